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

__all__ = ["METHODS", "SEEDS", "SETTINGS", "flags", "main", "methods"]

#: the settings amendment 33 registered (digits-logreg, the main job's task, in each):
#: name -> (latency regime, n, cohort, run-config keys set)
SETTINGS: dict[str, tuple[str, int, int, dict[str, Any]]] = {
    "persistent-p0.1-20x20": ("persistent", 20, 20, {"latency-p": 0.1}),
    "persistent-p0.3-slowdown40-20x20": ("persistent", 20, 20, {"latency-p": 0.3,
                                                                "latency-slowdown": 40.0}),
    "bimodal-20-cohort10": ("bimodal", 20, 10, {}),
    "pareto-shape1.5-20x20": ("pareto", 20, 20, {"latency-shape": 1.5}),
    "slow-classes-1-persistent-40x40": ("persistent", 40, 40, {"slow-classes": 1}),
}
#: the evaluation seeds amendment 33 registered (used by no run before it)
SEEDS = "20-24"
TASK = "digits-logreg"
#: the methods of every setting before the fixed codes (:func:`methods`)
METHODS = ("fedbuff-auto", "auto", "wait-for-all", "deadline", "deadline-best", "first-k",
           "fedbuff")


def methods(name: str) -> tuple[list[str], dict[str, str]]:
    """``(methods, set aside)`` of setting ``name``: :data:`METHODS`, then the grid file's
    fixed codes (``fixed_codes`` x ``fixed_s``) the harness runs as named there (``s`` below
    the cohort, the ServerApp building that code for the cohort: :func:`~experiments.registry.
    code_fit`); the others set aside, each with why, as the grid sets aside its cells' codes
    that would run another code or train another model."""
    from experiments.registry import cell_run_config, code_fit
    from fl_gradcode.config import merge_config

    grid = load_grid()
    latency, n, cohort, sets = SETTINGS[name]
    cfg = merge_config(cell_run_config(grid, TASK, latency, sets))
    kept, aside = list(METHODS), {}
    for code in grid["methods"]["fixed_codes"]:
        for s in grid["methods"]["fixed_s"]:
            method = f"{code}:{s}"
            if s >= cohort:
                aside[method] = f"s = {s} is not below the cohort of {cohort}"
                continue
            fallback, other = code_fit(method, n, cohort, cfg)
            if fallback is None and other is None:
                kept.append(method)
            else:
                aside[method] = str(other or f"the ServerApp would run another code "
                                    f"({fallback})")
    return kept, aside


def flags(name: str) -> list[str]:
    """The harness's flags of setting ``name`` (but ``--methods`` and ``--seeds``)."""
    latency, n, cohort, sets = SETTINGS[name]
    return ["--task", TASK, "--latency", latency, "--n", str(n), "--cohort", str(cohort),
            *(arg for k, v in sets.items() for arg in ("--set", f"{k}={v}"))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.unseen_check",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", choices=sorted(SETTINGS),
                        help="run this setting only (repeatable; default: all five)")
    parser.add_argument("--seeds", default=SEEDS, help=f"default: {SEEDS}, the registered")
    parser.add_argument("--methods", default=None,
                        help="comma list (default: every registered method the setting takes)")
    parser.add_argument("--quick", action="store_true", help="the harness's quick slice")
    parser.add_argument("--out", default="results/unseen_check.json")
    args = parser.parse_args(argv)
    out = Path(args.out)
    result: dict[str, Any] = {"registration": "experiments/grid.toml amendment 33",
                              "seeds": args.seeds, "methods": args.methods,
                              "quick": args.quick, "cells": {}}
    if out.exists():
        kept = json.loads(out.read_text())
        if all(kept.get(k) == result[k] for k in ("seeds", "methods", "quick")):
            result["cells"] = kept.get("cells", {})
    for name in args.only or list(SETTINGS):
        if name in result["cells"]:
            print(f"{name}: kept from {out}", flush=True)
            continue
        chosen, aside = (methods(name) if args.methods is None
                         else (args.methods.split(","), {}))
        argv_cell = [*flags(name), "--methods", ",".join(chosen), "--seeds", args.seeds,
                     *(["--quick"] if args.quick else [])]
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            cell_out = Path(tmp) / "cell.json"
            code = compare_main([*argv_cell, "--out", str(cell_out)])
            if code != 0:
                print(f"{name}: the harness exited {code}; not recorded", flush=True)
                return code
            cell = json.loads(cell_out.read_text())
        result["cells"][name] = {"argv": argv_cell, "methods_set_aside": aside, **cell,
                                 "check_runtime_s": time.perf_counter() - t0}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1))
        print(f"{name}: {time.perf_counter() - t0:.0f} s, wrote {out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
