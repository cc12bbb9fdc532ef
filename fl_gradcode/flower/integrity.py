"""Integrity from redundancy: replies that the code's redundancy contradicts never reach the model.

Every reply is ``r_i = sum_j B[i,j] v_j``. When more replies than a decodable set are in hand,
different decodable subsets must decode to the same result; a wrong reply (a buggy or malicious
client, or a replica whose training is not deterministic) makes them disagree. The checks run on
a few random projections of each reply (``q`` seeded linear functionals of a sample of its
coordinates, plus its example count, exactly), so they cost ``O(q)`` per reply, not a model.

* ``consistent(F)``: the min-norm decoding of ``F`` and of every decodable ``F \\ {i}`` agree
  (disagreement relative to the median reply's size <= ``tolerance``: a huge reply cannot
  drown the other disagreements);
* a reply is *checked* when ``F \\ {i}`` still decodes: its contribution is then compared with
  a decoding that does not use it; ``verified(F)`` = consistent and every reply checked;
* a contradiction is *resolved* when removing exactly one reply ``c`` leaves a consistent set
  that still decodes (e.g. a majority inside a repetition group); otherwise the round must not
  apply anything decoded from ``F``.

References:
    Tandon, Lei, Dimakis, Karampatziakis, "Gradient Coding", ICML 2017 (replies as linear
    combinations of partition updates, ``B``); Chen, Wang, Charles, Papailiopoulos, "DRACO:
    Byzantine-resilient Distributed Training via Redundant Gradients", ICML 2018,
    https://arxiv.org/abs/1803.09877 (majority vote inside repetition groups).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..codes import GradientCode

__all__ = ["Probe", "Verdict", "verify_replies"]

_EXACT = 1e-8


class Probe:
    """``q`` seeded random linear functionals of a reply, on a seeded coordinate sample.

    ``sample`` coordinates in all, split evenly over the arrays (at least 64 per array, or the
    whole array when smaller): every array is probed and the cost per reply stays ``O(q
    sample)`` however many layers the model has.
    """

    def __init__(
        self, layout: Mapping[str, tuple[int, ...]], seed: Sequence[int], q: int = 4,
        sample: int = 2048,
    ) -> None:
        rng = np.random.default_rng(list(seed))
        self._index: dict[str, np.ndarray] = {}
        self._weights: dict[str, np.ndarray] = {}
        per_array = max(64, sample // max(1, len(layout)))
        for name, shape in layout.items():
            size = int(np.prod(shape)) if shape else 1
            take = min(size, per_array)
            self._index[name] = np.sort(rng.choice(size, size=take, replace=False))
            self._weights[name] = rng.standard_normal((q, take))

    def __call__(self, arrays: Mapping[str, np.ndarray], count: float) -> np.ndarray:
        with np.errstate(all="ignore"):  # NaN/Inf replies give a non-finite z: rejected
            return self._project(arrays, count)

    def _project(self, arrays: Mapping[str, np.ndarray], count: float) -> np.ndarray:
        z = sum(
            self._weights[name] @ np.asarray(arrays[name]).reshape(-1)[idx].astype(np.float64)
            for name, idx in self._index.items()
        )
        return np.concatenate([np.atleast_1d(z), [float(count)]])


@dataclass
class Verdict:
    """What the redundancy says about a set of replies."""

    status: str  # "verified", "unverified" (consistent, not every reply checked), "contradicted"
    excluded: list[int] = field(default_factory=list)  # identified inconsistent workers
    disagreement: float = 0.0  # largest relative disagreement measured (before exclusion)
    unresolved: bool = False  # a contradiction no single exclusion explains


def _min_norm(B: np.ndarray, workers: Sequence[int]) -> np.ndarray | None:
    """The minimum-norm ``a`` with ``B[F]^T a = 1``, or ``None`` if ``F`` does not decode."""
    if not workers:
        return None
    A = B[list(workers)].T
    a, *_ = np.linalg.lstsq(A, np.ones(A.shape[0]), rcond=None)
    if np.max(np.abs(A @ a - 1.0)) > _EXACT:
        return None
    return a


def _check(B, z: Mapping[int, np.ndarray], workers: list[int]):
    """``(disagreement, checked workers)`` of ``workers``, or ``None`` if they do not decode."""
    a = _min_norm(B, workers)
    if a is None:
        return None
    full = sum(ai * z[w] for ai, w in zip(a, workers, strict=True))
    # the typical reply's size: one huge reply must not make every other disagreement look
    # like rounding (a scale from the decoded sums would grow with it)
    scale = float(np.median([np.linalg.norm(z[w]) for w in workers]))
    worst, checked = 0.0, set()
    for i in workers:
        rest = [w for w in workers if w != i]
        b = _min_norm(B, rest)
        if b is None:
            continue
        other = sum(bi * z[w] for bi, w in zip(b, rest, strict=True))
        diff = float(np.linalg.norm(other - full))
        worst = max(worst, diff / scale if scale > 0 else (0.0 if diff == 0 else np.inf))
        checked.add(i)
    return worst, checked


def verify_replies(
    code: GradientCode, z: Mapping[int, np.ndarray], workers: Sequence[int], tolerance: float
) -> Verdict:
    """The verdict of the redundancy among ``workers`` (their projections ``z``), block by
    block of ``code.blocks`` (a huge reply in one block cannot hide a disagreement in another
    through floating point cancellation)."""
    B = code.B
    workers = sorted(workers)
    verdicts = []
    for clients, parts in code.blocks:
        members = set(clients)
        mine = [w for w in workers if w in members]
        if mine:
            sub = np.zeros((B.shape[0], len(parts)))
            sub[list(clients)] = B[np.ix_(list(clients), list(parts))]
            verdicts.append(_verify_block(sub, z, mine, tolerance))
    if not verdicts:
        return Verdict("unverified")
    if any(v.status == "contradicted" for v in verdicts):
        status = "contradicted"
    elif all(v.status == "verified" for v in verdicts):
        status = "verified"
    else:
        status = "unverified"
    return Verdict(
        status,
        sorted(w for v in verdicts for w in v.excluded),
        max(v.disagreement for v in verdicts),
        unresolved=any(v.unresolved for v in verdicts),
    )


def _verify_block(
    B: np.ndarray, z: Mapping[int, np.ndarray], workers: list[int], tolerance: float
) -> Verdict:
    """:func:`verify_replies` inside one block (``B`` restricted to the block's columns)."""
    result = _check(B, z, workers)
    if result is None:
        return Verdict("unverified")
    worst, checked = result
    if worst <= tolerance:
        return Verdict("verified" if checked == set(workers) else "unverified", [], worst)
    candidates = []
    for c in workers:
        rest = [w for w in workers if w != c]
        sub = _check(B, z, rest)
        if sub is not None and sub[0] <= tolerance and sub[1]:
            candidates.append((c, sub[1] == set(rest)))
    if len(candidates) == 1:
        culprit, all_checked = candidates[0]
        return Verdict("verified" if all_checked else "unverified", [culprit], worst)
    return Verdict("contradicted", [], worst, unresolved=True)
