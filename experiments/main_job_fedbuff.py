"""The main job's FedBuff settings (its server learning rate and buffer ``K``), by the rule
``experiments/grid.toml`` gives FedBuff in every cell (``fedbuff_tune``, amendment 31).

The benchmark tunes FedBuff on the development seeds of each cell
(:func:`experiments.fedbuff_tuning.tuned_fedbuff`); the main job's FedBuff run
(:mod:`server.launch`) gets the same care in the main job's own setting, as its deadline does
(:mod:`experiments.main_job_deadline`): digits-logreg with the key table's defaults,
:data:`server.launch.NUM_SUPERNODES` nodes all in each round's cohort, the grid's rounds (FedBuff
as many client updates), the runs of ``python -m experiments.compare`` (its :class:`Runner`).
FedBuff: Nguyen et al., "Federated learning with buffered asynchronous aggregation",
AISTATS 2022, https://arxiv.org/abs/2106.06639.

``python -m experiments.main_job_fedbuff [--out results/main_job_fedbuff.json]``: about a
minute. The JSON keeps every setting tried and its runs' medians, so the pick can be checked.
In another setting (written to ``results/main_job_fedbuff_here.json`` unless ``--out`` says
otherwise, so that the committed file, the one the launcher reads, stays the default
setting's): ``--run-config "..."`` (the launcher's keys; those FedBuff reads are run)
and ``--num-supernodes N``, then ``python -m server.launch --fedbuff-pick FILE`` runs that
pick (the launcher prints both commands where its run departs from the pick's setting).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from experiments.common import (
    add_out_flag,
    add_setting_flags,
    harness_environment,
    launcher_setting,
    out_path,
    setting_values,
)
from experiments.compare import GRID, grid_cell, load_grid, lookup
from experiments.runner import Runner

__all__ = ["TASK", "main", "main_job_fedbuff", "setting"]

TASK = "digits-logreg"


def main_job_fedbuff(grid: Mapping[str, Any], n: int,
                     log: Callable[[str], None] = print,
                     overrides: Mapping[str, Any] | None = None,
                     target: float | None = None) -> dict[str, Any]:
    """The rule applied at ``n`` nodes (cohort ``n``): the JSON of
    ``results/main_job_fedbuff.json`` (``server_lr`` and ``buffer_fraction``, the pick the
    launcher runs; ``buffer_size``, its ``K`` at ``n``; ``staleness_exponent``, the weight
    its runs gave a stale update; ``tuning``, every setting tried). ``overrides``: the
    launcher's ``--run-config`` values of another setting (:func:`setting`), ``target`` the
    accuracy timed (default: the task's)."""
    from experiments.compare_cli import HARNESS_KEYS
    from experiments.fedbuff_tuning import tuned_fedbuff

    rules = grid["rules"]
    seeds = list(grid["seeds"]["development"])
    nodes, cohort, rounds, sets = setting(overrides or {}, n, int(grid["scale"]["rounds"]))
    if target is None:
        target = float(lookup(grid, "tasks", TASK)["target"])
    cell = grid_cell(grid, TASK, "", nodes, cohort, rounds, target, sets)
    runner = Runner(cell, log)
    tuned, tuning = tuned_fedbuff(cell, seeds, rules["fedbuff_tune_server_lr"],
                                  rules["fedbuff_tune_buffer_fraction"], runner.fedbuff,
                                  rules.get("fedbuff_tune_extend"))
    return {"rule": tuning["rule"],
            "settings": {"task": TASK, "n": nodes, "cohort": cohort, "rounds": rounds,
                         "target": target, "dev_seeds": seeds,
                         "run_config": {k: v for k, v in cell.config(seeds[0]).items()
                                        if k not in HARNESS_KEYS}},
            "server_lr": float(tuned.fedbuff_server_lr),
            "buffer_fraction": float(tuned.fedbuff_buffer_fraction),
            "buffer_size": tuned.fedbuff_buffer(),
            "server_steps": tuned.fedbuff_steps(),
            "staleness_exponent": float(tuned.fedbuff_staleness_exponent),
            "tuning": tuning}


def setting(values: Mapping[str, Any], n: int, rounds: int
            ) -> tuple[int, int, int, dict[str, Any]]:
    """:func:`experiments.common.launcher_setting` for FedBuff: the keys its runs read (not
    those only coded or synchronous rounds read, as the launcher's FedBuff run leaves
    them), its server lr and buffer refused (what the rule picks)."""
    from server.fedbuff_run import TUNED_KEYS
    from server.launch import dropped

    return launcher_setting(values, n, rounds, TUNED_KEYS, dropped("fedbuff"),
                            "FedBuff's server lr and buffer are what the rule picks")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.main_job_fedbuff",
                                     description=__doc__.splitlines()[0])
    add_out_flag(parser, "results/main_job_fedbuff.json", "results/main_job_fedbuff_here.json")
    add_setting_flags(parser, "those FedBuff reads are run; not server-lr or buffer-size, "
                      "which the rule picks; then pass the file to the launcher's "
                      "--fedbuff-pick")
    parser.add_argument("--target", type=float, default=None,
                        help="the accuracy timed (default: the task's)")
    args = parser.parse_args(argv)
    n, values = setting_values(parser, args, setting)
    t0 = time.perf_counter()
    with harness_environment():  # as the benchmark runs
        result = main_job_fedbuff(load_grid(GRID), n, overrides=values, target=args.target)
    result["runtime_s"] = time.perf_counter() - t0
    out = out_path(args)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"the rule picks server lr {result['server_lr']:g}, K {result['buffer_size']} "
          f"(a fraction {result['buffer_fraction']:g} of the cohort of "
          f"{result['settings']['cohort']}); "
          f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
