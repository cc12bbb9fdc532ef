"""The main job's round deadline (the key table's ``straggler-timeout``), by the rule written in
``experiments/grid.toml`` (``[rules]``: the stated deadline rule, ``main_job_deadline_digits``).

The stated rule (``deadline_slack`` times the ``deadline_quantile`` quantile of the client
times seen in wait-for-all runs) is applied to the development seeds in the main job's
own setting: digits-logreg with the key table's defaults (no latency table of the grid file),
:data:`server.launch.NUM_SUPERNODES` nodes, all of them in each round's cohort, the grid's
rounds. The runs are those of ``python -m experiments.compare`` (its :class:`Runner`): the
deadline the benchmark's ``deadline`` rival gets in a cell, here in the main job's setting.

``python -m experiments.main_job_deadline [--out results/main_job_deadline.json]``: a few
seconds. The JSON keeps every client time the rule read, so the value can be checked from it.
In another setting (written to ``results/main_job_deadline_here.json`` unless ``--out`` says
otherwise, so that the committed file, the one the launcher reads, stays the default
setting's): ``--run-config "..."`` (the launcher's keys) and ``--num-supernodes N``;
pass the ``straggler-timeout`` it prints to the launcher (which prints this command where
its run departs from the rule's setting and leaves the deadline at its default).
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

__all__ = ["TASK", "main", "main_job_deadline", "setting"]

TASK = "digits-logreg"


def main_job_deadline(grid: Mapping[str, Any], n: int,
                      log: Callable[[str], None] = print,
                      overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The rule applied at ``n`` nodes (cohort ``n``): the JSON of
    ``results/main_job_deadline.json`` (``straggler_timeout_s``, the rounded value the key
    table must hold; ``stated_deadline_s`` before rounding; the client times it read).
    ``overrides``: the launcher's ``--run-config`` values of another setting
    (:func:`setting`)."""
    from experiments.compare_cli import HARNESS_KEYS

    rules = grid["rules"]
    seeds = list(grid["seeds"]["development"])
    n, cohort, rounds, sets = setting(overrides or {}, n, int(grid["scale"]["rounds"]))
    target = float(lookup(grid, "tasks", TASK)["target"])
    cell = grid_cell(grid, TASK, "", n, cohort, rounds, target, sets)
    runner = Runner(cell, log)
    times = {str(seed): list(runner.rival("wait-for-all", seed)["client_times_s"])
             for seed in seeds}
    quantile, slack = float(rules["deadline_quantile"]), float(rules["deadline_slack"])
    stated = runner.stated_deadline(seeds, quantile, slack)  # the same runs, cached
    digits = int(rules["main_job_deadline_digits"])
    return {"rule": f"{slack} x the {quantile} quantile of wait-for-all's client times on "
                    f"development seeds {seeds}, rounded to {digits} decimals",
            # every key of the runs' config but those the harness sets per run: a change to
            # any of them (a latency default, the compute charge) shows against the key table
            "settings": {"task": TASK, "n": n, "cohort": cohort, "rounds": rounds,
                         "dev_seeds": seeds,
                         "run_config": {k: v for k, v in cell.config(seeds[0]).items()
                                        if k not in HARNESS_KEYS},
                         "quantile": quantile, "slack": slack, "digits": digits},
            "stated_deadline_s": stated,
            "straggler_timeout_s": round(stated, digits),
            "client_times_s": times}


def setting(values: Mapping[str, Any], n: int, rounds: int
            ) -> tuple[int, int, int, dict[str, Any]]:
    """:func:`experiments.common.launcher_setting` for the rule's wait-for-all runs: the keys
    they read (not those only coded rounds read, as the launcher's wait-for-all run leaves
    them), ``straggler-timeout`` refused (what the rule picks)."""
    from server.launch import dropped

    return launcher_setting(values, n, rounds, ("straggler-timeout",), dropped("uncoded"),
                            "the round deadline is what the rule picks")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.main_job_deadline",
                                     description=__doc__.splitlines()[0])
    add_out_flag(parser, "results/main_job_deadline.json", "results/main_job_deadline_here.json")
    add_setting_flags(parser, "those wait-for-all reads are run; not straggler-timeout, "
                      "which the rule picks; then pass the straggler-timeout it prints to "
                      "the launcher")
    args = parser.parse_args(argv)
    from fl_gradcode.config.keys import key

    n, values = setting_values(parser, args, setting)
    t0 = time.perf_counter()
    with harness_environment():  # as the benchmark runs
        result = main_job_deadline(load_grid(GRID), n, overrides=values)
    result["runtime_s"] = time.perf_counter() - t0
    out = out_path(args)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    current = float(key("straggler-timeout").default)
    from server.launch import NUM_SUPERNODES

    where = (f"the key table holds {current} s" if not values and n == NUM_SUPERNODES else
             f"add straggler-timeout={result['straggler_timeout_s']} to the launcher's "
             "--run-config in this setting")
    print(f"the rule gives straggler-timeout = {result['straggler_timeout_s']} s "
          f"(stated {result['stated_deadline_s']:.4f} s); {where}; wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
