"""Latency-model behaviours pinned down after mutation testing
(``experiments/mutation.py --module latency``): the default load of one unit, load scaling of
every load-scaled model, the persistent slow set, the drift's parts, and the theory helpers
against order statistics computed here with numpy.

Expected values are closed forms or numpy order statistics of the same seeded draws, never
the code path under test.
"""

from __future__ import annotations

import numpy as np
import pytest

from fl_gradcode.latency import (
    Drift,
    Exponential,
    NoLatency,
    Pareto,
    PersistentSlow,
    ShiftedExponential,
    TraceReplay,
    client_times,
    expected_coded_round_time,
    expected_round_time,
    harmonic,
    make_latency,
    round_times,
)


def _draw(model, size, load=None, seed=3):
    rng = np.random.default_rng(seed)
    return model.sample(size, rng) if load is None else model.sample(size, rng, load)


# ------------------------------------------------------------------ loads
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


# ------------------------------------------------------------------ theory helpers
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
