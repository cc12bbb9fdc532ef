"""Tuning of ``auto_approximate``'s knobs on the development seeds only.

``python -m experiments.tune_auto_approximate [--out FILE.json]``: for every knob setting of
:data:`GRID` (class attributes of :class:`~fl_gradcode.flower.approximate_rounds.
ApproximateRounds`), ``auto-approximate`` on digits-logreg, n = 20 and n = 100 (every node
sampled), development seeds 0-2, latency regimes persistent, bimodal and pareto
(``experiments/grid.toml``), the grid's rounds and target, each run as
``experiments.compare`` runs a coded method (the stated deadline), against ``auto`` on the
same seeds. The rule: the setting with the lowest geometric mean over the eighteen
(n, regime, seed) triples of time to target of ``auto-approximate`` over ``auto`` (a seed
that misses the target counts as 2x); ties: the first in :data:`GRID`.

Amended before any evaluation-seed run of ``auto-approximate``: the deadlines reach
``ceil(short_fraction * n)`` replies short (a persistent slow group at n = 100 is more than
three replies), so the cells include n = 100 and the grid ``short_fraction`` and a longer
``run``; ``max_short`` stays 3 (the old grid's 1 or 3 was never run to completion).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import logging
import math
from pathlib import Path

from experiments.compare import Runner, grid_cell, load_grid, lookup, task_target
from experiments.rival_runs import Cell, run_coded

GRID = {"short_fraction": [0.0, 0.25], "run": [3, 6]}
REGIMES = ("persistent", "bimodal", "pareto")
SIZES = (20, 100)
SEEDS = (0, 1, 2)


def tuning_cell(grid: dict, regime: str, n: int = 20) -> Cell:
    """The digits-logreg cell of ``regime`` at ``n`` nodes, all sampled, as
    ``experiments.compare`` builds it (its run config from the registry entries the grid's
    tables name, its target the task's for ``n``), without a deadline."""
    task = lookup(grid, "tasks", "digits-logreg")
    return grid_cell(grid, "digits-logreg", regime, n, n, int(grid["scale"]["rounds"]),
                     task_target(task, n, n))


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

    parser = argparse.ArgumentParser(prog="python -m experiments.tune_auto_approximate")
    parser.add_argument("--out", default="results/auto_approximate_tuning.json")
    args = parser.parse_args(argv)
    logging.getLogger("flwr").setLevel(logging.ERROR)
    import torch

    from fl_gradcode.flower.blas import serial_blas

    torch.set_num_threads(1)  # as experiments.compare: small models, threads only contend
    with serial_blas():
        return _tune(args.out)


def _tune(out_file: str) -> int:
    from fl_gradcode.flower.approximate_rounds import ApproximateRounds

    grid = load_grid()
    defaults = {k: getattr(ApproximateRounds, k) for k in GRID}
    pairs = [(f"{n}/{r}", s) for n in SIZES for r in REGIMES for s in SEEDS]
    cells = {f"{n}/{r}": with_stated_deadline(grid, tuning_cell(grid, r, n))
             for n in SIZES for r in REGIMES}
    base = {(c, s): run_coded("auto", s, cells[c])["time_to_target"] for c, s in pairs}
    print(f"auto: {len(base)} runs done", flush=True)
    rows = []
    try:
        for values in itertools.product(*GRID.values()):
            knobs = dict(zip(GRID, values, strict=True))
            for k, v in knobs.items():
                setattr(ApproximateRounds, k, v)
            ratios = {}
            for c, s in pairs:
                t = run_coded("auto-approximate", s, cells[c])["time_to_target"]
                b = base[c, s]
                ratios[f"{c}/{s}"] = (2.0 if t is None else t / b) if b else None
            known = [v for v in ratios.values() if v]
            geo = math.exp(sum(map(math.log, known)) / len(known)) if known else None
            rows.append({"knobs": knobs, "ratio_vs_auto": ratios, "geomean": geo})
            print(knobs, geo, flush=True)
    finally:
        for k, v in defaults.items():
            setattr(ApproximateRounds, k, v)
    best = min((r for r in rows if r["geomean"] is not None), key=lambda r: r["geomean"])
    out = {"grid": GRID, "regimes": REGIMES, "sizes": SIZES, "seeds": SEEDS,
           "auto_time_to_target": {f"{c}/{s}": t for (c, s), t in base.items()},
           "settings": rows, "chosen": best}
    Path(out_file).parent.mkdir(parents=True, exist_ok=True)
    Path(out_file).write_text(json.dumps(out, indent=2))
    print("chosen", best["knobs"], best["geomean"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
