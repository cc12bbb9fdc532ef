"""The early-returning grid (``EarlyReturnGrid``) and the strategy's side of it.

Its edges, with a fake time and a scripted inner grid (``tests/doubles.py``): the caller's
timeout and the round's deadline, replies picked up within ``poll_interval`` or right when a
grid says one is due, a second reply to one message, messages passed straight to the inner
grid, BLAS on one thread around a pulled batch. Then the order in which the strategy validates
replies pulled together (one per undecoded group first), and late replies to an earlier round:
handed to ``on_late_reply`` only, and counted in the next round's row.
"""

from __future__ import annotations

import itertools
import uuid

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MessageType, RecordDict
from flwr.serverapp.strategy import FedAvg

from fl_gradcode.flower import GradientCoding, gradient_coding_mod, protocol
from fl_gradcode.flower.grid import EarlyReturnGrid
from fl_gradcode.flower.protocol import Instruction
from fl_gradcode.flower.testing import InProcessGrid, set_task_identity
from tests.apps.numpy_app import (
    LR,
    initial_arrays,
    make_app,
    pytestmark,  # noqa: F401 (the warning filter applies here)
)
from tests.doubles import GridTime, RoundOwner, ScriptedGrid

# ======== EarlyReturnGrid: edges =================================================================
_ids = itertools.count()


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


# ======== the order replies are validated in =====================================================
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
