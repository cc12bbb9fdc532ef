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
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from experiments.common import harness_environment
from experiments.compare import GRID, grid_cell, load_grid, lookup
from experiments.runner import Runner

__all__ = ["TASK", "main", "main_job_fedbuff"]

TASK = "digits-logreg"


def main_job_fedbuff(grid: Mapping[str, Any], n: int,
                     log: Callable[[str], None] = print) -> dict[str, Any]:
    """The rule applied at ``n`` nodes (cohort ``n``): the JSON of
    ``results/main_job_fedbuff.json`` (``server_lr`` and ``buffer_fraction``, the pick the
    launcher runs; ``buffer_size``, its ``K`` at ``n``; ``staleness_exponent``, the weight
    its runs gave a stale update; ``tuning``, every setting tried)."""
    from experiments.compare_cli import HARNESS_KEYS
    from experiments.fedbuff_tuning import tuned_fedbuff

    rules = grid["rules"]
    seeds = list(grid["seeds"]["development"])
    rounds = int(grid["scale"]["rounds"])
    target = float(lookup(grid, "tasks", TASK)["target"])
    cell = grid_cell(grid, TASK, "", n, n, rounds, target)
    runner = Runner(cell, log)
    tuned, tuning = tuned_fedbuff(cell, seeds, rules["fedbuff_tune_server_lr"],
                                  rules["fedbuff_tune_buffer_fraction"], runner.fedbuff,
                                  rules.get("fedbuff_tune_extend"))
    return {"rule": tuning["rule"],
            "settings": {"task": TASK, "n": n, "cohort": n, "rounds": rounds,
                         "target": target, "dev_seeds": seeds,
                         "run_config": {k: v for k, v in cell.config(seeds[0]).items()
                                        if k not in HARNESS_KEYS}},
            "server_lr": float(tuned.fedbuff_server_lr),
            "buffer_fraction": float(tuned.fedbuff_buffer_fraction),
            "buffer_size": tuned.fedbuff_buffer(),
            "server_steps": tuned.fedbuff_steps(),
            "staleness_exponent": float(tuned.fedbuff_staleness_exponent),
            "tuning": tuning}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.main_job_fedbuff",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/main_job_fedbuff.json")
    args = parser.parse_args(argv)
    from server.launch import NUM_SUPERNODES

    t0 = time.perf_counter()
    with harness_environment():  # as the benchmark runs
        result = main_job_fedbuff(load_grid(GRID), NUM_SUPERNODES)
    result["runtime_s"] = time.perf_counter() - t0
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"the rule picks server lr {result['server_lr']:g}, K {result['buffer_size']} "
          f"(a fraction {result['buffer_fraction']:g} of the cohort of {NUM_SUPERNODES}); "
          f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
