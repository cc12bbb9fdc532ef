"""Input checks shared by every code: ``n`` and ``s``, partition weights, update vectors.

Each check returns the value in the form the codes use (Python ``int``, read-only float64
weights, float64 vectors) or raises ``ValueError`` naming the bad value.
"""

from __future__ import annotations

from numbers import Integral
from typing import Any

import numpy as np

__all__ = ["as_int", "check_n_s", "check_vector", "check_weights"]


def as_int(value: Any, name: str) -> int:
    """``value`` as an ``int``; booleans and non-integers are refused."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise ValueError(f"{name}={value!r} must be an integer")
    return int(value)


def check_n_s(n: Any, s: Any) -> tuple[int, int]:
    """Validate the number of clients ``n`` and the straggler tolerance ``s``."""
    n = as_int(n, "n")
    s = as_int(s, "s")
    if n < 1:
        raise ValueError(f"n={n} must be >= 1 (number of clients)")
    if s < 0:
        raise ValueError(f"s={s} must be >= 0 (number of tolerated stragglers)")
    if s >= n:
        raise ValueError(f"s={s} must be < n={n}")
    return n, s


def check_weights(weights: Any, k: int) -> np.ndarray:
    """Read-only partition weights: ``k`` positive finite floats (ones when ``None``)."""
    if weights is None:
        w = np.ones(k)
    else:
        w = np.array(weights, dtype=np.float64)
        if w.shape != (k,):
            raise ValueError(
                f"weights have shape {w.shape}; expected ({k},), one per partition"
            )
        bad = np.flatnonzero(~np.isfinite(w) | (w <= 0))
        if bad.size:
            j = int(bad[0])
            raise ValueError(f"weights[{j}]={float(w[j])!r} must be positive and finite")
    w.setflags(write=False)
    return w


def check_vector(v: Any, what: str) -> np.ndarray:
    """A finite real 1-D array as float64 (no copy when it already is)."""
    arr = np.asarray(v)
    if arr.ndim != 1:
        raise ValueError(f"{what} must be a 1-D array; got shape {arr.shape}")
    if not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
        raise ValueError(f"{what} must be a real numeric array; got dtype {arr.dtype}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{what} contains NaN or Inf")
    return arr.astype(np.float64, copy=False)
