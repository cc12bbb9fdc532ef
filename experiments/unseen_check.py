"""Unseen settings for the asynchronous ``s='auto'``: the grid file's amendment 33, run.

Amendment 32's class reading (``fedbuff-auto``: FedBuff until the server's evaluation shows a
class never learnt while most are, then ``s = 1``'s least-served rule; the ReplicatedFedBuff of
:mod:`fl_gradcode.flower.asynchronous`, after FedBuff: Nguyen et al., "Federated learning with
buffered asynchronous aggregation", AISTATS 2022) met the goal in cells whose development
seeds chose it. This runs it where nothing was chosen: five settings outside the grid
(:data:`SETTINGS`), evaluation seeds 20-24 used nowhere before, each setting one command of
the benchmark harness (``python -m experiments.compare``) with every rival and fixed code
of the grid file, the harness tuning the rivals on the development seeds 0-2 as in every
cell. ``results/unseen_check.json``: ``{"registration", "seeds", "methods", "cells": {name:
{"argv", ...the harness's cell JSON}}}``; ``tools/docgen`` reads it with the verdict's own
rule (docs/adaptive.md).

``python -m experiments.unseen_check [--only NAME ...] [--seeds 20-24] [--quick]``: about
five minutes a setting on two cores (the 40-client one about twice that). A setting whose
cell is already in ``--out`` with the same seeds and methods is kept, so an interrupted run
resumes where it stopped.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from experiments.compare import load_grid
from experiments.compare import main as compare_main

__all__ = ["SEEDS", "SETTINGS", "main", "methods"]

#: the settings amendment 33 registered, as the harness's flags (digits-logreg, the main
#: job's task, in each)
SETTINGS: dict[str, list[str]] = {
    "persistent-p0.1-20x20": ["--latency", "persistent", "--n", "20",
                              "--set", "latency-p=0.1"],
    "persistent-p0.3-slowdown40-20x20": ["--latency", "persistent", "--n", "20",
                                         "--set", "latency-p=0.3",
                                         "--set", "latency-slowdown=40"],
    "bimodal-20-cohort10": ["--latency", "bimodal", "--n", "20", "--cohort", "10"],
    "pareto-shape1.5-20x20": ["--latency", "pareto", "--n", "20",
                              "--set", "latency-shape=1.5"],
    "slow-classes-1-persistent-40x40": ["--latency", "persistent", "--n", "40",
                                        "--set", "slow-classes=1"],
}
#: the evaluation seeds amendment 33 registered (used by no run before it)
SEEDS = "20-24"
ROOT = Path(__file__).resolve().parents[1]


def methods() -> str:
    """The ``--methods`` of every setting: the asynchronous and the synchronous ``auto``,
    the rivals and the grid file's fixed codes (``fixed_codes`` x ``fixed_s``)."""
    grid = load_grid()["methods"]
    codes = [f"{code}:{s}" for code in grid["fixed_codes"] for s in grid["fixed_s"]]
    return ",".join(["fedbuff-auto", "auto", "wait-for-all", "deadline", "deadline-best",
                     "first-k", "fedbuff", *codes])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.unseen_check",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", choices=sorted(SETTINGS),
                        help="run this setting only (repeatable; default: all five)")
    parser.add_argument("--seeds", default=SEEDS, help=f"default: {SEEDS}, the registered")
    parser.add_argument("--methods", default=None, help="default: every registered method")
    parser.add_argument("--quick", action="store_true", help="the harness's quick slice")
    parser.add_argument("--out", default="results/unseen_check.json")
    args = parser.parse_args(argv)
    out = Path(args.out)
    chosen = methods() if args.methods is None else args.methods
    result: dict[str, Any] = {"registration": "experiments/grid.toml amendment 33",
                              "seeds": args.seeds, "methods": chosen, "quick": args.quick,
                              "cells": {}}
    if out.exists():
        kept = json.loads(out.read_text())
        if all(kept.get(k) == result[k] for k in ("seeds", "methods", "quick")):
            result["cells"] = kept.get("cells", {})
    for name in args.only or list(SETTINGS):
        if name in result["cells"]:
            print(f"{name}: kept from {out}", flush=True)
            continue
        argv_cell = ["--task", "digits-logreg", *SETTINGS[name], "--methods", chosen,
                     "--seeds", args.seeds, *(["--quick"] if args.quick else [])]
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            cell_out = Path(tmp) / "cell.json"
            code = compare_main([*argv_cell, "--out", str(cell_out)])
            if code != 0:
                print(f"{name}: the harness exited {code}; not recorded", flush=True)
                return code
            cell = json.loads(cell_out.read_text())
        result["cells"][name] = {"argv": argv_cell, **cell,
                                 "check_runtime_s": time.perf_counter() - t0}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1))
        print(f"{name}: {time.perf_counter() - t0:.0f} s, wrote {out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
