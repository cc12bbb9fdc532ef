"""The one benchmark command: gradient coding against what a Flower user would run instead.

``python -m experiments.compare [--task digits-logreg] [--latency persistent] [--n 20]
[--cohort N] [--methods auto,wait-for-all,deadline,deadline-best,first-k,fedbuff,grouped-rs:2]
[--seeds 10-19] [--rounds 30] [--target 0.85] [--set KEY=VALUE ...] [--out FILE.json]
[--quick]`` runs one cell into ``--out`` (default ``results/compare_cell.json``; never over a
grid's file); ``python -m experiments.compare --grid [--cells PATTERNS] [--methods ...]
--out results/compare.json`` runs cells of the grid (:mod:`experiments.run_grid`). The flags
are :mod:`experiments.compare_cli`'s: checked before any run, an explicit one winning over
``--quick``'s slice, and ``--set latency=REGIME`` running (and recording) that regime.

Every method runs in this process on the main job's ClientApp over an in-process grid, in
virtual time (:mod:`experiments.rival_runs`), on the same seeds, data, cohorts and latency
draws. A task and a latency regime are tables of ``experiments/grid.toml`` (the
pre-registered grid), each naming its one declaration in :mod:`fl_gradcode.tasks`
(``make_task(name).config`` / ``make_regime(name)``) plus keys of its own; a task whose
compute is ``measured-once`` charges every method the value the grid file fixes
(``charge_s``; at another ``n``, on the log-log line through its values: :func:`charge_at`),
or, with no such value or with ``--set`` keys that change the compute, a value measured once
per cell (:func:`charge_once`); ``--set KEY=VALUE`` adds any run-config key of
``fl_gradcode/config/keys.py`` (values parsed as the key's type) but those the harness sets
for every run (``compare_cli.HARNESS_KEYS``), so a setting outside the grid can be run.

Methods: ``auto`` (the main job: ``s=auto``), ``auto-approximate`` (``auto`` with
``auto-approximate = true``: approximate rounds with a deadline too), ``CODE:s`` (a fixed
code), ``wait-for-all``,
``deadline`` (the stated rule's deadline, from the wait-for-all runs of the development seeds
``--dev-seeds``), ``deadline-best`` (the best deadline in hindsight on the grid of
multiples of the stated one, chosen on the reported seeds by :func:`best_deadline`),
``first-k`` (over-commitment) and
``fedbuff`` (buffered asynchronous aggregation).

The JSON: ``{"settings": {...}, "runs": [{"method", "seed", "time_to_target",
"final_accuracy", "rounds", "bytes_up", "client_compute_s", ...}], "summary": {...}}``
(``rounds``: the server's aggregations, FedBuff's buffered steps included:
``settings.fedbuff.server_steps``; ``bytes_up``: every reply uploaded, those that arrived
after a deadline or were not kept included: what the clients sent, not what was used;
``client_compute_s``: every partition computed, late and wasted work included, in the
seconds the clock charges, so 0 where nothing is charged (``latency=fedscale`` with
``virtual-compute=none``: a device's compute is inside its trace latency; there
``partitions_computed`` counts the work));
``summary[method]`` holds the paired per-seed ratios method / auto (time to target, client
compute, bytes up) with their geometric mean and a 95 % Student-t interval on their logarithms.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from experiments.common import dumps, harness_environment
from experiments.compare_cli import (
    CELL_FLAGS,
    DEFAULT_METHODS,
    DEFAULT_OUT,
    DEFAULT_TASK,
    DEFAULTS,
    GRID_OUT,
    QUICK,
    build_parser,
    cell_latency,
    check_out,
    parse_rules,
    parse_seeds,
    parse_sets,
    split_methods,
)
from experiments.deadline_best import PriorDeadlines, best_deadline, deadline_best, prior_deadlines
from experiments.fedbuff_tuning import (
    check_extend,
    check_tuning_lists,
    fedbuff_runs,
    fedbuff_settings,
    note_overlap,
)
from experiments.first_k_tuning import check_overcommit_list, tuned_first_k
from experiments.journal import Journal
from experiments.registry import (
    COMPUTE_KEYS,
    GRID,
    built_code,
    cell_own_keys,
    cell_rules,
    cell_run_config,
    charge_at,
    charge_once,
    check_builds,
    check_cell,
    check_codes,
    check_methods,
    code_fit,
    grid_cell,
    load_grid,
    lookup,
    needs_stated_deadline,
    registry_config,
    task_target,
    with_rules,
)
from experiments.rival_runs import (
    FEDBUFF_METHODS,
    RIVALS,
    Cell,
    run_coded,
    run_rival,
)
from experiments.runner import OPEN_DEADLINE_S, Runner, with_timeout
from experiments.summary import print_summary, ratio_interval, summarize

__all__ = ["COMPUTE_KEYS", "GRID", "Cell", "Runner", "best_deadline", "built_code",
           "cell_own_keys", "cell_rules", "cell_run_config", "charge_at", "charge_once",
           "check_builds", "check_cell", "check_codes", "check_methods", "code_fit", "compare",
           "grid_cell", "load_grid", "lookup", "main", "print_summary", "ratio_interval",
           "registry_config", "run_cell", "run_coded", "run_rival", "summarize", "task_target",
           "with_rules"]

def compare(cell: Cell, methods: Sequence[str], seeds: Sequence[int],
            dev_seeds: Sequence[int], rules: Mapping[str, Any],
            log: Callable[[str], None] = print,
            own_timeout: bool = False, journal: Journal | None = None,
            prior: PriorDeadlines | None = None
            ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every method on every seed: ``(runs, deadline facts)``. ``own_timeout``: the cell sets
    ``straggler-timeout`` itself (``--set`` or the grid's tables; a registry entry's value is
    the main job's), and the coded methods stop waiting there. ``journal``: runs finished by
    an earlier process of the same cell are read back from it, new ones written to it.
    ``prior``: the deadlines a finished cell's ``deadline-best`` ran, read back instead of run
    (:func:`experiments.deadline_best.deadline_best`)."""
    from fl_gradcode.rivals import deadline_grid

    runner = Runner(cell, log, journal)
    runs: list[dict[str, Any]] = []
    facts: dict[str, Any] = {}
    coded = [m for m in methods if m not in (*RIVALS, "deadline", "deadline-best")]
    # coded methods stop waiting at the same stated deadline as the deadline rival, unless
    # the cell sets straggler-timeout itself
    needs_deadline = needs_stated_deadline(methods, own_timeout)
    stated = None
    if needs_deadline:
        stated = runner.stated_deadline(dev_seeds, float(rules["deadline_quantile"]),
                                        float(rules["deadline_slack"]))
        facts["stated_deadline_s"] = stated
        facts["deadline_rule"] = (f"{rules['deadline_slack']} x the "
                                  f"{rules['deadline_quantile']} quantile of wait-for-all's "
                                  f"client times on development seeds {list(dev_seeds)}")
        note_overlap(facts, "the stated deadline (auto's, the codes', deadline-best's grid)",
                     seeds, dev_seeds, log)
    if coded:
        timeout = (cell.run_config["straggler-timeout"] if own_timeout else stated)
        facts["coded_straggler_timeout_s"] = float(timeout)
        facts["coded_straggler_timeout_rule"] = (
            "set by the cell" if own_timeout else "the stated deadline (as the deadline rival)")
        runner.coded_cell = with_timeout(cell, timeout)
        codes = [m for m in coded if ":" in m]
        if codes and not own_timeout and cell.codes_own_deadline:
            quantile, slack = float(rules["deadline_quantile"]), float(rules["deadline_slack"])
            runner.code_deadlines = {m: runner.code_deadline(m, dev_seeds, quantile, slack)
                                     for m in codes}
            facts["code_deadlines_s"] = dict(runner.code_deadlines)
            facts["code_deadline_rule"] = (
                f"{slack} x the {quantile} quantile of the code's own client times in its "
                f"runs on development seeds {list(dev_seeds)} with straggler-timeout "
                f"{OPEN_DEADLINE_S:g} (never binding)")
    for method in methods:
        if method == "deadline":
            runs += [runner.deadline(stated, seed, "deadline") for seed in seeds]
        elif method == "deadline-best":
            best, more = deadline_best(
                deadline_grid(stated, rules["deadline_grid"]), seeds,
                lambda d, seed: runner.deadline(d, seed, "deadline-best"), stated, prior, log,
                check_extend(rules.get("deadline_grid_extend"), "deadline_grid_extend"))
            facts.update(more)
            runs += best
        elif method in FEDBUFF_METHODS[1:] or (method == "fedbuff" and cell.fedbuff_tune):
            more, new = fedbuff_runs(method, cell, seeds, dev_seeds, rules, runner, log)
            runs += more
            for key, value in new.items():  # FedBuff's tuning: once, whichever ran first
                facts.setdefault(key, value)
        elif method == "first-k" and cell.first_k_tune:
            tuned, tuning = tuned_first_k(cell, dev_seeds, check_overcommit_list(rules),
                                          runner.first_k, rules.get("first_k_tune_extend"))
            note_overlap(tuning, "first-k", seeds, dev_seeds, log)
            facts["first_k"] = {"k": tuned.first_k(), "overcommit": tuned.overcommit,
                                "tuning": tuning}
            runs += [{**runner.first_k(tuned, seed), "method": "first-k"} for seed in seeds]
        elif method in RIVALS:
            runs += [runner.rival(method, seed) for seed in seeds]
        else:
            runs += [runner.coded(method, seed) for seed in seeds]
    return [stored_run(r) for r in runs], facts


def stored_run(record: Mapping[str, Any]) -> dict[str, Any]:
    """A run as the JSON keeps it: without wait-for-all's client times (the stated rule
    reads them from the development seeds' runs only, which are not stored)."""
    return {k: v for k, v in record.items() if k != "client_times_s"}


# ============================================================================= the command
def main(argv: list[str] | None = None) -> int:
    args = build_parser(__doc__.splitlines()[0]).parse_args(argv)
    with harness_environment():
        return _main(args)


def run_cell(grid: Mapping[str, Any], task_name: str, latency: str, n: int, cohort: int,
             rounds: int, seeds: Sequence[int], dev_seeds: Sequence[int],
             methods: Sequence[str], target: float, sets: Mapping[str, Any] | None = None,
             quick: bool = False, log: Callable[[str], None] = print,
             journal: Path | None = None, finished: Mapping[str, Any] | None = None,
             checked: bool = False, rules_set: Mapping[str, float] | None = None
             ) -> dict[str, Any]:
    """One cell, every method on every seed: the JSON ``{"settings", "runs", "summary",
    "runtime_s"}``. ``journal``: a file keeping the cell's finished runs
    (:class:`experiments.journal.Journal`), so a cell cut off resumes where it stopped;
    ``runtime_s`` then counts the resumed runs' wall time, and ``resumed_runs`` how many.
    ``finished``: the cell as a finished grid run stored it, whose deadlines ``deadline-best``
    reads back when the grid's are extended (:func:`experiments.deadline_best.deadline_best`;
    only if it ran with the same settings). ``checked``: the caller has made the checks a
    cell gets before its first run (:func:`check_cell`, :func:`check_codes`). ``rules_set``:
    rivals' rules of the grid file replaced (``--rule``), recorded in the settings."""
    from fl_gradcode.config.keys import merge_config

    grid = with_rules(grid, rules_set)
    rules = grid["rules"]
    check_fedbuff_rules(rules, rules_set, methods)
    if not 1 <= cohort <= n:
        raise ValueError(f"--cohort {cohort}: expected 1..n (n={n})")
    cell = grid_cell(grid, task_name, latency, n, cohort, rounds, target, sets)
    cell.check_stop_rules(methods)
    own_timeout = "straggler-timeout" in cell_own_keys(grid, task_name, latency, sets)
    if not checked:
        check_cell(cell, task_name, [*seeds, *dev_seeds])
        check_codes(cell, methods)
        check_builds(cell, methods, [*seeds, *dev_seeds][0], own_timeout)
    # a fixed charge was measured with the task's own compute: not with --set keys changing it
    fixed, fixed_how = (charge_at(lookup(grid, "tasks", task_name).get("charge_s", {}), n)
                        if not set(sets or {}) & COMPUTE_KEYS else (None, None))
    book = None
    if journal is not None:
        book = Journal(journal, {"cell": dataclasses.asdict(cell), "seeds": list(seeds),
                                 "dev_seeds": list(dev_seeds), "charge_s": fixed,
                                 "rules": dict(rules)})
        if book.stale:
            log(f"compare: {journal} was written for another cell, seeds, code or versions: "
                f"set aside as {book.stale}, the cell starts afresh")
        elif book.runs:
            log(f"compare: resuming from {journal}: {len(book.runs)} runs already finished")
    ran = str(merge_config(cell.run_config)["latency"])
    if latency and ran != latency:
        log(f"compare: latency {ran!r} runs with the keys of the grid's {latency!r} table "
            "(--latency and --set latency differ)")
    t0 = time.perf_counter()
    cell, charge = charge_once(cell, [*seeds, *dev_seeds][0], book, fixed, fixed_how)
    source = "" if latency else " (no grid table: the key table" + (
        " with --set)" if "latency" in (sets or {}) else ")")
    log(f"compare: task {task_name}, latency {ran}{source}, "
        f"n={n}, cohort={cohort}, {rounds} rounds, target {target}, seeds {list(seeds)}"
        + (f", compute charged {charge['measured_partition_cost_s']:.4f} s per partition"
           if charge else ""))
    runs, facts = compare(cell, methods, seeds, dev_seeds, rules, log,
                          own_timeout=own_timeout, journal=book,
                          prior=prior_deadlines(finished, {
                              "task": task_name, "n": n, "cohort": cohort, "rounds": rounds,
                              "target": target, "seeds": list(seeds),
                              "dev_seeds": list(dev_seeds),
                              "run_config": dict(cell.run_config),
                              "rivals_stop_dropped_work": bool(cell.rivals_stop_dropped_work)},
                                                 log)
                          if finished is not None else None)
    resumed_s = book.resumed_wall_s if book is not None else 0.0
    tuned_fedbuff_settings = facts.pop("fedbuff", {})  # FedBuff's pick, where it was tuned
    first_k = facts.pop("first_k", None) or {"k": cell.first_k(), "overcommit": cell.overcommit}
    return {
        "settings": {
            # the regime that ran: the run config's, resolved by the key table
            "task": task_name, "latency": str(merge_config(cell.run_config)["latency"]),
            "latency_table": latency, "n": n, "cohort": cohort,
            "rounds": rounds, "target": target, "methods": list(methods),
            "seeds": list(seeds), "dev_seeds": list(dev_seeds), "set": dict(sets or {}),
            "run_config": dict(cell.run_config), "quick": bool(quick),
            "first_k": first_k,
            "fedbuff": {**fedbuff_settings(cell),
                        **({"regime_round": "federation"} if "fedbuff" in methods else {}),
                        **tuned_fedbuff_settings},
            # the rivals' fixes of the grid file's amendment 11, where those rivals ran
            **({"rivals_stop_dropped_work": bool(cell.rivals_stop_dropped_work)}
               if set(methods) & {"deadline", "deadline-best", "first-k"} else {}),
            # amendment 15, where auto or auto-approximate ran
            **({"auto_stop_at_decode": cell.auto_stops_at_decode}
               if set(methods) & {"auto", "auto-approximate"} else {}),
            # amendment 19, where a fixed code ran
            **({"codes_stop_at_decode": cell.stops_at_decode("codes_stop_at_decode"),
                # amendment 21: each code's deadline read from its own client times
                "codes_own_deadline": "code_deadlines_s" in facts}
               if any(":" in m for m in methods) else {}),
            "rules_set": dict(rules_set or {}),
            **({"auto_approximate": approximate_knobs()} if "auto-approximate" in methods
               else {}),
            **charge, **facts,
        },
        "runs": runs,
        "summary": summarize(runs),
        "runtime_s": time.perf_counter() - t0 + resumed_s,
        **({"resumed_runs": book.resumed} if book is not None else {}),
    }


def approximate_knobs() -> dict[str, float | str | None]:
    """The knobs ``auto-approximate`` runs with: the public class attributes of
    :class:`fl_gradcode.flower.approximate_rounds.ApproximateRounds` it names in ``KNOBS``."""
    from fl_gradcode.flower.approximate_rounds import ApproximateRounds

    return {k: getattr(ApproximateRounds, k) for k in ApproximateRounds.KNOBS}


def _main(args: argparse.Namespace) -> int:
    grid = load_grid()
    if args.grid and args.merge:
        from experiments.run_grid import cell_names, merge_files, merge_methods

        sources = [Path(f.strip()) for f in args.merge.split(",") if f.strip()]
        out = Path(args.out or GRID_OUT)
        try:
            names = None if args.cells == "*" else cell_names(grid, args.cells)
            merged = (merge_methods(out, grid, sources,
                                    check_methods(split_methods(args.methods)), names)
                      if args.methods else merge_files(out, grid, sources, names))
        except ValueError as exc:
            raise SystemExit(f"python -m experiments.compare: {exc}") from None
        print(f"grid: merged {', '.join(merged) or 'no cell'} into {out}")
        return 0
    if args.grid:
        from experiments.run_grid import check_grid, run_grid

        try:
            one_cell = [f"--{flag.replace('_', '-')}" for flag in CELL_FLAGS
                        if getattr(args, flag) not in (None, [], False)]
            if one_cell:
                raise ValueError(f"{', '.join(one_cell)}: one cell's flags; --grid runs the "
                                 "cells of experiments/grid.toml as it states them (--cells, "
                                 "--methods, --rerun, --merge, --out)")
            methods = split_methods(args.methods) if args.methods else None
            check_grid(grid, args.cells, methods, args.rerun)
        except ValueError as exc:
            raise SystemExit(f"python -m experiments.compare: {exc}") from None
        return run_grid(grid, args.cells, Path(args.out or GRID_OUT), methods,
                        rerun=args.rerun)
    grid_only = [flag for flag, given in (("--cells", args.cells != "*"),
                                          ("--rerun", args.rerun), ("--merge", args.merge))
                 if given]
    if grid_only:
        raise SystemExit(f"python -m experiments.compare: {', '.join(grid_only)} needs --grid")
    out = Path(args.out or DEFAULT_OUT)
    try:  # every argument checked before any run: a bad one is a message, not a traceback
        cell = parse_cell(grid, args)
        check_out(out)
    except ValueError as exc:
        raise SystemExit(f"python -m experiments.compare: {exc}") from None
    # finished runs wait here: the same command with the same code resumes a run cut off
    journal = single_journal(out)
    result = run_cell(grid, cell["task"], cell["latency"], cell["n"], cell["cohort"],
                      cell["rounds"], cell["seeds"], cell["dev_seeds"], cell["methods"],
                      cell["target"], cell["sets"], bool(args.quick), checked=True,
                      rules_set=cell["rules"], journal=journal)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(dumps(result))
    journal.unlink(missing_ok=True)
    print_summary(result)
    print(f"wrote {out} ({result['runtime_s']:.1f} s)")
    return 0


def check_fedbuff_rules(rules: Mapping[str, Any], rules_set: Mapping[str, float] | None,
                        methods: Sequence[str]) -> None:
    """A ``ValueError`` where ``--rule`` fixes FedBuff's server lr or K, or first-k's
    over-commitment, while ``rules`` (the grid file's with ``rules_set``) tune them on the
    development seeds (the value given would not run), or where a tuning's lists, or
    deadline-best's ``deadline_grid_extend``, are bad."""
    if "deadline-best" in methods:
        check_extend(rules.get("deadline_grid_extend"), "deadline_grid_extend")
    if rules.get("first_k_tune") and "first-k" in methods:
        check_overcommit_list(rules)
        if "overcommit" in (rules_set or {}):
            raise ValueError(f"--rule overcommit={rules_set['overcommit']:g}: first-k's "
                             "over-commitment is tuned on the development seeds (the grid "
                             "file's first_k_tune); add --rule first_k_tune=0 to run the "
                             "value given")
    if not (rules.get("fedbuff_tune") and set(FEDBUFF_METHODS) & set(methods)):
        return
    check_tuning_lists(rules)
    fixed = sorted({"fedbuff_server_lr", "fedbuff_buffer_fraction"} & set(rules_set or {}))
    if fixed:
        raise ValueError(f"--rule {fixed[0]}={rules_set[fixed[0]]:g}: FedBuff's server lr and "
                         "K are tuned on the development seeds (the grid file's "
                         "fedbuff_tune); add --rule fedbuff_tune=0 to run the value given")


def check_latency_sets(sets: Mapping[str, Any], model: str) -> None:
    """Refuse a ``--set`` latency parameter the cell's latency ``model`` does not read (it
    would be recorded as if it applied), even at its default value."""
    from server.app import latency_refusal, unread_latency_keys

    unread = unread_latency_keys(model, list(sets))
    if unread:
        raise ValueError(f"--set {latency_refusal(model, unread[0], sets[unread[0]])}")


def single_journal(out: Path) -> Path:
    """Where one comparison written to ``out`` keeps its finished runs until ``out`` is
    written (:class:`experiments.journal.Journal`): ``OUT.journal.jsonl``."""
    return out.with_name(out.stem + ".journal.jsonl")


def parse_cell(grid: Mapping[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The one cell the flags name (an explicit flag wins over ``--quick``'s slice), checked
    as :func:`run_cell` will check it before its first run (a ``ValueError`` naming the bad
    value: the task's data split ``n`` ways, the codes, the latency model's parameters)."""
    quick = bool(args.quick)
    task_name = args.task or DEFAULT_TASK
    task = lookup(grid, "tasks", task_name)
    sets = parse_sets(args.set)
    latency = cell_latency(args.latency, sets, grid.get("latency", {}))
    if latency:
        table = lookup(grid, "latency", latency)
        named = table.get("latency", latency)
        if args.latency is not None and "latency" in sets and str(sets["latency"]) != named:
            raise ValueError(f"--latency {args.latency} runs latency={named!r}, --set "
                             f"latency={sets['latency']!r} another model with its parameters: "
                             "give one of them")
    seeds = (parse_seeds(args.seeds) if args.seeds is not None
             else QUICK["seeds"] if quick else parse_seeds(DEFAULTS["seeds"]))
    dev_seeds = (parse_seeds(args.dev_seeds, "--dev-seeds") if args.dev_seeds is not None
                 else QUICK["dev_seeds"] if quick else parse_seeds(DEFAULTS["dev_seeds"]))
    methods = check_methods(split_methods(args.methods) if args.methods else
                            QUICK["methods"] if quick else list(DEFAULT_METHODS))
    n = int(args.n if args.n is not None else QUICK["n"] if quick else DEFAULTS["n"])
    if n < 1:
        raise ValueError(f"--n {n}: expected at least 1 node")
    cohort = n if args.cohort is None else int(args.cohort)
    if not 1 <= cohort <= n:
        raise ValueError(f"--cohort {cohort}: expected 1..n (n={n})")
    rounds = int(args.rounds if args.rounds is not None
                 else QUICK["rounds"] if quick else grid["scale"]["rounds"])
    if rounds < 1:
        raise ValueError(f"--rounds {rounds}: expected at least 1 round")
    if args.target is None and not quick and "target" not in task:
        raise ValueError(f"task {task_name!r} has no target in experiments/grid.toml yet "
                         "(its rule: 0.95 x the median final accuracy of wait-for-all on the "
                         "development seeds at (20, 20)): pass --target")
    target = float(args.target if args.target is not None
                   else QUICK["target"] if quick else task_target(task, n, cohort))
    if not 0.0 < target <= 1.0:
        raise ValueError(f"--target {target}: expected an accuracy in (0, 1]")
    if "code" in sets and any(":" in m for m in methods):
        raise ValueError(f"--set code={sets['code']}: the fixed codes of --methods name their "
                         "own (CODE:s); --set code applies to auto only: run those apart")
    rules = parse_rules(args.rule)
    ruled = with_rules(grid, rules)
    check_fedbuff_rules(ruled["rules"], rules, methods)
    checked = grid_cell(ruled, task_name, latency, n, cohort, rounds, target, sets)
    checked.check_stop_rules(methods)  # before the checks below measure anything
    check_latency_sets(sets, str(checked.config(seeds[0])["latency"]))
    if ("partition-cost-s" in sets and "virtual-compute" not in sets
            and checked.run_config.get("virtual-compute") == "measured-once"):
        raise ValueError(f"--set partition-cost-s={sets['partition-cost-s']}: task "
                         f"{task_name!r} charges its measured compute (virtual-compute="
                         "'measured-once'), which would replace it; add --set "
                         "virtual-compute=none to charge this value")
    check_cell(checked, task_name, [*seeds, *dev_seeds])
    check_codes(checked, methods)
    check_builds(checked, methods, [*seeds, *dev_seeds][0],
                 "straggler-timeout" in cell_own_keys(ruled, task_name, latency, sets))
    return {"task": task_name, "latency": latency, "n": n, "cohort": cohort, "rounds": rounds,
            "seeds": seeds, "dev_seeds": dev_seeds, "methods": methods, "target": target,
            "sets": sets, "rules": rules}


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except KeyboardInterrupt:  # the command line's Ctrl-C: no traceback, where to resume
        print("compare: interrupted; the finished runs are kept in the journal beside --out "
              "(OUT.journal.jsonl; a grid's under OUT.journal/): run the same command again "
              "to resume")
        raise SystemExit(130) from None
