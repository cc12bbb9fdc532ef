"""``auto`` with its server step tuned as FedBuff's is: how much of FedBuff's lead is a tuned
step (``experiments/grid.toml``, amendment 22; the asymmetry (f) it names).

``python -m experiments.auto_lr [--cells PATTERNS] [--out results/auto_lr.json]``

In the benchmark FedBuff alone has its server learning rate searched on the development
seeds; every other method steps with the decoded (or averaged) FedAvg delta as it is. Here
``auto`` runs, in each finished cell of ``results/compare.json``, with the run-config key
``server-lr`` (Flower's ``FedAvgM`` without momentum: the decoded delta times the lr), the lr
chosen by FedBuff's own rule and lists (:func:`choose_lr`), at the deadline ``auto`` ran with
in the cell; then the pick runs on the evaluation seeds, paired by seed with the cell's runs
(same draws). A check run, ``auto`` at lr 1 on the first evaluation seed, must reproduce the
cell's ``auto`` run, or the cell's reading is marked not paired. Nothing here changes the
benchmark's verdict or ``auto``'s default. FedBuff: Nguyen et al., "Federated learning with
buffered asynchronous aggregation", AISTATS 2022, https://arxiv.org/abs/2106.06639; FedAvgM:
Hsu, Qi, Brown, https://arxiv.org/abs/1909.06335.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from experiments.common import (
    checkout_commit,
    harness_environment,
    matching_cells,
    reading_parser,
    save_reading,
)
from experiments.compare import load_grid, run_cell
from experiments.deadline_best import tried_record
from experiments.fedbuff_tuning import check_extend, number_list
from experiments.summary import ratio_interval

COMPARE = Path("results/compare.json")
OUT = Path("results/auto_lr.json")
#: the a-priori server lr (the library's default, FedAvg's step)
A_PRIORI = 1.0
RULE = ("the server lr with the lowest median time to target over the development seeds "
        "(never reached: infinite), then the highest median final accuracy, then the a-priori "
        "1.0, then the order tried; from the grid file's fedbuff_tune_server_lr, growing past "
        "an edge pick (x2 or /2) at most fedbuff_tune_extend times: FedBuff's rule")

__all__ = ["A_PRIORI", "RULE", "choose_lr", "main", "paired_ratio", "run_auto", "same_time",
           "tune_cell"]


def choose_lr(lrs: Sequence[float], extend: int,
              tried: Callable[[float], Mapping[str, Any]]) -> dict[str, Any]:
    """The tuning's record: ``tried(lr)`` is one lr's record on the development seeds
    (``median_time_to_target_all_seeds``, ``None`` when the median seed never reached the
    target, and ``median_final_accuracy``); the pick is :data:`RULE`'s, and while it is the
    largest or smallest lr tried the list grows past it, at most ``extend`` times."""
    lrs = number_list(list(lrs), "fedbuff_tune_server_lr", lambda v: v > 0, "> 0")
    extend = check_extend(extend)
    results: list[dict[str, Any]] = []
    extensions: list[list[float]] = []

    def score(i: int) -> tuple:
        r = results[i]
        t = r["median_time_to_target_all_seeds"]
        return (math.inf if t is None else t, -r["median_final_accuracy"],
                r["server_lr"] != A_PRIORI, i)

    todo = list(lrs)
    while True:
        for lr in todo:
            results.append({"server_lr": lr, **tried(lr)})
        best = results[min(range(len(results)), key=score)]
        tried_lrs = [r["server_lr"] for r in results]
        lr = best["server_lr"]
        more = [v for v, edge in ((2 * lr, lr == max(tried_lrs)),
                                  (lr / 2, lr == min(tried_lrs))) if edge]
        if len(extensions) == extend or not more:
            break
        extensions.append(more)
        todo = more
    return {"rule": RULE, "grid": results, "extensions": extensions,
            "at_edge": bool(more), "chosen": best["server_lr"]}


def paired_ratio(mine: Sequence[Mapping[str, Any]], theirs: Sequence[Mapping[str, Any]]
                 ) -> dict[str, Any]:
    """``mine``'s time to target over ``theirs``' per seed, on the seeds where both reached
    it: geometric mean and 95 % interval (the benchmark's), and how many seeds paired."""
    by_seed = {r["seed"]: r["time_to_target"] for r in theirs}
    ratios = [r["time_to_target"] / by_seed[r["seed"]] for r in mine
              if r["time_to_target"] is not None and by_seed.get(r["seed"]) is not None
              and by_seed[r["seed"]] > 0]
    return {**ratio_interval(ratios), "paired": len(ratios), "seeds": len(mine)}


def same_time(time: float | None, ref: float | None) -> bool:
    """Whether a check run's time to target reproduces the reference run's (both never
    reached, or equal to 1e-9 relative)."""
    return (time is None and ref is None) or (
        time is not None and ref is not None and abs(time - ref) <= 1e-9 * max(1.0, ref))


def run_auto(grid: Mapping[str, Any], settings: Mapping[str, Any], lr: float,
             seeds: Sequence[int], log: Callable[[str], None]) -> list[dict[str, Any]]:
    """``auto``'s runs on ``seeds`` in the cell of ``settings`` (a finished cell's), at
    server lr ``lr`` and the deadline it ran with there."""
    sets = {**settings.get("set", {}),
            "straggler-timeout": float(settings["coded_straggler_timeout_s"])}
    if lr != A_PRIORI:
        sets["server-lr"] = float(lr)
    result = run_cell(grid, settings["task"], settings["latency_table"], settings["n"],
                      settings["cohort"], settings["rounds"], list(seeds), [], ["auto"],
                      float(settings["target"]), sets, log=log)
    return [{k: v for k, v in r.items() if k != "accuracy_curve"} | {"server_lr": lr}
            for r in result["runs"]]


def tune_cell(grid: Mapping[str, Any], name: str, cell: Mapping[str, Any],
              log: Callable[[str], None] = print) -> dict[str, Any]:
    """The reading of one finished cell: the tuning, the pick's runs on the evaluation seeds,
    the check run and the paired ratios."""
    t0 = time.perf_counter()
    settings = cell["settings"]
    rules = grid["rules"]
    dev, seeds = list(settings["dev_seeds"]), list(settings["seeds"])
    tuning = choose_lr(rules["fedbuff_tune_server_lr"], rules.get("fedbuff_tune_extend", 0),
                       lambda lr: tried_record(run_auto(grid, settings, lr, dev, log)))
    lr = tuning["chosen"]
    runs = run_auto(grid, settings, lr, seeds, log)
    grid_auto = [r for r in cell["runs"] if r["method"] == "auto"]
    ref = {r["seed"]: r["time_to_target"] for r in grid_auto}
    check_run = (runs if lr == A_PRIORI else run_auto(grid, settings, A_PRIORI, seeds[:1],
                                                      log))[0]
    t, t0_ref = check_run["time_to_target"], ref.get(check_run["seed"])
    same = same_time(t, t0_ref)
    fedbuff = [r for r in cell["runs"] if r["method"] == "fedbuff"]
    return {"cell": name, "dev_seeds": dev, "seeds": seeds,
            "deadline_s": float(settings["coded_straggler_timeout_s"]),
            "tuning": tuning, "server_lr": lr,
            "runs": [{**r, "method": "auto-lr"} for r in runs],
            "check": {"seed": check_run["seed"], "time_to_target": t,
                      "benchmark_auto_time_to_target": t0_ref, "reproduces": same},
            "over_fedbuff": paired_ratio(runs, fedbuff),
            "over_auto": paired_ratio(runs, grid_auto),
            "runtime_s": time.perf_counter() - t0}


def main(argv: Sequence[str] | None = None) -> int:
    args = reading_parser("python -m experiments.auto_lr", __doc__, "the grid file's [report] "
                          "order", COMPARE, OUT).parse_args(argv)
    grid = load_grid()
    data = json.loads(args.compare.read_text())["cells"]
    order = [c for c in grid["report"]["cells"] if c in data] + \
        [c for c in data if c not in grid["report"]["cells"]]
    names = matching_cells(order, args.cells, "experiments.auto_lr")
    for name in names:
        print(f"auto-lr: {name}", flush=True)
        with harness_environment():
            reading = tune_cell(grid, name, data[name])
        c = {**reading, "commit": checkout_commit()}
        save_reading(args.out, {"rule": RULE, "compare": str(args.compare),
                                "grid_rules": {k: grid["rules"][k] for k in
                                               ("fedbuff_tune_server_lr",
                                                "fedbuff_tune_extend")}}, (name, c))
        print(f"auto-lr: {name}: lr {c['server_lr']:g}, over FedBuff "
              f"{c['over_fedbuff']['geomean']}, over auto {c['over_auto']['geomean']}, "
              f"check {c['check']['reproduces']}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
