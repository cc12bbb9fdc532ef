"""The pooled latency curve: a weighted Kaplan-Meier curve with a generalised Pareto tail.

References:
    Kaplan, Meier, "Nonparametric Estimation from Incomplete Observations", JASA 53(282), 1958
    (the product-limit estimator, here with weights).
    Efron, "The two sample problem with censored data", Proc. 5th Berkeley Symposium 4, 1967
    (Kaplan-Meier as redistribution of censored mass to the right).
    Pickands, "Statistical inference using extreme order statistics", Ann. Statist. 3(1), 1975
    (generalised Pareto tails above a threshold).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["TINY", "Survival", "fit_gpd"]

TINY = 1e-12  # floor of times, weights and probabilities (no division by zero, no log 0)


def fit_gpd(y: np.ndarray, event: np.ndarray, w: np.ndarray) -> tuple[float, float]:
    """Censored weighted MLE of a generalised Pareto ``(xi, sigma)`` for excesses ``y >= 0``.

    Profile likelihood: for each ``xi`` on a grid ``0, 0.05, ..., 0.95`` the scale solves its
    (convex in ``log sigma``) score equation by Newton's method; the best ``xi`` wins. ``xi = 0``
    is an exponential tail, ``1/alpha`` a Pareto tail of index ``alpha``; bounded tails
    (``xi < 0``) are treated as exponential, which is conservative. Peaks over threshold:
    Pickands, Ann. Statist. 3(1), 1975.
    """
    n_events = float(np.sum(w * event))
    exposure = float(np.sum(w * y))
    sigma0 = exposure / max(n_events, TINY)
    if n_events < 5 or sigma0 <= 0:
        return 0.0, max(sigma0, TINY)
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
            step = grad / max(hess, TINY)
            theta -= float(np.clip(step, -2.0, 2.0))
            if abs(step) < 1e-6:
                break
        r = y / math.exp(theta)
        logsurv = -r if xi == 0 else -np.log1p(xi * r) / xi
        nll = -float(np.sum(w * np.where(event, -theta + (1.0 + xi) * logsurv, logsurv)))
        if nll < best[0]:
            best = (nll, float(xi), math.exp(theta))
    return best[1], best[2]


class Survival:
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
        factor = np.where(d, 1.0 - w / np.maximum(at_risk, TINY), 1.0)
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
            self.xi, self.sigma = fit_gpd(y, d[above], w[above])
        else:  # exponential tail: mean excess = exposure / events (cheap)
            self.xi = 0.0
            events_above = max(float(np.sum(w[above] * d[above])), TINY)
            self.sigma = max(float(np.sum(w[above] * y)) / events_above, TINY)
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
        sigma = np.maximum(self.sigma + self.xi * (start - self.x_u), TINY)
        if self.xi == 0:
            return -sigma * np.log(surv)
        return sigma / self.xi * np.expm1(-self.xi * np.log(surv))

    def _tail(self, u: np.ndarray) -> np.ndarray:
        """Quantiles beyond the last event (``u >= F_K``), in the log domain."""
        q = np.clip((1.0 - u) / max(self.s_last, TINY), TINY, 1.0)  # survival within tail
        if self._cens_x is None:
            start = np.full(q.shape, self.x_last)
            return np.log(start + self._excess(start, q))
        # which censored observation's share ``1 - q`` falls in, and where inside it
        c = np.clip(1.0 - q, 0.0, 1.0)
        j = np.minimum(np.searchsorted(self._cens_cum, c, side="right"),
                       self._cens_cum.size - 1)
        lo = np.where(j > 0, self._cens_cum[np.maximum(j - 1, 0)], 0.0)
        width = np.maximum(self._cens_cum[j] - lo, TINY)
        inner = np.clip(1.0 - (c - lo) / width, TINY, 1.0)
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
        beyond = np.log(x0 + self._excess(x0, np.clip(1.0 - u, TINY, 1.0)))
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
        # the cells centred on the kernel's middle (mode="same" would return the kernel's
        # length when it is longer than the table)
        dens = np.convolve(hist, kernel / kernel.sum())[half: half + size]
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
        floor = max(1e-6 * float(dens.max()), 1e-300)  # no event at all: no mass
        return np.log(np.maximum(dens, floor)), np.log(np.maximum(surv, 1e-300))
