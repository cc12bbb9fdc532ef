"""What ``verify=True`` may conclude from the replicas of a round, and nothing more.

The threat model is a coalition of up to ``s`` nodes (the round's ``s``) that know everything
public (the code matrix ``B``, the round's instructions) and forge their replies together; the
secret projections of :mod:`~fl_gradcode.flower.integrity` compare replies (a change of a reply
that a comparison sees is caught with probability ``>= 1 - 1e-12``).

``verify=True`` is accepted only for placements whose blocks are **repetition groups**: every
client of a block computes the same combination of the block's partitions (equal rows of
``B``), and a block has at least ``s + 1`` clients (:func:`placement_refusal`). A block of
received replies ``R`` is then

* **settled** when a set ``A`` of at least ``s + 1`` of its replies agree (all of ``R`` when
  ``|R| = s + 1``). ``A`` holds at least one honest reply, which equals the true value, so
  every reply of ``A`` does: the block's value is right whatever a coalition of ``<= s`` did.
  Replies outside ``A`` are then *provably wrong* (they contradict the true value): excluded
  and an offence of their node.
* **unsettled** otherwise (fewer than ``s + 1`` replies, or disagreeing replies of which no
  ``s + 1`` agree): some coalition of ``<= s`` could have produced every reply, on either side
  of any disagreement, so nobody is blamed and the block is left out of the decoding; the round
  decodes approximately from the settled blocks (``decode="approx"``, within
  ``max_decode_error``; the unsettled workers listed under ``unsettled`` in ``rounds.jsonl``).

Theorem (proved in ``docs/integrity.md``): against any coalition of at most ``s`` nodes, (i) a
model applied as ``verified`` is the example-weighted average of the true updates of the
partitions of the settled blocks (up to the projections' miss probability), and (ii) no honest
node is ever excluded, counted an offence or quarantined on the replicas' evidence. A majority
inside a group of ``s + 1`` locates up to ``floor(s / 2)`` liars, but ``floor(s / 2) + 1``
colluders could fabricate that majority, so it is never used.

Reed-Solomon or cyclic blocks (Tandon, Lei, Dimakis, Karampatziakis, "Gradient Coding", ICML
2017) have no such set: ``s`` colluders sharing no partition solve ``B[H \\ {k}] u = 0`` for the
honest rows ``H`` but one, ``k``, so every leave-one-out test points at the honest ``k``. Groups
of identical replicas and their majority are DRACO's (Chen, Wang, Charles, Papailiopoulos,
ICML 2018, https://arxiv.org/abs/1803.09877).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ..codes import GradientCode
from .integrity import Verdict, check_block

__all__ = ["auto_refusal", "placement_refusal", "repetition_block", "settle_replies"]


def repetition_block(B: np.ndarray, clients: Sequence[int], parts: Sequence[int]) -> bool:
    """Whether every client of the block computes the same combination of its partitions."""
    rows = np.asarray(B, dtype=np.float64)[np.ix_(list(clients), list(parts))]
    return bool(rows.size and np.any(rows[0] != 0) and np.all(rows == rows[0]))


def placement_refusal(code: GradientCode) -> str | None:
    """Why ``verify=True`` cannot guarantee anything for ``code``'s placement (``None``: every
    block is a repetition group of at least ``s + 1`` clients)."""
    if not (hasattr(code, "B") and hasattr(code, "blocks")):
        return "it declares no blocks"
    B = np.asarray(code.B)
    for clients, parts in code.blocks:
        if not repetition_block(B, clients, parts):
            return (f"its block of workers {list(clients)[:8]} computes different "
                    f"combinations of partitions {list(parts)[:8]}")
        if len(clients) < code.s + 1:
            return (f"its block of workers {list(clients)[:8]} has fewer than s + 1 = "
                    f"{code.s + 1} replicas")
    return None


def auto_refusal(exclude_slow: float | None, auto_approximate: bool) -> str | None:
    """Why ``verify=True`` cannot work with these ``s="auto"`` options (``None``: it can).
    ``s="auto"`` itself is taken: it chooses only the tolerances whose blocks settle."""
    if exclude_slow is not None:
        return (f"exclude_slow={exclude_slow!r} with verify=True: the groups left when slow "
                "clients are excluded are not repetition groups, which verify cannot settle; "
                "give one of them")
    if auto_approximate:
        return ("auto_approximate=True with verify=True: an approximate round ends before "
                "its blocks' s + 1 replicas have all arrived, and a block settles only when "
                "s + 1 replies agree, so most such rounds would settle nothing and be skipped; "
                "give one of them")
    return None


def settle_replies(
    code: GradientCode, z: Mapping[int, np.ndarray], workers: Sequence[int], tolerance: float,
    sizes: Mapping[int, float] | None = None, cache: dict | None = None,
) -> Verdict:
    """The verdict of ``verify=True`` on ``workers``' replies (projections ``z``), block by
    block (module docstring): ``status`` ``"verified"`` when some block settled (the replies of
    the unsettled blocks are listed in ``unsettled`` and must not be decoded), ``excluded`` the
    provably wrong replies, ``disagreement`` the largest measured."""
    B = np.asarray(code.B)
    bound = int(code.s)
    workers = sorted(workers)
    settled: list[int] = []
    excluded: list[int] = []
    unsettled: list[int] = []
    worst = 0.0
    for index, (clients, parts) in enumerate(code.blocks):
        members = set(clients)
        mine = [w for w in workers if w in members]
        if not mine:
            continue
        key = ("settle", id(code), index, tuple(mine), tolerance)
        if cache is not None and key in cache:
            found = cache[key]
        else:
            found = _settle_block(B, clients, parts, z, mine, tolerance, sizes, bound)
            if cache is not None:
                cache[key] = found
        agreed, wrong, disagreement = found
        worst = max(worst, disagreement)
        if agreed:
            settled += agreed
            excluded += wrong
        else:
            unsettled += mine
    status = "verified" if settled else ("contradicted" if worst > tolerance else "unverified")
    return Verdict(status, sorted(excluded), worst, unsettled=sorted(unsettled))


def _settle_block(B, clients, parts, z, mine: list[int], tolerance: float, sizes,
                  bound: int) -> tuple[list[int], list[int], float]:
    """``(agreeing set A, provably wrong replies, disagreement)`` of one block; ``A`` empty:
    unsettled."""
    if not repetition_block(B, clients, parts):
        return [], [], 0.0
    sub = np.zeros((B.shape[0], len(parts)))
    sub[list(clients)] = B[np.ix_(list(clients), list(parts))]
    if len(mine) == 1:
        return [], [], 0.0
    whole = check_block(sub, z, mine, sizes)
    disagreement = float("inf") if whole is None else float(whole[0])
    if disagreement <= tolerance:
        return (list(mine), [], disagreement) if len(mine) >= bound + 1 else ([], [], disagreement)
    if len(mine) < bound + 2:  # no s + 1 replies can agree while another disagrees
        return [], [], disagreement
    # classes of replies that agree pairwise; one of at least s + 1 replies decides
    classes = set()
    for seed in mine:
        cls = tuple(w for w in mine if w == seed or _agree(sub, z, seed, w, tolerance, sizes))
        if len(cls) >= bound + 1:
            check = check_block(sub, z, list(cls), sizes)
            if check is not None and check[0] <= tolerance:
                classes.add(cls)
    if len(classes) != 1:  # none, or two (more than s liars): nothing can be concluded
        return [], [], disagreement
    (agreed,) = classes
    return list(agreed), [w for w in mine if w not in agreed], disagreement


def _agree(sub, z, a: int, b: int, tolerance: float, sizes) -> bool:
    pair = check_block(sub, z, [a, b], sizes)
    return pair is not None and pair[0] <= tolerance
