"""Per-client latency per unit of load, estimated online from censored reply times.

An accelerated-failure-time model: client ``i`` given load ``L_i`` replies after
``busy_i + L_i**beta * f_i * E`` with ``E`` the pooled curve (:mod:`.survival`), ``f_i`` a
per-client slowness factor (maximum a posteriori under the censored likelihood, log-normal
prior) and ``beta`` given or estimated by ridge regression of log median time on log median
load.

References:
    Cox, Oakes, "Analysis of Survival Data", Chapman & Hall 1984 (censored likelihoods; the
    exponential MLE rate = events / total exposure of :meth:`LatencyEstimator.rates`).
    Kaplan, Meier, JASA 53(282), 1958; Pickands, Ann. Statist. 3(1), 1975 (the curve).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .fitting import estimate_beta, slowness_map, stack_rounds
from .state import STATE_FORMAT, ObservedRound, export_state, import_state, parse_state
from .survival import TINY, Survival

__all__ = ["CohortView", "LatencyEstimator"]


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
        self._rounds: deque[ObservedRound] = deque(maxlen=self.max_rounds)
        self._next_index = 0
        self._version = 0
        self._fit: dict[str, Any] | None = None
        self._prior_log = None
        if prior is not None:
            rng = np.random.default_rng([self.seed, 1])
            x = np.asarray(prior.sample(512, rng, 1.0), dtype=np.float64)
            self._prior_log = np.log(np.maximum(x, TINY))

    # ------------------------------------------------------------------ data in
    @property
    def n_rounds(self) -> int:
        """Rounds currently remembered."""
        return len(self._rounds)

    @property
    def rounds(self) -> tuple[ObservedRound, ...]:
        """The remembered rounds, oldest first (read them; feed data through :meth:`update`,
        :meth:`observe_late` and :meth:`observe_pending`)."""
        return tuple(self._rounds)

    def round(self, round_id: int) -> ObservedRound | None:
        """The remembered round with id ``round_id`` (``None``: never recorded, or forgotten)."""
        return next((rec for rec in self._rounds if rec.index == round_id), None)

    @property
    def next_round_id(self) -> int:
        """The id :meth:`update` gives the next round (also a count of the rounds recorded)."""
        return self._next_index

    def invalidate(self) -> None:
        """Drop the cached fit: the next estimate refits from the remembered rounds (as after
        a new round; for timing the fit)."""
        self._version += 1

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
        y = np.where(observed, np.maximum(elapsed - busy, TINY), np.nan)
        loads = np.where(limit > 0, loads, 0.0)  # never started: no information
        late = observed & (y > limit)  # a reply after the end: an observation all the same
        limit = np.where(late, y, limit)
        rec = ObservedRound(self._next_index, y, limit, loads, float(duration), busy)
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
        rec.y[client] = max(elapsed - rec.busy[client], TINY)
        rec.limit[client] = max(rec.limit[client], rec.y[client])
        rec.summary = None
        self._version += 1
        return True

    def _censored(self, round_id: int, client: int, elapsed: float) -> ObservedRound | None:
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
    STATE_FORMAT = STATE_FORMAT

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
        return export_state(list(self._rounds), self._keys(keys), self.n, meta,
                            informative_only)

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
        self._rounds.extend(import_state(state, keys, self.max_rounds, self._next_index))
        self._next_index += len(self._rounds)
        self._version += 1
        return len(self._rounds)

    @classmethod
    def validate_state(cls, state: Any) -> None:
        """Raise ``ValueError`` (naming the bad entry) unless ``state`` is
        :meth:`export_rounds` data."""
        parse_state(state, cls.STATE_FORMAT)

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
    def fit(self) -> dict[str, Any] | None:
        """Fit (cached until new data): ``beta``, log slowness ``phi``, the pooled curve."""
        if self._fit is not None and self._fit["version"] == self._version:
            return self._fit
        cols = stack_rounds(self._rounds, self.halflife)
        if cols is None:
            self._fit = None
            return None
        clients = np.concatenate([c[0] for c in cols])
        w = np.concatenate([c[1] for c in cols])
        t = np.concatenate([c[2] for c in cols])
        load = np.concatenate([c[3] for c in cols])
        event = np.concatenate([c[4] for c in cols])
        beta = self.fixed_beta if self.fixed_beta is not None else estimate_beta(
            self._rounds, self.halflife, self.beta_prior, self.beta_strength)
        per_unit = np.maximum(t, TINY) / load**beta
        z = np.log(per_unit)
        phi = slowness_map(self.n, self.slowness_sd, clients, w, z, event)
        e = z - phi[clients]
        if self._prior_log is not None and self.prior_weight > 0:
            pw = np.full(self._prior_log.size, self.prior_weight * self.n / self._prior_log.size)
            curve = Survival(
                np.concatenate([e, self._prior_log]),
                np.concatenate([event, np.ones(self._prior_log.size, dtype=bool)]),
                np.concatenate([w, pw]),
            )
        else:
            curve = Survival(e, event, w)
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
        scale = np.maximum(load[idx], TINY) ** self.load_exponent
        fit = self.fit()
        if fit is None:  # the prior, unconditional: it says nothing about this client
            X = self.sample(int(size), rng)[:, idx]
        else:
            phi = fit["phi"][idx]
            e0 = np.log(np.maximum(ago / scale, TINY)) - phi
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
    def next_round_id(self) -> int:
        return self.base.next_round_id

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
