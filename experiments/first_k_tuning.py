"""first-k given the care the deadline rival and FedBuff have: its over-commitment ``c``
chosen on the development seeds of the same cell (the grid file's ``first_k_tune`` rule,
amendment 18).

first-k samples ``ceil(c K)`` nodes and keeps the first ``K`` replies (``K`` the cohort when
that many nodes exist, else ``floor(n / c)``): with the cohort equal to ``n``, ``c`` sets how
many replies a round keeps, a knob like a deadline. For every ``c`` of
``first_k_tune_overcommit``, first-k runs on the development seeds; the pick is the value the
verdict's own rule ranks first over those seeds: the lowest median time to target (a seed
that never reached it counting as infinitely slow), then the highest median final accuracy,
then the grid file's a-priori ``overcommit``, then the order tried. A value that samples and
keeps what one tried does is skipped. While the pick is the largest ``c`` tried, 1.5 times it
is tried next (while ``K >= 1``); while it is the smallest, halfway to 1; at most
``first_k_tune_extend`` times (:func:`grown`). The reported seeds then run the pick only.
Over-commitment: Bonawitz et al., "Towards Federated Learning at Scale: System Design",
MLSys 2019 (select 130 % of the target count, keep the first).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from experiments.deadline_best import tried_record
from experiments.fedbuff_tuning import check_extend, number_list
from experiments.rival_runs import Cell

__all__ = ["FIRST_K_RULE", "check_overcommit_list", "grown", "tuned_first_k"]

#: What a cell's ``settings.first_k.tuning.rule`` says.
FIRST_K_RULE = ("the over-commitment c of the list with the lowest median time to target over "
                "the development seeds (never reached: infinite), then the highest median "
                "final accuracy, then the a-priori c, then the order tried, a c that samples "
                "and keeps what one tried does being skipped; while the pick is the largest c "
                "tried, 1.5 c is tried next (while K >= 1), while it is the smallest, "
                "(1 + c) / 2, and the pick is made again over every value tried, at most "
                "extend times")


def check_overcommit_list(rules: Mapping[str, Any]) -> list[float]:
    """The grid file's ``first_k_tune_overcommit`` as numbers >= 1 (and a good
    ``first_k_tune_extend``), or a ``ValueError`` naming the bad value."""
    values = number_list(rules.get("first_k_tune_overcommit"), "first_k_tune_overcommit",
                         lambda v: v >= 1, ">= 1")
    check_extend(rules.get("first_k_tune_extend"), "first_k_tune_extend")
    return values


def _shape(cell: Cell, c: float) -> tuple[int, int]:
    """``(K, nodes sampled)`` of first-k with over-commitment ``c`` in ``cell``."""
    k = dataclasses.replace(cell, overcommit=c).first_k()
    return k, min(cell.n, math.ceil(c * k - 1e-9))


def grown(tried: Sequence[float], pick: float, cell: Cell) -> list[float]:
    """The values to try next where ``pick`` is the largest (``1.5 pick``) or the smallest
    (``(1 + pick) / 2``) ``c`` tried; none where it is neither, or where the next value
    samples and keeps what one tried does, or keeps no reply."""
    shapes = {_shape(cell, c) for c in tried}
    candidates = ([1.5 * pick] if pick == max(tried) else []) + (
        [(1.0 + pick) / 2.0] if pick == min(tried) else [])
    out: list[float] = []
    for c in candidates:
        shape = _shape(cell, c)
        if shape[0] >= 1 and shape not in shapes:
            shapes.add(shape)
            out.append(round(c, 6))
    return out


def tuned_first_k(cell: Cell, dev_seeds: Sequence[int], values: Sequence[float],
                  run: Callable[[Cell, int], Mapping[str, Any]], extend: Any = 0
                  ) -> tuple[Cell, dict[str, Any]]:
    """``(cell with the chosen overcommit, the tuning's record)``: ``run(cell, seed)`` is one
    first-k run (the harness's, shared with the reported seeds' cache)."""
    if not dev_seeds:
        raise ValueError("first-k's tuning needs development seeds (--dev-seeds)")
    extend = check_extend(extend, "first_k_tune_extend")
    a_priori = float(cell.overcommit)
    results: list[dict[str, Any]] = []
    shapes: set[tuple[int, int]] = set()

    def score(i: int) -> tuple:
        r = results[i]
        time = r["median_time_to_target_all_seeds"]
        return (math.inf if time is None else time, -r["median_final_accuracy"],
                r["overcommit"] != a_priori, i)

    todo, extensions = [float(v) for v in values], []
    while True:
        for c in todo:
            shape = _shape(cell, c)
            if shape in shapes:
                continue
            shapes.add(shape)
            results.append(_tried(cell, c, dev_seeds, run))
        best = results[min(range(len(results)), key=score)]
        more = grown([r["overcommit"] for r in results], best["overcommit"], cell)
        if len(extensions) == extend or not more:
            break
        extensions.append(more)
        todo = more
    chosen = dataclasses.replace(cell, overcommit=best["overcommit"])
    return chosen, {"rule": FIRST_K_RULE, "dev_seeds": [int(s) for s in dev_seeds],
                    "a_priori": a_priori, "grid": results, "extend": extend,
                    "extensions": extensions, "at_edge": bool(more),
                    "chosen": best["overcommit"]}


def _tried(cell: Cell, c: float, dev_seeds: Sequence[int],
           run: Callable[[Cell, int], Mapping[str, Any]]) -> dict[str, Any]:
    """One value's runs on the development seeds, as the tuning's record has them."""
    tried = dataclasses.replace(cell, overcommit=c)
    k, sampled = _shape(cell, c)
    return {"overcommit": c, "k": k, "sampled": sampled,
            **tried_record([run(tried, int(seed)) for seed in dev_seeds])}
