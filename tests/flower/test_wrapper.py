"""Specification of the Flower plug-in: ``GradientCoding`` + ``gradient_coding_mod`` + the grids.

Every test runs real ClientApps in-process (``InProcessGrid``) under ``gradient_coding_mod``.
The app is a tiny deterministic numpy "trainer": partition ``j`` moves the model toward its own
target, ``theta_j = theta - lr * (theta - target_j)``, and trains on ``10 + j`` examples, so
FedAvg's example-weighted average ``sum_j n_j theta_j / sum_j n_j`` is computed here by calling
the app's train handler once per partition (no mod, no code, no seeding involved). The app and
its oracle are in ``tests/apps/numpy_app.py``, the runner and the fault injection in
``tests/flower/harness.py``.

Stragglers and faults are injected from outside the plug-in: by an OUTER client mod that
rewrites the coded reply (``ClientApp(mods=[fault_mod, gradient_coding_mod])``), by the grid's
wall-clock ``delay``, or, in virtual timing, by a fixed table of arrival times
(``measured_compute=False``: arrivals are exactly the table).

Here: exactness for every straggler pattern, deadlines, busy and late clients, the handshake,
``min_replies``, an outer wrapper strategy, inner strategies, the NaN guard, sparse decoding
and upload bandwidth. The rest of the specification: rejected replies and dropped messages in
``test_wrapper_rejection.py``, the early-returning grid in ``test_wrapper_grid.py``, the
wrapper's records, options and plumbing in ``test_wrapper_edges.py``, ``s="auto"`` in
``test_wrapper_adaptive.py``, the clocks in ``test_wrapper_clock.py``.
"""

from __future__ import annotations

import io
import itertools
import re
import time

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message
from flwr.serverapp.strategy import FedAdam, FedAvg, FedAvgM

from fl_gradcode.flower import GradientCoding, gradient_coding_mod
from fl_gradcode.flower.testing import InProcessGrid
from fl_gradcode.results import read_rounds
from tests.apps.numpy_app import (
    LR,
    SHAPES,
    as_dict,
    assert_model,
    call_app,
    fedavg,
    fedavg_rounds,
    flat,
    initial_arrays,
    make_app,
    num_examples,
    pytestmark,  # noqa: F401 (the warning filter applies here)
    theta0,
)
from tests.doubles import PassThrough
from tests.flower.harness import FixedArrivals, run


def test_oracle_is_example_weighted_and_moves_the_model():
    """The oracle is not vacuous: weights matter and one round moves the model."""
    n = 6
    avg = fedavg(theta0(), range(n), n)
    plain = {k: np.mean([call_app(theta0(), j, n)[0][k] for j in range(n)], axis=0) for k in SHAPES}
    assert np.linalg.norm(flat(avg) - flat(plain)) > 1e-2
    assert np.linalg.norm(flat(avg) - flat(theta0())) > 1e-1


# =============================================================================== 1. exactness
EXACT_CASES = [
    ("frc", 6, 1), ("frc", 6, 2),
    ("grouped-rs", 5, 1), ("grouped-rs", 5, 2), ("grouped-rs", 6, 1), ("grouped-rs", 6, 2),
    ("crc", 5, 1), ("crc", 5, 2), ("crc", 6, 1), ("crc", 6, 2),
]


@pytest.mark.parametrize(("code", "n", "s"), EXACT_CASES, ids=[f"{c}-n{n}-s{s}"
                                                                for c, n, s in EXACT_CASES])
def test_coded_fedavg_equals_the_oracle_for_every_straggler_pattern(code, n, s):
    expected = fedavg(theta0(), range(n), n)
    patterns = [p for size in range(s + 1) for p in itertools.combinations(range(n), size)]
    for pattern in patterns:
        outcome = run(n, code=code, s=s, faults={(w, 1): "error" for w in pattern})
        row = outcome.rows[0]
        assert row["decode"] == "exact", (pattern, row)
        assert set(pattern) <= set(row["stragglers"]), (pattern, row)
        assert not set(pattern) & set(row["clients_used"]), (pattern, row)
        assert row["num_examples"] == pytest.approx(sum(num_examples(j) for j in range(n)))
        assert_model(outcome.models[1], expected)


# =============================================================================== 2. deadlines
def test_wallclock_round_returns_at_the_first_decodable_set():
    # FRC n=6, s=1: groups (0,1) (2,3) (4,5); odd workers take 5 s, the deadline is 4 s
    outcome = run(6, timing="wallclock", straggler_timeout=4.0,
                  delay=lambda w, r: 5.0 if r >= 1 and w % 2 else 0.0)
    row = outcome.rows[0]
    assert row["wall_s"] < 1.0  # neither the 4-s deadline nor the 5-s stragglers
    assert row["decode"] == "exact"
    assert row["clients_used"] == [0, 2, 4]
    assert row["stragglers"] == [1, 3, 5]
    assert_model(outcome.models[1], fedavg(theta0(), range(6), 6))


def test_virtual_round_decodes_from_the_earliest_decodable_prefix_and_tracks_busy():
    arrivals = FixedArrivals({1: [0.5, 9.0, 0.7, 0.2, 3.0, 8.0], 2: [0.1] * 6})
    outcome = run(6, rounds=2, latency=arrivals, straggler_timeout=20.0)
    first, second = outcome.rows
    # arrival order 3, 0, 2, 4: every group covered once worker 4 arrives at t = 3.0
    assert first["clients_used"] == [0, 2, 3, 4]
    assert first["virtual_s"] == pytest.approx(3.0)
    assert first["late_dropped"] == 2  # workers 5 and 1 arrive after the round closed
    # at t = 3.0 workers 1 and 5 are still busy (until 9.0 and 8.0): no round-2 work
    assert second["busy"] == [1, 5]
    assert second["clients_used"] == [0, 2, 3, 4]
    assert second["decode"] == "exact"
    assert_model(outcome.models[2], fedavg_rounds(theta0(), 2, 6))


def test_wallclock_deadline_decodes_approximately_and_records_the_error():
    # a whole FRC group (4, 5) is slower (5 s) than the deadline (1 s): not decodable
    outcome = run(6, timing="wallclock", straggler_timeout=1.0,
                  delay=lambda w, r: 5.0 if r >= 1 and w in (4, 5) else 0.0)
    row = outcome.rows[0]
    assert row["decode"] == "approx"
    assert row["clients_used"] == [0, 1, 2, 3]
    assert row["decode_error"] == pytest.approx(2 / 6)  # 2 of 6 partitions missing
    assert 1.0 <= row["wall_s"] < 4.0
    # the decoded example count is that of partitions 0-3: FedAvg over them
    assert_model(outcome.models[1], fedavg(theta0(), range(4), 6))


def test_virtual_deadline_uses_only_replies_that_arrived_in_time():
    arrivals = FixedArrivals({1: [0.1, 0.2, 0.3, 0.4, 50.0, 60.0]})
    outcome = run(6, latency=arrivals, straggler_timeout=10.0)
    row = outcome.rows[0]
    assert row["decode"] == "approx"
    assert row["clients_used"] == [0, 1, 2, 3]
    assert row["virtual_s"] == pytest.approx(10.0)
    assert row["decode_error"] == pytest.approx(2 / 6)
    assert_model(outcome.models[1], fedavg(theta0(), range(4), 6))


def test_approximation_worse_than_max_decode_error_keeps_the_model_and_is_skipped():
    outcome = run(6, rounds=2, faults={(4, 1): "error", (5, 1): "error"},
                  max_decode_error=0.2, straggler_timeout=1.0)
    first, second = outcome.rows
    assert first["decode"] == "skipped"
    assert first["decode_error"] == pytest.approx(2 / 6)
    assert outcome.result.train_metrics_clientapp[1]["gc/decoded"] == 0
    assert_model(outcome.models[1], theta0())  # aggregate_train returned no arrays
    # the next round starts from the kept model (workers 4, 5 are free again at t = 1 s)
    assert second["decode"] == "exact"
    assert_model(outcome.models[2], fedavg(theta0(), range(6), 6))


def test_wallclock_round_with_nothing_received_is_skipped_and_keeps_a_finite_model():
    outcome = run(6, timing="wallclock", straggler_timeout=0.5, warmup_timeout=0.5,
                  delay=lambda w, r: 5.0 if r >= 1 else 0.0)
    row = outcome.rows[0]
    assert row["decode"] == "skipped"
    assert row["clients_used"] == []
    assert row["wall_s"] < 4.0
    assert np.all(np.isfinite(flat(outcome.models[1])))
    assert_model(outcome.models[1], theta0())


# =============================================================================== 3. busy, late
def test_virtual_clock_advances_when_no_reply_is_valid():
    errors = {(w, 1): "error" for w in range(6)}
    outcome = run(6, rounds=3, faults=errors, straggler_timeout=2.0)
    rows = outcome.rows
    assert rows[0]["decode"] == "skipped" and rows[0]["clients_used"] == []
    assert rows[0]["virtual_s"] == pytest.approx(2.0)  # the round lasted until the deadline
    assert [r["decode"] for r in rows[1:]] == ["exact", "exact"]
    assert rows[1]["busy"] == []  # every node is free again after the deadline
    assert_model(outcome.models[3], fedavg_rounds(theta0(), 2, 6))


def test_virtual_silent_client_is_busy_until_the_deadline_then_free_again():
    # every reply arrives 1 s after its round starts (worker 5's after 0.5 s); worker 5 never
    # answers round 1 (its reply is held back for good), so it counts as busy until that
    # round's deadline (2.5 s): in rounds 2 (t=1) and 3 (t=2), not in round 4 (t=3)
    arrivals = FixedArrivals({r: [1.0] * 5 + [0.5] for r in range(1, 5)})
    outcome = run(6, rounds=4, latency=arrivals, straggler_timeout=2.5, round_timeout=0.5,
                  delay=lambda w, r: 1000.0 if (w, r) == (5, 1) else 0.0)
    rows = outcome.rows
    assert [r["busy"] for r in rows] == [[], [5], [5], []]
    assert [r["virtual_s"] for r in rows] == pytest.approx([1.0, 2.0, 3.0, 4.0])
    assert all(r["decode"] == "exact" for r in rows)
    assert 5 in rows[3]["clients_used"]
    assert_model(outcome.models[4], fedavg_rounds(theta0(), 4, 6))


def test_virtual_client_that_answered_with_an_error_is_free_at_the_round_end():
    arrivals = FixedArrivals({r: [1.0] * 5 + [0.5] for r in range(1, 3)})
    outcome = run(6, rounds=2, faults={(5, 1): "error"}, latency=arrivals,
                  straggler_timeout=2.5)
    first, second = outcome.rows
    assert first["rejected"] == 1 and 5 in first["stragglers"]
    assert second["busy"] == []
    assert 5 in second["clients_used"]
    assert_model(outcome.models[2], fedavg_rounds(theta0(), 2, 6))


def test_wallclock_busy_client_is_skipped_and_its_late_reply_dropped_and_counted():
    # round 1: worker 5 replies after 1 s (the round ends at once without it);
    # round 2: worker 0 fails and worker 1 takes 2.5 s, so group (0, 1) keeps the round
    # polling when worker 5's round-1 reply arrives: it is dropped and counted, never decoded
    outcome = run(6, rounds=3, timing="wallclock", straggler_timeout=10.0,
                  faults={(0, 2): "error"},
                  delay=lambda w, r: {(5, 1): 1.0, (1, 2): 2.5}.get((w, r), 0.0))
    rows = outcome.rows
    assert [r["busy"] for r in rows] == [[], [5], []]
    assert [r["late_dropped"] for r in rows] == [0, 1, 0]
    assert rows[1]["clients_used"] == [1, 2, 3, 4]
    assert rows[2]["clients_used"] == [0, 1, 2, 3, 4, 5]
    assert all(r["decode"] == "exact" for r in rows)
    assert_model(outcome.models[3], fedavg_rounds(theta0(), 3, 6))


def test_wallclock_round_waits_for_late_replies_when_every_client_is_busy():
    # FRC n=6, s=5: one group, any single reply decodes. Round 1 gets nothing before its
    # deadline (every reply takes 2 s); round 2 must wait for those replies, not send nothing
    outcome = run(6, code="frc", s=5, rounds=2, timing="wallclock", straggler_timeout=0.5,
                  warmup_timeout=0.5, delay=lambda w, r: 2.0 if r == 1 else 0.0)
    first, second = outcome.rows
    assert first["decode"] == "skipped"
    assert second["decode"] == "exact"
    assert second["clients_used"]
    assert second["late_dropped"] >= 1
    assert_model(outcome.models[2], fedavg(theta0(), range(6), 6))


# =============================================================================== 4. handshake
def test_node_without_the_mod_is_a_straggler_of_the_round_not_the_end_of_the_run():
    """(More in test_membership.py.) Its handshake fails: it is a straggler of its
    partition, which its replica computes: the round is FedAvg over all six partitions and
    rounds.jsonl names it."""
    apps = [make_app(gradient_coding_mod)] * 5 + [make_app()]
    grid = InProcessGrid(None, 6, apps=apps)
    outcome = run(6, code="grouped-rs", grid=grid, warmup_timeout=0.3)
    assert_model(outcome.models[1], fedavg(theta0(), range(6), 6))
    assert outcome.rows[0]["unidentified"] == [grid.node_ids[5]]


def test_two_nodes_claiming_the_same_partition_are_both_excluded():
    """Neither claimant of partition 0 is used; partitions 0 and 5 (nobody's) are computed by
    their replicas (grouped-rs s=1: in different groups): FedAvg over all six."""
    grid = InProcessGrid(make_app(gradient_coding_mod), 6,
                         node_config=lambda i: {"partition-id": i % 5})
    outcome = run(6, code="grouped-rs", grid=grid)
    assert_model(outcome.models[1], fedavg(theta0(), range(6), 6))
    assert outcome.rows[0]["identity_rejected"] == sorted([grid.node_ids[0],
                                                           grid.node_ids[5]])


# =============================================================================== 5. min replies
def test_min_replies_closes_an_exact_code_round_early_with_an_approximation():
    # FRC n=6, s=1 closed at 3 replies: workers 0, 1, 2 cover partitions 0-3 only
    arrivals = FixedArrivals({1: [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]})
    outcome = run(6, latency=arrivals, min_replies=3)
    row = outcome.rows[0]
    assert row["clients_used"] == [0, 1, 2]
    assert row["virtual_s"] == pytest.approx(0.3)
    assert row["decode"] == "approx"
    assert row["decode_error"] == pytest.approx(2 / 6)
    assert_model(outcome.models[1], fedavg(theta0(), range(4), 6))


def test_approximate_code_closes_at_n_minus_s_replies():
    # ignore-stragglers (rescaled) n=6, s=2: the fastest 4 replies, then FedAvg over them
    arrivals = FixedArrivals({1: [0.3, 5.0, 0.1, 0.2, 9.0, 0.4]})
    outcome = run(6, code="ignore-stragglers", s=2, latency=arrivals, max_decode_error=0.6)
    row = outcome.rows[0]
    assert row["clients_used"] == [0, 2, 3, 5]
    assert row["virtual_s"] == pytest.approx(0.4)
    assert row["decode"] == "approx"
    assert row["decode_error"] == pytest.approx(0.5)  # (4 * 0.5^2 + 2 * 1) / 6
    assert_model(outcome.models[1], fedavg(theta0(), [0, 2, 3, 5], 6))
    # num_examples is the decoder's estimate of the cohort's example count (the same
    # decoding applied to the counts; rescaled, the whole cohort's here), not the examples
    # the round averaged; those left out are named apart
    assert row["num_examples"] == pytest.approx(sum(num_examples(j) for j in range(6)))
    assert row["missing_partitions"] == [1, 4]
    assert row["missing_weight"] == pytest.approx((num_examples(1) + num_examples(4))
                                                  / sum(num_examples(j) for j in range(6)))


# =============================================================================== 6. composition
def test_early_return_survives_an_outer_wrapper_strategy_via_wrap_grid():
    grid = InProcessGrid(make_app(gradient_coding_mod), 6,
                         delay=lambda w, r: 30.0 if r >= 1 and w % 2 else 0.0)
    coded = GradientCoding(FedAvg(fraction_evaluate=0.0), code="frc", s=1, timing="wallclock",
                           straggler_timeout=20.0)
    t0 = time.monotonic()
    result = PassThrough(coded).start(
        grid=coded.wrap_grid(grid), initial_arrays=initial_arrays(), num_rounds=1,
        train_config=ConfigRecord({"lr": LR}),
    )
    assert time.monotonic() - t0 < 10.0  # not the 20-s deadline, not the 30-s stragglers
    assert coded.history[0]["clients_used"] == [0, 2, 4]
    assert_model(as_dict(result.arrays), fedavg(theta0(), range(6), 6))


# ======================================================================== 7. inner strategies
class RecordingFedAdam(FedAdam):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.received: list[list[Message]] = []

    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        self.received.append(replies)
        return super().aggregate_train(server_round, replies)


def test_inner_fedadam_receives_one_reply_holding_the_decoded_fedavg():
    inner = RecordingFedAdam(fraction_evaluate=0.0)
    outcome = run(6, code="crc", s=2, inner=inner, faults={(1, 1): "error", (4, 1): "error"})
    assert len(inner.received) == 1 and len(inner.received[0]) == 1
    content = inner.received[0][0].content
    assert_model(as_dict(content["arrays"]), fedavg(theta0(), range(6), 6))
    sizes = [num_examples(j) for j in range(6)]
    losses = [call_app(theta0(), j, 6)[2] for j in range(6)]
    assert content["metrics"]["num-examples"] == pytest.approx(sum(sizes))
    weighted = float(np.dot(sizes, losses) / sum(sizes))
    assert content["metrics"]["train_loss"] == pytest.approx(weighted, rel=1e-9)
    assert weighted != pytest.approx(float(np.mean(losses)), rel=1e-3)  # weights matter
    # ... and FedAdam's own (server-optimizer) step is applied to it: not plain FedAvg
    assert outcome.result.train_metrics_clientapp[1]["train_loss"] == pytest.approx(weighted)
    assert np.linalg.norm(flat(outcome.models[1]) - flat(as_dict(content["arrays"]))) > 1e-3


def test_inner_fedavgm_applies_server_momentum_to_the_decoded_average():
    lr_s, mu = 0.7, 0.9
    outcome = run(6, code="grouped-rs", s=2, rounds=2,
                  inner=FedAvgM(fraction_evaluate=0.0, server_learning_rate=lr_s,
                                server_momentum=mu),
                  faults={(0, 1): "error", (5, 2): "error"})
    assert [r["decode"] for r in outcome.rows] == ["exact", "exact"]
    # SGD with momentum on the pseudo-gradient theta - FedAvg(theta), computed by hand
    theta = flat(theta0())
    momentum = None
    for _ in range(2):
        current = dict(zip(SHAPES, np.split(theta, [3]), strict=True))
        current = {k: v.reshape(SHAPES[k]) for k, v in current.items()}
        pseudo = theta - flat(fedavg(current, range(6), 6))
        momentum = pseudo if momentum is None else mu * momentum + pseudo
        theta = theta - lr_s * momentum
    np.testing.assert_allclose(flat(outcome.models[2]), theta, rtol=1e-9, atol=1e-12)


# =============================================================================== 8. NaN guard
class NaNOnceFedAvg(FedAvg):
    """Returns a NaN model in round 1 (a broken server optimizer), behaves in later rounds."""

    def aggregate_train(self, server_round, replies):
        arrays, metrics = super().aggregate_train(server_round, replies)
        if server_round == 1 and arrays is not None:
            arrays = ArrayRecord({k: Array(np.full_like(v.numpy(), np.nan))
                                  for k, v in arrays.items()})
        return arrays, metrics


def test_non_finite_model_from_the_inner_strategy_is_not_applied():
    outcome = run(6, rounds=2, inner=NaNOnceFedAvg(fraction_evaluate=0.0))
    first, second = outcome.rows
    assert first["decode"] == "skipped"
    assert_model(outcome.models[1], theta0())
    assert second["decode"] == "exact"
    assert_model(outcome.models[2], fedavg(theta0(), range(6), 6))
    assert np.all(np.isfinite(flat(as_dict(outcome.result.arrays))))


# =============================================================================== sparse decoding
def test_exact_round_reads_one_reply_per_frc_group_and_still_equals_the_oracle():
    # FRC n=6, s=2: groups (0, 1, 2) and (3, 4, 5); everyone answers at once
    expected = fedavg(theta0(), range(6), 6)
    sparse = run(6, code="frc", s=2)
    dense = run(6, code="frc", s=2, sparse_decoding=False)
    used = sparse.rows[0]["clients_used"]
    assert used == dense.rows[0]["clients_used"] and len(used) >= 4
    assert sparse.rows[0]["replies_read"] == 2
    assert dense.rows[0]["replies_read"] == len(used)
    assert_model(sparse.models[1], expected)
    assert_model(dense.models[1], expected)


# =============================================================================== bandwidth
def _npy_bytes(shape: tuple[int, ...], dtype=np.float64) -> int:
    buffer = io.BytesIO()
    np.save(buffer, np.zeros(shape, dtype=dtype), allow_pickle=False)
    return len(buffer.getvalue())


def test_upload_bandwidth_delays_each_reply_by_its_bytes():
    bandwidth = 100.0  # bytes per second
    full = _npy_bytes((3,)) + _npy_bytes((2, 2))  # a full-model reply, float64 wire
    # comm-efficient m=2: one chunk of ceil((7 parameters + 1 count) / 2) = 4 values
    chunk = _npy_bytes((4,))
    uncoded = run(4, code="uncoded", s=0, upload_bandwidth=bandwidth)
    short = run(6, code="comm-efficient", s=1, m=2, upload_bandwidth=bandwidth)
    assert uncoded.rows[0]["round_virtual_s"] == pytest.approx(full / bandwidth)
    assert short.rows[0]["round_virtual_s"] == pytest.approx(chunk / bandwidth)
    assert uncoded.rows[0]["bytes_up"] == 4 * full
    assert_model(short.models[1], fedavg(theta0(), range(6), 6))


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan"), "fast"])
def test_bad_upload_bandwidth_is_refused_with_its_value(bad):
    with pytest.raises(ValueError, match="upload_bandwidth"):
        GradientCoding(FedAvg(), code="uncoded", s=0, upload_bandwidth=bad)


def test_a_second_start_continues_the_federation_in_history_and_rounds_jsonl(tmp_path):
    """A second ``start`` goes on from the first run's end: its rounds (numbered from 1 again)
    follow the first run's in time, clients still busy with late work are busy, and
    ``rounds.jsonl`` lists the rows ``history`` holds, in order."""
    table = {r: [0.1, 0.2, 0.3, 0.4, 0.5, 9.0] for r in range(1, 6)}
    coded = GradientCoding(FedAvg(fraction_evaluate=0.0), code="frc", s=1, timing="virtual",
                           latency=FixedArrivals(table), measured_compute=False,
                           straggler_timeout=100.0, results_dir=str(tmp_path))
    grid = InProcessGrid(make_app(gradient_coding_mod), 6)
    for rounds in (2, 1):
        coded.start(grid=grid, initial_arrays=initial_arrays(), num_rounds=rounds,
                    train_config=ConfigRecord({"lr": LR}))
    rows = read_rounds(tmp_path)
    assert [row["round"] for row in rows] == [1, 2, 1]
    assert [row["virtual_s"] for row in rows] == [row["virtual_s"] for row in coded.history]
    times = [row["virtual_s"] for row in rows]
    assert times == sorted(times) and times[2] > times[1]
    # worker 5 (9 s, dropped once the others decode) is still busy in the next rounds
    assert all(5 in row["busy"] for row in rows[1:])


def test_verify_on_cohorts_it_cannot_check_says_so_not_that_the_deadline_is_short(caplog):
    """FRC with s = 3 cannot take 6 clients ((s + 1) does not divide n); the round's fallback
    (grouped-rs) has blocks that are not repetition groups, which verify never settles, so
    every round is skipped. The run's warnings name that, and do not blame the deadline
    (no reply was late)."""
    out = run(6, code="frc", s=3, verify=True, rounds=4, straggler_timeout=10.0)
    assert [row["decode"] for row in out.strategy.history] == ["skipped"] * 4
    assert "below the clients' round times" not in caplog.text
    assert re.search(r"no round applied an update.*verify=True could check none of its "
                     r"cohorts.*s \+ 1 = 4", caplog.text)


class DropsTheLastNodeAfterRoundOne(FedAvg):
    def configure_train(self, server_round, arrays, config, grid):
        messages = list(super().configure_train(server_round, arrays, config, grid))
        return messages if server_round == 1 else messages[:-1]


def test_verify_skips_a_later_cohort_it_cannot_check_and_the_run_goes_on():
    """After verified rounds, a cohort the code cannot check (6 -> 5 clients with FRC s = 1)
    is skipped with a warning, not the end of a run that has trained."""
    out = run(6, code="frc", s=1, verify=True, rounds=3,
              inner=DropsTheLastNodeAfterRoundOne(fraction_evaluate=0.0))
    assert [row["decode"] for row in out.strategy.history] == ["exact", "skipped", "skipped"]
    assert_model(out.models[3], out.models[1])


def test_without_an_evaluate_fn_the_log_has_no_global_evaluation_as_flowers_fedavg(caplog):
    """Flower's FedAvg without an ``evaluate_fn`` logs no "Global evaluation"; the coded
    strategy neither (it logged a ``MetricRecord: None`` every round), and its rows are still
    written."""
    grid = InProcessGrid(make_app(gradient_coding_mod), 4)
    coded = GradientCoding(FedAvg(fraction_evaluate=0.0), code="frc", s=1, timing="virtual",
                           measured_compute=False)
    coded.start(grid=grid, initial_arrays=initial_arrays(), num_rounds=2,
                train_config=ConfigRecord({"lr": LR}))
    assert "Global evaluation" not in caplog.text
    assert [row["decode"] for row in coded.history] == ["exact", "exact"]


def test_one_malformed_evaluate_reply_leaves_the_others_averaged(caplog):
    """One node's evaluate reply holds a list where the others hold a number: Flower's metric
    average cannot take it (Flower's FedAvg would end the run); the others are averaged, as
    Flower's FedAvg averages them without it, and the log says one was left out."""
    from flwr.app import MessageType

    def bad_evaluate_mod(msg, context, call_next):
        reply = call_next(msg, context)
        if (msg.metadata.message_type == MessageType.EVALUATE
                and int(context.node_config["partition-id"]) == 0):
            next(iter(reply.content.metric_records.values()))["eval_loss"] = [1.0, 2.0]
        return reply

    def skip_node_zero(msg, context, call_next):
        if (msg.metadata.message_type == MessageType.EVALUATE
                and int(context.node_config["partition-id"]) == 0):
            return Message(Error(0, "left out"), reply_to=msg)
        return call_next(msg, context)

    def federated(app, inner):
        return inner.start(grid=InProcessGrid(app, 4), initial_arrays=initial_arrays(),
                           num_rounds=1, train_config=ConfigRecord({"lr": LR}))

    plain = federated(make_app(skip_node_zero), FedAvg(min_evaluate_nodes=4))
    coded = federated(make_app(bad_evaluate_mod, gradient_coding_mod),
                      GradientCoding(FedAvg(min_evaluate_nodes=4), code="frc", s=1,
                                     timing="virtual", measured_compute=False))
    expected = plain.evaluate_metrics_clientapp[1]
    got = coded.evaluate_metrics_clientapp[1]
    assert set(got) == set(expected) and len(got) > 0
    for key in expected:
        assert got[key] == pytest.approx(expected[key], rel=1e-12)
    assert "left out 1 of 4 evaluate replies" in caplog.text


def test_min_replies_above_the_cohort_is_named_once_and_waits_for_the_cohort(caplog):
    """min_replies=10 with cohorts of 6 cannot be met: the round ends at its 6 replies (as
    documented, 'at most n'); the log says so once, naming both numbers."""
    out = run(6, code="bgc", s=1, rounds=2, min_replies=10)
    assert len(out.rows) == 2
    warned = [r.getMessage() for r in caplog.records if "min_replies=10" in r.getMessage()]
    assert len(warned) == 1 and "6" in warned[0]
