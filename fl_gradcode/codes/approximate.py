"""Approximate gradient codes: Bernoulli (BGC) and regular-graph (expander) codes.

These codes give up exactness for a lower load or graceful degradation beyond ``s`` stragglers;
the server decodes with the optimal least-squares vector (:meth:`GradientCode.decoding`) and
reports the error ``||B_F^T a - 1||^2 / k``.

References:
    Charles, Papailiopoulos, Ellenberg, "Approximate Gradient Coding via Sparse Random Graphs",
    2017, https://arxiv.org/abs/1711.06771 (Bernoulli gradient code, FRC as an approximate code).
    Raviv, Tamo, Tandon, Dimakis, "Gradient Coding from Cyclic MDS Codes and Expander Graphs",
    ICML 2018, https://arxiv.org/abs/1707.03858 (expander codes, ``B = A_G / d``).
"""

from __future__ import annotations

from collections.abc import Iterable

import networkx as nx
import numpy as np

from .base import GradientCode, check_n_s

__all__ = ["BernoulliCode", "ExpanderCode"]


def _check_load(n: int, d: int) -> int:
    if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or not 1 <= d <= n:
        raise ValueError(f"load d={d!r} must be an integer with 1 <= d <= n={n}")
    return int(d)


class BernoulliCode(GradientCode):
    """Bernoulli gradient code (BGC) of Charles et al. 2017: ``B_ij ~ Bernoulli(d/n)`` iid.

    Each client computes about ``d`` partitions (default ``d = s+1``) and sends their plain sum;
    the server decodes by least squares. Exact decoding is not guaranteed for any set
    (``is_exact`` is ``False``); partitions that no client draws are never recovered.
    """

    name = "bgc"

    def __init__(
        self,
        n: int,
        s: int,
        *,
        load: int | None = None,
        seed: int = 0,
        weights: Iterable[float] | None = None,
    ) -> None:
        n, s = check_n_s(n, s)
        d = _check_load(n, s + 1 if load is None else load)
        rng = np.random.default_rng(seed)
        B = (rng.random((n, n)) < d / n).astype(np.float64)
        super().__init__(B, s, is_exact=False, weights=weights)
        self.design_load = d


class ExpanderCode(GradientCode):
    """Regular-graph code of Raviv et al. 2018: ``B = A_G / d`` for a random ``d``-regular graph.

    Clients and partitions are the vertices of a random ``d``-regular graph (networkx, seeded);
    client ``i`` computes the partitions of its ``d`` neighbours (default ``d = s+1``; ``n*d``
    must be even). Least-squares decoding is optimal; :meth:`fixed_decoding_vector` is the
    paper's decoder ``n/(n-r) * 1_F`` whose error obeys
    ``err <= (lambda/d)^2 * n r / (n - r)`` with ``lambda`` the second largest absolute
    eigenvalue of ``A_G`` (:meth:`error_bound`).
    """

    name = "expander"

    def __init__(
        self,
        n: int,
        s: int,
        *,
        load: int | None = None,
        seed: int = 0,
        weights: Iterable[float] | None = None,
    ) -> None:
        n, s = check_n_s(n, s)
        d = _check_load(n, s + 1 if load is None else load)
        if load is None and (n * d) % 2 and d + 1 < n:
            d += 1  # a d-regular graph needs n*d even: default to the next feasible load
        if d >= n:
            raise ValueError(f"expander code needs load d={d} < n={n} (a d-regular simple graph)")
        if (n * d) % 2:
            raise ValueError(f"a {d}-regular graph on n={n} vertices needs n*d even; got {n * d}")
        graph = nx.random_regular_graph(d, n, seed=seed)
        A = nx.to_numpy_array(graph, nodelist=range(n))
        super().__init__(A / d, s, is_exact=False, weights=weights)
        eig = np.sort(np.abs(np.linalg.eigvalsh(A)))
        self.design_load = d
        self.spectral_lambda = float(eig[-2]) if n > 1 else 0.0

    def fixed_decoding_vector(self, received: Iterable[int]) -> np.ndarray:
        """Raviv et al.'s fixed decoder ``n/|F| * 1_F`` (aligned with ``received``)."""
        order = self._check_received(received)
        if not order:
            return np.zeros(0)
        return np.full(len(order), self.n / len(order))

    def error_bound(self, r: int) -> float:
        """Bound on ``||B_F^T a - 1||^2 / n`` of the fixed decoder with ``r`` stragglers."""
        if not 0 <= r < self.n:
            raise ValueError(f"r={r} stragglers must satisfy 0 <= r < n={self.n}")
        d = self.design_load
        return (self.spectral_lambda / d) ** 2 * r / (self.n - r)
