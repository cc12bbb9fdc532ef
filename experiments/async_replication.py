"""Coded asynchrony: FedBuff over replicated partitions, read beside the benchmark's verdict
(``experiments/grid.toml``, amendment 23).

``python -m experiments.async_replication [--cells PATTERNS] [--out FILE.json]``

In each finished cell of ``results/compare.json`` (and the slow-classes cells of amendment 8)
``fedbuff-replicated`` (:class:`fl_gradcode.flower.asynchronous.ReplicatedFedBuff`) runs with
FedBuff's settings as tuned in the cell; ``s`` (extra copies of each partition) is chosen on
the development seeds among 0, 1, 2 by FedBuff's ranking
(:func:`experiments.fedbuff_tuning.choose_replication`; ``s = 0`` is FedBuff, whose
development runs the cell's tuning already holds), then ``s = 1`` and ``s = 2``
run on the evaluation seeds, paired by seed with the cell's runs (same draws). A check run,
``s = 0`` on the first evaluation seed, must reproduce the cell's FedBuff run, or the cell's
reading is marked not paired. Nothing here changes the benchmark's verdict. FedBuff: Nguyen et
al., AISTATS 2022, https://arxiv.org/abs/2106.06639; the placement: Tandon et al., *Gradient
Coding*, ICML 2017.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from experiments.auto_lr import paired_ratio, same_time
from experiments.common import (
    harness_environment,
    matching_cells,
    reading_parser,
    save_reading,
)
from experiments.compare import load_grid
from experiments.fedbuff_tuning import (
    REPLICATION_CHOICES,
    REPLICATION_RULE,
    tuned_replication,
)
from experiments.registry import COMPUTE_KEYS, charge_at, charge_once, grid_cell, lookup
from experiments.rival_runs import Cell, run_replicated

COMPARE = Path("results/compare.json")
#: amendment 8's cells: name -> file (each one cell of ``python -m experiments.compare``)
SLOW_CLASSES = {
    "slow-classes-2/digits-logreg/persistent/20x20": Path(
        "results/compare_slow_classes_2_20x20.json"),
    "slow-classes-1/digits-logreg/persistent/20x20": Path(
        "results/compare_slow_classes_1_20x20.json"),
    "slow-classes-2/digits-logreg/persistent/100x100": Path(
        "results/compare_slow_classes_2_100x100.json"),
}
OUT = Path("results/async_replication.json")
METHOD = "fedbuff-replicated"

__all__ = ["METHOD", "cell_of", "main", "read_cell", "record", "stored"]


def cell_of(grid: Mapping[str, Any], settings: Mapping[str, Any]) -> Cell:
    """The :class:`Cell` a finished cell ran (its settings), with FedBuff's settings as
    they were tuned there and the compute charge the cell charged."""
    fb = settings["fedbuff"]
    sets = dict(settings.get("set") or {})
    cell = grid_cell(grid, settings["task"], settings["latency_table"], int(settings["n"]),
                     int(settings["cohort"]), int(settings["rounds"]),
                     float(settings["target"]), sets)
    cell = dataclasses.replace(
        cell, fedbuff_server_lr=float(fb["server_lr"]),
        fedbuff_buffer_fraction=float(fb["buffer_fraction"]),
        fedbuff_staleness_exponent=float(fb["staleness_exponent"]), fedbuff_tune=0.0)
    if cell.fedbuff_buffer() != int(fb["buffer_size"]):
        raise ValueError(f"the cell's FedBuff K {fb['buffer_size']} is not rebuilt "
                         f"({cell.fedbuff_buffer()})")
    fixed, how = (charge_at(lookup(grid, "tasks", settings["task"]).get("charge_s", {}),
                            int(settings["n"]))
                  if not set(sets) & COMPUTE_KEYS else (None, None))
    cell, _ = charge_once(cell, int(settings["seeds"][0]), None, fixed, how)
    return cell


def stored(run: Mapping[str, Any]) -> dict[str, Any]:
    """A run as the reading keeps it: without its accuracy curve (the benchmark's own runs
    keep theirs)."""
    return {k: v for k, v in run.items() if k != "accuracy_curve"}


def record(cell: Cell, s: int, seed: int) -> dict[str, Any]:
    """One run of ``fedbuff-replicated`` (:func:`experiments.rival_runs.run_replicated`),
    :func:`stored`."""
    return stored(run_replicated(s, seed, cell))


def fedbuff_dev(settings: Mapping[str, Any]) -> dict[str, Any]:
    """FedBuff's development runs at its tuned setting, by seed (the cell's tuning grid)."""
    fb = settings["fedbuff"]
    for entry in fb["tuning"]["grid"]:
        if (entry["server_lr"] == fb["server_lr"]
                and entry["buffer_fraction"] == fb["buffer_fraction"]):
            return entry["per_seed"]
    raise ValueError("the cell's FedBuff tuning does not hold its pick's runs")


def read_cell(grid: Mapping[str, Any], name: str, cell: Mapping[str, Any],
              log: Callable[[str], None] = print) -> dict[str, Any]:
    """The reading of one finished cell: the development runs and the pick, the runs of
    ``s = 1, 2`` on the evaluation seeds, the pick's runs, the check run, paired ratios."""
    t0 = time.perf_counter()
    settings = cell["settings"]
    dev, seeds = [int(x) for x in settings["dev_seeds"]], [int(x) for x in settings["seeds"]]
    spec = cell_of(grid, settings)
    fedbuff_runs = fedbuff_dev(settings)

    def fedbuff(_: Cell, seed: int) -> dict[str, Any]:  # s = 0: read from the tuning
        return {"seed": seed, **fedbuff_runs[str(seed)]}

    def replicated(c: Cell, s: int, seed: int) -> dict[str, Any]:
        run = record(c, s, seed)
        log(f"  dev s={s} seed {seed}: {run['time_to_target']}")
        return run

    pick, tuning = tuned_replication(spec, dev, fedbuff, replicated)
    fedbuff_eval = [r for r in cell["runs"] if r["method"] == "fedbuff"]
    evaluation: list[dict[str, Any]] = []
    for s in REPLICATION_CHOICES[1:]:
        for seed in seeds:
            evaluation.append(record(spec, s, seed))
            log(f"  s={s} seed {seed}: {evaluation[-1]['time_to_target']}")
    check = record(spec, 0, seeds[0])
    ref = next(r for r in fedbuff_eval if r["seed"] == seeds[0])
    finals = (check["final_accuracy"], ref["final_accuracy"])
    same = same_time(check["time_to_target"], ref["time_to_target"]) and (
        finals[0] == finals[1] or (None not in finals and abs(finals[0] - finals[1]) <= 1e-12))
    picked = ([{**stored(r), "method": METHOD, "s": 0} for r in fedbuff_eval] if pick == 0 else
              [{**r, "method": METHOD} for r in evaluation if r["s"] == pick])
    auto = [r for r in cell["runs"] if r["method"] == "auto"]
    return {"cell": name, "dev_seeds": dev, "seeds": seeds, "rule": REPLICATION_RULE,
            "fedbuff": {k: settings["fedbuff"][k] for k in
                        ("server_lr", "buffer_fraction", "buffer_size", "concurrency",
                         "staleness_exponent", "server_steps")},
            "tuning": tuning["tried"], "s": pick,
            "runs": evaluation + picked,
            "check": {"seed": seeds[0], "time_to_target": check["time_to_target"],
                      "final_accuracy": check["final_accuracy"],
                      "fedbuff_time_to_target": ref["time_to_target"],
                      "fedbuff_final_accuracy": ref["final_accuracy"], "reproduces": same},
            "over_fedbuff": paired_ratio(picked, fedbuff_eval),
            "over_auto": paired_ratio(picked, auto),
            "runtime_s": time.perf_counter() - t0}


def finished_cells(compare: Path) -> dict[str, Mapping[str, Any]]:
    """Every cell this reading may take, by name: the benchmark's, then amendment 8's."""
    cells: dict[str, Mapping[str, Any]] = dict(json.loads(compare.read_text())["cells"])
    for name, path in SLOW_CLASSES.items():
        if path.exists():
            cells[name] = json.loads(path.read_text())
    return cells


def cell_order(grid: Mapping[str, Any], names: Sequence[str]) -> list[str]:
    """Amendment 23's order: digits-logreg 20x20, the slow-classes cells, digits-logreg
    100x100, then the rest in [report]'s order."""
    report = list(grid["report"]["cells"])
    first = [c for c in report if c.startswith("digits-logreg/") and c.endswith("/20x20")]
    then = list(SLOW_CLASSES)
    hundred = [c for c in report if c.startswith("digits-logreg/") and c.endswith("/100x100")]
    order = first + then + hundred + [c for c in report if c not in first + hundred]
    return [c for c in order if c in names] + [c for c in names if c not in order]


def main(argv: Sequence[str] | None = None) -> int:
    args = reading_parser("python -m experiments.async_replication", __doc__,
                          "amendment 23's order", COMPARE, OUT).parse_args(argv)
    grid = load_grid()
    data = finished_cells(args.compare)
    names = matching_cells(cell_order(grid, list(data)), args.cells,
                           "experiments.async_replication")
    for name in names:
        print(f"{METHOD}: {name}", flush=True)
        with harness_environment():
            reading = read_cell(grid, name, data[name])
        save_reading(args.out, {"rule": REPLICATION_RULE, "choices": list(REPLICATION_CHOICES),
                                "compare": str(args.compare),
                                "slow_classes": {k: str(v) for k, v in SLOW_CLASSES.items()}},
                     (name, reading))
        print(f"{METHOD}: {name}: s {reading['s']}, over FedBuff "
              f"{reading['over_fedbuff']['geomean']}, over auto "
              f"{reading['over_auto']['geomean']}, check {reading['check']['reproduces']}",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
