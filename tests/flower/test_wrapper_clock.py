"""The wrapper's clocks: ``VirtualClock`` busy times and windows, ``WallClock`` stop times and
grid limits, unit by unit against hand-computed times; and stopping late work at the deadline
(virtual end to end with a fixed table of arrival times, wallclock counted from the messages'
creation).
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from flwr.app import ConfigRecord
from flwr.serverapp.strategy import FedAvg

from fl_gradcode.flower import GradientCoding, gradient_coding_mod
from fl_gradcode.flower.clock import VirtualClock
from fl_gradcode.flower.testing import InProcessGrid
from tests.apps.numpy_app import (
    LR,
    initial_arrays,
    make_app,
    pytestmark,  # noqa: F401 (the warning filter applies here)
)
from tests.flower.harness import FixedArrivals, run


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


# ======== stopping late work at the deadline =====================================================
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
