"""When a coded round stops waiting: the straggler deadline, ``auto_deadline``'s predicted one
with exponential backoff after misses, and what the grid is told.

The predicted deadline is ``auto_deadline`` times the round time the code policy predicts for
the round's code, never beyond ``straggler_timeout``; after a round that missed it (did not
decode exactly), the next one is :attr:`DeadlinePolicy.BACKOFF` times longer, again after each
miss in a row, back to the factor after an exact round: the backoff of a retransmission timer
(Paxson, Allman, Chu, Sargent, "Computing TCP's Retransmission Timer", RFC 6298, section 5.5).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from logging import WARNING
from typing import Any

from flwr.app import Message
from flwr.common.logger import log

from .clock import Clock
from .options import DeadlineOptions

__all__ = ["DeadlinePolicy"]


class DeadlinePolicy:
    """Each round's deadline (seconds from its start) and the grid's wall-clock limits.

    ``predicts``: the code policy predicts round times (``s="auto"``, or ``busy="fit"``), the
    condition for ``auto_deadline`` to apply.
    """

    #: factor by which the deadline grows after each predicted deadline missed in a row
    BACKOFF = 2.0
    #: rounds in a row ending at ``straggler_timeout`` without an exact decoding before the
    #: run warns that the deadline is below the clients' reply times
    UNREACHABLE_ROUNDS = 3

    def __init__(self, options: DeadlineOptions, predicts: bool) -> None:
        self.options = options
        self.predicts = predicts
        self.missed = 0  # rounds in a row that did not decode exactly by a predicted deadline
        self.planned = False  # this round's deadline is an approximate round's (planned)
        self.at_timeout = 0  # rounds in a row ended at straggler_timeout, not exact
        self.warned = False  # the unreachable-deadline warning is given once per run
        self.warned_min_replies = False  # min_replies above a cohort: said once

    def round_deadline(self, decision: Any) -> float:
        """This round's deadline: ``straggler_timeout``, or with ``auto_deadline`` that factor
        times the predicted time of this round's code (``decision.expected_time``) when it is
        finite and positive, if shorter; an approximate round's planned ``decision.deadline``
        (``auto_approximate``) when it has one."""
        limit = self.options.straggler_timeout
        planned = getattr(decision, "deadline", None)  # an approximate round (auto_approximate)
        self.planned = planned is not None
        if self.planned and math.isfinite(planned) and planned > 0:
            return min(limit, float(planned))
        factor = self.options.auto_deadline
        if self.predicts and decision is not None:
            self._warn_if_unreachable(decision.expected_time, getattr(decision, "s", None))
        if factor is not None and self.predicts and decision is not None:
            predicted = decision.expected_time
            if math.isfinite(predicted) and predicted > 0:
                backoff = self.BACKOFF ** min(self.missed, 30)
                limit = min(limit, factor * backoff * predicted)
        return limit

    def after_round(self, decode: str, deadline: float) -> None:
        """Count a miss (a round that ended at a predicted deadline without decoding
        exactly) or reset after an exact round."""
        at_timeout = deadline >= self.options.straggler_timeout and not self.planned
        self.at_timeout = self.at_timeout + 1 if decode != "exact" and at_timeout else 0
        if self.at_timeout >= self.UNREACHABLE_ROUNDS:
            self._warn(f"{self.at_timeout} rounds in a row ended at it without an exact "
                       "decoding")
        if decode == "exact":
            self.missed = 0
        elif self.planned:  # an approximate round by plan: no prediction was missed
            return
        elif deadline < self.options.straggler_timeout:  # a predicted deadline was missed
            self.missed += 1

    def _warn_if_unreachable(self, predicted: float, s: Any) -> None:
        limit = self.options.straggler_timeout
        if not math.isnan(predicted) and predicted > limit:
            self._warn(f"s='auto' predicts {predicted:.3g} s for its round (s={s})")

    def _warn(self, evidence: str) -> None:
        """Once per run: the straggler deadline is below what the clients take, so rounds
        end there before any code can decode exactly (approximate or skipped rounds)."""
        if self.warned:
            return
        self.warned = True
        log(WARNING, "straggler_timeout=%g s is below the clients' round times: %s, so "
            "rounds end at the deadline before they can decode exactly (approximate or "
            "skipped); raise it (run config `straggler-timeout`) above the replies' times",
            self.options.straggler_timeout, evidence)

    def grid_deadline_s(self, clock: Clock, round_number: int | None,
                        sent: Iterable[Message], timeout: float | None) -> float:
        """Wall-clock seconds the grid waits for the round in progress (the clock reads its
        own deadline: :meth:`~fl_gradcode.flower.clock.Clock.grid_limit_s`)."""
        return clock.grid_limit_s(round_number or 0, self.options, timeout, sent)

    def first_reply_deadline_s(self, clock: Clock, round_number: int | None) -> float | None:
        """The straggler deadline counted from the first reply (wallclock round 1), or
        ``None``."""
        return clock.first_reply_deadline_s(round_number, self.options.straggler_timeout)

    def stopping_replies(self, code: Any) -> int | None:
        """A round also ends at this many valid replies: ``min_replies`` (at most ``n``), or
        ``n - s`` for an approximate code; ``None``: only a decodable set ends it."""
        if self.options.min_replies is not None:
            if self.options.min_replies > code.n and not self.warned_min_replies:
                self.warned_min_replies = True
                log(WARNING, "min_replies=%d is more than the round's cohort of %d clients: "
                    "such rounds end at their %d replies (or a decodable set, or the "
                    "deadline); this warning is given once", self.options.min_replies, code.n,
                    code.n)
            return min(self.options.min_replies, code.n)
        return None if code.is_exact else code.n - code.s
