"""EarlyReturnGrid's abandoned messages: how long each is waited for, and giving it up.

Driven over a silent fake grid (every message accepted, no reply ever) with the grid module's
clock replaced: a round owner whose deadline is 0 s ends the round at once, so every message
is abandoned at monotonic time ``T0``. By definition an abandoned message is given up at
``T0 + bound`` (inclusive), where ``bound`` is ``abandon_ttl``, else the owner's
``round_timeout``, never beyond the message's TTL left (``ttl - max(now - created_at, 0)``),
else 3600 s, never negative. The expected instants below are computed by hand from that.
"""

from __future__ import annotations

import gc
import math
import re
import weakref
from logging import WARNING
from types import SimpleNamespace

import pytest
from flwr.app import Message, RecordDict

import fl_gradcode.flower.grid as grid_module
from fl_gradcode.flower import protocol
from fl_gradcode.flower.grid import EarlyReturnGrid
from fl_gradcode.flower.protocol import Instruction
from fl_gradcode.flower.testing import set_task_identity
from tests.doubles import GridTime, RoundOwner, ScriptedGrid

T0 = 1000.0  # monotonic time of the round (when its messages are abandoned)
WALL = 50_000.0  # wall-clock time of the round (created_at is compared with it)
GIVEN_UP = re.compile(r"^node (\d+) never answered message (\S+): given up, the node is free "
                      r"again$")


@pytest.fixture
def clock(monkeypatch):
    set_task_identity()
    return GridTime(start=T0, wall=WALL).install(monkeypatch)


def _owner(round_timeout: float | None = None) -> RoundOwner:
    """A round owner whose round ends at once (deadline 0 s)."""
    return RoundOwner(deadline=0.0, round_timeout=round_timeout)


def _message(node: int, ttl: float | None, age: float = 0.0) -> Message:
    """A coded train message to ``node`` with TTL ``ttl``, created ``age`` s before the round."""
    msg = protocol.instruction_message(RecordDict(), Instruction(op=protocol.OP_TRAIN), node, "1")
    msg.metadata.ttl = ttl
    msg.metadata.created_at = WALL - age
    return msg


def _abandon(owner, messages: list[Message], ids: list[str],
             abandon_ttl: float | None = None) -> EarlyReturnGrid:
    grid = EarlyReturnGrid(ScriptedGrid(ids=ids), owner, abandon_ttl=abandon_ttl)
    assert grid.send_and_receive(messages) == []
    assert owner.seen == [] and owner.unsent == []  # silent, and every message accepted
    nodes = [m.metadata.dst_node_id for m in messages]
    assert grid.abandoned == dict(zip(ids, nodes, strict=True))
    return grid


def _free_at(clock: GridTime, grid: EarlyReturnGrid, node: int, bound: float) -> None:
    """``node`` is busy a quarter second before ``T0 + bound`` and free at that instant."""
    clock.at(bound - 0.25)
    assert grid.expire() == [] and grid.busy_nodes() == {node}
    clock.at(bound)
    assert grid.expire() == [node]
    assert grid.busy_nodes() == set() and grid.abandoned == {} and grid.expired == 1


@pytest.mark.parametrize("bad", [0, 0.0, -1.0, -1e-9, math.nan])
def test_abandon_ttl_must_be_positive_and_the_error_names_it(bad):
    expected = (f"abandon_ttl={bad!r} must be > 0 seconds (or None: the strategy's "
                "round_timeout)")
    with pytest.raises(ValueError, match="^" + re.escape(expected) + "$"):
        EarlyReturnGrid(ScriptedGrid(ids=[]), _owner(), abandon_ttl=bad)


@pytest.mark.parametrize("ttl", [1e-9, 0.5, 1.0, 2.5])
def test_any_positive_abandon_ttl_is_accepted_below_one_second_too(ttl):
    assert EarlyReturnGrid(ScriptedGrid(ids=[]), _owner(), abandon_ttl=ttl).abandon_ttl == ttl


def test_a_new_grid_has_given_up_nothing(clock):
    grid = EarlyReturnGrid(ScriptedGrid(ids=[]), _owner())
    assert grid.expired == 0 and isinstance(grid.expired, int)
    assert grid.expire() == [] and grid.busy_nodes() == set() and grid.expired == 0


def test_abandon_ttl_bounds_the_wait_before_round_timeout_and_a_long_message_ttl(clock):
    grid = _abandon(_owner(100.0), [_message(4, ttl=3600.0)], ["a"], abandon_ttl=5.0)
    _free_at(clock, grid, 4, 5.0)


def test_a_sub_second_abandon_ttl_is_used_as_given(clock):
    grid = _abandon(_owner(), [_message(4, ttl=3600.0)], ["a"], abandon_ttl=0.5)
    _free_at(clock, grid, 4, 0.5)


def test_without_abandon_ttl_the_strategys_round_timeout_bounds_the_wait(clock):
    grid = _abandon(_owner(7.0), [_message(2, ttl=3600.0)], ["a"])
    _free_at(clock, grid, 2, 7.0)


def test_the_message_ttl_left_caps_a_longer_abandon_ttl(clock):
    """TTL 10 s, created 4 s before the round: 6 s left < abandon_ttl 100 s."""
    grid = _abandon(_owner(200.0), [_message(6, ttl=10.0, age=4.0)], ["a"],
                    abandon_ttl=100.0)
    _free_at(clock, grid, 6, 6.0)


def test_the_message_ttl_left_caps_a_longer_round_timeout(clock):
    grid = _abandon(_owner(30.0), [_message(6, ttl=10.0, age=1.5)], ["a"])
    _free_at(clock, grid, 6, 8.5)


def test_with_no_other_bound_the_message_ttl_left_is_the_wait(clock):
    """Created at the round's own instant: nothing of its 10 s TTL is used up yet."""
    grid = _abandon(_owner(), [_message(1, ttl=10.0)], ["a"])
    _free_at(clock, grid, 1, 10.0)


def test_a_message_created_in_the_future_has_its_whole_ttl_left(clock):
    """A clock skew (created_at after now) does not lengthen the TTL: elapsed counts as 0."""
    grid = _abandon(_owner(), [_message(1, ttl=10.0, age=-3.0)], ["a"])
    _free_at(clock, grid, 1, 10.0)


def test_a_message_whose_ttl_is_used_up_is_given_up_at_once(clock):
    """TTL 10 s, created 30 s ago: -20 s left, the bound is 0 s (never negative)."""
    grid = _abandon(_owner(7.0), [_message(3, ttl=10.0, age=30.0)], ["a"])
    assert grid.expire() == [3] and grid.busy_nodes() == set() and grid.expired == 1


def test_an_unreadable_message_ttl_and_no_other_bound_waits_an_hour(clock):
    grid = _abandon(_owner(), [_message(8, ttl=None)], ["a"])
    _free_at(clock, grid, 8, 3600.0)


def test_an_unreadable_message_ttl_leaves_the_abandon_ttl(clock):
    grid = _abandon(_owner(), [_message(8, ttl=None)], ["a"], abandon_ttl=12.0)
    _free_at(clock, grid, 8, 12.0)


def test_expire_frees_each_node_once_with_a_warning_naming_node_and_message(clock, flwr_log):
    """Node 3's message (TTL 2 s) is given up at T0+2, node 5's (TTL 4 s) at T0+4."""
    grid = _abandon(_owner(), [_message(3, ttl=2.0), _message(5, ttl=4.0)], ["m-a", "m-b"])
    clock.at(2.0)
    assert grid.expire() == [3]
    assert grid.expired == 1 and grid.abandoned == {"m-b": 5}
    assert grid.expire() == [] and grid.expired == 1  # given up once
    clock.at(4.0)
    assert grid.busy_nodes() == set()  # busy_nodes gives up node 5's message itself
    assert grid.expired == 2 and grid.abandoned == {}
    warnings = [text for level, text in flwr_log if GIVEN_UP.match(text)]
    assert warnings == [
        "node 3 never answered message m-a: given up, the node is free again",
        "node 5 never answered message m-b: given up, the node is free again",
    ]
    assert [level for level, text in flwr_log if text in warnings] == [WARNING, WARNING]


class _Id(str):
    """A message id a weak reference can follow (plain ``str`` takes none)."""


def test_a_given_up_message_leaves_no_reference_to_its_id(clock, monkeypatch):
    """Giving a message up forgets it entirely: a long run does not accumulate given-up ids."""
    lines = []
    monkeypatch.setattr(grid_module, "log", lambda level, fmt, *args: lines.append(fmt % args))
    ids = [_Id("m-a")]
    grid = _abandon(_owner(), [_message(3, ttl=2.0)], ids)
    ref = weakref.ref(ids[0])
    del ids
    gc.collect()
    assert ref() == "m-a"  # held while the message is waited for
    clock.at(2.0)
    assert grid.expire() == [3] and grid.expired == 1
    assert lines == ["node 3 never answered message m-a: given up, the node is free again"]
    gc.collect()
    assert ref() is None


@pytest.mark.parametrize("timeout", [0.0, 1.0])
def test_wait_until_free_starts_no_pull_or_sleep_once_its_timeout_has_passed(clock, timeout):
    """Node 3 stays busy (its message is waited for 100 s); poll_interval 0.25 s: the wait
    returns at ``T0 + timeout`` exactly (a multiple of the poll interval), having pulled from
    ``T0`` on, never more than poll_interval apart and never at or after its timeout (a
    timeout of 0 s has passed at once: no pull)."""
    inner = ScriptedGrid(clock, ids=["a"])
    grid = EarlyReturnGrid(inner, _owner(), poll_interval=0.25, abandon_ttl=100.0)
    assert grid.send_and_receive([_message(3, ttl=3600.0)]) == []
    assert inner.pulls == [T0] and clock.mono == T0  # the round's own pull, deadline 0 s
    inner.pulls.clear()
    grid.wait_until_free({3}, timeout)
    if timeout == 0.0:
        assert inner.pulls == []
    else:
        assert inner.pulls[0] == T0 and inner.pulls[-1] < T0 + timeout
        assert all(b - a <= 0.25 for a, b in zip(inner.pulls, inner.pulls[1:], strict=False))
        assert T0 + timeout - inner.pulls[-1] <= 0.25
    assert clock.mono == T0 + timeout
    assert grid.busy_nodes() == {3}


class _AnsweringGrid(ScriptedGrid):
    """Answers the message whose id is ``answer``, once that is set."""

    def __init__(self) -> None:
        super().__init__(ids=[])
        self.answer: str | None = None

    def pull_messages(self, ids):
        if self.answer in ids:
            return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=self.answer))]
        return []


def test_a_message_a_caller_adds_to_abandoned_is_waited_for_until_its_reply(clock):
    """``abandoned`` (message id -> node) is public; an entry added from outside has no time
    bound: its node is busy, never given up by time, until its reply is pulled."""
    inner = _AnsweringGrid()
    owner = _owner()
    grid = EarlyReturnGrid(inner, owner, abandon_ttl=1.0)
    grid.abandoned["ext"] = 9
    clock.at(1e6)
    assert grid.expire() == [] and grid.busy_nodes() == {9} and grid.expired == 0
    grid.collect_late()
    assert grid.abandoned == {"ext": 9} and owner.late == []
    inner.answer = "ext"
    grid.collect_late()
    assert grid.abandoned == {} and grid.busy_nodes() == set() and grid.expired == 0
    assert [r.metadata.reply_to_message_id for r in owner.late] == ["ext"]
