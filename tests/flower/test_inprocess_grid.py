"""InProcessGrid, the in-process test grid: node ids, ClientApp errors, sender ids, duplicates.

Expected values are computed by hand from the documented behaviour (node id formula, Flower's
``ClientAppException`` error text), never by the grid itself.
"""

from __future__ import annotations

import pytest
from flwr.app import Message, RecordDict

from fl_gradcode.flower.testing import InProcessGrid, set_task_identity

pytestmark = pytest.mark.mutation_found("testing")


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
