"""Exact gradient codes: every straggler pattern, load bounds, weighted sums, stability."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from fl_gradcode.codes import (
    CyclicRepetitionCode,
    GroupedReedSolomonCode,
    NotDecodableError,
    make_code,
    sampled_amplification,
    straggler_patterns,
)
from fl_gradcode.codes.repetition import frc_matrix
from fl_gradcode.codes.stable import rs_amplification


def rel_err(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.linalg.norm(x - y) / np.linalg.norm(y))


def encode_all(code, rng, length=7):
    updates = {j: rng.standard_normal(length) for j in range(code.k)}
    target = sum(code.weights[j] * updates[j] for j in range(code.k))
    replies = {i: code.encode(i, updates) for i in range(code.n)}
    return updates, target, replies


# (name, n, s) for every exact code at small n; FRC only where (s+1) | n.
SMALL = [("frc", n, s) for n in range(2, 13) for s in range(n) if n % (s + 1) == 0]
SMALL += [(name, n, s) for name in ("crc", "grouped-rs") for n in (5, 8, 11, 12) for s in range(n)]
SMALL += [("comm-efficient", n, s) for n in (6, 9, 12) for s in range(n - 1) if s + 2 <= n]
SMALL += [("uncoded", n, 0) for n in (1, 5, 12)]


@pytest.mark.parametrize(("name", "n", "s"), SMALL)
def test_exact_code_decodes_every_straggler_set_up_to_s(name, n, s):
    code = make_code(name, n=n, s=s, seed=3)
    assert code.is_exact
    rng = np.random.default_rng(n * 100 + s)
    _, target, replies = encode_all(code, rng)
    for size in range(s + 1):
        for stragglers in itertools.combinations(range(n), size):
            got = {i: r for i, r in replies.items() if i not in stragglers}
            assert code.is_decodable(got)
            decoded = code.decode(got)
            assert decoded.shape == target.shape
            assert rel_err(decoded, target) <= 1e-10, (stragglers, rel_err(decoded, target))


@pytest.mark.parametrize(("name", "n", "s"), [c for c in SMALL if c[0] in ("frc", "crc")])
def test_repetition_codes_have_exactly_s_plus_1_nonzeros_per_row(name, n, s):
    code = make_code(name, n=n, s=s, seed=1)
    assert code.k == n
    assert all(len(code.assignment(i)) == s + 1 for i in range(n))
    assert np.all(np.count_nonzero(code.B, axis=1) == s + 1)


@pytest.mark.parametrize(("name", "n", "s"), [c for c in SMALL if c[0] != "uncoded"])
def test_every_partition_is_held_by_at_least_s_plus_1_clients(name, n, s):
    """The load lower bound: a partition held by <= s clients can be wiped out."""
    code = make_code(name, n=n, s=s, seed=1)
    assert np.all(np.count_nonzero(code.B, axis=0) >= s + 1)
    assert code.load_fraction >= (s + 1) / n - 1e-12


@pytest.mark.parametrize(("n", "s"), [(8, 2), (11, 3), (12, 4)])
def test_crc_rejects_every_set_of_n_minus_s_minus_1_replies(n, s):
    """CRC's rows span an (n-s)-dimensional space: fewer replies cannot decode."""
    code = make_code("crc", n=n, s=s, seed=0)
    assert np.linalg.matrix_rank(code.B) == n - s
    for got in itertools.combinations(range(n), n - s - 1):
        assert not code.is_decodable(got)
        with pytest.raises(NotDecodableError):
            code.decoding_vector(got)


@pytest.mark.parametrize(("n", "s"), [(12, 2), (12, 3), (6, 1)])
def test_frc_decodes_iff_every_group_replies(n, s):
    code = make_code("frc", n=n, s=s)
    d = s + 1
    for size in range(n + 1):
        for got in itertools.combinations(range(n), size):
            covered = len({i // d for i in got}) == n // d
            assert code.is_decodable(got) == covered
            # the closed-form check agrees with the least-squares decoder
            assert code.decoding(got).exact == covered


@pytest.mark.parametrize(("n", "s"), [(10, 3), (11, 4), (12, 6), (9, 2)])
def test_grouped_rs_decodes_iff_each_group_keeps_t_distinct_rows(n, s):
    code = GroupedReedSolomonCode(n, s)
    # reconstruct the distinct-row classes of each group from B
    groups = []
    for clients, _ in code.blocks:
        rows = {}
        for i in clients:
            rows.setdefault(code.B[i].tobytes(), []).append(i)
        groups.append(list(rows.values()))
    ts = [p.t for p in code.plans]
    for got in itertools.combinations(range(n), n - s - 1):
        alive = set(got)
        expected = all(
            sum(any(i in alive for i in cls) for cls in classes) >= t
            for classes, t in zip(groups, ts, strict=True)
        )
        assert code.is_decodable(got) == expected


def test_grouped_rs_is_frc_when_s_plus_1_divides_n():
    code = make_code("grouped-rs", n=12, s=3)
    np.testing.assert_array_equal(code.B, make_code("frc", n=12, s=3).B)


@pytest.mark.parametrize(("n", "s"), [(10, 3), (12, 6), (7, 2), (13, 4), (16, 5)])
def test_grouped_rs_meets_optimal_load_at_small_n(n, s):
    # without the float32 budget, which trades load for float32 replies at (13, 4), (16, 5)
    code = make_code("grouped-rs", n=n, s=s, max_relative_amplification=None)
    assert code.k == n
    assert code.load == s + 1
    assert code.load_overhead == pytest.approx(1.0)


@pytest.mark.parametrize("s", [1, 2, 5, 16, 31, 32, 48, 63, 64, 100, 128, 200, 255])
def test_grouped_rs_is_stable_at_n256_over_random_sets_and_bursts(s):
    n = 256
    code = make_code("grouped-rs", n=n, s=s)
    assert code.amplification <= 1e5
    assert code.load_overhead < 2.0
    rng = np.random.default_rng(s)
    U = rng.standard_normal((code.k, 16))
    target = code.weights @ U
    replies = code.B @ (code.weights[:, None] * U)
    worst = 0.0
    for stragglers in straggler_patterns(n, s, max_sets=40, seed=s):
        alive = [i for i in range(n) if i not in stragglers]
        a = code.decoding_vector(alive)
        worst = max(worst, rel_err(a @ replies[alive], target))
    assert worst <= 1e-10


@pytest.mark.parametrize("n", [13, 16])
def test_grouped_rs_is_stable_over_all_straggler_sets_at_small_n(n):
    rng = np.random.default_rng(n)
    for s in range(n):
        code = make_code("grouped-rs", n=n, s=s)
        U = rng.standard_normal((code.k, 8))
        target = U.sum(axis=0)
        replies = code.B @ U
        for stragglers in itertools.combinations(range(n), s):
            alive = [i for i in range(n) if i not in stragglers]
            a = code.decoding_vector(alive)
            assert rel_err(a @ replies[alive], target) <= 1e-10


def test_rs_amplification_bound_is_attained_by_adjacent_nodes():
    """The stability argument: the bound is the exact worst case of sum|a_w| * max|B|."""
    from fl_gradcode.codes.stable import rs_block

    s, t = 6, 3
    m = s + t
    B = rs_block(s, t)
    worst = 0.0
    for rows in itertools.combinations(range(m), t):
        a = np.linalg.lstsq(B[list(rows)].T, np.ones(m), rcond=None)[0]
        assert np.allclose(a @ B[list(rows)], 1.0)
        worst = max(worst, np.abs(a).sum())
    x = np.linspace(-1, 1, m)
    assert worst == pytest.approx((m - 1) ** (t - 1) / 2)  # (m-1)^(t-1)/(t-1)!
    assert np.abs(B).max() <= 2 ** (t - 1) + 1e-12
    assert rs_amplification(m, t) == pytest.approx(worst * 2 ** (t - 1))
    assert x[1] - x[0] == pytest.approx(2 / (m - 1))


@pytest.mark.parametrize("name", ["frc", "crc", "grouped-rs", "comm-efficient"])
def test_weighted_sum_is_recovered_exactly(name):
    n, s = 12, 2
    rng = np.random.default_rng(7)
    k = make_code(name, n=n, s=s).k
    weights = rng.uniform(0.1, 5.0, size=k)
    code = make_code(name, n=n, s=s, weights=weights)
    updates = {j: rng.standard_normal(9) for j in range(k)}
    target = sum(weights[j] * updates[j] for j in range(k))
    replies = {i: code.encode(i, updates) for i in range(n) if i not in (0, 5)}
    assert rel_err(code.decode(replies), target) <= 1e-10


@pytest.mark.parametrize("name", ["frc", "crc", "grouped-rs"])
def test_decoding_vector_is_aligned_with_the_order_of_received(name):
    code = make_code(name, n=12, s=3)
    received = [11, 3, 7, 0, 5, 9, 1, 4, 2]
    a = code.decoding_vector(received)
    np.testing.assert_allclose(a @ code.B[received], np.ones(code.k), atol=1e-10)
    a_set = code.decoding_vector(frozenset(received))
    np.testing.assert_allclose(a_set @ code.B[list(frozenset(received))], 1.0, atol=1e-10)


def test_decoding_vectors_are_cached_per_received_set():
    code = make_code("crc", n=20, s=4)
    first = code.decoding(range(4, 20))
    again = code.decoding(reversed(range(4, 20)))
    assert again is first
    assert code.decoding(range(0, 16)) is not first


def test_condition_number_diagnostic_flags_crc_but_not_grouped_rs():
    n, s = 48, 11
    stragglers = set(range(s))
    alive = [i for i in range(n) if i not in stragglers]
    crc = make_code("crc", n=n, s=s, seed=0).condition_number(alive)
    grs = make_code("grouped-rs", n=n, s=s).condition_number(alive)
    assert grs < 1e3 < crc


@pytest.mark.parametrize("name", ["crc", "grouped-rs", "comm-efficient", "bgc"])
def test_with_weights_equals_building_with_those_weights(name):
    rng = np.random.default_rng(4)
    code = make_code(name, n=9, s=2, seed=5)
    w = rng.uniform(0.2, 3.0, size=code.k)
    direct = make_code(name, n=9, s=2, seed=5, weights=w)
    reweighted = code.with_weights(w)
    np.testing.assert_array_equal(reweighted.B, direct.B)
    np.testing.assert_array_equal(reweighted.weights, w)
    np.testing.assert_array_equal(code.weights, np.ones(code.k))  # the original is unchanged
    updates = {j: rng.standard_normal(5) for j in range(code.k)}
    replies = {i: direct.encode(i, updates) for i in range(9) if i not in (1, 4)}
    np.testing.assert_allclose(
        reweighted.decode(replies, approximate=True, length=5),
        direct.decode(replies, approximate=True, length=5),
    )
    alive = [0, 2, 3, 5, 6, 7]
    assert reweighted.decoding_error(alive) == pytest.approx(direct.decoding_error(alive))


# ======== edges: exact values, bounds and messages ===============================================
def test_frc_groups_are_consecutive_clients_sharing_consecutive_partitions():
    """Tandon et al. Sec. 3: client ``i`` holds partitions ``d*(i//d) .. d*(i//d)+d-1``
    (``d = s+1``), all with coefficient 1. Reference: the matrix built entry by entry."""
    for n, s in [(6, 1), (6, 2), (12, 3)]:
        d = s + 1
        expected = np.array(
            [[1.0 if i // d == j // d else 0.0 for j in range(n)] for i in range(n)]
        )
        np.testing.assert_array_equal(frc_matrix(n, s), expected)
        np.testing.assert_array_equal(make_code("frc", n=n, s=s).B, expected)


def _amplification_of(B: np.ndarray, received: list[int]) -> float:
    """``sum_i |a_i| ||B_i||_1 / k`` for numpy's minimum-norm ``a`` with ``a @ B_F = 1``."""
    a = np.linalg.lstsq(B[received].T, np.ones(B.shape[1]), rcond=None)[0]
    return float(np.abs(a) @ np.abs(B[received]).sum(axis=1)) / B.shape[1]


@pytest.mark.parametrize(("name", "n", "s", "bounded"),
                         [("frc", 6, 1, True), ("uncoded", 5, 0, True), ("crc", 6, 2, False)])
def test_sampled_amplification_weighs_each_reply_by_its_own_row(name, n, s, bounded):
    """``max_F sum_i |a_i| ||B_i||_1 / k`` over the sampled sets: 1 for FRC and uncoded (0/1
    decoding), and for CRC between its value on all clients and the maximum over every set of
    ``n - s`` (numpy least squares, each reply weighted by its OWN row's l1 norm)."""
    code = make_code(name, n=n, s=s, seed=2)
    value = sampled_amplification(code, seed=0)
    if bounded:
        assert value == pytest.approx(1.0, abs=1e-12)
        return
    B = np.asarray(code.B)
    low = _amplification_of(B, list(range(n)))
    high = max(_amplification_of(B, [i for i in range(n) if i not in st])
               for st in itertools.combinations(range(n), s))
    assert low - 1e-9 <= value <= max(low, high) + 1e-9
    assert high > 1.0


def test_crc_with_several_draws_keeps_the_best_screened_matrix():
    """n=7, s=2: C(7, 2) = 21 <= 64 straggler sets, so screening covers all of them: the kept
    ``B`` has worst condition number (numpy, over every set of n - s rows) equal to
    ``screened_condition``, and no larger than a single draw's."""
    n, s = 7, 2
    code = CyclicRepetitionCode(n, s, seed=5, draws=4)
    single = CyclicRepetitionCode(n, s, seed=5, draws=1)

    def worst(B):
        return max(np.linalg.cond(B[[i for i in range(n) if i not in st]])
                   for st in itertools.combinations(range(n), s))

    assert code.screened_condition == pytest.approx(worst(np.asarray(code.B)), rel=1e-9)
    assert code.screened_condition <= worst(np.asarray(single.B)) * (1 + 1e-9)


def test_plan_groups_raises_t_while_the_amplification_is_exactly_at_the_budget():
    """n=5, s=1: one spare client; t=2 costs (2*(3-1))^1/1! = 4, within a budget of 4."""
    from fl_gradcode.codes.stable import plan_groups

    assert [p.t for p in plan_groups(5, 1, 4.0)] == [2, 1]
    assert [p.t for p in plan_groups(5, 1, 3.999)] == [1, 1]


def test_plan_groups_never_lowers_a_threshold_below_one():
    """A relative bound no plan meets leaves every threshold at its floor t=1 (FRC groups),
    the spare clients as copies."""
    from fl_gradcode.codes.stable import plan_groups

    plans = plan_groups(4, 2, 10.0, 1.0, max_load_overhead=10.0)
    assert [(p.t, p.copies) for p in plans] == [(1, 1)]
