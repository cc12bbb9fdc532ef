"""InProcessGrid, the in-process test grid: node ids, ClientApp errors, sender ids, duplicates.

Expected values are computed by hand from the documented behaviour (node id formula, Flower's
``ClientAppException`` error text), never by the grid itself.
"""

from __future__ import annotations

import pytest
from flwr.app import Message, RecordDict

from fl_gradcode.flower.testing import InProcessGrid, set_task_identity


def _echo(msg: Message, _context) -> Message:
    return Message(RecordDict(), reply_to=msg)


def _train(dst: int, round_: int = 1) -> Message:
    set_task_identity()
    return Message(RecordDict(), dst_node_id=dst, message_type="train", group_id=str(round_))


def _push_pull(grid: InProcessGrid, msg: Message) -> list[Message]:
    ids = grid.push_messages([msg])
    assert len(ids) == 1 and ids[0]
    return grid.pull_messages(ids)


def test_a_single_node_grid_is_allowed():
    grid = InProcessGrid(_echo, 1)
    assert list(grid.get_node_ids()) == [23758]  # (7919 * 3) % 100003 + 0 + 1


def test_zero_nodes_is_refused_naming_the_value():
    with pytest.raises(ValueError, match=r"^num_nodes=0 must be >= 1$"):
        InProcessGrid(_echo, 0)


def test_default_node_ids_follow_the_documented_formula():
    # id(i) = (7919 * (i + 3)) % 100003 + 100000 * (i % 3) + 1, computed by hand:
    # i=0: 23757 + 1; i=1: 31676 + 100000 + 1; i=2: 39595 + 200000 + 1; i=3: 47514 + 1;
    # i=10: 7919 * 13 = 102947 -> 102947 - 100003 = 2944, + 100000 + 1
    ids = list(InProcessGrid(_echo, 11).get_node_ids())
    assert ids[:4] == [23758, 131677, 239596, 47515]
    assert ids[10] == 102945


def test_client_app_exception_becomes_an_error_reply_like_flowers():
    def boom(msg: Message, _context) -> Message:
        raise ValueError("bad batch")

    grid = InProcessGrid(boom, 2)
    node = list(grid.get_node_ids())[1]
    (reply,) = _push_pull(grid, _train(node))
    assert reply.has_error()
    assert reply.error.code == 0
    assert reply.error.reason == "ClientAppException: ValueError: bad batch"
    assert reply.metadata.src_node_id == node


def test_reply_carries_the_node_as_sender_and_gets_a_message_id():
    set_task_identity()

    def fresh(msg: Message, _context) -> Message:
        # not built with reply_to: its sender is this process's identity, not the node
        return Message(RecordDict(), dst_node_id=1, message_type="train")

    grid = InProcessGrid(fresh, 3)
    node = list(grid.get_node_ids())[2]
    (reply,) = _push_pull(grid, _train(node))
    assert reply.metadata.src_node_id == node
    assert reply.metadata.message_id


def test_duplicated_reply_is_pulled_twice_with_a_fresh_id_then_gone():
    grid = InProcessGrid(_echo, 2, duplicate=lambda i, r: i == 0)
    node = next(iter(grid.get_node_ids()))
    msg = _train(node, 3)
    ids = grid.push_messages([msg])
    assert grid.injected == [("duplicate", 0, 3)]
    assert grid.pending == 2
    got = grid.pull_messages(ids)
    assert len(got) == 2
    assert all(isinstance(m, Message) for m in got)
    assert [m.metadata.reply_to_message_id for m in got] == [ids[0], ids[0]]
    assert got[0].metadata.message_id != got[1].metadata.message_id
    assert grid.pending == 0
    assert grid.pull_messages(ids) == []


def test_set_task_identity_is_run_1_task_1_on_the_superlink():
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.task_identity import TaskIdentity

    set_task_identity()
    assert (TaskIdentity.run_id, TaskIdentity.task_id) == (1, 1)
    assert TaskIdentity.node_id == SUPERLINK_NODE_ID


def test_each_node_context_carries_run_node_and_partition_config():
    seen = []

    def record(msg: Message, context) -> Message:
        seen.append(context)
        return Message(RecordDict(), reply_to=msg)

    grid = InProcessGrid(record, 3, {"lr": 0.5}, node_config=lambda i: {"extra": 10 * i},
                         node_ids=[11, 22, 33])
    assert grid.pushed == 0
    _push_pull(grid, _train(33))
    assert grid.pushed == 1
    (ctx,) = seen
    assert ctx.run_id == 1
    assert ctx.node_id == 33
    assert dict(ctx.node_config) == {"partition-id": 2, "num-partitions": 3, "extra": 20}
    assert dict(ctx.run_config) == {"lr": 0.5}
    # a message to an unknown node is refused with an empty id and is not counted
    assert grid.push_messages([_train(44)]) == [""]
    assert grid.pushed == 1


@pytest.mark.parametrize(("group", "round_"), [("4", 4), ("handshake", 0)])
def test_fault_callables_get_the_node_index_and_round(group, round_):
    calls: dict[str, list] = {"delay": [], "crash": [], "src": []}

    def delay(i, r):
        calls["delay"].append((i, r))
        return 0.0

    def crash(i, r):
        calls["crash"].append((i, r))
        return i == 0

    def src(i, r):
        calls["src"].append((i, r))
        return 777 if i == 1 else None

    set_task_identity()
    grid = InProcessGrid(_echo, 3, delay=delay, crash=crash, src_node_id=src,
                         node_ids=[11, 22, 33])
    msgs = [Message(RecordDict(), dst_node_id=node, message_type="train", group_id=group)
            for node in (11, 22, 33)]
    ids = grid.push_messages(msgs)
    assert all(ids) and len(set(ids)) == 3
    assert calls["delay"] == [(0, round_), (1, round_), (2, round_)]
    assert calls["crash"] == [(0, round_), (1, round_), (2, round_)]
    assert calls["src"] == [(1, round_), (2, round_)]  # the crashed node never gets that far
    assert grid.injected == [("crash", 0, round_), ("src_node_id", 1, round_)]
    got = grid.pull_messages(ids)  # the crashed node's reply never arrives
    assert [m.metadata.reply_to_message_id for m in got] == ids[1:]
    assert [m.metadata.src_node_id for m in got] == [777, 33]
    assert grid.pending == 0


def test_delayed_reply_is_pullable_only_after_its_delay():
    import time

    grid = InProcessGrid(_echo, 1, delay=lambda i, r: 0.3)
    node = next(iter(grid.get_node_ids()))
    t0 = time.monotonic()
    ids = grid.push_messages([_train(node)])
    at = grid.available_at[ids[0]]
    assert isinstance(at, float)
    assert at >= t0 + 0.3
    assert grid.pull_messages(ids) == []
    assert grid.pending == 1
    time.sleep(max(0.0, at - time.monotonic()) + 0.01)
    assert len(grid.pull_messages(ids)) == 1


def test_a_held_reply_is_pullable_only_once_a_later_round_is_pushed():
    grid = InProcessGrid(_echo, 2, hold=lambda i, r: 3 if (i, r) == (1, 1) else None,
                         node_ids=[11, 22])
    first = grid.push_messages([_train(n, 1) for n in (11, 22)])
    assert [m.metadata.src_node_id for m in grid.pull_messages(first)] == [11]
    assert grid.next_reply_in(first) is None  # nothing due: the other reply is held
    grid.push_messages([_train(11, 2)])  # round 2 does not release it
    assert grid.pull_messages(first) == []
    grid.push_messages([_train(11, 3)])
    assert [m.metadata.src_node_id for m in grid.pull_messages(first)] == [22]
    assert grid.injected == [("hold", 1, 1)]
    bad = InProcessGrid(_echo, 1, hold=lambda i, r: r, node_ids=[11])
    with pytest.raises(ValueError, match=r"hold\(0, 4\) = 4: .* later than 4"):
        bad.push_messages([_train(11, 4)])
    assert bad.pushed == 0  # refused before the node ran it


def test_duplicate_twin_has_a_real_message_id():
    grid = InProcessGrid(_echo, 1, duplicate=lambda i, r: True)
    node = next(iter(grid.get_node_ids()))
    got = _push_pull(grid, _train(node))
    ids = [m.metadata.message_id for m in got]
    assert all(isinstance(i, str) and i for i in ids) and ids[0] != ids[1]


def test_send_and_receive_waits_for_every_reply_and_returns_promptly():
    import time

    grid = InProcessGrid(_echo, 3, delay=lambda i, r: 0.05 * i, node_ids=[11, 22, 33])
    t0 = time.monotonic()
    replies = grid.send_and_receive([_train(n) for n in (11, 22, 33, 44)], timeout=2.0)
    elapsed = time.monotonic() - t0
    assert sorted(m.metadata.src_node_id for m in replies) == [11, 22, 33]
    assert 0.1 <= elapsed < 0.9  # the slowest reply is due after 0.1 s; polls every 2 ms
    t0 = time.monotonic()
    assert len(grid.send_and_receive([_train(11)], timeout=3.0)) == 1
    assert time.monotonic() - t0 < 1.5  # returns once every reply is in, not at the timeout


class _FakeTime:
    """A clock that stands still except in ``sleep``, which moves it 100 s."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += 100.0


def test_send_and_receive_gives_up_after_one_hour_by_default(monkeypatch):
    import fl_gradcode.flower.testing as testing_module

    grid = InProcessGrid(_echo, 1, crash=lambda i, r: True)
    node = next(iter(grid.get_node_ids()))
    msg = _train(node)
    fake = _FakeTime()
    monkeypatch.setattr(testing_module, "time", fake)
    assert grid.send_and_receive([msg]) == []
    # each wait moves this clock 100 s: still waiting at 3500 s, given up at 3600 s
    assert fake.now == 3600.0 and len(fake.sleeps) == 36


def test_repeated_node_ids_are_refused():
    with pytest.raises(ValueError, match=r"^node_ids must be distinct, one per node$"):
        InProcessGrid(_echo, 2, node_ids=[5, 5])


def test_next_reply_in_is_the_time_until_the_first_asked_reply_is_due(monkeypatch):
    """Delays 5, 2 and 9 s and a crashed node: asked about all, the 2 s reply is next; asked
    about the 5 s one alone, 5 s; once pulled, or for the crashed node, nothing is due."""
    from types import SimpleNamespace

    import fl_gradcode.flower.testing as testing

    now = [50.0]
    monkeypatch.setattr(testing, "time", SimpleNamespace(monotonic=lambda: now[0]))
    grid = InProcessGrid(_echo, 4, delay=lambda i, r: (5.0, 2.0, 9.0, 0.0)[i],
                         crash=lambda i, r: i == 3)
    ids = grid.push_messages([_train(node) for node in grid.get_node_ids()])
    assert grid.next_reply_in(ids) == pytest.approx(2.0)
    assert grid.next_reply_in([ids[0], ids[2]]) == pytest.approx(5.0)
    assert grid.next_reply_in([ids[3]]) is None  # crashed: never answered
    assert grid.next_reply_in([]) is None
    now[0] = 53.0
    assert grid.next_reply_in(ids) == pytest.approx(-1.0)  # pullable now
    assert len(grid.pull_messages(ids)) == 1
    assert grid.next_reply_in(ids) == pytest.approx(2.0)  # the pulled one no longer counts
