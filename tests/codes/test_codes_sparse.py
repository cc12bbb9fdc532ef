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


def _count_solves(code) -> list[int]:
    """The sizes of the sets ``code.is_decodable`` is asked about from now on."""
    calls: list[int] = []
    solve = code.is_decodable
    code.is_decodable = lambda received: calls.append(len(received)) or solve(received)
    return calls


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_crc_tracker_solves_only_once_the_rows_can_span_the_ones_vector(seed):
    """Fewer than n - s generic CRC rows never span the ones vector: the basis (built at once
    when the rows first cover every partition, counted here with numpy) says so without
    solving (a failing CRC solve costs ~20 ms at n = 100); the first tracker solved the whole
    set after every reply."""
    n, s = 40, 3
    code = make_code("crc", n=n, s=s, seed=0)
    calls = _count_solves(code)
    tracker = code.tracker()
    order = np.random.default_rng(seed).permutation(n).tolist()
    decoded = [tracker.add(w) for w in order[: n - s + 1]]
    assert decoded == [False] * (n - s - 1) + [True, True]
    held = np.cumsum(code.B[order] != 0, axis=0) > 0
    covered = 1 + int(np.argmax(held.all(axis=1)))  # rows until every partition is held
    assert covered < n - s  # the basis is built before the set decodes
    assert calls == [n - s, n - s + 1]


def test_crc_tracker_in_push_order_solves_once():
    """Replies in client order cover the last partition with the (n - s)-th reply: one
    solve, then."""
    n, s = 100, 2
    code = make_code("crc", n=n, s=s, seed=0)
    calls = _count_solves(code)
    tracker = code.tracker()
    assert [tracker.add(w) for w in range(n - s)] == [False] * (n - s - 1) + [True]
    assert calls == [n - s]


@pytest.mark.parametrize(("name", "n", "s"), [("nested", 40, 4), ("grouped-rs", 40, 4),
                                                ("nested", 30, 3)])
def test_a_block_is_solved_only_once_covered_and_again_only_once_its_rows_can_span(name, n, s):
    """Every block solve happens on a covered block (numpy count), at most one of them
    before the rows' span can hold the ones vector (a numpy lstsq residual); the tracker still
    agrees with is_decodable on every prefix."""
    code = make_code(name, n=n, s=s, seed=0)
    calls = []
    solve = code.block_decodes
    code.block_decodes = lambda b, rows: calls.append((b, rows)) or solve(b, rows)
    tracker = code.tracker()
    order = np.random.default_rng(5).permutation(n).tolist()
    for t, w in enumerate(order):
        assert tracker.add(w) == code.is_decodable(order[: t + 1])
    far = {}
    for b, rows in calls:
        parts = list(code.blocks[b][1])
        sub = code.B[np.ix_(sorted(rows), parts)]
        assert (np.abs(sub).sum(axis=0) > 0).all()  # covered
        coef = np.linalg.lstsq(sub.T, np.ones(len(parts)), rcond=None)[0]
        if np.linalg.norm(coef @ sub - 1) > 1e-3 * np.sqrt(len(parts)):
            far[b] = far.get(b, 0) + 1
    assert all(count == 1 for count in far.values()), far
    assert len(calls) < n  # the old tracker solved a block on every reply


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


@SETTINGS
@given(seed=st.integers(0, 10_000), blocks=st.integers(1, 6), width=st.integers(1, 5),
       scale=st.sampled_from((1e-150, 1e-3, 1.0, 1e3, 1e150)))
def test_one_row_blocks_decode_to_numpys_least_squares(seed, blocks, width, scale):
    """Every block a single client holding ``width`` partitions (random values, some rows
    proportional to the weights, some not; one all-zero client): the per-block coefficients
    are numpy's weighted least-squares solution, and exactness is its residual's."""
    from fl_gradcode.codes import GradientCode

    rng = np.random.default_rng(seed)
    k = blocks * width
    weights = rng.uniform(0.5, 2.0, k)
    B = np.zeros((blocks + 1, k))
    for b in range(blocks):
        cols = slice(b * width, (b + 1) * width)
        B[b, cols] = (rng.uniform(0.5, 2.0) if rng.random() < 0.5
                      else rng.uniform(0.5, 2.0, width)) * scale
    code = GradientCode(B, 0, is_exact=False, weights=weights)
    dec = code.decoding(range(blocks + 1))
    for b in range(blocks):
        cols = slice(b * width, (b + 1) * width)
        m, w = B[b, cols] * weights[cols], weights[cols]
        want = np.linalg.lstsq(m[:, None], w, rcond=None)[0][0]
        assert dec.coefficients[b] == pytest.approx(want, rel=1e-12)
    assert dec.coefficients[blocks] == 0.0
    alpha = dec.coefficients @ B
    assert dec.exact == bool(np.max(np.abs(alpha - 1.0)) <= 1e-8)


@SETTINGS
@given(seed=st.integers(0, 10_000), k=st.integers(1, 12), m=st.integers(1, 14),
       kind=st.sampled_from(("generic", "low-rank", "with-zeros", "ones-inside")))
def test_row_span_built_at_once_never_lies_farther_from_ones_than_numpys_projection(
        seed, k, m, kind):
    """``add_rows`` on an empty span: the distance of the ones vector is never above the true
    one (numpy lstsq projection: refusing a decodable set is impossible), equal to it for
    independent rows, and rows added afterwards one at a time keep that guarantee."""
    from fl_gradcode.codes.span import RowSpan

    rng = np.random.default_rng(seed)
    rows = rng.standard_normal((m, k))
    if kind == "low-rank":
        rows = rng.standard_normal((m, 1)) @ rng.standard_normal((1, k)) * 3.0
    elif kind == "with-zeros":
        rows[rng.random(m) < 0.5] = 0.0
    elif kind == "ones-inside":
        rows[0] = np.ones(k) * rng.uniform(0.1, 10.0)
    extra = rng.standard_normal((2, k))

    def true_distance(r):
        r = r[np.abs(r).sum(axis=1) > 0]
        if not len(r):
            return 1.0
        coef = np.linalg.lstsq(r.T, np.ones(k), rcond=None)[0]
        return float(np.linalg.norm(np.ones(k) - r.T @ coef) / np.sqrt(k))

    span = RowSpan(k)
    span.add_rows(rows)
    want = true_distance(rows)
    assert span.distance <= want + 1e-9
    if kind == "generic" and m <= k:
        assert span.distance == pytest.approx(want, abs=1e-9)
    if kind == "ones-inside":
        assert span.may_decode
    for row in extra:
        span.add(row)
    assert span.distance <= true_distance(np.vstack([rows, extra])) + 1e-9


def test_row_span_add_rows_checks_the_shape():
    from fl_gradcode.codes.span import RowSpan

    with pytest.raises(ValueError, match=r"rows must have shape \(m, 3\); got \(2, 4\)"):
        RowSpan(3).add_rows(np.ones((2, 4)))


@pytest.mark.parametrize(("n", "s", "m"), [(7, 1, 2), (8, 2, 2), (9, 1, 3)])
def test_comm_efficient_necessary_counts_hold_on_every_received_set(n, s, m):
    """Exhaustive: a set with fewer than m members of some group never decodes (the claim
    the tracker relies on, checked against is_decodable)."""
    code = make_code("comm-efficient", n=n, s=s, seed=1, m=m)
    needs = code.necessary_counts()
    assert sorted(c for clients, _ in needs for c in clients) == sorted(
        c for c in range(n) if code.B[c].any())
    for size in range(n + 1):
        for subset in itertools.combinations(range(n), size):
            got = set(subset)
            if any(len(got & set(clients)) < count for clients, count in needs):
                assert not code.is_decodable(subset), subset


def test_comm_efficient_tracker_solves_only_once_every_group_has_m_replies():
    n, s, m = 40, 2, 3
    code = make_code("comm-efficient", n=n, s=s, seed=0, m=m)
    calls = []
    solve = code.is_decodable
    code.is_decodable = lambda received: calls.append(len(received)) or solve(received)
    tracker = code.tracker()
    order = np.random.default_rng(2).permutation(n).tolist()
    groups = [set(clients) for clients, _ in code.necessary_counts()]
    first = next(t for t in range(1, n + 1)  # numpy-free count: every group has m replies
                 if all(len(g & set(order[:t])) >= m for g in groups))
    for t, w in enumerate(order):
        assert tracker.add(w) == solve(order[: t + 1])
    assert calls and min(calls) == first
    assert len(calls) == n - first + 1
    assert make_code("crc", n=6, s=1).necessary_counts() == []


# ======== edges: exact values, bounds and messages ===============================================
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


def test_a_one_row_block_with_entries_below_one_is_solved_in_closed_form(monkeypatch):
    """A one-row block (an FRC-shaped group's first reply) is solved as ``m.w / m.m`` without
    LAPACK, whatever the scale of ``m`` (here ``m.m = 0.5 < 1``); the coefficient is the
    numpy ratio."""
    import scipy.linalg

    from fl_gradcode.codes import GradientCode

    B = np.kron(np.eye(2), np.full((2, 2), 0.5))  # two groups of two clients, entries 1/2
    code = GradientCode(B, 1, is_exact=True)
    calls = []
    lstsq = scipy.linalg.lstsq
    monkeypatch.setattr(scipy.linalg, "lstsq", lambda *a, **k: calls.append(1) or lstsq(*a, **k))
    dec = code.decoding([0, 2])
    assert calls == []
    m, w = B[0, :2], np.ones(2)
    np.testing.assert_allclose(dec.coefficients, [m.dot(w) / m.dot(m), 0, 2.0, 0], rtol=1e-15)
    assert dec.exact


def test_sparse_decoding_of_a_reweighted_code_reads_one_reply_per_group():
    code = make_code("frc", n=6, s=1).with_weights([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    dec = code.sparse_decoding(range(6))
    assert dec.exact
    assert np.count_nonzero(dec.coefficients) == 3
    assert code.sparse_decoding(range(6)) is dec  # cached per received set


@pytest.mark.parametrize(("n", "s", "seed"), [(11, 3, 0), (14, 4, 1), (19, 4, 2)])
def test_tracker_of_rs_groups_covered_before_they_decode_matches_numpy(n, s, seed):
    """grouped-rs groups with t >= 2 are covered by fewer than t rows: the first solve fails
    and the block's span is built from its received rows; every prefix then decodes exactly
    when numpy's least squares finds ``a @ B[F] = 1``."""
    code = make_code("grouped-rs", n=n, s=s, seed=0)
    assert len(code.blocks) > 1
    tracker = code.tracker()
    order = np.random.default_rng(seed).permutation(n).tolist()
    for t, worker in enumerate(order):
        sub = code.B[order[: t + 1]]
        a = np.linalg.lstsq(sub.T, np.ones(code.k), rcond=None)[0]
        assert tracker.add(worker) == bool(np.max(np.abs(a @ sub - 1)) < 1e-8), (order, t)
