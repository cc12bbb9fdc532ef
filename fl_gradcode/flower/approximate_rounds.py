"""``s="auto"`` with ``auto_approximate=True``: rounds that decode what arrived by a deadline.

:class:`ApproximateRounds` is held by :class:`~fl_gradcode.flower.policy.AdaptiveCodePolicy`.
After the exact choice (:func:`~fl_gradcode.adaptive.choose_s`) it prices every candidate
tolerance once more, exactly and with deadlines, by its cost per unit of progress
(:mod:`fl_gradcode.adaptive.approximate`: ``E[T] / (1 - E[e**p])``, ``e`` the relative
error of the decoded update measured in exact rounds, ``p`` :attr:`ApproximateRounds.
error_power`), and turns the round into an approximate one
when a deadline is cheapest. At most :attr:`ApproximateRounds.run` approximate rounds follow
each other: then an exact round measures the errors again (exploration, so that the estimate
follows the federation). Approximate decoding of gradient codes: Tandon, Lei, Dimakis,
Karampatziakis, ICML 2017, https://arxiv.org/abs/1612.03301.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..adaptive import (
    ERROR_POWER,
    Decision,
    DecodeErrors,
    check_error_power,
    choose_progress,
    measure_errors,
    missing_weights,
    price_candidates,
)
from .membership import covered_partitions

__all__ = ["ApproximateRounds"]

#: rounding allowed above ``max_skew`` (a skew summed from shares ``1/m`` equals a bound such
#: as ``f q`` only up to rounding, which would refuse a round the bound allows)
SKEW_TOLERANCE = 1e-12


class ApproximateRounds:
    """Prices approximate rounds and measures their errors in exact rounds.

    The knobs (class attributes, tuned on the development seeds only: ``docs/adaptive.md``):
    ``max_short``, ``short_fraction``: deadlines up to ``max(max_short, ceil(short_fraction
    * n))`` replies before the exact decode (and the errors measured for as many), so that a
    deadline can leave out a slow group of up to that share of the cohort at any ``n``;
    ``run``: approximate rounds in a row before an exact one;
    ``error_power``: ``p`` of the progress model (a round with relative error ``e`` makes
    ``1 - e**p`` of a round's progress: :mod:`fl_gradcode.adaptive.approximate`);
    ``alpha``: weight of the newest error measurement; ``samples``: Monte Carlo draws;
    ``tolerances``: which tolerances the approximate candidates are priced at,
    ``"trust-region"`` (the exact choice's candidates: ``s`` at least half the last round's)
    or ``"all"`` (the default, chosen on the development seeds: every tolerance of the
    placement, so drop-stragglers, ``s = 0``, stays a candidate after rounds at ``s_max``);
    the exact round it is compared with is the trust region's either way, and the trust
    region follows the last round's ``s``, approximate or exact (after an approximate round
    at ``s = 0`` every ``s`` is a candidate);
    ``max_skew``: ``None`` (no bound, the default) or the most the run's weighting of the data
    partitions may differ from FedAvg's before another approximate round is planned
    (:meth:`skew`, ``0..1``): dropping the same slow clients round after round moves the
    run's objective toward the other clients' data however small each round's error; with
    the bound, rounds stay exact while the skew is above it (exact rounds dilute it)."""

    #: the knobs above and below, by name (what a benchmark records of a run)
    KNOBS = ("max_short", "short_fraction", "run", "error_power", "alpha", "samples",
             "tolerances", "max_skew")
    #: the values :attr:`tolerances` may take
    TOLERANCES = ("trust-region", "all")
    max_short = 3
    short_fraction = 0.25
    run = 6
    error_power = ERROR_POWER
    alpha = 0.3
    samples = 256
    tolerances = "all"
    max_skew: float | None = None

    def __init__(self, seed: int) -> None:
        check_error_power(self.error_power, "ApproximateRounds.error_power")
        if self.tolerances not in self.TOLERANCES:
            raise ValueError(f"ApproximateRounds.tolerances={self.tolerances!r} must be one "
                             f"of {self.TOLERANCES}")
        if self.max_skew is not None and not 0.0 <= self.max_skew <= 1.0:
            raise ValueError(f"ApproximateRounds.max_skew={self.max_skew!r} must be None or "
                             "in [0, 1] (a total variation distance)")
        self.seed = int(seed)
        self.errors = DecodeErrors(self.alpha)
        self.streak = 0  # approximate rounds since the last exact one
        self.candidates: dict[str, Any] = {}  # the last pricing (for inspection)
        # per data partition (partition id, num-partitions), summed over the rounds with an
        # applied update: its share of the update had the round been exact (1 / the
        # cohort's partitions), and its share of the update applied (1 / the partitions a
        # used reply computed, if one did; partitions counted equally)
        self.exact_share: dict[tuple[int, int], float] = {}
        self.applied_share: dict[tuple[int, int], float] = {}
        self.applied_rounds = 0

    def over_skew(self) -> bool:
        """Whether :meth:`skew` is above :attr:`max_skew` (beyond rounding): no approximate
        round is planned then."""
        return self.max_skew is not None and self.skew() > self.max_skew + SKEW_TOLERANCE

    def skew(self) -> float:
        """How far the run's weighting of the data partitions has moved from FedAvg's
        (partitions counted equally, not by their examples): the
        total variation distance, over the rounds with an applied update, between each
        partition's mean share of the updates applied (in a round, ``1 / m`` for each of the
        ``m`` partitions a used reply computed, 0 for the others) and its mean share had
        every one of those rounds decoded exactly (``1 / k`` for each of the cohort's ``k``
        partitions): 0 before any update and while every round is exact; dropping a
        fraction ``f`` of the partitions, the same ones, in a fraction ``q`` of the rounds
        gives ``f q`` (so a bound ``b`` allows ``q <= b / f`` in the long run)."""
        if self.applied_rounds == 0:
            return 0.0
        keys = self.exact_share.keys() | self.applied_share.keys()
        return 0.5 * sum(abs(self.applied_share.get(key, 0.0) - self.exact_share.get(key, 0.0))
                         for key in keys) / self.applied_rounds

    def shortfall(self, n: int) -> int:
        """The most replies short a deadline is priced (and an error measured) for."""
        return max(int(self.max_short), math.ceil(self.short_fraction * int(n)))

    def revise(self, decision: Decision, placement: Any, estimator: Any, rem_inputs: Any,
               candidates: list[int], max_decode_error: float = math.inf,
               tolerances: list[int] | None = None) -> Decision:
        """``decision``, or an approximate round when one is cheaper per unit of progress
        than every exact round of ``candidates`` (never before an observation, with excluded
        clients, or after :attr:`run` approximate rounds in a row); the approximate rounds
        are priced at ``candidates`` or, with :attr:`tolerances` ``"all"``, at every one of
        ``tolerances`` (the placement's) as well; a decoding above ``max_decode_error`` is
        priced as a skipped round."""
        priced = list(candidates)
        if self.tolerances == "all" and tolerances is not None:
            priced = sorted(set(priced) | {int(t) for t in tolerances})
        if (not decision.observed or decision.excluded or self.streak >= self.run
                or self.over_skew()
                or (not any(self.errors.measured(s) for s in priced)
                and self.errors.heterogeneity is None)):
            return decision
        rng = np.random.default_rng([self.seed, estimator.next_round_id, 7])
        X = estimator.sample(self.samples, rng)
        rem = self._remaining(estimator, rem_inputs, decision, placement.n, rng)
        exact, approx = price_candidates(placement, estimator, priced, self.errors, rem,
                                         X, max_short=self.shortfall(placement.n),
                                         max_decode_error=max_decode_error,
                                         error_power=float(self.error_power))
        best_exact = min((exact[s] for s in candidates), key=lambda c: c.cost)
        self.candidates = {"exact": exact, "approximate": approx}
        best = choose_progress(best_exact, approx)
        if best is None:
            return decision
        return dataclasses.replace(decision, s=best.s, deadline=best.deadline,
                                   approximate_time=best.time)

    def _remaining(self, estimator: Any, inputs: Any, decision: Decision, n: int,
                   rng: np.random.Generator) -> np.ndarray:
        busy_until, pending, limit, now = inputs
        if pending is not None:
            rem = estimator.sample_remaining(pending[0], pending[1], self.samples, rng)
            rem = np.minimum(rem, np.asarray(limit)[None, :])
        elif busy_until is not None:
            rem = np.maximum(np.asarray(busy_until, dtype=np.float64) - now, 0.0)
        else:
            rem = np.zeros(n)
        rem = np.array(rem, dtype=np.float64)
        if decision.skip:  # busy members that get no work never reply
            rem[..., list(decision.skip)] = np.inf
        return rem

    def after_round(self, decision: Decision | None, state: Any, decode: str,
                    used: list[int], window_used: list[int],
                    max_decode_error: float) -> None:
        """Count the round and which data partitions its update covered (:meth:`skew`);
        after an exact round of a planned exact decision, measure the errors of its
        approximate decodings (``window_used``: replies in arrival order; a decoding above
        ``max_decode_error`` would be skipped: error 1)."""
        self._count_coverage(state, decode, used)
        if decision is not None and decision.deadline is not None:
            self.streak += 1
            return
        self.streak = 0
        if decode != "exact" or decision is None or decision.excluded or state.code.chunks != 1:
            return
        chosen = set(used)
        order = [w for w in window_used if w in chosen]
        if len(order) < 2:
            return
        short = self.shortfall(state.code.n)
        self.errors.update(state.code.s,
                           measure_errors(state.code, order, _vectors(state, order), short,
                                          max_decode_error),
                           missing_weights(state.code, order, short))

    def _count_coverage(self, state: Any, decode: str, used: list[int]) -> None:
        if not getattr(state, "partitions", None):
            return
        partitions = list(state.partitions)
        covered = covered_partitions(state.code, used, decode) & set(range(len(partitions)))
        if not covered:  # no update applied (a skipped round): the weighting is unchanged
            return
        self.applied_rounds += 1
        for j, identity in enumerate(partitions):
            key = (int(identity.partition_id), int(identity.num_partitions))
            self.exact_share[key] = self.exact_share.get(key, 0.0) + 1.0 / len(partitions)
            if j in covered:
                self.applied_share[key] = (self.applied_share.get(key, 0.0)
                                           + 1.0 / len(covered))


def _vectors(state: Any, order: list[int]) -> Mapping[int, np.ndarray]:
    """Each used reply as one float64 vector ``[sums..., count]``."""
    from .decoder import ReplyLayout

    layout = ReplyLayout.of(state.code, state.theta)
    return {w: np.concatenate([np.asarray(seg, dtype=np.float64).reshape(-1)
                               for seg in layout.message(state.valid[w])]) for w in order}
