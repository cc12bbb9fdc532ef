"""Stopping late work: a worker whose round's deadline has passed stops instead of finishing.

The mod is driven directly with a fake wall clock (``make_gradient_coding_mod(wall_clock=...)``);
the virtual clock's arithmetic is checked against hand-computed busy times; the wrapper is run
end to end with a fixed table of arrival times (the tiny app and runner of ``test_wrapper``).
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg

from fl_gradcode.config import merge_config
from fl_gradcode.flower import GradientCoding, gradient_coding_mod
from fl_gradcode.flower.clock import VirtualClock
from fl_gradcode.flower.mod import MOD_STOPPED_CODE, make_gradient_coding_mod
from fl_gradcode.flower.protocol import parse_instruction
from fl_gradcode.flower.testing import InProcessGrid
from tests.apps.numpy_app import (
    assert_model,
    fedavg_rounds,
    make_app,
    pytestmark,  # noqa: F401 (the warning filter applies here)
    theta0,
)
from tests.flower.harness import FixedArrivals, run
from tests.flower.messages import node_context as _context
from tests.flower.messages import train_instruction as _train_instruction
from tests.flower.messages import train_message as _message


# ------------------------------------------------------------------------------ protocol
def test_stop_after_survives_the_record_and_defaults_to_never():
    msg = _message(_train_instruction(stop_after_s=2.5))
    assert parse_instruction(msg.content).stop_after_s == 2.5
    assert parse_instruction(_message(_train_instruction()).content).stop_after_s == 0.0


# ------------------------------------------------------------------------------ the mod
class FakeClock:
    """The mod's ``wall_clock``: starts at the message's creation time plus ``offset``; every
    app call advances it by ``step`` seconds."""

    def __init__(self, start: float, step: float) -> None:
        self.t, self.step, self.calls = start, step, 0

    def __call__(self) -> float:
        return self.t

    def app(self, msg: Message, context) -> Message:
        self.calls += 1
        self.t += self.step
        theta = msg.content["arrays"]["w"].numpy()
        pid = float(context.node_config["partition-id"])
        return Message(RecordDict({"arrays": ArrayRecord({"w": Array(theta + pid + 1.0)}),
                                   "metrics": MetricRecord({"num-examples": 4})}),
                       reply_to=msg)


THREE = dict(partition_ids=(0, 1, 2), num_partitions=(3, 3, 3), coefficients=(1.0, 1.0, 1.0))


def _call(*, offset: float, step: float, **instruction):
    msg = _message(_train_instruction(**{**THREE, **instruction}))
    clock = FakeClock(float(msg.metadata.created_at) + offset, step)
    return make_gradient_coding_mod(wall_clock=clock)(msg, _context(), clock.app), clock


def test_an_expired_message_is_stopped_before_any_partition():
    reply, clock = _call(offset=5.0, step=1.0, stop_after_s=2.0)
    assert reply.has_error() and reply.error.code == MOD_STOPPED_CODE
    assert "stopped after 0 of 3 partitions" in reply.error.reason
    assert clock.calls == 0


def test_work_stops_between_partitions_once_the_deadline_passes():
    # partitions take 1.5 s each: at 0 and 1.5 s the deadline (2 s) has not passed, at 3 s it has
    reply, clock = _call(offset=0.0, step=1.5, stop_after_s=2.0)
    assert reply.has_error() and reply.error.code == MOD_STOPPED_CODE
    assert "stopped after 2 of 3 partitions" in reply.error.reason
    assert clock.calls == 2


@pytest.mark.parametrize("stop_after_s", [0.0, 100.0])
def test_without_a_reachable_deadline_every_partition_is_computed(stop_after_s):
    reply, clock = _call(offset=50.0 if stop_after_s == 0 else 0.0, step=1.5,
                         stop_after_s=stop_after_s)
    assert not reply.has_error()
    assert clock.calls == 3
    coded = reply.content["gradient-coding"]["w"].numpy()
    # sum_j B[i,j] n_j (theta_j - theta) with theta_j = theta + j + 1, n_j = 4
    np.testing.assert_allclose(coded, np.full_like(coded, 4 * (1 + 2 + 3)))


def test_simulated_latency_beyond_the_deadline_is_cut_at_the_deadline():
    msg = _message(_train_instruction(timing="wallclock", delay_s=30.0, stop_after_s=0.3))
    t0 = time.monotonic()
    reply = make_gradient_coding_mod()(msg, _context(), FakeClock(0.0, 0.0).app)
    took = time.monotonic() - t0
    assert reply.has_error() and reply.error.code == MOD_STOPPED_CODE
    assert "during the simulated latency" in reply.error.reason
    assert 0.3 <= took < 10.0  # until the deadline, not the 30 s of latency (lenient)


# ------------------------------------------------------------------------------ the clock
def _clock(stop: bool) -> VirtualClock:
    clock = VirtualClock(straggler_timeout=10.0)
    clock.stop_at_deadline = stop
    clock.now = 100.0
    clock.busy_until = {12: 105.0, 13: 115.0}  # nodes 12, 13 still busy for 5 s and 15 s
    clock.start_round(queued={2: 12, 3: 13})
    return clock


@pytest.mark.parametrize("stop", [False, True])
def test_virtual_clock_frees_stopped_workers_at_the_deadline(stop):
    clock = _clock(stop)
    # own times; workers 2 and 3 start after their backlogs (5 s, 15 s)
    own = {0: 3.0, 1: 12.0, 2: 4.0, 3: 1.0}
    window = clock.window(own, lambda used: len(used) >= 3, num_sent=4)
    # arrivals 3, 12, 9, 16: by the deadline only 0 and 2 (not 3 of 4): the round ends there;
    # 1 and 3 reply late, unless stopped
    assert window.end == pytest.approx(110.0)
    assert window.used == [0, 2]
    assert window.late == ([] if stop else [1, 3])
    clock.finish_round([10, 11, 12, 13], {10: 3.0, 11: 12.0, 12: 4.0, 13: 1.0}, window.end)
    expected = {10: 103.0, 11: 112.0, 12: 109.0, 13: 116.0}
    if stop:  # 11 stops at the deadline; 13's message expired before it could start: free
        expected.update({11: 110.0, 13: 115.0})  # when its earlier job ends
    assert clock.busy_until == pytest.approx(expected)


# ------------------------------------------------------------------------------ the wrapper
SLOW = 20.0  # worker 5's round-1 reply, against a 5-s deadline and 1-s rounds


def _slow_run(stop: bool, rounds: int, **options):
    arrivals = FixedArrivals({1: [1.0] * 5 + [SLOW], **{r: [1.0] * 6 for r in range(2, 31)}})
    return run(6, rounds=rounds, latency=arrivals, straggler_timeout=5.0,
               stop_late_work=stop, **options)


@pytest.mark.parametrize("stop", [False, True])
def test_a_stopped_worker_is_free_for_the_round_after_the_deadline(stop):
    outcome = _slow_run(stop, rounds=7)
    busy = [5 in row["busy"] for row in outcome.rows]
    # rounds start at t = 0, 1, 2, ...: worker 5 busy until 5 s (stopped) or 20 s
    assert busy == ([False, True, True, True, True, False, False] if stop
                    else [False] + [True] * 6)
    assert all(row["decode"] == "exact" for row in outcome.rows)
    assert_model(outcome.models[7], fedavg_rounds(theta0(), 7, 6))
    assert outcome.strategy.options.describe("FedAvg", None)["stop_late_work"] is stop
    first = outcome.rows[0]
    # round 1: worker 5's reply is late (t = 20 s) unless stopped at the deadline (5 s)
    assert (first["late_dropped"], first["stopped_at_deadline"]) == ((0, 1) if stop else (1, 0))
    assert sum(row["stopped_at_deadline"] for row in outcome.rows) == (1 if stop else 0)


def test_a_stopped_reply_is_not_counted_as_bytes_received():
    rows = [_slow_run(stop, rounds=1).rows[0] for stop in (False, True)]
    per_reply = rows[0]["bytes_up"] / 6  # six equal replies without stopping
    assert rows[1]["bytes_up"] == pytest.approx(5 * per_reply)


def test_a_stopped_job_is_done_at_the_deadline_in_the_servers_records():
    outcome = _slow_run(True, rounds=1, busy="fit")
    node = outcome.strategy.current_round.cohort[5]
    jobs = outcome.strategy.code_policy.outstanding[node]
    assert jobs[-1][2] == pytest.approx(5.0)  # round 1 started at 0: free at the deadline


@pytest.mark.parametrize("stop", [False, True])
def test_a_stopped_worker_is_censored_at_the_deadline_not_observed_late(stop):
    outcome = _slow_run(stop, rounds=23, busy="fit")
    first = outcome.strategy.code_policy.book.estimator.round(0)
    slow = int(np.flatnonzero(np.isnan(first.y))[0]) if stop else \
        int(np.argmax(np.nan_to_num(first.y)))
    if stop:  # its time is only known to exceed the deadline
        assert np.isnan(first.y[slow]) and first.limit[slow] == pytest.approx(5.0)
    else:  # observed when its reply arrived, 20 s after round 1 started
        assert first.y[slow] == pytest.approx(SLOW)
    assert np.count_nonzero(np.isnan(first.y)) == (1 if stop else 0)


def test_stop_late_work_is_validated_and_read_from_the_run_config():
    with pytest.raises(ValueError, match=r"stop_late_work='yes' must be True or False"):
        GradientCoding(FedAvg(fraction_evaluate=0.0), stop_late_work="yes")
    assert merge_config({"stop-late-work": True})["stop-late-work"] is True
    assert merge_config({})["stop-late-work"] == "auto"
    with pytest.raises(ValueError, match=r"stop-late-work=1 must be bool"):
        merge_config({"stop-late-work": 1})


def test_stop_late_work_auto_stops_queued_work_of_s_auto_only_and_an_explicit_value_wins():
    """The default "auto": on for s="auto" when busy clients are given queued work (virtual
    timing), where work behind stale work otherwise piles up once deadlines bind; off for a
    fixed code and under wallclock timing (busy clients are skipped there); True / False as
    given."""
    def stops(**keywords):
        return GradientCoding(FedAvg(fraction_evaluate=0.0), **keywords).stop_late_work

    assert stops(s="auto") is True
    assert stops(s="auto", busy="skip") is False
    assert stops(s="auto", timing="wallclock") is False
    assert stops(s=1) is False and stops(s=1, busy="queue") is False
    assert stops(s="auto", stop_late_work=False) is False
    assert stops(s=1, stop_late_work=True) is True




def test_wallclock_worker_stops_its_simulated_latency_at_the_deadline():
    # round 2: worker 5's simulated latency is 60 s against a 1-s deadline; the in-process grid
    # runs nodes one after the other, so without stopping the run would take a minute
    arrivals = FixedArrivals({1: [0.0] * 6, 2: [0.0] * 5 + [60.0], 3: [0.0] * 6})
    t0 = time.monotonic()
    outcome = run(6, rounds=3, timing="wallclock", latency=arrivals, straggler_timeout=1.0,
                  stop_late_work=True)
    assert time.monotonic() - t0 < 30.0
    second = outcome.rows[1]
    assert 5 not in second["clients_used"]
    # a straggler that stopped, not a bad reply; free again in round 3
    assert second["stopped_at_deadline"] == 1 and second["rejected"] == 0
    assert 5 not in outcome.rows[2]["busy"]
    assert all(row["decode"] == "exact" for row in outcome.rows)
    assert_model(outcome.models[3], fedavg_rounds(theta0(), 3, 6))


def _recorder(seen: list):
    def mod(msg, context, call_next):
        instruction = parse_instruction(msg.content)
        if instruction is not None and instruction.op == "train":
            seen.append((instruction.round, instruction.stop_after_s))
        return call_next(msg, context)
    return mod


@pytest.mark.parametrize("timing, stop", [("wallclock", True), ("wallclock", False),
                                          ("virtual", True)])
def test_only_wallclock_rounds_after_the_first_carry_the_deadline(timing, stop):
    seen: list = []
    grid = InProcessGrid(make_app(_recorder(seen), gradient_coding_mod), 6)
    run(6, rounds=3, timing=timing, grid=grid, straggler_timeout=2.0, stop_late_work=stop)
    expected = 2.0 if (timing, stop) == ("wallclock", True) else 0.0
    # round 1's wallclock deadline counts from its first reply: never stopped
    assert sorted(seen) == [(1, 0.0)] * 6 + [(2, expected)] * 6 + [(3, expected)] * 6


@pytest.mark.parametrize("stop", [False, True])
def test_the_wallclock_deadline_counts_from_the_messages_creation_when_workers_stop(stop):
    strategy = GradientCoding(FedAvg(fraction_evaluate=0.0), timing="wallclock",
                              straggler_timeout=5.0, warmup_timeout=9.0, stop_late_work=stop)
    msg = _message(_train_instruction())
    msg.metadata.created_at = time.time() - 2.0  # pushing took 2 s after it was created
    _open_round(strategy, 2, msg)
    # 3 s remain, as for the worker, which stops 5 s after the message was created
    limit = strategy.deadline_s(None)
    assert limit == pytest.approx(3.0 if stop else 5.0, abs=0.2)
    _open_round(strategy, 1, msg)
    assert strategy.deadline_s(None) == pytest.approx(9.0)  # round 1: start-up, unchanged


def _open_round(strategy, number, msg):
    """Round ``number`` in progress on ``strategy``'s collector, ``msg`` sent to worker 0."""
    from fl_gradcode.codes import make_code
    from fl_gradcode.flower.dispatch import Requests
    from fl_gradcode.flower.round_state import RoundPlan

    plan = RoundPlan(number=number, code=make_code("frc", 2, 1),
                     cohort=(msg.metadata.dst_node_id, -1), partitions=(), busy=(),
                     excluded=(), quarantined=(), layout={}, reply_layout={}, dtypes={},
                     theta={}, array_key="arrays", wire="float64", wall_start=0.0)
    strategy.collector.open(plan, Requests({0: msg}))


def _choose_s_keyword(monkeypatch, keyword: str) -> list:
    """The values of ``keyword`` in every call of ``choose_s`` from now on (it still runs)."""
    import fl_gradcode.adaptive as adaptive

    seen = []
    original = adaptive.choose_s

    def spy(*args, **kwargs):
        seen.append(kwargs.get(keyword))
        return original(*args, **kwargs)

    monkeypatch.setattr(adaptive, "choose_s", spy)
    return seen


@pytest.mark.parametrize("stop", [False, True])
def test_the_server_prices_a_busy_worker_as_free_by_its_deadline(monkeypatch, stop):
    seen = _choose_s_keyword(monkeypatch, "pending_limit")
    _slow_run(stop, rounds=2, busy="fit")
    # round 2 starts at t = 1; worker 5's round-1 work (sent at 0) stops at 5: free within 4 s
    limit = seen[-1]
    if stop:
        assert limit[5] == pytest.approx(4.0) and np.all(np.isinf(limit[:5]))
    else:
        assert limit is None


# ------------------------------------------------------------------------------ auto_deadline
def test_auto_deadline_is_validated_and_implies_stopping():
    with pytest.raises(ValueError, match=r"auto_deadline=2.0 needs s='auto' or busy='fit'"):
        GradientCoding(FedAvg(fraction_evaluate=0.0), s=1, auto_deadline=2.0)
    with pytest.raises(ValueError, match=r"got s=1, busy='queue'"):
        GradientCoding(FedAvg(fraction_evaluate=0.0), s=1, busy="queue", auto_deadline=2.0)
    fixed = GradientCoding(FedAvg(fraction_evaluate=0.0), s=1, busy="fit", auto_deadline=2.0)
    assert fixed.stop_late_work and fixed.clock.stop_at_deadline
    for bad in (0.5, True, float("inf"), "3"):
        with pytest.raises(ValueError, match=r"must be a factor >= 1"):
            GradientCoding(FedAvg(fraction_evaluate=0.0), s="auto", auto_deadline=bad)
    strategy = GradientCoding(FedAvg(fraction_evaluate=0.0), s="auto", auto_deadline=2)
    assert strategy.stop_late_work and strategy.clock.stop_at_deadline
    with pytest.raises(ValueError, match=r"auto_deadline=2 needs timing='virtual'"):
        GradientCoding(FedAvg(fraction_evaluate=0.0), s="auto", auto_deadline=2,
                       timing="wallclock")
    assert merge_config({"auto-deadline": 3})["auto-deadline"] == 3.0


@pytest.mark.parametrize("factor", [None, 2.0])
def test_each_round_s_deadline_is_the_factor_times_its_predicted_time(factor):
    # round 2: worker 5 takes 50 s; every other reply 1 s
    arrivals = FixedArrivals({1: [1.0] * 6, 2: [1.0] * 5 + [50.0],
                              **{r: [1.0] * 6 for r in range(3, 6)}})
    rows = run(6, s="auto", s_max=2, rounds=5, latency=arrivals, straggler_timeout=100.0,
               auto_deadline=factor).rows
    for row in rows:
        predicted = row["expected_round_s"]
        expected = 100.0 if factor is None or predicted is None else min(100.0,
                                                                        factor * predicted)
        assert row["round_deadline_s"] == pytest.approx(expected)
    assert rows[0]["round_deadline_s"] == 100.0  # nothing observed: the straggler timeout
    # worker 5's round-2 work: stopped at that round's deadline, or busy for its 50 s
    outcome = run(6, s="auto", s_max=2, rounds=2, latency=arrivals, straggler_timeout=100.0,
                  auto_deadline=factor)
    rows = outcome.rows
    start = rows[0]["virtual_s"]
    node = outcome.strategy.current_round.cohort[5]
    busy_until = outcome.strategy.clock.busy_until[node]
    if factor is None:
        assert busy_until == pytest.approx(start + 50.0)
    else:
        assert rows[1]["round_deadline_s"] < 50.0
        assert busy_until == pytest.approx(start + rows[1]["round_deadline_s"])
        assert rows[1]["stopped_at_deadline"] == 1
        # the server's record of that job: sent at the round's start, stops at its deadline
        job = outcome.strategy.code_policy.outstanding[node][-1]
        assert job[0] == pytest.approx(start)
        assert job[3] == pytest.approx(start + rows[1]["round_deadline_s"])


def test_a_fixed_code_fitting_busy_clients_gets_deadlines_from_its_own_prediction():
    """busy="fit": the estimator predicts the fixed code's round time, so the same deadline
    rule applies to it (a rival for auto with the same stopping). Worker 5 takes 50 s in
    round 2: with the deadline it is stopped there, the round decodes without it (s = 1), and
    the code never changes."""
    arrivals = FixedArrivals({1: [1.0] * 6, 2: [1.0] * 5 + [50.0],
                              **{r: [1.0] * 6 for r in range(3, 6)}})
    plain = run(6, code="nested", s=1, s_max=2, busy="fit", rounds=4, latency=arrivals,
                straggler_timeout=100.0).rows
    timed = run(6, code="nested", s=1, s_max=2, busy="fit", rounds=4, latency=arrivals,
                straggler_timeout=100.0, auto_deadline=2.0)
    rows = timed.rows
    assert [r["s"] for r in rows] == [1] * 4
    assert all(r["decode"] == "exact" for r in rows)
    assert rows[0]["expected_round_s"] is None and rows[0]["round_deadline_s"] == 100.0
    for row in rows[1:]:  # the prediction from the rounds before it, times the factor
        assert row["expected_round_s"] > 0
        assert row["round_deadline_s"] == pytest.approx(min(100.0,
                                                            2.0 * row["expected_round_s"]))
    assert rows[1]["round_deadline_s"] < 50.0 and rows[1]["stopped_at_deadline"] == 1
    assert all(r["round_deadline_s"] == 100.0 for r in plain)
    assert sum(r["stopped_at_deadline"] for r in plain) == 0
    # without the deadline worker 5 is still busy with its 50 s in round 4 (given no work);
    # with it, free since round 2's deadline and given work again
    assert plain[3]["busy"] == [5] and rows[3]["busy"] == []
    assert_model(timed.models[4], fedavg_rounds(theta0(), 4, 6))


def test_a_missed_deadline_doubles_the_next_one_until_a_round_is_exact():
    """Rounds 3 and 4: three of six workers take 30 s, more than s = 1 tolerates, so both
    rounds miss their predicted deadline (decoded approximately at it). The next deadline is
    twice as long after each miss in a row (2x, then 4x the factor), and back to the factor
    after an exact round."""
    fast = [1.0, 1.1, 1.2, 1.3, 1.4, 1.5]
    slow = [1.0, 1.1, 1.2, 30.0, 30.0, 30.0]
    arrivals = FixedArrivals({r: slow if r in (3, 4) else fast for r in range(1, 8)})
    rows = run(6, code="nested", s=1, s_max=2, busy="fit", rounds=7, latency=arrivals,
               straggler_timeout=100.0, auto_deadline=2.0).rows
    assert [r["decode"] for r in rows] == ["exact", "exact", "approx", "approx", "exact",
                                           "exact", "exact"]
    assert rows[0]["round_deadline_s"] == 100.0
    for row, times in zip(rows[1:], (1, 1, 2, 4, 1, 1), strict=True):
        assert row["round_deadline_s"] == pytest.approx(2.0 * times * row["expected_round_s"])
    assert rows[3]["round_virtual_s"] == pytest.approx(rows[3]["round_deadline_s"])


def test_work_stopped_before_it_could_start_is_no_observation_until_its_stop():
    """With per-round deadlines a queued job can wait past its own (shorter) deadline: it is
    stopped before it starts, at the end of the job before it. Until then nothing is known of
    it (its elapsed time is not negative), then it is censored at its deadline."""
    from fl_gradcode.adaptive import LatencyEstimator

    strategy = GradientCoding(FedAvg(fraction_evaluate=0.0), s="auto", auto_deadline=3.0)
    estimator = LatencyEstimator(2)
    rid = estimator.update(np.array([1.0, np.nan]), np.ones(2), 1.0)
    policy = strategy.code_policy
    policy.book.estimator, policy.book.node_index = estimator, {10: 0, 11: 1}
    policy.book.keys = ["0/2", "1/2"]
    # client 1: its round started at 0, deadline 3 s, queued behind a job that ended at 10 s
    policy.book.late.append((10.0, rid, 1, 3.0, True))
    strategy.clock.now = 5.0
    policy.estimator(2, [10, 11])
    record = estimator.round(rid)
    assert record.limit[1] == pytest.approx(1.0)  # still censored at the round's end
    strategy.clock.now = 10.0
    policy.estimator(2, [10, 11])
    assert record.limit[1] == pytest.approx(3.0) and np.isnan(record.y[1])
    assert policy.book.late == []


def test_a_deadline_below_every_predicted_round_time_is_named_in_a_warning(caplog):
    """Every reply takes 3 s and the straggler deadline is 2 s: no code can decode exactly by
    it, so s="auto" rounds end at the deadline for ever. The run says so (once), naming the
    deadline and the key to raise, instead of quietly skipping or approximating."""
    arrivals = FixedArrivals({r: [3.0] * 6 for r in range(1, 6)})
    with caplog.at_level("WARNING"):
        rows = run(6, s="auto", s_max=2, rounds=5, latency=arrivals,
                   straggler_timeout=2.0).rows
    assert all(r["decode"] != "exact" for r in rows)
    named = [m for m in caplog.messages if "straggler_timeout=2" in m]
    assert len(named) == 1, caplog.messages
    assert "below the clients' round times" in named[0] and "straggler-timeout" in named[0]
    # a deadline above the replies: no such warning
    caplog.clear()
    with caplog.at_level("WARNING"):
        rows = run(6, s="auto", s_max=2, rounds=5, latency=arrivals,
                   straggler_timeout=10.0).rows
    assert all(r["decode"] == "exact" for r in rows)
    assert not [m for m in caplog.messages if "straggler_timeout" in m]


# ------------------------------------------------------------------ stopping at the round's end
def test_virtual_clock_stops_every_late_worker_when_the_round_decodes():
    clock = VirtualClock(straggler_timeout=10.0, stop_at_deadline="decode")
    clock.now = 100.0
    clock.busy_until = {13: 104.0}  # node 13 busy for 4 s more
    clock.start_round(queued={3: 13})
    own = {0: 2.0, 1: 7.0, 2: 3.0, 3: 1.0, 4: 12.0}
    window = clock.window(own, lambda used: len(used) >= 2, num_sent=5)
    # arrivals 2, 7, 3, 5 (1 s after its 4-s backlog), 12: decodable at 0 and 2, t = 103
    assert window.end == pytest.approx(103.0) and window.used == [0, 2]
    assert window.late == [] and window.stopped == [1, 3, 4]
    # stopped at the round's end; 3's message had not started (its earlier job ends at 104)
    assert window.stopped_at == pytest.approx({1: 103.0, 3: 104.0, 4: 103.0})
    clock.finish_round([10, 11, 12, 13, 14], {10: 2.0, 11: 7.0, 12: 3.0, 13: 1.0, 14: 12.0},
                       window.end)
    assert clock.busy_until == pytest.approx(
        {10: 102.0, 11: 103.0, 12: 103.0, 13: 104.0, 14: 103.0})
    assert clock.now == pytest.approx(103.0)


def test_virtual_clock_stopping_at_the_end_frees_a_silent_worker_at_the_round_s_end():
    clock = VirtualClock(straggler_timeout=10.0, stop_at_deadline="decode")
    window = clock.window({0: 1.0, 1: 2.0}, lambda used: len(used) >= 2, num_sent=3)
    clock.finish_round([10, 11, 12], {10: 1.0, 11: 2.0}, window.end)  # 12 never answers
    assert window.end == pytest.approx(2.0)
    assert clock.busy_until[12] == pytest.approx(2.0)  # cancelled with the rest, not at 10 s


def test_an_undecodable_round_stops_its_late_work_at_the_deadline_when_stopping_at_the_end():
    clock = VirtualClock(straggler_timeout=5.0, stop_at_deadline="decode")
    window = clock.window({0: 1.0, 1: 8.0}, lambda used: len(used) >= 2, num_sent=2)
    assert window.end == pytest.approx(5.0) and window.stopped == [1]
    assert window.stopped_at == pytest.approx({1: 5.0})


def test_work_stopped_at_the_round_s_end_leaves_no_one_busy_and_the_model_exact():
    outcome = _slow_run("decode", rounds=7)
    # worker 5's round-1 reply (20 s) stops when round 1 decodes at 1 s: never busy
    assert [5 in row["busy"] for row in outcome.rows] == [False] * 7
    assert all(row["decode"] == "exact" for row in outcome.rows)
    assert_model(outcome.models[7], fedavg_rounds(theta0(), 7, 6))
    first = outcome.rows[0]
    assert (first["late_dropped"], first["stopped_at_deadline"]) == (0, 1)
    assert outcome.strategy.options.describe("FedAvg", None)["stop_late_work"] == "decode"


def test_a_worker_stopped_at_the_round_s_end_is_censored_there():
    outcome = _slow_run("decode", rounds=23, busy="fit")
    first = outcome.strategy.code_policy.book.estimator.round(0)
    slow = np.flatnonzero(np.isnan(first.y))
    # its time is known only to exceed round 1's end (1 s), never observed later
    assert slow.size == 1 and first.limit[slow[0]] == pytest.approx(1.0)
    assert outcome.strategy.code_policy.book.late == []


def test_the_server_prices_no_backlog_when_work_stops_at_the_round_s_end(monkeypatch):
    seen = _choose_s_keyword(monkeypatch, "lookahead")
    for stop in ("decode", True):
        seen.clear()
        _slow_run(stop, rounds=2, s="auto", code="nested")
        assert seen and set(seen) == {stop is True}


def test_stopping_at_the_round_s_end_needs_virtual_timing():
    with pytest.raises(ValueError, match=r"stop_late_work=.decode. must be .*timing=.wallclock."):
        GradientCoding(FedAvg(fraction_evaluate=0.0), timing="wallclock",
                       stop_late_work="decode")
    assert merge_config({"stop-late-work": "decode"})["stop-late-work"] == "decode"
    with pytest.raises(ValueError, match=r"stop_late_work='cancel' must be"):
        GradientCoding(FedAvg(fraction_evaluate=0.0), stop_late_work="cancel")


def test_a_reply_arriving_as_the_round_decodes_is_done_not_stopped():
    clock = VirtualClock(straggler_timeout=10.0, stop_at_deadline="decode")
    window = clock.window({0: 1.0, 1: 1.0, 2: 1.0, 3: 2.0}, lambda used: len(used) >= 2, 4)
    assert window.used == [0, 1] and window.late == [2] and window.stopped == [3]
    outcome = _slow_run("decode", rounds=3)
    # rounds 2 and 3: all six replies arrive at 1 s, as the round decodes: none stopped,
    # every reply's bytes received
    assert [row["stopped_at_deadline"] for row in outcome.rows] == [1, 0, 0]
    assert outcome.rows[1]["bytes_up"] == outcome.rows[2]["bytes_up"]
    assert outcome.rows[0]["bytes_up"] == pytest.approx(outcome.rows[1]["bytes_up"] * 5 / 6)
