"""Latency models: closed-form order statistics agree with Monte Carlo."""

from __future__ import annotations

import csv
import os
import re
from pathlib import Path

import numpy as np
import pytest

import fl_gradcode.latency as latency_module
from fl_gradcode.latency import (
    Bimodal,
    Drift,
    Exponential,
    NoLatency,
    Pareto,
    PersistentSlow,
    ShiftedExponential,
    TraceReplay,
    client_delay,
    client_times,
    expected_coded_round_time,
    expected_round_time,
    harmonic,
    make_latency,
    round_times,
)


def monte_carlo(model, n, k, load=1.0, samples=40000, seed=1):
    rng = np.random.default_rng(seed)
    t = np.sort(model.sample((samples, n), rng, load), axis=1)[:, k - 1]
    return float(t.mean()), float(t.std() / np.sqrt(samples))


def test_exponential_order_statistic_closed_form_and_quoted_numbers():
    m = Exponential(rate=1.0)
    assert expected_round_time(m, n=100, wait_for=100) == pytest.approx(5.1874, abs=1e-4)
    assert expected_round_time(m, n=100, wait_for=80) == pytest.approx(
        harmonic(100) - harmonic(20)
    )
    assert expected_round_time(m, n=100, wait_for=80) == pytest.approx(1.590, abs=1e-3)
    assert expected_round_time(m, n=100, wait_for=50) == pytest.approx(0.688, abs=1e-3)


@pytest.mark.parametrize(
    ("model", "n", "k", "load"),
    [
        (Exponential(rate=2.0), 30, 25, 1.0),
        (ShiftedExponential(shift=1.0, rate=1.0), 100, 80, 0.21),
        (ShiftedExponential(shift=0.5, rate=0.1), 20, 20, 0.05),
        (Pareto(scale=1.0, shape=2.5), 50, 45, 1.0),
        (Pareto(scale=2.0, shape=1.5, load_scaled=True), 40, 30, 0.5),
    ],
)
def test_closed_forms_match_monte_carlo(model, n, k, load):
    closed = expected_round_time(model, n=n, wait_for=k, load=load)
    mc, se = monte_carlo(model, n, k, load)
    assert abs(closed - mc) <= 5 * se + 1e-3 * closed


def test_shifted_exponential_scales_with_load_and_exponential_does_not():
    se = ShiftedExponential(shift=1.0, rate=1.0)
    assert expected_round_time(se, 100, 80, load=0.21) == pytest.approx(
        0.21 * (1.0 + harmonic(100) - harmonic(20))
    )
    ex = Exponential(rate=1.0)
    assert expected_round_time(ex, 10, 5, load=0.3) == expected_round_time(ex, 10, 5, load=1.0)


def test_pareto_max_is_infinite_when_tail_too_heavy():
    assert expected_round_time(Pareto(shape=0.9), n=10, wait_for=10) == float("inf")


def test_bimodal_uses_monte_carlo_and_is_seeded():
    m = Bimodal(base=ShiftedExponential(), p=0.1, slowdown=20.0)
    a = expected_round_time(m, 20, 18, load=0.1, samples=4000, seed=3)
    b = expected_round_time(m, 20, 18, load=0.1, samples=4000, seed=3)
    assert a == b
    fast = expected_round_time(ShiftedExponential(), 20, 18, load=0.1)
    assert a > fast


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: Exponential(rate=0), "rate=0"),
        (lambda: ShiftedExponential(shift=-1), "shift=-1"),
        (lambda: Bimodal(p=1.5), "p=1.5"),
        (lambda: expected_round_time(Exponential(), n=10, wait_for=11), "wait_for=11"),
        (lambda: expected_round_time(Exponential(), n=0, wait_for=1), "n=0"),
        (lambda: expected_round_time(Exponential(), n=5, wait_for=2, load=0), "load=0"),
    ],
)
def test_bad_parameters_are_rejected(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_client_delay_is_reproducible_per_seed_round_and_worker():
    from fl_gradcode.latency import client_delay, make_latency

    model = make_latency("bimodal", scale=0.1, rate=10.0, p=0.2, slowdown=20.0)
    a = client_delay(model, worker=3, round_index=5, load=4, seed=1)
    assert a == client_delay(model, worker=3, round_index=5, load=4, seed=1)
    assert a != client_delay(model, worker=3, round_index=6, load=4, seed=1)
    base = make_latency("shifted-exponential", scale=0.1, rate=10.0)
    one = client_delay(base, worker=0, round_index=1, load=1, seed=0)
    four = client_delay(base, worker=0, round_index=1, load=4, seed=0)
    assert four == pytest.approx(4 * one)  # compute scales with the coded load


def test_persistent_slow_clients_stay_slow_every_round():
    from fl_gradcode.latency import PersistentSlow, client_delay

    model = PersistentSlow(base=ShiftedExponential(shift=1.0, rate=100.0), p=0.2, slowdown=50)
    slow = [w for w in range(50) if model.is_slow(w)]
    assert 3 <= len(slow) <= 20
    for r in range(5):
        times = [client_delay(model, worker=w, round_index=r, load=1, seed=0) for w in range(50)]
        assert min(times[w] for w in slow) > max(t for w, t in enumerate(times) if w not in slow)


def test_trace_replay_reads_the_bundled_lambda_traces():
    from fl_gradcode.latency import TraceReplay, client_delay

    trace = TraceReplay("canada")
    assert trace.table.shape == (10, 256)
    assert trace.time(0, 0) == pytest.approx(2.0332)  # first row of canada.csv
    assert trace.time(256 + 1, 10) == trace.time(1, 0)  # worker mod 256, round mod 10
    assert client_delay(trace, worker=1, round_index=10, load=3, seed=0) == trace.time(1, 0)
    assert np.max(trace.table) > 30  # Canada has a 39.6-s straggler
    with pytest.raises(ValueError, match="bundled traces"):
        TraceReplay("mars")


def test_make_latency_knows_every_documented_model():
    from fl_gradcode.latency import LATENCY_MODELS, make_latency

    for name in LATENCY_MODELS:
        model = make_latency(name)
        sample = model.sample((3, 8), np.random.default_rng(0), 2.0)
        assert sample.shape == (3, 8) and np.all(sample >= 0)
    with pytest.raises(ValueError, match="latency='gamma'"):
        make_latency("gamma")


def test_round_time_monte_carlo_matches_order_statistics():
    from fl_gradcode.latency import round_times

    m = Exponential(rate=1.0)
    n, s = 24, 5
    uncoded = round_times(m, n, 0, "uncoded", samples=20000, seed=1)
    assert uncoded.mean() == pytest.approx(harmonic(n), rel=0.02)
    mds = round_times(m, n, s, "mds", samples=20000, seed=1)
    assert mds.mean() == pytest.approx(harmonic(n) - harmonic(s), rel=0.02)
    # FRC: each group's fastest of d=s+1 is Exp(d); the round is the max over n/d groups
    frc = round_times(m, n, s, "frc", samples=20000, seed=1)
    assert frc.mean() == pytest.approx(harmonic(n // (s + 1)) / (s + 1), rel=0.02)
    with pytest.raises(ValueError, match="FRC needs"):
        round_times(m, 10, 2, "frc")


def test_optimal_s_reproduces_the_load_aware_rules():
    from fl_gradcode.latency import expected_coded_round_time, optimal_s

    se = ShiftedExponential(shift=1.0, rate=1.0)  # M2: compute-bound, coding never pays
    assert optimal_s(se, 100)[0] == 0
    assert expected_coded_round_time(se, 100, 20) / 100 == pytest.approx(0.544, abs=1e-3)
    # M3: T = c (s+1)/n + Exp(1): s* ~ n/c - 1; at c=100, s=0 and
    # s=1 tie exactly (1 + H_100 = 2 + H_100 - 1), so take c=200, where s*=0
    assert optimal_s(Exponential(1.0), 100, partition_cost=2.0, samples=3000)[0] == 0
    best, _ = optimal_s(Exponential(1.0), 100, partition_cost=0.1, samples=3000,
                        candidates=list(range(0, 30)))
    assert 6 <= best <= 13  # exact optimum 9; Monte Carlo flat near it


# ======== edges: exact values, bounds and messages ===============================================
def _draw(model, size, load=None, seed=3):
    rng = np.random.default_rng(seed)
    return model.sample(size, rng) if load is None else model.sample(size, rng, load)


@pytest.mark.parametrize(
    "model",
    [
        Exponential(rate=2.0, load_scaled=True),
        ShiftedExponential(shift=0.5, rate=2.0),
        Pareto(scale=1.0, shape=1.5, load_scaled=True),
        TraceReplay("canada", load_scaled=True),
    ],
    ids=["exponential", "shifted-exponential", "pareto", "trace"],
)
def test_a_load_scaled_model_takes_load_times_as_long_and_the_default_load_is_one(model):
    one = _draw(model, (4, 6), 1.0)
    np.testing.assert_allclose(_draw(model, (4, 6)), one, rtol=0, atol=0)
    np.testing.assert_allclose(_draw(model, (4, 6), 3.0), 3.0 * one, rtol=1e-15)


def test_a_trace_replays_its_table_and_scales_it_by_the_load():
    trace = TraceReplay("canada", load_scaled=True)
    rounds, workers = trace.table.shape
    value = float(trace.table[2, 5])
    assert trace.time(5, 2) == value  # default load: one unit
    assert trace.time(5 + workers, 2 + rounds, 4.0) == pytest.approx(4.0 * value, rel=1e-15)
    assert TraceReplay("canada").time(5, 2, 4.0) == value  # not load-scaled: the load is moot


def test_the_persistent_slow_set_is_slowed_in_every_row():
    base = ShiftedExponential(shift=1.0, rate=1.0)
    model = PersistentSlow(base=base, p=0.0, slowdown=7.0, slow=(1, 3))
    t = _draw(model, (5, 4), 2.0)
    ref = _draw(base, (5, 4), 2.0)  # the same draws before the slowdown
    np.testing.assert_allclose(t[:, [0, 2]], ref[:, [0, 2]], rtol=1e-15)
    np.testing.assert_allclose(t[:, [1, 3]], 7.0 * ref[:, [1, 3]], rtol=1e-15)


def test_drift_samples_its_first_regime_with_the_load_and_make_latency_builds_both():
    before = ShiftedExponential(shift=1.0, rate=1.0)
    drift = Drift(before, Pareto(), at_round=3)
    np.testing.assert_allclose(_draw(drift, 6, 2.5), _draw(before, 6, 2.5), rtol=1e-15)
    built = make_latency("drift", scale=0.5, shape=1.5, rate=4.0, p=0.2, slowdown=50.0,
                         drift_round=9)
    assert built.at_round == 9
    assert built.before == Pareto(scale=0.5, shape=1.5)
    assert built.after.p == 0.2 and built.after.slowdown == 50.0
    assert built.after.base == ShiftedExponential(shift=0.5, rate=4.0)


def test_client_times_cost_nothing_to_compute_by_default():
    rng = np.random.default_rng(0)
    assert not client_times(NoLatency(), 3, 2, samples=4, rng=rng).any()
    rng = np.random.default_rng(0)
    np.testing.assert_array_equal(
        client_times(NoLatency(), 3, 2, partition_cost=0.5, samples=4, rng=rng), np.ones((4, 3)))


@pytest.mark.parametrize(("n", "s"), [(9, 3), (300, 30)])  # small rows: numpy sorts them whole
def test_round_times_are_the_numpy_order_statistics_of_the_same_draws(n, s):
    model, samples = Exponential(rate=1.0), 500
    t = model.sample((samples, n), np.random.default_rng(4), 1.0)
    np.testing.assert_array_equal(round_times(model, n, s, "uncoded", samples=samples, seed=4),
                                  t.max(axis=1))
    np.testing.assert_array_equal(
        round_times(model, n, s, "ignore-stragglers", samples=samples, seed=4),
        np.sort(t, axis=1)[:, n - s - 1])
    coded = model.sample((samples, n), np.random.default_rng(4), float(s + 1))
    np.testing.assert_array_equal(round_times(model, n, s, "mds", samples=samples, seed=4),
                                  np.sort(coded, axis=1)[:, n - s - 1])


def test_expected_round_time_of_a_single_client_is_its_mean():
    assert expected_round_time(Exponential(rate=2.0), 1, 1) == pytest.approx(0.5, rel=1e-15)


def test_expected_coded_round_time_is_the_closed_form_and_its_monte_carlo_takes_the_seed():
    model = Exponential(rate=2.0, load_scaled=True)
    # (H_n - H_s) / rate at load s + 1: exact, not a Monte Carlo estimate
    assert expected_coded_round_time(model, 10, 2) == pytest.approx(
        3 * (harmonic(10) - harmonic(2)) / 2.0, rel=1e-14)
    with_cost = [expected_coded_round_time(model, 10, 2, partition_cost=0.1, samples=200,
                                           seed=seed) for seed in (1, 1, 2)]
    assert with_cost[0] == with_cost[1] != with_cost[2]


def test_a_bimodal_client_delay_draws_its_time_then_its_slowness_from_the_client_stream():
    # numpy reference: one shifted-exponential draw, then one uniform against p, from the
    # generator seeded by (seed, round, worker); p = 1/2 makes both outcomes common
    model = make_latency("bimodal", scale=0.5, rate=2.0, p=0.5, slowdown=10.0)
    for seed in range(3):
        for worker in range(4):
            rng = np.random.default_rng([seed, 1, worker])
            t = 3 * (0.5 + rng.exponential(0.5))
            expected = 10.0 * t if rng.random() < 0.5 else t
            got = client_delay(model, worker=worker, round_index=1, load=3, seed=seed)
            assert got == pytest.approx(expected, rel=1e-15)


def _trace_csv_time(name: str, round_index: int, worker: int) -> float:
    path = Path(latency_module.__file__).parent / "traces" / f"{name}.csv"
    with path.open(newline="") as f:
        rows = csv.reader(f)
        next(rows)
        for r, w, t in rows:
            if int(float(r)) == round_index and int(float(w)) == worker:
                return float(t)
    raise AssertionError(f"no ({round_index}, {worker}) row in {path}")


def test_a_load_scaled_trace_client_delay_is_the_csv_time_times_the_load():
    trace = TraceReplay("canada", load_scaled=True)
    value = _trace_csv_time("canada", 3, 7)
    assert client_delay(trace, worker=7, round_index=3, load=4, seed=0) == pytest.approx(
        4 * value, rel=1e-15)


def test_client_times_pass_the_load_to_a_load_scaled_model():
    model = ShiftedExponential(shift=0.5, rate=2.0)
    got = client_times(model, 5, 3, partition_cost=0.2, samples=4, rng=np.random.default_rng(2))
    draws = np.random.default_rng(2).exponential(0.5, size=(4, 5))
    np.testing.assert_allclose(got, 0.2 * 3 + 3 * (0.5 + draws), rtol=1e-15)


def test_uncoded_and_ignore_stragglers_rounds_compute_one_partition_per_client():
    model, n, s, samples = ShiftedExponential(shift=0.5, rate=2.0), 6, 2, 50
    one = 0.5 + np.random.default_rng(5).exponential(0.5, size=(samples, n))  # load 1
    np.testing.assert_allclose(round_times(model, n, s, "uncoded", samples=samples, seed=5),
                               one.max(axis=1), rtol=1e-15)
    np.testing.assert_allclose(
        round_times(model, n, s, "ignore-stragglers", samples=samples, seed=5),
        np.sort(one, axis=1)[:, n - s - 1], rtol=1e-15)
    np.testing.assert_allclose(round_times(model, n, s, "mds", samples=samples, seed=5),
                               np.sort((s + 1) * one, axis=1)[:, n - s - 1], rtol=1e-15)


def test_make_latency_defaults_and_bimodal_fraction_are_the_documented_ones():
    base = ShiftedExponential(shift=1.0, rate=1.0)
    assert make_latency("shifted-exponential") == base
    assert make_latency("pareto") == Pareto(scale=1.0, shape=2.0)
    assert make_latency("bimodal") == Bimodal(base=base, p=0.1, slowdown=10.0)
    assert make_latency("bimodal", p=0.3, slowdown=4.0) == Bimodal(base=base, p=0.3,
                                                                   slowdown=4.0)


def test_an_unknown_trace_lists_every_bundled_trace_in_full():
    folder = Path(latency_module.__file__).parent / "traces"
    available = sorted(name[: -len(".csv")] for name in os.listdir(folder)
                       if name.endswith(".csv"))
    assert "canada" in available
    message = f"trace 'mars' not found; bundled traces: {available}"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        TraceReplay("mars")


@pytest.mark.parametrize("cls", [Bimodal, PersistentSlow])
def test_a_bad_slowdown_is_named_in_full(cls):
    with pytest.raises(ValueError, match=r"^slowdown=0 must be a positive finite number$"):
        cls(slowdown=0)


def test_a_drifting_latency_has_no_single_round_time_and_says_so(capsys):
    """Its rounds follow two regimes: the closed form raised AttributeError and the Monte
    Carlo drew the first regime only, so the calculator reported Pareto's times for drift."""
    from fl_gradcode.calculator import main
    from fl_gradcode.latency import expected_round_time, make_latency, round_times

    drift = make_latency("drift", scale=0.5, shape=1.5, drift_round=15)
    with pytest.raises(ValueError, match=r"drift changes regime at round 15"):
        expected_round_time(drift, 10, 8)
    with pytest.raises(ValueError, match=r"drift changes regime at round 15"):
        round_times(drift, 10, 0, "uncoded", samples=10)
    assert expected_round_time(drift.before, 10, 8) > 0  # each regime has one
    with pytest.raises(SystemExit) as exit_:
        main(["--latency", "drift", "--n", "8", "--samples", "10"])
    assert exit_.value.code == 2
    assert "drift changes regime" in capsys.readouterr().err


def test_latency_parameters_lists_exactly_the_arguments_each_model_reads():
    """LATENCY_PARAMETERS (what the benchmark's --set checks against) against make_latency
    itself: changing a listed argument changes the model built, changing any other does
    not (models compared by their pickled state)."""
    import pickle

    from fl_gradcode.latency import LATENCY_MODELS, LATENCY_PARAMETERS

    base = dict(scale=0.1, rate=10.0, shape=2.0, p=0.2, slowdown=20.0, trace="canada",
                seed=0, drift_round=15, device_trace="generated", round_s=60.0,
                num_devices=8)
    other = dict(scale=0.3, rate=5.0, shape=3.0, p=0.4, slowdown=10.0, trace="tokyo",
                 seed=1, drift_round=7, device_trace="generated", round_s=30.0)
    assert set(LATENCY_PARAMETERS) == set(LATENCY_MODELS) | {"fedscale"}
    for name, reads in LATENCY_PARAMETERS.items():
        built = pickle.dumps(make_latency(name, **base))
        for arg, value in other.items():
            if arg == "device_trace":
                continue  # one generated trace here; a path is a file of FedScale's
            changed = pickle.dumps(make_latency(name, **{**base, arg: value}))
            assert (changed != built) == (arg in reads), (name, arg)
