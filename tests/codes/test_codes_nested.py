"""Nested placement: every code's support inside the placement, exact decoding, stability."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fl_gradcode.codes import NestedPlacement, make_code, straggler_patterns
from fl_gradcode.codes.nested import (
    NestedGroupCode,
    banded_rs_block,
    reflected_misses,
)
from fl_gradcode.codes.stable import rs_amplification


def rel_err(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.linalg.norm(x - y) / np.linalg.norm(y))


@settings(max_examples=60, deadline=None)
@given(s=st.integers(1, 80), data=st.data())
def test_reflected_misses_are_regular_and_cover_every_out_of_band_pair(s, data):
    t = data.draw(st.integers(1, s + 1))
    m = s + t
    miss = reflected_misses(m, t)
    assert np.all(miss.sum(axis=0) == t - 1) and np.all(miss.sum(axis=1) == t - 1)
    p, x = np.indices((m, m))
    assert np.all(miss[np.abs(p - x) > s])
    B = banded_rs_block(m, t)
    assert np.all((B != 0) == ~miss)  # holds exactly s + 1 partitions, all within the band


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 40),
    data=st.data(),
    layout=st.sampled_from(["hybrid", "window"]),
)
def test_every_code_lives_inside_the_placement(n, data, layout):
    s_max = data.draw(st.integers(0, n - 1))
    p = NestedPlacement(n, s_max, seed=1, layout=layout)
    hold = p.holding_matrix
    for i in range(n):
        assert i in p.holdings(i)
        assert p.holdings(i) == tuple(np.flatnonzero(hold[i]))
    if layout == "window":
        assert all(len(p.holdings(i)) == min(s_max + 1, n) for i in range(n))
    for s in range(s_max + 1):
        code = p.code(s)
        assert code.s == s and code.is_exact and code.k == n
        for i in range(n):
            assert set(code.assignment(i)) <= set(p.holdings(i)), (s, i)
        # a partition held by <= s clients could be wiped out by s stragglers
        assert np.all(np.count_nonzero(code.B, axis=0) >= s + 1)
    np.testing.assert_array_equal(p.code(0).B, np.eye(n))  # s = 0: uncoded, own partition
    if layout == "hybrid":  # the block code is stable by construction
        assert p.stable_values == tuple(range(s_max + 1))


CASES = [(n, s_max, layout) for n in (5, 7, 8, 10) for s_max in (n - 1, n // 2, 2)
         for layout in ("hybrid", "window") if s_max < n]


@pytest.mark.parametrize(("n", "s_max", "layout"), CASES)
def test_exact_from_every_set_of_n_minus_s_replies_with_weights(n, s_max, layout):
    rng = np.random.default_rng(100 * n + s_max)
    w = rng.uniform(0.3, 3.0, n)  # partition weights != 1
    p = NestedPlacement(n, s_max, seed=2, layout=layout, weights=w)
    U = {j: rng.standard_normal(5) for j in range(n)}
    target = sum(w[j] * U[j] for j in range(n))
    for s in range(s_max + 1):
        code = p.code(s)
        np.testing.assert_array_equal(code.weights, w)
        replies = {i: code.encode(i, U) for i in range(n)}
        for stragglers in itertools.combinations(range(n), s):
            got = {i: r for i, r in replies.items() if i not in stragglers}
            assert code.is_decodable(got)
            assert rel_err(code.decode(got), target) <= 1e-10, (s, stragglers)


@pytest.mark.parametrize(("n", "s_max"), [(8, 7), (9, 4), (10, 6)])
def test_is_decodable_count_rule_agrees_with_least_squares_on_every_subset(n, s_max):
    p = NestedPlacement(n, s_max)
    for s in range(s_max + 1):
        code = p.code(s)
        if not isinstance(code, NestedGroupCode):
            continue
        for size in range(n + 1):
            for got in itertools.combinations(range(n), size):
                alive = np.zeros(n, dtype=bool)
                alive[list(got)] = True
                count_rule = all(
                    np.count_nonzero(alive[list(g.clients)]) >= g.threshold for g in code.groups
                )
                # the group count rule is exactly the least-squares criterion
                assert count_rule == code.decoding(got).exact == code.is_decodable(got)


def test_groups_decode_from_their_threshold_and_hold_the_load():
    p = NestedPlacement(30, 8)
    for s in range(9):
        code = p.code(s)
        assert code.tolerance >= s
        for g in code.groups:
            assert len(g.clients) - g.threshold >= s
            loads = np.count_nonzero(code.B[list(g.clients)], axis=1)
            assert np.all(loads == g.tolerance + 1)
        if s <= 4:  # banded window codes: the optimal load s + 1
            assert code.load == s + 1


def test_window_layout_stores_exactly_s_max_plus_1_and_flags_the_crc_fallback():
    p = NestedPlacement(40, 10, layout="window")
    assert p.storage == 11
    assert p.stable_values == tuple(range(6))  # s <= s_max / 2
    for s in range(6, 11):
        assert not p.is_stable(s)
        assert p.code(s).name == "nested-crc" and p.code(s).is_exact


def test_hybrid_at_n256_every_s_is_stable_with_bounded_storage_and_load():
    p = NestedPlacement(256, 64)
    assert p.stable_values == tuple(range(65))
    assert p.storage <= 2 * 64 + 1  # 118 measured
    loads = {s: p.code(s).load for s in range(65)}
    assert all(loads[s] == s + 1 for s in range(32))  # banded codes up to s_max/2 - 1
    assert all(loads[s] <= 2 * (s + 1) for s in range(65))
    assert max(p.code(s).amplification for s in range(65)) <= 1e5


@pytest.mark.parametrize("s", [1, 7, 19, 25, 28, 32, 39, 42, 64])
def test_stable_at_n256_over_random_sets_and_every_burst(s):
    n = 256
    p = NestedPlacement(n, 64)
    rng = np.random.default_rng(s)
    w = rng.uniform(0.5, 2.0, n)
    code = p.code(s).with_weights(w)
    assert code.amplification <= 1e5
    U = rng.standard_normal((n, 8))
    target = w @ U
    replies = code.B @ (w[:, None] * U)
    worst = 0.0
    for stragglers in straggler_patterns(n, s, max_sets=16, seed=s):  # 256 bursts + 16
        alive = [i for i in range(n) if i not in stragglers]
        a = code.decoding_vector(alive)
        worst = max(worst, rel_err(a @ replies[alive], target))
    assert worst <= 1e-10, worst  # measured <= 3e-12; the brief asks for 1e-8


def test_amplification_bound_matches_the_formula():
    code = NestedPlacement(50, 12).code(6)
    assert code.amplification == max(
        rs_amplification(len(g.clients), g.threshold) for g in code.groups
    )


def test_registry_and_validation():
    a = make_code("nested", n=12, s=3, s_max=6)
    np.testing.assert_array_equal(a.B, NestedPlacement(12, 6).code(3).B)
    b = make_code("nested", n=10, s=3)  # s_max = s: grouped RS, load raised, k = n
    assert b.k == 10 and b.load == 4 and b.is_exact
    with pytest.raises(ValueError, match="s_max"):
        make_code("nested", n=12, s=4, s_max=3)
    with pytest.raises(ValueError, match="layout"):
        NestedPlacement(12, 3, layout="ring")
    with pytest.raises(ValueError, match="s=5"):
        NestedPlacement(12, 3).code(5)
    with pytest.raises(ValueError, match="client index"):
        NestedPlacement(12, 3).holdings(12)


# ======== edges: exact values, bounds and messages ===============================================
def test_nested_placement_lists_a_code_for_every_tolerance_up_to_s_max():
    placement = NestedPlacement(8, 3)
    codes = placement.codes()
    assert sorted(codes) == [0, 1, 2, 3]
    assert [codes[s].s for s in range(4)] == [0, 1, 2, 3]


def test_a_block_code_exactly_at_the_amplification_budget_is_stable():
    """Budget 1: every super-block group falls back to threshold 1 (all members hold the
    group, amplification ``rs_amplification(m, 1) = 1`` = the budget): stable, so the hybrid
    placement is stable at every ``s`` (the band code, amplification > 1 for ``s >= 1``, is not)."""
    placement = NestedPlacement(12, 4, max_amplification=1.0)
    assert placement.stable_values == (0, 1, 2, 3, 4)
    for s in range(5):
        code = placement.code(s)
        assert code.amplification == 1.0
        assert all(g.threshold == 1 for g in code.groups)
    assert rs_amplification(5, 1) == 1.0 < rs_amplification(5, 2)


@pytest.mark.parametrize("s", [True, False, 1.0, "1"])
def test_a_tolerance_that_is_not_an_integer_is_refused(s):
    placement = NestedPlacement(12, 3)
    with pytest.raises(ValueError, match=rf"^s={re.escape(repr(s))} must be an integer$"):
        placement.code(s)
    with pytest.raises(ValueError, match=rf"^s={re.escape(repr(s))} must be an integer$"):
        placement.code_excluding(s, [0])


def test_code_excluding_gives_block_groups_of_active_clients_inside_the_placement():
    """n=12, s_max=3: super-blocks {0..3}, {4..7}, {8..11}; excluding client 5 at s=1 leaves 3
    active clients there (one group of 3 holding all four partitions). Every group is a block
    group; the excluded row is zero; any n - s rows decode the sum (numpy lstsq)."""
    placement = NestedPlacement(12, 3)
    assert placement.superblocks == [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11)]
    code = placement.code_excluding(1, [5])
    assert {g.kind for g in code.groups} == {"block"}
    assert sorted(tuple(g.clients) for g in code.groups) == [
        (0, 1), (2, 3), (4, 6, 7), (8, 9), (10, 11)]
    assert [g.partitions for g in code.groups if 4 in g.clients] == [(4, 5, 6, 7)]
    assert not np.any(code.B[5])
    assert not np.any((code.B != 0) & ~placement.holding_matrix)
    for stragglers in itertools.combinations(range(12), 1):
        rows = [i for i in range(12) if i not in stragglers]
        a = np.linalg.lstsq(code.B[rows].T, np.ones(12), rcond=None)[0]
        np.testing.assert_allclose(a @ code.B[rows], np.ones(12), atol=1e-9)


@pytest.mark.parametrize(("m", "k", "t"), [(5, 5, 3), (7, 4, 4), (6, 9, 2), (4, 4, 1)])
def test_spread_misses_marks_t_minus_one_clients_per_partition(m, k, t):
    from fl_gradcode.codes.nested import spread_misses

    expected = np.zeros((m, k), dtype=bool)
    for x in range(k):
        for i in range(t - 1):
            expected[(x * (t - 1) + i) % m, x] = True
    got = spread_misses(m, k, t)
    assert got.dtype == bool
    np.testing.assert_array_equal(got, expected)


def test_the_holding_matrix_is_read_only():
    hold = NestedPlacement(12, 3).holding_matrix
    assert not hold.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        hold[0, 0] = False


def test_code_excluding_groups_tolerate_members_minus_threshold():
    code = NestedPlacement(24, 5).code_excluding(2, [0, 1, 13])
    assert code.groups
    for g in code.groups:
        assert g.tolerance == len(g.clients) - g.threshold
        assert g.tolerance >= 2


def test_the_nested_registry_entry_honours_the_seed():
    """``layout="window"`` with ``s > s_max/2`` draws a CRC: the seed must reach it."""
    a = make_code("nested", n=12, s=3, seed=3, layout="window")
    np.testing.assert_array_equal(a.B, NestedPlacement(12, 3, 3, layout="window").code(3).B)
    assert not np.array_equal(a.B, make_code("nested", n=12, s=3, seed=0, layout="window").B)


def test_straggler_patterns_default_to_seed_zero():
    sampled = list(straggler_patterns(20, 4, max_sets=10))
    assert len(sampled) == 20 + 10  # every contiguous burst, then the random sets
    assert sampled == list(straggler_patterns(20, 4, max_sets=10, seed=0))
    assert sampled != list(straggler_patterns(20, 4, max_sets=10, seed=1))
