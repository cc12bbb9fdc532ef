"""The choice of ``s``: simulate the next round for every candidate tolerance with the
estimated latencies and keep the fastest (within a robustness margin).

References:
    David, Nagaraja, "Order Statistics", 3rd ed., Wiley 2003 (a round that needs ``t`` of
    ``m`` replies lasts the ``t``-th order statistic; Monte Carlo here because clients differ).
    Bertsekas, "Dynamic Programming and Optimal Control", 2017 (rollout: ``lookahead``).
    Simon, "Rational choice and the structure of the environment", Psychological Review 63,
    1956, and Savage, "The theory of statistical decision", JASA 46, 1951 (``margin``).
    Wang, Cheng, Ramamoorthy, "Heterogeneity-aware Gradient Coding for Straggler Tolerance",
    ICDCS 2019, https://arxiv.org/abs/1901.09339 (``busy="fit"``, ``exclude_slower_than``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..codes import GradientCode, NestedPlacement, UncodedCode
from .estimator import LatencyEstimator
from .rules import DecodeRule, decode_rule
from .survival import TINY

__all__ = ["Decision", "SingleCode", "choose_s", "expected_round_time"]


def _remaining(busy_until, now: float, n: int) -> np.ndarray:
    if busy_until is None:
        return np.zeros(n)
    rem = np.asarray(busy_until, dtype=np.float64) - float(now)
    if rem.shape != (n,):
        raise ValueError(f"busy_until has shape {rem.shape}; expected ({n},)")
    return np.maximum(np.nan_to_num(rem, nan=0.0, posinf=1e300), 0.0)


def _finish(X: np.ndarray, rem: np.ndarray, loads: np.ndarray, beta: float) -> np.ndarray:
    """Each draw's per-client reply times: remaining busy time (per client, or per draw and
    client) plus ``load**beta * X``."""
    scaled = np.where(loads > 0, np.maximum(loads, TINY) ** beta, 0.0)
    return rem + scaled * X


def _times(rule: DecodeRule, X: np.ndarray, rem: np.ndarray, loads: np.ndarray, beta: float):
    return rule.times(_finish(X, rem, loads, beta))


def expected_round_time(
    code: GradientCode,
    estimator: LatencyEstimator,
    busy_until: Sequence[float] | np.ndarray | None = None,
    now: float = 0.0,
    load_per_partition: float | np.ndarray = 1.0,
    rng: np.random.Generator | None = None,
    samples: int = 256,
) -> float:
    """Monte Carlo ``E[time until the replies decode]`` of one round under ``code``.

    Client ``i`` replies after ``max(busy_until_i - now, 0) + L_i**beta * X_i`` with
    ``L_i`` = its partitions' cost and ``X_i`` drawn from the estimator; the round ends when
    :func:`decode_rule` is met (the ``t``-th order statistic of each group, the max over
    groups). ``samples`` draws, seeded by ``rng`` (default: the estimator's seed).
    """
    if estimator.n != code.n:
        raise ValueError(f"estimator has n={estimator.n}; the code n={code.n}")
    rule = decode_rule(code)
    X = estimator.sample(int(samples), rng)
    rem = _remaining(busy_until, now, code.n)
    return float(
        np.mean(_times(rule, X, rem, rule.loads(load_per_partition), estimator.load_exponent))
    )


class SingleCode:
    """One fixed code seen as a placement with a single choice, so that :func:`choose_s`
    decides only which busy clients a fixed code queues (``busy="fit"``) with the same
    estimator and rule as ``s="auto"``."""

    def __init__(self, code: GradientCode) -> None:
        if not isinstance(code, GradientCode):
            raise TypeError(f"code must be a GradientCode; got {code!r}")
        self._code = code
        self.n = code.n
        self.s_max = code.s
        self.stable_values = (code.s,)

    def code(self, s: int) -> GradientCode:
        if s != self.s_max:
            raise ValueError(f"s={s!r}: this fixed code tolerates s={self.s_max}")
        return self._code


@dataclass(frozen=True)
class Decision:
    """What :func:`choose_s` decided.

    Attributes:
        s: the tolerance to use next round (with ``approximate``: stragglers to ignore).
        expected_times: predicted expected round time of every exact candidate.
        approximate: ``True`` if ignore-stragglers with ``s`` dropped replies was predicted
            fastest (only with ``allow_approximate=True``).
        approximate_times: ignore-stragglers candidates, time per full-data equivalent
            ``E[T] * n / (n - r)`` (empty unless ``allow_approximate``).
        observed: ``False`` when there were no observations (the safe default was returned).
        skip: busy clients that get no work this round (``busy="skip"``: all of them;
            ``busy="fit"``: those not expected to finish their queued work in time).
        excluded: clients that compute nothing under the chosen code
            (:meth:`~fl_gradcode.codes.NestedPlacement.code_excluding`; empty: ``code(s)``).
        excluded_times: predicted time of every exact candidate that excludes them.
        deadline: an approximate round (``auto_approximate``): decode what arrived by this
            many seconds from the round's start (``None``: an exact round).
        approximate_time: with ``deadline``, its predicted round time ``E[min(T, d)]``.
    """

    s: int
    expected_times: dict[int, float]
    approximate: bool = False
    approximate_times: dict[int, float] = field(default_factory=dict)
    observed: bool = True
    skip: tuple[int, ...] = ()
    excluded: tuple[int, ...] = ()
    excluded_times: dict[int, float] = field(default_factory=dict)
    deadline: float | None = None
    approximate_time: float | None = None

    @property
    def expected_time(self) -> float:
        """The predicted time of the chosen code (``nan`` before any observation; with a
        ``deadline``, the approximate round's)."""
        if self.deadline is not None and self.approximate_time is not None:
            return float(self.approximate_time)
        table = self.excluded_times if self.excluded else self.expected_times
        return float(table.get(self.s, math.nan))


def choose_s(
    placement: NestedPlacement | SingleCode,
    estimator: LatencyEstimator,
    *,
    busy_until: Sequence[float] | np.ndarray | None = None,
    now: float = 0.0,
    load_per_partition: float | np.ndarray = 1.0,
    candidates: Iterable[int] | None = None,
    samples: int = 256,
    rng: np.random.Generator | None = None,
    allow_approximate: bool = False,
    busy: str = "queue",
    margin: float = 0.0,
    lookahead: bool = False,
    pending: tuple[Sequence[float] | np.ndarray, Sequence[float] | np.ndarray] | None = None,
    exclude_slower_than: float | None = None,
    pending_limit: Sequence[float] | np.ndarray | None = None,
    deadline: float | None = None,
) -> Decision:
    """The tolerance minimising the predicted expected round time.

    Args:
        placement: the nested placement whose ``code(s)`` the server would use (or a
            :class:`SingleCode`: a fixed code, only the busy clients to skip are decided).
        estimator: fitted :class:`LatencyEstimator`.
        busy_until, now: absolute times at which clients become free, and the current time.
        load_per_partition: cost of one partition (scalar or one per partition).
        candidates: tolerances to consider (default ``placement.stable_values``: every
            ``s <= s_max`` with the default layout).
        samples: Monte Carlo draws; all candidates share them (common random numbers, so
            differences between candidates are not Monte Carlo noise of separate draws).
        rng: generator of the draws (default: seeded by the estimator's seed).
        allow_approximate: also consider ignore-stragglers (uncoded placement, the fastest
            ``n - r`` replies, biased unless rescaled), compared by time per full-data
            equivalent. Off by default: exact coding reproduces the uncoded model.
        busy: what a client still busy at ``now`` does this round.

            * ``"queue"``: it is given work queued behind its current job and replies after
              ``busy_until - now`` plus its own time (what a Flower SuperNode does with a
              message that arrives while it is still running one).
            * ``"skip"``: it gets no work and never replies this round (only codes that
              decode without it finish).
            * ``"fit"``: heterogeneity-aware queueing: it is queued only if its current job
              ends before the round's expected end under the best code with everyone queued
              (it can start the new work in time); the others are skipped and the choice is
              made again without them. This bounds the backlog of a client whose earlier job
              is far from done (its new work could only be late), in the spirit of
              heterogeneity-aware gradient coding (Wang et al., ICDCS 2019,
              https://arxiv.org/abs/1901.09339), which gives slow workers less work instead
              of the same work late. (Also requiring the new work to be expected to finish
              by then skipped more clients and was slower in the time-to-accuracy runs, both
              measured without the wrapper's trust region: n = 100 bimodal 67.9 s against
              55.2 s, n = 12 bimodal 37.0 s against 28.1 s.)

            ``Decision.skip`` lists the skipped clients.
        margin: robust choice: the most tolerant candidate whose prediction is within a
            factor ``1 + margin`` of the fastest (0: the fastest). The model treats clients
            as independent; correlated stragglers (several slow clients of one group in the
            same round, as in measured traces) make small ``s`` far costlier than predicted,
            while a larger ``s`` costs at most the margin if the model is right: a bounded
            premium against an unbounded loss (satisficing, Simon 1956; the minimax-regret
            reading of robust decisions, Savage 1951).
        lookahead: score each candidate by the mean of this round's and the next round's
            expected time, the next one starting from the backlog this round leaves (work of
            queued or slow clients still running when the round decodes, redrawn latencies,
            same code): a myopic policy ignores that a larger load delays later rounds and
            oscillates into rounds where most clients are still busy. A two-stage rollout of
            the fixed policy (Bertsekas, "Dynamic Programming and Optimal Control", 2017,
            rollout algorithms).
        pending: ``(elapsed, load)`` per client instead of ``busy_until``: work of ``load``
            units sent ``elapsed`` seconds ago and not returned yet (``nan``: none). Its
            remaining time is drawn from the estimator conditional on not being done
            (:meth:`LatencyEstimator.sample_remaining`): what a real server knows, where
            ``busy_until`` (when the pending reply will arrive) is a simulator's knowledge.
            With ``busy="fit"`` a client counts as late when its median remaining time
            exceeds the round's expected end.
        pending_limit: with ``pending``, per client the seconds after which it is free at
            the latest (its work stops at a deadline: the server's ``stop_late_work``;
            ``inf``: no limit). The drawn remaining times are capped there.
        exclude_slower_than: heterogeneity-aware assignment: the clients whose estimated
            slowness factor (:meth:`LatencyEstimator.slowness`) is at least this are
            candidates for exclusion, and every ``s`` is also priced with
            ``placement.code_excluding(s, those)`` (they compute nothing, the others share
            their partitions; Wang, Cheng, Ramamoorthy, ICDCS 2019,
            https://arxiv.org/abs/1901.09339). The margin rule picks ``s`` as before, then
            the faster of the two codes for that ``s`` (``Decision.excluded``). ``None``
            (default): never exclude.
        deadline: the round ends at this many seconds from its start whether or not it can
            decode (the server's straggler deadline); a code is then priced by its expected
            time per round that decodes, ``E[min(T, d)] / P(T <= d)`` (renewal-reward: a
            round that misses the deadline costs ``d`` and buys no exact update; ``inf``
            when no draw finishes by ``d``), so a code that can only finish after the
            deadline is not chosen while one that finishes before it exists; when none
            does, every code is priced by ``E[T]`` (the code soonest done). ``None``
            (default) or ``inf``: ``E[T]``.

    With no observation it returns the largest candidate (``s_max``: the safe choice; with
    ``busy="fit"`` every busy client is queued). Ties (identical codes, or codes that cannot
    decode without skipped clients) go to the larger ``s``. ``expected_times`` holds what
    was compared (with ``lookahead``: the two-round mean).
    """
    cand = _candidates(placement, estimator, candidates, busy, margin, exclude_slower_than)
    n = placement.n
    if pending is not None:
        if busy_until is not None:
            raise ValueError("give busy_until or pending, not both")
        p_elapsed, p_load = _pending_arrays(pending, n)
        is_busy = np.isfinite(p_elapsed) & (p_load > 0)
    else:
        rem = _remaining(busy_until, now, n)
        is_busy = rem > 0
    skip = np.flatnonzero(is_busy) if busy == "skip" else np.zeros(0, dtype=np.int64)
    if not estimator.has_data:
        return Decision(s=cand[-1], expected_times={}, observed=False, skip=_ints(skip))
    excluded = _slow_clients(estimator, exclude_slower_than)
    variants = _excluding(placement, cand, excluded)
    X = estimator.sample(int(samples), rng)
    if pending is not None:  # samples x n: each draw its own remaining times
        rem = estimator.sample_remaining(p_elapsed, p_load, int(samples), rng)
        if pending_limit is not None:
            rem = np.minimum(rem, _limit(pending_limit, n)[None, :])
    pricer = _Pricer(X, load_per_partition, estimator.load_exponent, lookahead, deadline)
    if busy == "skip":
        rem = np.where(is_busy, np.inf, rem)
    table = pricer.table(placement, cand, variants, rem, margin)
    if busy == "fit" and is_busy.any():
        typical = rem if rem.ndim == 1 else np.median(rem, axis=0)
        late = is_busy & (typical > table.end)  # cannot even start before the expected end
        if late.any():
            skip = np.flatnonzero(late)
            rem = np.where(late, np.inf, rem)
            table = pricer.table(placement, cand, variants, rem, margin)
    times, other, best = table.times, table.other, table.best
    approx = (_approximate_times(n, cand, rem, X, load_per_partition, estimator.load_exponent)
              if allow_approximate else {})
    if approx:
        r_best = min(approx, key=lambda r: (approx[r], r))
        if approx[r_best] < min(times[best], other.get(best, math.inf)):
            return Decision(r_best, times, True, approx, skip=_ints(skip), excluded_times=other)
    return Decision(best, times, False, approx, skip=_ints(skip),
                    excluded=excluded if table.use_other else (), excluded_times=other)


def _ints(values: Iterable[Any]) -> tuple[int, ...]:
    return tuple(int(i) for i in values)


def _candidates(placement: Any, estimator: Any, candidates: Iterable[int] | None, busy: str,
                margin: float, exclude_slower_than: float | None) -> list[int]:
    """The sorted candidate tolerances, after checking :func:`choose_s`'s arguments."""
    if busy not in ("queue", "skip", "fit"):
        raise ValueError(f"busy={busy!r}; expected 'queue', 'skip' or 'fit'")
    if not 0 <= margin < math.inf:
        raise ValueError(f"margin={margin!r} must be >= 0")
    if estimator.n != placement.n:
        raise ValueError(f"estimator has n={estimator.n}; the placement n={placement.n}")
    if exclude_slower_than is not None:
        if not (isinstance(exclude_slower_than, (int, float))
                and not isinstance(exclude_slower_than, bool) and exclude_slower_than > 1):
            raise ValueError(f"exclude_slower_than={exclude_slower_than!r} must be a number "
                             "> 1 (a slowness factor) or None")
        if not hasattr(placement, "code_excluding"):
            raise ValueError("exclude_slower_than needs a NestedPlacement (code_excluding)")
    cand = sorted(set(placement.stable_values if candidates is None else candidates))
    if not cand:
        raise ValueError("no candidate tolerance")
    for s in cand:
        if not 0 <= s <= placement.s_max:
            raise ValueError(f"candidate s={s} outside [0, s_max={placement.s_max}]")
    return cand


def _pending_arrays(pending: tuple[Any, Any], n: int) -> tuple[np.ndarray, np.ndarray]:
    p_elapsed, p_load = (np.asarray(v, dtype=np.float64) for v in pending)
    if p_elapsed.shape != (n,) or p_load.shape != (n,):
        raise ValueError(f"pending arrays must have shape ({n},); got {p_elapsed.shape} "
                         f"and {p_load.shape}")
    return p_elapsed, p_load


def _limit(pending_limit: Any, n: int) -> np.ndarray:
    cap = np.asarray(pending_limit, dtype=np.float64)
    if cap.shape != (n,) or np.any(np.isnan(cap)) or np.any(cap < 0):
        raise ValueError(f"pending_limit must hold {n} times >= 0 (inf: no limit); "
                         f"got {cap!r}")
    return cap


def _slow_clients(estimator: Any, exclude_slower_than: float | None) -> tuple[int, ...]:
    """Clients estimated at least ``exclude_slower_than`` times slower than typical."""
    if exclude_slower_than is None:
        return ()
    return _ints(np.flatnonzero(estimator.slowness() >= float(exclude_slower_than)))


def _excluding(placement: Any, cand: list[int], excluded: tuple[int, ...]
               ) -> dict[int, GradientCode]:
    """Per candidate ``s``, the code in which ``excluded`` compute nothing (if one exists)."""
    variants: dict[int, GradientCode] = {}
    if excluded:
        for s in cand:
            try:
                variants[s] = placement.code_excluding(s, excluded)
            except ValueError:  # a super-block with too few active clients for this s
                continue
    return variants


@dataclass(frozen=True)
class _Table:
    """One pricing of every candidate: ``times`` (everyone computes), ``other`` (the slow
    clients excluded), the chosen ``best`` and whether its excluding code is faster."""

    times: dict[int, float]
    other: dict[int, float]
    best: int
    use_other: bool

    @property
    def end(self) -> float:
        """The expected end of the round under the chosen code."""
        return self.other[self.best] if self.use_other else self.times[self.best]


class _Pricer:
    """Expected round time of a code under shared draws (common random numbers); each code's
    drawn round times are cached by its decode rule and loads within one :meth:`table`."""

    def __init__(self, X: np.ndarray, load_per_partition: Any, beta: float, lookahead: bool,
                 deadline: float | None = None):
        self.X, self.cost, self.beta, self.lookahead = X, load_per_partition, beta, lookahead
        self.deadline = None if deadline is None or not math.isfinite(deadline) else deadline
        if self.deadline is not None and not self.deadline > 0:
            raise ValueError(f"deadline={deadline!r} must be > 0 seconds (or None)")
        self.seen: dict[bytes, np.ndarray] = {}

    def draws(self, code: GradientCode, rem: np.ndarray) -> np.ndarray:
        """The code's round time in each draw (with ``lookahead``: the two-round mean)."""
        rule = decode_rule(code)
        loads = rule.loads(self.cost)
        key = rule.members.tobytes() + rule.thresholds.tobytes() + loads.tobytes()
        if key not in self.seen:
            finish = _finish(self.X, rem, loads, self.beta)
            T = rule.times(finish)
            if self.lookahead:  # the backlog this round leaves delays the next one
                with np.errstate(invalid="ignore"):  # inf - inf: never replies
                    left = finish - T[:, None]
                left = np.where(np.isnan(left), np.inf, np.maximum(left, 0.0))
                # rolled draws: independent latencies for the next round
                T = 0.5 * (T + rule.times(_finish(np.roll(self.X, 1, axis=0), left, loads,
                                                  self.beta)))
            self.seen[key] = T
        return self.seen[key]

    @staticmethod
    def per_round(T: np.ndarray, deadline: float | None) -> float:
        """``E[T]``, or with a deadline ``E[min(T, d)] / P(T <= d)`` (``inf``: never by
        ``d``)."""
        if deadline is None:
            return float(np.mean(T))
        decoded = float(np.mean(T <= deadline))
        if decoded == 0.0:
            return math.inf
        return float(np.mean(np.minimum(T, deadline))) / decoded

    def table(self, placement: Any, cand: list[int], variants: dict[int, GradientCode],
              rem: np.ndarray, margin: float) -> _Table:
        self.seen.clear()
        draws = {s: self.draws(placement.code(s), rem) for s in cand}
        other_draws = {s: self.draws(code, rem) for s, code in variants.items()}
        # no code decodes by the deadline in any draw: price by E[T] as without one (the code
        # soonest done gets the most replies by the deadline for the approximate decoding, and
        # replies at a load that can finish; the largest s, kept before, never left a load at
        # which every reply missed the deadline)
        for deadline in (self.deadline, None) if self.deadline is not None else (None,):
            times = {s: self.per_round(T, deadline) for s, T in draws.items()}
            other = {s: self.per_round(T, deadline) for s, T in other_draws.items()}
            both = {s: min(times[s], other.get(s, math.inf)) for s in cand}
            fastest = min(both.values())
            if not math.isinf(fastest):
                break
        # robust choice: the most tolerant candidate predicted within ``margin`` of the
        # fastest, then the faster of its two codes (ties: everyone computes)
        best = max(s for s in cand if both[s] <= fastest * (1.0 + margin))
        return _Table(times, other, best, other.get(best, math.inf) < times[best])


def _approximate_times(n: int, cand: list[int], rem: np.ndarray, X: np.ndarray,
                       load_per_partition: Any, beta: float) -> dict[int, float]:
    """Ignore-stragglers with ``r`` replies dropped: time per full-data equivalent
    ``E[T] * n / (n - r)`` (the fastest ``n - r`` replies of the uncoded placement)."""
    loads = decode_rule(UncodedCode(n)).loads(load_per_partition)
    T = np.atleast_2d(rem) + np.maximum(loads, TINY)[None, :] ** beta * X
    ordered = np.sort(T, axis=1)
    return {r: float(np.mean(ordered[:, n - r - 1])) * n / (n - r) for r in cand if r != 0}
