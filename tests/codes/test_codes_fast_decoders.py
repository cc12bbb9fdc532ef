"""Fast decoders (CRC's banded solver, FRC's and uncoded's closed forms) vs a dense reference.

The reference solves the weighted least-squares problem ``min ||diag(w)(B_F^T a - 1)||`` with
numpy's SVD-based ``lstsq`` on the dense ``B`` (minimum-norm when ``|F| > n - s``); the dense
QR path of :class:`GradientCode` is disabled during these tests so that a silent fallback to it
fails them instead of passing them."""

from __future__ import annotations

import numpy as np
import pytest

from fl_gradcode.codes import GradientCode, cyclic_solver, make_code
from fl_gradcode.codes.base import EXACT_TOL
from fl_gradcode.codes.cyclic_solver import CyclicLeastSquares, cyclic_supports, refine

CASES = [(6, 1), (12, 3), (12, 5), (30, 2), (48, 11), (64, 16), (100, 25), (150, 40), (200, 10)]


def reference(code: GradientCode, received: list[int], w: np.ndarray) -> np.ndarray:
    B_F = code.B[received]
    return np.linalg.lstsq((B_F * w).T, w, rcond=None)[0]


@pytest.fixture
def no_dense_path(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the dense least-squares path ran: the fast CRC decoder fell back")

    monkeypatch.setattr(GradientCode, "_least_squares", staticmethod(refuse))


def random_sets(n: int, size: int, rng: np.random.Generator, count: int) -> list[list[int]]:
    sets = [list(range(n - size, n)), list(range(size))]  # the stragglers in one burst
    sets += [sorted(rng.choice(n, size=size, replace=False).tolist()) for _ in range(count)]
    return sets


@pytest.mark.parametrize("unit_weights", [True, False])
@pytest.mark.parametrize(("n", "s"), CASES)
def test_crc_fast_decoder_matches_dense_lstsq_on_n_minus_s_replies(
    n, s, unit_weights, no_dense_path
):
    rng = np.random.default_rng(1000 * n + s)
    w = np.ones(n) if unit_weights else rng.uniform(0.1, 10.0, size=n)
    code = make_code("crc", n=n, s=s, seed=n + s, weights=w)
    for received in random_sets(n, n - s, rng, count=6):
        order = list(rng.permutation(received))  # decoding_vector follows the caller's order
        a = code.decoding_vector(order)
        ref = reference(code, order, w)
        np.testing.assert_allclose(a, ref, rtol=0, atol=1e-8 * np.linalg.norm(ref))
        assert np.max(np.abs(a @ code.B[order] - 1.0)) <= EXACT_TOL
        assert code.decoding(order).exact


@pytest.mark.parametrize("unit_weights", [True, False])
@pytest.mark.parametrize(("n", "s"), [(12, 3), (48, 11), (100, 25), (200, 10)])
def test_crc_fast_decoder_returns_the_minimum_norm_vector_with_extra_replies(
    n, s, unit_weights, no_dense_path
):
    """More than ``n - s`` replies: B_F is rank deficient and the decoder is minimum-norm."""
    rng = np.random.default_rng(n * s)
    w = np.ones(n) if unit_weights else rng.uniform(0.1, 10.0, size=n)
    code = make_code("crc", n=n, s=s, seed=3, weights=w)
    for extra in sorted({1, 2, max(1, s // 2), s}):
        for received in random_sets(n, n - s + extra, rng, count=3):
            a = code.decoding_vector(received)
            ref = reference(code, received, w)
            np.testing.assert_allclose(a, ref, rtol=0, atol=1e-8 * np.linalg.norm(ref))
            assert np.max(np.abs(a @ code.B[received] - 1.0)) <= EXACT_TOL


@pytest.mark.parametrize(("n", "s"), [(48, 11), (150, 40)])
def test_crc_fast_decoder_recovers_the_weighted_sum_from_replies(n, s, no_dense_path):
    rng = np.random.default_rng(s)
    w = rng.uniform(0.5, 3.0, size=n)
    code = make_code("crc", n=n, s=s, seed=1, weights=w)
    U = rng.standard_normal((n, 6))
    target = w @ U
    replies = code.B @ (w[:, None] * U)
    stragglers = set(rng.choice(n, size=s, replace=False).tolist())
    got = {i: replies[i] for i in range(n) if i not in stragglers}
    decoded = code.decode(got)
    # the reference decodes the same replies with the dense lstsq vector
    alive = sorted(got)
    expected = reference(code, alive, w) @ replies[alive]
    np.testing.assert_allclose(decoded, expected, rtol=0, atol=1e-7 * np.linalg.norm(target))
    np.testing.assert_allclose(decoded, target, rtol=0, atol=1e-6 * np.linalg.norm(target))


@pytest.mark.parametrize(("n", "s"), [(12, 6), (12, 9), (40, 25)])
def test_crc_with_s_at_least_n_minus_s_uses_the_dense_path_and_agrees(n, s):
    code = make_code("crc", n=n, s=s, seed=4)
    rng = np.random.default_rng(s)
    for received in random_sets(n, n - s, rng, count=3):
        ref = reference(code, received, code.weights)
        a = code.decoding_vector(received)
        np.testing.assert_allclose(a, ref, rtol=0, atol=1e-8 * np.linalg.norm(ref))


def test_crc_with_fewer_than_n_minus_s_replies_still_uses_the_dense_least_squares():
    code = make_code("crc", n=30, s=5, seed=0)
    received = list(range(24))
    ref = reference(code, received, code.weights)
    a = code.approximate_decoding_vector(received)
    np.testing.assert_allclose(a, ref, rtol=0, atol=1e-8 * np.linalg.norm(ref))
    assert not code.is_decodable(received)


@pytest.mark.parametrize("failure", ["singular", "inexact"])
def test_crc_falls_back_to_the_dense_path_when_the_fast_decoder_fails(failure, monkeypatch):
    from fl_gradcode.codes import repetition

    def broken(cols, vals, weights, received):
        if failure == "singular":
            raise np.linalg.LinAlgError("singular banded block")
        return np.zeros(len(received))  # residual 1: must not be accepted

    monkeypatch.setattr(repetition, "cyclic_decoding_vector", broken)
    code = make_code("crc", n=20, s=4, seed=2)
    alive = [i for i in range(20) if i not in (3, 9, 10, 17)]
    ref = reference(code, alive, code.weights)
    a = code.decoding_vector(alive)
    np.testing.assert_allclose(a, ref, rtol=0, atol=1e-8 * np.linalg.norm(ref))


def test_cyclic_supports_rejects_entries_outside_the_cyclic_band():
    from fl_gradcode.codes.cyclic_solver import cyclic_supports

    B = np.eye(6)
    B[0, 3] = 1.0  # client 0 holds partition 3, outside {0, 1}
    with pytest.raises(ValueError, match="outside the cyclic supports"):
        cyclic_supports(B, 1)


def test_uncoded_closed_form_matches_dense_lstsq():
    rng = np.random.default_rng(0)
    w = rng.uniform(0.1, 4.0, size=20)
    code = make_code("uncoded", n=20, s=0, weights=w)
    a = code.decoding_vector(range(20))
    np.testing.assert_allclose(a, reference(code, list(range(20)), w), atol=1e-12)
    part = [3, 7, 1]
    dec = code.decoding(part)
    assert not dec.exact
    np.testing.assert_allclose(dec.coefficients[part], reference(code, part, w), atol=1e-12)
    assert dec.error == pytest.approx(np.sum(np.delete(w, part) ** 2) / np.sum(w**2))


@pytest.mark.parametrize(("n", "s"), [(6, 1), (12, 3), (30, 4), (210, 20), (202, 100)])
def test_frc_closed_form_matches_dense_lstsq_including_uncovered_groups(n, s, no_dense_path):
    rng = np.random.default_rng(n + s)
    w = rng.uniform(0.1, 10.0, size=n)
    code = make_code("frc", n=n, s=s, weights=w)
    d = s + 1
    sizes = [n - s, n - 2 * s, n // 2, max(1, n // d - 1), 1]
    for size in sizes:
        received = list(rng.choice(n, size=size, replace=False))
        dec = code.decoding(received)
        ref = reference(code, received, w)
        np.testing.assert_allclose(dec.coefficients[received], ref, rtol=0, atol=1e-12)
        covered = len({int(i) // d for i in received}) == n // d
        assert dec.exact == covered == code.is_decodable(received)
        alpha = ref @ code.B[received]
        expected_error = np.sum((w * (alpha - 1.0)) ** 2) / np.sum(w**2)
        assert dec.error == pytest.approx(expected_error, abs=1e-15)


# ======== edges: exact values, bounds and messages ===============================================
@pytest.mark.parametrize("steps", [0, 1, 3])
def test_refinement_adds_the_solved_residual_while_it_shrinks(steps):
    """``A = diag(d)`` and a solver that returns half the exact correction: each pass halves the
    residual, so ``steps`` passes from ``a = 0`` give ``(1 - 2^-steps) b / d``; a solver that
    makes the residual grow is not applied, and a zero residual is not solved at all."""
    d = np.array([1.0, 2.0, 4.0])
    b = np.array([3.0, -1.0, 2.0])
    calls = []

    def half(res):
        calls.append(res)
        return 0.5 * res / d

    out = refine(half, lambda a: d * a, b, np.zeros(3), steps)
    np.testing.assert_allclose(out, (1 - 0.5**steps) * b / d, rtol=1e-15)
    worse = refine(lambda res: -res / d, lambda a: d * a, b, np.zeros(3), 3)
    np.testing.assert_array_equal(worse, np.zeros(3))
    calls.clear()
    exact = b / d
    np.testing.assert_array_equal(refine(half, lambda a: d * a, b, exact, 3), exact)
    assert calls == []


def test_a_failing_banded_solve_raises_with_lapacks_info(monkeypatch):
    """``gbtrs`` only fails on invalid arguments; its ``info`` must reach the error."""
    code = make_code("crc", n=8, s=2, seed=0)
    cols, vals = cyclic_supports(np.asarray(code.B), 2)
    ls = CyclicLeastSquares(cols, vals, np.ones(8), np.arange(2, 8))
    np.testing.assert_allclose(ls.apply(ls.solve_once(np.ones(8))), np.ones(8), atol=1e-12)
    monkeypatch.setattr(cyclic_solver.lapack, "dgbtrs", lambda *a, **k: (a[3], -7))
    with pytest.raises(np.linalg.LinAlgError, match=r"^gbtrs info=-7$"):
        ls.solve_once(np.ones(8))


@pytest.mark.parametrize(("n", "s", "seed"), [(20, 3, 0), (50, 2, 0), (100, 2, 2)])
def test_cyclic_decoding_vector_refines_at_most_twice_by_default(monkeypatch, n, s, seed):
    """One elimination pass plus at most two refinement passes (the documented default); the
    result is numpy's least squares. (How many refinements a case needs depends on the LAPACK
    build's rounding: the bound is what is documented, not the count.)"""
    code = make_code("crc", n=n, s=s, seed=seed)
    cols, vals = cyclic_supports(np.asarray(code.B), s)
    rng = np.random.default_rng(seed)
    w = rng.uniform(0.1, 10.0, n)
    F = np.sort(rng.choice(n, n - s, replace=False))
    calls = []
    solve_once = CyclicLeastSquares.solve_once
    monkeypatch.setattr(CyclicLeastSquares, "solve_once",
                        lambda self, b: calls.append(1) or solve_once(self, b))
    a = cyclic_solver.cyclic_decoding_vector(cols, vals, w, F)
    assert 1 <= len(calls) <= 3
    A = code.B[F] * w
    expected = np.linalg.lstsq(A.T, w, rcond=None)[0]
    np.testing.assert_allclose(a @ A, expected @ A, atol=1e-9)
