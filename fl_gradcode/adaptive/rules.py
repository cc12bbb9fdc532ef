"""When a code's replies decode, as group thresholds: the fast path of the round-time
simulation (a round that needs ``t`` of ``m`` replies of a group lasts their ``t``-th order
statistic: David, Nagaraja, "Order Statistics", 3rd ed., Wiley 2003).

The codes: Tandon, Lei, Dimakis, Karampatziakis, ICML 2017, https://arxiv.org/abs/1612.03301
(fractional repetition, cyclic) and Halbawi, Azizan, Salehi, Hassibi, ISIT 2018,
https://arxiv.org/abs/1706.05436 (grouped Reed-Solomon).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..codes import FractionalRepetitionCode, GradientCode, IgnoreStragglers, UncodedCode

__all__ = ["DecodeRule", "code_loads", "decode_rule"]

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

