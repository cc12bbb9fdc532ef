"""From a closed round's replies to the inner strategy's model.

:class:`RoundAggregator` cross-checks the replicas' partition sizes, picks the decoding of
the replies the clock's window used, decides the round's status (``"exact"``, ``"approx"``
within ``max_decode_error``, or ``"skipped"``; withheld by the integrity rules), decodes
through the one :class:`~fl_gradcode.flower.decoder.Decoder` path (again without the replies
whose values turn out not finite) and returns the typed
:class:`~fl_gradcode.flower.records.RoundOutcome`. The decoding is gradient coding's
(Tandon, Lei, Dimakis, Karampatziakis, ICML 2017, https://arxiv.org/abs/1612.03301).
"""

from __future__ import annotations

from logging import WARNING
from typing import Any

from flwr.app import ArrayRecord, MetricRecord
from flwr.common.logger import log

from .collector import ReplyCollector, serial_blas
from .decoder import Decoder, Outcome, replies_read
from .quarantine import Quarantine
from .records import RoundOutcome
from .reports import provably_wrong_sizes
from .round_state import RoundState

__all__ = ["WARN_DECODE_ERROR", "RoundAggregator"]

#: An approximate round applied with a relative decoding error above this is named in a
#: WARNING (``max_decode_error``, default 0.5, decides whether it is applied at all).
WARN_DECODE_ERROR = 0.1


class RoundAggregator:
    """Decodes a closed round (one job: the round's aggregation).

    ``max_decode_error``: the largest relative decoding error an approximate round may have
    and still be applied."""

    def __init__(self, *, decoder: Decoder, collector: ReplyCollector, quarantine: Quarantine,
                 max_decode_error: float) -> None:
        self.decoder, self.collector, self.quarantine = decoder, collector, quarantine
        self.max_decode_error = float(max_decode_error)

    def check_sizes(self, state: RoundState) -> None:
        """Cross-check the replicas' ``partition-sizes``: outvoted replies are rejected (an
        offence); the agreed sizes are the round's. With ``verify``, only ``s + 1`` agreeing
        replicas outvote a report, and only such a provably wrong report is an offence."""
        reported = {w: r.sizes for w, r in state.valid.items()}
        bound = state.code.s if self.collector.integrity.verify else None
        agreed, excluded = self.decoder.privatiser.check_sizes(
            state.code, state.partitions, reported, state.number, bound=bound)
        offenders = sorted(excluded) if bound is None else sorted(
            set(excluded) & provably_wrong_sizes(state.code, reported, bound))
        for worker, reason in sorted(excluded.items()):
            del state.valid[worker]
            if worker in offenders:
                state.reject(state.cohort[worker], worker, reason)
            else:  # contested, not provably wrong: left out of the round like its group
                state.left_out.append(worker)
                log(WARNING, "round %d: worker %d (node %s) left out: %s", state.number,
                    worker, state.cohort[worker], reason)
        self.quarantine.offend(state.number, [state.cohort[w] for w in offenders],
                               "partition sizes the other replicas contradict")
        if excluded:
            state.tracker = None  # rebuilt from the remaining replies
        state.sizes = agreed

    def status(self, decoding: Any) -> str:
        """``"exact"``, ``"approx"`` (within ``max_decode_error``) or ``"skipped"``."""
        if decoding is not None and (decoding.exact or decoding.error <= self.max_decode_error):
            return "exact" if decoding.exact else "approx"
        return "skipped"

    def decode(self, state: RoundState, used: list[int],
               verdict: Any) -> tuple[RoundOutcome, ArrayRecord | None, MetricRecord | None]:
        """The round's outcome, the arrays and metrics of the inner strategy's aggregation of
        the decoded average (``None`` when skipped). The server's own linear algebra runs with
        BLAS on one thread (:func:`~.collector.serial_blas`); the inner strategy's does not."""
        with serial_blas():
            decoding = self.decoder.decoding(state.code, used)
            self.collector.check_applied(state, used, decoding, verdict)
        decode = self.status(decoding)
        if self.collector.withholds(state, verdict, decode):
            decode = "skipped"
        result = None if decode == "skipped" else self._apply(state, used, decoding)
        bad = {} if result is not None or decode == "skipped" else (
            self.decoder.non_finite(state.valid, used))
        if bad:  # replies whose values were not read on arrival: drop them, decode again
            for w, reason in bad.items():
                del state.valid[w]
                state.reject(state.cohort[w], w, reason)
            used = [w for w in used if w not in bad]
            with serial_blas():
                decoding = self.decoder.decoding(state.code, used)
            decode = self.status(decoding)
            result = None if decode == "skipped" else self._apply(state, used, decoding)
        arrays, metrics, count, noise_std = result or (None,) * 4
        outcome = RoundOutcome(
            "skipped" if result is None else decode, used,
            0 if result is None else replies_read(decoding, used),
            float(decoding.error) if decoding is not None else 1.0, verdict, count, noise_std)
        if outcome.decode == "approx" and outcome.decode_error > WARN_DECODE_ERROR:
            log(WARNING, "round %d: applied an approximate decoding with relative error %.3g, "
                "above %.3g (max_decode_error=%.3g): the update is a biased average of the "
                "partitions that arrived. Set max_decode_error lower to skip such rounds, or "
                "raise s or straggler_timeout", state.number, outcome.decode_error,
                WARN_DECODE_ERROR, self.max_decode_error)
        return outcome, arrays, metrics

    def _apply(self, state: RoundState, used: list[int], decoding: Any) -> Outcome | None:
        """Decode the example-weighted average (privatised), hand it to the inner strategy."""
        with serial_blas():
            decoded = self.decoder.decode(state.code, state.valid, used, decoding, state.theta,
                                          state.dtypes, round_number=state.number,
                                          sizes=state.sizes)
        if decoded is None:
            return None
        return self.decoder.apply(decoded, round_number=state.number,
                                  array_key=state.array_key, reply_to=state.sent[used[0]])
