"""The strategy wrapper's edges and plumbing: what ``GradientCoding`` records and how it is
wired to the inner strategy.

The result, ``rounds.jsonl`` and ``config.json`` (strict JSON, every key spelled once, an idle
round's defaults), documented defaults and options (``s``, the wire, the run nonce, the inner
strategy's ArrayRecord and weight keys), what each round records about its decoding (sparse
reads, NaN replies, an unresolved contradiction, keyed central noise), a spent privacy budget,
an evaluation the inner strategy cannot aggregate, an unknown attribute. Runs the numpy app
(``run`` of ``tests/flower/harness.py``) or the vector app (``tests/apps/vector_app.py``).
"""

from __future__ import annotations

import json
import logging
from typing import ClassVar

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg

from fl_gradcode import privacy
from fl_gradcode.flower import GradientCoding, gradient_coding_mod, protocol
from fl_gradcode.flower.testing import InProcessGrid
from fl_gradcode.latency import Pareto
from tests.apps.numpy_app import (
    LR,
    SHAPES,
    as_dict,
    assert_model,
    fedavg,
    fedavg_rounds,
    initial_arrays,
    make_app,
    pytestmark,  # noqa: F401 (the warning filter applies here)
    theta0,
)
from tests.apps.vector_app import DIM, scaling_mod, train
from tests.apps.vector_app import oracle as vector_oracle
from tests.flower.harness import FixedArrivals, run
from tests.flower.harness import run as run_wrapper


# =============================================================================== results
def test_result_and_results_dir_hold_every_round(tmp_path):
    out = tmp_path / "results"
    outcome = run(6, rounds=2, results_dir=str(out), inner=FedAvg(fraction_evaluate=1.0),
                  faults={(3, 2): "nan"})
    result = outcome.result
    assert set(result.train_metrics_clientapp) == {1, 2}
    for r in (1, 2):
        metrics = result.train_metrics_clientapp[r]
        assert metrics["gc/decoded"] == 1 and metrics["gc/exact"] == 1
        assert metrics["gc/s"] == 1
    assert result.train_metrics_clientapp[2]["gc/rejected"] == 1
    # federated evaluation passes through the mod to the app's own evaluate handler
    assert set(result.evaluate_metrics_clientapp) == {1, 2}

    rows = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
    assert [row["round"] for row in rows] == [1, 2]
    keys = {"round", "decode", "clients_used", "stragglers", "late_dropped", "rejected",
            "decode_error", "virtual_s", "wall_s", "accuracy", "loss", "s"}
    for row in rows:
        assert keys <= set(row), keys - set(row)
        assert isinstance(row["clients_used"], list)
        assert all(isinstance(w, int) for w in row["clients_used"])
    assert rows[1]["rejected"] == 1 and 3 in rows[1]["stragglers"]
    assert rows == json.loads(json.dumps(outcome.rows))

    with np.load(out / "final_model.npz") as saved:
        assert set(saved.files) == set(SHAPES)
        assert_model({k: saved[k] for k in saved.files}, as_dict(result.arrays))
    assert_model(as_dict(result.arrays), fedavg_rounds(theta0(), 2, 6))
    config = json.loads((out / "config.json").read_text())
    assert config["code"] == "frc" and config["s"] == 1 and config["strategy"] == "FedAvg"


def test_the_round_recorder_writes_strict_json_with_null_for_non_finite_numbers(tmp_path):
    from fl_gradcode.results import ROUND_FIELDS, RoundRecorder, read_rounds

    rec = RoundRecorder(tmp_path, {"latency-scale": float("inf")})
    row = {k: 0 for k in ROUND_FIELDS}
    row.update(accuracy=float("nan"), loss=np.float64("inf"), decode_error=float("-inf"),
               extra=[1.0, float("nan")])
    rec.record(row)

    def refuse(token):
        raise ValueError(f"{token} is not JSON")

    text = (tmp_path / "rounds.jsonl").read_text()
    parsed = json.loads(text, parse_constant=refuse)
    assert parsed["accuracy"] is None and parsed["loss"] is None
    assert parsed["decode_error"] is None and parsed["extra"] == [1.0, None]
    assert read_rounds(tmp_path) == [parsed]
    config = json.loads((tmp_path / "config.json").read_text(), parse_constant=refuse)
    assert config == {"latency-scale": None}


def test_the_launcher_comparison_reads_null_accuracy_without_crashing(tmp_path):
    from fl_gradcode.results import ROUND_FIELDS, RoundRecorder
    from server.launch import compare

    for name, accuracy in (("coded", [0.5, 0.8]), ("uncoded", [0.4, float("nan")])):
        rec = RoundRecorder(tmp_path / name, {})
        for r, acc in enumerate(accuracy, start=1):
            rec.record({**{k: 0 for k in ROUND_FIELDS}, "round": r, "decode": "exact",
                        "accuracy": acc, "virtual_s": float(r), "bytes_up": 0})
    text = compare(tmp_path / "coded", tmp_path / "uncoded")
    uncoded = next(line for line in text.splitlines() if line.startswith("uncoded"))
    assert uncoded.split()[1] == "-"  # its final accuracy is null: shown as missing
    assert "time to accuracy 0.800" in text  # the only final accuracy there is


# ======== the strategy wrapper: edges ============================================================
N = 6


def _run(rounds=2, grid_cls=InProcessGrid, n=N, **kw):
    app = ClientApp(mods=[gradient_coding_mod])
    app.train()(train)
    options = dict(code="frc", s=1, latency=Pareto(1.0, 1.5), seed=0, wire="float64",
                   straggler_timeout=1e6, measured_compute=False)
    strategy = GradientCoding(FedAvg(fraction_evaluate=0.0, min_available_nodes=n),
                              **{**options, **kw})
    grid = grid_cls(app, n)
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord({"w": Array(np.zeros(DIM))}),
                            num_rounds=rounds, train_config=ConfigRecord({}))
    return strategy, result, grid


def _rows(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "rounds.jsonl").read_text().splitlines()]


def test_documented_defaults_of_s():
    assert GradientCoding(FedAvg()).s == 1
    # s="auto" starts at the safe s_max before any observation
    assert GradientCoding(FedAvg(), s="auto", s_max=3).s == 3


def test_wallclock_deadline_before_any_round_is_the_straggler_timeout():
    strategy = GradientCoding(FedAvg(), timing="wallclock", straggler_timeout=7.0,
                              warmup_timeout=30.0)
    assert strategy.deadline_s(None) == 7.0
    assert strategy.deadline_s(2.0) == 2.0  # the caller's timeout, when shorter
    assert strategy.first_reply_deadline_s() is None


def test_config_json_names_the_latency_model_and_the_straggler_timeout(tmp_path):
    latency = Pareto(1.0, 1.5)
    GradientCoding(FedAvg(), latency=latency, straggler_timeout=7.0, results_dir=str(tmp_path))
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["latency"] == repr(latency)
    assert config["straggler_timeout"] == 7.0


def test_every_round_row_and_metric_record_has_the_documented_keys_spelled_once(tmp_path):
    _, result, _ = _run(results_dir=str(tmp_path))
    rows = _rows(tmp_path)
    assert len(rows) == 2
    for row in rows:
        assert {"late_dropped", "verified", "replies_read", "decode", "s"} <= set(row)
        assert len({key.lower() for key in row}) == len(row)  # one spelling per key
    for metrics in result.train_metrics_clientapp.values():
        assert "gc/late_dropped" in metrics and "gc/decoded" in metrics
        assert len({key.lower() for key in metrics}) == len(metrics)


def test_a_round_with_nothing_to_aggregate_records_every_key_with_its_default(tmp_path):
    """``aggregate_train`` of a round that was never configured (e.g. the privacy budget is
    spent): skipped, and its row has the same keys as a coded round's."""
    _run(rounds=1, results_dir=str(tmp_path / "coded"))
    strategy = GradientCoding(FedAvg(), results_dir=str(tmp_path / "idle"))
    arrays, metrics = strategy.aggregate_train(1, [])
    assert arrays is None
    (idle,) = _rows(tmp_path / "idle")
    (coded,) = _rows(tmp_path / "coded")
    assert set(idle) == set(coded)
    assert idle["decode"] == "skipped" and idle["verified"] is None
    assert idle["late_dropped"] == 0 and idle["clients_used"] == []
    assert metrics["gc/late_dropped"] == 0 and metrics["gc/decoded"] == 0


def test_ignore_stragglers_rounds_are_recorded_as_approx():
    strategy, _, _ = _run(code="ignore-stragglers", s=1, max_decode_error=1.0)
    assert [r["decode"] for r in strategy.history] == ["approx", "approx"]


def test_min_norm_decoding_reads_every_reply_it_uses_and_sparse_reads_one_per_group():
    sparse, _, _ = _run(rounds=1)
    dense, _, _ = _run(rounds=1, sparse_decoding=False)
    for strategy, expected in ((sparse, N // 2), (dense, None)):
        row = strategy.history[0]
        assert row["decode"] == "exact"
        used = len(row["clients_used"])
        assert row["replies_read"] == (used if expected is None else expected)
    assert len(dense.history[0]["clients_used"]) > N // 2  # more than one per FRC pair


class _RecordingGrid(InProcessGrid):
    def __init__(self, app, n):
        super().__init__(app, n)
        self.groups: list[str] = []

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        self.groups += [m.metadata.group_id for m in messages]
        return super().send_and_receive(messages, timeout=timeout)


def test_identify_messages_travel_in_the_identify_group():
    _, _, grid = _run(rounds=1, grid_cls=_RecordingGrid)
    assert grid.groups[:N] == ["identify"] * N


def test_virtual_nan_reply_is_read_in_full_on_arrival_and_the_round_waits_for_its_replica():
    """FRC n=6, s=1, groups (0, 1) (2, 3) (4, 5); workers 0, 2, 4 reply at 1 s, the others at
    10 s, and worker 0's array ``w`` holds a NaN. In virtual time every value is read as the
    reply arrives (the reason names the array, not just the integrity probe's sampled
    coordinates); rejected at once, the round waits for worker 1 (10 s) and decodes exactly."""
    outcome = run_wrapper(6, faults={(0, 1): "nan"}, straggler_timeout=100.0,
                          latency=FixedArrivals({1: [1.0, 10.0, 1.0, 10.0, 1.0, 10.0]}))
    row = outcome.rows[0]
    assert row["rejected_reasons"] == ["array 'w' contains NaN or Inf"]
    assert row["decode"] == "exact" and row["round_virtual_s"] == 10.0
    assert 1 in row["clients_used"] and 0 not in row["clients_used"]
    assert_model(outcome.models[1], fedavg(theta0(), range(6), 6))


def test_wallclock_nan_reply_found_at_decoding_leaves_an_approximate_round_labelled_approx():
    """Uncoded n=6: worker 0's NaN is found in the decoding pass (wallclock reads values
    there); the round is decoded again from workers 1..5, an approximation: FedAvg of
    partitions 1..5."""
    outcome = run_wrapper(6, code="uncoded", s=0, timing="wallclock", faults={(0, 1): "nan"})
    row = outcome.rows[0]
    assert row["decode"] == "approx"
    assert row["clients_used"] == [1, 2, 3, 4, 5] and row["rejected"] == 1
    assert_model(outcome.models[1], fedavg(theta0(), range(1, 6), 6))


def test_an_unresolved_contradiction_logs_how_far_the_replicas_disagree(caplog):
    """FRC s=1: node 0 scales its reply by 1.5, its one replica disagrees and nothing tells
    which lies: the pair is left out (before: the round was skipped), the other groups decode,
    and the warning gives the recorded disagreement."""
    apps = []
    for pid in range(N):
        app = ClientApp(mods=[scaling_mod(0, 1.5), gradient_coding_mod] if pid == 0
                        else [gradient_coding_mod])
        app.train()(train)
        apps.append(app)
    strategy = GradientCoding(FedAvg(fraction_evaluate=0.0, min_available_nodes=N), code="frc",
                              s=1, latency=Pareto(1.0, 1.5), seed=0, verify=True,
                              straggler_timeout=1e6, wire="float64")
    with caplog.at_level(logging.WARNING, logger="flwr"):
        strategy.start(grid=InProcessGrid(None, N, apps=apps),
                       initial_arrays=ArrayRecord({"w": Array(np.zeros(DIM))}),
                       num_rounds=1, train_config=ConfigRecord({}))
    row = strategy.history[0]
    assert row["decode"] == "approx" and row["disagreement"] > 1e-3
    assert row["unsettled"] == [0, 1] and row["quarantined"] == []
    messages = [r.getMessage() for r in caplog.records if "agreeing replicas" in r.msg]
    expected = (f"round 1: workers [0, 1]: no s + 1 = 2 agreeing replicas settle their group "
                f"(disagreement {row['disagreement']:.3g}, or replies missing); left out of the "
                "decoding, nobody blamed")
    assert messages == [expected]


def test_round_metrics_carry_the_decode_error():
    _, result, _ = _run(rounds=1, code="ignore-stragglers", s=1, max_decode_error=1.0)
    (metrics,) = result.train_metrics_clientapp.values()
    assert 0.0 < metrics["gc/decode_error"] <= 1.0  # an approximate round: a positive error


def test_keyed_central_noise_is_drawn_for_the_round_and_the_run_nonce():
    """Central DP with a server key: the noise is seeded by HMAC(key, nonce, round), so two
    runs with the same key and nonce release the same model and another nonce changes it."""
    from fl_gradcode.privacy import DPConfig, ServerNoise

    def released(nonce):
        strategy, result, _ = _run(rounds=1, dp=DPConfig(mode="central", clip_norm=1.0,
                                                         noise_multiplier=0.5),
                                   server_noise=ServerNoise(key=bytes(32)),
                                   dp_run_nonce=nonce)
        assert strategy.history[0]["decode"] == "exact"
        return result.arrays["w"].numpy()

    a, b, c = released("run-a"), released("run-a"), released("run-b")
    np.testing.assert_array_equal(a, b)
    assert np.all(np.isfinite(a)) and not np.allclose(a, c)


# ======== the strategy wrapper's plumbing: edges =================================================
#: central DP that neither clips nor adds noise: only the accountant acts here
_NO_NOISE = privacy.DPConfig(mode="central", clip_norm=1e9, noise_multiplier=0.0)


class _Budget:
    """A stand-in privacy accountant: the first ``rounds`` rounds fit the budget and each
    stepped round costs ε = 0.5 (the wrapper asks only ``can_run_round``, ``step``,
    ``epsilon``)."""

    def __init__(self, rounds: int) -> None:
        self.allowed, self.steps = rounds, []

    def can_run_round(self, noise_multiplier=None) -> bool:
        return len(self.steps) < self.allowed

    def step(self, noise_multiplier=None) -> float:
        self.steps.append(noise_multiplier)
        return self.epsilon

    @property
    def epsilon(self) -> float:
        return 0.5 * len(self.steps)


def test_a_spent_privacy_budget_stops_training_for_good_and_says_so_once(flwr_log):
    budget = _Budget(rounds=2)
    strategy, result, _ = _run(rounds=4, accountant=budget, dp=_NO_NOISE)
    rows = strategy.history
    assert [r["decode"] for r in rows] == ["exact", "exact", "skipped", "skipped"]
    assert [r["stopped"] for r in rows] == [False, False, True, True]
    assert [r["epsilon"] for r in rows] == [0.5, 1.0, 1.0, 1.0]
    # a coded round's row carries its deadline (the straggler timeout); an idle one none
    assert [r["round_deadline_s"] for r in rows] == [1e6, 1e6, None, None]
    assert len(budget.steps) == 2 and strategy.stopped is True
    stops = [(level, line) for level, line in flwr_log if "target-epsilon" in line]
    assert stops == [(logging.INFO, "round 3 would exceed target-epsilon: training stops")]
    # the last model within the budget is the result: two rounds of FedAvg (numpy oracle)
    np.testing.assert_allclose(result.arrays["w"].numpy(), vector_oracle(2, N), atol=1e-9)


def test_a_run_in_which_no_round_applied_an_update_returns_the_initial_model(flwr_log):
    strategy, result, _ = _run(rounds=2, accountant=_Budget(rounds=0), dp=_NO_NOISE)
    assert [r["decode"] for r in strategy.history] == ["skipped", "skipped"]
    assert list(result.arrays) == ["w"]
    np.testing.assert_array_equal(result.arrays["w"].numpy(), np.zeros(DIM))
    assert (logging.WARNING, "no round applied an update (see rounds.jsonl): the returned "
            "model is the initial one") in flwr_log


class _FailingEvaluation(FedAvg):
    def aggregate_evaluate(self, server_round, replies):
        raise ValueError("no 'accuracy' in the replies")


def test_an_evaluation_the_inner_strategy_cannot_aggregate_is_warned_and_skipped(flwr_log):
    strategy = GradientCoding(_FailingEvaluation())
    assert strategy.aggregate_evaluate(3, []) is None
    assert (logging.WARNING, "round 3: evaluation not aggregated: no 'accuracy' in the replies"
            ) in flwr_log


def test_an_unknown_attribute_is_an_attribute_error_naming_it():
    strategy = GradientCoding(FedAvg())
    with pytest.raises(AttributeError,
                       match=r"^'GradientCoding' object has no attribute 'no_such_option'$"):
        _ = strategy.no_such_option
    assert not hasattr(strategy, "no_such_option")
    with pytest.raises(AttributeError, match=r"^GradientCoding\.configure_fit does not exist"):
        _ = strategy.configure_fit  # Flower's legacy API


class _NonceGrid(InProcessGrid):
    """Records the nonce of every instruction sent through ``send_and_receive``, by op."""

    def __init__(self, app, n):
        super().__init__(app, n)
        self.nonces: dict[str, list[str]] = {}

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        for msg in messages:
            instruction = protocol.parse_instruction(msg.content)
            if instruction is not None:
                self.nonces.setdefault(instruction.op, []).append(instruction.nonce)
        return super().send_and_receive(messages, timeout=timeout)


def test_the_run_nonce_is_fresh_per_run_unless_pinned_and_the_handshake_carries_it():
    first, second = GradientCoding(FedAvg()), GradientCoding(FedAvg())
    assert first.nonce and second.nonce and first.nonce != second.nonce
    assert GradientCoding(FedAvg(), dp_run_nonce="pinned-run").nonce == "pinned-run"
    _, _, grid = _run(rounds=1, grid_cls=_NonceGrid, dp_run_nonce="pinned-run")
    assert grid.nonces[protocol.OP_IDENTIFY] == ["pinned-run"] * N


def test_the_reply_dtype_is_the_wire_option_else_chosen_from_the_code():
    from fl_gradcode.codes import make_code

    frc = make_code("frc", 6, 1)  # decoding adds one reply per group: no amplification
    assert GradientCoding(FedAvg()).wire_for(frc) == "model"
    assert GradientCoding(FedAvg(), wire="float64").wire_for(frc) == "float64"
    assert GradientCoding(FedAvg(), wire="model").wire_for(make_code("crc", 10, 3)) == "model"


class _TwoArrayRecords(FedAvg):
    """FedAvg keeping its model under ``"weights"`` and sending a second ArrayRecord."""

    def configure_train(self, server_round, arrays, config, grid):
        messages = list(super().configure_train(server_round, arrays, config, grid))
        for msg in messages:
            msg.content["aux"] = ArrayRecord({"z": Array(np.ones(2))})
        return messages


def test_the_model_is_read_from_the_inner_strategys_arrayrecord_key():
    grid = InProcessGrid(make_app(gradient_coding_mod), 4)
    strategy = GradientCoding(_TwoArrayRecords(fraction_evaluate=0.0, arrayrecord_key="weights"),
                              code="frc", s=1, timing="wallclock", seed=0)
    msgs = list(strategy.configure_train(1, initial_arrays(), ConfigRecord({"lr": LR}),
                                         strategy.wrap_grid(grid)))
    assert len(msgs) == 4
    assert strategy.current_round.array_key == "weights"
    theta = {k: v.numpy() for k, v in msgs[0].content.array_records["weights"].items()}
    assert theta.keys() == theta0().keys()
    for key, value in theta0().items():
        np.testing.assert_array_equal(theta[key], value)


def _train_samples(msg: Message, context) -> Message:
    """The vector app, weighting its reply under ``"samples"``."""
    reply = train(msg, context)
    count = reply.content["metrics"]["num-examples"]
    return Message(RecordDict({"arrays": reply.content["arrays"],
                               "metrics": MetricRecord({"samples": count})}), reply_to=msg)


def test_an_unknown_aggregation_is_checked_once_with_the_strategys_weight_key():
    class Counting(FedAvg):
        """Its own ``aggregate_train`` (not a known averaging one: checked on copies once);
        each call's number of replies is kept class-wide (the copies share it)."""

        calls: ClassVar[list[int]] = []

        def aggregate_train(self, server_round, replies):
            replies = list(replies)
            type(self).calls.append(len(replies))
            return super().aggregate_train(server_round, replies)

    app = ClientApp(mods=[gradient_coding_mod])
    app.train()(_train_samples)
    strategy = GradientCoding(
        Counting(fraction_evaluate=0.0, min_available_nodes=N, weighted_by_key="samples"),
        code="frc", s=1, seed=0, wire="float64", straggler_timeout=1e6,
        measured_compute=False)
    result = strategy.start(grid=InProcessGrid(app, N),
                            initial_arrays=ArrayRecord({"w": Array(np.zeros(DIM))}),
                            num_rounds=3, train_config=ConfigRecord({}))
    # the check's three calls (four replies, one, the one again) in round 1, then one reply
    # per round
    assert Counting.calls == [4, 1, 1, 1, 1, 1]
    assert [r["decode"] for r in strategy.history] == ["exact"] * 3
    np.testing.assert_allclose(result.arrays["w"].numpy(), vector_oracle(3, N), atol=1e-9)
