"""Whose data a method's model had taken in when it reached the target: the persistently slow
clients' share of the client updates, against their share of the training data.

``python -m experiments.participation [--out results/participation.json]``

Under ``persistent`` latency a fixed fifth of the clients is 20x slower in every round. A
method that does not wait for them (a deadline, first-k, FedBuff) reaches the target sooner by
training on the others' data; on non-IID partitions that is another objective (their labels
and examples count less). Gradient coding's exact rounds take in every partition of the
cohort, the slow clients' included, from the replies of the others (Tandon et al., "Gradient
Coding", ICML 2017). This experiment measures how much each method took in from the slow
clients before its test accuracy first reached the cell's target:

* for a rival round (or FedBuff server step): the partitions of the updates it averaged
  (``clients_used``);
* for a coded round: every partition of the cohort but the round's ``missing_partitions``
  (none in an exact round; none at all in a skipped one);

each weighed by its examples, against the slow clients' share of the training data.

It reruns, on the evaluation seeds, the cells ``digits-logreg/persistent/20x20`` and
``.../100x100`` of ``experiments/grid.toml`` (every node in the cohort) for ``auto``, the
stated-rule and hindsight-best deadlines that ``results/compare.json`` recorded for the cell
(and the coded methods' deadline it recorded), first-k and FedBuff, with the grid's rules,
through the benchmark's public runners; each run records the benchmark's time to target for
the same method and seed beside its own (they should agree: same seeds, same draws). Nothing
is tuned here.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from experiments.compare import grid_cell, load_grid, lookup, task_target
from experiments.rival_runs import Cell, start_cell_coded, start_cell_rival
from fl_gradcode.data import run_partitions

GRID = Path("experiments/grid.toml")
COMPARE = Path("results/compare.json")
CELLS = (("digits-logreg", "persistent", 20), ("digits-logreg", "persistent", 100))
METHODS = ("auto", "deadline", "deadline-best", "first-k", "fedbuff")


def taken_in(row: Mapping[str, Any], cohort: Sequence[int]) -> list[int]:
    """The data partitions whose updates entered the model in one round or server step."""
    if isinstance(row.get("partitions"), Mapping):  # a coded round
        if row.get("decode") == "skipped":
            return []
        missing = set(row.get("missing_partitions") or [])
        return [p for p in cohort if p not in missing]
    return [int(p) for p in row["clients_used"]]


def share_before_target(rows: Sequence[Mapping[str, Any]], cohort: Sequence[int],
                        slow: set[int], target: float,
                        sizes: Sequence[float] | None = None) -> dict[str, Any]:
    """Updates taken in up to (and with) the first round at or above ``target`` (all rounds
    when it is never reached), how many of them were the ``slow`` clients', and the slow
    clients' share of the examples those updates were computed on (``sizes``: examples per
    partition; ``None``: one each)."""
    def weight(p: int) -> float:
        return 1.0 if sizes is None else float(sizes[p])

    updates = slow_updates = 0
    examples = slow_examples = 0.0
    reached = None
    for row in rows:
        parts = taken_in(row, cohort)
        updates += len(parts)
        slow_updates += sum(p in slow for p in parts)
        examples += sum(weight(p) for p in parts)
        slow_examples += sum(weight(p) for p in parts if p in slow)
        if row.get("accuracy") is not None and row["accuracy"] >= target:
            reached = float(row["virtual_s"])
            break
    return {"time_to_target": reached, "updates": updates, "slow_updates": slow_updates,
            "slow_update_share": slow_updates / updates if updates else None,
            "slow_example_share": slow_examples / examples if examples else None}


def recorded_rules(settings: Mapping[str, Any]) -> dict[str, float]:
    """The rivals' rules a benchmark cell ran with, from its ``settings``: FedBuff's server
    lr and buffer (its tuned pick where it was tuned), whether the deadline rivals and
    first-k stopped dropped work and whether auto stopped its late work at the round's end
    (absent: they did not, the runs predate the option)."""
    fedbuff = settings.get("fedbuff", {})
    out: dict[str, float] = {"rivals_stop_dropped_work":
                             float(bool(settings.get("rivals_stop_dropped_work", False))),
                             # absent: auto's runs predate amendment 15 (work stopped at the
                             # round's deadline)
                             "auto_stop_at_decode":
                             float(settings.get("auto_stop_at_decode") is True)}
    if "server_lr" in fedbuff:
        out["fedbuff_server_lr"] = float(fedbuff["server_lr"])
    if "buffer_fraction" in fedbuff:
        out["fedbuff_buffer_fraction"] = float(fedbuff["buffer_fraction"])
    elif "buffer_size" in fedbuff and settings.get("cohort"):
        out["fedbuff_buffer_fraction"] = float(fedbuff["buffer_size"]) / int(settings["cohort"])
    return out


def run_method(method: str, seed: int, cell: Cell, deadlines: Mapping[str, float]
               ) -> list[dict[str, Any]]:
    """One run's history (rows of rounds or server steps); ``deadlines``: the deadline runs'
    (by method) and the coded methods' (``coded``), as the benchmark gave them."""
    if method == "auto":  # at the coded methods' deadline, as the benchmark runs them
        coded = dataclasses.replace(cell, run_config={**cell.run_config,
                                                      "straggler-timeout": deadlines["coded"]})
        return start_cell_coded(method, seed, coded)[0].history
    if method in ("deadline", "deadline-best"):
        return start_cell_rival("deadline", seed, cell, deadlines[method])[0].history
    return start_cell_rival(method, seed, cell)[0].history


def measure(grid: Mapping[str, Any], compare: Mapping[str, Any], seeds: Sequence[int],
            log: Callable[[str], None] = print,
            cells_run: Sequence[tuple[str, str, int]] = CELLS,
            rounds: int | None = None) -> dict[str, Any]:
    """The JSON of ``results/participation.json``: ``cells_run`` (task, latency, n; every
    node in the cohort) of ``compare`` (a benchmark file: the deadlines it recorded, and each
    run's time to target there, ``benchmark_time_to_target``, to check these runs against)."""
    from server.app import run_latency

    rounds = int(grid["scale"]["rounds"]) if rounds is None else int(rounds)
    cells: dict[str, Any] = {}
    for task, latency, n in cells_run:
        name = f"{task}/{latency}/{n}x{n}"
        settings = compare["cells"][name]["settings"]
        benchmark = {(r["method"], r["seed"]): r["time_to_target"]
                     for r in compare["cells"][name].get("runs", [])}
        target = task_target(lookup(grid, "tasks", task), n, n)
        # the rivals as the benchmark ran them there (FedBuff's pick, the stop of dropped work)
        cell = dataclasses.replace(grid_cell(grid, task, latency, n, n, rounds, target),
                                   **recorded_rules(settings))
        deadlines = {"deadline": float(settings["stated_deadline_s"]),
                     "deadline-best": float(settings["deadline_best_s"]),
                     "coded": float(settings["coded_straggler_timeout_s"])}
        runs = []
        for seed in seeds:
            cfg = cell.config(seed)
            model = run_latency(cfg, n)
            slow = {p for p in range(n) if model.is_slow(p)}
            _, index = run_partitions(cfg, n)
            sizes = [len(p) for p in index]
            data_share = sum(sizes[p] for p in slow) / sum(sizes)
            for method in METHODS:
                rows = run_method(method, seed, cell, deadlines)
                got = share_before_target(rows, list(range(n)), slow, target, sizes)
                runs.append({"method": method, "seed": seed, "slow_clients": len(slow),
                             "slow_data_share": data_share, **got,
                             "benchmark_time_to_target": benchmark.get((method, seed))})
                share = got["slow_example_share"]
                log(f"{name} {method:>13} seed {seed}: slow clients' share of the examples "
                    f"taken in {share if share is None else round(share, 3)} (of the data "
                    f"{data_share:.3f}), target at {got['time_to_target']} (benchmark "
                    f"{benchmark.get((method, seed))})")
        cells[name] = {"target": target, "deadlines_s": deadlines, "runs": runs}
    return {"settings": {"cells": [f"{t}/{lat}/{n}x{n}" for t, lat, n in cells_run],
                         "methods": list(METHODS), "seeds": list(seeds), "rounds": rounds,
                         "deadlines_from": str(COMPARE)},
            "cells": cells}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.participation",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/participation.json")
    parser.add_argument("--seeds", default=None,
                        help="comma-separated (default: the grid's evaluation seeds)")
    args = parser.parse_args(argv)
    import torch

    from fl_gradcode.flower.blas import serial_blas

    grid = load_grid(GRID)
    seeds = ([int(s) for s in args.seeds.split(",")] if args.seeds
             else list(grid["seeds"]["evaluation"]))
    logging.getLogger("flwr").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    with serial_blas():
        result = measure(grid, json.loads(COMPARE.read_text()), seeds)
    result["runtime_s"] = time.perf_counter() - t0
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
