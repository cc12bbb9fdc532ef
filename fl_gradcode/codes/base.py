"""The gradient-code object: encoding matrix, assignments, exact and least-squares decoding.

Every code in this package is a :class:`GradientCode`: an encoding matrix ``B`` (``n x k``),
a straggler tolerance ``s`` and partition weights ``w``. Client ``i`` computes the updates
``u_j`` of the partitions in the support of row ``i`` and sends
``f_i = sum_j B[i, j] * w[j] * u_j``. From the replies of a set ``F`` of clients the server
finds ``a`` with ``a @ B[F] == 1`` and recovers ``sum_i a_i f_i = sum_j w_j u_j``.

References:
    Tandon, Lei, Dimakis, Karampatziakis, "Gradient Coding: Avoiding Stragglers in Distributed
    Learning", ICML 2017, https://arxiv.org/abs/1612.03301 (the framework and the decoder).
    Charles, Papailiopoulos, Ellenberg, "Approximate Gradient Coding via Sparse Random Graphs",
    2017, https://arxiv.org/abs/1711.06771 (least-squares decoding of approximate codes).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Mapping
from numbers import Integral
from typing import Any

import numpy as np
import scipy.linalg
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

from .checks import as_int, check_n_s, check_vector, check_weights
from .decoding import EXACT_TOL, Decoding, LRUCache, NotDecodableError, least_squares
from .tracker import DecodabilityTracker

__all__ = ["DecodabilityTracker", "Decoding", "GradientCode", "NotDecodableError", "check_n_s"]


class GradientCode:
    """A linear gradient code ``B`` with straggler tolerance ``s`` and partition weights ``w``.

    Args:
        B: encoding matrix of shape ``(n, k)``; row ``i`` is client ``i``'s combination.
        s: number of stragglers the code is designed for.
        is_exact: ``True`` if every set of ``n - s`` replies decodes exactly.
        weights: positive partition weights ``w`` (length ``k``, default ones); decoding then
            recovers ``sum_j w_j u_j`` (e.g. partition sizes for a size-weighted sum).
        name: registry name.
        cache_size: how many received sets to remember per independent block of the code.

    Decoding splits ``B`` into independent blocks (connected components of the
    client-partition support graph: the groups of FRC-like codes), solves a small least-squares
    problem per block in float64 with QR (``scipy.linalg.lstsq``, ``gelsy``) and caches each
    block's solution by the frozenset of its received clients.

    Example:
        >>> from fl_gradcode.codes import make_code
        >>> code = make_code("frc", n=4, s=1)
        >>> code.assignment(0)
        (0, 1)
        >>> [float(x) for x in code.decoding_vector([0, 3])]
        [1.0, 1.0]
    """

    name = "generic"
    #: Whether a server may combine the replies in their own dtype (float32 replies, float32
    #: sums): true when the decoders are small and well conditioned, like the 0/1 and
    #: least-squares decoders of ``B``; codes whose decoders invert a dense random matrix
    #: say False and are combined in float64.
    decodes_in_reply_dtype = True
    #: Exactness decomposes over :attr:`blocks` (a set decodes iff every block's received rows
    #: span its partitions' weights). Codes whose replies are not ``B``-combinations say False.
    blockwise_exactness = True

    def __init__(
        self,
        B: np.ndarray,
        s: int,
        *,
        is_exact: bool,
        weights: Iterable[float] | np.ndarray | None = None,
        name: str | None = None,
        cache_size: int = 4096,
    ) -> None:
        B = np.array(B, dtype=np.float64)
        if B.ndim != 2 or B.shape[0] < 1 or B.shape[1] < 1:
            raise ValueError(f"B must be a non-empty 2-D array of shape (n, k); got {B.shape}")
        if not np.all(np.isfinite(B)):
            raise ValueError("B must be finite; it has NaN or Inf entries")
        n, k = B.shape
        self._s = as_int(s, "s")
        if not 0 <= self._s < n:
            raise ValueError(f"s={self._s} must satisfy 0 <= s < n={n}")
        B.setflags(write=False)
        self._B = B
        self._weights = self._check_weights(weights, k)
        self._is_exact = bool(is_exact)
        if name is not None:
            self.name = name
        self._support = [tuple(int(j) for j in np.flatnonzero(B[i])) for i in range(n)]
        self._blocks = self._find_blocks()
        self._block_of_client = np.full(n, -1, dtype=np.int64)
        for b, (clients, _) in enumerate(self._blocks):
            self._block_of_client[list(clients)] = b
        self._caches = [LRUCache(cache_size) for _ in self._blocks]
        self._set_cache = LRUCache(cache_size)
        self._sparse_cache = LRUCache(cache_size)
        # Partitions held by nobody can never be recovered.
        self._orphans = np.flatnonzero(~np.any(B != 0, axis=0))

    # ------------------------------------------------------------------ properties
    @property
    def n(self) -> int:
        """Number of clients (workers)."""
        return self._B.shape[0]

    @property
    def k(self) -> int:
        """Number of data partitions."""
        return self._B.shape[1]

    @property
    def s(self) -> int:
        """Number of stragglers the code is designed to tolerate."""
        return self._s

    @property
    def B(self) -> np.ndarray:
        """The encoding matrix, shape ``(n, k)`` (read-only)."""
        return self._B

    @property
    def weights(self) -> np.ndarray:
        """Partition weights ``w``: decoding recovers ``sum_j w_j u_j``."""
        return self._weights

    @property
    def is_exact(self) -> bool:
        """``True``: the sum is recovered exactly from ANY ``n - s`` replies."""
        return self._is_exact

    @property
    def load(self) -> int:
        """Computation load: the largest number of partitions any client computes."""
        return max(len(sup) for sup in self._support)

    @property
    def load_fraction(self) -> float:
        """Largest fraction of the data any client computes (lower bound ``(s+1)/n``)."""
        return self.load / self.k

    @property
    def rounding_amplification(self) -> float | None:
        """A bound over EVERY straggler pattern on ``sum_i |a_i| ||B_i||_1 / k`` (how much
        decoding magnifies the replies' rounding errors relative to the decoded sum), or
        ``None`` when the code has no closed form (a server then samples decodable sets)."""
        return None

    @property
    def blocks(self) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
        """Independent blocks ``(clients, partitions)`` that decode separately."""
        return list(self._blocks)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(name={self.name!r}, n={self.n}, k={self.k}, s={self.s}, "
            f"load={self.load}, is_exact={self.is_exact})"
        )

    def with_weights(self, weights: Iterable[float] | np.ndarray) -> GradientCode:
        """The same code (same ``B``, same random draws) with other partition weights.

        Lets a caller build the code once, learn ``k``, size the partitions, then weight them;
        decoders are recomputed because least-squares decoding depends on the weights.
        """
        new = copy.copy(self)
        new._weights = self._check_weights(weights, self.k)
        new._caches = [LRUCache(c.maxsize) for c in self._caches]
        new._set_cache = LRUCache(self._set_cache.maxsize)
        new._sparse_cache = LRUCache(self._sparse_cache.maxsize)
        return new

    # ------------------------------------------------------------------ client side
    def assignment(self, i: int) -> tuple[int, ...]:
        """Partition indices client ``i`` must compute (the support of row ``i``)."""
        return self._support[self._check_client(i)]

    def encoding_coefficients(self, i: int) -> np.ndarray:
        """Coefficients ``B[i, j] * w_j`` aligned with :meth:`assignment`."""
        i = self._check_client(i)
        cols = list(self._support[i])
        return self._B[i, cols] * self._weights[cols]

    def encode(self, i: int, updates: Mapping[int, np.ndarray]) -> np.ndarray:
        """What client ``i`` sends: ``sum_j B[i, j] * w_j * updates[j]`` over its assignment.

        ``updates`` maps partition index to a 1-D array; partitions outside the assignment are
        ignored, so the full dictionary of all partition updates may be passed.
        """
        i = self._check_client(i)
        parts = self._support[i]
        missing = [j for j in parts if j not in updates]
        if missing:
            raise ValueError(
                f"client {i} must compute partitions {list(parts)}; updates lack {missing}"
            )
        vectors = [self._check_vector(updates[j], f"update of partition {j}") for j in parts]
        if vectors:
            length = vectors[0].shape[0]
        else:  # a client holding nothing (possible in random codes) sends zeros
            any_update = next(iter(updates.values()), np.zeros(0))
            length = self._check_vector(any_update, "update").shape[0]
        for j, v in zip(parts, vectors, strict=True):
            if v.shape[0] != length:
                raise ValueError(
                    f"update of partition {j} has length {v.shape[0]}; expected {length} "
                    f"(the length of partition {parts[0]}'s update)"
                )
        out = np.zeros(length, dtype=np.float64)
        for c, v in zip(self.encoding_coefficients(i), vectors, strict=True):
            out += c * v
        return out

    # ------------------------------------------------------------------ server side
    def is_decodable(self, received: Iterable[int]) -> bool:
        """Whether the replies of ``received`` determine the weighted sum exactly."""
        return self.decoding(received).exact

    def decoding(self, received: Iterable[int]) -> Decoding:
        """The optimal (least-squares) decoding for ``received``, with diagnostics."""
        order = self._check_received(received)
        return self._decode_set(frozenset(order))

    def block_of(self, i: int) -> int:
        """Index into :attr:`blocks` of client ``i``'s block (-1: it holds nothing)."""
        return int(self._block_of_client[self._check_client(i)])

    def necessary_counts(self) -> list[tuple[tuple[int, ...], int]]:
        """``(clients, count)`` pairs: a received set holding fewer than ``count`` of some
        ``clients`` provably does not decode, so :class:`DecodabilityTracker` skips the solve.
        None here (the tracker's own coverage and span tests apply to ``B``-combinations);
        codes whose replies are not rows of ``B`` may say."""
        return []

    def tracker(self) -> DecodabilityTracker:
        """A :class:`DecodabilityTracker` for replies arriving one at a time."""
        return DecodabilityTracker(self)

    # ------------------------------------------------------------------ chunks
    @property
    def chunks(self) -> int:
        """How many chunks of the update a reply mixes: 1, the reply is the whole combination
        ``sum_j B[i, j] w_j u_j`` (codes with ``m`` chunks send ``1/m`` of it)."""
        return 1

    def chunk_coefficients(self, i: int) -> np.ndarray:
        """Client ``i``'s reply as a combination of the ``chunks`` chunks of its coded sum:
        ``(1.0,)`` here, one chunk that is the whole sum (row ``i`` of ``B``)."""
        self._check_client(i)
        return np.ones(1)

    def chunk_decoder(self, decoding: Decoding) -> np.ndarray:
        """``decoding`` as a ``(chunks, n)`` float64 matrix: row ``u`` applied to the replies
        recovers chunk ``u`` of the weighted sum (one row here: the decoding vector)."""
        return np.asarray(decoding.coefficients, dtype=np.float64).reshape(self.chunks, self.n)

    def block_decodes(self, b: int, rows: frozenset[int]) -> bool:
        """Whether block ``b``'s received ``rows`` recover its partitions' weighted sum
        (weighted least squares on the block, cached per ``rows``)."""
        parts = list(self._blocks[b][1])
        coeffs = self._solve_block(b, rows)
        if not coeffs.size:
            return False
        alpha = coeffs @ self._B[np.ix_(sorted(rows), parts)]
        return bool(np.max(np.abs(alpha - 1.0)) <= EXACT_TOL)

    def decoding_vector(self, received: Iterable[int]) -> np.ndarray:
        """``a`` with ``a @ B[received] == 1``, aligned with the order of ``received``.

        Raises:
            NotDecodableError: if no such ``a`` exists.
        """
        order = self._check_received(received)
        dec = self._decode_set(frozenset(order))
        if not dec.exact:
            raise NotDecodableError(
                f"received set of {len(order)} clients does not decode exactly "
                f"(best decoding error {dec.error:.3g}); code {self.name} with n={self.n}, "
                f"s={self.s}"
            )
        return dec.coefficients[list(order)].copy()

    def sparse_decoding(self, received: Iterable[int]) -> Decoding:
        """An exact decoding that reads as few of the received replies as the code allows.

        Any ``a`` with ``a @ B[F] == w`` recovers the sum; the minimum-norm one of
        :meth:`decoding` spreads weight over every replica (an FRC group's ``s + 1`` identical
        replies each get ``1/(s+1)``), so a server would read every reply. Here, block by block,
        QR with column pivoting of ``B[F_b]^T`` picks ``rank(B[F_b])`` received rows spanning
        the same row space, and the block is solved on those rows only: an FRC group is read
        once (Tandon et al. 2017, Sec. 3: one reply per group decodes), a cyclic block
        ``n - s`` times. Blocks with more than 256 received rows, or whose reduced solve is not
        exact to ``EXACT_TOL``, keep the minimum-norm solution. Sets that do not decode
        exactly get :meth:`decoding` unchanged (least squares is what an approximate round
        needs). ``coefficients`` is zero on the rows not read; ``received`` is still ``F``.
        """
        order = self._check_received(received)
        got = frozenset(order)
        cached = self._sparse_cache.get(got)
        if cached is not None:
            return cached
        dense = self._decode_set(got)
        if not dense.exact or np.ndim(dense.coefficients) != 1:
            self._sparse_cache.put(got, dense)
            return dense
        a = np.array(dense.coefficients, dtype=np.float64)
        for clients, parts in self._blocks:
            rows = sorted(got.intersection(clients))
            if len(rows) < 2 or len(rows) > 256:
                continue
            w = self._weights[list(parts)]
            M = self._B[np.ix_(rows, parts)] * w  # rows x parts
            _, R, piv = scipy.linalg.qr(M.T, mode="economic", pivoting=True)
            diag = np.abs(np.diag(R))
            rank = int(np.sum(diag > diag[0] * 1e-10)) if diag.size and diag[0] > 0 else 0
            if rank == 0 or rank >= len(rows):
                continue
            chosen = [rows[i] for i in sorted(piv[:rank])]
            coeffs = self._least_squares(M[[rows.index(c) for c in chosen]].T, w)
            if np.max(np.abs(coeffs @ M[[rows.index(c) for c in chosen]] - w)) > EXACT_TOL:
                continue
            a[rows] = 0.0
            a[chosen] = coeffs
        dec = self.decoding_from(got, a)
        if not dec.exact:  # numerically worse than the dense solution: keep that one
            dec = dense
        self._sparse_cache.put(got, dec)
        return dec

    def approximate_decoding_vector(self, received: Iterable[int]) -> np.ndarray:
        """The decoding vector minimising :meth:`decoding_error`; never raises on valid input.

        Aligned with the order of ``received``; the empty set gives an empty vector.
        """
        order = self._check_received(received)
        dec = self._decode_set(frozenset(order))
        return dec.coefficients[list(order)].copy()

    def decoding_error(self, received: Iterable[int], a: Iterable[float] | None = None) -> float:
        """``||w * (B_F^T a - 1)||^2 / ||w||^2`` (``||B_F^T a - 1||^2 / k`` for unit weights).

        ``a`` (aligned with ``received``) defaults to the optimal decoding vector.
        """
        order = self._check_received(received)
        if a is None:
            return self._decode_set(frozenset(order)).error
        a = np.asarray(a, dtype=np.float64)
        if a.shape != (len(order),):
            raise ValueError(f"a has shape {a.shape}; expected ({len(order)},) for received")
        alpha = a @ self._B[list(order)] if order else np.zeros(self.k)
        return self._weighted_error(alpha)

    def condition_number(self, received: Iterable[int]) -> float:
        """Worst condition number over blocks of ``B_F`` restricted to its nonzero singular values.

        A diagnostic of how much decoding amplifies rounding and noise (``inf`` when a block has
        no received client but holds data).
        """
        order = self._check_received(received)
        got = frozenset(order)
        worst = 1.0
        for clients, parts in self._blocks:
            rows = sorted(got.intersection(clients))
            if not parts:
                continue
            if not rows:
                return float("inf")
            sv = np.linalg.svd(self._B[np.ix_(rows, parts)], compute_uv=False)
            sv = sv[sv > sv[0] * 1e-13]
            worst = max(worst, float(sv[0] / sv[-1]))
        return worst

    def decode(
        self,
        replies: Mapping[int, np.ndarray],
        *,
        approximate: bool | None = None,
        length: int | None = None,
    ) -> np.ndarray:
        """Recover ``sum_j w_j u_j`` from ``{client: reply}``.

        Args:
            replies: each received client's reply (1-D arrays of one length).
            approximate: if ``True``, fall back to the least-squares decoding when the set is not
                exactly decodable instead of raising. Defaults to ``not is_exact``: approximate
                codes (``bgc``, ``expander``, ``ignore-stragglers``) decode whatever arrived.
            length: expected update length; only needed to return zeros when nothing arrived.

        Raises:
            NotDecodableError: the set does not decode exactly and ``approximate`` is ``False``,
                or no reply arrived and ``length`` is unknown.
        """
        clients, vectors = self._check_replies(replies)
        if approximate is None:
            approximate = not self.is_exact
        if not clients and approximate and length is not None:
            return np.zeros(int(length))
        if not clients:
            raise NotDecodableError("no replies to decode (pass length= to get zeros)")
        if length is not None and vectors[0].shape[0] != length:
            raise ValueError(f"replies have length {vectors[0].shape[0]}; expected {length}")
        dec = self._decode_set(frozenset(clients))
        if not dec.exact and not approximate:
            raise NotDecodableError(
                f"replies from {len(clients)} clients do not decode exactly "
                f"(best decoding error {dec.error:.3g}); pass approximate=True to accept it"
            )
        return self._combine(dec.coefficients[clients], vectors)

    # ------------------------------------------------------------------ internals
    @staticmethod
    def _combine(coefficients: np.ndarray, vectors: list[np.ndarray]) -> np.ndarray:
        length = vectors[0].shape[0] if vectors else 0
        out = np.zeros(length, dtype=np.float64)
        for c, v in zip(coefficients, vectors, strict=True):
            if c != 0.0:
                out += c * v
        return out

    _check_weights = staticmethod(check_weights)
    _check_vector = staticmethod(check_vector)
    _least_squares = staticmethod(least_squares)

    def _check_client(self, i: Any) -> int:
        if type(i) is int and 0 <= i < self.n:  # the usual case, without the ABC check
            return i
        if isinstance(i, bool) or not isinstance(i, Integral):
            raise ValueError(f"client index {i!r} must be an integer in [0, {self.n})")
        i = int(i)
        if not 0 <= i < self.n:
            raise ValueError(f"client index {i} is out of range; expected 0 <= i < n={self.n}")
        return i

    def _check_received(self, received: Iterable[int]) -> tuple[int, ...]:
        if isinstance(received, (str, bytes)) or not isinstance(received, Iterable):
            raise ValueError(f"received={received!r} must be an iterable of client indices")
        order = tuple(self._check_client(i) for i in received)
        if len(set(order)) != len(order):
            dup = next(i for i in order if order.count(i) > 1)
            raise ValueError(f"client {dup} appears more than once in received")
        return order

    def _check_replies(
        self, replies: Mapping[int, np.ndarray]
    ) -> tuple[list[int], list[np.ndarray]]:
        if not isinstance(replies, Mapping):
            raise ValueError(f"replies must be a mapping client -> array; got {type(replies)}")
        clients, vectors = [], []
        length = None
        for i, v in replies.items():
            i = self._check_client(i)
            arr = self._check_vector(v, f"reply of client {i}")
            if length is None:
                length = arr.shape[0]
            elif arr.shape[0] != length:
                raise ValueError(
                    f"reply of client {i} has length {arr.shape[0]}; expected {length} "
                    "like the other replies"
                )
            clients.append(i)
            vectors.append(arr)
        return clients, vectors

    def _find_blocks(self) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
        n, k = self._B.shape
        rows, cols = np.nonzero(self._B)
        graph = csr_matrix(
            (np.ones(rows.size), (rows, n + cols)), shape=(n + k, n + k)
        )
        _, labels = connected_components(graph, directed=False)
        blocks: dict[int, tuple[list[int], list[int]]] = {}
        for node, lab in enumerate(labels):
            entry = blocks.setdefault(int(lab), ([], []))
            if node < n:
                entry[0].append(node)
            else:
                entry[1].append(node - n)
        # Partitions held by nobody form blocks without clients; they are handled as orphans.
        return [(tuple(c), tuple(p)) for c, p in blocks.values() if c and p]

    def _solve_block(self, b: int, got: frozenset[int]) -> np.ndarray:
        """Weighted least squares for block ``b``: coefficients aligned with ``sorted(got)``."""
        cached = self._caches[b].get(got)
        if cached is not None:
            return cached
        parts = self._blocks[b][1]
        rows = sorted(got)
        if not rows:
            a = np.zeros(0)
        else:
            w = self._weights[list(parts)]
            M = self._B[np.ix_(rows, parts)] * w  # scale columns by the weights
            mm = float(M[0].dot(M[0])) if len(rows) == 1 else 0.0
            if 0.0 < mm < math.inf:  # one column: the least-squares solution m.w / m.m in
                # closed form (an FRC-shaped group's first reply: no LAPACK call per group)
                a = np.array([float(M[0].dot(w)) / mm])
            else:
                a = self._least_squares(M.T, w)
        a.setflags(write=False)
        self._caches[b].put(got, a)
        return a

    def _weighted_error(self, alpha: np.ndarray) -> float:
        w = self._weights
        return float(np.sum((w * (alpha - 1.0)) ** 2) / np.sum(w**2))

    def _decode_set(self, got: frozenset[int]) -> Decoding:
        dec = self._set_cache.get(got)
        if dec is None:
            dec = self._compute_decoding(got)
            self._set_cache.put(got, dec)
        return dec

    def _compute_decoding(self, got: frozenset[int]) -> Decoding:
        """Least squares block by block; subclasses with closed forms override this."""
        a = np.zeros(self.n)
        for b, (clients, _) in enumerate(self._blocks):
            sub = got.intersection(clients)
            coeffs = self._solve_block(b, frozenset(sub))
            if coeffs.size:
                a[sorted(sub)] = coeffs
        return self.decoding_from(got, a)

    def decoding_from(self, got: frozenset[int], a: np.ndarray) -> Decoding:
        received = tuple(sorted(got))
        alpha = a[list(received)] @ self._B[list(received)] if received else np.zeros(self.k)
        exact = bool(np.max(np.abs(alpha - 1.0)) <= EXACT_TOL)
        a.setflags(write=False)
        alpha.setflags(write=False)
        return Decoding(received, a, exact, self._weighted_error(alpha), alpha)
