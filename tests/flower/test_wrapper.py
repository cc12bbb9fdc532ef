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

import copy
import io
import itertools
import json
import logging
import time
import uuid
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, ClassVar

import numpy as np
import pytest
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Error,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAdam, FedAvg, FedAvgM

import fl_gradcode.adaptive as adaptive
from fl_gradcode.flower import GradientCoding, gradient_coding_mod, protocol
from fl_gradcode.flower.clock import VirtualClock
from fl_gradcode.flower.grid import EarlyReturnGrid
from fl_gradcode.flower.protocol import PROTOCOL_KEY, Instruction
from fl_gradcode.flower.testing import InProcessGrid, set_task_identity
from fl_gradcode.latency import Pareto
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
from tests.apps.vector_app import DIM, scaling_mod, train
from tests.apps.vector_app import oracle as vector_oracle
from tests.doubles import GridTime, PassThrough, RoundOwner, ScriptedGrid
from tests.flower.harness import FixedArrivals, run
from tests.flower.harness import run as run_wrapper


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
    return strategy, wrapped, {strategy.current_round.worker_of(m.metadata.dst_node_id): m
                               for m in msgs}


def _reply_from(msg: Message) -> Message:
    reply = Message(RecordDict(), reply_to=msg)
    reply.metadata.__dict__["_src_node_id"] = msg.metadata.dst_node_id
    return reply


def test_replies_pulled_together_are_validated_one_per_undecoded_group_first():
    # FRC n=6, s=2: groups (0, 1, 2) and (3, 4, 5)
    strategy, wrapped, sent = _configured_round(6, "frc", 2)
    batch = [_reply_from(sent[w]) for w in range(6)]
    view = strategy.current_round
    order = [view.worker_of(r.metadata.src_node_id) for r in strategy.prioritize(batch)]
    assert order == [0, 3, 1, 4, 2, 5]
    # once group (0, 1, 2) decodes (worker 1's valid reply), its replies go after those of
    # the undecoded group
    [reply] = wrapped.inner.send_and_receive([sent[1]], timeout=30)
    strategy.on_reply(reply)
    assert strategy.current_round.valid == (1,)
    order = [view.worker_of(r.metadata.src_node_id) for r in strategy.prioritize(batch)]
    assert order == [3, 4, 5, 0, 1, 2]



def test_wallclock_round_with_every_reply_at_once_returns_after_one_reply_per_group():
    # every reply is in the first poll: the round is ready after validating 2 of the 6
    strategy, wrapped, sent = _configured_round(6, "frc", 2)
    validated, original = [], strategy.collector.on_reply  # the grid's callback

    def on_reply(reply: Message) -> None:
        validated.append(strategy.current_round.worker_of(reply.metadata.src_node_id))
        original(reply)

    strategy.collector.on_reply = on_reply
    replies = wrapped.send_and_receive(list(sent.values()), timeout=30)
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


# ======== EarlyReturnGrid: edges =================================================================
def _coded_message(node: int) -> Message:
    msg = protocol.instruction_message(RecordDict(), Instruction(op=protocol.OP_TRAIN), node, "1")
    msg.metadata.__dict__["_message_id"] = f"m{next(_ids)}"
    return msg


@pytest.fixture
def clock(monkeypatch):
    return GridTime(start=100.0).install(monkeypatch)


def test_the_callers_timeout_reaches_the_round_deadline(clock):
    owner = RoundOwner(deadline=600.0)
    grid = EarlyReturnGrid(ScriptedGrid(clock), owner, poll_interval=0.5)
    msg = _coded_message(1)
    assert grid.send_and_receive([msg], timeout=2.0) == []
    assert owner.timeouts == [2.0]
    assert clock.now == 102.0  # gave up at the caller's 2 s, not the owner's 600 s
    assert set(grid.abandoned) == {msg.metadata.message_id}


def test_the_round_ends_when_the_clock_reaches_the_deadline(clock):
    """Deadline 1 s, poll_interval 0.5 s: the round returns at 1 s exactly, having waited no
    more than poll_interval between pulls; a reply that turns up at 1.25 s is not read this
    round (its message is abandoned)."""
    msg = _coded_message(1)
    inner = ScriptedGrid(clock, [(101.25, Message(RecordDict(), reply_to=msg))])
    grid = EarlyReturnGrid(inner, RoundOwner(deadline=1.0), poll_interval=0.5)
    assert grid.send_and_receive([msg]) == []
    assert clock.now == pytest.approx(101.0)
    assert 0.0 < max(clock.sleeps) <= 0.5
    assert set(grid.abandoned) == {msg.metadata.message_id}


def test_a_reply_is_picked_up_within_the_default_5_ms_poll_interval(clock):
    msg = _coded_message(1)
    reply = Message(RecordDict(), reply_to=msg)
    grid = EarlyReturnGrid(ScriptedGrid(clock, [(100.001, reply)]), RoundOwner())
    assert grid.send_and_receive([msg]) == [reply]
    assert 100.001 <= clock.now <= 100.001 + 0.005


def test_each_reply_is_picked_up_within_poll_interval_without_pulling_faster_when_quiet(clock):
    """poll_interval 0.8 s, replies pullable at 0, 2, 2.35 and 10 s: each is read within
    0.8 s of becoming pullable, in order, and the grid is not polled busily: over the 10 s
    round, fewer than twice the pulls of one pull per poll_interval."""
    msgs = [_coded_message(i) for i in (1, 2, 3, 4)]
    replies = [Message(RecordDict(), reply_to=m) for m in msgs]
    due = [100.0, 102.0, 102.35, 110.0]

    class Owner(RoundOwner):
        def __init__(self):
            super().__init__(deadline=20.0)
            self.read_at: list[float] = []

        def on_reply(self, reply):
            self.read_at.append(clock.now)
            super().on_reply(reply)

    owner = Owner()
    inner = ScriptedGrid(clock, list(zip(due, replies, strict=True)))
    grid = EarlyReturnGrid(inner, owner, poll_interval=0.8)
    assert grid.send_and_receive(msgs) == replies
    assert owner.seen == replies
    assert all(t <= read <= t + 0.8 for t, read in zip(due, owner.read_at, strict=True))
    assert len(inner.pulls) < 2 * (10.0 / 0.8)


class _HintingGrid(ScriptedGrid):
    """A grid that says when its next reply becomes pullable."""

    def __init__(self, clock, schedule=()):
        super().__init__(clock, schedule)
        self.asked: list[list[str]] = []

    def next_reply_in(self, ids):
        self.asked.append(list(ids))
        times = [t for t, _ in self.schedule]
        return min(times) - self.clock.now if times else None


@pytest.mark.parametrize("at", [100.3, 101.2])
def test_a_grid_that_knows_when_its_next_reply_is_due_is_pulled_right_then(clock, at):
    """With ``next_reply_in`` the reply is read at the instant it is due (0.3 s, or 1.2 s:
    beyond poll_interval 0.5 s), never waiting more than poll_interval between pulls: no
    pull misses its reply by a poll quantum."""
    msg = _coded_message(1)
    reply = Message(RecordDict(), reply_to=msg)
    inner = _HintingGrid(clock, [(at, reply)])
    grid = EarlyReturnGrid(inner, RoundOwner(), poll_interval=0.5)
    assert grid.send_and_receive([msg]) == [reply]
    assert clock.now == pytest.approx(at)
    assert max(clock.sleeps) <= 0.5
    assert inner.asked[0] == [msg.metadata.message_id]


def test_a_grid_with_no_reply_due_still_ends_the_round_at_its_deadline(clock):
    msg = _coded_message(1)
    inner = _HintingGrid(clock)
    grid = EarlyReturnGrid(inner, RoundOwner(deadline=1.0), poll_interval=0.5)
    assert grid.send_and_receive([msg]) == []
    assert clock.now == pytest.approx(101.0)
    assert 0.0 < max(clock.sleeps) <= 0.5


def test_a_second_reply_to_one_message_is_handed_to_the_strategy_to_reject(clock):
    owner = RoundOwner()
    msgs = [_coded_message(1), _coded_message(2)]
    first, again, other = (Message(RecordDict(), reply_to=m) for m in (msgs[0], msgs[0], msgs[1]))
    inner = ScriptedGrid(clock, [(100.0, first), (100.5, again), (100.5, other)])
    grid = EarlyReturnGrid(inner, owner, poll_interval=0.5)
    replies = grid.send_and_receive(msgs, timeout=5.0)
    assert replies == [first, other]
    assert owner.seen == [first, again, other]  # the duplicate too, as itself
    assert owner.prioritized == [2]  # only pulls of several replies are reordered


def test_messages_other_than_coded_train_pass_straight_to_the_inner_grid(clock):
    """Evaluate messages and plain train messages (no protocol record) are the inner grid's:
    one send_and_receive call with the caller's timeout, nothing pushed or pulled here."""
    from flwr.app import MessageType

    class Inner(ScriptedGrid):
        def __init__(self):
            super().__init__(clock)
            self.passed: list[tuple[int, float | None]] = []

        def send_and_receive(self, messages, *, timeout=None):
            self.passed.append((len(list(messages)), timeout))
            return ["inner reply"]

    inner, owner = Inner(), RoundOwner()
    grid = EarlyReturnGrid(inner, owner)
    evaluate = Message(RecordDict(), dst_node_id=3, message_type=MessageType.EVALUATE)
    plain = Message(RecordDict({"arrays": ArrayRecord({"w": Array(np.zeros(2))})}),
                    dst_node_id=3, message_type=MessageType.TRAIN)
    assert grid.send_and_receive([evaluate], timeout=4.0) == ["inner reply"]
    assert grid.send_and_receive([plain], timeout=5.0) == ["inner reply"]
    assert grid.send_and_receive([], timeout=6.0) == ["inner reply"]
    assert inner.passed == [(1, 4.0), (1, 5.0), (0, 6.0)]
    assert inner.pulls == [] and owner.seen == []


def test_the_grid_validates_a_pulled_batch_with_blas_on_one_thread_and_restores_it(clock):
    """The grid enters one single-threaded BLAS block around a pulled batch (each reply's own
    block inside it is then free); the caller's BLAS setting is back once the round returns."""
    from threadpoolctl import ThreadpoolController, threadpool_limits

    def threads():
        return [lib.num_threads for lib in ThreadpoolController().select(
            user_api="blas").lib_controllers]

    class Owner(RoundOwner):
        def __init__(self):
            super().__init__()
            self.during: list[list[int]] = []

        def on_reply(self, reply):
            self.during.append(threads())
            super().on_reply(reply)

        def ready(self):
            self.during.append(threads())
            return False

    msgs = [_coded_message(1), _coded_message(2)]
    replies = [Message(RecordDict(), reply_to=m) for m in msgs]
    owner = Owner()
    grid = EarlyReturnGrid(ScriptedGrid(clock, [(100.0, r) for r in replies]), owner)
    with threadpool_limits(limits=2, user_api="blas"):
        before = threads()
        if not before or 2 not in before:
            pytest.skip("no BLAS library that runs on 2 threads here")
        assert grid.send_and_receive(msgs, timeout=1.0) == replies
        assert threads() == before
    assert len(owner.during) == 4 and all(set(t) == {1} for t in owner.during)


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


def _auto_run(latency, rounds, monkeypatch, n=4, s_max=1):
    app = ClientApp(mods=[gradient_coding_mod])
    app.train()(train)
    strategy = GradientCoding(
        FedAvg(fraction_evaluate=0.0, min_available_nodes=n), s="auto", s_max=s_max,
        latency=latency, seed=0, wire="float64", straggler_timeout=1e6, measured_compute=False,
    )
    strategy.start(grid=InProcessGrid(app, n),
                   initial_arrays=ArrayRecord({"w": Array(np.zeros(DIM))}),
                   num_rounds=rounds, train_config=ConfigRecord({}))
    return strategy


def test_auto_feeds_the_estimator_each_replys_own_latency_when_nothing_was_queued(monkeypatch):
    """Round 1 (nobody busy, no queued work): the observed elapsed time of every reply in time
    is its replayed latency (1, 2, 3, 4 s), nothing added."""
    observed = []
    real = adaptive.LatencyEstimator.update

    def spy(self, elapsed, loads, duration, **kwargs):
        observed.append(np.array(elapsed, dtype=float))
        return real(self, elapsed, loads, duration, **kwargs)

    monkeypatch.setattr(adaptive.LatencyEstimator, "update", spy)
    _auto_run(FixedArrivals({1: [1.0, 2.0, 3.0, 4.0]}), 1, monkeypatch)
    (elapsed,) = observed
    seen = np.isfinite(elapsed)
    assert seen.sum() >= 2  # at least the replies that decoded
    np.testing.assert_array_equal(elapsed[seen], np.array([1.0, 2.0, 3.0, 4.0])[seen])


def test_auto_draws_fresh_monte_carlo_samples_every_round(monkeypatch):
    """Each decision with data gets its own generator: rounds 2 and 3 do not reuse one
    stream of draws."""
    draws = []
    real = adaptive.choose_s

    def spy(*args, **kwargs):
        rng = kwargs.get("rng")
        draws.append(None if rng is None else copy.deepcopy(rng).random(4))
        return real(*args, **kwargs)

    monkeypatch.setattr(adaptive, "choose_s", spy)
    _auto_run(Pareto(1.0, 1.5), 3, monkeypatch)
    assert len(draws) == 3
    assert all(d is not None for d in draws)
    assert not np.array_equal(draws[1], draws[2])


_ids = itertools.count()


def test_config_json_of_an_auto_run_names_the_nested_adaptive_code_and_s_auto(tmp_path):
    GradientCoding(FedAvg(), s="auto", s_max=3, results_dir=str(tmp_path))
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["code"] == "nested (adaptive)" and config["s"] == "auto"
    assert config["s_max"] == 3


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


def test_auto_raises_the_censoring_time_of_replies_still_outstanding(monkeypatch):
    """A reply due at 100 s is late in round 1 (decoded at 3 s): at each later decision
    before 100 s the estimator learns it has still not arrived, ``now`` seconds after round 1
    started (at 0)."""
    calls = []
    real = adaptive.LatencyEstimator.observe_pending

    def spy(self, round_id, client, elapsed):
        calls.append((round_id, client, elapsed))
        return real(self, round_id, client, elapsed)

    monkeypatch.setattr(adaptive.LatencyEstimator, "observe_pending", spy)
    times = {1: [1.0, 2.0, 3.0, 100.0], 2: [1.0] * 4, 3: [1.0] * 4}
    strategy = _auto_run(FixedArrivals(times), 3, monkeypatch)
    ends = [row["virtual_s"] for row in strategy.history]  # = the next round's start
    expected = [end for end in ends[:2] if end < 100.0]
    assert ends[0] == 3.0 and expected
    assert [(r, c) for r, c, _ in calls] == [(0, 3)] * len(expected)
    assert [e for _, _, e in calls] == pytest.approx(expected)


def test_auto_prices_a_busy_client_by_the_work_it_was_sent_and_when(monkeypatch):
    """What the policy is told about a busy client is what a server knows: the work it sent
    (2 partitions at s = 1) and how long ago (since round 1 started at 0), nothing about when
    the reply will come (100 s)."""
    seen = []
    real = adaptive.choose_s

    def spy(*args, **kwargs):
        seen.append((kwargs["busy_until"], kwargs["pending"], kwargs["now"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(adaptive, "choose_s", spy)
    times = {1: [1.0, 2.0, 3.0, 100.0], 2: [1.0] * 4}
    strategy = _auto_run(FixedArrivals(times), 2, monkeypatch)
    assert strategy.history[0]["s"] == 1
    busy_until, (elapsed, units), now = seen[1]
    assert busy_until is None and now == strategy.history[0]["virtual_s"] == 3.0
    np.testing.assert_array_equal(elapsed, [np.nan, np.nan, np.nan, 3.0])
    np.testing.assert_array_equal(units, [0.0, 0.0, 0.0, 2.0])
    # round 2: work queued behind the unfinished job adds to it (sent at 0 all the same)
    row = strategy.history[1]
    assert 3 not in row["busy"]  # queued, not skipped
    policy = strategy.code_policy
    extra = float(adaptive.code_loads(policy.placement(4).code(row["s"]))[3])
    # round 1's job (sent at 0, 2 units, back at 100 s) and round 2's queued behind it (sent
    # at 3 s; 1 s of its own after the 100-s job), each with its deadline (the timeout, 1e6 s)
    node = next(nd for nd, i in policy.book.node_index.items() if i == 3)
    assert policy.outstanding[node] == [[0.0, 2.0, 100.0, 1e6], [3.0, extra, 101.0, 3.0 + 1e6]]


def test_a_busy_nodes_current_job_starts_when_the_reply_before_it_arrived():
    """Jobs not known to be done: round 1's (sent at 0, 2 units, back at 5 s) and round 2's
    (sent at 3 s, 4 units, still out). At 4 s neither is back: 6 units, started at 0. At 8 s
    the first is done: 4 units, computing since its predecessor's reply at 5 s."""
    book = GradientCoding(FedAvg(), s="auto", s_max=3, seed=0).code_policy.book
    book.outstanding[7] = [[0.0, 2.0, 5.0], [3.0, 4.0, None]]
    assert book.pending_work(7, 4.0, 9.0) == (4.0, 6.0)
    assert book.pending_work(7, 8.0, 9.0) == (3.0, 4.0)
    assert book.outstanding[7] == [[3.0, 4.0, None]]
    # no record (work sent before a restart): the given largest load, from now
    assert book.pending_work(8, 8.0, 9.0) == (0.0, 9.0)


# ======== VirtualClock: edges ====================================================================
def test_virtual_clock_keeps_a_client_that_never_replied_busy_until_the_deadline():
    """Hand-computed: round starts at t=0, deadline 10 s, round ends at 3 s. Node 1 replied at
    2 s (free at 3), node 2 answered with an error (free at the round end), node 3 never
    answered: busy until 10 s, free again after that."""
    clock = VirtualClock(straggler_timeout=10.0)
    clock.start_round()
    clock.finish_round([1, 2, 3], {1: 2.0}, end=3.0, answered=[2])
    assert clock.now == 3.0
    assert clock.busy([1, 2, 3]) == {3}
    assert clock.busy_until == {1: 2.0, 2: 3.0, 3: 10.0}
    clock.wait_for_any_free([3])
    assert clock.now == 10.0
    assert clock.busy([1, 2, 3]) == set()


# ======== late replies: edges ====================================================================
def _train_message(node: int, server_round: int) -> Message:
    content = RecordDict({protocol.PROTOCOL_KEY: ConfigRecord({"op": protocol.OP_TRAIN})})
    return Message(content, dst_node_id=node, message_type=MessageType.TRAIN,
                   group_id=str(server_round))


class _SilentNodeGrid:
    """Accepts every message; replies of nodes in ``silent`` are held back until ``release``."""

    def __init__(self, silent: set[int]) -> None:
        self.silent = silent
        self.held: dict[str, Message] = {}
        self.ready: dict[str, Message] = {}

    def push_messages(self, messages):
        ids = []
        for msg in messages:
            mid = str(uuid.uuid4())
            msg.metadata.__dict__["_message_id"] = mid
            reply = Message(RecordDict(), reply_to=msg)
            reply.metadata.__dict__["_src_node_id"] = msg.metadata.dst_node_id
            reply.metadata.__dict__["_message_id"] = str(uuid.uuid4())
            (self.held if msg.metadata.dst_node_id in self.silent else self.ready)[mid] = reply
            ids.append(mid)
        return ids

    def release(self, node: int) -> None:
        for mid, reply in list(self.held.items()):
            if reply.metadata.src_node_id == node:
                self.ready[mid] = self.held.pop(mid)

    def pull_messages(self, ids):
        return [self.ready.pop(mid) for mid in list(ids) if mid in self.ready]


def test_late_reply_to_an_earlier_round_is_never_handed_to_the_current_round():
    """Round 1: node 3 does not answer before the deadline (busy). Round 2 (nodes 1, 2): its
    round-1 reply arrives meanwhile; the grid hands it to ``on_late_reply`` only, never to
    ``on_reply``, and returns only the round-2 replies."""
    set_task_identity()  # Flower's Message() needs a run id, as inside a ServerApp
    inner = _SilentNodeGrid(silent={3})
    owner = RoundOwner(deadline=0.05)
    grid = EarlyReturnGrid(inner, owner, poll_interval=0.001)

    replies = grid.send_and_receive([_train_message(n, 1) for n in (1, 2, 3)])
    assert sorted(r.metadata.src_node_id for r in replies) == [1, 2]
    assert grid.busy_nodes() == {3}

    inner.release(3)  # the round-1 reply of node 3 is now pullable
    replies = grid.send_and_receive([_train_message(n, 2) for n in (1, 2)])

    assert sorted((r.metadata.src_node_id, r.metadata.group_id) for r in replies) == [
        (1, "2"), (2, "2")]
    def sent_in(replies):
        return [(r.metadata.src_node_id, r.metadata.group_id) for r in replies]

    assert sorted(sent_in(owner.seen)) == [(1, "1"), (1, "2"), (2, "1"), (2, "2")]
    assert sent_in(owner.late) == [(3, "1")]
    assert owner.unsent == []  # every message is accepted
    assert grid.busy_nodes() == set()


# ======== the strategy wrapper's plumbing: edges =================================================
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
    strategy, result, _ = _run(rounds=4, accountant=budget)
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
    strategy, result, _ = _run(rounds=2, accountant=_Budget(rounds=0))
    assert [r["decode"] for r in strategy.history] == ["skipped", "skipped"]
    assert list(result.arrays) == ["w"]
    np.testing.assert_array_equal(result.arrays["w"].numpy(), np.zeros(DIM))
    assert (logging.WARNING, "no round applied an update (see rounds.jsonl): the returned "
            "model is the initial one") in flwr_log


def test_an_idle_rounds_row_counts_the_late_and_the_stopped_replies_since_the_last_row():
    set_task_identity()  # Flower's Message() needs a run id, as inside a ServerApp
    strategy = GradientCoding(FedAvg())
    sent = [_train_message(node, 1) for node in (4, 5, 6)]
    strategy.on_late_reply(Message(Error(code=protocol.STOPPED_CODE, reason="stopped"),
                                   reply_to=sent[0]))
    strategy.on_late_reply(Message(Error(code=protocol.STOPPED_CODE, reason="stopped"),
                                   reply_to=sent[1]))
    strategy.on_late_reply(_reply_from(sent[2]))
    _, metrics = strategy.aggregate_train(2, [])
    row = strategy.history[-1]
    assert (row["late_dropped"], row["stopped_at_deadline"]) == (1, 2)
    assert metrics["gc/late_dropped"] == 1
    strategy.aggregate_train(3, [])  # counted once
    assert (strategy.history[-1]["late_dropped"], strategy.history[-1]["stopped_at_deadline"]) \
        == (0, 0)


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
    # the check's two calls (four replies, one) in round 1, then one reply per round
    assert Counting.calls == [4, 1, 1, 1, 1]
    assert [r["decode"] for r in strategy.history] == ["exact"] * 3
    np.testing.assert_allclose(result.arrays["w"].numpy(), vector_oracle(3, N), atol=1e-9)


def test_every_adaptive_keyword_reaches_the_options_and_the_code_policy():
    strategy = GradientCoding(FedAvg(), s="auto", s_max=3, exclude_slow=2.5)
    assert strategy.exclude_slow == 2.5 and strategy.code_policy.exclude_slow == 2.5
    # s="auto" starts at the safe s_max before any observation (not at 8 // 4 = 2)
    assert strategy.code_for(8).s == 3
    with pytest.raises(ValueError, match=r"exclude_slow=0\.5 must be a slowness factor > 1"):
        GradientCoding(FedAvg(), s="auto", exclude_slow=0.5)


def test_stop_late_work_stops_a_virtual_worker_at_the_deadline():
    """FRC n=6, s=1, deadline 5 s: worker 5 would reply at 20 s; its partner 4 replies at
    1 s, so the round decodes exactly and worker 5 is stopped at the deadline (not late)."""
    arrivals = FixedArrivals({1: [1.0] * 5 + [20.0]})
    rows = {stop: run(6, latency=arrivals, straggler_timeout=5.0, stop_late_work=stop).rows[0]
            for stop in (False, True)}
    assert (rows[True]["late_dropped"], rows[True]["stopped_at_deadline"]) == (0, 1)
    assert (rows[False]["late_dropped"], rows[False]["stopped_at_deadline"]) == (1, 0)
    assert GradientCoding(FedAvg(), stop_late_work=True).stop_late_work is True


def test_wallclock_deadline_with_stopping_counts_from_the_messages_creation(monkeypatch):
    """Workers stop ``straggler_timeout`` (10 s) after their message was created: a round-2
    grid that starts waiting 4 s after the creation waits the remaining 6 s."""
    import fl_gradcode.flower.clock as clock_module

    grid = InProcessGrid(make_app(gradient_coding_mod), 4)
    strategy = GradientCoding(FedAvg(fraction_evaluate=0.0), code="frc", s=1,
                              timing="wallclock", straggler_timeout=10.0, stop_late_work=True,
                              seed=0)
    msgs = list(strategy.configure_train(2, initial_arrays(), ConfigRecord({"lr": LR}),
                                         strategy.wrap_grid(grid)))
    assert len(msgs) == 4
    created = min(float(m.metadata.created_at) for m in msgs)
    monkeypatch.setattr(clock_module, "time", SimpleNamespace(
        time=lambda: created + 4.0, monotonic=time.monotonic))
    assert strategy.deadline_s(None) == pytest.approx(6.0)
    assert strategy.deadline_s(5.0) == pytest.approx(1.0)  # the caller's 5 s, less the 4


# ====================================================================== clock, unit by unit
def _sent_at(created: float) -> SimpleNamespace:
    """A sent message as grid_limit_s reads it (only its creation time)."""
    return SimpleNamespace(metadata=SimpleNamespace(created_at=created))


@pytest.fixture
def frozen_time(monkeypatch):
    """clock.time.time() fixed at 1000.0 (so elapsed seconds are exact)."""
    import fl_gradcode.flower.clock as clock_module

    monkeypatch.setattr(clock_module, "time", SimpleNamespace(
        time=lambda: 1000.0, monotonic=time.monotonic))
    return 1000.0


@pytest.mark.parametrize("timing", ["virtual", "wallclock"])
def test_a_default_clock_does_not_stop_late_work_and_starts_at_zero(timing):
    from fl_gradcode.flower.clock import make_clock
    from fl_gradcode.flower.options import TimingOptions

    clock = make_clock(TimingOptions(mode=timing), 3.0)
    assert clock.stop_at_deadline is False
    assert clock.now == 0.0 and clock.round_start == 0.0
    assert dict(clock.backlog) == {}


def test_virtual_clock_defaults_keep_late_replies_and_cost_nothing_per_load_unit():
    clock = VirtualClock(1.0)
    assert clock.stop_at_deadline is False
    # arrival = compute 0.5 + 0 s per load unit + delay 0.25 (no bandwidth: no transfer)
    assert clock.arrival(0.5, 1000, lambda: 2.0, lambda units: 0.25) == pytest.approx(0.75)
    clock.start_round()
    window = clock.window({0: 0.5, 1: 2.0}, lambda used: len(used) == 2, num_sent=2)
    # worker 1 arrives after the 1 s deadline: late (it still replies), not stopped
    assert (window.used, window.end, window.late, window.stopped) == ([0], 1.0, [1], [])


def test_virtual_stopped_workers_are_reported_when_the_round_ends_at_the_deadline():
    clock = VirtualClock(1.0, stop_at_deadline=True)
    clock.start_round()
    window = clock.window({0: 0.5, 1: 2.0}, lambda used: len(used) == 2, num_sent=2)
    # undecodable at the 1 s deadline; worker 1 (2 s) stops there and never replies
    assert (window.used, window.end, window.late, window.stopped) == ([0], 1.0, [], [1])


def test_virtual_work_queued_on_a_never_used_node_waits_for_nothing():
    clock = VirtualClock(2.0)
    clock.start_round(queued={3: 7})  # node 7 has never been sent work
    assert clock.backlog == {3: 0.0}


def test_virtual_wait_for_a_free_node_does_not_move_when_a_never_used_node_is_free():
    clock = VirtualClock(5.0)
    clock.start_round()
    clock.finish_round([1], {1: 4.0}, end=0.5)  # node 1 busy until 4 s; now = 0.5 s
    assert clock.now == 0.5
    clock.wait_for_any_free([1, 2])  # node 2 never used: free now
    assert clock.now == 0.5
    clock.wait_for_any_free([1])  # only node 1: jump to 4 s
    assert clock.now == 4.0


def test_wallclock_tells_workers_to_stop_only_with_stopping_and_from_round_2():
    from fl_gradcode.flower.clock import WallClock

    assert WallClock(4.0).stop_after_s(2) == 0.0
    assert WallClock(4.0, stop_at_deadline=True).stop_after_s(1) == 0.0
    assert WallClock(4.0, stop_at_deadline=True).stop_after_s(2) == 4.0


def test_wallclock_grid_limit_counts_from_creation_only_when_workers_stop(frozen_time):
    from fl_gradcode.flower.clock import WallClock
    from fl_gradcode.flower.options import DeadlineOptions

    timeouts = DeadlineOptions(straggler_timeout=4.0, warmup_timeout=9.0)
    old = [_sent_at(frozen_time - 3.0)]  # created 3 s ago
    # no stopping: the full deadline, however old the messages
    assert WallClock(4.0).grid_limit_s(2, timeouts, None, old) == 4.0
    stopping = WallClock(4.0, stop_at_deadline=True)
    # round 1 (no stopping yet): max(straggler 4, warm-up 9), not counted from creation
    assert stopping.grid_limit_s(1, timeouts, None, old) == 9.0
    assert stopping.grid_limit_s(2, timeouts, None, old) == 1.0  # 4 - 3
    assert stopping.grid_limit_s(2, timeouts, None, [_sent_at(frozen_time)]) == 4.0  # 4 - 0
    # created 0.5 s ago: 3.5 s left; "in the future" (another host's clock): nothing elapsed
    assert stopping.grid_limit_s(2, timeouts, None, [_sent_at(frozen_time - 0.5)]) == 3.5
    assert stopping.grid_limit_s(2, timeouts, None, [_sent_at(frozen_time + 2.0)]) == 4.0
    # created 10 s ago: the deadline has passed, the grid does not wait at all
    assert stopping.grid_limit_s(2, timeouts, None, [_sent_at(frozen_time - 10.0)]) == 0.0
