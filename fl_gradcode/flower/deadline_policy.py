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
from typing import Any

from flwr.app import Message

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

    def __init__(self, options: DeadlineOptions, predicts: bool) -> None:
        self.options = options
        self.predicts = predicts
        self.missed = 0  # rounds in a row that did not decode exactly by a predicted deadline
        self.planned = False  # this round's deadline is an approximate round's (planned)

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
        if factor is not None and self.predicts and decision is not None:
            predicted = decision.expected_time
            if math.isfinite(predicted) and predicted > 0:
                backoff = self.BACKOFF ** min(self.missed, 30)
                limit = min(limit, factor * backoff * predicted)
        return limit

    def after_round(self, decode: str, deadline: float) -> None:
        """Count a miss (a round that ended at a predicted deadline without decoding
        exactly) or reset after an exact round."""
        if decode == "exact":
            self.missed = 0
        elif self.planned:  # an approximate round by plan: no prediction was missed
            return
        elif deadline < self.options.straggler_timeout:  # a predicted deadline was missed
            self.missed += 1

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
            return min(self.options.min_replies, code.n)
        return None if code.is_exact else code.n - code.s
