"""A gradient code that is exact for every ``(n, s)`` and numerically stable: grouped Reed-Solomon.

References:
    Tandon, Lei, Dimakis, Karampatziakis, "Gradient Coding: Avoiding Stragglers in Distributed
    Learning", ICML 2017, https://arxiv.org/abs/1612.03301 (fractional repetition groups).
    Halbawi, Azizan, Salehi, Hassibi, "Improving Distributed Gradient Descent Using
    Reed-Solomon Codes", ISIT 2018, https://arxiv.org/abs/1706.05436 (the polynomial code
    used inside a group).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from .amplification import sampled_amplification
from .base import GradientCode, check_n_s

__all__ = [
    "DEFAULT_MAX_AMPLIFICATION",
    "DEFAULT_MAX_LOAD_OVERHEAD",
    "DEFAULT_MAX_RELATIVE_AMPLIFICATION",
    "GroupPlan",
    "GroupedReedSolomonCode",
    "plan_groups",
    "rs_amplification",
    "rs_block",
    "rs_rounding_weight",
]

#: Default bound on the worst-case error amplification of one group (see the class docstring).
DEFAULT_MAX_AMPLIFICATION = 1e5
#: Default bound on the code's worst-case amplification of reply rounding relative to the decoded
#: sum: ``8 * 2**-24 < 5e-7``, so float32 replies decode within 1e-6 of the float64 result.
DEFAULT_MAX_RELATIVE_AMPLIFICATION = 8.0
#: Largest load overhead (load fraction over ``(s+1)/n``) paid to meet the relative budget; it
#: is always met within it for ``s <= n/4`` (at least 3 groups: ``n / (G(s+1)) < 4/3``).
DEFAULT_MAX_LOAD_OVERHEAD = 4.0 / 3.0
#: Above this many ``t``-subsets :func:`rs_rounding_weight` uses its closed-form upper bound.
_MAX_SUBSETS = 200_000


def rs_amplification(m: int, t: int) -> float:
    """Worst-case error amplification of an ``m``-partition RS group that decodes from ``t``.

    With equispaced nodes on ``[-1, 1]`` (spacing ``h = 2/(m-1)``) the decoder reads the leading
    coefficient of a degree ``t-1`` polynomial: ``a_w = 1 / prod_{v != w}(x_w - x_v)``. The sum
    ``sum_w |a_w|`` is largest for ``t`` adjacent nodes, where it equals ``(m-1)^(t-1)/(t-1)!``;
    the encoding entries are products of ``t-1`` node gaps, at most ``2^(t-1)``. Their product
    bounds how much a rounding error in any reply is magnified in the decoded sum.
    """
    if t <= 1:
        return 1.0
    return (2.0 * (m - 1)) ** (t - 1) / math.factorial(t - 1)


def rs_block(s: int, t: int) -> np.ndarray:
    """The ``(s+t) x (s+t)`` RS group code of Halbawi et al. with cyclic supports of size s+1.

    Position ``p`` holds partitions ``p, ..., p+s mod m`` (``m = s + t``); partition ``j`` is
    missing at the ``t-1`` positions ``N_j = {j+1, ..., j+t-1}``, ``q_j(x) = prod_{v in N_j}
    (x - x_v)`` (monic, degree ``t-1``) and ``B[p, j] = q_j(x_p)``. Client ``p`` then sends
    ``P(x_p)`` for ``P = sum_j q_j u_j``, whose leading coefficient is ``sum_j u_j``: any ``t``
    evaluations determine it. ``t = 1`` is a fractional-repetition group (all ones).
    """
    m = s + t
    if t == 1:
        return np.ones((m, m))
    x = np.linspace(-1.0, 1.0, m)
    B = np.zeros((m, m))
    for j in range(m):
        missing = [(j + d) % m for d in range(1, t)]
        for p in range(m):
            B[p, j] = np.prod(x[p] - x[missing])
    return B


@functools.lru_cache(maxsize=1024)
def rs_rounding_weight(s: int, t: int) -> float:
    """``max_S sum_{w in S} |a_w| ||B_w||_1`` over every ``t``-subset ``S`` of the rows of
    :func:`rs_block` ``(s, t)``, ``a`` the decoding of ``S`` (any ``t`` distinct rows decode).

    A rounding error ``e_w`` (``|e_w| <= eps ||B_w||_1 max_j |u_j|``) of reply ``w`` reaches
    the decoded group sum as ``a_w e_w``; this is the group's worst total over every straggler
    pattern that leaves it ``t`` distinct rows. ``a_w = 1 / prod_{v in S, v != w}(x_w - x_v)``
    (the leading coefficient of the interpolating polynomial, Halbawi et al.). Exact by
    enumeration up to 200,000 subsets; beyond, the upper bound ``(m-1)^(t-1)/(t-1)! *
    max_w ||B_w||_1`` (``t`` adjacent equispaced nodes maximise ``sum_w |a_w|``).
    """
    block = rs_block(s, t)
    l1 = np.abs(block).sum(axis=1)
    m = s + t
    if t == 1:
        return float(l1.max())
    if math.comb(m, t) > _MAX_SUBSETS:
        return float((m - 1) ** (t - 1) / math.factorial(t - 1) * l1.max())
    x = np.linspace(-1.0, 1.0, m)
    subsets = np.array(list(itertools.combinations(range(m), t)))
    nodes = x[subsets]
    gaps = nodes[:, :, None] - nodes[:, None, :]
    gaps[:, np.arange(t), np.arange(t)] = 1.0
    a = 1.0 / np.prod(gaps, axis=2)
    return float(np.max(np.sum(np.abs(a) * l1[subsets], axis=1)))


def _relative_amplification(s: int, ts: list[int]) -> float:
    """``sum_g W_g / k`` for groups with thresholds ``ts`` (:func:`rs_rounding_weight`)."""
    weight = {t: rs_rounding_weight(s, t) for t in set(ts)}
    return sum(weight[t] for t in ts) / sum(s + t for t in ts)


def _matrix(n: int, s: int, plans: list[GroupPlan]) -> np.ndarray:
    """The ``n x k`` matrix of ``plans``: group blocks on the diagonal, copies below each."""
    B = np.zeros((n, sum(s + p.t for p in plans)))
    row = col = 0
    for p in plans:
        m = s + p.t
        block = rs_block(s, p.t)
        B[row : row + m, col : col + m] = block
        for c in range(p.copies):
            B[row + m + c, col : col + m] = block[(c * m) // max(p.copies, 1)]
        row += m + p.copies
        col += m
    return B


@dataclass(frozen=True)
class GroupPlan:
    """One group: ``t`` replies decode it, ``copies`` extra clients repeat some of its rows."""

    t: int
    copies: int


def plan_groups(n: int, s: int, max_amplification: float,
                max_relative_amplification: float | None = None,
                max_load_overhead: float = DEFAULT_MAX_LOAD_OVERHEAD) -> list[GroupPlan]:
    """Split ``n`` clients into ``floor(n/(s+1))`` groups that each tolerate ``s`` stragglers.

    Each group needs ``s + t`` distinct rows; the ``r = n mod (s+1)`` spare clients are spread
    over the groups, raising ``t`` (more partitions, lower load) while the group's
    amplification stays within ``max_amplification``; the rest become copies of existing rows.
    With ``max_relative_amplification``, the code's bound ``sum_g W_g / k``
    (:func:`rs_rounding_weight`) must stay within it too: when the plan above exceeds it, the
    thresholds are raised from 1 level by level (group 0 first) only while the bound holds,
    unless that plan's load overhead ``n / k`` exceeds ``max_load_overhead`` (then the plan
    above is kept: its replies need float64).
    """
    groups = n // (s + 1)
    spare = n - groups * (s + 1)
    spares = [spare // groups + (1 if g < spare % groups else 0) for g in range(groups)]
    caps = []
    for r_g in spares:
        t = 1
        while t <= r_g and rs_amplification(s + t + 1, t + 1) <= max_amplification:
            t += 1
        caps.append(t)
    ts = list(caps)
    if (max_relative_amplification is not None
            and _relative_amplification(s, ts) > max_relative_amplification):
        low = [1] * groups
        for level, g in itertools.product(range(2, max(caps) + 1), range(groups)):
            if caps[g] < level:
                continue
            low[g] = level
            if _relative_amplification(s, low) > max_relative_amplification:
                low[g] = level - 1
                break
        if n / sum(s + t for t in low) <= max_load_overhead * (1 + 1e-12):
            ts = low
    return [GroupPlan(t=t, copies=r_g - (t - 1)) for t, r_g in zip(ts, spares, strict=True)]


class GroupedReedSolomonCode(GradientCode):
    """Exact for every ``0 <= s < n`` and numerically stable: FRC groups with RS inside.

    Construction. The ``n`` clients form ``G = floor(n/(s+1))`` groups of consecutive clients;
    group ``g`` owns ``s + t_g`` partitions of its own and uses the Reed-Solomon gradient code of
    Halbawi et al. (:func:`rs_block`, equispaced real nodes): each client computes exactly
    ``s+1`` partitions and any ``t_g`` distinct rows of the group decode the group's sum. The
    ``n mod (s+1)`` clients left over after ``G`` groups of ``s+1`` raise the ``t_g``; when
    that would exceed the stability budget, they repeat existing rows instead (a copy never
    hurts: ``s`` stragglers still leave ``t_g`` distinct rows in every group). With
    ``(s+1) | n`` it is exactly FRC.

    Why it is exact: a group of ``m_g >= s + t_g`` clients keeps at least ``t_g`` distinct rows
    whatever ``s`` clients straggle, and groups decode independently.

    Why it is stable: decoding never solves a system larger than one group, and a group with
    ``t`` needed replies has worst-case amplification
    ``(2(m-1))^(t-1)/(t-1)!`` (:func:`rs_amplification`) over ALL straggler patterns; ``t`` is
    capped so that this stays below ``max_amplification`` (default 1e5, i.e. a worst relative
    error around 1e-11 in float64). Real Vandermonde, random CRC and cyclic-MDS codes instead
    solve one ``(n-s)``-sized system whose conditioning grows exponentially with ``n``.

    Replies in float32. A reply's rounding error reaches the decoded sum multiplied by its
    decoding coefficient; :attr:`relative_amplification` bounds the total relative to the
    decoded sum over ALL straggler patterns (``sum_g W_g / k``, :func:`rs_rounding_weight`).
    ``max_relative_amplification`` (default 8: float32 rounding, ``2**-24``, then stays below
    5e-7 relative) caps it: where the plan above would exceed it, fewer spare clients raise
    ``t`` and more become copies (``k`` drops, :attr:`load_overhead` rises, at most to
    ``n / (G(s+1))``, below 4/3 for ``s <= n/4``). Codes that already fit are unchanged: by
    the bound, or by :func:`~fl_gradcode.codes.sampled_amplification` (seed 0: the measure a
    server used before the bound; e.g. ``n=22, s=5``); so are codes where fitting would cost
    more than ``max_load_overhead`` (default 4/3: only some ``s > n/4``), whose replies then go
    in float64. ``None``: only ``max_amplification`` applies.

    Load. Every client computes ``s+1`` of ``k`` partitions; ``k = n`` (optimal load fraction
    ``(s+1)/n``) whenever the spare clients fit the budgets (always for small ``s``), otherwise
    ``k < n`` and :attr:`load_overhead` reports the ratio to the optimum (at most 2, reached only
    as ``s`` nears ``n/2``).
    """

    name = "grouped-rs"

    def __init__(
        self,
        n: int,
        s: int,
        *,
        max_amplification: float = DEFAULT_MAX_AMPLIFICATION,
        max_relative_amplification: float | None = DEFAULT_MAX_RELATIVE_AMPLIFICATION,
        max_load_overhead: float = DEFAULT_MAX_LOAD_OVERHEAD,
        weights: Iterable[float] | None = None,
    ) -> None:
        n, s = check_n_s(n, s)
        if not max_amplification >= 1:
            raise ValueError(f"max_amplification={max_amplification!r} must be >= 1")
        if max_relative_amplification is not None and not max_relative_amplification >= 1:
            raise ValueError(f"max_relative_amplification={max_relative_amplification!r} must "
                             "be >= 1 (1: every group a fractional-repetition group) or None")
        if not max_load_overhead >= 1:
            raise ValueError(f"max_load_overhead={max_load_overhead!r} must be >= 1 (the "
                             "load fraction over its lower bound (s+1)/n)")
        plans = plan_groups(n, s, max_amplification)
        if max_relative_amplification is not None:
            budgeted = plan_groups(n, s, max_amplification, max_relative_amplification,
                                   max_load_overhead)
            # a plan whose sampled sets already decode within the budget stays as it was
            if budgeted != plans and sampled_amplification(
                    GradientCode(_matrix(n, s, plans), s, is_exact=True)
            ) > max_relative_amplification:
                plans = budgeted
        self.plans = plans
        B = _matrix(n, s, plans)
        super().__init__(B, s, is_exact=True, weights=weights)
        self.max_amplification = float(max_amplification)
        self.max_relative_amplification = (None if max_relative_amplification is None
                                           else float(max_relative_amplification))
        self.max_load_overhead = float(max_load_overhead)

    @property
    def amplification(self) -> float:
        """Worst-case error amplification over all groups and all straggler patterns."""
        return max(rs_amplification(self.s + p.t, p.t) for p in self.plans)

    @property
    def relative_amplification(self) -> float:
        """Worst case over ALL straggler patterns of ``sum_i |a_i| ||B_i||_1 / k`` (``a`` any
        decoding that reads ``t_g`` distinct rows of group ``g``: the sparse decoding), the
        measure :func:`~fl_gradcode.flower.decoder.error_amplification` samples; 1 for FRC."""
        return _relative_amplification(self.s, [p.t for p in self.plans])

    @property
    def rounding_amplification(self) -> float:
        """:attr:`relative_amplification` (a guaranteed bound: the decoder needs no sampling)."""
        return self.relative_amplification

    @property
    def load_overhead(self) -> float:
        """Load fraction divided by the lower bound ``(s+1)/n`` (1.0 = optimal)."""
        return self.load_fraction / ((self.s + 1) / self.n)
