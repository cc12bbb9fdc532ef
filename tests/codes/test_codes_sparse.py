"""``GradientCode.sparse_decoding``: exact decodings that read as few replies as possible.

Expected values come from the construction (an FRC group's rows are identical, so one reply per
group is the fewest possible), from a plain numpy check of ``a @ B[F] == 1`` and from the
weighted sum of encoded updates, never from the decoder under test.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from fl_gradcode.codes import make_code

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def exact_case(draw):
    name = draw(st.sampled_from(("crc", "grouped-rs", "frc", "uncoded")))
    if name == "frc":
        d = draw(st.integers(1, 6))
        n, s = d * draw(st.integers(1, 6)), d - 1
    elif name == "uncoded":
        n, s = draw(st.integers(1, 12)), 0
    else:
        n = draw(st.integers(1, 30 if name == "grouped-rs" else 12))
        s = draw(st.integers(0, n - 1))
    return name, n, s


@SETTINGS
@given(case=exact_case(), seed=st.integers(0, 2**31 - 1), data=st.data())
def test_sparse_decoding_is_exact_reads_a_subset_and_recovers_the_weighted_sum(case, seed, data):
    name, n, s = case
    k = make_code(name, n=n, s=s, seed=seed).k
    weights = data.draw(st.lists(st.floats(0.1, 10.0), min_size=k, max_size=k) | st.none())
    code = make_code(name, n=n, s=s, seed=seed, weights=weights)
    stragglers = data.draw(st.sets(st.integers(0, n - 1), max_size=s), label="stragglers")
    received = [i for i in range(n) if i not in stragglers]
    sparse = code.sparse_decoding(received)
    dense = code.decoding(received)
    a = np.asarray(sparse.coefficients)
    assert sparse.exact
    assert set(np.flatnonzero(a)) <= set(received)  # never reads a reply it does not hold
    assert np.count_nonzero(a) <= np.count_nonzero(np.asarray(dense.coefficients))
    np.testing.assert_allclose(a[received] @ code.B[received], 1.0, atol=1e-7)
    # decode encoded updates with it: the weighted sum, independent of which replicas are read
    rng = np.random.default_rng(seed % 2**32)
    updates = {j: rng.standard_normal(4) for j in range(k)}
    target = sum(code.weights[j] * updates[j] for j in range(k))
    decoded = sum(a[i] * code.encode(i, updates) for i in received)
    np.testing.assert_allclose(decoded, target, atol=1e-6 * (1 + np.abs(target).max()))


@pytest.mark.parametrize(("n", "s"), [(6, 1), (6, 2), (12, 3), (100, 19)])
def test_frc_reads_one_reply_per_group_for_every_decodable_set(n, s):
    code = make_code("frc", n=n, s=s)
    groups = n // (s + 1)
    sets = [range(n)] + [
        [i for i in range(n) if i not in drop]
        for drop in itertools.islice(itertools.combinations(range(n), s), 50)
    ]
    for received in sets:
        a = np.asarray(code.sparse_decoding(list(received)).coefficients)
        read = np.flatnonzero(a)
        assert len(read) == groups
        assert sorted({i // (s + 1) for i in read}) == list(range(groups))  # one per group
        np.testing.assert_array_equal(a[read], 1.0)


def test_grouped_rs_with_frc_groups_reads_n_over_s_plus_1_replies():
    code = make_code("grouped-rs", n=100, s=19)
    a = np.asarray(code.sparse_decoding(list(range(19, 100))).coefficients)
    assert np.count_nonzero(a) == 5
    assert np.count_nonzero(np.asarray(code.decoding(list(range(19, 100))).coefficients)) == 81


def test_cyclic_code_reads_n_minus_s_when_everyone_replied():
    n, s = 8, 2
    code = make_code("crc", n=n, s=s)
    a = np.asarray(code.sparse_decoding(list(range(n))).coefficients)
    # B has rank n - s over all n rows: no fewer rows can span the all-ones vector
    assert np.linalg.matrix_rank(code.B) == n - s
    assert np.count_nonzero(a) == n - s
    np.testing.assert_allclose(a @ code.B, 1.0, atol=1e-8)


@pytest.mark.parametrize("name", ["expander", "bgc", "ignore-stragglers"])
def test_sets_that_do_not_decode_exactly_keep_the_least_squares_decoding(name):
    code = make_code(name, n=12, s=3, seed=1)
    received = list(range(3, 12))
    sparse, dense = code.sparse_decoding(received), code.decoding(received)
    assert not dense.exact
    np.testing.assert_array_equal(sparse.coefficients, dense.coefficients)
    assert sparse.error == dense.error


# ======================================================================= incremental decodability
@SETTINGS
@given(
    name=st.sampled_from(("crc", "grouped-rs", "frc", "uncoded", "expander", "bgc",
                          "comm-efficient", "ignore-stragglers")),
    n=st.integers(2, 16),
    seed=st.integers(0, 10_000),
)
def test_tracker_agrees_with_is_decodable_on_every_prefix_of_an_arrival_order(name, n, seed):
    rng = np.random.default_rng(seed)
    if name == "frc":
        s = int(rng.choice([d for d in range(1, n + 1) if n % d == 0])) - 1
    elif name == "uncoded":
        s = 0
    else:
        s = int(rng.integers(0, n))
    options = {"m": 1 + int(rng.integers(0, n - s))} if name == "comm-efficient" else {}
    try:
        code = make_code(name, n=n, s=s, seed=seed, **options)
    except ValueError:  # a combination the construction does not exist for
        assume(False)
    tracker = code.tracker()
    order = rng.permutation(n).tolist()
    for t, worker in enumerate(order):
        assert tracker.add(worker) == code.is_decodable(order[: t + 1]), (order, t)
        assert tracker.add(worker) == tracker.decodable  # a repeated reply changes nothing


def test_tracker_decodes_frc_when_the_last_group_gets_its_first_reply():
    code = make_code("frc", n=6, s=1)  # groups (0, 1) (2, 3) (4, 5)
    tracker = code.tracker()
    assert [tracker.add(w) for w in (0, 1, 2, 3, 5)] == [False, False, False, False, True]


def test_a_fresh_tracker_decodes_nothing_and_waits_for_every_block():
    code = make_code("frc", n=6, s=1)
    tracker = code.tracker()
    assert tracker.decodable is False
    assert tracker.pending_blocks == {0, 1, 2}
    tracker.add(0)
    assert tracker.pending_blocks == {1, 2}


@SETTINGS
@given(
    name=st.sampled_from(("crc", "grouped-rs", "nested", "crc-weighted", "dense", "low-rank")),
    n=st.integers(2, 40),
    seed=st.integers(0, 10_000),
)
def test_tracker_with_the_span_prefilter_agrees_with_is_decodable_on_every_prefix(name, n, seed):
    """One-block codes (CRC, a dense random code, a rank-deficient one) and blockwise ones,
    up to n = 40, random arrival orders: the tracker says exactly what is_decodable says."""
    from fl_gradcode.codes import GradientCode

    rng = np.random.default_rng(seed)
    s = int(rng.integers(0, n))
    try:
        if name == "dense":
            code = GradientCode(rng.standard_normal((n, n)), s, is_exact=False)
        elif name == "low-rank":  # rows from a random subspace of dimension r: rarely decodes
            r = 1 + int(rng.integers(0, n))
            basis = np.vstack([np.ones(n), rng.standard_normal((r - 1, n))])
            code = GradientCode(rng.standard_normal((n, r)) @ basis, s, is_exact=False)
        elif name == "crc-weighted":
            code = make_code("crc", n=n, s=s, seed=seed, weights=rng.uniform(0.5, 5.0, n))
        else:
            code = make_code(name, n=n, s=s, seed=seed)
    except ValueError:
        assume(False)
    tracker = code.tracker()
    order = rng.permutation(n).tolist()
    for t, worker in enumerate(order):
        assert tracker.add(worker) == code.is_decodable(order[: t + 1]), (order, t)


@pytest.mark.parametrize(("name", "n", "s"), [("crc", 6, 2), ("crc", 7, 3), ("crc", 5, 1),
                                                ("grouped-rs", 7, 2), ("nested", 7, 2),
                                                ("expander", 7, 2)])
def test_tracker_agrees_with_is_decodable_on_every_received_set(name, n, s):
    """Exhaustive: every subset of clients, added in a seeded random order."""
    code = make_code(name, n=n, s=s, seed=3)
    rng = np.random.default_rng(0)
    for size in range(1, n + 1):
        for subset in itertools.combinations(range(n), size):
            order = rng.permutation(subset).tolist()
            tracker = code.tracker()
            for t, worker in enumerate(order):
                assert tracker.add(worker) == code.is_decodable(order[: t + 1]), order


def test_crc_tracker_solves_only_once_the_rows_can_span_the_ones_vector():
    """Fewer than n - s generic CRC rows never span the ones vector: the incremental basis
    says so without solving; the old tracker solved the whole set after every reply."""
    n, s = 40, 3
    code = make_code("crc", n=n, s=s, seed=0)
    calls = []
    solve = code.is_decodable
    code.is_decodable = lambda received: calls.append(len(received)) or solve(received)
    tracker = code.tracker()
    order = np.random.default_rng(1).permutation(n).tolist()
    decoded = [tracker.add(w) for w in order[: n - s + 1]]
    assert decoded == [False] * (n - s - 1) + [True, True]
    assert calls == [n - s, n - s + 1]


def test_row_span_distance_and_rank_match_numpy():
    from fl_gradcode.codes.span import RowSpan

    rng = np.random.default_rng(5)
    k = 9
    rows = rng.standard_normal((6, k))
    rows[3] = 2.0 * rows[0] - rows[1]  # dependent: adds no direction
    span = RowSpan(k)
    assert span.distance == pytest.approx(1.0) and not span.may_decode
    for t in range(rows.shape[0]):
        span.add(rows[t])
        block = rows[: t + 1]
        coef = np.linalg.lstsq(block.T, np.ones(k), rcond=None)[0]
        expected = np.linalg.norm(block.T @ coef - np.ones(k)) / np.sqrt(k)
        assert span.distance == pytest.approx(expected, rel=1e-9, abs=1e-12)
        assert span.rank == np.linalg.matrix_rank(block)
    span.add(np.ones(k))
    assert span.distance < 1e-14 and span.may_decode
    before = span.rank
    span.add(np.zeros(k))
    span.add(np.full(k, np.nan))
    assert span.rank == before


# ======== found by mutation testing ==============================================================
@pytest.mark.mutation_found("codes")
@pytest.mark.parametrize(("name", "n", "s"), [("frc", 6, 1), ("crc", 7, 2), ("grouped-rs", 8, 2)])
def test_sparse_decoding_is_computed_once_per_received_set(name, n, s):
    """The sparse decoding of a set is cached: asking again (in any order) returns the same
    object, and it still satisfies ``a @ B = 1`` (numpy) with no weight outside ``F``."""
    code = make_code(name, n=n, s=s, seed=1)
    received = list(range(s, n))
    first = code.sparse_decoding(received)
    assert code.sparse_decoding(received[::-1]) is first
    a = np.asarray(first.coefficients, dtype=np.float64)
    np.testing.assert_allclose(a @ code.B, np.ones(code.k), atol=1e-9)
    assert not np.any(a[:s])
