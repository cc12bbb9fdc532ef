"""Coded asynchrony that reacts to what it observes: FedBuff over replicated partitions whose
clients serve a neighbour's partition only while it falls behind their own
(``experiments/grid.toml``, amendment 24), read beside the benchmark's verdict.

``python -m experiments.async_bar --phase dev`` picks ONE ``replicate_below`` (``theta``) for
every cell on the development seeds of the fifteen cheapest cells of amendment 23's order;
``python -m experiments.async_bar --phase eval [--cells PATTERNS]`` runs the pick on the
evaluation seeds of the cells given (amendment 23's order), paired by seed with the
benchmark's FedBuff and amendment 23's ``s = 1`` (same draws). The placement is amendment 23's
``s = 1`` (:class:`fl_gradcode.flower.asynchronous.ReplicatedFedBuff`); FedBuff's settings are
as tuned in each cell. FedBuff: Nguyen et al., AISTATS 2022,
https://arxiv.org/abs/2106.06639; the placement: Tandon et al., *Gradient Coding*, ICML 2017.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from experiments.async_replication import cell_of, cell_order, finished_cells, stored
from experiments.auto_lr import paired_ratio
from experiments.common import harness_environment, matching_cells, save_reading
from experiments.compare import load_grid
from experiments.deadline_best import tried_record
from experiments.rival_runs import run_replicated

COMPARE = Path("results/compare.json")
REPLICATION = Path("results/async_replication.json")
OUT = Path("results/async_bar.json")
METHOD = "fedbuff-bar"
#: amendment 24: the placement, the bars tried, the tie-break, how many cells tune it
S = 1
CHOICES = (0.25, 0.5, 0.75)
TIE = 0.5
DEV_CELLS = 15
RULE = ("one theta for every cell among 0.25, 0.5, 0.75: per development cell, theta's median "
        "time to target over the development seeds (never reached: infinite) over the lowest "
        "of amendment 23's development medians for s = 0, 1, 2 (both infinite: 1; only "
        "theta's: infinite); the lowest worst ratio over the cells, then the lowest median "
        "ratio, then 0.5")

__all__ = ["CHOICES", "METHOD", "RULE", "choose", "dev_cells", "main", "ratio_to_best",
           "read_cell"]


def dev_cells(grid: Mapping[str, Any], names: Sequence[str]) -> list[str]:
    """The cells the bar is picked on: the first :data:`DEV_CELLS` of amendment 23's order."""
    return cell_order(grid, list(names))[:DEV_CELLS]


def _median(record: Mapping[str, Any]) -> float:
    value = record["median_time_to_target_all_seeds"]
    return math.inf if value is None else float(value)


def ratio_to_best(mine: Mapping[str, Any], fixed: Mapping[str, Mapping[str, Any]]) -> float:
    """``mine``'s development median over the lowest of the fixed settings' (records of
    :func:`experiments.deadline_best.tried_record`): both infinite 1, only mine infinite."""
    best = min(_median(r) for r in fixed.values())
    own = _median(mine)
    if math.isinf(best):
        return 1.0 if math.isinf(own) else 0.0
    if best <= 0:
        return 1.0 if own <= 0 else math.inf
    return own / best


def choose(ratios: Mapping[float, Sequence[float]]) -> float:
    """:data:`RULE`'s pick among ``ratios`` (``theta`` -> its ratio in each cell); a tie the
    rule leaves open (two bars other than 0.5 equal on both ratios) goes to the lower bar,
    which is nearer FedBuff."""
    def score(theta: float) -> tuple:
        values = list(ratios[theta])
        return (max(values), statistics.median(values), theta != TIE, theta)
    return min(ratios, key=score)


def dev_phase(grid: Mapping[str, Any], data: Mapping[str, Mapping[str, Any]],
              replication: Mapping[str, Any], log: Callable[[str], None] = print
              ) -> dict[str, Any]:
    """Every bar on the development seeds of :func:`dev_cells`; the pick."""
    cells: dict[str, Any] = {}
    for name in dev_cells(grid, list(data)):
        settings = data[name]["settings"]
        spec = cell_of(grid, settings)
        fixed = replication["cells"][name]["tuning"]
        tried = {}
        for theta in CHOICES:
            runs = []
            for seed in settings["dev_seeds"]:
                runs.append(stored(run_replicated(S, int(seed), spec, theta)))
                log(f"  {name} theta {theta} seed {seed}: {runs[-1]['time_to_target']}")
            record = tried_record(runs)
            tried[str(theta)] = {**record, "ratio_to_best_fixed": ratio_to_best(record, fixed),
                                 "replicated": [r["replicated"] for r in runs]}
        cells[name] = {"tried": tried, "fixed": {s: _median(r) for s, r in fixed.items()}}
    ratios = {theta: [cells[c]["tried"][str(theta)]["ratio_to_best_fixed"] for c in cells]
              for theta in CHOICES}
    return {"rule": RULE, "cells": cells, "pick": choose(ratios),
            "worst": {str(t): max(v) for t, v in ratios.items()},
            "median": {str(t): statistics.median(v) for t, v in ratios.items()}}


def read_cell(grid: Mapping[str, Any], name: str, cell: Mapping[str, Any],
              replication: Mapping[str, Any], theta: float,
              log: Callable[[str], None] = print) -> dict[str, Any]:
    """The pick's runs on the evaluation seeds of one finished cell, paired with FedBuff's
    and amendment 23's ``s = 1``."""
    t0 = time.perf_counter()
    settings = cell["settings"]
    spec = cell_of(grid, settings)
    runs = []
    for seed in settings["seeds"]:
        runs.append({**stored(run_replicated(S, int(seed), spec, theta)), "method": METHOD})
        log(f"  {name} seed {seed}: {runs[-1]['time_to_target']}")
    fedbuff = [r for r in cell["runs"] if r["method"] == "fedbuff"]
    s1 = [r for r in replication["cells"].get(name, {}).get("runs", [])
          if r["method"] == f"fedbuff-replicated:{S}"]
    auto = [r for r in cell["runs"] if r["method"] == "auto"]
    return {"cell": name, "theta": theta, "s": S, "runs": runs,
            "over_fedbuff": paired_ratio(runs, fedbuff),
            "over_s1": paired_ratio(runs, s1) if s1 else None,
            "over_auto": paired_ratio(runs, auto),
            "runtime_s": time.perf_counter() - t0}


#: what ``results/async_bar.json`` says it ran
SETTINGS = {"rule": RULE, "choices": list(CHOICES), "s": S, "compare": str(COMPARE),
            "replication": str(REPLICATION)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.async_bar",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--phase", choices=("dev", "eval"), required=True)
    parser.add_argument("--cells", default="*", help="comma-separated patterns (fnmatch) of "
                        "finished cells (eval), run in amendment 23's order")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    grid = load_grid()
    data = finished_cells(COMPARE)
    replication = json.loads(REPLICATION.read_text())
    if args.phase == "dev":
        with harness_environment():
            dev = dev_phase(grid, data, replication)
        save_reading(args.out, SETTINGS, dev=dev)
        print(f"{METHOD}: picked theta {dev['pick']} (worst {dev['worst']}, median "
              f"{dev['median']})", flush=True)
        return 0
    stored_dev = json.loads(args.out.read_text()).get("dev") if args.out.exists() else None
    if not stored_dev:
        raise SystemExit(f"python -m experiments.async_bar --phase eval: {args.out} holds no "
                         "development pick; run --phase dev first")
    names = matching_cells(cell_order(grid, list(data)), args.cells, "experiments.async_bar")
    for name in names:
        print(f"{METHOD}: {name}", flush=True)
        with harness_environment():
            reading = read_cell(grid, name, data[name], replication, float(stored_dev["pick"]))
        save_reading(args.out, SETTINGS, (name, reading))
        print(f"{METHOD}: {name}: over FedBuff {reading['over_fedbuff']['geomean']}, over "
              f"s = 1 {(reading['over_s1'] or {}).get('geomean')}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
