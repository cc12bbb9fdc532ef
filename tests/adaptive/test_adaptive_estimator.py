"""Adaptive tolerance: censored latency estimation (fl_gradcode.adaptive.LatencyEstimator):
censored replies, late and still-outstanding replies, busy time, forgetting, the prior and its
weight, the load exponent, and the warm start from saved rounds."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

from fl_gradcode.adaptive import LatencyEstimator, code_loads
from fl_gradcode.codes import NestedPlacement
from tests.adaptive.support import simulate_round


# ------------------------------------------------------------------------ the estimator
def test_censored_mle_recovers_simulated_rates_and_ignoring_censoring_is_biased():
    n, rounds = 20, 300
    rng = np.random.default_rng(0)
    rate = np.linspace(0.5, 2.0, n)  # the truth we simulate with
    est = LatencyEstimator(n, load_exponent=1.0, halflife=math.inf, max_rounds=rounds)
    observed_sum, observed_count, capped_sum = np.zeros(n), np.zeros(n), np.zeros(n)
    for _ in range(rounds):
        t = rng.exponential(1.0 / rate)
        end = np.sort(t)[n - 6]  # early return at the 15th of 20 replies: 25% censored
        got = t <= end
        est.update(np.where(got, t, np.nan), np.ones(n), end)
        observed_sum += np.where(got, t, 0.0)
        observed_count += got
        capped_sum += np.minimum(t, end)
    err = lambda r: float(np.mean(np.abs(r / rate - 1)))  # noqa: E731
    censored = err(est.rates())
    dropped = err(observed_count / observed_sum)  # only the replies that arrived
    as_replies = err(rounds / capped_sum)  # stragglers counted as replies at the deadline
    assert censored < 0.08  # measured 0.046
    assert dropped > 5 * censored and as_replies > 3 * censored  # measured 0.87 and 0.38
    # the slow clients are the slow ones (slowness is relative to the pooled baseline)
    slowness = est.slowness()
    assert np.corrcoef(np.log(slowness), np.log(1 / rate))[0, 1] > 0.95


def test_late_replies_replace_censored_observations():
    n = 10
    est = LatencyEstimator(n, load_exponent=1.0)
    rid = est.update([1.0] * 9 + [np.nan], np.ones(n), 2.0)
    before = est.rates()[9]
    assert est.observe_late(rid, 9, 30.0)
    assert not est.observe_late(rid, 9, 31.0)  # already observed
    assert not est.observe_late(rid + 5, 0, 1.0)  # unknown round
    after = est.rates()[9]
    assert before == 0.0 and after == pytest.approx(1 / 30.0)


def test_replies_still_outstanding_raise_their_censoring_time():
    n = 10
    est = LatencyEstimator(n, load_exponent=1.0)
    rid = est.update([1.0 + 0.1 * i for i in range(8)] + [np.nan, np.nan], np.ones(n), 2.0)
    rng = lambda: np.random.default_rng(0)  # noqa: E731
    before = est.sample(20000, rng())[:, 8]
    assert est.observe_pending(rid, 8, 50.0) and est.observe_pending(rid, 9, 50.0)
    assert not est.observe_pending(rid, 9, 40.0)  # not beyond the bound it already has
    assert not est.observe_pending(rid, 0, 60.0)  # replied in time
    assert not est.observe_pending(rid + 3, 8, 60.0)  # unknown round
    after = est.sample(20000, rng())[:, 8]
    assert np.mean(before >= 50.0) == 0.0
    # both unanswered clients are known to exceed 50 s: their share of the mass is drawn
    # there and nowhere between the fastest replies and 50 s
    assert np.mean(after >= 50.0) > 0.15
    assert not np.any((after > 10.0) & (after < 50.0))
    assert est.observe_late(rid, 8, 70.0)  # the reply finally arrives: an observation
    assert not est.observe_pending(rid, 8, 80.0)
    with pytest.raises(ValueError, match="client=10"):
        est.observe_pending(rid, 10, 1.0)
    with pytest.raises(ValueError, match="elapsed=nan"):
        est.observe_pending(rid, 9, float("nan"))


def _fitted(draw, n=20, rounds=100):
    est = LatencyEstimator(n, load_exponent=1.0, halflife=math.inf, max_rounds=rounds)
    for _ in range(rounds):
        est.update(draw(n), np.ones(n), 1e9)  # every reply observed
    return est


def _mean_remaining(est, elapsed, load=1.0):
    ago, units = np.full(est.n, np.nan), np.zeros(est.n)
    ago[0], units[0] = elapsed, load
    rem = est.sample_remaining(ago, units, 20000, np.random.default_rng(1))
    assert np.all(rem[:, 1:] == 0.0)  # nothing outstanding elsewhere
    assert np.all(rem[:, 0] >= 0.0)
    return float(rem[:, 0].mean())


def test_remaining_time_of_outstanding_work_follows_the_conditional_law():
    """References: an exponential time is memoryless (mean remaining 1 at rate 1 whatever
    has elapsed); a Pareto(x_m = 1, alpha = 3) time that has run t >= 1 is Pareto(t, 3), mean
    remaining t / 2 (grows with t)."""
    rng = np.random.default_rng(0)
    exp = _fitted(lambda n: rng.exponential(1.0, n))
    assert [_mean_remaining(exp, t) for t in (0.5, 1.0, 2.0)] == pytest.approx([1, 1, 1],
                                                                             rel=0.15)
    pareto = _fitted(lambda n: 1.0 + rng.pareto(3.0, n))
    assert _mean_remaining(pareto, 1.5) == pytest.approx(0.75, rel=0.1)
    assert _mean_remaining(pareto, 2.0) == pytest.approx(1.0, rel=0.1)
    assert _mean_remaining(pareto, 4.0) > 1.8 * _mean_remaining(pareto, 2.0)  # not memoryless
    # two units of work at one unit per second, sent 0.5 s ago: 1.5 s left in every draw
    point = LatencyEstimator(4, load_exponent=1.0)
    point.update(np.ones(4), np.ones(4), 1.0)
    assert _mean_remaining(point, 0.5, load=2.0) == pytest.approx(1.5)
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        point.sample_remaining([0.5], [1.0], 10)


def test_busy_time_is_not_counted_as_compute_and_clients_without_work_are_skipped():
    est = LatencyEstimator(4, load_exponent=1.0)
    # clients 0-1 were busy 2 s before starting; client 2 got no work; client 3 never started
    est.update([3.0, 3.0, 9.0, np.nan], [1.0, 1.0, 0.0, 1.0], 5.0, busy=[2.0, 2.0, 0.0, 6.0])
    rates = est.rates()
    assert rates[:2] == pytest.approx([1.0, 1.0]) and np.isnan(rates[2:]).all()


def test_persistent_slow_clients_get_large_slowness_factors():
    n = 24
    slow = np.zeros(n, dtype=bool)
    slow[[3, 11, 19]] = True
    rng = np.random.default_rng(1)
    code = NestedPlacement(n, 6).code(6)
    est = LatencyEstimator(n, load_exponent=1.0)
    for _ in range(30):
        t = code_loads(code) * (1 + rng.exponential(1.0, n)) * np.where(slow, 20.0, 1.0)
        simulate_round(est, code, t, late=True)
    f = est.slowness()
    assert np.all(f[slow] > 10) and np.all(f[~slow] < 1.6)
    assert np.median(f[slow]) / np.median(f[~slow]) == pytest.approx(20, rel=0.3)


def test_forgetting_tracks_drift():
    n = 12
    rng = np.random.default_rng(2)
    fast = LatencyEstimator(n, load_exponent=1.0, halflife=5.0)
    slow_memory = LatencyEstimator(n, load_exponent=1.0, halflife=math.inf, max_rounds=200)
    for r in range(120):
        rate = 1.0 if r < 60 else 0.25  # everyone gets 4x slower at round 60
        t = rng.exponential(1 / rate, n)
        for est in (fast, slow_memory):
            est.update(t, np.ones(n), float(t.max()))
    assert np.median(fast.rates()) == pytest.approx(0.25, rel=0.25)
    assert np.median(slow_memory.rates()) > 0.35  # still mixes in the old regime (0.4)


def test_estimator_is_seeded_and_validates_its_input():
    def run():
        est = LatencyEstimator(6, seed=3)
        rng = np.random.default_rng(0)
        for _ in range(5):
            est.update(rng.exponential(1.0, 6), np.ones(6), 10.0)
        return est.sample(50)

    np.testing.assert_array_equal(run(), run())
    est = LatencyEstimator(6)
    with pytest.raises(ValueError, match="no observations"):
        est.sample(3)
    with pytest.raises(ValueError, match="shape"):
        est.update(np.ones(5), np.ones(6), 1.0)
    with pytest.raises(ValueError, match="duration"):
        est.update(np.ones(6), np.ones(6), 0.0)
    with pytest.raises(ValueError, match="loads"):
        est.update(np.ones(6), -np.ones(6), 1.0)
    with pytest.raises(ValueError, match="halflife"):
        LatencyEstimator(6, halflife=0)


def test_prior_is_used_before_data():
    from fl_gradcode.latency import Exponential

    est = LatencyEstimator(8, prior=Exponential(rate=2.0))
    x = est.sample(20000)
    assert x.shape == (20000, 8) and x.mean() == pytest.approx(0.5, rel=0.03)


# ------------------------------------------------------------------ warm start (saved rounds)
def _observed_rounds(n, rounds, seed):
    """Rounds of persistent-slow latencies with censoring, late replies and busy time."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(rounds):
        loads = rng.choice([1.0, 2.0, 4.0], size=n) * (rng.random(n) > 0.1)
        t = loads * (0.1 + rng.exponential(0.1, n)) * np.where(np.arange(n) % 5 == 0, 8.0, 1.0)
        busy = np.where(rng.random(n) < 0.2, 0.05, 0.0)
        elapsed = t + busy
        duration = float(np.quantile(elapsed, 0.7))
        out.append((np.where(elapsed <= duration, elapsed, np.nan), loads, duration, busy,
                    [(i, float(elapsed[i])) for i in np.flatnonzero(elapsed > duration)][:2]))
    return out


def _feed(est, rounds, order):
    """Feed ``rounds`` to ``est`` with client ``order[j]`` of the rounds as client ``j``."""
    for elapsed, loads, duration, busy, late in rounds:
        rid = est.update(elapsed[order], loads[order], duration, busy=busy[order])
        where = {int(c): j for j, c in enumerate(order)}
        for i, t in late:
            if i in where:
                est.observe_late(rid, where[i], t)


def test_saved_rounds_warm_start_an_estimator_as_if_it_had_seen_them():
    import json

    n = 10
    rounds = _observed_rounds(n, 12, seed=4)
    original = LatencyEstimator(n, seed=7)
    _feed(original, rounds, np.arange(n))
    state = json.loads(json.dumps(original.export_rounds([f"p{i}" for i in range(n)])))
    # the new run meets the clients in another order, one of them new (no record), and
    # one old client is gone; the reference sees the same observations fed directly
    order = np.array([3, 0, 9, 1, 7, 2, 8, 5, 4])
    keys = [f"p{i}" for i in order] + ["new"]
    warm = LatencyEstimator(n, seed=7)
    assert warm.import_rounds(state, keys) == 12
    reference = LatencyEstimator(n, seed=7)
    padded = [(np.append(e, np.nan), np.append(ld, 0.0), d, np.append(b, 0.0), late)
              for e, ld, d, b, late in rounds]
    _feed(reference, padded, np.append(order, n))
    assert warm.has_data and warm.n_rounds == reference.n_rounds
    np.testing.assert_allclose(warm.slowness(), reference.slowness(), rtol=1e-12)
    assert warm.load_exponent == pytest.approx(reference.load_exponent, rel=1e-12)
    np.testing.assert_allclose(warm.sample(64), reference.sample(64), rtol=1e-12)
    # the slow clients (every fifth) are known slow from the first decision on
    slow = np.isin(order, [0, 5])
    assert warm.slowness()[:9][slow].min() > 3 * warm.slowness()[:9][~slow].max()
    # and both go on alike: a late reply to an imported round from a client that waited for
    # earlier work (its busy time is subtracted), then new rounds (they weigh more)
    found = [(r, j) for r, (e, ld, _, b, _) in enumerate(rounds) for j, c in enumerate(order)
             if np.isnan(e[c]) and ld[c] > 0 and b[c] > 0 and all(i != c for i, _ in rounds[r][4])]
    assert found
    r, j = found[-1]
    assert warm.observe_late(r, j, 9.0) and reference.observe_late(r, j, 9.0)
    assert warm.rounds[r].y[j] == pytest.approx(9.0 - rounds[r][3][order[j]])
    more = _observed_rounds(n, 5, seed=5)
    for est in (warm, reference):
        _feed(est, [(np.append(e, np.nan), np.append(ld, 0.0), d, np.append(b, 0.0), late)
                    for e, ld, d, b, late in more], np.append(order, n))
    np.testing.assert_allclose(warm.slowness(), reference.slowness(), rtol=1e-12)
    np.testing.assert_allclose(warm.sample(64), reference.sample(64), rtol=1e-12)


def test_saved_rounds_are_validated_and_only_warm_an_empty_estimator():
    est = LatencyEstimator(3)
    est.update([1.0, np.nan, np.nan], [1.0, 1.0, 0.0], 2.0, busy=[0.0, 0.5, 0.0])
    good = est.export_rounds(["a", "b", "c"])
    # per client: compute time (null: censored), censoring time (the round's end less the
    # busy time), units of work (0: none, no information), busy time
    assert good["clients"] == ["a", "b", "c"]
    assert good["rounds"] == [{"duration": 2.0, "time": [1.0, None, None],
                               "censored_at": [2.0, 1.5, 2.0], "load": [1.0, 1.0, 0.0],
                               "busy": [0.0, 0.5, 0.0]}]
    with pytest.raises(ValueError, match="without rounds"):
        est.import_rounds(good, ["a", "b", "c"])
    with pytest.raises(ValueError, match="distinct"):
        LatencyEstimator(2).import_rounds(good, ["a", "a"])
    one = good["rounds"][0]
    bad = [
        ({**good, "format": "other"}, "format"),
        ({**good, "clients": ["a", "a", "b"]}, "clients"),
        ({**good, "rounds": {}}, "rounds must be a list"),
        ({**good, "rounds": [{**one, "duration": 0}]}, r"rounds\[0\]\.duration"),
        ({**good, "rounds": [{**one, "load": [1.0, 1.0]}]}, r"rounds\[0\]\.load .* 3"),
        ({**good, "rounds": [{**one, "load": [1.0, -1.0, 0.0]}]}, r"\.load has -1"),
        ({**good, "rounds": [{**one, "time": ["x", None, None]}]}, r"\.time must hold"),
        ({**good, "rounds": [{**one, "busy": [0.0, None, 0.0]}]}, r"\.busy must hold"),
        ({**good, "rounds": [{**one, "censored_at": [2.0, float("inf"), 2.0]}]},
         r"\.censored_at has inf"),
    ]
    for state, message in bad:
        with pytest.raises(ValueError, match=message):
            LatencyEstimator(3).import_rounds(state, ["a", "b", "c"])


def test_saved_rounds_survive_clients_that_never_started_and_refuse_absurd_values():
    est = LatencyEstimator(2)
    # client 1 was busy longer than the round lasted: it never started (no information)
    est.update([1.0, np.nan], [1.0, 1.0], 2.0, busy=[0.0, 3.0])
    state = est.export_rounds(["a", "b"])
    assert state["rounds"][0]["censored_at"][1] == 0.0 and state["rounds"][0]["load"][1] == 0.0
    assert LatencyEstimator(2).import_rounds(state, ["a", "b"]) == 1
    one = state["rounds"][0]
    for field, values, message in [
        ("time", [[1.0], [2.0]], "flat"),
        ("time", [10**400, None], "numbers"),
        ("time", [1e300, None], "1e\\+300"),
        ("load", [1e-300, 1.0], "1e-300"),
    ]:
        bad = {**state, "rounds": [{**one, field: values}]}
        with pytest.raises(ValueError, match=message):
            LatencyEstimator.validate_state(bad)


# ======== edges: exact values, bounds and messages ===============================================
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


def test_a_client_without_outstanding_work_draws_nothing_and_changes_no_other_draw():
    est = LatencyEstimator(4)
    est.update([1.0, 2.0, 1.5, 3.0], [1.0] * 4, 4.0)
    load = np.array([1.0, 1.0, 0.0, 1.0])
    free = est.sample_remaining([0.5, np.nan, np.nan, 1.0], load, 64, np.random.default_rng(1))
    # client 2 has a finite time since its last job but no work outstanding (load 0)
    idle = est.sample_remaining([0.5, np.nan, 7.0, 1.0], load, 64, np.random.default_rng(1))
    np.testing.assert_array_equal(idle, free)
    assert not idle[:, 1:3].any() and idle[:, [0, 3]].all()


def test_a_pending_reply_is_censored_at_its_compute_time_after_the_busy_wait():
    """Client 1 waited 0.5 s for earlier work: 4 s after the round started it has computed
    for 3.5 s, the new censoring time (not 4.5 s)."""
    est = LatencyEstimator(3)
    rid = est.update([1.0, np.nan, 1.0], [1.0] * 3, 2.0, busy=[0.0, 0.5, 0.0])
    assert est.round(rid).limit[1] == 1.5
    assert est.observe_pending(rid, 1, 4.0)
    assert est.round(rid).limit[1] == 3.5
    assert not est.observe_pending(rid, 1, 3.9)  # 3.4 s: not beyond 3.5 s
    assert est.round(rid).limit[1] == 3.5


def test_the_load_exponent_is_clipped_to_one_when_time_grows_faster_than_the_load():
    """Times 1 s at load 1 and 16 s at load 4: the regression slope is 2, clipped to 1."""
    est = LatencyEstimator(4, beta_strength=1e-9)
    for load, time in ((1.0, 1.0), (4.0, 16.0)):
        _round(est, load, time)
    assert est.load_exponent == 1.0
