"""FedBuff given the care the deadline rival has: its server learning rate and its buffer ``K``
chosen on the development seeds of the same cell (the grid file's ``fedbuff_tune`` rule).

For every setting of ``fedbuff_tune_server_lr`` x ``fedbuff_tune_buffer_fraction`` (``K`` a
fraction of the cohort, the server steps as many client updates in all as ``rounds``
synchronous rounds), FedBuff runs on the development seeds; the pick is the setting the
verdict's own rule ranks first over those seeds: the lowest median time to target (a seed
that never reached it counting as infinitely slow), then the highest median final accuracy,
then the grid file's a-priori setting (``fedbuff_server_lr``, ``fedbuff_buffer_fraction``),
then the grid's order. The reported seeds then run the pick only. FedBuff: Nguyen, Malik,
Zhan, Yousefpour, Rabbat, Malek, Huba, "Federated learning with buffered asynchronous
aggregation", AISTATS 2022, https://arxiv.org/abs/2106.06639 (its server learning rate and
``K`` are set per task there too).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from experiments.deadline_best import rank_medians
from experiments.rival_runs import Cell

__all__ = ["FEDBUFF_RULE", "check_tuning_lists", "tuned_fedbuff"]

#: What a cell's ``settings.fedbuff.tuning.rule`` says.
FEDBUFF_RULE = ("the (server_lr, buffer_fraction) of the grid with the lowest median time to "
                "target over the development seeds (never reached: infinite), then the "
                "highest median final accuracy, then the a-priori setting, then the grid's "
                "order")


def _grid(values: Any, name: str, ok: Callable[[float], bool], what: str) -> list[float]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
        raise ValueError(f"{name}={values!r}: expected a non-empty list of numbers {what}")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                or not ok(float(v)):
            raise ValueError(f"{name}: {v!r} is not a number {what}")
        out.append(float(v))
    return out


def check_tuning_lists(rules: Mapping[str, Any]) -> tuple[list[float], list[float]]:
    """The grid file's ``(fedbuff_tune_server_lr, fedbuff_tune_buffer_fraction)`` as numbers,
    or a ``ValueError`` naming the bad list (checked before any run where FedBuff is tuned)."""
    return (_grid(rules.get("fedbuff_tune_server_lr"), "fedbuff_tune_server_lr",
                  lambda v: v > 0, "> 0"),
            _grid(rules.get("fedbuff_tune_buffer_fraction"), "fedbuff_tune_buffer_fraction",
                  lambda v: 0 < v <= 1, "in (0, 1]"))


def tuned_fedbuff(cell: Cell, dev_seeds: Sequence[int], server_lrs: Sequence[float],
                  fractions: Sequence[float],
                  run: Callable[[Cell, int], Mapping[str, Any]]
                  ) -> tuple[Cell, dict[str, Any]]:
    """``(cell with the pick, the tuning's record)``: ``run(cell, seed)`` is one FedBuff run
    (its record: ``time_to_target``, ``final_accuracy``) of ``cell``'s settings."""
    lrs, fracs = check_tuning_lists({"fedbuff_tune_server_lr": server_lrs,
                                     "fedbuff_tune_buffer_fraction": fractions})
    if not dev_seeds:
        raise ValueError("FedBuff's tuning needs development seeds (--dev-seeds)")
    a_priori = (float(cell.fedbuff_server_lr), float(cell.fedbuff_buffer_fraction))
    results: list[dict[str, Any]] = []
    for lr in lrs:
        for fraction in fracs:
            tried = dataclasses.replace(cell, fedbuff_server_lr=lr,
                                        fedbuff_buffer_fraction=fraction)
            runs = [run(tried, int(seed)) for seed in dev_seeds]
            time, final = rank_medians(runs)
            results.append({
                "server_lr": lr, "buffer_fraction": fraction,
                "buffer_size": tried.fedbuff_buffer(), "server_steps": tried.fedbuff_steps(),
                "median_time_to_target_all_seeds": None if math.isinf(time) else time,
                "median_final_accuracy": final,
                "per_seed": {str(r["seed"]): {"time_to_target": r["time_to_target"],
                                              "final_accuracy": r["final_accuracy"]}
                             for r in runs}})

    def score(i: int) -> tuple:
        r = results[i]
        time = r["median_time_to_target_all_seeds"]
        return (math.inf if time is None else time, -r["median_final_accuracy"],
                (r["server_lr"], r["buffer_fraction"]) != a_priori, i)

    best = results[min(range(len(results)), key=score)]
    chosen = dataclasses.replace(cell, fedbuff_server_lr=best["server_lr"],
                                 fedbuff_buffer_fraction=best["buffer_fraction"])
    return chosen, {"rule": FEDBUFF_RULE, "dev_seeds": [int(s) for s in dev_seeds],
                    "a_priori": {"server_lr": a_priori[0], "buffer_fraction": a_priori[1]},
                    "grid": results,
                    "chosen": {"server_lr": best["server_lr"],
                               "buffer_fraction": best["buffer_fraction"]}}
