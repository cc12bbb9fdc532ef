"""What a decoder returns, and the least-squares solve behind it.

:class:`Decoding` is the answer of :meth:`~fl_gradcode.codes.GradientCode.decoding` for one
received set; :func:`least_squares` is the numerically careful solve every block of a code goes
through; :class:`LRUCache` keeps solved sets.

References:
    Tandon, Lei, Dimakis, Karampatziakis, "Gradient Coding: Avoiding Stragglers in Distributed
    Learning", ICML 2017, https://arxiv.org/abs/1612.03301 (the decoder ``a @ B_F = 1``).
    Charles, Papailiopoulos, Ellenberg, "Approximate Gradient Coding via Sparse Random Graphs",
    2017, https://arxiv.org/abs/1711.06771 (least-squares decoding of approximate codes).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.linalg

__all__ = ["EXACT_TOL", "Decoding", "LRUCache", "NotDecodableError", "least_squares"]

#: A decoding vector is exact when ``max |B_F^T a - 1| <= EXACT_TOL``.
EXACT_TOL = 1e-8


class NotDecodableError(Exception):
    """The received set does not determine the exact (weighted) sum of the partition updates."""


@dataclass(frozen=True)
class Decoding:
    """How the server combines the replies of one received set.

    Attributes:
        received: the received clients, sorted.
        coefficients: length-``n`` decoding vector, zero outside ``received`` (an ``(m, n)``
            matrix for codes whose replies carry ``m`` chunks: one row per chunk).
        exact: whether ``coefficients @ B == 1`` holds (to ``EXACT_TOL``).
        error: decoding error ``||w * (B_F^T a - 1)||^2 / ||w||^2``; for unit weights this is
            ``||B_F^T a - 1||^2 / k``, the error of Charles et al. normalised by ``k``.
        alpha: effective partition multipliers ``B_F^T a`` (1 everywhere when exact).
    """

    received: tuple[int, ...]
    coefficients: np.ndarray = field(repr=False)
    exact: bool
    error: float
    alpha: np.ndarray = field(repr=False)

    @property
    def coefficient_norm(self) -> float:
        """``||a||_2``: how much independent per-reply noise the decoder amplifies."""
        return float(np.linalg.norm(self.coefficients))


class LRUCache:
    """A small bounded cache keyed by frozensets of clients."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self._data: OrderedDict[frozenset[int], Any] = OrderedDict()

    def get(self, key: frozenset[int]) -> Any:
        """The value stored under ``key`` (now the most recent), or ``None``."""
        value = self._data.get(key)
        if value is not None:
            self._data.move_to_end(key)
        return value

    def put(self, key: frozenset[int], value: Any) -> None:
        """Store ``value`` under ``key``, dropping the least recent entries beyond ``maxsize``."""
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > self.maxsize:
            self._data.popitem(last=False)


def least_squares(A: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Minimum-norm least squares in float64 with pivoted QR, one refinement step.

    Pivoted QR can take an exactly rank-deficient system (two received clients with the
    same row, as random approximate codes draw) for full rank and return a solution of
    norm 1e15 that is not even a least-squares one; the normal equations
    ``A^T (y - A a) = 0`` or the norm tell, and the SVD (minimum norm, rank by singular
    values) is taken instead unless the QR solution's residual is smaller by more than
    the rounding its own norm allows (Golub and Van Loan, Matrix Computations, 5.5)."""
    a, *_ = scipy.linalg.lstsq(A, y, lapack_driver="gelsy", check_finite=False)
    # One step of iterative refinement: cheap, and recovers digits lost to conditioning.
    r = y - A @ a
    if np.any(r != 0):
        da, *_ = scipy.linalg.lstsq(A, r, lapack_driver="gelsy", check_finite=False)
        a2 = a + da
        if np.linalg.norm(y - A @ a2) <= np.linalg.norm(r):
            a = a2
    r = y - A @ a
    norm_a, norm_A, norm_y = (float(np.linalg.norm(x)) for x in (a, A, y))
    if (np.linalg.norm(A.T @ r) > 1e-9 * norm_A * norm_y  # not a least-squares solution
            or norm_a * norm_A > 1e6 * norm_y):  # or one of absurd norm
        eps = float(np.finfo(float).eps)
        b, *_ = scipy.linalg.lstsq(A, y, cond=eps * max(A.shape), lapack_driver="gelsd",
                                   check_finite=False)
        rb, ra = float(np.linalg.norm(y - A @ b)), float(np.linalg.norm(r))
        norm_b = float(np.linalg.norm(b))
        if norm_a > 1e3 * norm_b:
            # QR's vector carries a null-space component the SVD's has not (the system is
            # rank-deficient): a residual is computed to about eps ||A|| ||x||, so a vector
            # of norm 1e15 can show one below the optimum's by rounding alone; it wins only
            # by more than that
            noise = 64 * eps * norm_A * norm_a + 1e-9 * ra
            if rb <= ra + noise:
                a = b
        elif rb < ra * (1 - 1e-9) or (rb <= ra * (1 + 1e-9) and norm_b < norm_a):
            a = b
    return a
