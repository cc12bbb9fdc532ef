"""Nested data placement: place once, then switch the straggler tolerance ``s`` every round.

:class:`NestedPlacement` ``(n, s_max)`` gives every client a fixed set of partitions (its own
partition ``i`` included) and, for EVERY ``0 <= s <= s_max``, an exact :class:`GradientCode`
whose support (``assignment(i)``) lies inside client ``i``'s holdings. The server can therefore
change ``s`` between rounds without moving data; ``s = 0`` is uncoded (client ``i`` sends its
own partition ``i``).

What is possible (and what is not)
----------------------------------
A stable exact code for ``s`` decomposes into independent groups (FRC groups of Tandon et al.
with a Reed-Solomon code of Halbawi et al. inside, as in ``grouped-rs``): a group of ``m``
clients that must survive ``s`` stragglers with load ``L`` needs ``t = m - L + 1`` replies, and
its worst-case error amplification ``(2(m-1))^(t-1)/(t-1)!`` (:func:`rs_amplification`) only
stays small for small ``t``. Two facts follow.

* **Storage exactly ``s_max + 1`` cannot be stable for every s** (with any construction known
  here). With storage ``s_max + 1`` the code for ``s_max`` uses the whole placement (each
  partition needs ``s_max + 1`` holders); for ``n = 256, s_max = 64`` its blocks hold at least
  65 clients each, so at most 3 blocks share 256 clients and some block needs ``t >= 22``
  replies: amplification 1.1e27 with real RS nodes (``grouped-rs`` avoids it only by using
  ``k < n`` partitions). And with a window placement (client ``i`` holds ``s_max + 1``
  consecutive partitions around ``i``) every exact code with ``s > s_max/2`` is a single
  connected block on all ``n`` clients (two neighbouring partitions must share a holder:
  ``2(s+1) > s_max + 2``), i.e. a CRC-like code with large decoding coefficients.
* **Windows nest for ``s <= s_max/2``.** With the centred window ``i - h, ..., i - h + s_max``
  (``h = floor(s_max/2)``) and groups of consecutive clients owning the same consecutive
  partitions, a client only needs partitions within distance ``s`` of itself if the group's
  RS support is *banded*: client ``p`` of an ``m = s + t`` group misses the ``t - 1``
  partitions given by the reflected anti-diagonals of :func:`reflected_misses`, which cover
  every pair with ``|p - x| > s``. Halbawi et al.'s polynomial construction works for any such
  pattern (partition ``x`` missing at ``N_x``, ``q_x = prod_{v in N_x} (z - z_v)``), so the
  stability bound is unchanged and every client computes exactly ``s + 1`` partitions.

The design
----------
``layout="hybrid"`` (default) holds the centred window (``s_max + 1`` partitions) **plus** the
client's super-block: the ``n`` clients are cut into ``floor(n/(s_max+1))`` arcs
(``grouped-rs``'s groups for ``s_max``) and each client also holds its whole arc. For each
``s`` the placement builds the banded window code (optimal load ``s + 1``) and the block code
(groups inside super-blocks, every member holds the whole group; a group whose ``t`` would
exceed the amplification budget raises its load until it fits: load ``L = m - t + 1 >= s+1``,
tolerance ``L - 1 >= s``) and returns the stable one with the smaller largest load. Every
``s <= s_max`` is then stable. Storage is at most ``D + ceil(s_max/2)`` (``D`` = largest
super-block) and, checked for every ``n <= 256`` and ``2 <= s_max <= n/4``, at most
``2 s_max + 1``: at n = 256 it is 118 partitions per client for ``s_max = 64`` (1.8x
``s_max + 1``), 53 for ``s_max = 32``. Load at n = 256, ``s_max = 64``: ``s + 1`` (optimal)
for ``s <= 31``; 40 for ``s = 32..39``, ``s + 1`` for ``s = 40, 41``; 83 for ``s = 42`` and
84 for ``s = 43..64`` (one and the same code, tolerance 82: 1.29x the optimum at ``s = 64``,
1.95x at ``s = 43``). The amplification budget is ``grouped-rs``'s 1e5.

Heterogeneity-aware variant (:meth:`NestedPlacement.code_excluding`): with the hybrid layout
every client holds its whole super-block, so for any set of excluded (persistently slow)
clients the others of each super-block can share its partitions in groups with a balanced
Halbawi et al. code (:func:`spread_misses`), still exact from any ``n - s`` replies.

``layout="window"`` holds exactly ``s_max + 1`` partitions (the centred window). Codes with
``s <= s_max/2`` are the banded codes above (stable up to the amplification budget); for
``s > s_max/2`` it returns Tandon et al.'s randomized CRC with support inside the window
(exact in exact arithmetic, :meth:`NestedPlacement.is_stable` ``False``; screened over
``crc_draws`` draws). :attr:`NestedPlacement.stable_values` lists the stable ``s``.

Measured (n = 256, ``s_max = 64``, weights != 1, 16 random straggler sets plus all 256
contiguous bursts per s): hybrid, worst relative decoding error 3.0e-12 (s = 39; <= 1e-12 for
most s), decoding coefficients <= 4.4e2, and 1.8e-5 with float32-rounded replies. The window
layout's CRC fallback is accurate in float64 too (1.7e-11 at s = 40) but its coefficients
reach 6.8e4, so float32 replies decode to 1.3e-3 relative error: that is why it is flagged.

References:
    Tandon, Lei, Dimakis, Karampatziakis, "Gradient Coding: Avoiding Stragglers in Distributed
    Learning", ICML 2017, https://arxiv.org/abs/1612.03301 (FRC groups, cyclic repetition).
    Halbawi, Azizan, Salehi, Hassibi, "Improving Distributed Gradient Descent Using
    Reed-Solomon Codes", ISIT 2018, https://arxiv.org/abs/1706.05436 (the polynomial code
    inside a group, here with banded instead of cyclic supports).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from .base import GradientCode, check_n_s
from .checks import as_int
from .repetition import CyclicRepetitionCode
from .stable import DEFAULT_MAX_AMPLIFICATION, rs_amplification

__all__ = [
    "CodeGroup",
    "NestedGroupCode",
    "NestedPlacement",
    "banded_rs_block",
    "cyclic_rs_block",
    "nested_code",
    "reflected_misses",
    "spread_misses",
]

LAYOUTS = ("hybrid", "window")


def reflected_misses(m: int, t: int) -> np.ndarray:
    """Which partitions each client of an ``m``-client group does NOT hold (boolean ``m x m``).

    Each row and each column has exactly ``t - 1`` ``True`` entries, and every pair with
    ``|p - x| > s = m - t`` is among them (valid for ``1 <= t <= s + 1``, i.e. ``m <= 2s+1``).
    The misses are ``t - 1`` anti-diagonals ``p + x = m - 1 + d`` (``d = ±1, ±3, ...`` for
    even ``t - 1``; ``0, ±2, ±4, ...`` for odd) whose column index is reflected back into
    ``[0, m)`` at the borders (``x -> -1 - x`` below 0, ``x -> 2m - 1 - x`` above ``m - 1``).

    The pattern is checked on every call (checked exhaustively for ``s <= 130``, every
    ``t <= s + 1``, which covers ``n <= 256``; the tests draw ``s <= 80``).

    Raises:
        ValueError: ``t`` outside ``[1, s + 1]`` or the pattern check fails.
    """
    s = m - t
    if not 1 <= t <= s + 1:
        raise ValueError(f"need 1 <= t <= s + 1 (m <= 2s + 1); got m={m}, t={t}")
    k = t - 1
    if k % 2:
        offsets = [0] + [sign * 2 * i for i in range(1, k // 2 + 1) for sign in (1, -1)]
    else:
        offsets = [sign * (2 * i - 1) for i in range(1, k // 2 + 1) for sign in (1, -1)]
    p = np.arange(m)
    counts = np.zeros((m, m), dtype=np.int64)
    for d in offsets:
        x = m - 1 + d - p
        x = np.where(x < 0, -1 - x, np.where(x >= m, 2 * m - 1 - x, x))
        counts[p, x] += 1
    pp, xx = np.indices((m, m))
    ok = (
        counts.max(initial=0) <= 1
        and np.all(counts.sum(axis=0) == k)
        and np.all(counts.sum(axis=1) == k)
        and np.all(counts[np.abs(pp - xx) > s] == 1)
    )
    if not ok:  # pragma: no cover - checked for every s <= 130 and t <= s + 1
        raise ValueError(f"reflected miss pattern failed for m={m}, t={t}")
    return counts.astype(bool)


def _rs_from_misses(miss: np.ndarray) -> np.ndarray:
    """Halbawi et al.'s group code for a miss pattern: ``B[p, x] = prod_{v in N_x} (z_p - z_v)``
    with equispaced nodes ``z`` on ``[-1, 1]`` and ``N_x`` the clients missing partition ``x``
    (``m`` clients, any number of partitions: every ``q_x`` with ``|N_x| = t - 1`` is monic of
    degree ``t - 1``, so any ``t`` replies give the leading coefficient ``sum_x u_x``)."""
    m, k = miss.shape
    z = np.linspace(-1.0, 1.0, m) if m > 1 else np.zeros(1)
    diff = z[:, None] - z[None, :]  # diff[p, v] = z_p - z_v
    B = np.empty((m, k))
    for x in range(k):
        B[:, x] = np.prod(diff[:, miss[:, x]], axis=1)
    return B


def banded_rs_block(m: int, t: int) -> np.ndarray:
    """``m x m`` RS group code (Halbawi et al.) decodable from any ``t`` rows, banded support.

    Client ``p`` holds partition ``x`` unless ``reflected_misses(m, t)[p, x]``; so it holds
    exactly ``s + 1 = m - t + 1`` partitions, all with ``|p - x| <= s``. With nodes
    ``z = linspace(-1, 1, m)`` and ``N_x`` the clients missing ``x``,
    ``B[p, x] = prod_{v in N_x} (z_p - z_v)``: client ``p`` sends ``P(z_p)`` for the
    degree-``t-1`` polynomial ``P = sum_x q_x u_x`` whose leading coefficient is ``sum_x u_x``,
    so any ``t`` evaluations determine it.
    """
    if t == 1:
        return np.ones((m, m))
    return _rs_from_misses(reflected_misses(m, t))


def cyclic_rs_block(s: int, t: int) -> np.ndarray:
    """:func:`fl_gradcode.codes.stable.rs_block` (cyclic supports ``p, ..., p+s mod m``),
    vectorised: partition ``j`` is missing at the clients ``j+1, ..., j+t-1 mod m``."""
    m = s + t
    if t == 1:
        return np.ones((m, m))
    gap = (np.arange(m)[:, None] - np.arange(m)[None, :]) % m
    return _rs_from_misses((gap >= 1) & (gap <= t - 1))


@dataclass(frozen=True)
class CodeGroup:
    """One independent group of a :class:`NestedGroupCode`.

    Attributes:
        clients: the group's clients (consecutive modulo ``n``).
        partitions: the group's partitions.
        tolerance: stragglers inside the group it survives (``load - 1 >= s``).
        threshold: replies of distinct members that always decode it (``t``).
        kind: ``"band"`` (banded RS inside windows) or ``"block"`` (RS inside a super-block).
    """

    clients: tuple[int, ...]
    partitions: tuple[int, ...]
    tolerance: int
    threshold: int
    kind: str

    @property
    def amplification(self) -> float:
        return rs_amplification(len(self.clients), self.threshold)


class NestedGroupCode(GradientCode):
    """An exact code made of independent RS groups (see the module docstring).

    Every group with ``m`` members and threshold ``t`` decodes from ANY ``t`` of its members,
    and ``m - t >= s``: any ``n - s`` replies decode. Fewer than ``t`` replies in a group do not
    decode it (checked on every subset at n <= 12), so the count rule is exact;
    :meth:`is_decodable` uses it first (no linear algebra) and asks least squares only when
    some group is short.
    """

    name = "nested"

    def __init__(
        self,
        n: int,
        s: int,
        groups: list[CodeGroup],
        blocks: list[np.ndarray],
        *,
        weights: Iterable[float] | None = None,
    ) -> None:
        B = np.zeros((n, n))
        for g, block in zip(groups, blocks, strict=True):
            B[np.ix_(g.clients, g.partitions)] = block
        super().__init__(B, s, is_exact=True, weights=weights)
        self.groups = list(groups)
        self._group_members = [np.array(g.clients) for g in groups]
        self._thresholds = np.array([g.threshold for g in groups])

    @property
    def amplification(self) -> float:
        """Worst-case error amplification over groups and ALL straggler patterns."""
        return max(g.amplification for g in self.groups)

    @property
    def tolerance(self) -> int:
        """Stragglers it actually survives (``>= s``; larger where a group raised its load)."""
        return min(g.tolerance for g in self.groups)

    @property
    def decode_groups(self) -> list[tuple[tuple[int, ...], int]]:
        """``(clients, threshold)`` per group: the round ends when every group has its
        ``threshold`` replies (used by :mod:`fl_gradcode.adaptive`)."""
        return [(g.clients, g.threshold) for g in self.groups]

    def is_decodable(self, received: Iterable[int]) -> bool:
        """Every group has its threshold of replies (else: the least-squares check)."""
        order = self._check_received(received)
        got = np.zeros(self.n, dtype=bool)
        got[list(order)] = True
        if all(
            np.count_nonzero(got[members]) >= t
            for members, t in zip(self._group_members, self._thresholds, strict=True)
        ):
            return True
        return self.decoding(order).exact


def spread_misses(m: int, k: int, t: int) -> np.ndarray:
    """``m x k`` miss pattern: partition ``x`` is missed by the ``t - 1`` clients
    ``x (t-1), ..., x (t-1) + t - 2`` (mod ``m``), so every column has exactly ``t - 1``
    misses and the clients' loads ``k - misses`` differ by at most one.

    Raises:
        ValueError: ``t`` outside ``[1, m]``.
    """
    if not 1 <= t <= m:
        raise ValueError(f"need 1 <= t <= m; got m={m}, t={t}")
    miss = np.zeros((m, k), dtype=bool)
    rows = (np.arange(k)[:, None] * (t - 1) + np.arange(t - 1)[None, :]) % m
    miss[rows, np.arange(k)[:, None]] = True
    return miss


def _spread(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` near-equal positive sizes, larger ones first."""
    base, extra = divmod(total, parts)
    return [base + (1 if g < extra else 0) for g in range(parts)]


def _largest_threshold(m: int, t_max: int, max_amplification: float) -> int:
    t = 1
    while t < t_max and rs_amplification(m, t + 1) <= max_amplification:
        t += 1
    return t


def _band_code(n: int, s: int, weights, max_amplification: float) -> tuple[NestedGroupCode, bool]:
    """Banded groups of consecutive clients owning the same partitions (load exactly s + 1).

    ``floor(n/(s+1))`` groups of ``m <= 2s + 1`` clients (spare clients spread over them);
    client ``p`` only computes partitions ``x`` with ``|x - p| <= s``.
    """
    groups, blocks, start = [], [], 0
    for m in _spread(n, n // (s + 1)):
        members = tuple(range(start, start + m))
        groups.append(CodeGroup(members, members, s, m - s, "band"))
        blocks.append(banded_rs_block(m, m - s))
        start += m
    code = NestedGroupCode(n, s, groups, blocks, weights=weights)
    return code, code.amplification <= max_amplification


def _superblock_groups(
    superblocks: list[tuple[int, ...]], s: int, max_amplification: float,
    excluded: frozenset[int] = frozenset(),
):
    """``(members, partitions, t)`` of every group inside the super-blocks: each super-block's
    ``a`` clients not ``excluded`` cut into ``floor(a / (s + 1))`` near-equal groups of
    ``s + 1 <= m <= 2s + 1`` members, its partitions into as many near-equal shares (with
    nobody excluded a group owns its members' own partitions), ``t`` the largest threshold
    ``<= m - s`` within the amplification budget (the load raised where it must be).

    Raises:
        ValueError: a super-block with fewer than ``s + 1`` active clients.
    """
    for sb in superblocks:
        active = tuple(c for c in sb if c not in excluded)
        if len(active) < s + 1:
            raise ValueError(
                f"super-block {sb[0]}..{sb[-1]} has {len(active)} active clients; "
                f"tolerance s={s} needs at least {s + 1}"
            )
        count = len(active) // (s + 1)
        start = pstart = 0
        for m, k in zip(_spread(len(active), count), _spread(len(sb), count), strict=True):
            yield (active[start : start + m], sb[pstart : pstart + k],
                   _largest_threshold(m, m - s, max_amplification))
            start, pstart = start + m, pstart + k


def _block_code(
    n: int, s: int, superblocks: list[tuple[int, ...]], weights, max_amplification: float
) -> tuple[NestedGroupCode, bool]:
    """Groups inside super-blocks (every member holds the whole group); load raised if needed."""
    groups, blocks = [], []
    for members, _, t in _superblock_groups(superblocks, s, max_amplification):
        groups.append(CodeGroup(members, members, len(members) - t, t, "block"))
        blocks.append(cyclic_rs_block(len(members) - t, t))
    code = NestedGroupCode(n, s, groups, blocks, weights=weights)
    return code, code.amplification <= max_amplification


class NestedPlacement:
    """Data placed once for tolerance up to ``s_max``; an exact code for every ``s <= s_max``.

    Args:
        n: number of clients (= partitions; partition ``i`` is client ``i``'s own data).
        s_max: the largest tolerance the server may pick (``0 <= s_max < n``).
        seed: seed of the random CRC fallback (``layout="window"``, ``s > s_max/2`` only).
        layout: ``"hybrid"`` (default: window plus super-block, every s stable) or
            ``"window"`` (exactly ``s_max + 1`` partitions per client; stable for
            ``s <= s_max/2``). See the module docstring for why and for the numbers.
        max_amplification: stability budget of one group (default 1e5, as ``grouped-rs``).
        weights: partition weights passed to every code.
        crc_draws: draws screened for the CRC fallback.

    Example:
        >>> p = NestedPlacement(12, 4)   # window 3..7 plus super-block 0..5
        >>> p.holdings(5)
        (0, 1, 2, 3, 4, 5, 6, 7)
        >>> code = p.code(2)
        >>> set(code.assignment(5)) <= set(p.holdings(5)), code.load
        (True, 3)
        >>> p.code(0).assignment(5)
        (5,)
    """

    def __init__(
        self,
        n: int,
        s_max: int,
        seed: int = 0,
        *,
        layout: str = "hybrid",
        max_amplification: float = DEFAULT_MAX_AMPLIFICATION,
        weights: Iterable[float] | None = None,
        crc_draws: int = 1,
    ) -> None:
        n, _ = check_n_s(n, 0)
        s_max = as_int(s_max, "s_max")
        if not 0 <= s_max < n:
            raise ValueError(f"s_max={s_max} must be >= 0 and < n={n}")
        if layout not in LAYOUTS:
            raise ValueError(f"layout={layout!r}; expected one of {LAYOUTS}")
        if not max_amplification >= 1:
            raise ValueError(f"max_amplification={max_amplification!r} must be >= 1")
        self.n, self.s_max, self.seed, self.layout = n, s_max, int(seed), layout
        self.max_amplification = float(max_amplification)
        self.weights = None if weights is None else np.asarray(weights, dtype=np.float64)
        self.crc_draws = int(crc_draws)
        self.half = s_max // 2  # window reaches h back and s_max - h forward
        sizes = _spread(n, n // (s_max + 1))
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        self.superblocks = [
            tuple(range(int(a), int(a) + m)) for a, m in zip(starts, sizes, strict=True)
        ]
        self._superblock_of = np.repeat(np.arange(len(sizes)), sizes)
        hold = np.zeros((n, n), dtype=bool)
        for i in range(n):
            hold[i, (i - self.half + np.arange(s_max + 1)) % n] = True
            if layout == "hybrid":
                hold[i, list(self.superblocks[self._superblock_of[i]])] = True
        hold.setflags(write=False)
        self._hold = hold
        self._holdings = [tuple(int(j) for j in np.flatnonzero(hold[i])) for i in range(n)]
        self._codes: dict[int, tuple[GradientCode, bool]] = {}
        self._excluding: dict[tuple[int, frozenset[int]], NestedGroupCode] = {}

    # ---------------------------------------------------------------- placement
    def holdings(self, i: int) -> tuple[int, ...]:
        """The partitions client ``i`` stores (sorted); ``i`` itself is always among them."""
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < self.n:
            raise ValueError(f"client index {i!r} must be an integer in [0, {self.n})")
        return self._holdings[int(i)]

    @property
    def holding_matrix(self) -> np.ndarray:
        """Boolean ``n x n``: ``[i, j]`` iff client ``i`` stores partition ``j`` (read-only)."""
        return self._hold

    @property
    def storage(self) -> int:
        """The largest number of partitions any client stores."""
        return int(self._hold.sum(axis=1).max())

    # ---------------------------------------------------------------- codes
    def code(self, s: int) -> GradientCode:
        """The exact code for tolerance ``s`` (built once, then cached)."""
        return self._entry(s)[0]

    def is_stable(self, s: int) -> bool:
        """Whether :meth:`code` ``(s)`` has worst-case amplification within the budget."""
        return self._entry(s)[1]

    @property
    def stable_values(self) -> tuple[int, ...]:
        """Every ``s <= s_max`` whose code is stable (all of them with ``layout="hybrid"``)."""
        return tuple(s for s in range(self.s_max + 1) if self.is_stable(s))

    def codes(self) -> dict[int, GradientCode]:
        """``{s: code(s)}`` for every ``0 <= s <= s_max``."""
        return {s: self.code(s) for s in range(self.s_max + 1)}

    def code_excluding(self, s: int, excluded: Iterable[int]) -> NestedGroupCode:
        """An exact code for tolerance ``s`` in which the ``excluded`` clients compute nothing.

        Heterogeneity-aware assignment on the same placement (Wang, Cheng, Ramamoorthy,
        ICDCS 2019, https://arxiv.org/abs/1901.09339, give slow workers less work; here a
        persistently slow client gets none). Every super-block's partitions are shared by its
        ``a`` clients that are not excluded: they form as many groups as fit,
        ``floor(a / (s + 1))`` of ``s + 1 <= m <= 2s + 1`` members (small groups, small
        thresholds: stable), each owning
        a share of the super-block's partitions (every member holds the whole super-block),
        with Halbawi et al.'s code on a balanced miss pattern (:func:`spread_misses`): any
        ``t = m - s`` members decode their group (``t`` lowered, load raised, where the
        amplification budget requires it, as for the block codes). An excluded client's row
        is zero: any ``n - s`` replies still decode, since the active clients among them miss
        at most ``s``. Loads rise to about ``(s + 1) D / a`` in a super-block of ``D`` clients
        with ``a`` active; a super-block without excluded clients gets the block code's
        ``s + 1``. Needs ``layout="hybrid"`` (the super-blocks) and ``s + 1`` active clients
        in every super-block.

        Raises:
            ValueError: ``layout="window"``, ``s`` out of range, a client index out of range,
                or a super-block with fewer than ``s + 1`` active clients.
        """
        if self.layout != "hybrid":
            raise ValueError(f"code_excluding needs layout='hybrid'; this placement has "
                             f"layout={self.layout!r}")
        self._entry(s)  # validates s
        s = int(s)
        out = set()
        for i in excluded:
            if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < self.n:
                raise ValueError(f"excluded client {i!r} must be an integer in [0, {self.n})")
            out.add(int(i))
        key = (s, frozenset(out))
        cached = self._excluding.get(key)
        if cached is not None:
            return cached
        groups, blocks = [], []
        for members, parts, t in _superblock_groups(
            self.superblocks, s, self.max_amplification, key[1]
        ):
            m, k = len(members), len(parts)
            groups.append(CodeGroup(members, parts, m - t, t, "block"))
            blocks.append(np.ones((m, k)) if t == 1 else _rs_from_misses(spread_misses(m, k, t)))
        code = NestedGroupCode(self.n, s, groups, blocks, weights=self.weights)
        self._check_support(code)
        if len(self._excluding) >= 64:
            self._excluding.pop(next(iter(self._excluding)))
        self._excluding[key] = code
        return code

    def _entry(self, s: int) -> tuple[GradientCode, bool]:
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)):
            raise ValueError(f"s={s!r} must be an integer")
        s = int(s)
        if not 0 <= s <= self.s_max:
            raise ValueError(f"s={s} must satisfy 0 <= s <= s_max={self.s_max}")
        if s not in self._codes:
            self._codes[s] = self._build(s)
        return self._codes[s]

    def _build(self, s: int) -> tuple[GradientCode, bool]:
        options: list[tuple[GradientCode, bool]] = []
        if s <= self.half:
            options.append(_band_code(self.n, s, self.weights, self.max_amplification))
        # The banded code has the optimal load s + 1: only look further when it is unstable.
        if self.layout == "hybrid" and not (options and options[0][1]):
            options.append(
                _block_code(self.n, s, self.superblocks, self.weights, self.max_amplification)
            )
        if options:  # the stable one with the smallest load (else the least unstable)
            pool = [o for o in options if o[1]] or options
            best = min(pool, key=lambda o: (o[0].load, o[0].amplification))
            self._check_support(best[0])
            return best
        # window layout, s > s_max/2: CRC rows shifted so the support sits inside the window
        crc = CyclicRepetitionCode(self.n, s, seed=self.seed, draws=self.crc_draws)
        rows = (np.arange(self.n) - self.half) % self.n  # row i = CRC row i - h
        code = GradientCode(crc.B[rows], s, is_exact=True, weights=self.weights, name="nested-crc")
        self._check_support(code)
        return code, False

    def _check_support(self, code: GradientCode) -> None:
        outside = (code.B != 0) & ~self._hold
        if outside.any():  # pragma: no cover - construction invariant, tested
            i, j = np.argwhere(outside)[0]
            raise AssertionError(f"code(s={code.s}) uses partition {j} outside client {i}")

    def __repr__(self) -> str:
        return (
            f"NestedPlacement(n={self.n}, s_max={self.s_max}, layout={self.layout!r}, "
            f"storage={self.storage})"
        )


def nested_code(
    n: int,
    s: int,
    seed: int = 0,
    *,
    s_max: int | None = None,
    layout: str = "hybrid",
    max_amplification: float = DEFAULT_MAX_AMPLIFICATION,
    weights: Iterable[float] | None = None,
) -> GradientCode:
    """Registry entry ``make_code("nested", n, s, s_max=...)``: ``NestedPlacement(...).code(s)``.

    ``s_max`` defaults to ``s``: a single-tolerance placement, whose code is ``grouped-rs``
    with the spare clients absorbed by a higher load instead of row copies (``k = n``).
    """
    s_max = s if s_max is None else s_max
    if s_max < s:
        raise ValueError(f"s_max={s_max} must be >= s={s}")
    placement = NestedPlacement(
        n, s_max, seed, layout=layout, max_amplification=max_amplification, weights=weights
    )
    return placement.code(s)
