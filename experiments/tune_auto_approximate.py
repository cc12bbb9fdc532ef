"""Tuning of ``auto_approximate``'s knobs on the development seeds only.

``python -m experiments.tune_auto_approximate [--out FILE.json]``: for every knob setting of
:data:`GRID` (class attributes of :class:`~fl_gradcode.flower.approximate_rounds.
ApproximateRounds`), ``auto-approximate`` on digits-logreg, n = 20, development seeds 0-2,
latency regimes persistent, bimodal and pareto (``experiments/grid.toml``), the grid's rounds
and target, each run as ``experiments.compare`` runs a coded method (the stated deadline),
against ``auto`` on the same seeds. The rule: the setting with the lowest geometric mean
over the nine (regime, seed) pairs of time to target of ``auto-approximate`` over ``auto``
(a seed that misses the target counts as 2x); ties: the first in :data:`GRID`.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import logging
import math
from pathlib import Path

from experiments.compare import Runner, grid_cell, load_grid, lookup
from experiments.rival_runs import Cell, run_coded

GRID = {"max_short": [1, 3], "run": [1, 3]}
REGIMES = ("persistent", "bimodal", "pareto")
SEEDS = (0, 1, 2)


def tuning_cell(grid: dict, regime: str) -> Cell:
    """The digits-logreg cell of ``regime`` at n = 20 as ``experiments.compare`` builds it
    (its run config from the registry entries the grid's tables name), without a deadline."""
    task = lookup(grid, "tasks", "digits-logreg")
    return grid_cell(grid, "digits-logreg", regime, 20, 20, int(grid["scale"]["rounds"]),
                     float(task["target"]))


def with_stated_deadline(grid: dict, cell: Cell) -> Cell:
    """``cell`` with the coded methods' deadline of ``experiments.compare``: the stated rule
    on wait-for-all's client times of the development seeds."""
    rules = grid["rules"]
    stated = Runner(cell, log=lambda _: None).stated_deadline(
        list(grid["seeds"]["development"]), float(rules["deadline_quantile"]),
        float(rules["deadline_slack"]))
    return dataclasses.replace(cell, run_config={**cell.run_config,
                                                 "straggler-timeout": stated})


def main(argv: list[str] | None = None) -> int:
    from fl_gradcode.flower.approximate_rounds import ApproximateRounds

    parser = argparse.ArgumentParser(prog="python -m experiments.tune_auto_approximate")
    parser.add_argument("--out", default="results/auto_approximate_tuning.json")
    args = parser.parse_args(argv)
    logging.getLogger("flwr").setLevel(logging.ERROR)
    grid = load_grid()
    defaults = {k: getattr(ApproximateRounds, k) for k in GRID}
    cells = {r: with_stated_deadline(grid, tuning_cell(grid, r)) for r in REGIMES}
    base = {(r, s): run_coded("auto", s, cells[r])["time_to_target"]
            for r in REGIMES for s in SEEDS}
    rows = []
    try:
        for values in itertools.product(*GRID.values()):
            knobs = dict(zip(GRID, values, strict=True))
            for k, v in knobs.items():
                setattr(ApproximateRounds, k, v)
            ratios = {}
            for r in REGIMES:
                for s in SEEDS:
                    t = run_coded("auto-approximate", s, cells[r])["time_to_target"]
                    b = base[r, s]
                    ratios[f"{r}/{s}"] = (2.0 if t is None else t / b) if b else None
            known = [v for v in ratios.values() if v]
            geo = math.exp(sum(map(math.log, known)) / len(known)) if known else None
            rows.append({"knobs": knobs, "ratio_vs_auto": ratios, "geomean": geo})
            print(knobs, geo, flush=True)
    finally:
        for k, v in defaults.items():
            setattr(ApproximateRounds, k, v)
    best = min((r for r in rows if r["geomean"] is not None), key=lambda r: r["geomean"])
    out = {"grid": GRID, "regimes": REGIMES, "seeds": SEEDS, "auto_time_to_target":
           {f"{r}/{s}": t for (r, s), t in base.items()}, "settings": rows, "chosen": best}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print("chosen", best["knobs"], best["geomean"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
