"""The latency-state file: remembered rounds of a latency estimator as JSON-ready data.

:meth:`~fl_gradcode.adaptive.LatencyEstimator.export_rounds` writes it,
:meth:`~fl_gradcode.adaptive.LatencyEstimator.import_rounds` warm-starts a new run from it
(clients matched by a name that outlives the run: their data partition). Every entry is
validated on reading, the message names the bad entry. The records are right-censored reply
times (Cox, Oakes, "Analysis of Survival Data", Chapman & Hall 1984).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .survival import TINY

__all__ = ["STATE_FORMAT", "STATE_MAX", "ObservedRound", "export_state", "import_state",
           "parse_state"]

STATE_FORMAT = "fl-gradcode latency observations"
STATE_MAX = 1e12  # seconds or units of work: beyond any run, and far from float overflow


def parse_state(state: Any, expected_format: str) -> tuple[list[str], list[tuple]]:
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
            bad = ~np.isfinite(known) | (known < 0) | (known > STATE_MAX)
            if name == "load":  # a unit of work too small would make its time per unit infinite
                bad |= (known > 0) & (known < 1 / STATE_MAX)
            if bad.any():
                raise ValueError(f"{where} has {float(known[bad][0]):g}; expected values in "
                                 f"[0, {STATE_MAX:g}]" + (" (0 or at least "
                                 f"{1 / STATE_MAX:g})" if name == "load" else ""))
            cols.append(arr)
        out.append((float(duration), *cols))
    return clients, out


@dataclass
class ObservedRound:
    """One remembered round of a :class:`~fl_gradcode.adaptive.LatencyEstimator`, one entry
    per client in each array (``index``: the round's id, from ``update``)."""

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
                    math.log(max(float(np.median(t)), TINY)),
                )
            else:
                self.summary = (math.nan, math.nan)
        return None if math.isnan(self.summary[0]) else self.summary


def export_state(rounds: Sequence[ObservedRound], keys: list[str], n: int,
                 meta: Mapping[str, Any] | None, informative_only: bool) -> dict[str, Any]:
    """``rounds`` (oldest first) as latency-state data, client ``i`` named ``keys[i]``."""
    cols = np.arange(n)
    if informative_only:
        cols = np.flatnonzero(np.any([rec.load > 0 for rec in rounds], axis=0)
                              if rounds else np.zeros(n, dtype=bool))
    # (a client that never started has a negative censoring time and no load: 0)
    out = [{"duration": rec.duration,
            "time": [None if math.isnan(y) else y for y in rec.y[cols].tolist()],
            "censored_at": np.maximum(rec.limit[cols], 0.0).tolist(),
            "load": rec.load[cols].tolist(), "busy": rec.busy[cols].tolist()}
           for rec in rounds]
    state = {"format": STATE_FORMAT, "version": 1, "clients": [keys[j] for j in cols],
             "rounds": out}
    if meta is not None:
        state["meta"] = dict(meta)
    return state


def import_state(state: Mapping[str, Any], keys: list[str], max_rounds: int,
                 first_index: int) -> list[ObservedRound]:
    """The last ``max_rounds`` rounds of latency-state data over the clients ``keys``
    (matched by name; other names ignored, missing clients had no work), numbered from
    ``first_index``.

    Raises:
        ValueError: ``state`` is not such data (the message names the bad entry).
    """
    names, rounds = parse_state(state, STATE_FORMAT)
    n = len(keys)
    where = {key: i for i, key in enumerate(keys)}
    src = np.array([j for j, key in enumerate(names) if key in where], dtype=np.int64)
    dst = np.array([where[names[j]] for j in src], dtype=np.int64)
    out = []
    for index, (duration, t, cut, units, waited) in enumerate(rounds[-max_rounds:],
                                                              start=first_index):
        y = np.full(n, np.nan)
        limit, load, busy = np.zeros(n), np.zeros(n), np.zeros(n)
        y[dst] = np.maximum(t[src], TINY)  # NaN (censored) stays NaN
        limit[dst], load[dst], busy[dst] = cut[src], units[src], waited[src]
        out.append(ObservedRound(index, y, limit, load, duration, busy))
    return out
