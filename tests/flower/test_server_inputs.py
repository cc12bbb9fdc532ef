"""What clients report never steers the server unchecked, and the server's own edges hold.

* partition sizes forged by an OUTER client mod (``ClientApp(mods=[forger,
  gradient_coding_mod])``, the reply's ``gradient-coding-meta`` rewritten): 0 and 1e15, alone
  and with a matching ``num-examples``; the central-DP noise scale from checked sizes only;
* client-supplied rejection text (2 MB with newlines) one short line in the log and
  ``rounds.jsonl``;
* results writes that fail (file size limit mid-line, a directory in the way) warn and the
  run goes on; ``rounds.jsonl`` never holds a partial line;
* a wallclock reply that is lost: its node is free again after ``round_timeout``;
* ``dp='partition'`` without keys: one error at round 1 saying how to create and pass keys;
* ``dp-noise=independent`` with ``s="auto"``: ε from each round's effective multiplier.

Expected values come from the tiny app's known sizes (``num_examples(j) = 10 + j``), the numpy
FedAvg oracle of ``test_wrapper`` and Opacus' own accountant stepped by hand.
"""

from __future__ import annotations

import json
import logging
import math
import os
import resource
import signal
import time

import numpy as np
import pytest
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Error,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp.strategy import FedAvg

from fl_gradcode.flower import GradientCoding, gradient_coding_mod
from fl_gradcode.flower.protocol import OP_TRAIN, PROTOCOL_KEY, parse_instruction
from fl_gradcode.flower.reports import MAX_REASON_CHARS, public_reason
from fl_gradcode.flower.testing import InProcessGrid
from fl_gradcode.privacy import DPConfig, PrivacyAccountant, ServerNoise, write_key_file
from fl_gradcode.results import RoundRecorder, read_rounds
from tests.apps.numpy_app import (
    LR,
    META_KEY,
    as_dict,
    assert_model,
    fedavg,
    initial_arrays,
    make_app,
    num_examples,
    theta0,
)

pytestmark = [
    pytest.mark.filterwarnings("ignore:gradient_coding_mod. no partition key:UserWarning"),
]


# =============================================================================== helpers
def meta_mod(edit):
    """An OUTER mod: ``edit(worker, round, meta) -> meta | None`` rewrites the coded reply's
    ``gradient-coding-meta`` (``None``: unchanged); the arrays stay what the mod computed."""

    def mod(msg: Message, context: Context, call_next) -> Message:
        reply = call_next(msg, context)
        if msg.metadata.message_type != MessageType.TRAIN or reply.has_error():
            return reply
        instruction = parse_instruction(msg.content)
        if instruction is None or instruction.op != OP_TRAIN:
            return reply
        meta = dict(reply.content.metric_records[META_KEY])
        new = edit(instruction.worker, instruction.round, meta)
        if new is None:
            return reply
        content = RecordDict({PROTOCOL_KEY: reply.content.array_records[PROTOCOL_KEY],
                              META_KEY: MetricRecord(new)})
        return Message(content, reply_to=msg)

    return mod


def forge_sizes(workers, value, *, consistent=False, rounds=(1,)):
    """Worker ``w`` in ``workers`` reports every partition size as ``value`` (and, with
    ``consistent``, the matching ``num-examples`` for FRC's 0/1 coefficients)."""

    def edit(worker, server_round, meta):
        if worker not in workers or server_round not in rounds:
            return None
        sizes = [float(value)] * len(meta["partition-sizes"])
        meta["partition-sizes"] = sizes
        if consistent:
            meta["num-examples"] = float(sum(sizes))
        return meta

    return edit


def central(sigma=1.0, clip=1e6):
    # a clip norm no update reaches: the released average is FedAvg's plus the server noise
    return DPConfig(mode="central", noise_multiplier=sigma, clip_norm=clip)


def run(n, *, mods=(), rounds=1, code="frc", s=1, evaluate=None, grid=None, **options):
    grid = grid or InProcessGrid(make_app(*mods, gradient_coding_mod), n)
    options.setdefault("measured_compute", False)
    strategy = GradientCoding(FedAvg(fraction_evaluate=0.0), code=code, s=s, seed=0, **options)
    models: dict[int, dict[str, np.ndarray]] = {0: as_dict(initial_arrays())}

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> None:
        models[server_round] = as_dict(arrays)
        if evaluate is not None:
            evaluate(server_round)

    strategy.start(grid=grid, initial_arrays=initial_arrays(), num_rounds=rounds,
                   train_config=ConfigRecord({"lr": LR}), evaluate_fn=evaluate_fn)
    return strategy, models


def hand_noise_std(sigma, clip, sizes):
    """Exact decoding (alpha = 1): sigma C max_j n_j / sum_j n_j."""
    return sigma * clip * max(sizes) / sum(sizes)


# =============================================================================== 4. sizes
def test_sizes_forged_to_zero_are_rejected_and_the_noise_is_sized_from_honest_sizes():
    # FRC n=4 s=1: worker 2 holds partitions 2 and 3 and claims 0 examples for both
    sigma = 0.5
    strategy, _ = run(4, mods=[meta_mod(forge_sizes({2}, 0.0))], dp=central(sigma, clip=1.0),
                      server_noise=ServerNoise(b"k" * 32))
    row = strategy.history[0]
    assert row["rejected"] == 1
    reason = row["rejected_reasons"][0]
    assert "partition-sizes=[0, 0]" in reason and "num-examples=25" in reason  # 12 + 13
    assert 2 not in row["clients_used"] and row["decode"] == "exact"
    sizes = [num_examples(j) for j in range(4)]
    assert row["central_noise_std"] == pytest.approx(hand_noise_std(sigma, 1.0, sizes), rel=1e-12)
    assert strategy.partition_sizes == {(j, 4): float(sizes[j]) for j in range(4)}


def test_every_reply_claiming_zero_sizes_releases_nothing_instead_of_a_noiseless_model():
    strategy, models = run(4, mods=[meta_mod(forge_sizes(set(range(4)), 0.0))], dp=central())
    row = strategy.history[0]
    assert row["rejected"] == 4 and row["decode"] == "skipped"
    assert row["central_noise_std"] is None  # never 0 with a reported epsilon
    assert_model(models[1], models[0])


def test_a_huge_size_without_matching_num_examples_is_rejected():
    strategy, models = run(4, mods=[meta_mod(forge_sizes({0}, 1e15))], dp=central(0.0))
    row = strategy.history[0]
    assert row["rejected"] == 1 and "partition-sizes=[1e+15, 1e+15]" in row["rejected_reasons"][0]
    assert 0 not in row["clients_used"] and row["decode"] == "exact"
    assert_model(models[1], fedavg(theta0(), range(4), 4))  # noise multiplier 0: FedAvg


def test_a_huge_size_with_matching_num_examples_is_outvoted_by_the_other_replicas():
    # FRC n=6 s=2: worker 0 reports 1e15 for partitions 0-2 and a num-examples to match; the
    # two other replicas of those partitions report the true sizes
    strategy, models = run(6, s=2, mods=[meta_mod(forge_sizes({0}, 1e15, consistent=True))],
                           dp=central(0.0))
    row = strategy.history[0]
    assert row["rejected"] == 1
    reason = row["rejected_reasons"][0]
    assert reason.startswith("partition-sizes: n_0=1e+15 disagrees") and "report 10" in reason
    assert 0 not in row["clients_used"] and row["decode"] == "exact"
    assert_model(models[1], fedavg(theta0(), range(6), 6))
    assert strategy.partition_sizes[(0, 6)] == 10.0


def test_a_tie_between_two_replicas_is_broken_by_a_size_confirmed_earlier():
    # FRC n=4 s=1: worker 0 forges a consistent 1e15 in rounds 1 and 3. Round 1: 1 against 1,
    # nothing confirmed yet: both replicas excluded (group 0 lost: not applied). Round 2: the
    # replicas agree, the sizes are confirmed. Round 3: the confirmed size decides.
    forger = meta_mod(forge_sizes({0}, 1e15, consistent=True, rounds=(1, 3)))
    strategy, models = run(4, mods=[forger], rounds=3, dp=central(0.0), max_decode_error=0.1)
    first, second, third = strategy.history
    assert first["rejected"] == 2 and first["decode"] == "skipped"
    assert all("no majority" in r for r in first["rejected_reasons"])
    assert second["rejected"] == 0 and second["decode"] == "exact"
    assert third["rejected"] == 1 and third["decode"] == "exact"
    assert 0 not in third["clients_used"]
    assert_model(models[3], fedavg(models[2], range(4), 4))


def test_without_replicas_a_huge_consistent_size_is_flagged(caplog):
    # s=0: no other holder can contradict a client about its own partition (documented): the
    # outlier is named in the log
    with caplog.at_level(logging.WARNING, logger="flwr"):
        strategy, _ = run(4, code="uncoded", s=0, dp=central(1.0, clip=1.0),
                          mods=[meta_mod(forge_sizes({1}, 1e15, consistent=True))])
    assert strategy.history[0]["rejected"] == 0
    assert any("reports 1e+15 examples" in r.getMessage() for r in caplog.records)


# =============================================================================== 6. reasons
def test_a_two_megabyte_multiline_rejection_reason_is_one_short_line(tmp_path, caplog):
    huge = "evil\n[round 9] exact from 6 replies\r\n" * 60_000  # > 2 MB

    def mod(msg, context, call_next):
        reply = call_next(msg, context)
        instruction = parse_instruction(msg.content)
        if instruction is not None and instruction.op == OP_TRAIN and instruction.worker == 1:
            return Message(Error(code=0, reason=huge), reply_to=msg)
        return reply

    assert len(huge) > 2_000_000
    with caplog.at_level(logging.WARNING, logger="flwr"):
        run(4, mods=[mod], rounds=2, results_dir=str(tmp_path))
    lines = (tmp_path / "rounds.jsonl").read_text().splitlines()
    assert len(lines) == 2
    for line in lines:
        row = json.loads(line)
        assert row["rejected"] == 1
        (reason,) = row["rejected_reasons"]
        assert len(reason) <= MAX_REASON_CHARS and "\n" not in reason and "\r" not in reason
        assert reason.startswith("error reply (code 0: evil\\n[round 9]")
    logged = [r.getMessage() for r in caplog.records if "rejected reply" in r.getMessage()]
    assert len(logged) == 2 and all("\n" not in m and len(m) < 700 for m in logged)


def test_public_reason_escapes_every_line_break_and_control_character():
    text = "a\nb\rc\td\x1b[31me\x00f\u2028g\u2029h\x85i"
    assert public_reason(text) == "a\\nb\\rc\\td\\x1b[31me\\x00f\\u2028g\\u2029h\\x85i"
    assert public_reason("x" * 500) == "x" * 500
    cut = public_reason("x" * 501)
    assert len(cut) == 500 and cut.endswith("... [501 characters]")


# =============================================================================== 6. results
def _row(r):
    return {"round": r, "decode": "exact", "clients_used": [0, 1], "stragglers": [],
            "late_dropped": 0, "rejected": 0, "decode_error": 0.0, "virtual_s": float(r),
            "wall_s": 0.1, "accuracy": None, "loss": None}


def test_a_rounds_line_cut_by_a_full_disk_is_rolled_back_and_the_next_line_is_whole(tmp_path):
    recorder = RoundRecorder(tmp_path, {"seed": 0})
    path = tmp_path / "rounds.jsonl"
    recorder.record(_row(1))
    before = path.read_bytes()
    # the file may grow by 20 bytes only: the second line is cut mid-line (EFBIG)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (len(before) + 20, hard))
        try:
            ok = recorder.record(_row(2))
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    finally:
        signal.signal(signal.SIGXFSZ, old_handler)
    assert ok is False
    assert path.read_bytes() == before  # no partial line
    assert recorder.record(_row(3)) is True
    assert [row["round"] for row in read_rounds(tmp_path)] == [1, 3]


def test_a_write_that_raises_mid_line_leaves_no_partial_line(tmp_path, monkeypatch):
    recorder = RoundRecorder(tmp_path, {"seed": 0})
    recorder.record(_row(1))
    before = (tmp_path / "rounds.jsonl").read_bytes()
    real = os.write

    def half_then_fail(fd, data):
        if len(data) > 10:
            real(fd, bytes(data[: len(data) // 2]))
            raise OSError(28, "No space left on device")
        return real(fd, data)

    monkeypatch.setattr(os, "write", half_then_fail)
    assert recorder.record(_row(2)) is False
    monkeypatch.setattr(os, "write", real)
    assert (tmp_path / "rounds.jsonl").read_bytes() == before
    assert recorder.failures == 1


def test_results_that_cannot_be_written_warn_and_the_run_goes_on(tmp_path, caplog):
    # rounds.jsonl and final_model.npz replaced by directories once the run has started
    def block(server_round):
        if server_round == 1:
            for name in ("rounds.jsonl", "final_model.npz"):
                target = tmp_path / name
                if target.exists():
                    target.unlink()
                target.mkdir()

    with caplog.at_level(logging.WARNING, logger="flwr"):
        strategy, models = run(4, rounds=3, results_dir=str(tmp_path), evaluate=block)
    assert [row["round"] for row in strategy.history] == [1, 2, 3]
    assert [row["decode"] for row in strategy.history] == ["exact"] * 3
    assert sorted(models) == [0, 1, 2, 3]
    messages = [r.getMessage() for r in caplog.records]
    assert any("cannot append round" in m and "the run goes on" in m for m in messages)
    assert any("final_model.npz" in m and "the run goes on" in m for m in messages)


# =============================================================================== 6. expiry
def test_a_node_whose_wallclock_reply_is_lost_is_free_again_after_round_timeout(flwr_log):
    # worker 3's round-1 reply never arrives (crash after computing); round_timeout 0.6 s;
    # each round ends 0.25 s after the last (the evaluation sleeps)
    grid = InProcessGrid(make_app(gradient_coding_mod), 6, crash=lambda w, r: (w, r) == (3, 1))
    strategy, _ = run(6, grid=grid, rounds=6, timing="wallclock", straggler_timeout=0.2,
                      warmup_timeout=0.2, round_timeout=0.6,
                      evaluate=lambda r: time.sleep(0.25))
    rows = strategy.history
    assert rows[0]["stragglers"] == [3]
    assert rows[1]["busy"] == [3]  # still waited for
    freed = [row["round"] for row in rows[1:] if not row["busy"]]
    assert freed and freed[0] <= 5, [row["busy"] for row in rows]
    assert all(3 in row["clients_used"] for row in rows if row["round"] >= freed[0])
    given_up = [m for level, m in flwr_log
                if level == logging.WARNING and "given up, the node is free again" in m]
    assert len(given_up) == 1, given_up  # the one lost message, given up once


# =============================================================================== 7. keys
def test_partition_dp_without_keys_stops_at_round_1_with_one_error_saying_what_to_do(tmp_path):
    with pytest.raises(RuntimeError) as info:
        run(4, rounds=5, dp=DPConfig(mode="partition"), results_dir=str(tmp_path))
    text = str(info.value)
    assert text.startswith("round 1: every reply was refused because the clients have no DP "
                           "partition keys (dp='partition')")
    assert "python -m fl_gradcode.privacy keygen" in text and "dp-key-file" in text
    assert "FL_GRADCODE_DP_KEY_FILE" in text and "flwr run" in text
    rows = read_rounds(tmp_path)
    assert [r["round"] for r in rows] == [1] and rows[0]["rejected"] == 4


def test_partition_dp_with_keys_is_not_stopped(tmp_path):
    keys = write_key_file(tmp_path / "keys.json")
    grid = InProcessGrid(make_app(gradient_coding_mod), 4,
                         node_config=lambda i: {"dp-key-file": str(keys)})
    strategy, _ = run(4, grid=grid, rounds=2, dp=DPConfig(mode="partition", clip_norm=1e6))
    assert [row["decode"] for row in strategy.history] == ["exact", "exact"]



def _key_error_from_worker_0(msg: Message, context: Context, call_next) -> Message:
    """Worker 0 answers with the mod's missing-key text, whatever the run's dp."""
    instruction = parse_instruction(msg.content)
    if instruction is not None and instruction.op == OP_TRAIN and instruction.worker == 0:
        return Message(Error(0, "dp='partition' needs partition keys on the client"),
                       reply_to=msg)
    return call_next(msg, context)


@pytest.mark.parametrize("dp", [None, DPConfig(mode="central", clip_norm=1e6)])
def test_one_nodes_missing_key_text_does_not_end_a_run_that_needs_no_keys(tmp_path, dp):
    """The only reply by the deadline is worker 0's error saying it lacks partition keys; the
    run's dp needs none (the text is the client's to choose): the reply is refused, the round
    is skipped and the run goes on, the other replies used once they arrive."""
    slow = lambda worker, rnd: 0.0 if worker == 0 else 1.0  # noqa: E731
    grid = InProcessGrid(make_app(_key_error_from_worker_0, gradient_coding_mod), 4,
                         delay=slow)
    options = {} if dp is None else {"dp": dp}
    strategy, _ = run(4, grid=grid, rounds=3, timing="wallclock", straggler_timeout=0.3,
                      warmup_timeout=0.3, round_timeout=30.0, results_dir=str(tmp_path),
                      **options)
    rows = strategy.history
    assert [row["round"] for row in rows] == [1, 2, 3]
    assert rows[0]["rejected"] >= 1


def test_partition_dp_is_not_ended_by_one_node_while_the_others_are_late(tmp_path):
    """dp='partition', the other nodes have keys but are late: one node's missing-key error
    is not every node's, so the run is not ended as untrainable."""
    keys = write_key_file(tmp_path / "keys.json")
    slow = lambda worker, rnd: 0.0 if worker == 0 else 1.0  # noqa: E731
    grid = InProcessGrid(make_app(_key_error_from_worker_0, gradient_coding_mod), 4,
                         delay=slow, node_config=lambda i: {"dp-key-file": str(keys)})
    strategy, _ = run(4, grid=grid, rounds=2, timing="wallclock", straggler_timeout=0.3,
                      warmup_timeout=0.3, round_timeout=30.0, results_dir=str(tmp_path / "r"),
                      dp=DPConfig(mode="partition", clip_norm=1e6))
    assert [row["round"] for row in strategy.history] == [1, 2]

# =============================================================================== 8. accountant
def _effective_multiplier(B: np.ndarray, sigma: float, sizes: list[float]) -> float:
    """By hand: partition j's replicas each add their own N(0, (sigma C)^2) and reply
    ``sum_j B_ij n_j (u_j + z_ij)``; the best unbiased combination of the replies for ``u_j``
    leaves noise variance ``(sigma C)^2 / sum_i W_ij^2 / ||W_i||^2`` (``W_ij = B_ij n_j``),
    worst partition."""
    shares = np.zeros(B.shape[1])
    for row in B:
        weighted = row * np.asarray(sizes, dtype=np.float64)
        norm2 = float(weighted @ weighted)
        if norm2 > 0:
            shares += weighted**2 / norm2
    return sigma / math.sqrt(float(shares.max()))


def test_independent_noise_with_auto_s_is_accounted_at_each_rounds_multiplier(tmp_path):
    from opacus.accountants import RDPAccountant

    from fl_gradcode.codes import NestedPlacement
    from fl_gradcode.latency import make_latency
    from tests.apps.numpy_app import num_examples

    keys = write_key_file(tmp_path / "keys.json")
    n, s_max, sigma = 8, 3, 1.0
    grid = InProcessGrid(make_app(gradient_coding_mod), n,
                         node_config=lambda i: {"dp-key-file": str(keys)})
    dp = DPConfig(mode="partition", noise="independent", noise_multiplier=sigma,
                  clip_norm=1e6)
    strategy, _ = run(n, grid=grid, rounds=3, s="auto", s_max=s_max, auto_margin=0.5,
                      latency=make_latency("pareto", seed=1), dp=dp,
                      accountant=PrivacyAccountant(dp, [(sigma, 1.0, 1)]))
    placement = NestedPlacement(n, s_max, seed=0)
    reference = RDPAccountant()
    multipliers = []
    for row in strategy.history:
        # every partition's size was agreed in each round (code partition j is node j's:
        # num_examples(j) examples)
        multiplier = _effective_multiplier(placement.code(row["s"]).B, sigma,
                                           [num_examples(j) for j in range(n)])
        multipliers.append(multiplier)
        reference.step(noise_multiplier=multiplier, sample_rate=1.0)
        assert row["epsilon"] == pytest.approx(reference.get_epsilon(delta=dp.delta), rel=1e-9)
    # the run is not vacuous: some round's code lowered the multiplier below the nominal one
    assert min(multipliers) < sigma - 0.1, [row["s"] for row in strategy.history]


def test_the_accountant_composes_rounds_at_different_multipliers_like_opacus():
    from opacus.accountants import RDPAccountant

    dp = DPConfig(mode="partition", target_epsilon=0.0)
    ours = PrivacyAccountant(dp, [(1.0, 1.0, 1)])
    reference = RDPAccountant()
    for multiplier in (1.0, 0.8, None, 0.8, 1.3):
        ours.step(multiplier)
        reference.step(noise_multiplier=1.0 if multiplier is None else multiplier,
                       sample_rate=1.0)
        assert ours.epsilon == pytest.approx(reference.get_epsilon(delta=dp.delta), rel=1e-9)
    with pytest.raises(ValueError, match="noise_multiplier"):
        ours.step(float("nan"))


def test_a_budget_is_judged_at_the_smallest_multiplier_seen():
    # the next round's code (and multiplier) is not known before it is chosen: judged at the
    # worst seen so far, 0.5 here, not at the nominal 1.0
    dp = DPConfig(mode="partition")
    at_half = PrivacyAccountant(dp, [(0.5, 1.0, 1)]).epsilon_after(2)
    at_nominal = PrivacyAccountant(dp, [(1.0, 1.0, 1)])
    at_nominal.step(0.5)
    then_nominal = at_nominal.epsilon_after(2)
    assert then_nominal < at_half
    target = (then_nominal + at_half) / 2
    budget = PrivacyAccountant(DPConfig(mode="partition", target_epsilon=target),
                               [(1.0, 1.0, 1)])
    assert budget.can_run_round()
    budget.step(0.5)
    assert not budget.can_run_round()
    assert budget.can_run_round(noise_multiplier=1.0)  # a round known to run at 1.0 fits


def test_one_worker_misreporting_several_partitions_is_the_only_one_excluded():
    """Cyclic code, s = 1: worker 2 holds partitions 2 and 3 and reports 0 for both. Each
    partition has two replicas, so each is a tie on its own; the one reply that explains both
    ties is excluded, its honest neighbours 1 and 3 are kept (one exclusion, not three)."""
    from fl_gradcode.codes import make_code
    from fl_gradcode.flower.reports import agree_sizes

    code = make_code("crc", n=6, s=1, seed=0)
    truth = [10.0, 11.0, 12.0, 13.0, 14.0, 15.0]
    reported = {w: [truth[j] for j in code.assignment(w)] for w in range(6)}
    assert list(code.assignment(2)) == [2, 3]
    reported[2] = [0.0, 0.0]
    agreed, excluded, _ = agree_sizes(code, reported)
    assert set(excluded) == {2}
    assert agreed == {j: truth[j] for j in range(6)}


def test_twins_misreporting_against_each_other_are_both_excluded():
    """FRC, s = 1: twins 0 and 1 hold the same partitions; a tie in both gives neither more
    evidence, so both are excluded (nothing confirmed) and their partitions have no size."""
    from fl_gradcode.codes import make_code
    from fl_gradcode.flower.reports import agree_sizes

    code = make_code("frc", n=6, s=1)
    reported = {w: [10.0 + j for j in code.assignment(w)] for w in range(6)}
    reported[0] = [0.0, 0.0]
    agreed, excluded, _ = agree_sizes(code, reported)
    assert set(excluded) == {0, 1}
    assert set(agreed) == {2, 3, 4, 5}


def test_a_node_repeatedly_reporting_inconsistent_sizes_is_quarantined(tmp_path):
    """Sizes that contradict the reply's own num-examples are provable: each is an offence,
    and two put the node in quarantine (named in rounds.jsonl), as a reply the replicas
    contradict does (before, such a node was rejected every round for ever, never named)."""
    from tests.flower.test_review_edges import _run, _sizes

    _, rows = _run(tmp_path, lambda i: [_sizes(1, 0.0)], "frc", 2, rounds=4)
    assert rows[0]["rejected"] >= 1 and rows[1]["rejected"] >= 1
    quarantined = {n for row in rows[2:] for n in row["quarantined"]}
    assert len(quarantined) == 1
    assert quarantined == {rows[0]["nodes"]["rejected"][0]}
