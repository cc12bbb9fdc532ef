"""Adaptive tolerance: the survival curve behind the latency estimator
(fl_gradcode.adaptive.survival): weighted Kaplan-Meier with censoring, the smoothed density and
survival tables, sampling, and the generalised Pareto tail (``fit_gpd``)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import minimize_scalar
from scipy.stats import genpareto

from fl_gradcode.adaptive.survival import Survival, fit_gpd


def test_tail_mass_lies_beyond_the_censoring_times_that_carry_it():
    """Hand-computed Kaplan-Meier with weights: events at 1, 2, 3 (weight 1), censored at 10
    (weight 1) and 20 (weight 3). S(3) = 6/7 * 5/6 * 4/5 = 4/7, carried 1/4 by the
    observation at 10 and 3/4 by the one at 20 (redistribution to the right). Exponential
    tail (``gpd=False``) above the threshold 2: excesses 1, 8, 18 with weights 1, 1, 3 over
    one event, sigma = 63. The median of each share is its censoring time + 63 ln 2."""
    from fl_gradcode.adaptive.survival import Survival

    curve = Survival(np.log([1.0, 2.0, 3.0, 10.0, 20.0]),
                      np.array([True, True, True, False, False]),
                      np.array([1.0, 1.0, 1.0, 1.0, 3.0]), gpd=False)
    assert curve.cdf == pytest.approx([1 / 7, 2 / 7, 3 / 7])
    assert curve.sigma == pytest.approx(63.0)
    got = np.exp(curve.quantile(np.array([3 / 7 + 0.5 / 7, 4 / 7 + 1.5 / 7])))
    assert got == pytest.approx([10 + 63 * math.log(2), 20 + 63 * math.log(2)])
    draws = np.exp(curve.sample(np.random.default_rng(0).random(20000)))
    assert not np.any((draws > 3.0 + 1e-9) & (draws < 10.0))  # nothing between 3 and 10
    # beyond 20: all of the share at 20, and the share at 10 beyond 10 more seconds
    assert np.mean(draws >= 20.0) == pytest.approx(3 / 7 + math.exp(-10 / 63) / 7, abs=0.02)


def test_the_density_of_one_event_is_a_gaussian_of_silvermans_bandwidth():
    """One event at 0: the smoothed density is N(0, bw^2) with bw = 0.9 * 0.05 (the spread's
    floor; Silverman's rule at one point), so it integrates to 1 and has variance bw^2."""
    curve = Survival(np.array([0.0]), np.array([True]), np.array([1.0]))
    h, size = 0.001, 801
    lo = -0.4
    logp, logs = curve.log_tables(lo, h, size)
    e = lo + h * np.arange(size)
    dens = np.exp(logp)
    dens[dens <= 1e-6 * dens.max() * 1.0001] = 0.0  # drop the floor
    bw = 0.9 * 0.05
    assert np.sum(dens) * h == pytest.approx(1.0, rel=1e-3)
    assert np.sum(dens * e**2) * h == pytest.approx(bw**2, rel=0.02)
    # the survival steps from 1 to 0 at the event
    assert np.exp(logs[e < -h]).min() == 1.0 and np.exp(logs[e > h]).max() < 1e-100


def test_kaplan_meier_counts_a_time_censored_at_an_event_time_as_still_at_risk():
    """Textbook convention (Kaplan & Meier 1958): on a tie the event comes first, so the one
    censored at t = 1 is at risk at t = 1: S(1) = 1 - 1/2, not 1 - 1/1."""
    curve = Survival(np.array([1.0, 1.0]), np.array([False, True]), np.ones(2))
    np.testing.assert_allclose(curve.surv, [0.5])
    curve = Survival(np.array([1.0, 1.0, 2.0]), np.array([True, False, True]), np.ones(3))
    np.testing.assert_allclose(curve.surv, [2 / 3, 0.0])


@pytest.mark.parametrize(("xi", "sigma"), [(0.0, 2.0), (0.5, 2.0)])
def test_the_gpd_fit_recovers_the_shape_and_scale_of_gpd_excesses(xi, sigma):
    """Excesses drawn from GPD(xi, sigma) by inversion, 4,000 of them: the profile MLE on the
    grid of shapes (step 0.05) returns the true shape within one step and the scale within 5%
    (Pickands 1975)."""
    u = np.random.default_rng(0).random(4000)
    y = -sigma * np.log1p(-u) if xi == 0 else sigma / xi * ((1 - u) ** -xi - 1)
    got_xi, got_sigma = fit_gpd(y, np.ones(y.size, dtype=bool), np.ones(y.size))
    assert got_xi == pytest.approx(xi, abs=0.051)
    assert got_sigma == pytest.approx(sigma, rel=0.05)


def _gpd_profile_mle(y):
    """Reference: the profile MLE of GPD(xi, sigma) on the shapes 0, 0.05, ..., 0.95, each
    scale maximising scipy's genpareto likelihood (every point an event, weight 1)."""
    best = (math.inf, 0.0, 0.0)
    for xi in np.round(np.arange(0.0, 0.951, 0.05), 2):
        res = minimize_scalar(lambda th, xi=xi: -np.sum(genpareto.logpdf(y, xi, scale=np.exp(th))),
                              bounds=(-10.0, 10.0), method="bounded",
                              options={"xatol": 1e-10})
        if res.fun < best[0]:
            best = (res.fun, float(xi), float(np.exp(res.x)))
    return best[1], best[2]


def test_five_events_are_enough_for_a_gpd_tail_and_fewer_give_the_exponential_one():
    y = np.array([0.05, 0.2, 0.5, 1.5, 20.0])
    xi, sigma = _gpd_profile_mle(y)
    assert xi > 0.2  # the reference is heavy-tailed: not the exponential fallback
    got = fit_gpd(y, np.ones(5, dtype=bool), np.ones(5))
    assert got[0] == pytest.approx(xi, abs=1e-9)
    assert got[1] == pytest.approx(sigma, rel=1e-4)
    # 4.99 weighted events: exponential tail, scale = exposure / events
    w = np.full(5, 0.998)
    assert fit_gpd(y, np.ones(5, dtype=bool), w) == pytest.approx(
        (0.0, float(np.sum(w * y) / np.sum(w))))


def test_a_curve_without_events_puts_all_mass_beyond_the_largest_censoring_time():
    curve = Survival(np.array([0.5, 1.5, 1.0]), np.zeros(3, dtype=bool), np.ones(3))
    np.testing.assert_array_equal(curve.grid, [1.5])
    np.testing.assert_array_equal(curve.surv, [1.0])
    assert np.all(curve.quantile(np.array([0.0, 0.5, 0.9])) >= 1.5)


def test_the_survival_table_beyond_the_last_event_is_the_gpd_tail():
    """Pareto(2) times censored at 30: beyond the last event the log survival table is
    log(s_last) - log1p(xi * y / sigma_last) / xi with y the excess in linear time (the
    generalised Pareto survival; Pickands 1975), decreasing from s_last."""
    x = np.random.default_rng(1).pareto(2.0, 3000) + 1.0
    event = x < 30.0
    curve = Survival(np.log(np.minimum(x, 30.0)), event, np.ones(x.size))
    assert curve.xi > 0 and curve.s_last > 0
    lo, h, size = 0.0, 0.01, 500
    _, logs = curve.log_tables(lo, h, size)
    e = lo + h * np.arange(size)
    beyond = e > curve.last
    y = np.exp(e[beyond]) - np.exp(curve.last)
    expected = math.log(curve.s_last) - np.log1p(curve.xi * y / curve.sigma_last) / curve.xi
    np.testing.assert_allclose(logs[beyond], expected, rtol=1e-12)
    assert np.all(np.diff(logs[beyond]) < 0) and logs[beyond][0] <= math.log(curve.s_last)


def test_events_outside_the_table_grid_land_in_its_edge_cells():
    """Events at 0 and 1 on a grid ending at 0.5: the tables keep their size; the survival
    is 1 before the first event and 1/2 after it (Kaplan-Meier by hand)."""
    curve = Survival(np.array([0.0, 1.0]), np.ones(2, dtype=bool), np.ones(2))
    logp, logs = curve.log_tables(-2.5, 0.05, 61)
    assert logp.shape == logs.shape == (61,) and np.all(np.isfinite(logp))
    e = -2.5 + 0.05 * np.arange(61)
    np.testing.assert_allclose(np.exp(logs[e < -1e-9]), 1.0)
    np.testing.assert_allclose(np.exp(logs[e > 1e-9]), 0.5)


def test_an_event_at_the_start_of_the_grid_centres_the_kernel_on_the_first_cell():
    """One event at lo = 0 (h = 0.001): the density is the normalised Gaussian kernel of
    bandwidth 0.9 * 0.05 centred on cell 0, computed here."""
    h, size = 0.001, 401
    logp, _ = Survival(np.array([0.0]), np.array([True]), np.array([1.0])).log_tables(
        0.0, h, size)
    bw = 0.9 * 0.05
    half = math.ceil(4 * bw / h)
    kernel = np.exp(-0.5 * (np.arange(-half, half + 1) * h / bw) ** 2)
    expected = kernel[half: half + size] / kernel.sum() / h
    np.testing.assert_allclose(np.exp(logp[:150]), expected[:150], rtol=1e-9)


def test_sampling_between_the_last_two_events_returns_the_last_event():
    """Kaplan-Meier of events at 0 and 1 and a time censored at 2: F = 1/3 from 0, 2/3 from
    1 (by hand); u in (1/3, 2/3] draws 1, u <= 1/3 draws 0."""
    curve = Survival(np.array([0.0, 1.0, 2.0]), np.array([True, True, False]), np.ones(3))
    np.testing.assert_allclose(curve.cdf, [1 / 3, 2 / 3])
    np.testing.assert_array_equal(curve.sample(np.array([0.1, 0.3, 0.4, 0.6, 0.66])),
                                  [0.0, 0.0, 1.0, 1.0, 1.0])


def test_a_table_shorter_than_the_smoothing_kernel_keeps_its_size_and_the_kernel_values():
    """One event at 0 (bandwidth 0.9 * 0.05, kernel half-width 4 bandwidths = 181 cells of
    0.001) on a table of 101 cells around it: the density is the normalised Gaussian kernel
    at those cells (computed here), not an error or a table of the kernel's length."""
    h, size, lo = 0.001, 101, -0.05
    curve = Survival(np.array([0.0]), np.array([True]), np.array([1.0]))
    logp, logs = curve.log_tables(lo, h, size)
    assert logp.shape == logs.shape == (size,)
    bw = 0.9 * 0.05
    half = math.ceil(4 * bw / h)
    kernel = np.exp(-0.5 * (np.arange(-half, half + 1) * h / bw) ** 2)
    cells = np.arange(size) - 50  # offsets from the event's cell
    np.testing.assert_allclose(np.exp(logp), kernel[half + cells] / kernel.sum() / h, rtol=1e-9)


def test_log_tables_with_every_observation_censored_are_finite_and_warn_nothing():
    """No reply ever arrived (every observation censored): the density has no mass; its log
    table is floored, not log(0) = -inf with a divide-by-zero warning."""
    import warnings

    z = np.log(np.array([1.0, 2.0, 3.0]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        logp, logs = Survival(z, np.zeros(3, dtype=bool), np.ones(3), gpd=False).log_tables(
            -5.0, 0.02, 600)
    assert np.all(np.isfinite(logp)) and np.all(np.isfinite(logs))
