"""Amendment 15 of ``experiments/grid.toml``: should ``auto``'s late work stop when its round
ends (``stop-late-work = "decode"``, the grid rule ``auto_stop_at_decode``)?

``python -m experiments.stop_at_decode [--runs DIR] [--out FILE.json]``: in each cell of
:data:`CELLS`, ``auto`` on the development seeds 0-2 as ``experiments.compare`` runs a cell,
once as the grid ran it so far (work stopped at the round's deadline) and once with
``--set stop-late-work=decode``; each comparison's JSON is kept in ``--runs`` (a comparison
already there is read back, not run again). The rule: the geometric mean over the (cell,
seed) pairs of auto's time to target with ``"decode"`` over without it (a seed only one of
the two reaches counts as 0.5 or 2, a seed neither reaches as 1); below 1, the rule is turned
on. The development seeds only: evaluation seeds never enter it. Writes ``--out``
(default ``results/auto_stop_at_decode_dev.json``): per cell and seed both times and the
ratio, per cell the geometric mean, the rule's value and its verdict.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from experiments.common import dumps
from experiments.summary import paired_ratio

__all__ = ["CELLS", "SEEDS", "VARIANTS", "rule", "run"]

#: (task, latency table, n, cohort): the digits-logreg cells of the auto-approximate tuning and
#: the two cells where auto was nearest the best rival when the amendment was recorded
CELLS = (("digits-logreg", "persistent", 20, 20), ("digits-logreg", "bimodal", 20, 20),
         ("digits-logreg", "pareto", 20, 20), ("digits-logreg", "persistent", 100, 100),
         ("digits-logreg", "bimodal", 100, 100), ("digits-logreg", "pareto", 100, 100),
         ("mnist1d-cnn", "pareto", 20, 20), ("mnist1d-cnn", "trace", 20, 20))
SEEDS = (0, 1, 2)
#: variant -> the flags it adds (``deadline``: as the grid ran auto before the amendment, its
#: rule off; the stored comparisons ran before the rule existed, the same thing)
VARIANTS = {"deadline": ("--rule", "auto_stop_at_decode=0"),
            "decode": ("--set", "stop-late-work=decode")}
OUT = "results/auto_stop_at_decode_dev.json"


def _file(runs: Path, cell: tuple[str, str, int, int], variant: str) -> Path:
    task, latency, n, cohort = cell
    return runs / f"{task}_{latency}_{n}x{cohort}_{variant}.json"


def run(runs: Path) -> None:
    """Every (cell, variant) comparison not yet in ``runs``."""
    from experiments import compare

    runs.mkdir(parents=True, exist_ok=True)
    for cell in CELLS:
        for variant, flags in VARIANTS.items():
            out = _file(runs, cell, variant)
            if out.exists():
                continue
            task, latency, n, cohort = cell
            code = compare.main(["--task", task, "--latency", latency, "--n", str(n),
                                 "--cohort", str(cohort), "--methods", "auto",
                                 "--seeds", ",".join(map(str, SEEDS)), *flags,
                                 "--out", str(out)])
            if code:
                raise SystemExit(f"compare failed on {cell} {variant}")


def _times(path: Path, cell: tuple[str, str, int, int], variant: str
           ) -> dict[int, float | None]:
    """auto's time to target per seed in a stored comparison, once its settings say it is
    ``cell``'s and ran ``variant``."""
    data = json.loads(path.read_text())
    s = data.get("settings", {})
    shape = (s.get("task"), s.get("latency_table"), s.get("n"), s.get("cohort"))
    decode = (s.get("run_config", {}).get("stop-late-work") == "decode"
              or s.get("auto_stop_at_decode") is True)
    if shape != cell or decode != (variant == "decode"):
        raise ValueError(f"{path}: ran {shape} with auto's work stopped at the "
                         f"{'round end' if decode else 'deadline'}; expected {cell}, {variant}")
    return {int(r["seed"]): r["time_to_target"] for r in data["runs"] if r["method"] == "auto"}


def rule(runs: Path) -> dict[str, Any]:
    """The rule's inputs and verdict from the comparisons in ``runs``."""
    cells, logs = {}, []
    for cell in CELLS:
        name = "/".join([cell[0], cell[1], f"{cell[2]}x{cell[3]}"])
        times = {v: _times(_file(runs, cell, v), cell, v) for v in VARIANTS}
        if any(sorted(t) != list(SEEDS) for t in times.values()):
            raise ValueError(f"{name}: expected auto's runs on seeds {list(SEEDS)}")
        ratios = {s: paired_ratio(times["decode"][s], times["deadline"][s]) for s in SEEDS}
        mine = [math.log(r) for r in ratios.values()]
        logs += mine
        cells[name] = {"time_to_target": {v: {str(s): t[s] for s in SEEDS}
                                          for v, t in times.items()},
                       "ratio": {str(s): r for s, r in ratios.items()},
                       "geomean": math.exp(sum(mine) / len(mine))}
    value = math.exp(sum(logs) / len(logs))
    return {"rule": __doc__.split("The rule: ", 1)[1].split(" The development", 1)[0],
            "seeds": list(SEEDS), "cells": cells, "geomean": value,
            "auto_stop_at_decode": value < 1.0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.stop_at_decode",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="results/stop_at_decode_runs",
                        help="where each comparison's JSON is kept (and read back)")
    parser.add_argument("--out", default=OUT)
    args = parser.parse_args(argv)
    runs = Path(args.runs)
    run(runs)
    result = rule(runs)
    Path(args.out).write_text(dumps(result))
    print(f"auto's time with stop-late-work='decode' over without it, geometric mean over "
          f"(cell, seed): {result['geomean']:.3f}: the rule is "
          f"{'on' if result['auto_stop_at_decode'] else 'off'}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
