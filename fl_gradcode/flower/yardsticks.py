"""Disagreements between replicas' replies relative to per-projection yardsticks.

Each projection of a reply (:class:`~fl_gradcode.flower.integrity.Probe`) is judged against
its own part's size (the model's projections against the arrays' norm, the count against the
count, the metrics' against the whole reply), the median over the replies compared: one part's
size (a large app metric) cannot widen another's tolerance, and one huge reply cannot drown
the others' disagreements.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["norm", "relative", "relative_rows", "typical_yardstick", "yardsticks"]


def norm(x: np.ndarray) -> float:
    """Euclidean norm without overflow (``inf`` when ``x`` is not finite)."""
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    if x.size == 0:
        return 0.0
    with np.errstate(all="ignore"):
        top = float(np.max(np.abs(x)))
        if not np.isfinite(top):
            return float("inf")
        if top == 0.0:
            return 0.0
        y = x / top
        return top * float(np.sqrt(y @ y))


def yardsticks(z: Mapping[int, np.ndarray], sizes: Mapping[int, Any] | None,
               workers: Sequence[int]) -> np.ndarray:
    """Per worker, each projection's yardstick (a scalar size, or without ``sizes`` the
    projections' norm, stands for all its projections)."""
    rows = [np.asarray(sizes[w] if sizes is not None else norm(z[w]), dtype=np.float64)
            for w in workers]
    width = max((np.size(z[w]) for w in workers), default=1)
    return np.array([np.broadcast_to(r, (width,)) if r.ndim == 0 else r for r in rows])


def typical_yardstick(z: Mapping[int, np.ndarray], sizes: Mapping[int, Any] | None,
                      workers: Sequence[int]) -> np.ndarray:
    """Each projection's typical yardstick: the median over ``workers`` (inf if one is)."""
    values = yardsticks(z, sizes, workers)
    if not np.all(np.isfinite(values)):
        return np.full(values.shape[1], np.inf)
    return np.median(values, axis=0)


def relative(diff: np.ndarray, scale: np.ndarray) -> float:
    """The norm of ``diff`` with each projection divided by its yardstick (one scalar
    yardstick: ``|diff| / scale``); a difference where the yardstick is 0, or a non-finite
    value, is never agreement."""
    return float(relative_rows(np.asarray(diff, dtype=np.float64)[None, :], scale)[0])


def relative_rows(diff: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """:func:`relative` of each row of ``diff`` at once (without overflow, as :func:`norm`)."""
    scale = np.broadcast_to(np.asarray(scale, dtype=np.float64), diff.shape[1:])
    zero = scale <= 0
    with np.errstate(all="ignore"):
        scaled = np.where(zero, 0.0, diff / np.where(zero, 1.0, scale))
        top = np.max(np.abs(scaled), axis=1, initial=0.0)
        norms = top * np.sqrt(np.sum((scaled / np.where(top > 0, top, 1.0)[:, None]) ** 2,
                                     axis=1))
    bad = ~np.all(np.isfinite(diff), axis=1) | np.any(diff[:, zero] != 0, axis=1)
    if not np.all(np.isfinite(scale)):
        bad[:] = True
    return np.where(bad | ~np.isfinite(norms), np.inf, norms)
