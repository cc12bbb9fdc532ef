"""The rivals (``fl_gradcode.rivals``) against numpy references of what each should apply.

The numpy app (``tests/apps/numpy_app.py``) moves partition ``j``'s model towards its own
target on ``10 + j`` examples; arrivals come from a fixed table (``FixedArrivals``, compute not
measured), so the references below replay, in plain numpy, what each rival's definition says
it applies: FedAvg over every reply (wait-for-all), FedAvg over exactly the first ``K``
arrivals by virtual time, work queued behind a client's late job (first-k), and
staleness-weighted buffered updates (FedBuff)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Error, Message

from fl_gradcode.flower.testing import InProcessGrid
from fl_gradcode.results import read_rounds
from fl_gradcode.rivals import (
    FedBuff,
    FirstK,
    WaitForAll,
    deadline_grid,
    staleness_weight,
    stated_deadline,
    train_timing_mod,
)
from tests.apps.numpy_app import (
    LR,
    as_dict,
    assert_model,
    call_app,
    fedavg,
    initial_arrays,
    make_app,
    theta0,
)
from tests.flower.harness import DevicesOff, FixedArrivals

pytestmark = pytest.mark.filterwarnings("ignore:fraction_evaluate")


def _start(strategy, n, rounds, app=None):
    models = {}

    def evaluate_fn(server_round, arrays):
        models[server_round] = as_dict(arrays)

    result = strategy.start(grid=InProcessGrid(app or make_app(train_timing_mod), n),
                            initial_arrays=initial_arrays(), num_rounds=rounds,
                            train_config=ConfigRecord({"lr": LR}), evaluate_fn=evaluate_fn)
    return result, models


def _sync(cls, table, notices=None, **kwargs):
    latency = FixedArrivals(table) if notices is None else DevicesOff(table, notices)
    return cls(latency=latency, measured_compute=False, fraction_evaluate=0.0,
               min_available_nodes=1, **kwargs)


# ============================================================================= wait for all
TABLE = {1: [0.5, 2.0, 0.1, 3.0], 2: [1.0, 0.2, 4.0, 0.3], 3: [0.7, 0.6, 0.5, 0.4]}


def test_wait_for_all_applies_fedavg_of_every_reply_and_lasts_its_slowest_arrival():
    strategy = _sync(WaitForAll, TABLE, min_train_nodes=1)
    result, models = _start(strategy, 4, 3)
    theta = theta0()
    for r in (1, 2, 3):
        theta = fedavg(theta, range(4), 4)
        assert_model(models[r], theta)
    assert_model(as_dict(result.arrays), theta)
    assert [row["round_virtual_s"] for row in strategy.history] == pytest.approx([3.0, 4.0, 0.7])
    assert strategy.history[-1]["virtual_s"] == pytest.approx(7.7)
    assert all(row["late_dropped"] == 0 and row["decode"] == "all" for row in strategy.history)


def test_wait_for_all_refuses_a_deadline():
    with pytest.raises(ValueError, match="WaitForAll waits for every reply: it takes no "
                                         "deadline"):
        WaitForAll(deadline=2.0)


# ============================================================================= first-k
def _first_k_reference(table, n, k, rounds):
    """FedAvg of the first ``k`` arrivals of each round; a client late in a round is busy
    until its reply arrives, and its next job starts then (a SuperNode runs one message after
    the other). Returns the models and each round's (kept partitions, end time)."""
    theta, now, busy_until = theta0(), 0.0, [0.0] * n
    models, rounds_out = {}, []
    for r in range(1, rounds + 1):
        start = now
        arrive = [start + max(busy_until[p] - start, 0.0) + table[r][p] for p in range(n)]
        order = sorted(range(n), key=lambda p: (arrive[p], p))
        kept = order[:k]
        now = arrive[kept[-1]]
        for p in range(n):
            busy_until[p] = max(busy_until[p], arrive[p])
        theta = fedavg(theta, kept, n)
        models[r] = theta
        rounds_out.append((sorted(kept), now))
    return models, rounds_out


def test_first_k_applies_fedavg_of_exactly_the_first_k_arrivals_with_late_work_queued():
    """k=3, overcommit 1.3: ceil(3.9) = 4 sampled (every node); in round 1 partition 3
    arrives at 3.0 s, after the round ended at 2.0 s, so its round-2 job waits until then."""
    strategy = _sync(FirstK, TABLE, k=3)
    _, models = _start(strategy, 4, 3)
    expected, per_round = _first_k_reference(TABLE, 4, 3, 3)
    for r in (1, 2, 3):
        assert_model(models[r], expected[r])
    assert [row["clients_used"] for row in strategy.history] == [k for k, _ in per_round]
    assert [row["virtual_s"] for row in strategy.history] == pytest.approx(
        [t for _, t in per_round])
    assert [row["late_dropped"] for row in strategy.history] == [1, 1, 1]


def test_first_k_samples_ceil_c_k_nodes_and_keeps_the_fastest_k_of_them():
    n, k = 10, 5
    times = {1: [float(10 - p) for p in range(n)]}  # partition 9 is the fastest
    strategy = _sync(FirstK, times, k=k, overcommit=1.3)
    _, models = _start(strategy, n, 1)
    row = strategy.history[0]
    sampled = sorted(row["clients_used"] + row["stragglers"])
    assert len(sampled) == math.ceil(1.3 * k) == 7
    fastest = sorted(sorted(sampled, key=lambda p: times[1][p])[:k])
    assert row["clients_used"] == fastest
    assert_model(models[1], fedavg(theta0(), fastest, n))


def test_first_k_refuses_more_samples_than_connected_nodes_naming_the_numbers():
    strategy = _sync(FirstK, TABLE, k=4, overcommit=1.3)
    with pytest.raises(ValueError, match=r"^FirstK\(k=4, overcommit=1.3\) samples 6 nodes but "
                                         r"only 4 are connected: lower k or overcommit$"):
        _start(strategy, 4, 1)


@pytest.mark.parametrize("kwargs, message", [
    ({"k": 0}, "k=0 must be an integer >= 1"),
    ({"k": 2, "overcommit": 0.9}, "overcommit=0.9 must be a number >= 1"),
    ({"k": 2, "fraction_train": 0.5}, "do not pass fraction_train"),
])
def test_first_k_refuses_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FirstK(**kwargs)


# ============================================================================= devices off
# A device that goes off never replies; Flower's SuperLink then answers its message with an
# error (NODE_UNAVAILABLE) once the node has missed its heartbeats. A round that waits for
# every reply ends when each sampled client has replied or been reported off, never later.
INF = math.inf
OFF_TABLE = {1: [0.5, INF, 0.1, 3.0], 2: [1.0, 0.2, INF, 0.3], 3: [0.7, 0.6, 0.5, 0.4]}
OFF_NOTICES = {1: {1: 5.0}, 2: {2: 0.0}, 3: {}}


def test_wait_for_all_ends_a_round_when_every_client_replied_or_was_reported_off():
    strategy = _sync(WaitForAll, OFF_TABLE, OFF_NOTICES, min_train_nodes=1)
    _, models = _start(strategy, 4, 3)
    theta = theta0()
    for r, kept in ((1, [0, 2, 3]), (2, [0, 1, 3]), (3, [0, 1, 2, 3])):
        theta = fedavg(theta, kept, 4)
        assert_model(models[r], theta)
    rows = strategy.history
    # round 1: the last reply at 3.0 s, partition 1 reported off at 5.0 s; round 2: reported
    # off at once, the last reply at 1.0 s; round 3: every reply, the slowest at 0.7 s
    assert [row["round_virtual_s"] for row in rows] == pytest.approx([5.0, 1.0, 0.7])
    assert rows[-1]["virtual_s"] == pytest.approx(6.7)
    assert [row["clients_used"] for row in rows] == [[0, 2, 3], [0, 1, 3], [0, 1, 2, 3]]
    assert [row["stragglers"] for row in rows] == [[1], [2], []]


def test_first_k_short_of_k_live_clients_ends_when_the_rest_are_reported_off():
    # k=2 of ceil(2.6) = 3 sampled; partitions 0 and 2 off, reported at 2.0 s and 7.0 s
    table, notices = {1: [INF, 0.4, INF]}, {1: {0: 2.0, 2: 7.0}}
    strategy = _sync(FirstK, table, notices, k=2)
    _, models = _start(strategy, 3, 1)
    assert strategy.history[0]["round_virtual_s"] == pytest.approx(7.0)
    assert_model(models[1], fedavg(theta0(), [1], 3))
    # with a deadline before the last report, the round ends at the deadline
    strategy = _sync(FirstK, table, notices, k=2, deadline=3.0)
    _start(strategy, 3, 1)
    assert strategy.history[0]["round_virtual_s"] == pytest.approx(3.0)


def test_a_client_reported_off_after_the_round_ended_is_free_from_the_report_on():
    """k=2 of 3: round 1 ends at the second arrival (0.6 s), before partition 2 is reported
    off (5.0 s after the round's start); its message errored then, so round 2's job starts at
    5.0 s (not after a 1e12 s wait): arrival 5.0 - 0.6 + 0.7 = 5.1 s into round 2."""
    table = {1: [0.5, 0.6, INF], 2: [INF, 0.6, 0.7]}
    notices = {1: {2: 5.0}, 2: {0: 0.0}}
    strategy = _sync(FirstK, table, notices, k=2, overcommit=1.5)
    _start(strategy, 3, 2)
    assert [row["round_virtual_s"] for row in strategy.history] == pytest.approx([0.6, 5.1])
    assert [row["clients_used"] for row in strategy.history] == [[0, 1], [1, 2]]


def _fedbuff_off_reference(table, notices, n, k, steps):
    """FedBuff with concurrency ``n``, server lr 1, weights ``1/sqrt(1 + tau)``; job ``j`` of
    client ``p`` takes ``table[j][p]`` s, or, when that is ``inf`` (the device off), is
    reported off ``notices[j][p]`` s after it started: no update, and the client is sent the
    current model again then (its next job)."""

    def took(job, p):
        return notices[job][p] if math.isinf(table[job][p]) else table[job][p]

    theta, version = theta0(), 0
    jobs = [1] * n
    running = {p: (took(1, p), 0, theta) for p in range(n)}
    buffer, count, models, times = None, 0, {}, {}
    while version < steps:
        p = min(running, key=lambda q: (running[q][0], q))
        arrive, sent_version, sent = running.pop(p)
        if not math.isinf(table[jobs[p]][p]):
            new, _, _ = call_app(sent, p, n)
            w = (1.0 + version - sent_version) ** -0.5
            delta = {name: w * (new[name] - sent[name]) for name in sent}
            buffer = delta if buffer is None else {m: buffer[m] + delta[m] for m in buffer}
            count += 1
            if count == k:
                theta = {m: theta[m] + buffer[m] / k for m in theta}
                version += 1
                models[version], times[version] = theta, arrive
                buffer, count = None, 0
        jobs[p] += 1
        running[p] = (arrive + took(jobs[p], p), version, theta)
    return models, times


def test_fedbuff_gives_the_slot_of_a_client_reported_off_to_the_next_job_then():
    table = {j: list(row) for j, row in FEDBUFF_TABLE.items()}
    notices = {j: {} for j in table}
    table[1][1], notices[1][1] = INF, 1.5   # off in its first job, reported at 1.5 s
    table[3][0], notices[3][0] = INF, 0.0   # off at its third job's start: reported at once
    strategy = FedBuff(buffer_size=2, concurrency=3, latency=DevicesOff(table, notices),
                       measured_compute=False)
    _, models = _start(strategy, 3, 5)
    expected, times = _fedbuff_off_reference(table, notices, 3, 2, 5)
    for step in range(1, 6):
        assert_model(models[step], expected[step])
    assert [row["virtual_s"] for row in strategy.history] == pytest.approx(
        [times[s] for s in range(1, 6)])
    assert all(math.isfinite(row["virtual_s"]) for row in strategy.history)
    assert sum(row["rejected"] for row in strategy.history) == 2


def _devices(off: dict[int, tuple[list[float], list[float]]], seconds: list[float]):
    """FedScale devices 1..n: client ``w`` (device ``w + 1``) takes ``seconds[w]`` per job
    (3 x ms/sample / 1000 at load 1, no upload); ``off``: client -> its on periods
    ``(active, inactive)`` of a 1000 s cycle (others always on)."""
    from fl_gradcode.devices import DeviceTrace

    capacity = {w + 1: {"computation": 1000.0 * s / 3, "communication": 1.0}
                for w, s in enumerate(seconds)}
    behave = {w + 1: {"active": a, "inactive": i, "finish_time": 1000.0}
              for w, (a, i) in off.items()}
    return DeviceTrace(capacity, behave, round_s=60.0)


def test_fedbuff_sends_no_work_to_a_device_until_it_is_on_again():
    """Client 1's device is off for the first 10 s of the run (on 10-900 of its cycle, off
    since 900 of the last one: reported at once). Client 0 takes 1 s a job, client 1 2 s.
    K = 1: client 0's updates are steps 1..10 at 1..10 s; client 1 is sent work when its
    device is on, at 10 s, and its first update is at 12 s. (It used to be sent its next job
    at once, read 60 s further along its cycle, and reply at 2 s.)"""
    strategy = FedBuff(buffer_size=1, concurrency=2, measured_compute=False,
                       latency=_devices({1: ([10.0], [900.0])}, [1.0, 2.0]))
    _start(strategy, 2, 14)
    used = [(row["clients_used"], row["virtual_s"]) for row in strategy.history]
    assert used[:10] == [([0], pytest.approx(float(t))) for t in range(1, 11)]
    first = next(t for pids, t in used if pids == [1])
    assert first == pytest.approx(12.0)
    assert sum(row["rejected"] for row in strategy.history) == 1


def test_fedbuff_with_every_idle_device_off_waits_for_the_first_back_on():
    """Both devices off at the start (back at 5 s and 8 s): the run's first update is at
    5 + 1 s, and no job is re-sent to a device still off (two reports in all)."""
    strategy = FedBuff(buffer_size=1, concurrency=2, measured_compute=False,
                       latency=_devices({0: ([5.0], [900.0]), 1: ([8.0], [900.0])},
                                        [1.0, 1.0]))
    _start(strategy, 2, 3)
    assert [row["virtual_s"] for row in strategy.history] == pytest.approx([6.0, 7.0, 8.0])
    assert sum(row["rejected"] for row in strategy.history) == 2


def test_fedbuff_runs_on_past_its_devices_first_cycles():
    """One client, 400 s jobs, its device on 0.1-900 s of a 1000 s cycle. Hand-timed: sent at
    0.1 (off at 0, reported at once: off since 900 of the last cycle), steps at 400.1 and
    800.1; the job from 800.1 is cut at 900, heard of at 960, and the client is back at
    1000.1: steps at 1400.1, 1800.1; cut again at 1900, back at 2000.1: 2400.1, 2800.1."""
    strategy = FedBuff(buffer_size=1, concurrency=1, measured_compute=False,
                       latency=_devices({0: ([0.1], [900.0])}, [400.0]))
    _start(strategy, 1, 6)
    assert [row["virtual_s"] for row in strategy.history] == pytest.approx(
        [400.1, 800.1, 1400.1, 1800.1, 2400.1, 2800.1])
    assert sum(row["rejected"] for row in strategy.history) == 3


def test_fedbuff_stops_when_no_device_is_ever_on_again(caplog):
    import logging

    strategy = FedBuff(buffer_size=1, concurrency=1, measured_compute=False,
                       latency=_devices({0: ([], [])}, [1.0]))
    with caplog.at_level(logging.WARNING, logger="flwr"):
        _start(strategy, 1, 3)
    assert strategy.history == []
    assert any("no client can take work" in r.getMessage() for r in caplog.records)


def test_synchronous_rounds_read_the_devices_at_their_start_time():
    """Both clients take 1 s per unit of load; client 1's load is 11 / 10.5 (its examples
    over the mean), so rounds last ``L1``; round 3 starts at ``2 L1`` (2.1 s) and client 1's
    device (on 0-2.5 of its cycle) goes off during its job: no reply, heard of at 2.5 + 60 s,
    when wait-for-all ends the round. (Read at round x 60 s, as it used to be, client 1 was
    off from round 1 on.)"""
    strategy = WaitForAll(latency=_devices({1: ([0.0], [2.5])}, [1.0, 1.0]),
                          measured_compute=False, fraction_evaluate=0.0,
                          min_available_nodes=1, min_train_nodes=1)
    _start(strategy, 2, 3)
    assert [sorted(row["clients_used"]) for row in strategy.history] == [[0, 1], [0, 1], [0]]
    load1 = 11 / 10.5
    assert [row["round_virtual_s"] for row in strategy.history] == pytest.approx(
        [load1, load1, 62.5 - 2 * load1])


# ============================================================================= deadline rule
def test_the_stated_deadline_is_three_times_the_75th_percentile_and_the_grid_holds_it():
    times = np.arange(1.0, 101.0)
    assert stated_deadline(times) == pytest.approx(3 * np.quantile(times, 0.75))
    base = stated_deadline(times)
    assert base in deadline_grid(base)
    with pytest.raises(ValueError, match="arrivals: expected non-negative finite seconds"):
        stated_deadline([1.0, float("nan")])


# ============================================================================= FedBuff
def _fedbuff_reference(table, n, k, server_lr, steps, exponent=0.5):
    """Every client always busy (concurrency = n): a finished client is sent the current
    model at once. Update ``theta_j - theta_sent`` weighted ``(1 + tau)^-exponent``; every
    ``k`` updates ``theta += server_lr * sum / k``. ``table[job][p]``: client ``p``'s
    ``job``-th job's duration. Returns the model after each step and each step's time."""
    theta, version = theta0(), 0
    jobs = [1] * n
    running = {p: (table[1][p], version, theta) for p in range(n)}  # p -> (arrival, v, sent)
    buffer, count, models, times = None, 0, {}, {}
    while version < steps:
        p = min(running, key=lambda q: (running[q][0], q))
        arrive, sent_version, sent = running.pop(p)
        new, _, _ = call_app(sent, p, n)
        w = (1.0 + version - sent_version) ** -exponent
        delta = {name: w * (new[name] - sent[name]) for name in sent}
        buffer = delta if buffer is None else {m: buffer[m] + delta[m] for m in buffer}
        count += 1
        if count == k:
            theta = {m: theta[m] + server_lr * buffer[m] / k for m in theta}
            version += 1
            models[version], times[version] = theta, arrive
            buffer, count = None, 0
        jobs[p] += 1
        running[p] = (arrive + table[jobs[p]][p], version, theta)
    return models, times


FEDBUFF_TABLE = {j: [0.3 + 0.1 * ((j * 7 + p * 3) % 5) + p * 0.25 for p in range(3)]
                 for j in range(1, 12)}


@pytest.mark.parametrize("exponent", [0.5, 0.0])
def test_fedbuff_applies_staleness_weighted_buffered_updates(exponent):
    strategy = FedBuff(buffer_size=2, concurrency=3, server_lr=0.7,
                       staleness_exponent=exponent, latency=FixedArrivals(FEDBUFF_TABLE),
                       measured_compute=False)
    result, models = _start(strategy, 3, 5)
    expected, times = _fedbuff_reference(FEDBUFF_TABLE, 3, 2, 0.7, 5, exponent)
    for step in range(1, 6):
        assert_model(models[step], expected[step])
    assert_model(as_dict(result.arrays), expected[5])
    assert [row["virtual_s"] for row in strategy.history] == pytest.approx(
        [times[s] for s in range(1, 6)])
    # some update was stale, else the weights were not exercised
    assert any(any(row["staleness"]) for row in strategy.history)


def test_a_second_fedbuff_run_starts_its_virtual_clock_at_zero():
    """The same strategy started twice: the second run's models and step times are the
    reference's, not shifted by the first run's end, and its history holds its own steps
    only."""
    strategy = FedBuff(buffer_size=2, concurrency=3, server_lr=0.7,
                       latency=FixedArrivals(FEDBUFF_TABLE), measured_compute=False)
    _start(strategy, 3, 3)
    _, models = _start(strategy, 3, 5)
    expected, times = _fedbuff_reference(FEDBUFF_TABLE, 3, 2, 0.7, 5)
    for step in range(1, 6):
        assert_model(models[step], expected[step])
    assert [row["virtual_s"] for row in strategy.history] == pytest.approx(
        [times[s] for s in range(1, 6)])


def test_a_second_fedbuff_run_writes_rounds_jsonl_of_its_own_steps(tmp_path):
    """``rounds.jsonl`` holds the rows ``history`` holds: after a second start, the second
    run's steps only (its clock restarted at zero; the first run's rows, numbered from 1
    too, would read as the same steps)."""
    strategy = FedBuff(buffer_size=2, concurrency=3, server_lr=0.7,
                       latency=FixedArrivals(FEDBUFF_TABLE), measured_compute=False,
                       results_dir=str(tmp_path))
    _start(strategy, 3, 3)
    _start(strategy, 3, 5)
    rows = read_rounds(tmp_path)
    _, times = _fedbuff_reference(FEDBUFF_TABLE, 3, 2, 0.7, 5)
    assert [row["round"] for row in rows] == [1, 2, 3, 4, 5]
    assert [row["virtual_s"] for row in rows] == pytest.approx([times[s] for s in range(1, 6)])


@pytest.mark.parametrize("cls", [WaitForAll, FirstK])
def test_a_second_synchronous_rival_run_continues_its_clock_in_history_and_rounds_jsonl(
        cls, tmp_path):
    """The synchronous rivals continue the federation on a second start (clients busy with
    the first run's late work stay busy): the clock goes on, and ``rounds.jsonl`` lists both
    runs' rounds as ``history`` does, in order of time."""
    kwargs = {"k": 2} if cls is FirstK else {}
    strategy = _sync(cls, TABLE, results_dir=str(tmp_path), **kwargs)
    _start(strategy, 4, 2)
    _start(strategy, 4, 3)
    rows = read_rounds(tmp_path)
    assert [row["round"] for row in rows] == [1, 2, 1, 2, 3]
    assert [row["virtual_s"] for row in rows] == [row["virtual_s"] for row in strategy.history]
    times = [row["virtual_s"] for row in rows]
    assert times == sorted(times) and times[2] > times[1]


def test_fedbuff_with_one_step_of_every_fresh_update_is_the_unweighted_mean_update():
    table = {1: [1.0, 2.0, 3.0], 2: [10.0, 10.0, 10.0]}  # the next jobs arrive later
    strategy = FedBuff(buffer_size=3, concurrency=3, server_lr=1.0,
                       latency=FixedArrivals(table), measured_compute=False)
    _, models = _start(strategy, 3, 1)
    theta = theta0()
    updates = [call_app(theta, p, 3)[0] for p in range(3)]
    expected = {m: theta[m] + sum(u[m] - theta[m] for u in updates) / 3 for m in theta}
    assert_model(models[1], expected)
    assert strategy.history[0]["staleness"] == [0, 0, 0]


def test_a_fedbuff_error_reply_is_counted_and_the_run_goes_on():
    def app(msg, context):
        if int(context.node_config["partition-id"]) == 1:
            return Message(Error(0, "client crashed"), reply_to=msg)
        return make_app(train_timing_mod)(msg, context)

    strategy = FedBuff(buffer_size=2, concurrency=3, latency=FixedArrivals(FEDBUFF_TABLE),
                       measured_compute=False)
    _, models = _start(strategy, 3, 3, app=app)
    assert sorted(models) == [0, 1, 2, 3]
    assert all(1 not in row["clients_used"] for row in strategy.history)
    assert sum(row["rejected"] for row in strategy.history) >= 1


def test_the_staleness_weight_is_one_over_the_root_of_one_plus_tau():
    assert [staleness_weight(t) for t in (0, 3, 8)] == pytest.approx([1.0, 0.5, 1 / 3])
    with pytest.raises(ValueError, match="staleness tau=-1 must be >= 0"):
        staleness_weight(-1)


def test_fedbuff_needs_the_timing_mod_and_says_so():
    strategy = FedBuff(buffer_size=1, measured_compute=False)
    with pytest.raises(ValueError, match=r"needs train_timing_mod in the ClientApp's mods"):
        _start(strategy, 2, 1, app=make_app())


def test_fedbuff_refuses_bad_arguments():
    with pytest.raises(ValueError, match="buffer_size=0 must be an integer >= 1"):
        FedBuff(buffer_size=0)
    with pytest.raises(ValueError, match=r"server_lr=0\.0 must be > 0"):
        FedBuff(buffer_size=1, server_lr=0.0)


def test_the_rivals_are_flower_fedavg_subclasses():
    from flwr.serverapp.strategy import FedAvg

    assert all(issubclass(cls, FedAvg) for cls in (WaitForAll, FirstK, FedBuff))
    assert isinstance(initial_arrays(), ArrayRecord)
