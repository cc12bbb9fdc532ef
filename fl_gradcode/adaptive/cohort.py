"""A latency estimator seen through one round's cohort (sampled cohorts: what is learnt
about a node outlives the rounds it is not sampled in)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .estimator import LatencyEstimator

__all__ = ["CohortView"]


class CohortView:
    """A :class:`LatencyEstimator` over every node ever seen, restricted to this round's
    cohort (client ``w`` of the view is ``members[w]`` of the estimator): what
    :func:`choose_s` needs when the strategy samples a different cohort each round, so that
    what was learnt about a node survives the rounds it is not sampled in.

    Draws are the estimator's draws for all its clients, columns ``members`` (the same
    numbers as the estimator itself when ``members`` is ``0..n-1``).
    """

    def __init__(self, estimator: LatencyEstimator, members: Sequence[int] | np.ndarray):
        idx = np.asarray(members, dtype=np.int64)
        if idx.ndim != 1 or idx.size == 0:
            raise ValueError(f"members must be a non-empty 1-D sequence; got shape {idx.shape}")
        bad = (idx < 0) | (idx >= estimator.n)
        if bad.any():
            raise ValueError(f"member {int(idx[bad][0])} outside [0, {estimator.n})")
        if np.unique(idx).size != idx.size:
            raise ValueError("members must be distinct")
        self.base, self.members, self.n = estimator, idx, int(idx.size)
        self.seed = estimator.seed

    @property
    def has_data(self) -> bool:
        return self.base.has_data

    @property
    def load_exponent(self) -> float:
        return self.base.load_exponent

    @property
    def next_round_id(self) -> int:
        return self.base.next_round_id

    def slowness(self) -> np.ndarray:
        return self.base.slowness()[self.members]

    def sample(self, size: int, rng: np.random.Generator | None = None) -> np.ndarray:
        return self.base.sample(size, rng)[:, self.members]

    def sample_remaining(
        self,
        elapsed: Sequence[float] | np.ndarray,
        load: Sequence[float] | np.ndarray,
        size: int,
        rng: np.random.Generator | None = None,
    ) -> np.ndarray:
        elapsed = np.asarray(elapsed, dtype=np.float64)
        load = np.asarray(load, dtype=np.float64)
        if elapsed.shape != (self.n,) or load.shape != (self.n,):
            raise ValueError(f"elapsed and load must have shape ({self.n},); got "
                             f"{elapsed.shape} and {load.shape}")
        full_e, full_l = np.full(self.base.n, np.nan), np.zeros(self.base.n)
        full_e[self.members], full_l[self.members] = elapsed, load
        return self.base.sample_remaining(full_e, full_l, size, rng)[:, self.members]

