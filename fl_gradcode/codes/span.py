"""An incremental orthonormal basis of received rows: a cheap necessary test of decodability.

A set ``F`` of replies decodes exactly when some ``a`` has ``a @ B[F] == 1`` (Tandon, Lei,
Dimakis, Karampatziakis, "Gradient Coding", ICML 2017, https://arxiv.org/abs/1612.03301), to
the tolerance ``EXACT_TOL`` per partition: then the all-ones vector lies within
``sqrt(k) EXACT_TOL`` of the row span of ``B[F]``. :class:`RowSpan` keeps an orthonormal basis
of that span, one row at a time (classical Gram-Schmidt, re-orthogonalised: Giraud, Langou,
Rozloznik, "The loss of orthogonality in the Gram-Schmidt orthogonalization process", 2005),
and the distance of the ones vector from it, in ``O(rank k)`` per row instead of one
least-squares solve of the whole set. A distance above :data:`FAR` (many orders of magnitude
above what an exact decoding and the rounding of the basis allow) proves the set does not
decode; below it the code's own ``is_decodable`` decides. A row with any component outside
the basis beyond rounding extends it: a larger span only makes the test pass more often, never
refuses a decodable set.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["FAR", "RowSpan"]

#: Distance of the ones vector from the span, relative to its norm ``sqrt(k)``, above which a
#: set cannot decode: an exact decoding leaves at most ``EXACT_TOL = 1e-8`` per partition, and
#: the basis' rounding (about ``1e-16 ||a|| ||B||``) stays far below this even for decoding
#: vectors of norm ``1e9`` (the worst conditioned CRC sets).
FAR = 1e-4
#: A row whose component outside the span is below this, relative to its norm, is in the span
#: up to rounding (it adds no direction; what it leaves out, ``ROUNDING ||a|| ||B||``, is far
#: below :data:`FAR`).
ROUNDING = 1e-13


class RowSpan:
    """The span of the rows added so far and the distance of ``ones(k)`` from it."""

    def __init__(self, k: int) -> None:
        self.k = int(k)
        self._basis = np.zeros((self.k, self.k))
        self.rank = 0
        self._target = np.ones(self.k)
        self._residual = self._target.copy()

    def add(self, row: np.ndarray) -> None:
        """Extend the span by ``row`` (length ``k``)."""
        v = np.asarray(row, dtype=np.float64)
        scale = _norm(v)
        if self.rank == self.k or not (scale > 0.0 and np.isfinite(scale)):
            return
        v, left = v / scale, 1.0  # left: the row's relative component outside the span
        q = self._basis[: self.rank]
        for _ in range(4):  # until a pass barely shortens it: orthogonal to working precision
            w = v - q.T @ (q @ v)
            norm = _norm(w)
            left *= norm
            if not left > ROUNDING:  # inside the span up to rounding
                return
            v = w / norm
            if norm > 0.5:
                break
        self._basis[self.rank] = v
        self.rank += 1
        self._residual = self._residual - v * (v @ self._residual)  # v is orthogonal to the rest

    def add_rows(self, rows: np.ndarray) -> None:
        """Extend an empty span by several rows at once: one Householder QR of the rows
        scaled to unit norm, instead of one Gram-Schmidt pass per row. Every column of the
        ``Q`` factor is kept (their span holds every row exactly; for rank-deficient rows it
        is larger than theirs, which only makes :attr:`may_decode` pass more often, never
        refuse a decodable set). A non-empty span, a single row or more rows than ``k``
        are added one at a time."""
        v = np.asarray(rows, dtype=np.float64)
        if v.ndim != 2 or v.shape[1] != self.k:
            raise ValueError(f"rows must have shape (m, {self.k}); got {v.shape}")
        norms = np.sqrt(np.einsum("ij,ij->i", v, v))
        keep = (norms > 0.0) & np.isfinite(norms)
        v = v[keep] / norms[keep, None]
        if self.rank or not 1 < len(v) <= self.k:
            for row in v:
                self.add(row)
            return
        q = np.linalg.qr(v.T)[0]  # k x m, orthonormal columns spanning the rows
        self.rank = q.shape[1]
        self._basis[: self.rank] = q.T
        self._residual = self._target - q @ (q.T @ self._target)

    @property
    def distance(self) -> float:
        """``||ones - P ones|| / ||ones||`` with ``P`` the projection on the span."""
        return _norm(self._residual) / math.sqrt(self.k) if self.k else 0.0

    @property
    def may_decode(self) -> bool:
        """``False`` only when the rows provably cannot combine to the ones vector."""
        return bool(self.distance <= FAR)


def _norm(v: np.ndarray) -> float:
    """``float(np.linalg.norm(v))`` of a 1-D float64 vector, computed as numpy does it
    (``sqrt(v . v)``) without its dispatch (a few microseconds, several times per row)."""
    return math.sqrt(float(v.dot(v)))
