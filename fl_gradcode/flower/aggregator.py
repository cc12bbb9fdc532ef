"""From a closed, cross-checked round's replies to the inner strategy's model.

:class:`RoundAggregator` picks the decoding of the replies the cross-check kept, decides the
round's status (``"exact"``, ``"approx"`` within ``max_decode_error``, or ``"skipped"``;
withheld when the verifier does not clear it), decodes through the one
:class:`~fl_gradcode.flower.decoder.Decoder` path (again without the replies whose values turn
out not finite) and returns the round with its typed
:class:`~fl_gradcode.flower.records.RoundOutcome`. The decoding is gradient coding's
(Tandon, Lei, Dimakis, Karampatziakis, ICML 2017, https://arxiv.org/abs/1612.03301).
"""

from __future__ import annotations

import dataclasses
from logging import WARNING

from flwr.app import ArrayRecord, MetricRecord
from flwr.common.logger import log

from ..codes import Decoding
from .blas import serial_blas
from .decoder import Decoder, Outcome, replies_read
from .records import RoundOutcome
from .round_state import RoundState, rejection
from .verifier import RoundVerifier

__all__ = ["WARN_DECODE_ERROR", "RoundAggregator"]

#: An approximate round applied with a relative decoding error above this is named in a
#: WARNING (``max_decode_error``, default 0.5, decides whether it is applied at all).
WARN_DECODE_ERROR = 0.1


class RoundAggregator:
    """Decodes a closed round (one job: the round's aggregation).

    ``verifier``: clears the decoding about to be applied; ``max_decode_error``: the largest
    relative decoding error an approximate round may have and still be applied."""

    def __init__(self, *, decoder: Decoder, verifier: RoundVerifier,
                 max_decode_error: float) -> None:
        self.decoder, self.verifier = decoder, verifier
        self.max_decode_error = float(max_decode_error)

    def status(self, decoding: Decoding | None) -> str:
        """``"exact"``, ``"approx"`` (within ``max_decode_error``) or ``"skipped"``."""
        if decoding is not None and (decoding.exact or decoding.error <= self.max_decode_error):
            return "exact" if decoding.exact else "approx"
        return "skipped"

    def decode(self, state: RoundState
               ) -> tuple[RoundState, ArrayRecord | None, MetricRecord | None]:
        """The round with its outcome, and the arrays and metrics of the inner strategy's
        aggregation of the decoded average (``None`` when skipped). The server's own linear
        algebra runs with BLAS on one thread (:func:`~.blas.serial_blas`); the inner
        strategy's does not."""
        assert state.verification is not None, "the decoding follows the cross-check"
        used, verdict = list(state.verification.used), state.verification.verdict
        with serial_blas():
            decoding = self.decoder.decoding(state.code, used)
        decode = self.status(decoding)
        verdict, withheld = self.verifier.clearance(state, used, decoding, verdict, decode)
        if withheld:
            decode = "skipped"
        result = None if decode == "skipped" else self._apply(state, used, decoding)
        bad = {} if result is not None or decode == "skipped" else (
            self.decoder.non_finite(state.valid, used))
        dropped = tuple(rejection(state.number, state.cohort[w], w, reason)
                        for w, reason in bad.items())
        if bad:  # replies whose values were not read on arrival: drop them, decode again
            used = [w for w in used if w not in bad]
            with serial_blas():
                decoding = self.decoder.decoding(state.code, used)
            decode = self.status(decoding)
            result = None if decode == "skipped" else self._apply(state, used, decoding)
        arrays, metrics, count, noise_std = result or (None,) * 4
        outcome = RoundOutcome(
            "skipped" if result is None else decode, used,
            0 if result is None else replies_read(decoding, used),
            float(decoding.error) if decoding is not None else 1.0, verdict, count, noise_std,
            dropped)
        if outcome.decode == "approx" and outcome.decode_error > WARN_DECODE_ERROR:
            log(WARNING, "round %d: applied an approximate decoding with relative error %.3g, "
                "above %.3g (max_decode_error=%.3g): the update is a biased average of the "
                "partitions that arrived. Set max_decode_error lower to skip such rounds, or "
                "raise s or straggler_timeout", state.number, outcome.decode_error,
                WARN_DECODE_ERROR, self.max_decode_error)
        return dataclasses.replace(state, outcome=outcome), arrays, metrics

    def _apply(self, state: RoundState, used: list[int],
               decoding: Decoding | None) -> Outcome | None:
        """Decode the example-weighted average (privatised), hand it to the inner strategy."""
        assert decoding is not None  # a round that decodes nothing is skipped
        with serial_blas():
            decoded = self.decoder.decode(state.code, state.valid, used, decoding, state.theta,
                                          state.dtypes, round_number=state.number,
                                          sizes=state.sizes)
        if decoded is None:
            return None
        return self.decoder.apply(decoded, round_number=state.number,
                                  array_key=state.array_key, reply_to=state.sent[used[0]])
