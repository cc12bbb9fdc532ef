"""Coded matrix multiplication: exact from every k-subset, stable at n = 64, clear errors."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fl_gradcode.matmul import MDSMatVec, PolynomialMatMul, coded_least_squares_gradient


def rel(x, y):
    return float(np.linalg.norm(x - y) / np.linalg.norm(y))


@pytest.mark.parametrize("generator", ["gaussian", "systematic"])
@pytest.mark.parametrize(("n", "k"), [(10, 7), (6, 6), (5, 1), (8, 3)])
def test_mds_matvec_recovers_from_every_k_subset(n, k, generator):
    rng = np.random.default_rng(n * k)
    A = rng.standard_normal((23, 5))  # 23 rows: not divisible by k in most cases
    x = rng.standard_normal(5)
    job = MDSMatVec(A, n=n, k=k, generator=generator)
    assert job.padded_rows == -23 % k
    results = {i: job.task(i, x) for i in range(n)}
    for workers in itertools.combinations(range(n), k):
        decoded = job.decode({i: results[i] for i in workers})
        assert decoded.shape == (23,)
        assert rel(decoded, A @ x) <= 1e-10


def test_mds_matvec_accepts_a_matrix_right_hand_side_and_extra_results():
    rng = np.random.default_rng(1)
    A, X = rng.standard_normal((12, 4)), rng.standard_normal((4, 3))
    job = MDSMatVec(A, n=7, k=4)
    out = job.decode({i: job.task(i, X) for i in range(7)})
    np.testing.assert_allclose(out, A @ X, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("generator", ["gaussian", "polynomial"])
@pytest.mark.parametrize(("n", "a", "b"), [(10, 2, 3), (6, 1, 4), (5, 2, 2), (4, 1, 1)])
def test_polynomial_matmul_recovers_from_every_ab_subset(n, a, b, generator):
    rng = np.random.default_rng(n + a + b)
    A, B = rng.standard_normal((9, 7)), rng.standard_normal((9, 5))
    job = PolynomialMatMul(A, B, n=n, a=a, b=b, generator=generator)
    results = {i: job.task(i) for i in range(n)}
    for workers in itertools.combinations(range(n), a * b):
        decoded = job.decode({i: results[i] for i in workers})
        assert decoded.shape == (7, 5)
        assert rel(decoded, A.T @ B) <= 1e-10


def test_polynomial_code_product_is_a_polynomial_of_degree_ab_minus_1():
    """With generator='polynomial' worker i's result is sum_t x_i^t C_t (Yu et al.)."""
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((4, 4)), rng.standard_normal((4, 6))
    job = PolynomialMatMul(A, B, n=8, a=2, b=3, generator="polynomial")
    x = np.exp(2j * np.pi * np.arange(8) / 8)
    blocks = [Aj.T @ Bl for Aj in np.split(A, 2, axis=1) for Bl in np.split(B, 3, axis=1)]
    for i in range(8):
        expected = sum(
            x[i] ** (j + 2 * q) * blocks[j * 3 + q] for j in range(2) for q in range(3)
        )
        np.testing.assert_allclose(job.task(i), expected, atol=1e-12)


@pytest.mark.parametrize(("k",), [(8,), (32,), (48,), (63,)])
def test_mds_matvec_is_stable_at_n64_over_random_sets_and_bursts(k):
    n = 64
    rng = np.random.default_rng(k)
    A, x = rng.standard_normal((128, 16)), rng.standard_normal(16)
    job = MDSMatVec(A, n=n, k=k, seed=k)
    results = {i: job.task(i, x) for i in range(n)}
    subsets = [sorted(rng.choice(n, size=k, replace=False).tolist()) for _ in range(60)]
    subsets += [[(s + t) % n for t in range(k)] for s in range(n)]
    worst = max(rel(job.decode({i: results[i] for i in w}), A @ x) for w in subsets)
    assert worst <= 1e-8


@pytest.mark.parametrize(("a", "b"), [(4, 4), (4, 8), (8, 7)])
def test_gaussian_product_code_is_stable_at_n64(a, b):
    n = 64
    rng = np.random.default_rng(a * b)
    A, B = rng.standard_normal((20, 16)), rng.standard_normal((20, 16))
    job = PolynomialMatMul(A, B, n=n, a=a, b=b, seed=1)
    results = {i: job.task(i) for i in range(n)}
    k = a * b
    subsets = [sorted(rng.choice(n, size=k, replace=False).tolist()) for _ in range(40)]
    subsets += [[(s + t) % n for t in range(k)] for s in range(0, n, 4)]
    worst = max(rel(job.decode({i: results[i] for i in w}), A.T @ B) for w in subsets)
    assert worst <= 1e-8


def test_roots_of_unity_polynomial_code_fails_on_bursts_at_n64():
    """Documents why the Gaussian generator is the default: bursts break the polynomial code."""
    job = PolynomialMatMul(np.eye(16), np.eye(16), n=64, a=4, b=8, generator="polynomial")
    assert job.screened_condition > 1e10
    assert PolynomialMatMul(np.eye(16), np.eye(16), n=64, a=4, b=8).screened_condition < 1e6


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 16),
    data=st.data(),
    rows=st.integers(1, 20),
    cols=st.integers(1, 6),
    seed=st.integers(0, 10_000),
)
def test_mds_matvec_property(n, data, rows, cols, seed):
    k = data.draw(st.integers(1, n), label="k")
    rng = np.random.default_rng(seed)
    A, x = rng.standard_normal((rows, cols)), rng.standard_normal(cols)
    job = MDSMatVec(A, n=n, k=k, seed=seed, draws=1)
    workers = data.draw(st.permutations(range(n)), label="order")[:k]
    out = job.decode({i: job.task(i, x) for i in workers})
    np.testing.assert_allclose(out, A @ x, rtol=1e-8, atol=1e-8 * np.abs(A).sum())


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 12), data=st.data(), seed=st.integers(0, 10_000))
def test_polynomial_matmul_property(n, data, seed):
    a = data.draw(st.integers(1, n), label="a")
    b = data.draw(st.integers(1, max(1, n // a)), label="b")
    rng = np.random.default_rng(seed)
    r, p, q = (int(v) for v in rng.integers(1, 8, size=3))
    A, B = rng.standard_normal((r, p)), rng.standard_normal((r, q))
    job = PolynomialMatMul(A, B, n=n, a=a, b=b, seed=seed, draws=1)
    workers = data.draw(st.permutations(range(n)), label="order")[: a * b]
    out = job.decode({i: job.task(i) for i in workers})
    np.testing.assert_allclose(out, A.T @ B, rtol=1e-8, atol=1e-8 * (1 + np.abs(A.T @ B).max()))


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: MDSMatVec(np.ones((4, 2)), n=3, k=4), "k=4 must be <= n=3"),
        (lambda: MDSMatVec(np.ones(4), n=3, k=2), r"2-D array; got shape \(4,\)"),
        (lambda: MDSMatVec(np.ones((4, 2)), n=0, k=1), "n=0 must be an integer >= 1"),
        (lambda: MDSMatVec(np.full((2, 2), np.nan), n=3, k=2), "NaN or Inf"),
        (lambda: MDSMatVec(np.ones((4, 2)), n=3, k=2, generator="x"), "generator='x'"),
        (lambda: PolynomialMatMul(np.ones((3, 2)), np.ones((4, 2)), n=4, a=1, b=1), "as many rows"),
        (lambda: PolynomialMatMul(np.ones((3, 2)), np.ones((3, 2)), n=5, a=2, b=3), "a\\*b=6"),
    ],
)
def test_bad_parameters_raise_clear_errors(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_bad_results_raise_clear_errors():
    job = MDSMatVec(np.ones((6, 2)), n=4, k=2)
    good = job.task(0, np.ones(2))
    with pytest.raises(ValueError, match="any k=2 of n=4 are needed"):
        job.decode({0: good})
    with pytest.raises(ValueError, match="worker index 9 is out of range"):
        job.decode({0: good, 9: good})
    with pytest.raises(ValueError, match="NaN or Inf"):
        job.decode({0: good, 1: good * np.nan})
    with pytest.raises(ValueError, match="shape"):
        job.decode({0: good, 1: good[:1]})
    with pytest.raises(ValueError, match=r"x has shape \(3,\)"):
        job.task(0, np.ones(3))


def test_coded_least_squares_gradient_matches_direct_gradient():
    rng = np.random.default_rng(3)
    X, y, w = rng.standard_normal((50, 4)), rng.standard_normal(50), rng.standard_normal(4)
    fwd, bwd = coded_least_squares_gradient(X, y, n=8, k=5)
    r = fwd.decode({i: fwd.task(i, w) for i in (7, 1, 3, 5, 0)}) - y
    g = bwd.decode({i: bwd.task(i, r) for i in (2, 4, 6, 0, 1)})
    np.testing.assert_allclose(g, X.T @ (X @ w - y), rtol=1e-10)


# ======== edges: exact values, bounds and messages ===============================================
def test_condition_number_is_that_of_the_workers_generator_rows_in_any_order():
    job = MDSMatVec(np.ones((6, 2)), n=5, k=3, generator="systematic")
    # the first k workers hold the plain blocks: their rows are the identity
    assert job.condition_number([2, 0, 1]) == pytest.approx(1.0)
    rows = job.M[[1, 3, 4]]
    s = np.linalg.svd(rows, compute_uv=False)
    assert job.condition_number([4, 1, 3]) == pytest.approx(s[0] / s[-1])
    assert isinstance(job.condition_number([0, 1, 2]), float)


def test_the_default_seed_is_zero():
    A = np.arange(12.0).reshape(6, 2)
    np.testing.assert_array_equal(MDSMatVec(A, n=5, k=3).M, MDSMatVec(A, n=5, k=3, seed=0).M)
    assert not np.array_equal(MDSMatVec(A, n=5, k=3, seed=1).M, MDSMatVec(A, n=5, k=3).M)


def test_errors_name_the_bad_argument():
    with pytest.raises(ValueError, match=r"^k=0 must be an integer >= 1$"):
        MDSMatVec(np.ones((4, 2)), n=3, k=0)
    with pytest.raises(ValueError, match=r"^A must be a non-empty 2-D array; got shape \(3,\)$"):
        PolynomialMatMul(np.ones(3), np.ones((3, 2)), n=4, a=1, b=1)
    with pytest.raises(ValueError, match=r"^generator='x'; expected 'gaussian' or 'polynomial'$"):
        PolynomialMatMul(np.ones((3, 2)), np.ones((3, 2)), n=4, a=1, b=1, generator="x")


def test_coded_least_squares_jobs_are_reproducible_from_the_seed():
    rng = np.random.default_rng(5)
    X, y = rng.standard_normal((12, 3)), rng.standard_normal(12)
    first, second = coded_least_squares_gradient(X, y, n=5, k=3, seed=4), \
        coded_least_squares_gradient(X, y, n=5, k=3, seed=4)
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a.M, b.M)
