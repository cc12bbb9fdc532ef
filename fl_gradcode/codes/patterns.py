"""Straggler patterns used to screen codes, test them and benchmark them."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

import numpy as np

__all__ = ["bursts", "straggler_patterns"]


def bursts(n: int, size: int) -> Iterator[frozenset[int]]:
    """All cyclically contiguous straggler sets ``{b, b+1, ..., b+size-1} mod n`` (a slow rack)."""
    if size == 0:
        yield frozenset()
        return
    for start in range(n if size < n else 1):
        yield frozenset((start + t) % n for t in range(size))


def straggler_patterns(
    n: int, size: int, *, max_sets: int = 256, seed: int = 0
) -> Iterator[frozenset[int]]:
    """Straggler sets of ``size`` clients: all of them when ``C(n, size) <= max_sets``,
    otherwise every contiguous burst plus ``max_sets`` uniformly random sets (seeded)."""
    if math.comb(n, size) <= max_sets:
        for combo in itertools.combinations(range(n), size):
            yield frozenset(combo)
        return
    yield from bursts(n, size)
    rng = np.random.default_rng(seed)
    for _ in range(max_sets):
        yield frozenset(int(i) for i in rng.choice(n, size=size, replace=False))
