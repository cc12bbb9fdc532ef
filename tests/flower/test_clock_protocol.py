"""The round clocks answer what the strategy and its code policy ask through the ``Clock``
protocol, each clock its own way; a clock of one's own that answers it works with the policy.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from fl_gradcode.flower.clock import CLOCKS, Clock, VirtualClock, make_clock
from fl_gradcode.flower.options import TimingOptions
from fl_gradcode.flower.policy import AdaptiveCodePolicy, FixedCodePolicy
from tests.flower.harness import ScriptedClock


def _protocol_members() -> set[str]:
    members = {name for name, _ in inspect.getmembers(Clock) if not name.startswith("_")}
    return members | set(Clock.__annotations__)


@pytest.mark.parametrize("timing", sorted(CLOCKS))
def test_every_registered_clock_answers_every_question_of_the_protocol(timing):
    clock = make_clock(TimingOptions(mode=timing), 5.0)
    missing = {name for name in _protocol_members() if not hasattr(clock, name)}
    assert missing == set()
    assert clock.timing == timing
    assert clock.last_duration is None  # no round finished yet


def test_a_clock_that_never_queues_answers_every_queue_question_with_skip():
    wall = make_clock(TimingOptions(mode="wallclock"), 5.0)
    assert [wall.busy_mode(m) for m in ("skip", "queue", "fit")] == ["skip"] * 3
    assert wall.queueable({1, 2, 3}) == set()
    virtual = make_clock(TimingOptions(mode="virtual"), 5.0)
    assert [virtual.busy_mode(m) for m in ("skip", "queue", "fit")] == ["skip", "queue", "fit"]


def test_both_clocks_remember_the_last_rounds_length():
    """Virtual: 2 s after a round started at 3 s; wallclock: the real end minus its start."""
    virtual = VirtualClock(10.0)
    virtual.now = 3.0
    virtual.start_round()
    virtual.finish_round([1], {1: 2.0}, end=5.0)
    assert virtual.last_duration == pytest.approx(2.0)
    wall = make_clock(TimingOptions(mode="wallclock"), 10.0)
    wall.start_round()
    window = wall.window({0: 0.0}, lambda used: True, 1)
    wall.finish_round([1], {1: 0.0}, window.end)
    assert 0.0 <= wall.last_duration == pytest.approx(window.end - wall.round_start)


def test_the_virtual_clock_queues_the_nodes_free_within_the_limit():
    clock = VirtualClock(10.0)
    clock.now = 100.0
    clock.busy_until = {1: 105.0, 2: 115.0}  # free in 5 s and 15 s; node 3 free now
    assert clock.queueable({1, 2, 3}) == {1, 2, 3}
    assert clock.queueable({1, 2, 3}, within_s=10.0) == {1, 3}
    assert clock.queueable({1, 2, 3}, within_s=5.0) == {3}  # strictly within


@pytest.mark.parametrize("stop", [False, True])
def test_a_window_says_when_each_stopped_worker_is_free(stop):
    """Deadline 10 s from 100 s; worker 1 (12 s of its own) stops at 110; worker 3, queued
    behind a job ending at 115 (its message expired before it could start), is free at 115:
    the times the clock then holds for their nodes."""
    clock = VirtualClock(10.0, stop_at_deadline=stop)
    clock.now = 100.0
    clock.busy_until = {12: 105.0, 13: 115.0}
    clock.start_round(queued={2: 12, 3: 13})
    window = clock.window({0: 3.0, 1: 12.0, 2: 4.0, 3: 1.0}, lambda used: len(used) >= 3, 4)
    assert window.stopped_at == ({1: 110.0, 3: 115.0} if stop else {})
    clock.finish_round([10, 11, 12, 13], {10: 3.0, 11: 12.0, 12: 4.0, 13: 1.0}, window.end)
    assert {w: clock.busy_until[10 + w] for w in window.stopped} == window.stopped_at


def test_a_queued_workers_failure_is_heard_after_its_wait_too():
    """Worker 1's work is queued behind a job ending 4 s into the round; its device goes off
    and the server hears so 2 s into that work: 6 s after the round's start, when (every
    worker having replied or been heard of) the undecodable round ends."""
    clock = VirtualClock(10.0)
    clock.now = 100.0
    clock.busy_until = {11: 104.0}
    clock.start_round(queued={1: 11})
    window = clock.window({0: 1.0}, lambda used: len(used) >= 2, 2, failures={1: 2.0})
    assert window.used == [0] and window.end == pytest.approx(106.0)


# ------------------------------------------------------------------ a clock of one's own
def _bound(policy, clock):
    from types import SimpleNamespace

    policy.bind(SimpleNamespace(clock=clock, identities={}))
    return policy


def test_a_clock_of_ones_own_decides_whom_a_fixed_code_queues():
    """busy="queue": the members the clock says are free within min(deadline, last round):
    node 1 free in 2 s, node 3 in 4 s, with a 3-s last round."""
    clock = ScriptedClock(now=5.0, free_at={1: 7.0, 3: 9.0}, last_duration=3.0)
    policy = _bound(FixedCodePolicy(busy="queue", straggler_timeout=10.0), clock)
    assert policy.queued({1, 2, 3}, [1, 2, 3]) == {1, 2}
    clock.queues = False  # the same clock, now never queueing: nobody
    assert policy.queued({1, 2, 3}, [1, 2, 3]) == set()


def test_an_adaptive_policy_plans_and_learns_under_a_clock_of_ones_own():
    """The policy records the jobs it sent only for the members the clock can queue behind,
    and prices busy members from them; under a clock that queues nothing, a busy member is
    free at the deadline."""
    n = 8
    cohort = list(range(100, 100 + n))
    queueing = ScriptedClock(now=0.0, straggler_timeout=7.0)
    policy = _bound(AdaptiveCodePolicy(s_max=2, straggler_timeout=7.0, seed=0), queueing)
    code = policy.plan(cohort, set())
    state = _SentState(code, cohort)
    policy.record_sent(state, set())
    assert set(policy.outstanding) == set(cohort)
    queueing.now = 1.0
    busy_until, pending, _ = policy.busy_inputs(policy.placement(n), {100, 103}, cohort)
    assert busy_until is None
    np.testing.assert_array_equal(np.isfinite(pending[0]), [w in (0, 3) for w in range(n)])

    never = ScriptedClock(now=1.0, queues=False, straggler_timeout=7.0)
    other = _bound(AdaptiveCodePolicy(s_max=2, straggler_timeout=7.0, seed=0), never)
    other.plan(cohort, set())
    other.record_sent(_SentState(code, cohort), set())
    assert other.outstanding == {}
    busy_until, pending, limit = other.busy_inputs(other.placement(n), {100, 103}, cohort)
    assert pending is None and np.all(np.isinf(limit))
    np.testing.assert_array_equal(busy_until, [8.0 if w in (0, 3) else 0.0 for w in range(n)])


class _SentState:
    """A round's record as the policy reads it: the code, the cohort, every worker sent."""

    def __init__(self, code, cohort):
        self.code, self.cohort = code, cohort
        self.sent = dict.fromkeys(range(len(cohort)))



def test_a_virtual_clock_built_without_charges_charges_gradient_codings_defaults():
    """``VirtualClock(t)`` and the clock ``GradientCoding`` builds from its default timing
    keywords put a reply at the same time: measured compute (2.5 s) plus the delay (0.25 s),
    no charge per unit of load, no upload time."""
    from flwr.serverapp.strategy import FedAvg

    from fl_gradcode.flower import GradientCoding

    args = (2.5, 1000, lambda: 3.0, lambda units: 0.25)
    assert VirtualClock(10.0).arrival(*args) == pytest.approx(2.75)
    assert GradientCoding(FedAvg()).clock.arrival(*args) == pytest.approx(2.75)
