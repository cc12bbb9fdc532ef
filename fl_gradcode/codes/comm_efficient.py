"""Communication-efficient gradient coding: load ``d = s + m``, each reply ``1/m`` of the update.

References:
    Ye, Abbe, "Communication-Computation Efficient Gradient Coding", ICML 2018,
    https://arxiv.org/abs/1802.03475 (the tradeoff ``d >= s + m``).
    Kadhe, Koyluoglu, Ramchandran, "Communication-Efficient Gradient Coding for Straggler
    Mitigation in Distributed Learning", ISIT 2020, https://arxiv.org/abs/2005.07184 (any
    linear code defines a scheme; a Gaussian MDS code is optimal and stable).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping

import numpy as np

from .base import Decoding, GradientCode, NotDecodableError, check_n_s
from .patterns import bursts

__all__ = ["CommunicationEfficientCode"]

_EXACT_TOL = 1e-8


def _column_subsets(d: int, m: int, rng: np.random.Generator, limit: int = 2000):
    """All m-subsets of d columns when few, else every cyclic window plus random subsets."""
    if math.comb(d, m) <= limit:
        yield from (list(c) for c in itertools.combinations(range(d), m))
        return
    yield from (sorted(b) for b in bursts(d, m))
    for _ in range(512):
        yield sorted(int(c) for c in rng.choice(d, size=m, replace=False))


def _screened_gaussian(m: int, d: int, rng: np.random.Generator, draws: int):
    """Gaussian ``m x d`` generator whose worst ``m``-column condition number is smallest."""
    best, best_cond = None, np.inf
    for _ in range(draws):
        gamma = rng.standard_normal((m, d))
        worst = max(np.linalg.cond(gamma[:, cols]) for cols in _column_subsets(d, m, rng))
        if worst < best_cond:
            best, best_cond = gamma, worst
    return best, float(best_cond)


class CommunicationEfficientCode(GradientCode):
    """Grouped-MDS communication-efficient gradient code (Kadhe et al. 2020 framework).

    Clients form ``G = floor(n/(s+m))`` groups of consecutive clients; group ``g`` owns
    ``d = s+m`` partitions (``k = G*d``), which every member computes. A member at position
    ``t`` splits the group sum ``S_g = sum_j w_j u_j`` into ``m`` chunks of length
    ``ceil(l/m)`` (zero-padding the tail when ``m`` does not divide ``l``) and sends
    ``sum_u Gamma[u, t] * S_g^(u)``: a reply is ``1/m`` of the update. ``Gamma`` is an
    ``m x |group|`` Gaussian MDS generator, screened over draws for the smallest worst-case
    condition number of its ``m``-column submatrices, so any ``m`` replies of a group recover
    its sum and any ``s`` stragglers leave ``>= m`` per group. Decoding solves one ``m x m``
    (or least-squares ``|T| x m``) system per group: cost ``O(G (m^3 + m l))``, and its accuracy
    is set by ``screened_condition``, not by ``n`` (unlike the polynomial scheme of Ye-Abbe,
    whose ``(n-s)``-sized Vandermonde system fails beyond ~30 clients).

    ``own_partitions=True``: group ``g`` owns its members' own partitions instead
    (``k = n``, one partition per client, the construction of Kadhe et al. with ``d | n``
    when ``s + m`` divides ``n``). The ``n mod (s+m)`` clients left over then make some
    groups larger, and their members compute ``|group|`` partitions, not ``s + m``; any
    ``s`` stragglers still leave ``|group| - s >= m`` replies in every group. A server
    whose clients hold their own data uses it when ``s + m`` does not divide ``n``: ``k < n``
    partitions would be the data split another way than the clients'.

    ``B`` is the ``0/1`` assignment matrix; :meth:`decoding_vector` returns an ``(m, |F|)``
    matrix whose row ``u`` recovers chunk ``u`` of the sum from the received replies.
    """

    name = "comm-efficient"
    blockwise_exactness = False  # replies are chunk combinations: exactness is per group of m
    decodes_in_reply_dtype = False  # decoders invert Gaussian m x m systems: sums in float64

    def __init__(
        self,
        n: int,
        s: int,
        *,
        m: int = 2,
        seed: int = 0,
        draws: int = 8,
        dim: int | None = None,
        weights: Iterable[float] | None = None,
        own_partitions: bool = False,
    ) -> None:
        n, s = check_n_s(n, s)
        if not isinstance(own_partitions, (bool, np.bool_)):
            raise ValueError(f"own_partitions={own_partitions!r} must be True or False")
        if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1:
            raise ValueError(f"m={m!r} must be an integer >= 1 (the message is 1/m of an update)")
        m = int(m)
        d = s + m
        if d > n:
            raise ValueError(f"load d = s + m = {d} must be <= n={n}; got s={s}, m={m}")
        if dim is not None and (not isinstance(dim, (int, np.integer)) or dim < 1):
            raise ValueError(f"dim={dim!r} must be a positive integer (the update length)")
        G = n // d
        sizes = [d + (n - G * d) // G + (1 if g < (n - G * d) % G else 0) for g in range(G)]
        rng = np.random.default_rng(seed)
        B = np.zeros((n, n if own_partitions else G * d))
        self._group_cols: list[slice] = []
        self.gammas: list[np.ndarray] = []
        self._position = np.zeros(n, dtype=np.int64)
        self._group = np.zeros(n, dtype=np.int64)
        worst = 1.0
        row = 0
        for g, size in enumerate(sizes):
            cols = slice(row, row + size) if own_partitions else slice(g * d, (g + 1) * d)
            B[row : row + size, cols] = 1.0
            self._group_cols.append(cols)
            if m == 1:
                gamma, cond = np.ones((1, size)), 1.0
            else:
                gamma, cond = _screened_gaussian(m, size, rng, max(1, draws))
            self.gammas.append(gamma)
            worst = max(worst, cond)
            self._group[row : row + size] = g
            self._position[row : row + size] = np.arange(size)
            row += size
        self.m = m
        self.own_partitions = bool(own_partitions)
        self.dim = None if dim is None else int(dim)
        self.screened_condition = worst
        self._group_rows = [np.flatnonzero(self._group == g) for g in range(G)]
        self._length_hint: int | None = None
        super().__init__(B, s, is_exact=True, weights=weights)

    @property
    def load_overhead(self) -> float:
        """Load fraction divided by the lower bound ``(s+m)/n`` of Ye and Abbe (1.0 = optimal)."""
        return self.load_fraction / ((self.s + self.m) / self.n)

    def message_length(self, length: int) -> int:
        """Reply length ``ceil(length / m)`` for an update of ``length`` floats."""
        return -(-int(length) // self.m)

    @property
    def chunks(self) -> int:
        """``m``: a reply mixes the ``m`` chunks of its group's sum."""
        return self.m

    def chunk_coefficients(self, i: int) -> np.ndarray:
        """``Gamma[:, t]`` of client ``i`` (position ``t`` in its group): its reply is
        ``sum_u Gamma[u, t] S_g^(u)``."""
        i = self._check_client(i)
        return np.array(self.gammas[self._group[i]][:, self._position[i]], dtype=np.float64)

    # ------------------------------------------------------------------ client side
    def encode(self, i: int, updates: Mapping[int, np.ndarray]) -> np.ndarray:
        """Client ``i``'s reply: ``Gamma[:, t]``-combination of the chunks of its group's sum."""
        group_sum = super().encode(i, updates)  # B is 0/1: this is sum_j w_j u_j over the group
        length = group_sum.shape[0]
        self._length_hint = length
        L = self.message_length(length)
        padded = np.zeros(self.m * L)
        padded[:length] = group_sum
        gamma = self.gammas[self._group[i]]
        return gamma[:, self._position[i]] @ padded.reshape(self.m, L)

    # ------------------------------------------------------------------ server side
    def necessary_counts(self) -> list[tuple[tuple[int, ...], int]]:
        """Every group needs ``m`` of its members: with ``|T| < m`` replies,
        ``D_g Gamma_T^T`` has rank ``<= |T| < m`` and cannot be the ``m x m`` identity."""
        return [(tuple(int(r) for r in rows), self.m) for rows in self._group_rows]

    def _group_decoder(self, g: int, got: frozenset[int]) -> tuple[list[int], np.ndarray]:
        rows = [int(r) for r in self._group_rows[g] if int(r) in got]
        cached = self._caches[g].get(frozenset(rows))
        if cached is None:
            if rows:
                gamma_t = self.gammas[g][:, self._position[rows]]  # m x |T|
                cached = np.linalg.pinv(gamma_t.T)  # m x |T|: X = D F_T
            else:
                cached = np.zeros((self.m, 0))
            cached.setflags(write=False)
            self._caches[g].put(frozenset(rows), cached)
        return rows, cached

    def _compute_decoding(self, got: frozenset[int]) -> Decoding:
        """Each group with ``m`` or more replies recovers its sum exactly; a group with fewer
        is left out (decoder columns 0, ``alpha`` 0 on its partitions). Its replies are not
        projected: a least-squares fit of ``m`` chunks from ``|T| < m`` mixtures mixes the
        chunks, i.e. model coordinates with each other and with the example count, so an
        approximate round is the exact sum of the complete groups."""
        D = np.zeros((self.m, self.n))
        alpha = np.zeros(self.k)
        exact = True
        for g, gamma in enumerate(self.gammas):
            rows, Dg = self._group_decoder(g, got)
            recovered = np.zeros((self.m, self.m))  # D_g Gamma_T^T: the identity when exact
            if len(rows) >= self.m:
                D[:, rows] = Dg
                recovered = Dg @ gamma[:, self._position[rows]].T
            miss = recovered - np.eye(self.m)
            exact = exact and bool(np.max(np.abs(miss)) <= _EXACT_TOL)
            # fraction of the group's sum recovered (1 when exact, 0 when nothing arrived)
            alpha[self._group_cols[g]] = 1.0 - np.sum(miss**2) / self.m
        D.setflags(write=False)
        alpha.setflags(write=False)
        return Decoding(tuple(sorted(got)), D, exact, self._weighted_error(alpha), alpha)

    def decoding_vector(self, received: Iterable[int]) -> np.ndarray:
        """``(m, |F|)`` decoder: row ``u`` applied to the replies gives chunk ``u`` of the sum."""
        order = self._check_received(received)
        dec = self._decode_set(frozenset(order))
        if not dec.exact:
            raise NotDecodableError(
                f"received set of {len(order)} clients leaves a group with fewer than "
                f"m={self.m} replies; code {self.name} with n={self.n}, s={self.s}"
            )
        return dec.coefficients[:, list(order)].copy()

    def approximate_decoding_vector(self, received: Iterable[int]) -> np.ndarray:
        """``(m, |F|)`` decoder of the complete groups (``m`` replies or more; the others
        are left out, their replies' columns 0)."""
        order = self._check_received(received)
        return self._decode_set(frozenset(order)).coefficients[:, list(order)].copy()

    def decoding_error(self, received: Iterable[int], a: Iterable[float] | None = None) -> float:
        """Fraction of the (weighted) sum lost: 0 when exact, 1 when nothing arrived."""
        if a is not None:
            raise ValueError("comm-efficient codes decode chunk-wise; pass a=None")
        return super().decoding_error(received)

    def decode(
        self,
        replies: Mapping[int, np.ndarray],
        *,
        approximate: bool | None = None,
        length: int | None = None,
    ) -> np.ndarray:
        """Rebuild the full-length sum ``sum_j w_j u_j`` from short replies.

        ``length`` (the update length ``l``) trims the zero padding; it defaults to ``dim``
        given at construction, else to the length last passed to :meth:`encode` on this
        object, else the padded length ``m * ceil(l/m)`` is returned.
        """
        clients, vectors = self._check_replies(replies)
        target = length if length is not None else (self.dim or self._length_hint)
        if not clients:
            if approximate and target is not None:
                return np.zeros(int(target))
            raise NotDecodableError("no replies to decode (pass length= to get zeros)")
        dec = self._decode_set(frozenset(clients))
        if not dec.exact and not approximate:
            raise NotDecodableError(
                f"replies from {len(clients)} clients leave a group with fewer than m={self.m} "
                "replies; pass approximate=True to accept a partial sum"
            )
        L = vectors[0].shape[0] if vectors else 0
        chunks = np.zeros((self.m, L))
        for c, v in zip(clients, vectors, strict=True):
            chunks += np.outer(dec.coefficients[:, c], v)
        full = chunks.reshape(-1)
        if target is None:
            return full
        if not self.m * L - self.m < target <= self.m * L:
            raise ValueError(
                f"length={target} does not match replies of length {L} (expected "
                f"{self.m * L - self.m + 1}..{self.m * L} for m={self.m})"
            )
        return full[:target]

    def condition_number(self, received: Iterable[int]) -> float:
        """Worst condition number of the per-group systems ``Gamma[:, T]``."""
        got = frozenset(self._check_received(received))
        worst = 1.0
        for g, gamma in enumerate(self.gammas):
            rows = [int(r) for r in self._group_rows[g] if int(r) in got]
            if len(rows) < self.m:
                return float("inf")
            worst = max(worst, float(np.linalg.cond(gamma[:, self._position[rows]])))
        return worst
