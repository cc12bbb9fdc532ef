"""A latency estimator seen through one round's cohort (sampled cohorts: what is learnt
about a node outlives the rounds it is not sampled in): :class:`CohortView`, defined beside
:class:`~fl_gradcode.adaptive.estimator.LatencyEstimator` (which builds views of itself)."""

from __future__ import annotations

from .estimator import CohortView

__all__ = ["CohortView"]
