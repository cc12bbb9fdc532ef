"""Property-based tests (hypothesis) of the algebra over n, s, seeds, weights and updates."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fl_gradcode.codes import NotDecodableError, make_code

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def code_case(draw, names=("crc", "grouped-rs", "frc", "comm-efficient")):
    name = draw(st.sampled_from(names))
    if name == "frc":
        d = draw(st.integers(1, 6))
        n = d * draw(st.integers(1, 6))
        s = d - 1
    elif name == "comm-efficient":
        m = draw(st.integers(1, 4))
        n = draw(st.integers(m, 30))
        s = draw(st.integers(0, n - m))
        return name, n, s, {"m": m}
    else:
        n = draw(st.integers(1, 40 if name == "grouped-rs" else 14))
        s = draw(st.integers(0, n - 1))
    return name, n, s, {}


@SETTINGS
@given(
    case=code_case(),
    seed=st.integers(0, 2**31 - 1),
    length=st.integers(1, 9),
    data=st.data(),
)
def test_any_n_minus_s_replies_recover_the_weighted_sum(case, seed, length, data):
    name, n, s, options = case
    k = make_code(name, n=n, s=s, seed=seed, **options).k
    weights = data.draw(
        st.lists(st.floats(0.05, 20.0), min_size=k, max_size=k) | st.none(), label="weights"
    )
    code = make_code(name, n=n, s=s, seed=seed, weights=weights, **options)
    rng = np.random.default_rng(seed)
    updates = {j: rng.standard_normal(length) * 10 ** rng.uniform(-3, 3) for j in range(k)}
    target = sum(code.weights[j] * updates[j] for j in range(k))
    stragglers = data.draw(st.sets(st.integers(0, n - 1), max_size=s), label="stragglers")
    replies = {i: code.encode(i, updates) for i in range(n) if i not in stragglers}
    decoded = code.decode(replies)
    scale = sum(code.weights[j] * np.linalg.norm(updates[j]) for j in range(k))
    # crc is the unstable construction: only a loose bound holds for it
    tol = 1e-6 if name == "crc" else 1e-10
    assert np.linalg.norm(decoded - target) <= tol * scale


@SETTINGS
@given(case=code_case(names=("crc", "grouped-rs", "frc")), seed=st.integers(0, 1000))
def test_decoding_vector_satisfies_a_B_F_equals_one(case, seed):
    name, n, s, options = case
    code = make_code(name, n=n, s=s, seed=seed, **options)
    rng = np.random.default_rng(seed)
    alive = rng.permutation(n)[: n - s].tolist()
    a = code.decoding_vector(alive)
    np.testing.assert_allclose(a @ code.B[alive], 1.0, atol=1e-7 if name == "crc" else 1e-10)


@SETTINGS
@given(
    name=st.sampled_from(["bgc", "expander", "frc", "grouped-rs", "ignore-stragglers"]),
    n=st.integers(4, 20),
    seed=st.integers(0, 1000),
    data=st.data(),
)
def test_decoded_value_equals_alpha_weighted_sum_for_any_received_set(name, n, seed, data):
    """Approximate decoding returns exactly sum_j alpha_j w_j u_j with alpha = B_F^T a."""
    s = 1 if name == "frc" and n % 2 == 0 else 0 if name == "frc" else min(2, n - 2)
    code = make_code(name, n=n, s=s, seed=seed)
    alive = sorted(data.draw(st.sets(st.integers(0, n - 1), max_size=n), label="alive"))
    rng = np.random.default_rng(seed)
    updates = {j: rng.standard_normal(3) for j in range(code.k)}
    replies = {i: code.encode(i, updates) for i in alive}
    dec = code.decoding(alive)
    expected = sum(dec.alpha[j] * code.weights[j] * updates[j] for j in range(code.k))
    np.testing.assert_allclose(
        code.decode(replies, approximate=True, length=3), expected, atol=1e-9
    )
    assert 0.0 <= dec.error
    if not dec.exact:
        with pytest.raises(NotDecodableError):
            code.decode(replies, approximate=False)
        if code.is_exact:  # exact codes refuse by default, approximate codes decode by default
            with pytest.raises(NotDecodableError):
                code.decode(replies)
        elif alive:
            np.testing.assert_allclose(code.decode(replies), expected, atol=1e-9)


@SETTINGS
@given(
    n=st.integers(2, 30),
    m=st.integers(1, 5),
    length=st.integers(1, 23),
    seed=st.integers(0, 1000),
    data=st.data(),
)
def test_comm_efficient_replies_are_ceil_l_over_m_and_decode_to_length_l(n, m, length, seed, data):
    m = min(m, n)
    s = data.draw(st.integers(0, n - m), label="s")
    code = make_code("comm-efficient", n=n, s=s, m=m, seed=seed)
    rng = np.random.default_rng(seed)
    updates = {j: rng.standard_normal(length) for j in range(code.k)}
    replies = {i: code.encode(i, updates) for i in range(n)}
    assert all(r.shape == (-(-length // m),) for r in replies.values())
    stragglers = data.draw(st.sets(st.integers(0, n - 1), max_size=s), label="stragglers")
    got = {i: r for i, r in replies.items() if i not in stragglers}
    decoded = code.decode(got, length=length)
    target = sum(updates.values())
    np.testing.assert_allclose(decoded, target, rtol=1e-9, atol=1e-9)
    assert code.load == s + m


def test_least_squares_decoding_of_duplicate_rows_is_the_minimum_norm_solution():
    """bgc at n = 4, seed 289: clients 0 and 1 hold the same partitions {1, 2, 3}. Least
    squares (reference: the pseudo-inverse, by hand) gives a_0 + a_1 = 1, alpha = 1 on
    {1, 2, 3}; the minimum-norm split is 1/2 each. Pivoted QR took the rank-1 system for
    rank 2 and returned a = -/+1.7e15 with alpha = 1/4, and decoding then cancelled two
    numbers of 1e15 (a result on a grid of 1/8)."""
    code = make_code("bgc", n=4, s=2, seed=289)
    assert np.array_equal(code.B[0], code.B[1]) and list(code.B[0]) == [0, 1, 1, 1]
    dec = code.decoding([0, 1])
    np.testing.assert_allclose(dec.coefficients[[0, 1]], [0.5, 0.5], atol=1e-12)
    np.testing.assert_allclose(dec.alpha, [0.0, 1.0, 1.0, 1.0], atol=1e-12)
    u = {j: np.array([0.3, -1.7, 2.9]) * (j + 1) for j in range(4)}
    got = code.decode({i: code.encode(i, u) for i in (0, 1)}, approximate=True)
    np.testing.assert_allclose(got, u[1] + u[2] + u[3], rtol=1e-12)


@SETTINGS
@given(
    name=st.sampled_from(["bgc", "expander", "ignore-stragglers"]),
    n=st.integers(3, 16),
    seed=st.integers(0, 1000),
    data=st.data(),
)
def test_approximate_decoding_is_least_squares_optimal_for_any_received_set(name, n, seed,
                                                                             data):
    """The decoding's residual ``||B_F^T a - 1||`` (unit weights) equals the optimum, from
    numpy's SVD-based lstsq (an independent reference), for any received set, rank-deficient
    ones (duplicate rows) included."""
    s = min(2, n - 2)
    code = make_code(name, n=n, s=s, seed=seed)
    alive = sorted(data.draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=n)))
    B_F = np.asarray(code.B, dtype=float)[alive]
    ref = np.linalg.lstsq(B_F.T, np.ones(code.k), rcond=None)[0]
    best = np.linalg.norm(B_F.T @ ref - 1.0)
    dec = code.decoding(alive)
    got = np.linalg.norm(B_F.T @ dec.coefficients[alive] - 1.0)
    assert got <= best + 1e-9 * (1.0 + best)
    np.testing.assert_allclose(dec.alpha, B_F.T @ dec.coefficients[alive], atol=1e-9)
