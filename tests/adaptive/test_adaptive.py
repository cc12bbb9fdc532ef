"""Adaptive tolerance: the round-time model and the choice of s (fl_gradcode.adaptive:
``decode_rule``, ``expected_round_time``, ``choose_s``).

The estimator itself is tested in test_adaptive_estimator.py, its survival curve in
test_adaptive_survival.py."""

from __future__ import annotations

import math

import numpy as np
import pytest

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
from fl_gradcode.codes import NestedPlacement, make_code
from fl_gradcode.latency import harmonic
from tests.adaptive.support import simulate_round


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


# ======== edges: exact values, bounds and messages ===============================================
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
