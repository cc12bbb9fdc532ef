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
wall-clock ``delay``, by grids that tamper with or drop messages, or, in virtual timing, by a
fixed table of arrival times (``measured_compute=False``: arrivals are exactly the table).
"""

from __future__ import annotations

import io
import itertools
import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    RecordDict,
)
from flwr.serverapp.strategy import FedAdam, FedAvg, FedAvgM, Strategy

from fl_gradcode.flower import GradientCoding, gradient_coding_mod
from fl_gradcode.flower.protocol import PROTOCOL_KEY
from fl_gradcode.flower.testing import InProcessGrid
from tests.apps.numpy_app import (
    LR,
    META_KEY,
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


# =============================================================================== 4. rejection
REJECTIONS = {
    "error": "error reply",
    "no-arrays": "lacks",
    "no-metrics": "lacks",
    "wrong-keys": "array keys",
    "extra-key": "array keys",
    "wrong-shape": "shape",
    "string-dtype": "dtype",
    "bool-dtype": "dtype",
    "complex-dtype": "dtype",
    "nan": "NaN or Inf",
    "inf": "NaN or Inf",
    "int-dtype": "dtype",
    "corrupt-bytes": "not .npy",
    "truncated-bytes": "truncated",
    "object-dtype": "Python objects",
    "wrong-stype": "serialization",
    "list-count": "not a number",
    "str-compute": "not a number",
    "list-app-metric": "not a number",
    "nan-count": "not finite",
    "negative-compute": "negative",
    "other-worker": "claims worker 1",
    "other-round": "computed for round 99",
}


@pytest.mark.parametrize("kind", list(REJECTIONS))
def test_bad_reply_is_rejected_counted_and_never_decoded(kind):
    outcome = run(6, faults={(0, 1): kind})
    row = outcome.rows[0]
    assert row["rejected"] == 1
    assert len(row["rejected_reasons"]) == 1
    assert REJECTIONS[kind] in row["rejected_reasons"][0]
    assert 0 not in row["clients_used"] and 0 in row["stragglers"]
    assert row["decode"] == "exact"  # worker 1 covers group (0, 1)
    assert outcome.result.train_metrics_clientapp[1]["gc/rejected"] == 1
    assert_model(outcome.models[1], fedavg(theta0(), range(6), 6))


@pytest.mark.parametrize("kind", ["nan", "inf"])
def test_wallclock_non_finite_reply_is_rejected_and_never_decoded(kind):
    outcome = run(6, timing="wallclock", faults={(0, 1): kind})
    row = outcome.rows[0]
    assert row["rejected"] == 1 and "NaN or Inf" in row["rejected_reasons"][0]
    assert 0 not in row["clients_used"]
    assert row["decode"] == "exact"
    assert_model(outcome.models[1], fedavg(theta0(), range(6), 6))


class TamperingGrid:
    """A delegating grid that hands every pulled reply to ``tamper(grid, reply)``."""

    def __init__(self, inner: InProcessGrid, tamper: Callable[[Any, Message], None]):
        self.inner, self.tamper, self.seen = inner, tamper, {}

    def get_node_ids(self):
        return self.inner.get_node_ids()

    def push_messages(self, messages):
        return self.inner.push_messages(messages)

    def pull_messages(self, message_ids):
        replies = list(self.inner.pull_messages(message_ids))
        for reply in replies:
            self.tamper(self, reply)
        return replies

    def send_and_receive(self, messages, *, timeout=None):
        return self.inner.send_and_receive(messages, timeout=timeout)


def _is_round_1_reply_of(grid: TamperingGrid, reply: Message, worker: int) -> bool:
    node = grid.inner.node_ids[worker]
    return reply.metadata.src_node_id == node and reply.metadata.group_id == "1"


def _unknown_sender(grid, reply):
    if _is_round_1_reply_of(grid, reply, 0):
        reply.metadata.__dict__["_src_node_id"] = 424242


def _reply_to_another_round(grid, reply):
    if _is_round_1_reply_of(grid, reply, 0):
        reply.metadata.__dict__["_group_id"] = "7"


def _duplicate_sender(grid, reply):
    """Worker 1's reply is replaced by a poisoned copy of worker 0's, sent as node 0."""
    if _is_round_1_reply_of(grid, reply, 0):
        grid.seen[0] = reply.content
    elif _is_round_1_reply_of(grid, reply, 1):
        copy = grid.seen[0]
        arrays = {k: Array(v.numpy() + 1000.0) for k, v in copy[PROTOCOL_KEY].items()}
        reply.content = RecordDict({PROTOCOL_KEY: ArrayRecord(arrays), META_KEY: copy[META_KEY]})
        reply.metadata.__dict__["_src_node_id"] = grid.inner.node_ids[0]


SENDER_FAULTS = {
    # (the first decodable prefix in worker order: group (4, 5) is covered by worker 4)
    "unknown-sender": (_unknown_sender, "unknown sender", [1, 2, 3, 4]),
    "other-round-group": (_reply_to_another_round, "reply to round '7'", [1, 2, 3, 4]),
    "duplicate-sender": (_duplicate_sender, "duplicate sender", [0, 2, 3, 4]),
}


@pytest.mark.parametrize("kind", list(SENDER_FAULTS))
def test_reply_from_the_wrong_sender_or_round_is_rejected_and_never_decoded(kind):
    tamper, reason, used = SENDER_FAULTS[kind]
    grid = TamperingGrid(InProcessGrid(make_app(gradient_coding_mod), 6), tamper)
    outcome = run(6, grid=grid)
    row = outcome.rows[0]
    assert row["rejected"] == 1
    assert reason in row["rejected_reasons"][0]
    assert row["decode"] == "exact"
    assert row["clients_used"] == used
    assert_model(outcome.models[1], fedavg(theta0(), range(6), 6))


def test_replayed_reply_handed_to_aggregate_train_is_a_duplicate_sender():
    """A reply fed twice (a new message id, the same node) is rejected the second time."""
    grid = InProcessGrid(make_app(gradient_coding_mod), 4)
    strategy = GradientCoding(FedAvg(fraction_evaluate=0.0), code="frc", s=1,
                              measured_compute=False)
    arrays = initial_arrays()
    wrapped = strategy.wrap_grid(grid)
    msgs = list(strategy.configure_train(1, arrays, ConfigRecord({"lr": LR}), wrapped))
    replies = wrapped.send_and_receive(msgs, timeout=60)
    replay = Message(replies[0].content, reply_to=msgs[0])
    replay.metadata.__dict__["_src_node_id"] = replies[0].metadata.src_node_id
    replay.metadata.__dict__["_message_id"] = "replayed"
    new_arrays, _ = strategy.aggregate_train(1, [*replies, replay])
    row = strategy.history[0]
    assert row["rejected"] == 1 and "duplicate sender" in row["rejected_reasons"][0]
    assert row["decode"] == "exact"
    assert_model(as_dict(new_arrays), fedavg(theta0(), range(4), 4))


# =============================================================================== 5. handshake
def test_node_without_the_mod_is_a_straggler_of_the_round_not_the_end_of_the_run():
    """(More in test_membership.py.) Its handshake fails: the round is FedAvg over the
    other five nodes' partitions and rounds.jsonl names it."""
    apps = [make_app(gradient_coding_mod)] * 5 + [make_app()]
    grid = InProcessGrid(None, 6, apps=apps)
    outcome = run(6, code="grouped-rs", grid=grid, warmup_timeout=0.3)
    assert_model(outcome.models[1], fedavg(theta0(), range(5), 6))
    assert outcome.rows[0]["unidentified"] == [grid.node_ids[5]]


def test_two_nodes_claiming_the_same_partition_leave_one_claimant_excluded():
    grid = InProcessGrid(make_app(gradient_coding_mod), 6,
                         node_config=lambda i: {"partition-id": i % 5})
    outcome = run(6, code="grouped-rs", grid=grid)
    assert_model(outcome.models[1], fedavg(theta0(), range(5), 6))
    assert outcome.rows[0]["identity_rejected"] == [max(grid.node_ids[0], grid.node_ids[5])]


# =============================================================================== 6. min replies
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


# =============================================================================== 7. composition
class PassThrough(Strategy):
    """A wrapper in the style of Flower's DP wrappers: composition, no ``start`` override."""

    def __init__(self, inner: Strategy):
        self.inner = inner

    def configure_train(self, *args):
        return self.inner.configure_train(*args)

    def aggregate_train(self, *args):
        return self.inner.aggregate_train(*args)

    def configure_evaluate(self, *args):
        return self.inner.configure_evaluate(*args)

    def aggregate_evaluate(self, *args):
        return self.inner.aggregate_evaluate(*args)

    def summary(self):
        self.inner.summary()


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


# ======================================================================== 8. inner strategies
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


# =============================================================================== 9. results
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


# =============================================================================== 10. grid drops
class DroppingGrid(InProcessGrid):
    """Like Flower's InMemoryGrid when the link refuses a message: it sets the message's id,
    then leaves it out of the returned list (which is shorter than the messages)."""

    def __init__(self, *args, drop: set[tuple[int, int]], **kwargs):
        super().__init__(*args, **kwargs)
        self.drop = drop

    def push_messages(self, messages):
        ids = []
        for msg in messages:
            group = msg.metadata.group_id
            key = (self.index[msg.metadata.dst_node_id], int(group) if group.isdigit() else 0)
            if key in self.drop:
                msg.metadata.__dict__["_message_id"] = "refused"
                continue
            ids.extend(super().push_messages([msg]))
        return ids


def test_message_the_grid_does_not_accept_makes_its_worker_a_straggler():
    grid = DroppingGrid(make_app(gradient_coding_mod), 6, drop={(3, 1)})
    outcome = run(6, grid=grid, rounds=2,
                  latency=FixedArrivals({1: [1.0] * 6, 2: [1.0] * 6}), straggler_timeout=1.5)
    first, second = outcome.rows
    assert first["decode"] == "exact" and 3 in first["stragglers"]
    assert 3 not in first["clients_used"]
    assert second["decode"] == "exact"
    assert_model(outcome.models[2], fedavg_rounds(theta0(), 2, 6))


def test_wallclock_busy_tracking_survives_a_grid_that_drops_a_message():
    # worker 3's round-1 message is refused, worker 4's round-1 reply takes 5 s: in round 2
    # the busy worker is 4 (still computing), not 3 (never got work)
    grid = DroppingGrid(make_app(gradient_coding_mod), 6, drop={(3, 1)},
                        delay=lambda w, r: 5.0 if (w, r) == (4, 1) else 0.0)
    outcome = run(6, grid=grid, rounds=2, timing="wallclock", straggler_timeout=4.0)
    first, second = outcome.rows
    assert first["clients_used"] == [0, 1, 2, 5] and first["decode"] == "exact"
    assert second["busy"] == [4]
    assert second["clients_used"] == [0, 1, 2, 3, 5]
    assert_model(outcome.models[2], fedavg_rounds(theta0(), 2, 6))


# =============================================================================== 11. NaN guard
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



def _configured_round(n: int, code: str, s: int):
    grid = InProcessGrid(make_app(gradient_coding_mod), n)
    strategy = GradientCoding(FedAvg(fraction_evaluate=0.0), code=code, s=s,
                              timing="wallclock", seed=0)
    wrapped = strategy.wrap_grid(grid)
    msgs = list(strategy.configure_train(1, initial_arrays(), ConfigRecord({"lr": LR}), wrapped))
    strategy._grid_for_test = wrapped
    return strategy, {strategy._round.cohort.index(m.metadata.dst_node_id): m for m in msgs}


def _reply_from(msg: Message) -> Message:
    reply = Message(RecordDict(), reply_to=msg)
    reply.metadata.__dict__["_src_node_id"] = msg.metadata.dst_node_id
    return reply


def test_replies_pulled_together_are_validated_one_per_undecoded_group_first():
    # FRC n=6, s=2: groups (0, 1, 2) and (3, 4, 5)
    strategy, sent = _configured_round(6, "frc", 2)
    batch = [_reply_from(sent[w]) for w in range(6)]
    order = [strategy._round.worker_of[r.metadata.src_node_id]
             for r in strategy.prioritize(batch)]
    assert order == [0, 3, 1, 4, 2, 5]
    # once group (0, 1, 2) decodes, its replies go after those of the undecoded group
    strategy._round.tracker.add(1)
    order = [strategy._round.worker_of[r.metadata.src_node_id]
             for r in strategy.prioritize(batch)]
    assert order == [3, 4, 5, 0, 1, 2]



def test_wallclock_round_with_every_reply_at_once_returns_after_one_reply_per_group():
    # every reply is in the first poll: the round is ready after validating 2 of the 6
    strategy, sent = _configured_round(6, "frc", 2)
    validated, original = [], strategy.on_reply

    def on_reply(reply: Message) -> None:
        validated.append(strategy._round.worker_of[reply.metadata.src_node_id])
        original(reply)

    strategy.on_reply = on_reply
    replies = strategy._grid_for_test.send_and_receive(list(sent.values()), timeout=30)
    assert len(replies) == 6 and validated == [0, 3]
    _, _ = strategy.aggregate_train(1, replies)  # the other four are validated here
    assert set(validated) == set(range(6)) and strategy.history[0]["decode"] == "exact"
    assert strategy.history[0]["replies_read"] == 2


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
