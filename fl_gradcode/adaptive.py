"""Adaptive gradient coding: pick the straggler tolerance ``s`` online, every round (no Flower).

The data is placed once for a maximum tolerance (:class:`fl_gradcode.codes.NestedPlacement`),
so switching ``s`` between rounds moves no data. Each round the server

1. feeds what it saw into a :class:`LatencyEstimator` (reply times, censored for clients that
   had not replied when the round ended, late replies added when they arrive), then
2. calls :func:`choose_s`, which simulates the next round for every candidate ``s`` with the
   estimated per-client latency distributions and returns the ``s`` with the smallest expected
   time until the replies decode (``s = 0`` is uncoded on the same placement, so exact coding
   is never predicted to lose to it); optionally each ``s`` also with the clients estimated
   persistently slow excluded (:meth:`fl_gradcode.codes.NestedPlacement.code_excluding`).

Latency model. Client ``i``, given load ``L_i`` (partitions it computes times the cost of one
partition) and still busy for ``b_i`` seconds, replies after ``b_i + L_i**beta * X_i``. ``X_i``
is its per-unit latency, ``X_i = f_i * E`` (an accelerated-failure-time model): a per-client
slowness factor ``f_i`` (persistently slow clients) times a common distribution ``E``.

* ``E``: weighted Kaplan-Meier curve of all clients' normalised times ``X / f_i``, with
  exponential forgetting (``halflife`` rounds) for drift. Beyond the largest observed time,
  which is exactly what early-ending rounds hide, a generalised Pareto tail fitted to the
  upper part of the curve by censored maximum likelihood (peaks over threshold): exponential
  delays give an exponential tail, Pareto delays a Pareto tail.
* ``f_i``: maximum a posteriori under the censored likelihood (events contribute the density
  of ``E``, censored rounds its survival beyond the censoring time) with a log-normal prior;
  a client that never replies keeps gaining slowness, so a dead node ends up tolerated.
* ``beta``: ``1`` is compute-bound work (a coded client with ``s+1`` partitions takes ``s+1``
  times longer: coding rarely pays), ``0`` a delay that does not shrink with the work
  (network, queueing, heavy tails: coding pays). Given, or estimated by a ridge regression of
  each round's log median time on its log median load, starting from ``beta = 1``. That prior
  makes small ``s`` look cheap, so the policy tries them and learns from the result:
  optimism in the face of uncertainty, the principle of UCB (Auer et al.), without an explicit
  bonus.

Censoring. A client that has not replied when the round ends (or errors, or never answers)
has a time known only to exceed the round's duration. Dropping such observations, or treating
them as replies at the deadline, biases every estimate towards fast clients (the tests measure
it: mean relative error of per-client rates 0.87 and 0.38 against 0.046 for the censored MLE).
The bound grows while the reply is outstanding (:meth:`LatencyEstimator.observe_pending`), and
the mass beyond the last observed reply is drawn beyond the censoring times that carry it, so
a slow mode seen only through censoring is never predicted faster than the time it has
already taken.

Busy clients. A client still working on earlier work is priced by its remaining time, drawn
from the estimator conditional on the work not being done after the time since it was sent
(:meth:`LatencyEstimator.sample_remaining`, ``choose_s(pending=...)``): what a server knows.
``choose_s(busy_until=...)`` takes known finishing times instead (a simulator's knowledge).

References:
    Kaplan, Meier, "Nonparametric Estimation from Incomplete Observations", JASA 53(282), 1958
    (the product-limit estimator, here with weights).
    Efron, "The two sample problem with censored data", Proc. 5th Berkeley Symposium 4, 1967
    (Kaplan-Meier as redistribution of censored mass to the right).
    Cox, Oakes, "Analysis of Survival Data", Chapman & Hall 1984 (censored likelihoods; the
    exponential MLE rate = events / total exposure of :meth:`LatencyEstimator.rates`).
    Pickands, "Statistical inference using extreme order statistics", Ann. Statist. 3(1), 1975
    (generalised Pareto tails above a threshold).
    Auer, Cesa-Bianchi, Fischer, "Finite-time Analysis of the Multiarmed Bandit Problem",
    Machine Learning 47, 2002 (UCB: optimism in the face of uncertainty).
    David, Nagaraja, "Order Statistics", 3rd ed., Wiley 2003 (a round that needs ``t`` of ``m``
    replies lasts the ``t``-th order statistic; Monte Carlo here because clients differ).
    Wang et al., "Heterogeneity-aware Gradient Coding for Straggler Tolerance", ICDCS 2019,
    https://arxiv.org/abs/1901.09339 (heterogeneous workers: slow ones get less work; here a
    busy client may get none for a round, and with ``exclude_slower_than`` a client
    estimated persistently slow may be excluded, its partitions shared by the others).
    Tandon, Lei, Dimakis, Karampatziakis, ICML 2017, https://arxiv.org/abs/1612.03301 and
    Halbawi, Azizan, Salehi, Hassibi, ISIT 2018, https://arxiv.org/abs/1706.05436 (the codes).
"""

from __future__ import annotations

import math
import weakref
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.sparse import csr_matrix

from .codes import (
    FractionalRepetitionCode,
    GradientCode,
    IgnoreStragglers,
    NestedPlacement,
    UncodedCode,
)

__all__ = [
    "CohortView",
    "Decision",
    "DecodeRule",
    "LatencyEstimator",
    "SingleCode",
    "choose_s",
    "code_loads",
    "decode_rule",
    "expected_round_time",
]

_TINY = 1e-12


# ============================================================================ survival curve
def _fit_gpd(y: np.ndarray, event: np.ndarray, w: np.ndarray) -> tuple[float, float]:
    """Censored weighted MLE of a generalised Pareto ``(xi, sigma)`` for excesses ``y >= 0``.

    Profile likelihood: for each ``xi`` on a grid ``0, 0.05, ..., 0.95`` the scale solves its
    (convex in ``log sigma``) score equation by Newton's method; the best ``xi`` wins. ``xi = 0``
    is an exponential tail, ``1/alpha`` a Pareto tail of index ``alpha``; bounded tails
    (``xi < 0``) are treated as exponential, which is conservative. Peaks over threshold:
    Pickands, Ann. Statist. 3(1), 1975.
    """
    n_events = float(np.sum(w * event))
    exposure = float(np.sum(w * y))
    sigma0 = exposure / max(n_events, _TINY)
    if n_events < 5 or sigma0 <= 0:
        return 0.0, max(sigma0, _TINY)
    q = np.where(event, 1.0, 0.0)
    best = (math.inf, 0.0, sigma0)
    theta = math.log(sigma0)
    for xi in np.arange(0.0, 0.951, 0.05):  # warm start from the previous xi
        for _ in range(30):
            r = y / math.exp(theta)
            one = 1.0 + xi * r
            a = r / one
            grad = -float(np.sum(w * (q * (-1.0 + (1.0 + xi) * a) + (1 - q) * a)))
            hess = float(np.sum(w * (q * (1.0 + xi) + (1 - q)) * r / one**2))
            step = grad / max(hess, _TINY)
            theta -= float(np.clip(step, -2.0, 2.0))
            if abs(step) < 1e-6:
                break
        r = y / math.exp(theta)
        logsurv = -r if xi == 0 else -np.log1p(xi * r) / xi
        nll = -float(np.sum(w * np.where(event, -theta + (1.0 + xi) * logsurv, logsurv)))
        if nll < best[0]:
            best = (nll, float(xi), math.exp(theta))
    return best[1], best[2]


class _Survival:
    """Weighted Kaplan-Meier curve of log per-unit times ``e`` with right censoring, and a
    generalised Pareto tail (in linear time) beyond the last observed event.

    Kaplan-Meier cannot say anything beyond the largest event (the upper tail is exactly
    what censoring hides when rounds end early); there the remaining mass follows a GPD
    fitted to the excesses above a threshold in the upper part of the curve (exponential
    tails give ``xi ~ 0``, Pareto tails ``xi = 1/alpha``).
    """

    def __init__(
        self, values: np.ndarray, events: np.ndarray, weights: np.ndarray, gpd: bool = True
    ) -> None:
        order = np.lexsort((~events, values))  # by value; events before censored on ties
        v, d, w = values[order], events[order], weights[order]
        at_risk = np.cumsum(w[::-1])[::-1]
        factor = np.where(d, 1.0 - w / np.maximum(at_risk, _TINY), 1.0)
        surv = np.cumprod(np.clip(factor, 0.0, 1.0))
        self.grid = v[d]
        self.surv = surv[d]
        if self.grid.size == 0:  # nothing observed: all mass beyond the largest censoring time
            self.grid = np.array([float(v.max()) if v.size else 0.0])
            self.surv = np.array([1.0])
        self.cdf = 1.0 - self.surv
        self.last = float(self.grid[-1])
        self.s_last = float(self.surv[-1])
        # GPD tail fitted above the KM quantile at max(F_K - 0.3, F_K / 2).
        level = max(self.cdf[-1] - 0.3, 0.5 * self.cdf[-1])
        self.u = float(self.grid[min(np.searchsorted(self.cdf, level), self.grid.size - 1)])
        above = v > self.u
        x_u = math.exp(self.u)
        y = np.exp(v[above]) - x_u
        if gpd:
            self.xi, self.sigma = _fit_gpd(y, d[above], w[above])
        else:  # exponential tail: mean excess = exposure / events (cheap)
            self.xi = 0.0
            events_above = max(float(np.sum(w[above] * d[above])), _TINY)
            self.sigma = max(float(np.sum(w[above] * y)) / events_above, _TINY)
        self.x_last = math.exp(self.last)
        self.x_u = x_u
        self.sigma_last = self.sigma + self.xi * (self.x_last - x_u)  # threshold stability
        # The mass beyond the last event belongs to the observations censored there (Efron's
        # redistribution to the right): each is known to exceed its censoring time, so its
        # share is the tail conditional on exceeding that time, not on exceeding the last
        # event (a slow mode seen only through censoring is at least as slow as the bound).
        beyond = ~d & (v >= self.last)
        self._cens_x = self._cens_cum = None
        if beyond.any() and self.s_last > 0 and float(np.sum(w[beyond])) > 0:
            self._cens_x = np.exp(v[beyond])
            self._cens_cum = np.cumsum(w[beyond]) / float(np.sum(w[beyond]))

    def _excess(self, start: np.ndarray, surv: np.ndarray) -> np.ndarray:
        """GPD excess beyond ``start`` (linear time) with conditional survival ``surv``."""
        sigma = np.maximum(self.sigma + self.xi * (start - self.x_u), _TINY)
        if self.xi == 0:
            return -sigma * np.log(surv)
        return sigma / self.xi * np.expm1(-self.xi * np.log(surv))

    def _tail(self, u: np.ndarray) -> np.ndarray:
        """Quantiles beyond the last event (``u >= F_K``), in the log domain."""
        q = np.clip((1.0 - u) / max(self.s_last, _TINY), _TINY, 1.0)  # survival within tail
        if self._cens_x is None:
            start = np.full(q.shape, self.x_last)
            return np.log(start + self._excess(start, q))
        # which censored observation's share ``1 - q`` falls in, and where inside it
        c = np.clip(1.0 - q, 0.0, 1.0)
        j = np.minimum(np.searchsorted(self._cens_cum, c, side="right"),
                       self._cens_cum.size - 1)
        lo = np.where(j > 0, self._cens_cum[np.maximum(j - 1, 0)], 0.0)
        width = np.maximum(self._cens_cum[j] - lo, _TINY)
        inner = np.clip(1.0 - (c - lo) / width, _TINY, 1.0)
        start = self._cens_x[j]
        return np.log(start + self._excess(start, inner))

    def quantile(self, u: np.ndarray) -> np.ndarray:
        """Inverse CDF at ``u`` in ``[0, 1)``."""
        u = np.asarray(u, dtype=np.float64)
        idx = np.searchsorted(self.cdf, u, side="left")
        inside = idx < self.grid.size
        out = np.empty_like(u)
        out[inside] = self.grid[idx[inside]]
        out[~inside] = self._tail(u[~inside])
        return out

    def sample(self, u: np.ndarray, resolution: int = 1 << 16) -> np.ndarray:
        """:meth:`quantile` through a lookup table of ``resolution`` quantiles (fast), exact
        in the tail beyond the last event."""
        if not hasattr(self, "_table"):
            mid = (np.arange(resolution) + 0.5) / resolution
            self._table = self.quantile(np.minimum(mid, self.cdf[-1]))
        u = np.asarray(u, dtype=np.float64)
        out = self._table[np.minimum((u * resolution).astype(np.int64), resolution - 1)]
        tail = u >= self.cdf[-1]
        if tail.any():
            out[tail] = self._tail(u[tail])
        return out

    def sample_above(self, e0: np.ndarray, u: np.ndarray) -> np.ndarray:
        """Draws of ``e`` conditional on ``e > e0`` (one threshold per column of ``u``).

        Below the last event: the curve's quantile at ``F(e0) + (1 - F(e0)) u``. Beyond it:
        ``e0`` plus a GPD excess, the tail's own conditional law above ``e0`` (threshold
        stability of the generalised Pareto distribution).
        """
        e0 = np.asarray(e0, dtype=np.float64)
        k = np.searchsorted(self.grid, e0, side="right")
        f0 = np.where(k > 0, self.cdf[np.maximum(k - 1, 0)], 0.0)
        below = np.maximum(self.sample(f0 + (1.0 - f0) * u), e0)
        x0 = np.exp(e0)
        beyond = np.log(x0 + self._excess(x0, np.clip(1.0 - u, _TINY, 1.0)))
        return np.where(e0 < self.last, below, beyond)

    def log_tables(self, lo: float, h: float, size: int) -> tuple[np.ndarray, np.ndarray]:
        """Log density and log survival of ``e`` on the grid ``lo + h * arange(size)``.

        The density smooths the Kaplan-Meier jumps with a Gaussian kernel (Silverman's
        bandwidth on the log scale) and adds the GPD tail; both are floored so that one
        surprising observation cannot dominate a likelihood.
        """
        e = lo + h * np.arange(size)
        jumps = -np.diff(np.concatenate([[1.0], self.surv]))
        idx = np.clip(np.round((self.grid - lo) / h).astype(np.int64), 0, size - 1)
        hist = np.bincount(idx, weights=jumps, minlength=size) / h
        spread = float(np.subtract(*np.quantile(self.grid, [0.75, 0.25]))) / 1.34
        bw = max(2 * h, 0.9 * max(spread, 0.05) * max(self.grid.size, 1) ** -0.2)
        half = math.ceil(4 * bw / h)
        kernel = np.exp(-0.5 * (np.arange(-half, half + 1) * h / bw) ** 2)
        dens = np.convolve(hist, kernel / kernel.sum(), mode="same")
        x = np.exp(e)
        beyond = e > self.last
        y = x[beyond] - self.x_last
        if self.xi == 0:
            logsurv_t = -y / self.sigma_last
        else:
            logsurv_t = -np.log1p(self.xi * y / self.sigma_last) / self.xi
        tail_dens = self.s_last * np.exp((1 + self.xi) * logsurv_t) / self.sigma_last * x[beyond]
        dens[beyond] += tail_dens
        surv = np.ones(size)
        k = np.searchsorted(self.grid, e, side="right")
        inside = k > 0
        surv[inside] = self.surv[k[inside] - 1]
        surv[beyond] = self.s_last * np.exp(logsurv_t)
        floor = 1e-6 * float(dens.max())
        return np.log(np.maximum(dens, floor)), np.log(np.maximum(surv, 1e-300))


# ============================================================================ estimator
_STATE_MAX = 1e12  # seconds or units of work: beyond any run, and far from float overflow


def _parse_state(state: Any, expected_format: str) -> tuple[list[str], list[tuple]]:
    """Validated ``(clients, [(duration, time, censored_at, load, busy), ...])`` of
    :meth:`LatencyEstimator.export_rounds` data (arrays over ``clients``, ``time`` NaN where
    censored)."""
    if not isinstance(state, Mapping):
        raise ValueError(f"latency observations must be a JSON object; got {type(state).__name__}")
    if state.get("format") != expected_format or state.get("version") != 1:
        raise ValueError(f"format={state.get('format')!r} version={state.get('version')!r}; "
                         f"expected {expected_format!r} version 1")
    clients = state.get("clients")
    if not (isinstance(clients, list) and all(isinstance(k, str) for k in clients)
            and len(set(clients)) == len(clients)):
        raise ValueError("clients must be a list of distinct names")
    if not isinstance(state.get("meta", {}), Mapping):
        raise ValueError(f"meta must be an object; got {type(state['meta']).__name__}")
    rounds = state.get("rounds")
    if not isinstance(rounds, list):
        raise ValueError(f"rounds must be a list; got {type(rounds).__name__}")
    out = []
    for r, item in enumerate(rounds):
        if not isinstance(item, Mapping):
            raise ValueError(f"rounds[{r}] must be an object")
        duration = item.get("duration")
        if isinstance(duration, bool) or not isinstance(duration, (int, float)) or not (
                math.isfinite(duration) and duration > 0):
            raise ValueError(f"rounds[{r}].duration={duration!r} must be a finite number > 0")
        cols = []
        for name in ("time", "censored_at", "load", "busy"):
            values = item.get(name)
            where = f"rounds[{r}].{name}"
            if not isinstance(values, list) or len(values) != len(clients):
                raise ValueError(f"{where} must be a list of {len(clients)} numbers (one per "
                                 "client)")
            if any(isinstance(v, (bool, str)) or (v is None and name != "time")
                   for v in values):
                raise ValueError(f"{where} must hold numbers"
                                 + (" or null" if name == "time" else ""))
            try:
                arr = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
            except (TypeError, ValueError, OverflowError) as exc:
                raise ValueError(f"{where} must hold numbers: {exc}") from exc
            if arr.ndim != 1:
                raise ValueError(f"{where} must be a flat list of numbers")
            known = arr[~np.isnan(arr)] if name == "time" else arr
            bad = ~np.isfinite(known) | (known < 0) | (known > _STATE_MAX)
            if name == "load":  # a unit of work too small would make its time per unit infinite
                bad |= (known > 0) & (known < 1 / _STATE_MAX)
            if bad.any():
                raise ValueError(f"{where} has {float(known[bad][0]):g}; expected values in "
                                 f"[0, {_STATE_MAX:g}]" + (" (0 or at least "
                                 f"{1 / _STATE_MAX:g})" if name == "load" else ""))
            cols.append(arr)
        out.append((float(duration), *cols))
    return clients, out


@dataclass
class _Round:
    index: int
    y: np.ndarray  # compute time (elapsed - busy), NaN when censored
    limit: np.ndarray  # censoring time (duration - busy)
    load: np.ndarray  # units of work; 0 = no information
    duration: float
    busy: np.ndarray
    summary: tuple[float, float] | None = None  # (log median load, log median time), cached

    def log_medians(self) -> tuple[float, float] | None:
        """``(log median load, log median time)`` of the clients with work, or ``None`` when
        half or more of them were censored (the median time is then unknown)."""
        if self.summary is None:
            mask = self.load > 0
            t = np.where(np.isnan(self.y[mask]), np.inf, self.y[mask])
            if mask.any() and 2 * np.count_nonzero(np.isinf(t)) < t.size:
                self.summary = (
                    math.log(float(np.median(self.load[mask]))),
                    math.log(max(float(np.median(t)), _TINY)),
                )
            else:
                self.summary = (math.nan, math.nan)
        return None if math.isnan(self.summary[0]) else self.summary


class LatencyEstimator:
    """Per-client latency per unit of load, estimated online from censored reply times.

    Args:
        n: number of clients.
        prior: optional latency model (anything with ``sample(size, rng, load)``, e.g.
            :class:`fl_gradcode.latency.ShiftedExponential`) for the per-unit latency ``X``
            before any observation; afterwards it enters the pooled curve as
            ``prior_weight`` rounds of pseudo-observations that never decay.
        halflife: rounds after which an observation counts half (exponential forgetting, for
            drift); ``math.inf`` keeps everything.
        load_exponent: ``beta`` in ``time = busy + load**beta * X``; ``None`` (default)
            estimates it from rounds at different loads, starting from ``beta_prior``.
        beta_prior: the starting ``beta`` (1.0: compute-bound, the optimistic guess for
            small ``s``).
        beta_strength: weight of ``beta_prior`` in (log load)^2 units: data from rounds whose
            loads differ by a factor ``r`` outweigh it after about ``beta_strength / ln(r)^2``
            rounds.
        prior_weight: pseudo-rounds of the prior in the pooled curve.
        slowness_sd: prior standard deviation of a client's log slowness factor (1.5: a
            client needs a few rounds before it is believed 10x slower or faster).
        max_rounds: rounds kept (default ``6 * halflife``, at most 200: older rounds weigh
            less than 2%).
        seed: seeds the prior's pseudo-observations and :meth:`sample`'s default generator.

    Feed it with :meth:`update` once per round and :meth:`observe_late` for replies that
    arrive after their round ended.
    """

    def __init__(
        self,
        n: int,
        prior: Any = None,
        *,
        halflife: float = 20.0,
        load_exponent: float | None = None,
        beta_prior: float = 1.0,
        beta_strength: float = 0.1,
        prior_weight: float = 1.0,
        slowness_sd: float = 1.5,
        max_rounds: int | None = None,
        seed: int = 0,
    ) -> None:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"n={n!r} must be a positive integer")
        if not halflife > 0:
            raise ValueError(f"halflife={halflife!r} must be > 0 (math.inf: no forgetting)")
        if load_exponent is not None and not 0.0 <= load_exponent <= 2.0:
            raise ValueError(f"load_exponent={load_exponent!r} must be in [0, 2] or None")
        for name, value in (("beta_strength", beta_strength), ("slowness_sd", slowness_sd)):
            if not value > 0:
                raise ValueError(f"{name}={value!r} must be > 0")
        if not prior_weight >= 0:
            raise ValueError(f"prior_weight={prior_weight!r} must be >= 0")
        if prior is not None and not hasattr(prior, "sample"):
            raise ValueError("prior must have a sample(size, rng, load) method or be None")
        self.n = int(n)
        self.prior = prior
        self.halflife = float(halflife)
        self.fixed_beta = None if load_exponent is None else float(load_exponent)
        self.beta_prior = float(beta_prior)
        self.beta_strength = float(beta_strength)
        self.prior_weight = float(prior_weight)
        self.slowness_sd = float(slowness_sd)
        if max_rounds is None:
            max_rounds = 200 if math.isinf(halflife) else int(min(200, math.ceil(6 * halflife)))
        self.max_rounds = max(int(max_rounds), 2)
        self.seed = int(seed)
        self._rounds: deque[_Round] = deque(maxlen=self.max_rounds)
        self._next_index = 0
        self._version = 0
        self._fit: dict[str, Any] | None = None
        self._prior_log = None
        if prior is not None:
            rng = np.random.default_rng([self.seed, 1])
            x = np.asarray(prior.sample(512, rng, 1.0), dtype=np.float64)
            self._prior_log = np.log(np.maximum(x, _TINY))

    # ------------------------------------------------------------------ data in
    @property
    def n_rounds(self) -> int:
        """Rounds currently remembered."""
        return len(self._rounds)

    @property
    def has_data(self) -> bool:
        """Whether at least one reply time or censored time has been recorded."""
        return any(np.any(r.load > 0) for r in self._rounds)

    def update(
        self,
        elapsed: Sequence[float] | np.ndarray,
        loads: Sequence[float] | np.ndarray,
        duration: float,
        *,
        busy: Sequence[float] | np.ndarray | None = None,
    ) -> int:
        """Record one round; returns its id (for :meth:`observe_late`).

        Args:
            elapsed: per client, seconds from the round's start to its reply; ``nan`` or
                ``inf`` when it had not replied by the end of the round, errored, or never
                answers (censored at ``duration``).
            loads: per client, the units of work it was given (partitions times cost); 0 for
                clients that got no work (they carry no information).
            duration: when the round ended (seconds from its start).
            busy: per client, seconds it was still busy with earlier work when the round
                started (default 0); its own computation started only then.
        """
        elapsed = self._vector(elapsed, "elapsed", allow_nan=True)
        loads = self._vector(loads, "loads")
        if np.any(loads < 0):
            raise ValueError("loads must be >= 0")
        if not (isinstance(duration, (int, float, np.floating)) and duration > 0):
            raise ValueError(f"duration={duration!r} must be a positive number")
        busy = np.zeros(self.n) if busy is None else self._vector(busy, "busy")
        busy = np.maximum(busy, 0.0)
        limit = float(duration) - busy
        observed = np.isfinite(elapsed)
        y = np.where(observed, np.maximum(elapsed - busy, _TINY), np.nan)
        loads = np.where(limit > 0, loads, 0.0)  # never started: no information
        late = observed & (y > limit)  # a reply after the end: an observation all the same
        limit = np.where(late, y, limit)
        rec = _Round(self._next_index, y, limit, loads, float(duration), busy)
        self._rounds.append(rec)
        self._next_index += 1
        self._version += 1
        return rec.index

    def grow(self, n: int) -> None:
        """Make room for clients ``self.n .. n - 1`` (new nodes joining the federation): the
        remembered rounds record that they had no work (no information about them)."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < self.n:
            raise ValueError(f"n={n!r} must be an integer >= the current n={self.n}")
        extra = int(n) - self.n
        if extra == 0:
            return
        for rec in self._rounds:
            rec.y = np.concatenate([rec.y, np.full(extra, np.nan)])
            rec.limit = np.concatenate([rec.limit, np.zeros(extra)])
            rec.load = np.concatenate([rec.load, np.zeros(extra)])
            rec.busy = np.concatenate([rec.busy, np.zeros(extra)])
        self.n = int(n)
        self._version += 1

    def view(self, members: Sequence[int] | np.ndarray) -> CohortView:
        """This estimator seen through a cohort: client ``w`` of the view is ``members[w]``."""
        return CohortView(self, members)

    def observe_late(self, round_id: int, client: int, elapsed: float) -> bool:
        """A reply of round ``round_id`` arrived after the round ended: turn the censored
        observation of ``client`` into an observed time. Returns ``False`` if the round is no
        longer remembered or the client already had a time."""
        rec = self._censored(round_id, client, elapsed)
        if rec is None:
            return False
        rec.y[client] = max(elapsed - rec.busy[client], _TINY)
        rec.limit[client] = max(rec.limit[client], rec.y[client])
        rec.summary = None
        self._version += 1
        return True

    def _censored(self, round_id: int, client: int, elapsed: float) -> _Round | None:
        """The remembered round ``round_id`` if ``client`` had work in it and no time yet."""
        if not 0 <= client < self.n:
            raise ValueError(f"client={client} must be in [0, {self.n})")
        if not (math.isfinite(elapsed) and elapsed >= 0):
            raise ValueError(f"elapsed={elapsed!r} must be a finite time >= 0")
        for rec in self._rounds:
            if rec.index == round_id:
                if not np.isnan(rec.y[client]) or rec.load[client] <= 0:
                    return None
                return rec
        return None

    def observe_pending(self, round_id: int, client: int, elapsed: float) -> bool:
        """The reply of ``client`` in round ``round_id`` has still not arrived ``elapsed``
        seconds after that round started: its censoring time grows to ``elapsed``.

        A round's end only bounds an unanswered client's time from below; every later round
        that passes without its reply raises the bound. Without this, a slow mode whose
        replies are all still outstanding looks only slightly slower than the round that
        censored it. Returns ``False`` if the round is no longer remembered, the client
        already replied, had no work, or ``elapsed`` is not beyond its censoring time.
        """
        rec = self._censored(round_id, client, elapsed)
        limit = None if rec is None else elapsed - rec.busy[client]
        if rec is None or limit <= rec.limit[client]:
            return False
        rec.limit[client] = limit
        self._version += 1
        return True

    # ------------------------------------------------------------------ persistence
    STATE_FORMAT = "fl-gradcode latency observations"

    def export_rounds(self, keys: Sequence[str], meta: Mapping[str, Any] | None = None,
                      informative_only: bool = False) -> dict[str, Any]:
        """The remembered rounds as JSON-ready data, client ``i`` named ``keys[i]`` (a name
        that outlives this run, such as its data partition), oldest round first.

        ``{"clients": keys, "rounds": [{"duration": d, "time": [...], "censored_at": [...],
        "load": [...], "busy": [...]}]}``, one value per client in each list: its compute time
        (``null`` when the reply had not arrived), the time it was censored at, its units of
        work (0: no work, no information) and the seconds it waited for earlier work.
        ``meta`` (JSON-ready): how the times were measured, stored as ``"meta"``.
        ``informative_only``: leave out the clients without work in any remembered round.
        """
        keys = self._keys(keys)
        cols = np.arange(self.n)
        if informative_only:
            cols = np.flatnonzero(np.any([rec.load > 0 for rec in self._rounds], axis=0)
                                  if self._rounds else np.zeros(self.n, dtype=bool))
        # (a client that never started has a negative censoring time and no load: 0)
        rounds = [{"duration": rec.duration,
                   "time": [None if math.isnan(y) else y for y in rec.y[cols].tolist()],
                   "censored_at": np.maximum(rec.limit[cols], 0.0).tolist(),
                   "load": rec.load[cols].tolist(), "busy": rec.busy[cols].tolist()}
                  for rec in self._rounds]
        state = {"format": self.STATE_FORMAT, "version": 1,
                 "clients": [keys[j] for j in cols], "rounds": rounds}
        if meta is not None:
            state["meta"] = dict(meta)
        return state

    def import_rounds(self, state: Mapping[str, Any], keys: Sequence[str]) -> int:
        """Remember the rounds of :meth:`export_rounds` (another run's observations of the
        same clients) as rounds before any of this estimator's: a warm start, so that the
        first decision is made from them instead of the safe default. Clients are matched by
        name; names not in ``keys`` are ignored, and clients not in ``state`` had no work.
        The rounds age like any round (``halflife``). Returns the number of rounds remembered.

        Raises:
            ValueError: the estimator already has rounds, or ``state`` is not such data (the
                message names the bad entry).
        """
        keys = self._keys(keys)
        if self._rounds:
            raise ValueError("import_rounds needs an estimator without rounds; this one has "
                             f"{len(self._rounds)}")
        names, rounds = _parse_state(state, self.STATE_FORMAT)
        where = {key: i for i, key in enumerate(keys)}
        src = np.array([j for j, key in enumerate(names) if key in where], dtype=np.int64)
        dst = np.array([where[names[j]] for j in src], dtype=np.int64)
        for duration, t, cut, units, waited in rounds[-self.max_rounds:]:
            y = np.full(self.n, np.nan)
            limit, load, busy = np.zeros(self.n), np.zeros(self.n), np.zeros(self.n)
            y[dst] = np.maximum(t[src], _TINY)  # NaN (censored) stays NaN
            limit[dst], load[dst], busy[dst] = cut[src], units[src], waited[src]
            self._rounds.append(_Round(self._next_index, y, limit, load, duration, busy))
            self._next_index += 1
        self._version += 1
        return len(self._rounds)

    @classmethod
    def validate_state(cls, state: Any) -> None:
        """Raise ``ValueError`` (naming the bad entry) unless ``state`` is
        :meth:`export_rounds` data."""
        _parse_state(state, cls.STATE_FORMAT)

    def _keys(self, keys: Sequence[str]) -> list[str]:
        keys = [str(k) for k in keys]
        if len(keys) != self.n:
            raise ValueError(f"{len(keys)} keys for {self.n} clients; expected one per client")
        if len(set(keys)) != len(keys):
            raise ValueError("client keys must be distinct")
        return keys

    def _vector(self, v: Any, name: str, allow_nan: bool = False) -> np.ndarray:
        arr = np.asarray(v, dtype=np.float64)
        if arr.shape != (self.n,):
            raise ValueError(f"{name} has shape {arr.shape}; expected ({self.n},)")
        bad = np.zeros(self.n, dtype=bool) if allow_nan else ~np.isfinite(arr)
        if bad.any():
            raise ValueError(f"{name}[{int(np.flatnonzero(bad)[0])}] is not finite")
        return arr

    # ------------------------------------------------------------------ fitting
    def _stacked(self):
        """All remembered observations: client, round weight, time, censoring, load, event."""
        if not self._rounds:
            return None
        latest = self._rounds[-1].index
        cols = []
        for rec in self._rounds:
            mask = rec.load > 0
            if not mask.any():
                continue
            w = 0.5 ** ((latest - rec.index) / self.halflife)
            clients = np.flatnonzero(mask)
            event = ~np.isnan(rec.y[mask])
            t = np.where(event, rec.y[mask], rec.limit[mask])
            cols.append((clients, np.full(clients.size, w), t, rec.load[mask], event, rec.index))
        if not cols:
            return None
        return cols

    def _estimate_beta(self) -> float:
        if self.fixed_beta is not None:
            return self.fixed_beta
        xs, ys, ws = [], [], []
        latest = self._rounds[-1].index
        for rec in self._rounds:
            med = rec.log_medians()
            if med is None:
                continue
            xs.append(med[0])
            ys.append(med[1])
            ws.append(0.5 ** ((latest - rec.index) / self.halflife))
        if len(xs) < 2:
            return self.beta_prior
        x, y, w = np.array(xs), np.array(ys), np.array(ws)
        xc = x - np.average(x, weights=w)
        yc = y - np.average(y, weights=w)
        beta = (self.beta_strength * self.beta_prior + np.sum(w * xc * yc)) / (
            self.beta_strength + np.sum(w * xc * xc)
        )
        return float(np.clip(beta, 0.0, 1.0))

    def fit(self) -> dict[str, Any] | None:
        """Fit (cached until new data): ``beta``, log slowness ``phi``, the pooled curve."""
        if self._fit is not None and self._fit["version"] == self._version:
            return self._fit
        cols = self._stacked()
        if cols is None:
            self._fit = None
            return None
        clients = np.concatenate([c[0] for c in cols])
        w = np.concatenate([c[1] for c in cols])
        t = np.concatenate([c[2] for c in cols])
        load = np.concatenate([c[3] for c in cols])
        event = np.concatenate([c[4] for c in cols])
        beta = self._estimate_beta()
        per_unit = np.maximum(t, _TINY) / load**beta
        z = np.log(per_unit)
        phi = self._slowness_map(clients, w, z, event)
        e = z - phi[clients]
        if self._prior_log is not None and self.prior_weight > 0:
            pw = np.full(self._prior_log.size, self.prior_weight * self.n / self._prior_log.size)
            curve = _Survival(
                np.concatenate([e, self._prior_log]),
                np.concatenate([event, np.ones(self._prior_log.size, dtype=bool)]),
                np.concatenate([w, pw]),
            )
        else:
            curve = _Survival(e, event, w)
        evts = np.bincount(clients, weights=w * event, minlength=self.n)
        exposure = np.bincount(clients, weights=w * per_unit, minlength=self.n)
        self._fit = {
            "version": self._version,
            "beta": beta,
            "phi": phi,
            "curve": curve,
            "events": evts,
            "exposure": exposure,
        }
        return self._fit

    def _slowness_map(
        self, clients: np.ndarray, w: np.ndarray, z: np.ndarray, event: np.ndarray
    ) -> np.ndarray:
        """Per-client log slowness ``phi_i``: MAP under ``z = phi_i + e``, ``e`` ~ the pooled
        curve (refitted once after a first pass), prior ``N(0, slowness_sd^2)``.

        Censored observations enter through the survival ``P(e > c - phi)``: a client that
        has been censored in every one of ``R`` rounds is pushed up until ``S(c - phi)^R`` is
        not small, so its estimate keeps growing (slowly) while it never replies, and a
        node that never answers ends up tolerated. Grid search: coarse step 0.5 on
        ``[-6, 9]`` (factors 0.0025 to 8100), then 0.05 around the best.
        """
        h = 0.02
        coarse = np.arange(-6.0, 9.0 + 1e-9, 0.5)
        fine = np.arange(-0.5, 0.5 + 1e-9, 0.05)
        M = csr_matrix((w, (clients, np.arange(clients.size))), shape=(self.n, clients.size))
        ev, ce = np.flatnonzero(event), np.flatnonzero(~event)
        prior_prec = 1.0 / self.slowness_sd**2
        seen = np.bincount(clients, minlength=self.n) > 0
        lo = float(z.min()) - 9.5
        size = math.ceil((float(z.max()) + 6.5 - lo) / h) + 1
        base_e, base_c = (z[ev] - lo) / h, (z[ce] - lo) / h
        phi = np.zeros(self.n)
        for it in range(2):  # pass 1 from the pooled curve, pass 2 from the refitted one
            logp, logs = _Survival(z - phi[clients], event, w, gpd=False).log_tables(lo, h, size)

            def log_post(cand: np.ndarray, logp=logp, logs=logs) -> np.ndarray:
                """``n x P`` log posterior of the candidate values ``cand`` (``n x P``)."""
                shifts = cand[clients] / h
                vals = np.empty(shifts.shape)
                ie = np.rint(base_e[:, None] - shifts[ev]).astype(np.int32)
                vals[ev] = logp[np.clip(ie, 0, size - 1)]
                ic = np.rint(base_c[:, None] - shifts[ce]).astype(np.int32)
                vals[ce] = logs[np.clip(ic, 0, size - 1)]
                return np.asarray(M @ vals) - 0.5 * prior_prec * cand**2

            if it == 0:
                cand = np.broadcast_to(coarse, (self.n, coarse.size))
                phi = coarse[np.argmax(log_post(cand), axis=1)]
            cand = phi[:, None] + fine[None, :]
            phi = cand[np.arange(self.n), np.argmax(log_post(cand), axis=1)]
            phi[~seen] = 0.0
        return phi

    # ------------------------------------------------------------------ estimates out
    @property
    def load_exponent(self) -> float:
        """The current ``beta`` (given, or estimated; ``beta_prior`` before data)."""
        fit = self.fit()
        if fit is None:
            return self.beta_prior if self.fixed_beta is None else self.fixed_beta
        return float(fit["beta"])

    def rates(self) -> np.ndarray:
        """Per-client exponential MLE of the per-unit rate with censoring (Cox & Oakes):
        ``(weighted events) / (weighted total exposure)``; ``nan`` for a client never seen."""
        fit = self.fit()
        if fit is None:
            return np.full(self.n, np.nan)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(fit["exposure"] > 0, fit["events"] / fit["exposure"], np.nan)

    def slowness(self) -> np.ndarray:
        """Per-client slowness factor ``f_i`` (1 = typical; 10 = ten times slower)."""
        fit = self.fit()
        return np.ones(self.n) if fit is None else np.exp(fit["phi"])

    def sample(self, size: int, rng: np.random.Generator | None = None) -> np.ndarray:
        """``size x n`` draws of each client's per-unit latency ``X_i`` (the predictive).

        Raises:
            ValueError: no observation and no prior.
        """
        rng = np.random.default_rng([self.seed, 2]) if rng is None else rng
        fit = self.fit()
        if fit is None:
            if self.prior is None:
                raise ValueError("no observations yet and no prior: nothing to sample from")
            return np.asarray(self.prior.sample((size, self.n), rng, 1.0), dtype=np.float64)
        u = rng.random((size, self.n))
        return np.exp(fit["curve"].sample(u) + fit["phi"][None, :])

    def sample_remaining(
        self,
        elapsed: Sequence[float] | np.ndarray,
        load: Sequence[float] | np.ndarray,
        size: int,
        rng: np.random.Generator | None = None,
    ) -> np.ndarray:
        """``size x n`` draws of the time each client still needs for work it has not
        returned: ``load[i]`` units sent ``elapsed[i]`` seconds ago (``nan``: nothing
        outstanding, remaining 0).

        The work's total time ``load**beta * X_i`` is drawn conditional on exceeding
        ``elapsed`` (it has not been returned yet): what a server knows about a busy client,
        without the simulator's knowledge of when its reply will arrive.
        """
        elapsed = np.asarray(elapsed, dtype=np.float64)
        load = np.asarray(load, dtype=np.float64)
        if elapsed.shape != (self.n,) or load.shape != (self.n,):
            raise ValueError(f"elapsed and load must have shape ({self.n},); got "
                             f"{elapsed.shape} and {load.shape}")
        rng = np.random.default_rng([self.seed, 3]) if rng is None else rng
        out = np.zeros((int(size), self.n))
        idx = np.flatnonzero(np.isfinite(elapsed) & (load > 0))
        if idx.size == 0:
            return out
        ago = np.maximum(elapsed[idx], 0.0)
        scale = np.maximum(load[idx], _TINY) ** self.load_exponent
        fit = self.fit()
        if fit is None:  # the prior, unconditional: it says nothing about this client
            X = self.sample(int(size), rng)[:, idx]
        else:
            phi = fit["phi"][idx]
            e0 = np.log(np.maximum(ago / scale, _TINY)) - phi
            e = fit["curve"].sample_above(e0, rng.random((int(size), idx.size)))
            X = np.exp(e + phi)
        out[:, idx] = np.maximum(scale * X - ago, 0.0)
        return out


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
    def _next_index(self) -> int:
        return self.base._next_index

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


# ============================================================================ decode rules
@dataclass(frozen=True)
class DecodeRule:
    """When a code's replies decode: every group ``g`` has ``thresholds[g]`` replies.

    ``members`` is ``G x m`` (padded with ``n``, a never-arriving client); ``support`` the
    ``n x k`` 0/1 matrix of the partitions each client computes, ``counts`` its row sums.
    """

    members: np.ndarray
    thresholds: np.ndarray
    support: np.ndarray
    counts: np.ndarray
    n: int

    def loads(self, load_per_partition: float | np.ndarray) -> np.ndarray:
        """Per-client units of work: the sum of the costs of the partitions it computes."""
        cost = np.asarray(load_per_partition, dtype=np.float64)
        if cost.ndim == 0:
            return self.counts * float(cost)
        if cost.shape != (self.support.shape[1],):
            raise ValueError(f"load_per_partition has shape {cost.shape}; expected scalar or "
                             f"({self.support.shape[1]},)")
        return self.support @ cost

    def times(self, client_times: np.ndarray) -> np.ndarray:
        """Decode time of each row of ``client_times`` (``samples x n``)."""
        S = client_times.shape[0]
        padded = np.concatenate([client_times, np.full((S, 1), np.inf)], axis=1)
        G, m = self.members.shape
        t_max = int(self.thresholds.max())
        if G == 1:
            t = int(self.thresholds[0])
            row = padded[:, self.members[0]]
            return np.partition(row, t - 1, axis=1)[:, t - 1]
        if t_max == 1:  # one reply per group (FRC): max over groups of the group minimum
            return padded[:, self.members].min(axis=2).max(axis=1)
        if t_max <= 6:
            # Keep each group's t_max smallest times in a sorted buffer (elementwise min/max,
            # client-major so member rows gather contiguously): 2-3x faster than np.partition
            # on many short rows at n = 256 (measured); large thresholds use np.partition.
            cols = np.ascontiguousarray(padded.T)  # (n+1) x S: member rows gather fast
            buf = [np.full((G, S), np.inf) for _ in range(t_max)]
            lo = np.empty((G, S))
            for j in range(m):
                x = cols[self.members[:, j]]
                for k in range(t_max):  # insert x into the sorted buffer
                    np.minimum(buf[k], x, out=lo)
                    np.maximum(buf[k], x, out=x)
                    buf[k], lo = lo, buf[k]
            stacked = np.stack(buf)  # t_max x G x S
            picked = stacked[self.thresholds - 1, np.arange(G)]  # G x S
            return picked.max(axis=0)
        block = padded[:, self.members]  # S x G x m
        kth = np.unique(self.thresholds - 1)
        block = np.partition(block, kth, axis=2)
        picked = np.take_along_axis(
            block, np.broadcast_to((self.thresholds - 1)[None, :, None], (S, G, 1)), axis=2
        )[:, :, 0]
        return picked.max(axis=1)


_RULES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _rule_from_groups(n: int, groups: list[tuple[Sequence[int], int]], support) -> DecodeRule:
    m = max(len(c) for c, _ in groups)
    members = np.full((len(groups), m), n, dtype=np.int64)
    for g, (clients, _) in enumerate(groups):
        members[g, : len(clients)] = clients
    thresholds = np.array([t for _, t in groups], dtype=np.int64)
    return DecodeRule(members, thresholds, support, support.sum(axis=1), n)


def decode_rule(code: GradientCode) -> DecodeRule:
    """The (cached) group rule of a code, used instead of ``is_decodable`` for speed.

    Codes with ``decode_groups`` (nested codes): their groups. FRC: one reply per group.
    ``uncoded``: every reply. ``ignore-stragglers``: the fastest ``n - s``. Any other exact
    code: per independent block, ``|block| - s`` replies (sufficient since any ``n - s``
    decode; exact for MDS-like blocks such as CRC's single block).

    Raises:
        ValueError: an approximate code other than ``ignore-stragglers``.
    """
    cached = _RULES.get(code)
    if cached is not None:
        return cached
    n, s = code.n, code.s
    support = (code.B != 0).astype(np.float64)
    if hasattr(code, "decode_groups"):
        groups = list(code.decode_groups)
    elif isinstance(code, IgnoreStragglers):
        groups = [(tuple(range(n)), n - s)]
    elif isinstance(code, UncodedCode):
        groups = [((i,), 1) for i in range(n)]
    elif isinstance(code, FractionalRepetitionCode):
        groups = [(tuple(range(g, g + s + 1)), 1) for g in range(0, n, s + 1)]
    elif code.is_exact:
        groups = [(clients, max(1, len(clients) - s)) for clients, _ in code.blocks]
    else:
        raise ValueError(f"no decode rule for approximate code {code.name!r}")
    rule = _rule_from_groups(n, groups, support)
    _RULES[code] = rule
    return rule


def code_loads(code: GradientCode, load_per_partition: float | np.ndarray = 1.0) -> np.ndarray:
    """Per-client units of work under ``code`` (what :meth:`LatencyEstimator.update` wants)."""
    return decode_rule(code).loads(load_per_partition)


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
    scaled = np.where(loads > 0, np.maximum(loads, _TINY) ** beta, 0.0)
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
    """

    s: int
    expected_times: dict[int, float]
    approximate: bool = False
    approximate_times: dict[int, float] = field(default_factory=dict)
    observed: bool = True
    skip: tuple[int, ...] = ()
    excluded: tuple[int, ...] = ()
    excluded_times: dict[int, float] = field(default_factory=dict)

    @property
    def expected_time(self) -> float:
        """The predicted time of the chosen code (``nan`` before any observation)."""
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

    With no observation it returns the largest candidate (``s_max``: the safe choice; with
    ``busy="fit"`` every busy client is queued). Ties (identical codes, or codes that cannot
    decode without skipped clients) go to the larger ``s``. ``expected_times`` holds what
    was compared (with ``lookahead``: the two-round mean).
    """
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
    n = placement.n
    if pending is not None:
        if busy_until is not None:
            raise ValueError("give busy_until or pending, not both")
        p_elapsed, p_load = (np.asarray(v, dtype=np.float64) for v in pending)
        if p_elapsed.shape != (n,) or p_load.shape != (n,):
            raise ValueError(f"pending arrays must have shape ({n},); got {p_elapsed.shape} "
                             f"and {p_load.shape}")
        is_busy = np.isfinite(p_elapsed) & (p_load > 0)
    else:
        rem = _remaining(busy_until, now, n)
        is_busy = rem > 0
    skip = np.flatnonzero(is_busy) if busy == "skip" else np.zeros(0, dtype=np.int64)
    if not estimator.has_data:
        return Decision(s=cand[-1], expected_times={}, observed=False,
                        skip=tuple(int(i) for i in skip))
    excluded: tuple[int, ...] = ()
    if exclude_slower_than is not None:
        slow = estimator.slowness() >= float(exclude_slower_than)
        excluded = tuple(int(i) for i in np.flatnonzero(slow))
    variants: dict[int, GradientCode] = {}
    if excluded:
        for s in cand:
            try:
                variants[s] = placement.code_excluding(s, excluded)
            except ValueError:  # a super-block with too few active clients for this s
                continue
    X = estimator.sample(int(samples), rng)
    if pending is not None:  # samples x n: each draw its own remaining times
        rem = estimator.sample_remaining(p_elapsed, p_load, int(samples), rng)
        if pending_limit is not None:
            cap = np.asarray(pending_limit, dtype=np.float64)
            if cap.shape != (n,) or np.any(np.isnan(cap)) or np.any(cap < 0):
                raise ValueError(f"pending_limit must hold {n} times >= 0 (inf: no limit); "
                                 f"got {cap!r}")
            rem = np.minimum(rem, cap[None, :])
    beta = estimator.load_exponent

    seen: dict[bytes, float] = {}

    def price(code: GradientCode, rem: np.ndarray) -> float:
        rule = decode_rule(code)
        loads = rule.loads(load_per_partition)
        key = rule.members.tobytes() + rule.thresholds.tobytes() + loads.tobytes()
        if key not in seen:
            finish = _finish(X, rem, loads, beta)
            T = rule.times(finish)
            if lookahead:  # the backlog this round leaves delays the next one
                with np.errstate(invalid="ignore"):  # inf - inf: never replies
                    left = finish - T[:, None]
                left = np.where(np.isnan(left), np.inf, np.maximum(left, 0.0))
                # rolled draws: independent latencies for the next round
                T = 0.5 * (T + rule.times(_finish(np.roll(X, 1, axis=0), left, loads,
                                                  beta)))
            seen[key] = float(np.mean(T))
        return seen[key]

    def evaluate(rem: np.ndarray) -> tuple[dict[int, float], dict[int, float], int, bool]:
        seen.clear()
        times = {s: price(placement.code(s), rem) for s in cand}
        other = {s: price(code, rem) for s, code in variants.items()}
        both = {s: min(times[s], other.get(s, math.inf)) for s in cand}
        fastest = min(both.values())
        # robust choice: the most tolerant candidate predicted within ``margin`` of the
        # fastest, then the faster of its two codes (ties: everyone computes)
        best = max(s for s in cand if both[s] <= fastest * (1.0 + margin))
        return times, other, best, other.get(best, math.inf) < times[best]

    if busy == "skip":
        rem = np.where(is_busy, np.inf, rem)
    times, other, best, use_other = evaluate(rem)
    if busy == "fit" and is_busy.any():
        typical = rem if rem.ndim == 1 else np.median(rem, axis=0)
        end = other[best] if use_other else times[best]
        late = is_busy & (typical > end)  # cannot even start before the expected end
        if late.any():
            skip = np.flatnonzero(late)
            rem = np.where(late, np.inf, rem)
            times, other, best, use_other = evaluate(rem)
    chosen = excluded if use_other else ()
    approx: dict[int, float] = {}
    if allow_approximate:
        own = UncodedCode(n)
        loads = decode_rule(own).loads(load_per_partition)
        T = np.atleast_2d(rem) + np.maximum(loads, _TINY)[None, :] ** beta * X
        ordered = np.sort(T, axis=1)
        for r in cand:
            if r == 0:
                continue
            approx[r] = float(np.mean(ordered[:, n - r - 1])) * n / (n - r)
        if approx:
            r_best = min(approx, key=lambda r: (approx[r], r))
            if approx[r_best] < min(times[best], other.get(best, math.inf)):
                return Decision(r_best, times, True, approx, skip=tuple(int(i) for i in skip),
                                excluded_times=other)
    return Decision(best, times, False, approx, skip=tuple(int(i) for i in skip),
                    excluded=chosen, excluded_times=other)
