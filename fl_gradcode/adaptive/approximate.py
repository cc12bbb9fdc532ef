"""Approximate rounds for ``s="auto"`` (``auto_approximate``): decode what arrived by a
deadline, priced by its expected time and by what the approximation costs in progress.

A candidate is a tolerance ``s`` of the nested placement and a deadline ``d``: the round ends
when the replies decode exactly or at ``d``, whichever is first; at ``d`` it decodes by least
squares from the replies in hand (with ``s = 0`` this is drop-stragglers; with ``s > 0``
the approximate decoding of a gradient code: codes of Tandon, Lei, Dimakis, Karampatziakis,
ICML 2017, https://arxiv.org/abs/1612.03301; approximate gradient coding: Charles,
Papailiopoulos, Ellenberg, "Approximate gradient coding via sparse random graphs", 2017,
https://arxiv.org/abs/1711.06771, and Raviv, Tamo, Tandon, Dimakis, "Gradient coding from
cyclic MDS codes and expander graphs", ICML 2018, https://arxiv.org/abs/1707.03858).

The stated progress model: a round whose decoded update has relative error ``e`` (against
the exact update) counts as ``1 - e**p`` of a round's progress, so a candidate costs
``E[T] / (1 - E[e**p])`` seconds per unit of progress (a renewal-reward ratio: time per round over
progress per round); an exact candidate costs ``E[T]``. The cheapest wins. ``p = 1`` is
linear in the error. ``p = 2`` (the default, :data:`ERROR_POWER`) is the loss decrease of a
step on a local quadratic with isotropic curvature whose best step is the exact update
``u``: a step ``v`` decreases the loss by ``|u|^2 - |v - u|^2`` (in units of the curvature),
a share ``1 - e^2`` of the exact step's decrease; it charges a small error less than
``p = 1`` does and still prices ``e >= 1`` as no progress. A draw's ``e`` is a running mean of
measured errors (or the missing-weight model's), and the square of a mean is at most the
mean of the squares: with ``p = 2`` the price leans toward approximate rounds where the
error varies from round to round.

What is observable: the server never sees a partition's contribution alone, only through
decoding. In an exact round it has both the exact update and the replies in arrival order,
so it decodes the first replies approximately, ``j = 1, 2, ...`` replies short of the set it
decoded exactly, and measures the relative error against the exact update
(:func:`measure_errors`). :class:`DecodeErrors` keeps an exponentially weighted mean per code
tolerance ``s`` and shortfall ``j``: a non-IID federation (partitions that pull the model
apart) measures large errors, an IID-like one small errors.

A tolerance never run exactly (``s = 0``, drop-stragglers, once the rule has moved to
``s > 0``) has no such measurement. It is priced through the *missing weight* ``w`` of a
decoding, the share of partitions no used reply computed (:func:`missing_weights`): the
average over the partitions in hand differs from the full average by
``w / (1 - w) * (full average - missing partitions' average)``, so the relative error is
modelled as ``e(w) = min(1, c * w / (1 - w))``, ``c`` (the heterogeneity of the partitions'
updates) fitted to the exact rounds' measurements with ``w > 0`` whatever their tolerance
(:meth:`DecodeErrors.by_weight`). *When it is wrong*: a fixed set of missing partitions (the
same slow clients every round) may pull the model further than the measured random sets.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..codes import GradientCode

__all__ = ["ERROR_POWER", "ApproxCandidate", "DecodeErrors", "approximate_candidates",
           "check_error_power",
           "choose_progress", "measure_errors", "missing_weights", "price_candidates",
           "price_deadline", "progress_cost", "repetition_supports"]


#: The progress model's power ``p`` by default (a round with relative error ``e`` makes
#: ``1 - e**p`` of a round's progress): 2, chosen on the development seeds only
#: (``docs/adaptive.md``); ``p = 1`` is the first stated model.
ERROR_POWER = 2.0


def check_error_power(power: float, name: str = "error_power") -> float:
    """``power`` as a float if it is a positive finite number (the progress model's ``p``),
    else ``ValueError`` naming ``name`` and the value."""
    if not (math.isfinite(power) and power > 0):
        raise ValueError(f"{name}={power!r} must be a positive finite number")
    return float(power)


def progress_cost(time: float, error: float) -> float:
    """Seconds per unit of progress of a round lasting ``time`` on average whose update has
    mean relative error ``error`` (with ``error_power`` ``p``, the mean of ``e**p``):
    ``time / (1 - error)`` (``inf`` when ``error >= 1``: no progress)."""
    if not (math.isfinite(time) and 0.0 <= error < 1.0):
        return math.inf
    return float(time) / (1.0 - float(error))


@dataclass(frozen=True)
class ApproxCandidate:
    """One priced candidate: tolerance ``s``, ``deadline`` (seconds from the round's start;
    ``inf``: exact), expected round ``time``, expected relative ``error`` of its update and
    ``cost`` per unit of progress (:func:`progress_cost` of the time and the mean of
    ``e**p``: ``time / (1 - error)`` only with ``p = 1``)."""

    s: int
    deadline: float
    time: float
    error: float
    cost: float

    @property
    def exact(self) -> bool:
        return not math.isfinite(self.deadline)


def choose_progress(exact: ApproxCandidate | float,
                    approximate: Sequence[ApproxCandidate]) -> ApproxCandidate | None:
    """The approximate candidate with the lowest cost per unit of progress if it is strictly
    cheaper than ``exact`` (an :class:`ApproxCandidate` with an infinite deadline, or its
    expected round time), else ``None`` (keep the exact round). Ties: the later deadline."""
    exact_cost = exact.cost if isinstance(exact, ApproxCandidate) else float(exact)
    finite = [c for c in approximate if math.isfinite(c.cost)]
    if not finite:
        return None
    best = min(finite, key=lambda c: (c.cost, -c.deadline))
    return best if best.cost < exact_cost else None


class DecodeErrors:
    """Measured relative errors of approximate decodings, per ``(s, j)``: code tolerance ``s``
    and ``j`` replies short of the exact decoding's set; an exponentially weighted mean with
    weight ``alpha`` on the newest measurement (the first measurement is taken as it is)."""

    def __init__(self, alpha: float = 0.3) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha={alpha!r} must be in (0, 1]")
        self.alpha = float(alpha)
        self.table: dict[tuple[int, int], float] = {}
        self.counts: dict[tuple[int, int], int] = {}
        self.heterogeneity: float | None = None  # c of e(w) = c w / (1 - w)

    def update(self, s: int, errors: Mapping[int, float],
               weights: Mapping[int, float] | None = None) -> None:
        """Add one exact round's measurements ``{j: error}`` for tolerance ``s`` and, with
        ``weights`` (``{j: missing weight}``, :func:`missing_weights`), refit ``c`` of the
        missing-weight model: this round's ``sum(e) / sum(w / (1 - w))`` over its ``j``
        with ``0 < w < 1`` and ``e < 1`` (``e = 1`` is a decoding the wrapper skips or none:
        it says nothing of the partitions), averaged into ``c`` with weight ``alpha``."""
        for j, e in errors.items():
            e = min(max(float(e), 0.0), 1.0) if math.isfinite(e) else 1.0
            key = (int(s), int(j))
            old = self.table.get(key)
            self.table[key] = e if old is None else (1 - self.alpha) * old + self.alpha * e
            self.counts[key] = self.counts.get(key, 0) + 1
        pairs = [(max(float(errors[j]), 0.0), float(w))
                 for j, w in (weights or {}).items()
                 if j in errors and math.isfinite(errors[j]) and errors[j] < 1.0
                 and 0.0 < w < 1.0]
        if pairs:
            c = sum(e for e, _ in pairs) / sum(w / (1.0 - w) for _, w in pairs)
            old_c = self.heterogeneity
            self.heterogeneity = c if old_c is None else (1 - self.alpha) * old_c + self.alpha * c

    def by_weight(self, w: np.ndarray) -> np.ndarray | None:
        """Modelled relative errors ``min(1, c w / (1 - w))`` for missing weights ``w`` (1
        at ``w >= 1``); ``None`` before any measurement with a missing partition."""
        if self.heterogeneity is None:
            return None
        w = np.asarray(w, dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            e = self.heterogeneity * w / (1.0 - w)
        return np.where(w >= 1.0, 1.0, np.clip(e, 0.0, 1.0))

    def get(self, s: int, j: int) -> float | None:
        """The estimate for ``j`` replies short under tolerance ``s`` (``None``: never
        measured)."""
        return self.table.get((int(s), int(j)))

    def measured(self, s: int) -> bool:
        """Whether tolerance ``s`` has any measurement."""
        return any(key[0] == s for key in self.table)


def approximate_candidates(s: int, finish: np.ndarray, decode: np.ndarray,
                           error_of: Callable[[int], float | None],
                           max_short: int,
                           by_weight: Callable[[np.ndarray], np.ndarray] | None = None,
                           covers: np.ndarray | None = None,
                           max_decode_error: float = math.inf,
                           error_power: float = ERROR_POWER) -> list[ApproxCandidate]:
    """Price the deadlines of tolerance ``s`` from Monte Carlo draws.

    Args:
        finish: ``samples x n`` reply times (``inf``: never replies this round).
        decode: per draw, when the replies decode exactly (``inf``: never).
        error_of: ``j -> `` estimated relative error with ``j`` replies short of the exact
            set (``None``: unknown, priced as 1: no progress).
        max_short: the deadlines tried: per ``j = 1..max_short``, the mean over draws of the
            time of the reply ``j`` before the one that made the draw decode.

    Per draw the round lasts ``min(decode, d)``; if it has not decoded by ``d`` it is ``j``
    replies short (those in hand at the exact decode minus those by ``d``) and its error is
    ``error_of(j)`` (1 with no reply by ``d``: the round is skipped). ``cost`` is
    ``mean(time) / (1 - mean(error ** error_power))``.
    """
    finish = np.asarray(finish, dtype=np.float64)
    decode = np.asarray(decode, dtype=np.float64)
    ordered = np.sort(finish, axis=1)
    in_hand = np.sum(finish <= decode[:, None], axis=1)  # replies at the exact decode
    out: list[ApproxCandidate] = []
    for j in range(1, int(max_short) + 1):
        k = in_hand - j  # replies by the deadline of this draw
        ok = k >= 1
        if not ok.any():
            break
        rows = np.flatnonzero(ok)
        times = ordered[rows, k[ok] - 1]
        times = times[np.isfinite(times)]
        if times.size == 0:
            continue
        d = float(np.mean(times))
        out.append(price_deadline(s, d, finish, decode, error_of, by_weight, covers,
                                  max_decode_error, error_power))
    return out


def price_deadline(s: int, d: float, finish: np.ndarray, decode: np.ndarray,
                   error_of: Callable[[int], float | None],
                   by_weight: Callable[[np.ndarray], np.ndarray] | None = None,
                   covers: np.ndarray | None = None,
                   max_decode_error: float = math.inf,
                   error_power: float = ERROR_POWER) -> ApproxCandidate:
    """One deadline ``d`` of tolerance ``s`` priced over the draws (see
    :func:`approximate_candidates`; ``error_power`` ``p > 0``: a draw with error ``e`` makes
    ``1 - e**p`` of a round's progress; the candidate's ``error`` is the mean of ``e``).
    With ``by_weight`` and ``covers`` (``n x k``: which partitions each worker of a
    repetition code computes) a late draw's error is
    ``by_weight`` of the share ``w`` of partitions no reply by ``d`` computed, instead of
    ``error_of`` its shortfall; for a repetition code ``w`` is also the decoding's error
    ``||B_F^T a - 1||^2 / k``, so a draw with ``w > max_decode_error`` is a skipped round
    (error 1)."""
    error_power = check_error_power(error_power)
    time = np.minimum(decode, d)
    arrived = np.sum(finish <= d, axis=1)
    in_hand = np.sum(finish <= decode[:, None], axis=1)
    late = decode > d
    errors = np.zeros(decode.shape[0])
    if by_weight is not None and covers is not None:
        covered = ((finish <= d).astype(np.float64) @ covers) > 0
        w = 1.0 - covered.mean(axis=1)
        modelled = np.where(w > max_decode_error, 1.0, by_weight(w))
        errors[late] = modelled[late]
        errors[late & (arrived == 0)] = 1.0
        return _candidate(s, d, time, errors, error_power)
    for row in np.flatnonzero(late):
        if arrived[row] == 0:
            errors[row] = 1.0
            continue
        e = error_of(int(max(in_hand[row] - arrived[row], 1)))
        errors[row] = 1.0 if e is None else min(max(float(e), 0.0), 1.0)
    return _candidate(s, d, time, errors, error_power)


def _candidate(s: int, d: float, time: np.ndarray, errors: np.ndarray,
               error_power: float) -> ApproxCandidate:
    mean_time = float(np.mean(time))
    return ApproxCandidate(int(s), float(d), mean_time, float(np.mean(errors)),
                           progress_cost(mean_time, float(np.mean(errors ** error_power))))


def measure_errors(code: GradientCode, order: Sequence[int],
                   vectors: Mapping[int, np.ndarray], max_short: int,
                   max_decode_error: float = math.inf) -> dict[int, float]:
    """In an exact round: the relative error of the update decoded from the first
    ``len(order) - j`` replies (least squares), ``j = 1..max_short``, against the exact
    update decoded from all of ``order`` (workers in arrival order).

    ``vectors[w]``: worker ``w``'s reply as ``[sum_j B_wj n_j dtheta_j..., sum_j B_wj n_j]``
    (float64, one chunk); the update is the decoded sum over the decoded count. The error is
    ``||u_approx - u_exact|| / ||u_exact||`` (1 when nothing or no count is decoded, or when
    the decoding's own error ``||B_F^T a - 1||^2 / k`` exceeds ``max_decode_error``: such a
    round is skipped, no progress; capped at 1). Raises ``ValueError`` for codes whose
    replies mix chunks.
    """
    if code.chunks != 1:
        raise ValueError(f"code {code.name!r} mixes {code.chunks} chunks per reply; "
                         "measure_errors reads one-chunk replies")
    order = list(order)
    exact = _update(code, order, vectors)
    if exact is None:
        return {}
    norm = float(np.linalg.norm(exact))
    out: dict[int, float] = {}
    for j in range(1, min(int(max_short), len(order)) + 1):
        subset = order[: len(order) - j]
        if subset and code.decoding(subset).error > max_decode_error:
            out[j] = 1.0  # the wrapper skips such a round
            continue
        approx = _update(code, subset, vectors) if subset else None
        if approx is None or norm == 0.0:
            out[j] = 1.0 if approx is None else float(np.linalg.norm(approx) > 0)
            continue
        out[j] = min(float(np.linalg.norm(approx - exact)) / norm, 1.0)
    return out


def repetition_supports(code: GradientCode) -> np.ndarray | None:
    """``B``'s support (``n x k``, float 0/1) if the code is a repetition code (every
    coefficient 1, two workers' partitions the same or disjoint: the replies in hand decode
    the partitions they cover exactly, the others are missing), else ``None``."""
    B = np.asarray(code.B, dtype=np.float64)
    support = (B != 0).astype(np.float64)
    if not np.all(B[B != 0] == 1.0):
        return None
    overlap = support @ support.T
    sizes = np.diag(overlap)
    shared = overlap > 0
    # overlap[i, j] = |supp i & supp j| must be 0 or |supp j| (and, by symmetry, |supp i|)
    if not np.all(overlap[shared] == np.broadcast_to(sizes, overlap.shape)[shared]):
        return None
    return support


def missing_weights(code: GradientCode, order: Sequence[int],
                    max_short: int) -> dict[int, float]:
    """The share of the code's partitions no reply among the first ``len(order) - j``
    computed, ``j = 1..max_short`` (partitions counted equally)."""
    order = list(order)
    covers = np.abs(code.B) > 0
    out: dict[int, float] = {}
    for j in range(1, min(int(max_short), len(order)) + 1):
        subset = order[: len(order) - j]
        covered = covers[subset].any(axis=0) if subset else np.zeros(code.k, dtype=bool)
        out[j] = float(1.0 - covered.mean())
    return out


def _update(code: GradientCode, used: Sequence[int],
            vectors: Mapping[int, np.ndarray]) -> np.ndarray | None:
    row = code.chunk_decoder(code.decoding(list(used)))[0]
    total = None
    for w in used:
        a = float(row[w])
        if a != 0.0:
            total = a * vectors[w] if total is None else total + a * vectors[w]
    if total is None or not (math.isfinite(total[-1]) and total[-1] > 0):
        return None
    return total[:-1] / total[-1]


def price_candidates(placement: object, estimator: object, candidates: Sequence[int],
                     errors: DecodeErrors, rem: np.ndarray, X: np.ndarray, *,
                     max_short: int, load_per_partition: float | np.ndarray = 1.0,
                     max_decode_error: float = math.inf, error_power: float = ERROR_POWER,
                     ) -> tuple[dict[int, ApproxCandidate], list[ApproxCandidate]]:
    """Every candidate tolerance priced exactly (one round, no deadline) and, where its
    decoding errors were measured, with the deadlines of :func:`approximate_candidates`;
    a repetition code (:func:`repetition_supports`: ``s = 0`` of a nested placement, i.e.
    drop-stragglers) never run exactly, by the missing-weight model once it is fitted.

    ``rem``: per client (or per draw and client) seconds until it can start (``inf``: it
    gets no work); ``X``: the estimator's draws (``samples x n``), shared by every
    candidate (common random numbers); ``error_power``: the progress model's ``p``."""
    from .rules import decode_rule
    from .survival import TINY

    beta = estimator.load_exponent  # type: ignore[attr-defined]
    exact: dict[int, ApproxCandidate] = {}
    approx: list[ApproxCandidate] = []
    for s in candidates:
        rule = decode_rule(placement.code(s))  # type: ignore[attr-defined]
        loads = rule.loads(load_per_partition)
        # remaining busy time plus load**beta times the drawn latency (as choose_s prices)
        finish = rem + np.where(loads > 0, np.maximum(loads, TINY) ** beta, 0.0) * X
        finish = np.broadcast_to(finish, X.shape)
        decode = rule.times(finish)
        mean = float(np.mean(decode))
        exact[s] = ApproxCandidate(int(s), math.inf, mean, 0.0, progress_cost(mean, 0.0))
        if errors.measured(s):
            approx += approximate_candidates(s, finish, decode,
                                             lambda j, s=s: errors.get(s, j), max_short,
                                             error_power=error_power)
        elif errors.heterogeneity is not None:  # never exact at s: the missing-weight model
            covers = repetition_supports(placement.code(s))  # type: ignore[attr-defined]
            if covers is not None:
                approx += approximate_candidates(s, finish, decode, lambda j: None,
                                                 max_short, errors.by_weight, covers,
                                                 max_decode_error, error_power)
    return exact, approx
