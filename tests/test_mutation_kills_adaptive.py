"""Adaptive-coding behaviours pinned down after mutation testing
(``experiments/mutation.py --module adaptive``).

Expected values are closed forms, literals of the documented contract or references computed
here; one test also checks a relation between outputs (the approximate choice is the argmin
of the times the decision reports).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm
from test_adaptive import closed_loop

from fl_gradcode.adaptive import LatencyEstimator, choose_s
from fl_gradcode.adaptive.survival import Survival, fit_gpd


# ------------------------------------------------------------------ validation and priors
def test_prior_weight_below_one_is_accepted_and_a_negative_one_is_named():
    for weight in (0.0, 0.5):  # documented: pseudo-rounds of the prior, any value >= 0
        assert LatencyEstimator(3, prior_weight=weight).prior_weight == weight
    with pytest.raises(ValueError, match=r"prior_weight=-0\.1 must be >= 0"):
        LatencyEstimator(3, prior_weight=-0.1)


def test_update_names_a_loads_vector_of_the_wrong_shape():
    est = LatencyEstimator(3)
    with pytest.raises(ValueError, match=r"loads has shape \(2,\); expected \(3,\)"):
        est.update([1.0, 1.0, 1.0], [1.0, 1.0], 2.0)
    with pytest.raises(ValueError, match=r"elapsed has shape \(4,\); expected \(3,\)"):
        est.update([1.0] * 4, [1.0] * 3, 2.0)
    with pytest.raises(ValueError, match=r"busy has shape \(2,\); expected \(3,\)"):
        est.update([1.0] * 3, [1.0] * 3, 2.0, busy=[0.0, 0.0])


class _Constant:
    """A duck-typed prior whose ``sample`` takes the load without a default (the documented
    signature ``sample(size, rng, load)``): per-unit latency ``value``, loads recorded."""

    def __init__(self, value: float) -> None:
        self.value, self.loads = value, []

    def sample(self, size, rng, load):
        self.loads.append(load)
        return np.full(size, self.value * load)


def test_the_prior_is_sampled_per_unit_of_load_and_weighs_prior_weight_rounds():
    prior = _Constant(5.0)
    heavy = LatencyEstimator(4, prior, prior_weight=100.0)
    assert prior.loads == [1.0]  # pseudo-observations per unit of load
    light = LatencyEstimator(4, _Constant(5.0), prior_weight=0.0)
    for est in (heavy, light):  # one round: every client 1.0 s per unit
        est.update([1.0] * 4, [1.0] * 4, 2.0)
    rng = np.random.default_rng(0)
    # 100 rounds of prior at 5.0 against one round at 1.0: the predictive sits at the prior;
    # with no weight it is the data alone
    assert np.median(heavy.sample(2000, rng)) == pytest.approx(5.0, rel=0.05)
    assert np.median(light.sample(2000, rng)) == pytest.approx(1.0, rel=0.05)


# ------------------------------------------------------------------ forgetting in beta
def _round(est, load, time):
    n = est.n
    est.update(np.full(n, time), np.full(n, load), time + 1.0)


def test_the_load_exponent_forgets_old_rounds_at_the_halflife():
    """Two old rounds say time grows with the load (beta = 1), two recent ones that it does
    not (beta = 0). Weighted least squares of log median time on log median load with weights
    0.5**(age / halflife), computed here: a short halflife follows the recent rounds."""

    def fitted(halflife):
        est = LatencyEstimator(4, halflife=halflife, beta_strength=1e-9, max_rounds=10)
        for load, time in ((1.0, 1.0), (4.0, 4.0), (1.0, 2.0), (4.0, 2.0)):
            _round(est, load, time)
        return est.load_exponent

    def reference(halflife):
        x = np.log([1.0, 4.0, 1.0, 4.0])
        y = np.log([1.0, 4.0, 2.0, 2.0])
        w = 0.5 ** (np.array([3, 2, 1, 0]) / halflife)
        xc, yc = x - np.average(x, weights=w), y - np.average(y, weights=w)
        return float(np.clip(np.sum(w * xc * yc) / np.sum(w * xc * xc), 0.0, 1.0))

    for halflife in (0.5, 2.0, math.inf):
        assert fitted(halflife) == pytest.approx(reference(halflife), abs=1e-6)
    assert fitted(0.5) < 0.1 < 0.4 < fitted(math.inf) < 0.6


# ------------------------------------------------------------------ slowness shrinkage
@pytest.mark.parametrize("slowness_sd", [0.5, 2.0])
def test_one_slow_reply_is_shrunk_by_the_gaussian_prior_on_log_slowness(slowness_sd):
    """48 clients whose log times are the same 48 normal quantiles in rotation (every client
    has mean log time 0; the pooled curve is about N(0, 1) plus the kernel's bandwidth), and a
    newcomer seen once at log time 2. Conjugate normal reference for its log slowness: the
    posterior mode 2 * p / (p + 1 / slowness_sd**2) with data precision p = 1 / (1 + bw**2)."""
    k = 48
    n = k + 1
    levels = norm.ppf((np.arange(k) + 0.5) / k)
    est = LatencyEstimator(n, halflife=math.inf, load_exponent=1.0, slowness_sd=slowness_sd)
    for r in range(k):
        t = np.append(np.exp(np.roll(levels, r)), np.nan)
        est.update(t, np.append(np.ones(k), 0.0), 100.0)
    est.update(np.append(np.exp(np.roll(levels, 7)), math.exp(2.0)), np.ones(n), 100.0)
    bw = 0.9 * 1.0 * (k * k + 1) ** -0.2  # Silverman's rule on the pooled log times
    p = 1.0 / (1.0 + bw**2)
    expected = 2.0 * p / (p + 1.0 / slowness_sd**2)
    assert np.log(est.slowness()[-1]) == pytest.approx(expected, abs=0.12)
    assert np.abs(np.log(est.slowness()[:k])).max() < 0.1  # the others are typical


# ------------------------------------------------------------------ the smoothing kernel
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


# ------------------------------------------------------------------ Kaplan-Meier and the GPD tail
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


# ------------------------------------------------------------------ busy clients' remaining work
def test_a_client_without_outstanding_work_draws_nothing_and_changes_no_other_draw():
    est = LatencyEstimator(4)
    est.update([1.0, 2.0, 1.5, 3.0], [1.0] * 4, 4.0)
    load = np.array([1.0, 1.0, 0.0, 1.0])
    free = est.sample_remaining([0.5, np.nan, np.nan, 1.0], load, 64, np.random.default_rng(1))
    # client 2 has a finite time since its last job but no work outstanding (load 0)
    idle = est.sample_remaining([0.5, np.nan, 7.0, 1.0], load, 64, np.random.default_rng(1))
    np.testing.assert_array_equal(idle, free)
    assert not idle[:, 1:3].any() and idle[:, [0, 3]].all()


# ------------------------------------------------------------------ approximate decoding
def test_the_approximate_choice_is_the_fastest_per_full_data_equivalent_not_the_smallest_r():
    """Compute-bound clients, two of them 50x slower in every round: ignoring one straggler
    still waits for the other, so the best approximate choice drops at least two, and
    ``choose_s`` returns the r minimising ``approximate_times`` (smaller r on ties)."""
    def draw(rng, loads):
        slow = np.where(np.arange(loads.size) < 2, 50.0, 1.0)
        return loads * (1.0 + 0.1 * rng.exponential(1.0, loads.size)) * slow

    placement, est, _, _ = closed_loop(24, 6, draw, rounds=10, seed=0)
    d = choose_s(placement, est, allow_approximate=True)
    assert d.approximate
    assert d.s == min(d.approximate_times, key=lambda r: (d.approximate_times[r], r))
    assert d.s >= 2 and d.approximate_times[1] > 10 * d.approximate_times[d.s]
