"""Specification of the Flower plug-in, rejection: a reply the wrapper must not decode is
rejected, counted and never decoded, and a message the grid does not accept makes its worker a
straggler.

Real ClientApps in-process (``InProcessGrid``) under ``gradient_coding_mod``, with the tiny
numpy app and oracle of ``tests/apps/numpy_app.py`` (see ``test_wrapper.py``). Bad replies
come from an OUTER client mod (``fault_mod`` of ``tests/flower/harness.py``), from a grid that
tampers with a pulled reply's sender or round, or from one that refuses a message as Flower's
InMemoryGrid does (``DroppingGrid``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.serverapp.strategy import FedAvg

from fl_gradcode.flower import GradientCoding, gradient_coding_mod
from fl_gradcode.flower.protocol import PROTOCOL_KEY
from fl_gradcode.flower.testing import InProcessGrid
from tests.apps.numpy_app import (
    LR,
    META_KEY,
    as_dict,
    assert_model,
    fedavg,
    fedavg_rounds,
    initial_arrays,
    make_app,
    pytestmark,  # noqa: F401 (the warning filter applies here)
    theta0,
)
from tests.flower.harness import FixedArrivals, run

# =============================================================================== rejection
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


# =============================================================================== grid drops
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
