"""FedScale-format device traces (``latency=fedscale``): the loader reads FedScale's own pickles
and gives the delays of a hand computation; the generator is reproducible from its seed and
draws what its stated fit says."""

from __future__ import annotations

import math
import pickle
from pathlib import Path

import numpy as np
import pytest

from fl_gradcode.devices import FIT, generate_fedscale
from fl_gradcode.latency import client_delay, make_latency

BUNDLED = Path(__file__).resolve().parents[2] / "fl_gradcode" / "traces" / "fedscale-generated"

# three devices in FedScale's format, ids as FedScale numbers them (not 0..n-1, unsorted)
CAPACITY = {
    7: {"computation": 20.0, "communication": 1000.0},
    3: {"computation": 100.0, "communication": 8000.0},
    12: {"computation": 50.0, "communication": 250.0},
}
BEHAVE = {
    # on 0-100 and 200-1000 of a 1000 s cycle
    3: {"active": [0.0, 200.0], "inactive": [100.0, 1000.0], "finish_time": 1000.0,
        "duration": 1000.0, "model": "any"},
    # on 50-60 only
    7: {"active": [50.0], "inactive": [60.0], "finish_time": 1000.0},
    # device 12 has no behaviour entry: always on
}


def _write(directory: Path, behave: bool = True) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "client_device_capacity", "wb") as fh:
        pickle.dump(CAPACITY, fh)
    if behave:
        with open(directory / "client_behave_trace", "wb") as fh:
            pickle.dump(BEHAVE, fh)
    return directory


def _hand(device: int, samples: float, model_bytes: float) -> float:
    """FedScale's charge: 3 x samples x ms/sample (forward + backward), plus bits / kbps."""
    cap = CAPACITY[device]
    return 3 * samples * cap["computation"] / 1000 + model_bytes * 8 / 1000 / cap["communication"]


def test_fedscale_pickles_give_the_delays_of_a_hand_computation(tmp_path):
    path = _write(tmp_path / "trace")
    model = make_latency("fedscale", device_trace=str(path), samples_per_load=10.0,
                         model_bytes=50_000.0, round_s=250.0)
    # clients map to the devices in sorted id order: worker 0 -> 3, 1 -> 7, 2 -> 12, 3 -> 3
    d3 = _hand(3, 10.0, 50_000.0)  # 3 + 0.05 = 3.05 s
    d3_load2 = _hand(3, 20.0, 50_000.0)
    d12 = _hand(12, 10.0, 50_000.0)  # 1.5 + 1.6 = 3.1 s
    assert d3 == pytest.approx(3.05) and d12 == pytest.approx(3.1)
    cases = [
        # (worker, round, load, expected): round r starts at 250 r s on the 1000 s cycle
        (0, 0, 1.0, d3),  # t = 0: on until 100
        (0, 1, 1.0, d3),  # t = 250: in 200-1000
        (0, 4, 1.0, d3),  # t = 1000 = 0 mod 1000
        (3, 2, 2.0, d3_load2),  # worker 3 is device 3 again; t = 500
        (1, 0, 1.0, math.inf),  # device 7 off at t = 0
        (1, 1, 1.0, math.inf),  # and at 250
        (2, 0, 1.0, d12),  # device 12: no behaviour entry, always on
        (2, 3, 1.0, d12),
    ]
    for worker, rnd, load, expected in cases:
        got = client_delay(model, worker=worker, round_index=rnd, load=load, seed=0)
        assert got == pytest.approx(expected), (worker, rnd, load)


def test_a_device_going_off_before_it_finishes_never_replies(tmp_path):
    path = _write(tmp_path / "trace")
    # device 3 is on 0-100: a 3.05 s task starting at 98 s would end after it goes off
    model = make_latency("fedscale", device_trace=str(path), samples_per_load=10.0,
                         model_bytes=50_000.0, round_s=98.0)
    assert client_delay(model, worker=0, round_index=1, load=1.0, seed=0) == math.inf
    # device 7 is on 50-60: a 0.9 s task (3 x 10 x 20 ms + 0.4 s) starting at 55 fits
    model = make_latency("fedscale", device_trace=str(path), samples_per_load=10.0,
                         model_bytes=50_000.0, round_s=55.0)
    hand7 = _hand(7, 10.0, 50_000.0)
    assert hand7 == pytest.approx(1.0)
    assert client_delay(model, worker=1, round_index=1, load=1.0, seed=0) == pytest.approx(hand7)
    # ... but not a task of ten times the load (10 s from 55 goes past 60)
    assert client_delay(model, worker=1, round_index=1, load=10.0, seed=0) == math.inf


@pytest.mark.parametrize("worker, round_s, expected", [
    (0, 98.0, 62.0),    # device 3 on 0-100: a 3.05 s task from 98 s; off at 100, heard at 160
    (0, 150.0, 10.0),   # off since 100 when the task starts at 150: heard at 160
    (0, 300.0, math.inf),  # on 200-1000: replies
    (1, 10.0, 0.0),     # device 7 (on 50-60 only) off since 60 of the last cycle: at once
    (1, 59.5, 60.5),    # a 1.0 s task from 59.5 s: off at 60, heard at 120
    (2, 10.0, math.inf),   # device 12 has no behaviour entry: always on
])
def test_the_server_hears_of_a_device_gone_off_a_minute_after_it_went(tmp_path, worker,
                                                                      round_s, expected):
    """Flower's SuperLink reports a node unavailable after two missed 30 s heartbeats."""
    from flwr.common import constant

    from fl_gradcode.latency import failure_notice

    assert constant.HEARTBEAT_PATIENCE * constant.HEARTBEAT_DEFAULT_INTERVAL == 60
    model = make_latency("fedscale", device_trace=str(_write(tmp_path / "trace")),
                         samples_per_load=10.0, model_bytes=50_000.0, round_s=round_s)
    notice = failure_notice(model, worker=worker, round_index=1, load=1.0, seed=0)
    assert notice == pytest.approx(expected)
    delay = client_delay(model, worker=worker, round_index=1, load=1.0, seed=0)
    assert math.isinf(delay) == math.isfinite(notice)


def test_a_model_without_devices_never_reports_a_client_off():
    from fl_gradcode.latency import failure_notice

    model = make_latency("bimodal", p=0.5, slowdown=20.0)
    assert failure_notice(model, worker=3, round_index=2, load=1.0, seed=0) == math.inf


def test_the_capacity_file_alone_or_by_path_is_read_as_fedscale_writes_it(tmp_path):
    only = _write(tmp_path / "no-behave", behave=False)
    model = make_latency("fedscale", device_trace=str(only), samples_per_load=10.0,
                         model_bytes=50_000.0, round_s=250.0)
    # no behaviour file: every device always available (device 7 too)
    assert client_delay(model, worker=1, round_index=0, load=1.0, seed=0) == pytest.approx(
        _hand(7, 10.0, 50_000.0))
    both = _write(tmp_path / "both")
    by_file = make_latency("fedscale", device_trace=str(both / "client_device_capacity"),
                           samples_per_load=10.0, model_bytes=50_000.0, round_s=250.0)
    assert client_delay(by_file, worker=1, round_index=0, load=1.0, seed=0) == math.inf


def test_malformed_or_missing_trace_files_are_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="client_device_capacity"):
        make_latency("fedscale", device_trace=str(tmp_path / "nowhere"))
    bad = tmp_path / "bad"
    bad.mkdir()
    with open(bad / "client_device_capacity", "wb") as fh:
        pickle.dump({1: {"computation": 10.0}}, fh)
    with pytest.raises(ValueError, match="communication"):
        make_latency("fedscale", device_trace=str(bad))


def test_the_generator_is_reproducible_from_its_seed():
    a = generate_fedscale(40, seed=3)
    assert a == generate_fedscale(40, seed=3)
    assert a != generate_fedscale(40, seed=4)
    # device c depends on (seed, c) only: a larger federation starts with the same devices
    bigger = generate_fedscale(60, seed=3)
    assert {c: bigger[0][c] for c in a[0]} == a[0]
    assert {c: bigger[1][c] for c in a[1]} == a[1]
    # the bundled trace is the generator's seed-0 draw of 100 devices
    with open(BUNDLED / "client_device_capacity", "rb") as fh:
        capacity = pickle.load(fh)
    with open(BUNDLED / "client_behave_trace", "rb") as fh:
        behave = pickle.load(fh)
    assert (capacity, behave) == generate_fedscale(100, seed=0)
    assert sum(p.stat().st_size for p in BUNDLED.iterdir()) < 200_000


def test_generated_devices_follow_the_stated_fit():
    capacity, behave = generate_fedscale(3000, seed=11)
    compute = np.log([c["computation"] for c in capacity.values()])
    network = np.log([c["communication"] for c in capacity.values()])
    # log-normal: median = exp(mean of the log), sigma = std of the log (3000 draws: the
    # standard errors are about 2% of sigma)
    assert math.exp(np.mean(compute)) == pytest.approx(FIT["computation_median_ms"], rel=0.05)
    assert np.std(compute) == pytest.approx(FIT["computation_sigma"], rel=0.05)
    assert math.exp(np.mean(network)) == pytest.approx(FIT["communication_median_kbps"],
                                                       rel=0.08)
    assert np.std(network) == pytest.approx(FIT["communication_sigma"], rel=0.05)
    # availability: time on over the cycle = mean_on / (mean_on + mean_off)
    on = [sum(np.subtract(b["inactive"], b["active"])) / b["finish_time"]
          for b in behave.values()]
    expected = FIT["mean_on_s"] / (FIT["mean_on_s"] + FIT["mean_off_s"])
    assert np.mean(on) == pytest.approx(expected, abs=0.01)
    periods = [x for b in behave.values() for x in np.subtract(b["inactive"], b["active"])[1:-1]]
    assert np.mean(periods) == pytest.approx(FIT["mean_on_s"], rel=0.05)
    assert all(b["finish_time"] == FIT["finish_time_s"] for b in behave.values())


def test_a_clock_time_places_the_task_on_the_cycle_in_place_of_the_round(tmp_path):
    """Runs on a virtual clock read the devices at the round's (or job's) start time: the
    round index no longer moves the cycle (hand-read from BEHAVE)."""
    from fl_gradcode.latency import failure_notice

    model = make_latency("fedscale", device_trace=str(_write(tmp_path / "trace")),
                         samples_per_load=10.0, model_bytes=50_000.0, round_s=250.0)
    d3 = _hand(3, 10.0, 50_000.0)
    for rnd in (0, 1, 7):  # whatever the round, time 150 is in device 3's 100-200 gap
        assert client_delay(model, worker=0, round_index=rnd, load=1.0, seed=0,
                            start_s=150.0) == math.inf
        assert failure_notice(model, worker=0, round_index=rnd, load=1.0, seed=0,
                              start_s=150.0) == pytest.approx(10.0)  # off at 100, heard 160
        assert client_delay(model, worker=0, round_index=rnd, load=1.0, seed=0,
                            start_s=250.0) == pytest.approx(d3)
    # without a clock time, round 1 starts at 250 s as before
    assert client_delay(model, worker=0, round_index=1, load=1.0, seed=0) == pytest.approx(d3)
    with pytest.raises(ValueError, match=r"start_s=-1\.0 must be a finite time >= 0"):
        client_delay(model, worker=0, round_index=1, load=1.0, seed=0, start_s=-1.0)


@pytest.mark.parametrize("worker, at_s, expected", [
    (0, 150.0, 50.0),    # device 3: off 100-200
    (0, 250.0, 0.0),     # on 200-1000
    (0, 1100.0, 0.0),    # 100 of the next cycle: on (it goes off at 100 itself)
    (0, 1100.5, 99.5),
    (1, 10.0, 40.0),     # device 7: on 50-60 only
    (1, 55.0, 0.0),
    (1, 70.0, 980.0),    # the next cycle's 50
    (2, 123.0, 0.0),     # device 12: no behaviour entry
])
def test_a_device_reported_off_is_back_at_its_next_period(tmp_path, worker, at_s, expected):
    from fl_gradcode.latency import back_on

    model = make_latency("fedscale", device_trace=str(_write(tmp_path / "trace")))
    assert back_on(model, worker=worker, at_s=at_s) == pytest.approx(expected)
    assert back_on(make_latency("bimodal"), worker=worker, at_s=at_s) == 0.0


def test_a_clock_landing_on_a_periods_start_reads_it_on_after_any_number_of_cycles():
    """now + back_on(now) is the next period's start up to rounding (2000.1 % 1000 is
    0.0999...): read as on, else a client would be re-sent work at once for ever."""
    from fl_gradcode.devices import DeviceTrace
    from fl_gradcode.latency import back_on

    trace = DeviceTrace({1: {"computation": 10.0, "communication": 1000.0}},
                        {1: {"active": [0.1, 500.3], "inactive": [400.0, 900.0],
                             "finish_time": 1000.0}})
    for now in [950.0, 2000.0, 1999.0, 123_456_789.0, 450.25]:
        landing = now + back_on(trace, worker=0, at_s=now)
        assert back_on(trace, worker=0, at_s=landing) == 0.0, now
        assert trace.time(0, 0, start_s=landing) < math.inf, now
    assert 2000.1 % 1000 < 0.1  # the rounding this guards against


def test_a_device_with_no_period_on_is_never_back():
    from fl_gradcode.devices import DeviceTrace
    from fl_gradcode.latency import back_on

    trace = DeviceTrace({1: {"computation": 10.0, "communication": 1000.0}},
                        {1: {"active": [], "inactive": [], "finish_time": 1000.0}})
    assert trace.time(0, 0, start_s=5.0) == math.inf
    assert back_on(trace, worker=0, at_s=5.0) == math.inf
