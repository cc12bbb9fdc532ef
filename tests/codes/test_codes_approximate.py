"""Approximate decoding: least squares is optimal, closed forms match Monte Carlo."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from fl_gradcode.codes import frc_expected_error, make_code

APPROX_CODES = [
    ("frc", {}),
    ("crc", {}),
    ("grouped-rs", {}),
    ("bgc", {}),
    ("expander", {}),
    ("ignore-stragglers", {}),
]


@pytest.mark.parametrize(("name", "options"), APPROX_CODES)
def test_least_squares_decoding_beats_every_perturbed_vector(name, options):
    n, s = 12, 2
    code = make_code(name, n=n, s=s, seed=5, **options)
    rng = np.random.default_rng(0)
    for _ in range(30):
        size = int(rng.integers(1, n))
        received = sorted(rng.choice(n, size=size, replace=False).tolist())
        a = code.approximate_decoding_vector(received)
        best = code.decoding_error(received)
        assert code.decoding_error(received, a) == pytest.approx(best, abs=1e-12)
        for _ in range(20):
            other = a + rng.normal(scale=10.0 ** rng.uniform(-4, 0), size=a.shape)
            assert code.decoding_error(received, other) >= best - 1e-12


@pytest.mark.parametrize("name", ["bgc", "expander", "frc"])
def test_least_squares_error_is_k_minus_projection_of_ones(name):
    """err* = (k - 1^T P 1) / k with P the projector onto rowspan(B_F)."""
    code = make_code(name, n=12, s=2, seed=2)
    rng = np.random.default_rng(1)
    for _ in range(20):
        received = sorted(rng.choice(12, size=int(rng.integers(1, 12)), replace=False).tolist())
        Q, R = np.linalg.qr(code.B[received].T)
        rank = int(np.sum(np.abs(np.diag(R)) > 1e-10))
        U, _, _ = np.linalg.svd(code.B[received].T, full_matrices=False)
        P = U[:, :rank] @ U[:, :rank].T
        ones = np.ones(code.k)
        expected = (code.k - ones @ P @ ones) / code.k
        assert code.decoding_error(received) == pytest.approx(expected, abs=1e-10)
        assert Q.shape[0] == code.k


def test_empty_received_set_gives_zero_vector_and_full_error():
    code = make_code("bgc", n=8, s=1)
    a = code.approximate_decoding_vector([])
    assert a.shape == (0,)
    assert code.decoding_error([]) == pytest.approx(1.0)
    assert not code.is_decodable([])


@pytest.mark.parametrize(("n", "d", "r"), [(12, 3, 6), (24, 4, 12), (20, 2, 9)])
def test_frc_error_matches_closed_form_under_random_stragglers(n, d, r):
    code = make_code("frc", n=n, s=d - 1)
    rng = np.random.default_rng(n + r)
    trials = 3000
    errs = []
    for _ in range(trials):
        stragglers = set(rng.choice(n, size=r, replace=False).tolist())
        errs.append(code.decoding_error([i for i in range(n) if i not in stragglers]))
    expected = frc_expected_error(n, d, r)
    # err/k of one trial is d * (#lost groups) / n: bounded, so a 5-sigma band is safe
    sigma = np.std(errs) / np.sqrt(trials)
    assert abs(np.mean(errs) - expected) <= 5 * sigma + 1e-3
    assert expected > 0


def test_frc_error_is_d_times_lost_groups_over_k_exhaustively():
    n, d = 8, 2
    code = make_code("frc", n=n, s=d - 1)
    for size in range(n + 1):
        for stragglers in itertools.combinations(range(n), size):
            lost = sum(all(g * d + t in stragglers for t in range(d)) for g in range(n // d))
            alive = [i for i in range(n) if i not in stragglers]
            assert code.decoding_error(alive) == pytest.approx(d * lost / n)


@pytest.mark.parametrize("r", [1, 3, 6])
def test_ignore_stragglers_errors_match_closed_forms(r):
    n = 12
    alive = list(range(r, n))
    plain = make_code("ignore-stragglers", n=n, s=r)
    rescaled = make_code("ignore-stragglers", n=n, s=r, rescale=True)
    assert plain.decoding_error(alive) == pytest.approx(r / n)
    assert rescaled.decoding_error(alive) == pytest.approx(n * r / (n - r) / n)
    np.testing.assert_allclose(rescaled.approximate_decoding_vector(alive), n / (n - r))
    np.testing.assert_allclose(plain.approximate_decoding_vector(alive), 1.0)


def test_ignore_stragglers_rescaling_uses_weights():
    w = np.arange(1.0, 7.0)
    code = make_code("ignore-stragglers", n=6, s=2, rescale=True, weights=w)
    a = code.approximate_decoding_vector([0, 5])
    np.testing.assert_allclose(a, w.sum() / (w[0] + w[5]))


def test_ignore_stragglers_rescaled_decoding_is_unbiased_over_random_sets():
    n, r = 10, 3
    code = make_code("ignore-stragglers", n=n, s=r, rescale=True)
    rng = np.random.default_rng(0)
    updates = {j: rng.standard_normal(4) for j in range(n)}
    target = sum(updates.values())
    total = np.zeros(4)
    subsets = list(itertools.combinations(range(n), n - r))
    for alive in subsets:
        total += code.decode({i: code.encode(i, updates) for i in alive}, approximate=True)
    np.testing.assert_allclose(total / len(subsets), target, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("r", [2, 5, 10, 20])
def test_expander_fixed_decoder_obeys_spectral_bound(r):
    n = 48
    code = make_code("expander", n=n, s=3, seed=1)
    assert code.design_load == 4
    rng = np.random.default_rng(r)
    for _ in range(30):
        stragglers = set(rng.choice(n, size=r, replace=False).tolist())
        alive = [i for i in range(n) if i not in stragglers]
        fixed = code.decoding_error(alive, code.fixed_decoding_vector(alive))
        assert fixed <= code.error_bound(r) + 1e-12
        assert code.decoding_error(alive) <= fixed + 1e-12


def test_approximate_codes_are_flagged_not_exact():
    for name in ("bgc", "expander", "ignore-stragglers"):
        assert not make_code(name, n=12, s=3).is_exact


def test_approximate_decode_never_raises_and_refuses_without_flag():
    from fl_gradcode.codes import NotDecodableError

    code = make_code("frc", n=6, s=1)
    updates = {j: np.ones(3) * (j + 1) for j in range(6)}
    replies = {i: code.encode(i, updates) for i in (0, 1, 2, 3)}  # group 2 lost
    with pytest.raises(NotDecodableError):
        code.decode(replies)
    approx = code.decode(replies, approximate=True)
    np.testing.assert_allclose(approx, np.ones(3) * (1 + 2 + 3 + 4))


# ======== edges: exact values, bounds and messages ===============================================
def _weighted_error(w: np.ndarray, alpha: np.ndarray) -> float:
    return float(np.sum((w * (alpha - 1.0)) ** 2) / np.sum(w**2))


def test_approximate_decoding_is_weighted_least_squares_not_plain_least_squares():
    """Weighted expander code, n=6, one straggler: the decoder minimises ``||w (B_F^T a - 1)||``.

    Reference: numpy's lstsq on the row-scaled system ``diag(w) B_F^T a = w``. Plain least
    squares (``B_F^T a = 1``) gives a visibly larger weighted error (0.0562 vs 0.00965)."""
    w = np.arange(1.0, 7.0)
    code = make_code("expander", n=6, s=1, seed=0, weights=w)
    got = (0, 1, 2, 3, 4)
    BF = code.B[list(got)]
    a_ref, *_ = np.linalg.lstsq((BF * w).T, w, rcond=None)
    err_ref = _weighted_error(w, a_ref @ BF)
    a_plain, *_ = np.linalg.lstsq(BF.T, np.ones(6), rcond=None)
    err_plain = _weighted_error(w, a_plain @ BF)
    assert err_plain > 2 * err_ref  # the case tells the two decoders apart

    dec = code.decoding(got)
    assert dec.error == pytest.approx(err_ref, rel=1e-9)
    np.testing.assert_allclose(dec.alpha, a_ref @ BF, atol=1e-12)
    assert code.decoding_error(got) == pytest.approx(err_ref, rel=1e-9)


@pytest.mark.parametrize(("n", "d"), [(6, 3), (8, 2), (6, 1), (4, 4)])
def test_frc_expected_error_is_the_mean_over_every_straggler_set(n, d):
    """Brute force: over all ``C(n, r)`` straggler sets, the fraction of the ``n/d`` groups whose
    ``d`` members all straggle, times ``d/n`` per lost group; 0 with fewer stragglers than ``d``."""
    for r in range(n + 1):
        lost = [sum(set(range(g * d, g * d + d)) <= set(st) for g in range(n // d))
                for st in itertools.combinations(range(n), r)]
        expected = d * float(np.mean(lost)) / n
        assert frc_expected_error(n, d, r) == pytest.approx(expected, abs=1e-15)
    assert frc_expected_error(n, d, d - 1) == 0.0


def test_an_approximate_decoding_may_weigh_a_partition_negatively_as_documented():
    """docs/codes.md: alpha_j = (B_F^T a)_j is a least-squares fit, not a share. crc at
    n = 8, s = 3 has received sets within the default max_decode_error (0.5) where some
    partition's weight is negative; alpha is B_F^T a computed here from B and a (numpy)."""
    import itertools

    import numpy as np

    from fl_gradcode.codes import make_code

    code = make_code("crc", 8, 3, seed=0)
    negative = []
    for size in range(1, 8):
        for received in itertools.combinations(range(8), size):
            decoding = code.decoding(received)
            a = code.approximate_decoding_vector(received)
            alpha = code.B[list(received)].T @ a
            np.testing.assert_allclose(alpha, decoding.alpha, atol=1e-9)
            if decoding.error <= 0.5 and alpha.min() < -1e-6:
                negative.append(received)
    assert negative


# received sets whose rows repeat (a grouped-rs row copied when s + 1 does not divide n, bgc
# and expander drawing the same row twice): the system is exactly rank-deficient
REPEATED_ROWS = [
    ("grouped-rs", 0, 6, 3, [5.8, 3.3, 6.0, 3.4, 4.0], (0, 5)),
    ("grouped-rs", 0, 7, 4, [8.240302303158176, 7.720998254377348, 0.155516003727539,
                             7.184382699651432, 8.69905508258295, 2.23965692133574], (0, 6)),
    ("bgc", 1, 3, 1, [5.208830450418032, 5.217390522713276, 8.90090851439153], (1, 2)),
    ("expander", 28, 8, 5, None, (1, 4, 5, 7)),
]


@pytest.mark.parametrize("name, seed, n, s, weights, got", REPEATED_ROWS)
def test_least_squares_on_repeated_rows_is_the_minimum_norm_optimum(name, seed, n, s,
                                                                    weights, got):
    """The decoding vector is the weighted least-squares optimum of minimum norm (numpy's
    SVD solve, an independent reference): not a vector of norm 1e15 whose decoded sum
    depends on the last bit of a reply, and the error reported is the vector's own."""
    options = {"seed": seed} if weights is None else {"seed": seed, "weights": weights}
    code = make_code(name, n, s, **options)
    w = np.asarray(code.weights, dtype=float)
    rows = code.B[list(got)]
    reference, *_ = np.linalg.lstsq((rows * w).T, w, rcond=None)
    optimum = float(np.sum((w * (reference @ rows - 1.0)) ** 2) / np.sum(w**2))
    decoding = code.decoding(list(got))
    a = np.asarray(decoding.coefficients, dtype=float)[list(got)]
    own = float(np.sum((w * (a @ rows - 1.0)) ** 2) / np.sum(w**2))
    assert np.linalg.norm(a) <= 1.0 + 10 * np.linalg.norm(reference)
    assert own == pytest.approx(optimum, rel=1e-9, abs=1e-12)
    assert decoding.error == pytest.approx(own, rel=1e-9, abs=1e-12)
    # a reply one float32 rounding off moves the decoded sum by about that rounding
    rng = np.random.default_rng(0)
    updates = rng.standard_normal((code.k, 20))
    replies = {i: code.encode(i, dict(enumerate(updates))) for i in got}
    rounded = {i: v.astype(np.float32).astype(np.float64) for i, v in replies.items()}
    shift = np.linalg.norm(code.decode(rounded, approximate=True)
                           - code.decode(replies, approximate=True))
    assert shift <= 1e-5 * np.linalg.norm(w @ updates)
