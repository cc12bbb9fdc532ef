"""Tuning of ``auto_approximate``'s knobs on the development seeds only.

``python -m experiments.tune_auto_approximate [--out FILE.json]``: for every knob setting of
:data:`GRID` (class attributes of :class:`~fl_gradcode.flower.approximate_rounds.
ApproximateRounds`), ``auto-approximate`` on digits-logreg, n = 20 and n = 100 (every node
sampled), development seeds 0-2, latency regimes persistent, bimodal and pareto
(``experiments/grid.toml``), the grid's rounds and target, each run as
``experiments.compare`` runs a coded method (the stated deadline), against ``auto`` on the
same seeds. The rule: the setting with the lowest geometric mean over the (cell, seed) pairs
of time to target of ``auto-approximate`` over ``auto`` (a seed where only ``auto`` reaches
the target counts as 2x, where only ``auto-approximate`` does as 0.5x, where neither does as
1x); ties: the first in :data:`GRID`.

Amended before any evaluation-seed run of ``auto-approximate``: the deadlines reach
``ceil(short_fraction * n)`` replies short (a persistent slow group at n = 100 is more than
three replies), so the cells include n = 100 and the grid ``short_fraction`` and a longer
``run``; ``max_short`` stays 3 (the old grid's 1 or 3 was never run to completion).

Amended again before it ran, after ``auto-approximate`` had run on the evaluation seeds of
the finished grid cells (where the hindsight-best deadline keeps far fewer replies than its
candidates reach) and a look at the development seeds 0-2 of natural-noniid persistent
1000x100 and digits-logreg persistent 100x100 (not a result): ``run`` stays 6 (the last
choice); ``short_fraction`` adds 0.95 (deadlines down to a few replies); ``error_power``
(the progress model's ``p``: a round with error ``e`` makes ``1 - e**p`` of a round's
progress) is 1 (the last model) or 2; the cells add natural-noniid persistent and bimodal,
1000 nodes, cohorts of 100 (:data:`SAMPLED`); a seed ``auto`` misses is counted (see the
rule). The first setting of :data:`GRID` was the library's default when it ran, so a tie
kept it; it chose ``error_power = 2``, the library's default since (its results:
``results/auto_approximate_tuning_power.json``).

Amended a third time (``experiments/grid.toml`` amendment 13), before any run with it: the
knob ``tolerances`` (``"trust-region"``: the approximate rounds are priced at the exact
choice's trust region only; ``"all"``: at every tolerance of the placement) between its two
values, the other knobs at the values the second grid chose; the same cells, seeds and rule
(results: ``results/auto_approximate_tuning_tolerances.json``). Each results file names its
own grid (``grid``).

Amended a fourth time (``experiments/grid.toml`` amendment 14), before any run with it;
``--skew`` runs it (:data:`SKEW_GRID`; it has run, and the rule kept the bound off, so the
knobs of :data:`GRID` stay the library's defaults): the knob ``max_skew`` (``None``: no
bound on how far the run's weighting of the partitions may drift from FedAvg's, the default,
first, so a tie keeps it; 0.1; 0.05), the other knobs as the third grid chose; the cells add
digits-logreg persistent at n = 20 and n = 100 with ``slow-classes = 2``
(:data:`SLOW_CLASSES`: two classes only the persistently slow clients hold, where dropping
them starves the model of those classes); the same seeds and rule (results:
:data:`SKEW_OUT`).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import logging
import math
from pathlib import Path

from experiments.compare import (
    Runner,
    charge_at,
    charge_once,
    grid_cell,
    load_grid,
    lookup,
    task_target,
)
from experiments.journal import Journal
from experiments.rival_runs import Cell, run_coded
from experiments.summary import paired_ratio

GRID = {"short_fraction": [0.25], "run": [6], "error_power": [2.0],
        "tolerances": ["trust-region", "all"]}
OUT = "results/auto_approximate_tuning_tolerances.json"
#: amendment 14's grid and file (``--skew``)
SKEW_GRID = {"short_fraction": [0.25], "run": [6], "error_power": [2.0], "tolerances": ["all"],
             "max_skew": [None, 0.1, 0.05]}
SKEW_OUT = "results/auto_approximate_tuning_skew.json"
REGIMES = ("persistent", "bimodal", "pareto")
SIZES = (20, 100)
# (task, regime, n, cohort) of sampled cohorts, beside digits-logreg's REGIMES x SIZES
SAMPLED = (("natural-noniid", "persistent", 1000, 100),
           ("natural-noniid", "bimodal", 1000, 100))
#: (regime, n, slow-classes) of the digits-logreg cells ``--skew`` adds, whose persistently
#: slow clients alone hold some classes
SLOW_CLASSES = (("persistent", 20, 2), ("persistent", 100, 2))
SEEDS = (0, 1, 2)


def tuning_cell(grid: dict, regime: str, n: int = 20, task: str = "digits-logreg",
                cohort: int | None = None, sets: dict | None = None) -> Cell:
    """The cell of ``task`` and ``regime`` at ``n`` nodes sampling ``cohort`` (default: all)
    a round (``sets``: run-config keys set, as compare's ``--set``), as
    ``experiments.compare`` builds it (its run config from the registry entries the grid's
    tables name, its target the task's for ``n`` and the cohort; a task that
    charges its compute in virtual time charged the grid file's fixed ``charge_s`` at ``n``,
    not a measurement taken under whatever load the machine has), without a deadline."""
    cohort = n if cohort is None else cohort
    table = lookup(grid, "tasks", task)
    cell = grid_cell(grid, task, regime, n, cohort, int(grid["scale"]["rounds"]),
                     task_target(table, n, cohort), sets)
    fixed, how = charge_at(table.get("charge_s", {}), n)
    # auto's late work stops at the round's deadline, as when the tunings ran (amendment 15's
    # stop at the round's end came after them)
    cell = dataclasses.replace(cell, auto_stop_at_decode=0.0)
    return charge_once(cell, SEEDS[0], None, fixed, how)[0]


def with_stated_deadline(grid: dict, cell: Cell, stated: float | None = None) -> Cell:
    """``cell`` with the coded methods' deadline of ``experiments.compare``: the stated rule
    on wait-for-all's client times of the development seeds (``stated``: its value, found
    before)."""
    if stated is None:
        rules = grid["rules"]
        stated = Runner(cell, log=lambda _: None).stated_deadline(
            list(grid["seeds"]["development"]), float(rules["deadline_quantile"]),
            float(rules["deadline_slack"]))
    return dataclasses.replace(cell, run_config={**cell.run_config,
                                                 "straggler-timeout": stated})


def main(argv: list[str] | None = None) -> int:

    parser = argparse.ArgumentParser(prog="python -m experiments.tune_auto_approximate")
    parser.add_argument("--out", default=OUT,
                        help="default: the latest grid's file (the earlier grids': "
                        "results/auto_approximate_tuning.json, "
                        "results/auto_approximate_tuning_power.json)")
    parser.add_argument("--skew", action="store_true",
                        help=f"amendment 14's grid {SKEW_GRID} with its cells "
                        f"{SLOW_CLASSES} added (default --out: {SKEW_OUT})")
    args = parser.parse_args(argv)
    logging.getLogger("flwr").setLevel(logging.ERROR)
    import torch

    from fl_gradcode.flower.blas import serial_blas

    torch.set_num_threads(1)  # as experiments.compare: small models, threads only contend
    with serial_blas():
        if args.skew:
            return tune(SKEW_OUT if args.out == OUT else args.out, SKEW_GRID, SLOW_CLASSES)
        return tune(args.out)


def tune(out_file: str, knobs_grid: dict | None = None, slow_classes: tuple = ()) -> int:
    """Run the rule over ``knobs_grid`` (default :data:`GRID`) on the tuning cells and
    :data:`SEEDS` (with ``slow_classes``' cells added) and write ``out_file``; finished
    runs wait in ``out_file``'s journal, so a tuning cut off resumes where it stopped."""
    from fl_gradcode.flower.approximate_rounds import ApproximateRounds

    grid = load_grid()
    knobs_grid = GRID if knobs_grid is None else knobs_grid
    defaults = {k: getattr(ApproximateRounds, k) for k in knobs_grid}
    specs = {f"{n}/{r}": ("digits-logreg", r, n, n, None) for n in SIZES for r in REGIMES}
    specs.update({f"{t}/{r}/{n}x{c}": (t, r, n, c, None) for t, r, n, c in SAMPLED})
    specs.update({f"{n}/{r}/slow-classes={k}": ("digits-logreg", r, n, n, {"slow-classes": k})
                  for r, n, k in slow_classes})
    pairs = [(c, s) for c in specs for s in SEEDS]
    plain = {c: tuning_cell(grid, r, n, t, k, sets) for c, (t, r, n, k, sets) in specs.items()}
    # finished runs (and each cell's stated deadline) wait in a journal beside the output: a
    # tuning cut off resumes there; one of other cells (their run configs, targets, rules),
    # deadline rule, knobs, seeds or code is set aside
    rules = grid["rules"]
    journal = Journal(Path(f"{out_file}.journal.jsonl"), {
        "tuning": {c: dataclasses.asdict(cell) for c, cell in plain.items()},
        "grid": knobs_grid,
        "seeds": SEEDS, "deadline_rule": [list(grid["seeds"]["development"]),
                                          rules["deadline_quantile"], rules["deadline_slack"]]})
    if journal.stale is not None:
        print(f"tuning: {journal.stale} was another tuning's (cells, rules, knobs, seeds or "
              "code): set aside, starting afresh", flush=True)
    elif journal.runs:
        print(f"tuning: resuming from {journal.path}: {len(journal.runs)} runs already "
              "finished", flush=True)
    cells = {}
    for c, cell in plain.items():
        stated = journal.meta(f"deadline {c}")
        cells[c] = with_stated_deadline(grid, cell, stated)
        if stated is None:
            journal.set_meta(f"deadline {c}", cells[c].run_config["straggler-timeout"])

    def time_to_target(method: str, knobs: dict | None, c: str, s: int) -> float | None:
        key = (method, knobs, c, s)
        done = journal.get(key)
        if done is None:
            done = {"time_to_target": run_coded(method, s, cells[c])["time_to_target"]}
            journal.add(key, done)
        return done["time_to_target"]

    base = {(c, s): time_to_target("auto", None, c, s) for c, s in pairs}
    print(f"auto: {len(base)} runs done", flush=True)
    rows = []
    try:
        for values in itertools.product(*knobs_grid.values()):
            knobs = dict(zip(knobs_grid, values, strict=True))
            for k, v in knobs.items():
                setattr(ApproximateRounds, k, v)
            ratios = {}
            for c, s in pairs:
                t = time_to_target("auto-approximate", knobs, c, s)
                ratios[f"{c}/{s}"] = paired_ratio(t, base[c, s])
            known = list(ratios.values())
            geo = math.exp(sum(map(math.log, known)) / len(known)) if known else None
            rows.append({"knobs": knobs, "ratio_vs_auto": ratios, "geomean": geo})
            print(knobs, geo, flush=True)
    finally:
        for k, v in defaults.items():
            setattr(ApproximateRounds, k, v)
    best = min((r for r in rows if r["geomean"] is not None), key=lambda r: r["geomean"])
    out = {"grid": knobs_grid, "regimes": REGIMES, "sizes": SIZES, "sampled": SAMPLED,
           **({"slow_classes": slow_classes} if slow_classes else {}), "seeds": SEEDS,
           "auto_time_to_target": {f"{c}/{s}": t for (c, s), t in base.items()},
           "settings": rows, "chosen": best}
    Path(out_file).parent.mkdir(parents=True, exist_ok=True)
    Path(out_file).write_text(json.dumps(out, indent=2))
    journal.path.unlink(missing_ok=True)
    print("chosen", best["knobs"], best["geomean"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
