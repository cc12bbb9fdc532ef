"""Fitting the latency model's parameters from the remembered rounds: the load exponent
``beta`` (ridge regression of log median time on log median load) and each client's log
slowness factor (maximum a posteriori under the censored likelihood: events contribute the
density of the pooled curve, censored rounds its survival; Cox, Oakes, "Analysis of Survival
Data", Chapman & Hall 1984), with a log-normal prior."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.sparse import csr_matrix

from .state import ObservedRound
from .survival import Survival

__all__ = ["estimate_beta", "slowness_map", "stack_rounds"]


def stack_rounds(rounds: Sequence[ObservedRound], halflife: float) -> list[tuple] | None:
    """All remembered observations, per round with work: ``(clients, round weight, time or
    censoring time, load, event, round id)``; weights halve every ``halflife`` rounds."""
    if not rounds:
        return None
    latest = rounds[-1].index
    cols = []
    for rec in rounds:
        mask = rec.load > 0
        if not mask.any():
            continue
        w = 0.5 ** ((latest - rec.index) / halflife)
        clients = np.flatnonzero(mask)
        event = ~np.isnan(rec.y[mask])
        t = np.where(event, rec.y[mask], rec.limit[mask])
        cols.append((clients, np.full(clients.size, w), t, rec.load[mask], event, rec.index))
    if not cols:
        return None
    return cols


def estimate_beta(rounds: Sequence[ObservedRound], halflife: float, prior: float,
                  strength: float) -> float:
    """The load exponent ``beta``: ridge regression of each round's log median time on its
    log median load (weights halving every ``halflife`` rounds), shrunk towards ``prior``
    with weight ``strength``, clipped to ``[0, 1]``."""
    xs, ys, ws = [], [], []
    latest = rounds[-1].index
    for rec in rounds:
        med = rec.log_medians()
        if med is None:
            continue
        xs.append(med[0])
        ys.append(med[1])
        ws.append(0.5 ** ((latest - rec.index) / halflife))
    if len(xs) < 2:
        return prior
    x, y, w = np.array(xs), np.array(ys), np.array(ws)
    xc = x - np.average(x, weights=w)
    yc = y - np.average(y, weights=w)
    beta = (strength * prior + np.sum(w * xc * yc)) / (
        strength + np.sum(w * xc * xc)
    )
    return float(np.clip(beta, 0.0, 1.0))


def slowness_map(n: int, slowness_sd: float, clients: np.ndarray, w: np.ndarray,
                 z: np.ndarray, event: np.ndarray) -> np.ndarray:
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
    M = csr_matrix((w, (clients, np.arange(clients.size))), shape=(n, clients.size))
    ev, ce = np.flatnonzero(event), np.flatnonzero(~event)
    prior_prec = 1.0 / slowness_sd**2
    seen = np.bincount(clients, minlength=n) > 0
    lo = float(z.min()) - 9.5
    size = math.ceil((float(z.max()) + 6.5 - lo) / h) + 1
    base_e, base_c = (z[ev] - lo) / h, (z[ce] - lo) / h
    phi = np.zeros(n)
    for it in range(2):  # pass 1 from the pooled curve, pass 2 from the refitted one
        logp, logs = Survival(z - phi[clients], event, w, gpd=False).log_tables(lo, h, size)

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
            cand = np.broadcast_to(coarse, (n, coarse.size))
            phi = coarse[np.argmax(log_post(cand), axis=1)]
        cand = phi[:, None] + fine[None, :]
        phi = cand[np.arange(n), np.argmax(log_post(cand), axis=1)]
        phi[~seen] = 0.0
    return phi
