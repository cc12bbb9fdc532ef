"""Experiment-only code policies: reference schemes built on the library's public extension
point (``GradientCoding(code_policy=...)``, :mod:`fl_gradcode.flower.policy`), never by
replacing the strategy's methods. They are not options a user would turn on:

* :class:`HindsightCodePolicy` (``oracle s=v`` of ``time_to_accuracy.py``): ``s="auto"``'s
  machinery with its choice fixed at ``v`` once the estimator has data (round 1 keeps the
  rule's ``s_max``; whom to queue is still decided by auto's rule with the server's
  knowledge). Knowing the best ``v`` needs every ``v`` run to the end: a bound, not a policy.
* :class:`ResettingCodePolicy` (``auto-reset`` of ``sampled_cohorts.py``): the estimator of
  earlier versions, restarted whenever the cohort differs from the last round's, to measure
  what keeping the estimates across sampled cohorts is worth.

Pass them as a class, e.g. ``functools.partial(HindsightCodePolicy, v=1)``: the strategy
builds them with its option groups (``options=``, an
:class:`~fl_gradcode.flower.options.Options` holding ``s_max``, ``auto_margin``, ``busy``,
``seed``, ...), which they hand on to :class:`~fl_gradcode.flower.policy.AdaptiveCodePolicy`.
"""

from __future__ import annotations

from typing import Any

from fl_gradcode.codes import NestedPlacement
from fl_gradcode.flower.policy import AdaptiveCodePolicy


class HindsightCodePolicy(AdaptiveCodePolicy):
    """``s="auto"`` deciding among ``[v]`` alone once its estimator has data."""

    def __init__(self, *, v: int, **keywords: Any) -> None:
        super().__init__(**keywords)
        self.v = int(v)

    def candidates(self, placement: NestedPlacement, estimator: Any) -> list[int]:
        if estimator.has_data:
            return [self.v]
        return super().candidates(placement, estimator)


class ResettingCodePolicy(AdaptiveCodePolicy):
    """``s="auto"`` with a new latency estimator whenever the cohort differs from the last
    round's (the names it gave nodes are kept, as earlier versions did)."""

    def __init__(self, **keywords: Any) -> None:
        super().__init__(**keywords)
        self.last_cohort: tuple[int, ...] | None = None

    def estimator(self, n: int, cohort: list[int]) -> Any:
        if self.last_cohort not in (None, tuple(cohort)):
            self.book.estimator, self.book.node_index = None, {}
            self.book.late.clear()
        self.last_cohort = tuple(cohort)
        return super().estimator(n, cohort)
