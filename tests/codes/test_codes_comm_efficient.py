"""Communication-efficient gradient coding: short replies, exact from any n - s."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from fl_gradcode.codes import NotDecodableError, make_code


@pytest.mark.parametrize(("n", "s", "m"), [(12, 2, 2), (12, 1, 3), (10, 3, 2), (9, 0, 3)])
@pytest.mark.parametrize("length", [12, 13, 1])
def test_exact_from_every_set_of_n_minus_s_with_short_replies(n, s, m, length):
    code = make_code("comm-efficient", n=n, s=s, m=m, seed=0)
    rng = np.random.default_rng(n + s + m + length)
    updates = {j: rng.standard_normal(length) for j in range(code.k)}
    target = sum(updates.values())
    replies = {i: code.encode(i, updates) for i in range(n)}
    assert {r.shape for r in replies.values()} == {(-(-length // m),)}
    assert code.message_length(length) == -(-length // m)
    for stragglers in itertools.combinations(range(n), s):
        got = {i: r for i, r in replies.items() if i not in stragglers}
        decoded = code.decode(got)  # length remembered from encode on this object
        assert decoded.shape == (length,)
        np.testing.assert_allclose(decoded, target, rtol=1e-10, atol=1e-10)


def test_load_is_s_plus_m_and_each_group_tolerates_s():
    code = make_code("comm-efficient", n=12, s=2, m=2)
    assert code.load == 4
    assert code.k == 12
    assert all(len(code.assignment(i)) == 4 for i in range(12))


def test_explicit_dim_and_length_trim_padding_and_mismatch_is_rejected():
    code = make_code("comm-efficient", n=6, s=1, m=2, dim=5)
    updates = {j: np.arange(5.0) + j for j in range(code.k)}
    replies = {i: code.encode(i, updates) for i in range(6)}
    np.testing.assert_allclose(code.decode(replies), sum(updates.values()))
    padded = code.decode(replies, length=6)
    assert padded.shape == (6,) and padded[-1] == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="length=9 does not match replies of length 3"):
        code.decode(replies, length=9)


def test_too_few_replies_in_a_group_is_not_decodable():
    code = make_code("comm-efficient", n=8, s=2, m=2)  # 2 groups of 4
    alive = [0, 4, 5, 6, 7]  # group 0 keeps 1 < m replies
    assert not code.is_decodable(alive)
    with pytest.raises(NotDecodableError):
        code.decoding_vector(alive)
    assert code.decoding_error(alive) > 0.0
    assert code.condition_number(alive) == float("inf")


def test_decoding_matrix_recovers_each_chunk():
    code = make_code("comm-efficient", n=10, s=2, m=3, seed=1)
    alive = [0, 2, 3, 5, 6, 7, 8, 9]
    D = code.decoding_vector(alive)
    assert D.shape == (3, len(alive))
    updates = {j: np.random.default_rng(j).standard_normal(6) for j in range(code.k)}
    replies = np.array([code.encode(i, updates) for i in alive])
    np.testing.assert_allclose((D @ replies).reshape(-1), sum(updates.values()), atol=1e-10)


def test_group_generators_are_well_conditioned_at_large_n():
    code = make_code("comm-efficient", n=240, s=18, m=2, seed=0)
    assert code.screened_condition < 1e3
    rng = np.random.default_rng(0)
    updates = {j: rng.standard_normal(11) for j in range(code.k)}
    target = sum(updates.values())
    replies = {i: code.encode(i, updates) for i in range(code.n)}
    for start in range(0, 240, 37):  # contiguous bursts of s
        stragglers = {(start + t) % 240 for t in range(18)}
        got = {i: r for i, r in replies.items() if i not in stragglers}
        np.testing.assert_allclose(code.decode(got), target, rtol=1e-10, atol=1e-10)


# ======== edges: exact values, bounds and messages ===============================================
def test_comm_efficient_condition_number_is_that_of_the_received_generator_columns():
    """One group of six members (n=6, s=2, m=2: load 4, a Gaussian 2 x 6 generator): the
    condition number of a received set is ``cond(Gamma[:, T])``; with fewer than m = 2 replies
    the group's system is singular."""
    code = make_code("comm-efficient", 6, 2, m=2)
    (gamma,) = code.gammas
    assert gamma.shape == (2, 6)
    for received in ([0, 3], [1, 2, 5], list(range(6))):
        assert code.condition_number(received) == np.linalg.cond(gamma[:, received])
    assert code.condition_number([4]) == float("inf")


def test_chunk_coefficients_are_the_generator_column_of_the_clients_position():
    """Two groups of five (n=10, s=3, m=2): client ``i`` at position ``t`` of group ``g`` has
    ``Gamma_g[:, t]``, and its reply is that combination of its group sum's two chunks."""
    code = make_code("comm-efficient", 10, 3, m=2, seed=4)
    assert len(code.gammas) == 2
    rng = np.random.default_rng(0)
    updates = {j: rng.standard_normal(6) for j in range(code.k)}
    for i in range(10):
        g, t = divmod(i, 5)
        np.testing.assert_array_equal(code.chunk_coefficients(i), code.gammas[g][:, t])
        group_sum = sum(updates[j] for j in range(g * 5, g * 5 + 5))
        np.testing.assert_allclose(code.encode(i, updates),
                                   code.gammas[g][:, t] @ group_sum.reshape(2, 3), atol=1e-12)
    with pytest.raises(ValueError, match=r"10"):
        code.chunk_coefficients(10)


def test_approximate_decoding_vector_decodes_complete_groups_and_leaves_the_others_out():
    """Columns aligned with the order of ``received``: per group with at least m replies,
    numpy's least-squares solution ``D`` of ``Gamma[:, T]^T D^T = I`` (exact); a group with
    fewer replies gets zero columns (a fit of m chunks from fewer mixtures would mix them)."""
    code = make_code("comm-efficient", 10, 2, m=3, seed=1)  # two groups of five, m=3
    assert [g.shape for g in code.gammas] == [(3, 5), (3, 5)]
    received = [7, 0, 3, 2, 8]  # group 0: {0, 2, 3} (m of them), group 1: {7, 8} (< m)
    D = code.approximate_decoding_vector(received)
    assert D.shape == (3, 5)
    members = [0, 3, 2]
    cols = [received.index(c) for c in members]
    expected = np.linalg.lstsq(code.gammas[0][:, members], np.eye(3), rcond=None)[0].T
    np.testing.assert_allclose(D[:, cols], expected, atol=1e-10)
    np.testing.assert_allclose(D[:, [1, 2, 3]] @ code.gammas[0][:, [0, 3, 2]].T, np.eye(3),
                               atol=1e-10)
    assert not D[:, [received.index(7), received.index(8)]].any()
    assert code.approximate_decoding_vector([]).shape == (3, 0)


@pytest.mark.parametrize(("n", "s", "m"), [(8, 2, 2), (9, 1, 2), (10, 2, 3)])
def test_an_approximate_decode_is_the_exact_sum_of_the_groups_with_m_replies(n, s, m):
    """Every received set (exhaustive): the approximate decode is ``sum_j w_j u_j`` over the
    partitions of the groups that sent at least m replies (numpy sums of the updates, from
    the code's assignment, as the reference), and ``alpha`` is 1 on them and 0 elsewhere."""
    weights = np.arange(1.0, 1.0 + (n // (s + m)) * (s + m))
    code = make_code("comm-efficient", n=n, s=s, m=m, seed=2, weights=weights)
    rng = np.random.default_rng(n * 100 + s * 10 + m)
    length = 7
    updates = {j: rng.standard_normal(length) for j in range(code.k)}
    replies = {i: code.encode(i, updates) for i in range(n)}
    groups = {}
    for i in range(n):
        groups.setdefault(tuple(sorted(code.assignment(i))), []).append(i)
    for size in range(n + 1):
        for got in itertools.combinations(range(n), size):
            complete = [j for parts, members in groups.items()
                        if sum(i in got for i in members) >= m for j in parts]
            target = sum((weights[j] * updates[j] for j in complete), np.zeros(length))
            decoded = code.decode({i: replies[i] for i in got}, approximate=True,
                                  length=length)
            np.testing.assert_allclose(decoded, target, rtol=1e-9, atol=1e-9)
            if got:
                alpha = code.decoding(got).alpha
                np.testing.assert_allclose(alpha, np.isin(np.arange(code.k), complete),
                                           atol=1e-9)


def test_decode_of_too_few_replies_names_the_count_and_the_way_out():
    code = make_code("comm-efficient", 6, 2, m=2)
    replies = {i: np.ones(3) for i in (0,)}
    with pytest.raises(NotDecodableError, match=r"^replies from 1 clients leave a group with "
                       r"fewer than m=2 replies; pass approximate=True to accept a partial sum$"):
        code.decode(replies)


@pytest.mark.parametrize(("n", "s", "m"), [(7, 1, 2), (10, 1, 2), (11, 2, 3), (5, 0, 3), (9, 3, 1)])
def test_own_partitions_code_every_clients_partition_from_any_n_minus_s(n, s, m):
    """s + m does not divide n: with own_partitions the code has one partition per client
    (k = n) and still decodes the weighted sum of all n from any n - s short replies."""
    code = make_code("comm-efficient", n=n, s=s, m=m, seed=2, own_partitions=True,
                     weights=np.arange(1.0, n + 1.0))
    assert code.k == n
    rng = np.random.default_rng(n * 7 + s)
    updates = {j: rng.standard_normal(11) for j in range(n)}
    target = sum((j + 1.0) * updates[j] for j in range(n))  # weights 1..n, by hand
    replies = {i: code.encode(i, updates) for i in range(n)}
    assert {r.shape for r in replies.values()} == {(-(-11 // m),)}
    for stragglers in itertools.combinations(range(n), s):
        got = {i: r for i, r in replies.items() if i not in stragglers}
        np.testing.assert_allclose(code.decode(got), target, rtol=1e-9, atol=1e-9)
    # every client computes the partitions of its group of consecutive clients, itself in it
    for i in range(n):
        mine = set(code.assignment(i))
        assert i in mine and len(mine) >= s + m
        assert mine == set(range(min(mine), max(mine) + 1))


def test_own_partitions_missing_group_loses_its_own_share():
    """n = 7, s = 1, m = 2: groups of 4 and 3 clients. Losing the whole group of 3 loses
    exactly its 3 partitions: the approximate decode is the other group's sum."""
    code = make_code("comm-efficient", n=7, s=1, m=2, own_partitions=True)
    groups = sorted({tuple(code.assignment(i)) for i in range(7)})
    assert [len(g) for g in groups] == [4, 3]
    updates = {j: np.full(4, 10.0 ** j) for j in range(7)}
    replies = {i: code.encode(i, updates) for i in range(4)}
    got = code.decode(replies, approximate=True)
    np.testing.assert_allclose(got, sum(updates[j] for j in range(4)), rtol=1e-9)
    assert not code.is_decodable(list(replies))


def test_own_partitions_is_the_same_code_when_s_plus_m_divides_n():
    a = make_code("comm-efficient", n=12, s=2, m=2, seed=4)
    b = make_code("comm-efficient", n=12, s=2, m=2, seed=4, own_partitions=True)
    np.testing.assert_array_equal(a.B, b.B)
    with pytest.raises(ValueError, match="own_partitions='yes' must be True or False"):
        make_code("comm-efficient", n=12, s=2, m=2, own_partitions="yes")


def test_own_partitions_error_is_the_lost_groups_share_of_the_weights():
    """n = 7, s = 1, m = 2, weights 1..7: groups {0..3} and {4, 5, 6}. Every reply: error 0
    and every partition recovered; no reply of the second group: its weights' share lost."""
    weights = np.arange(1.0, 8.0)
    code = make_code("comm-efficient", n=7, s=1, m=2, own_partitions=True, weights=weights)
    assert code.decoding_error(range(7)) == pytest.approx(0.0, abs=1e-12)
    assert code.decoding_error([0, 1, 2, 3, 4, 5]) == pytest.approx(0.0, abs=1e-12)
    # by hand: sum over lost partitions of w_j^2 over sum of all w_j^2 (the error measure)
    lost = (5.0**2 + 6.0**2 + 7.0**2) / sum(w**2 for w in range(1, 8))
    assert code.decoding_error([0, 1, 2, 3]) == pytest.approx(lost, rel=1e-12)
