"""Adaptive tolerance: censored latency estimation and the choice of s (fl_gradcode.adaptive)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import minimize_scalar
from scipy.stats import genpareto, norm

from fl_gradcode.adaptive import (
    Decision,
    DecodeRule,
    LatencyEstimator,
    SingleCode,
    choose_s,
    code_loads,
    decode_rule,
    expected_round_time,
)
from fl_gradcode.adaptive.survival import Survival, fit_gpd
from fl_gradcode.codes import NestedPlacement, make_code
from fl_gradcode.latency import harmonic


def simulate_round(est, code, times, *, late=False):
    """One round with early return: decode at the rule's time, censor the rest."""
    end = float(decode_rule(code).times(times[None, :])[0])
    rid = est.update(np.where(times <= end, times, np.nan), code_loads(code), end)
    if late:  # late replies arrive after the round and are reported then
        for i in np.flatnonzero(times > end):
            est.observe_late(rid, int(i), float(times[i]))
    return end


def closed_loop(n, s_max, draw, rounds, seed=0, **options):
    """Run the policy: choose s, observe a round under the true model ``draw``, repeat."""
    rng = np.random.default_rng(seed)
    placement = NestedPlacement(n, s_max)
    est = LatencyEstimator(n, seed=seed, **options)
    history = []
    s = choose_s(placement, est).s
    for _ in range(rounds):
        code = placement.code(s)
        end = simulate_round(est, code, draw(rng, code_loads(code)))
        history.append((s, end))
        s = choose_s(placement, est).s
    return placement, est, history, s


def true_times(placement, draw, samples=4000, seed=123):
    """Reference: expected round time of every code under the true model (Monte Carlo)."""
    rng = np.random.default_rng(seed)
    out = {}
    for s in placement.stable_values:
        code = placement.code(s)
        loads = code_loads(code)
        T = np.stack([draw(rng, loads) for _ in range(samples)])
        out[s] = float(decode_rule(code).times(T).mean())
    return out


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


def test_pending_work_is_priced_like_the_busy_time_it_implies():
    """Deterministic 1 s per partition: work of 1 partition sent 0.5 s ago on clients 0-5 is
    the same as busy_until = now + 0.5: uncoded, 1.5 s then 1 s."""
    N12 = 12
    placement = NestedPlacement(N12, 3)
    est = LatencyEstimator(N12, load_exponent=1.0)
    est.update(np.ones(N12), np.ones(N12), 1.0)
    ago = np.where(np.arange(N12) < 6, 0.5, np.nan)
    by_pending = choose_s(placement, est, pending=(ago, np.ones(N12)), now=10.0,
                          busy="queue", lookahead=True)
    by_clock = choose_s(placement, est, busy_until=np.where(np.arange(N12) < 6, 10.5, 0.0),
                        now=10.0, busy="queue", lookahead=True)
    assert by_pending.expected_times == pytest.approx(by_clock.expected_times)
    assert by_pending.s == by_clock.s == 0
    with pytest.raises(ValueError, match="not both"):
        choose_s(placement, est, pending=(ago, np.ones(N12)), busy_until=np.zeros(N12))
    with pytest.raises(ValueError, match="pending arrays must have shape"):
        choose_s(placement, est, pending=(ago[:3], np.ones(N12)))


def test_pending_work_that_stops_at_a_deadline_is_priced_as_busy_until_then():
    """Deterministic 1 s per partition: 4 partitions sent 0.5 s ago (3.5 s left) on clients
    0-5, whose work stops 0.25 s from now (``pending_limit``), is busy_until = now + 0.25;
    an infinite limit leaves the 3.5 s."""
    N12 = 12
    placement = NestedPlacement(N12, 3)
    est = LatencyEstimator(N12, load_exponent=1.0)
    est.update(np.ones(N12), np.ones(N12), 1.0)
    busy = np.arange(N12) < 6
    ago, units = np.where(busy, 0.5, np.nan), np.where(busy, 4.0, 0.0)
    for cap, left in ((0.25, 0.25), (np.inf, 3.5)):
        capped = choose_s(placement, est, pending=(ago, units), now=10.0, busy="queue",
                          lookahead=True, pending_limit=np.where(busy, cap, np.inf))
        by_clock = choose_s(placement, est, busy_until=np.where(busy, 10.0 + left, 0.0),
                            now=10.0, busy="queue", lookahead=True)
        assert capped.expected_times == pytest.approx(by_clock.expected_times)
    with pytest.raises(ValueError, match="pending_limit must hold 12 times >= 0"):
        choose_s(placement, est, pending=(ago, units), pending_limit=-np.ones(N12))


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


# ------------------------------------------------------------------------ round-time model
def test_expected_round_time_matches_order_statistics_closed_form():
    """Uncoded waits for the max of n Exp(1): E = H_n (David & Nagaraja); any-(n-s) codes at
    load s+1 (compute-bound): (s+1)(H_n - H_s). Censoring hides the top 20% of every round."""
    n = 20
    rng = np.random.default_rng(4)
    est = LatencyEstimator(n, load_exponent=1.0, halflife=math.inf, max_rounds=200)
    for _ in range(200):
        t = rng.exponential(1.0, n)
        end = np.sort(t)[n - 5]
        est.update(np.where(t <= end, t, np.nan), np.ones(n), end)
    uncoded = expected_round_time(make_code("uncoded", n, 0), est, samples=4000)
    assert uncoded == pytest.approx(harmonic(n), rel=0.05)  # measured 3.61 vs 3.60
    crc = expected_round_time(make_code("crc", n, 3), est, samples=4000)
    assert crc == pytest.approx(4 * (harmonic(n) - harmonic(3)), rel=0.05)


@pytest.mark.parametrize(
    ("name", "s"),
    [("uncoded", 0), ("frc", 1), ("crc", 2), ("grouped-rs", 3), ("ignore-stragglers", 2)],
)
def test_fast_decode_rule_agrees_with_is_decodable(name, s):
    n = 10
    code = make_code(name, n, s, seed=1)
    rule = decode_rule(code)
    rng = np.random.default_rng(5)
    T = rng.exponential(1.0, (30, n))
    fast = rule.times(T)
    for row, t_fast in zip(T, fast, strict=True):
        order = np.argsort(row)
        k = next(k for k in range(1, n + 1) if code.is_decodable(order[:k]) or (
            not code.is_exact and k >= n - s))
        assert t_fast == row[order[k - 1]]


def test_fast_decode_rule_agrees_with_is_decodable_for_every_nested_code():
    n = 10
    placement = NestedPlacement(n, 5)
    rng = np.random.default_rng(6)
    T = rng.exponential(1.0, (20, n))
    for s in range(6):
        code = placement.code(s)
        fast = decode_rule(code).times(T)
        for row, t_fast in zip(T, fast, strict=True):
            order = np.argsort(row)
            k = next(k for k in range(1, n + 1) if code.is_decodable(order[:k]))
            assert t_fast == row[order[k - 1]], (s, row)


def test_busy_clients_delay_the_round():
    n = 12
    placement = NestedPlacement(n, 3)
    est = LatencyEstimator(n, load_exponent=1.0)
    est.update(np.ones(n), np.ones(n), 1.0)  # deterministic: 1 s per unit of work
    busy = np.zeros(n)
    assert choose_s(placement, est, busy_until=busy).s == 0  # nothing to gain from coding
    busy[4] = 100.0  # one client is still busy with stale work for 100 s
    d = choose_s(placement, est, busy_until=busy, now=0.0)
    assert d.s >= 1 and d.expected_times[0] == pytest.approx(101.0)


def test_busy_clients_queued_skipped_or_queued_if_in_time():
    """Deterministic 1 s per partition (beta = 1); odd clients busy for 0.5 s more.

    queue: uncoded ends at max(0.5 + 1, 1) = 1.5, before s = 1 (load 2: 2 s). skip: busy
    clients never reply, so uncoded never ends and s = 1 (one free client per pair) takes 2 s.
    fit: client 4 busy for 100 s would finish at 101 (uncoded) or 102 (s >= 1), after the best
    round's end (s = 1: 2 s, its partner replies): skipped, and uncoded cannot finish.
    """
    n = 12
    placement = NestedPlacement(n, 3)
    est = LatencyEstimator(n, load_exponent=1.0)
    est.update(np.ones(n), np.ones(n), 1.0)
    busy = np.zeros(n)
    busy[1::2] = 0.5
    d = choose_s(placement, est, busy_until=busy, busy="queue")
    assert (d.s, d.skip) == (0, ()) and d.expected_times[0] == pytest.approx(1.5)
    d = choose_s(placement, est, busy_until=busy, busy="fit")  # all finish by 1.5: queued
    assert (d.s, d.skip) == (0, ())
    d = choose_s(placement, est, busy_until=busy, busy="skip")
    assert (d.s, d.skip) == (1, (1, 3, 5, 7, 9, 11))
    assert d.expected_times[0] == math.inf and d.expected_times[1] == pytest.approx(2.0)
    far = np.zeros(n)
    far[4] = 100.0
    assert choose_s(placement, est, busy_until=far, busy="queue").expected_times[
        0] == pytest.approx(101.0)
    d = choose_s(placement, est, busy_until=far, busy="fit")
    assert (d.s, d.skip) == (1, (4,))
    assert d.expected_times[0] == math.inf and d.expected_times[1] == pytest.approx(2.0)
    with pytest.raises(ValueError, match="busy"):
        choose_s(placement, est, busy="later")
    # no observation yet: s_max; skip lists every busy client, fit and queue none
    fresh = LatencyEstimator(n)
    assert choose_s(placement, fresh, busy_until=busy, busy="skip").skip == (1, 3, 5, 7, 9, 11)
    assert choose_s(placement, fresh, busy_until=busy, busy="fit").skip == ()


def test_single_code_decides_only_whom_to_queue_for_a_fixed_code():
    """Deterministic 1 s per partition (beta = 1), the fixed s = 1 code of the nested placement
    (pairs (0, 1), (2, 3), ..., load 2: 2 s). Client 1 busy for 0.5 s more, client 4 for 100 s.
    Everyone queued, every pair decodes by 2 s (client 0 at 2, client 5 at 2): the round takes
    2 s. Client 1 starts its new work at 0.5 < 2: queued; client 4 only at 100 > 2: skipped.
    The decision keeps s = 1 whatever the busy clients cost."""
    n = 12
    code = NestedPlacement(n, 3).code(1)
    est = LatencyEstimator(n, load_exponent=1.0)
    est.update(np.ones(n), np.ones(n), 1.0)
    busy = np.zeros(n)
    busy[1], busy[4] = 0.5, 100.0
    d = choose_s(SingleCode(code), est, busy_until=busy, busy="fit")
    assert (d.s, d.skip) == (1, (4,))
    assert d.expected_times == {1: pytest.approx(2.0)}
    # all pairs blocked by busy clients: still s = 1 (it is the only choice), nobody skipped
    # when everyone can start in time
    slow = np.where(np.arange(n) % 2 == 0, 1.5, 0.0)
    d = choose_s(SingleCode(code), est, busy_until=slow, busy="fit")
    assert (d.s, d.skip) == (1, ()) and d.expected_times[1] == pytest.approx(2.0)
    assert SingleCode(code).code(1) is code
    with pytest.raises(ValueError, match="s=2"):
        SingleCode(code).code(2)
    with pytest.raises(TypeError, match="GradientCode"):
        SingleCode("frc")


# ------------------------------------------------------------------------ the policy
def test_no_observation_returns_s_max():
    d = choose_s(NestedPlacement(16, 5), LatencyEstimator(16))
    assert d == Decision(s=5, expected_times={}, approximate=False, observed=False)


def test_deterministic_load_scaled_latency_picks_uncoded():
    def draw(rng, loads):
        return 0.5 * loads  # compute-bound, no randomness: coding can only cost

    _, est, history, s = closed_loop(24, 6, draw, rounds=6)
    assert history[0][0] == 6  # the safe start
    assert s == 0 and all(h[0] == 0 for h in history[1:])
    assert est.load_exponent == pytest.approx(1.0)


def test_heavy_tailed_load_independent_delays_pick_a_large_s():
    def draw(rng, loads):
        return 1.0 + rng.pareto(1.5, loads.size)  # Pareto(1, 1.5), ignores the load

    # beta known to be 0: coding is free, the largest tolerance wins
    placement = NestedPlacement(24, 6)
    est = LatencyEstimator(24, load_exponent=0.0)
    rng = np.random.default_rng(7)
    for _ in range(20):
        simulate_round(est, placement.code(6), draw(rng, np.ones(24)))
    assert choose_s(placement, est).s == 6
    # beta unknown: the policy tries small s (beta = 1 prior), sees the time did not shrink
    # with the load, and settles on a large s; its rounds are far faster than uncoded ones.
    placement, est, history, s = closed_loop(24, 6, draw, rounds=30, seed=1)
    truth = true_times(placement, draw)
    assert est.load_exponent < 0.4
    assert s >= 4
    assert np.mean([truth[h[0]] for h in history[5:]]) < 0.4 * truth[0]


def test_persistently_slow_clients_are_avoided():
    n = 24
    slow = np.zeros(n, dtype=bool)
    slow[[2, 9, 17]] = True

    def draw(rng, loads):  # compute-bound shifted exponential, 3 clients 20x slower
        return loads * (1 + rng.exponential(1.0, n)) * np.where(slow, 20.0, 1.0)

    placement, est, _, s = closed_loop(n, 6, draw, rounds=25, seed=2)
    truth = true_times(placement, draw)
    best = min(truth.values())
    assert truth[s] <= 1.15 * best  # near the true optimum (s = 1 here)
    assert truth[s] < 0.3 * truth[0]  # uncoded waits for a 20x slow client
    assert np.all(est.slowness()[slow] > 4 * np.median(est.slowness()))


def test_a_node_that_never_answers_is_tolerated():
    n = 12
    placement = NestedPlacement(n, 3)
    est = LatencyEstimator(n, load_exponent=1.0)
    for _ in range(10):  # deterministic compute; node 5 errors every round
        s = choose_s(placement, est).s
        code = placement.code(s)
        t = code_loads(code) * 1.0
        t[5] = np.inf
        end = float(decode_rule(code).times(t[None, :])[0])
        end = min(end, 20.0)  # the round's timeout when it cannot decode
        est.update(np.where(t <= end, t, np.nan), code_loads(code), end)
    d = choose_s(placement, est)
    assert d.s >= 1 and d.expected_times[0] > 10 * d.expected_times[d.s]


def test_approximate_option_is_flagged_and_off_by_default():
    def draw(rng, loads):
        return 1.0 + rng.pareto(1.5, loads.size)

    placement, est, _, _ = closed_loop(24, 6, draw, rounds=10, seed=3)
    d = choose_s(placement, est)
    assert not d.approximate and d.approximate_times == {}
    d = choose_s(placement, est, allow_approximate=True)
    assert set(d.approximate_times) == set(range(1, 7))
    best_exact = min(d.expected_times.values())
    assert d.approximate == (min(d.approximate_times.values()) < best_exact)


def test_choose_s_is_deterministic_and_validates_candidates():
    def draw(rng, loads):
        return loads * rng.exponential(1.0, loads.size)

    placement, est, _, _ = closed_loop(16, 4, draw, rounds=5, seed=4)
    a = choose_s(placement, est, rng=np.random.default_rng(0))
    b = choose_s(placement, est, rng=np.random.default_rng(0))
    assert a == b
    d = choose_s(placement, est, candidates=[0, 2])
    assert set(d.expected_times) == {0, 2}
    with pytest.raises(ValueError, match="candidate"):
        choose_s(placement, est, candidates=[7])


def test_per_partition_costs_set_the_loads():
    placement = NestedPlacement(8, 2)
    code = placement.code(2)
    cost = np.arange(1.0, 9.0)
    loads = code_loads(code, cost)
    for i in range(8):
        assert loads[i] == pytest.approx(sum(cost[j] for j in code.assignment(i)))
    np.testing.assert_array_equal(code_loads(code, 2.0), 2.0 * code_loads(code))
    assert np.all(code_loads(code) == code.load)  # banded code: s + 1 partitions each


class _FixedDraws:
    """An estimator stand-in whose per-unit latencies are given rows (hand-checkable)."""

    def __init__(self, rows, beta=1.0):
        self.rows = np.asarray(rows, dtype=float)
        self.n = self.rows.shape[1]
        self.has_data = True
        self.load_exponent = beta

    def sample(self, size, rng=None):
        return self.rows.copy()


def test_lookahead_charges_the_backlog_a_round_leaves_to_the_next_round():
    """n=4, s_max=1: s=0 is uncoded (load 1, all four replies), s=1 pairs {0,1}, {2,3} (load 2,
    one reply per pair). Draw 1: client 3 is 10x slow, draw 2: client 2. By hand, with
    ``time = load * X``: s=0 waits 10 in each draw; s=1 decodes at 2, but the slow client's
    work runs until 20, so the next round (latencies of the other draw) finds client 2 slow
    and client 3 busy for 18 more: its pair decodes at 20. Two-round means: s=0 (10+10)/2 = 10,
    s=1 (2+20)/2 = 11; one-round: s=0 10, s=1 2."""
    est = _FixedDraws([[1, 1, 1, 10], [1, 1, 10, 1]])
    placement = NestedPlacement(4, 1)
    myopic = choose_s(placement, est)
    ahead = choose_s(placement, est, lookahead=True)
    assert myopic.expected_times == pytest.approx({0: 10.0, 1: 2.0})
    assert myopic.s == 1
    assert ahead.expected_times == pytest.approx({0: 10.0, 1: 11.0})
    assert ahead.s == 0


def test_lookahead_without_backlog_equals_the_one_round_prediction():
    """When every client ends by the time the round decodes (uncoded), the next round starts
    from nothing: the two-round mean is the one-round mean (the draws are reused, permuted)."""
    rng = np.random.default_rng(3)
    est = _FixedDraws(rng.exponential(1.0, size=(64, 6)) + 1.0, beta=0.5)
    placement = NestedPlacement(6, 2)
    a = choose_s(placement, est, candidates=[0])
    b = choose_s(placement, est, candidates=[0], lookahead=True)
    assert b.expected_times[0] == pytest.approx(a.expected_times[0], rel=1e-12)


@pytest.mark.parametrize(("margin", "expected"), [(0.0, 0), (0.01, 0), (0.05, 1), (1.0, 1)])
def test_margin_prefers_the_more_tolerant_code_within_the_slack(margin, expected):
    """beta = 0.1, one draw X = (1, 1, 1, 1.05): s=0 waits for the slowest, 1.05; s=1 (load 2)
    needs one reply per pair, 2**0.1 = 1.0718 (2.1% slower). Within a 5% margin s=1 wins."""
    est = _FixedDraws([[1, 1, 1, 1.05]], beta=0.1)
    d = choose_s(NestedPlacement(4, 1), est, margin=margin)
    assert d.expected_times == pytest.approx({0: 1.05, 1: 2**0.1})
    assert d.s == expected


def test_margin_must_be_non_negative():
    est = _FixedDraws([[1, 1, 1, 1]])
    with pytest.raises(ValueError, match=r"margin=-0\.1"):
        choose_s(NestedPlacement(4, 1), est, margin=-0.1)


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


def test_a_client_without_outstanding_work_draws_nothing_and_changes_no_other_draw():
    est = LatencyEstimator(4)
    est.update([1.0, 2.0, 1.5, 3.0], [1.0] * 4, 4.0)
    load = np.array([1.0, 1.0, 0.0, 1.0])
    free = est.sample_remaining([0.5, np.nan, np.nan, 1.0], load, 64, np.random.default_rng(1))
    # client 2 has a finite time since its last job but no work outstanding (load 0)
    idle = est.sample_remaining([0.5, np.nan, 7.0, 1.0], load, 64, np.random.default_rng(1))
    np.testing.assert_array_equal(idle, free)
    assert not idle[:, 1:3].any() and idle[:, [0, 3]].all()


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


def test_choose_s_refuses_exclusion_on_a_fixed_code_and_busy_until_with_pending():
    est = LatencyEstimator(4)
    fixed = SingleCode(make_code("crc", 4, 1))
    with pytest.raises(ValueError, match=r"^exclude_slower_than needs a NestedPlacement "
                                         r"\(code_excluding\)$"):
        choose_s(fixed, est, exclude_slower_than=4.0)
    with pytest.raises(ValueError, match=r"^give busy_until or pending, not both$"):
        choose_s(NestedPlacement(4, 1), est, busy_until=np.zeros(4),
                 pending=(np.zeros(4), np.ones(4)))


def test_a_client_slower_than_the_factor_is_excluded_when_that_is_faster():
    """Twelve clients at about 4 s per round of 4 units, client 3 at 200 s (50x). Uncoded
    waits for client 3 (about 50 s per unit); excluding it, client 0 carries two partitions
    of its super-block (about 2 s): worked out by hand from the placement."""
    slowness = np.ones(12)
    slowness[3] = 50.0
    est = LatencyEstimator(12, seed=0, load_exponent=1.0)
    rng = np.random.default_rng(5)
    loads = np.full(12, 4.0)
    for _ in range(8):
        t = loads * slowness * np.exp(0.1 * rng.standard_normal(12))
        est.update(t, loads, float(t.max()))
    d = choose_s(NestedPlacement(12, 3), est, candidates=[0], exclude_slower_than=4.0,
                 samples=64)
    assert d.excluded == (3,) and d.s == 0
    assert d.expected_times[0] == pytest.approx(50.0, rel=0.1)
    assert d.excluded_times[0] == pytest.approx(2.0, rel=0.1)


class _Exponential:
    """A prior of per-unit latency ``Exp(1)`` scaled by the load it is asked for."""

    def sample(self, size, rng, load):
        return load * rng.exponential(1.0, size)


def test_before_data_the_round_time_is_drawn_per_unit_from_the_prior_with_the_given_rng():
    """Uncoded, three clients with one unit each and no observation: the round lasts the
    largest of three Exp(1) draws of the given generator (numpy's own draws, here)."""
    est = LatencyEstimator(3, _Exponential())
    reference = np.random.default_rng(7).exponential(1.0, (500, 3))
    np.testing.assert_array_equal(est.sample(500, np.random.default_rng(7)), reference)
    got = expected_round_time(make_code("uncoded", 3, 0), est, rng=np.random.default_rng(7),
                              samples=500)
    assert got == float(np.mean(reference.max(axis=1)))


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


def test_a_multi_group_rule_with_large_thresholds_takes_each_groups_order_statistic():
    """Three groups of up to nine clients (the last padded with the never-arriving client
    n), thresholds 7, 9 and 8: the round lasts the largest of the groups' t-th smallest
    reply times (np.sort as reference)."""
    n = 26
    groups = [list(range(0, 9)), list(range(9, 18)), list(range(18, 26))]
    members = np.full((3, 9), n, dtype=np.int64)
    for g, c in enumerate(groups):
        members[g, : len(c)] = c
    thresholds = np.array([7, 9, 8], dtype=np.int64)
    support = np.eye(n)
    rule = DecodeRule(members, thresholds, support, support.sum(axis=1), n)
    T = np.random.default_rng(3).exponential(1.0, (40, n))
    expected = np.max([np.sort(T[:, c], axis=1)[:, t - 1]
                       for c, t in zip(groups, thresholds, strict=True)], axis=0)
    np.testing.assert_array_equal(rule.times(T), expected)


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


def test_an_approximate_choice_only_as_fast_as_the_exact_one_is_not_taken():
    """Two clients, beta = 1: replicating both partitions on both (s = 1) lasts 2 min(X);
    ignoring the slower of two uncoded replies lasts min(X) for half the data, 2 min(X) per
    full-data equivalent. A tie, so the exact code is kept."""
    est = LatencyEstimator(2, load_exponent=1.0)
    rng = np.random.default_rng(0)
    for _ in range(4):
        t = 2.0 * rng.exponential(1.0, 2)
        est.update(t, [2.0, 2.0], float(t.max()))
    d = choose_s(NestedPlacement(2, 1), est, candidates=[1], allow_approximate=True)
    assert d.approximate_times[1] == d.expected_times[1]
    assert not d.approximate and d.s == 1


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


def test_a_deadline_rules_out_codes_that_cannot_decode_by_it():
    """Deterministic 1 s per partition, client 4 busy for 100 s (its work queued): s = 0
    waits for it (101 s), s = 1, 2, 3 decode without it at s + 1 seconds. With margin 1 the
    most tolerant s within 2x of the fastest (2 s) is s = 3 (4 s). A 3.5 s deadline: s = 3
    cannot decode by it (priced inf: every round would end undecoded), so s = 2 (3 s)."""
    n = 12
    placement = NestedPlacement(n, 3)
    est = LatencyEstimator(n, load_exponent=1.0)
    est.update(np.ones(n), np.ones(n), 1.0)
    busy = np.zeros(n)
    busy[4] = 100.0
    free = choose_s(placement, est, busy_until=busy, busy="queue", margin=1.0)
    assert free.s == 3
    assert free.expected_times == pytest.approx({0: 101.0, 1: 2.0, 2: 3.0, 3: 4.0})
    timed = choose_s(placement, est, busy_until=busy, busy="queue", margin=1.0, deadline=3.5)
    assert timed.s == 2
    assert timed.expected_times == pytest.approx({0: math.inf, 1: 2.0, 2: 3.0, 3: math.inf})
    # no code can decode by the deadline: priced by E[T] as without one, the code soonest
    # done (s = 1, 2 s: the most replies by the deadline for the approximate decoding, and
    # replies at a load that can finish); the largest s (4 s) used to be kept here, and a
    # run whose every reply at that load missed the deadline never left it
    stuck = choose_s(placement, est, busy_until=busy, busy="queue", deadline=1.5)
    assert stuck.s == 1
    assert stuck.expected_times == pytest.approx({0: 101.0, 1: 2.0, 2: 3.0, 3: 4.0})
    # an infinite deadline is none
    assert choose_s(placement, est, busy_until=busy, busy="queue", margin=1.0,
                    deadline=math.inf).expected_times == free.expected_times
    with pytest.raises(ValueError, match="deadline=0"):
        choose_s(placement, est, busy_until=busy, deadline=0)

