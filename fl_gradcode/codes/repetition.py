"""Baselines and the repetition codes of Tandon et al.: uncoded, ignore-stragglers, FRC, CRC.

References:
    Tandon, Lei, Dimakis, Karampatziakis, "Gradient Coding: Avoiding Stragglers in Distributed
    Learning", ICML 2017, https://arxiv.org/abs/1612.03301.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from .base import Decoding, GradientCode, check_n_s
from .cyclic_solver import cyclic_decoding_vector, cyclic_supports
from .patterns import straggler_patterns

__all__ = [
    "CyclicRepetitionCode",
    "FractionalRepetitionCode",
    "IgnoreStragglers",
    "UncodedCode",
    "crc_matrix",
    "frc_expected_error",
    "frc_matrix",
]


class UncodedCode(GradientCode):
    """No coding: client ``i`` computes partition ``i`` only (``B = I``), every reply is needed.

    Its straggler tolerance is 0 whatever ``s`` is asked for: it is exact from all ``n`` replies.
    """

    name = "uncoded"

    def __init__(self, n: int, *, weights: Iterable[float] | None = None) -> None:
        n, _ = check_n_s(n, 0)
        super().__init__(np.eye(n), 0, is_exact=True, weights=weights)

    def _compute_decoding(self, got: frozenset[int]) -> Decoding:
        return _identity_decoding(self, got)


def _identity_decoding(code: GradientCode, got: frozenset[int]) -> Decoding:
    """Closed form for ``B = I``: ``a = 1`` on the received clients, whatever the weights.

    It is the weighted least-squares optimum (each partition is its own block), computed in
    O(n) instead of one solve per client (90 ms at n = 1000).
    """
    a = np.zeros(code.n)
    a[sorted(got)] = 1.0
    return code.decoding_from(got, a)


class IgnoreStragglers(GradientCode):
    """Uncoded baseline that decodes whatever arrived (``B = I``).

    With ``rescale=False`` the decoding vector is ``1_F`` (the least-squares optimum, biased by
    ``|F|/n``); with ``rescale=True`` it is ``(sum_j w_j / sum_{j in F} w_j) * 1_F``, which is
    ``n/|F| * 1_F`` for unit weights: unbiased under uniformly random stragglers, like
    minibatch SGD, at error ``n r / (n - r)`` instead of ``r`` for ``r`` stragglers.

    ``s`` is the number of replies the server is prepared to skip; the code is exact only when
    every reply arrives (``is_exact`` is ``False``).
    """

    name = "ignore-stragglers"

    def __init__(
        self, n: int, s: int, *, rescale: bool = False, weights: Iterable[float] | None = None
    ) -> None:
        n, s = check_n_s(n, s)
        super().__init__(np.eye(n), s, is_exact=s == 0, weights=weights)
        self.rescale = bool(rescale)

    def _compute_decoding(self, got: frozenset[int]) -> Decoding:
        a = np.zeros(self.n)
        rows = sorted(got)
        if rows:
            factor = 1.0
            if self.rescale:
                factor = float(np.sum(self.weights) / np.sum(self.weights[rows]))
            a[rows] = factor
        return self.decoding_from(got, a)


def frc_matrix(n: int, s: int) -> np.ndarray:
    """FRC encoding matrix: consecutive groups of ``s+1`` clients hold the same ``s+1``
    partitions and send their plain sum."""
    n, s = check_n_s(n, s)
    if n % (s + 1):
        raise ValueError(f"FRC needs (s+1) | n; got n={n}, s={s} ((s+1)={s + 1} does not divide n)")
    d = s + 1
    return np.kron(np.eye(n // d), np.ones((d, d)))


class FractionalRepetitionCode(GradientCode):
    """Fractional repetition code (FRC) of Tandon et al. 2017, Sec. 3.

    Clients are split into ``n/(s+1)`` groups of ``s+1`` consecutive clients; each group holds
    ``s+1`` partitions and every member sends their plain sum. The set of replies decodes exactly
    as soon as every group has one reply (possibly well before ``n - s`` replies), with
    coefficients of magnitude at most 1: decoding is perfectly conditioned. Needs ``(s+1) | n``.

    Under more than ``s`` stragglers it is an approximate code (Charles et al. 2017): a fully
    straggled group loses its ``s+1`` partitions; see :func:`frc_expected_error`.
    """

    name = "frc"

    def __init__(self, n: int, s: int, *, weights: Iterable[float] | None = None) -> None:
        super().__init__(frc_matrix(n, s), s, is_exact=True, weights=weights)

    def _compute_decoding(self, got: frozenset[int]) -> Decoding:
        """Closed form: each received member of a group gets ``1 / (replies of its group)``.

        A group's rows are identical (ones on its ``s+1`` partitions), so its weighted least
        squares ``min ||w (sum_F a - 1)||`` is solved by any ``a`` summing to 1 and the
        minimum-norm one splits it evenly; a group without replies gets nothing. This is what
        the dense solver returns, in O(n) without LAPACK.
        """
        a = np.zeros(self.n)
        rows = np.array(sorted(got), dtype=np.int64)
        if rows.size:
            groups = rows // (self.s + 1)
            a[rows] = 1.0 / np.bincount(groups)[groups]
        return self.decoding_from(got, a)

    def is_decodable(self, received: Iterable[int]) -> bool:
        """Group coverage: one reply per group (O(|received|), no linear algebra)."""
        order = self._check_received(received)
        groups = {i // (self.s + 1) for i in order}
        return len(groups) == self.n // (self.s + 1)


def frc_expected_error(n: int, d: int, r: int) -> float:
    """``E[err]/k`` of FRC with group size ``d`` under ``r`` uniformly random stragglers.

    A group is lost iff all its ``d`` members straggle, so ``E[err]/k = C(n-d, r-d) / C(n, r)``
    (Charles, Papailiopoulos, Ellenberg 2017).
    """
    from math import comb

    if not 0 <= r <= n or not 1 <= d <= n:
        raise ValueError(f"need 0 <= r <= n and 1 <= d <= n; got n={n}, d={d}, r={r}")
    if r < d:
        return 0.0
    return comb(n - d, r - d) / comb(n, r)


def crc_matrix(n: int, s: int, rng: np.random.Generator) -> np.ndarray:
    """One draw of Tandon et al.'s randomized cyclic repetition code (Algorithm 2).

    ``H = [H~, -H~ 1]`` with ``H~ ~ N(0, 1)^{s x (n-1)}``; row ``w`` has support
    ``{w, ..., w+s} mod n``, ``B[w, w] = 1`` and solves ``H b_w = 0``. All rows lie in the
    ``(n-s)``-dimensional null space of ``H``, which contains ``1``; any ``n-s`` rows span it with
    probability 1.
    """
    n, s = check_n_s(n, s)
    B = np.zeros((n, n))
    if s == 0:
        return np.eye(n)
    Ht = rng.standard_normal((s, n - 1))
    H = np.hstack([Ht, -Ht.sum(axis=1, keepdims=True)])
    for w in range(n):
        others = [(w + t) % n for t in range(1, s + 1)]
        x = np.linalg.solve(H[:, others], -H[:, w])
        B[w, w] = 1.0
        B[w, others] = x
    return B


class CyclicRepetitionCode(GradientCode):
    """Randomized cyclic repetition code (CRC) of Tandon et al. 2017, Sec. 4 (Algorithm 2).

    Works for every ``(n, s)``; each row has exactly ``s+1`` nonzeros (the optimal load), any
    ``n - s`` replies decode. **Not numerically stable:** the worst condition number over
    straggler sets reaches ~1e9 at n = 48..96 (measured; ``tests/codes/test_codes_exact.py``),
    so use ``"grouped-rs"`` or ``"frc"`` for real runs. With ``draws > 1`` several encoding matrices
    are drawn and the one with the smallest worst condition number over screened straggler
    sets (all sets when few, else every burst plus random sets) is kept.

    Decoding. For ``|F| >= n - s`` received clients and ``s < n - s`` the decoder exploits the
    cyclic band (:mod:`fl_gradcode.codes.cyclic_solver`): banded LU of an ``(n-s)``-square
    block plus an ``s``-column least-squares update, ``O(n s^2)`` instead of the dense QR's
    ``O(n^3)`` (about 15 ms instead of 200 ms at n = 1000, s = 100). It returns the same
    minimum-norm least-squares vector as the dense path, refined on the full residual; when
    that residual is above the exactness tolerance, for fewer than ``n - s`` replies
    (approximate decoding) and for ``s >= n - s`` (where the band is no cheaper), the dense
    least-squares path of :class:`GradientCode` decides.
    """

    name = "crc"

    def __init__(
        self,
        n: int,
        s: int,
        *,
        seed: int = 0,
        draws: int = 1,
        weights: Iterable[float] | None = None,
    ) -> None:
        n, s = check_n_s(n, s)
        if draws < 1:
            raise ValueError(f"draws={draws} must be >= 1")
        rng = np.random.default_rng(seed)
        best, best_cond = None, np.inf
        for _ in range(draws):
            B = crc_matrix(n, s, rng)
            if draws == 1:
                best = B
                break
            worst = 0.0
            for stragglers in straggler_patterns(n, s, max_sets=64, seed=seed):
                rows = [i for i in range(n) if i not in stragglers]
                sv = np.linalg.svd(B[rows], compute_uv=False)
                worst = max(worst, sv[0] / sv[-1])
            if worst < best_cond:
                best, best_cond = B, worst
        super().__init__(best, s, is_exact=True, weights=weights)
        self.screened_condition = float(best_cond)
        self._cols, self._vals = cyclic_supports(self.B, s)

    def _compute_decoding(self, got: frozenset[int]) -> Decoding:
        n, s = self.n, self.s
        if s == 0:  # B = I
            return _identity_decoding(self, got)
        if len(got) >= n - s and s < n - s:
            received = np.array(sorted(got), dtype=np.int64)
            try:
                with np.errstate(all="ignore"):  # a near-singular band is caught just below
                    coeffs = cyclic_decoding_vector(
                        self._cols, self._vals, self.weights, received
                    )
            except np.linalg.LinAlgError:
                coeffs = None
            if coeffs is not None and np.all(np.isfinite(coeffs)):
                a = np.zeros(n)
                a[received] = coeffs
                dec = self.decoding_from(got, a)
                if dec.exact:
                    return dec
        return super()._compute_decoding(got)
