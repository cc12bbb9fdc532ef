"""``python -m experiments.compare --grid``: cells of ``experiments/grid.toml`` in one JSON.

A cell is a (task, latency regime, (n, cohort)) of the grid, named ``TASK/LATENCY/NxCOHORT``
(a task's ``scales``, else ``[scale] settings``). ``--cells`` takes comma-separated fnmatch
patterns of those names and runs the matching cells in the order of the patterns (then the
grid's), each on the evaluation seeds, with the stated deadline from the development seeds
(:func:`experiments.compare.run_cell`). A cell whose task has no target yet is skipped and
listed with the reason.

Each finished cell is merged into ``--out`` at once (a cell run again replaces its entry), so a
partial run keeps what it finished: ``{"grid", "cells": {name: {"settings", "runs", "summary",
"runtime_s", "finished_utc", "methods_not_run"}}, "done", "not_done", "skipped",
"estimate"}``. Until a cell is merged, its finished runs are kept in
``OUT.journal/TASK_LATENCY_NxC.jsonl`` (:func:`journal_path`): the same command run again
after a cut-off (a session's end, a kill) resumes the cell where it stopped, with the same
code and settings (:mod:`experiments.journal`). ``estimate`` is the wall time the whole
grid would take on this machine, extrapolated from the finished cells' own run times (its
formula is in the JSON).
"""

from __future__ import annotations

import datetime as _dt
import fnmatch
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from experiments.common import dumps
from experiments.compare import (
    DEFAULT_METHODS,
    check_methods,
    run_cell,
    stored_run,
    task_target,
)
from experiments.fedbuff_tuning import check_tuning_lists
from experiments.first_k_tuning import check_overcommit_list
from experiments.rival_runs import RIVALS
from experiments.summary import print_summary, summarize

__all__ = ["cell_names", "check_grid", "estimate", "grid_cells", "grid_methods", "journal_path",
           "merge", "merge_files", "merge_methods", "off_problem", "run_grid", "set_aside"]


def grid_cells(grid: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every cell of the grid, in its order: ``{"name", "task", "latency", "n", "cohort"}``."""
    out = []
    for task, table in grid["tasks"].items():
        for latency in grid["latency"]:
            for n, cohort in table.get("scales", grid["scale"]["settings"]):
                out.append({"name": f"{task}/{latency}/{n}x{cohort}", "task": task,
                            "latency": latency, "n": int(n), "cohort": int(cohort)})
    return out


def cell_names(grid: Mapping[str, Any], patterns: str) -> list[str]:
    """The cells matching ``patterns`` (comma separated, fnmatch), in the patterns' order; a
    pattern matching no cell is refused, naming the cells there are. The pattern ``report``
    stands for the reported set (``[report] cells`` of the grid file), in its order."""
    names = [c["name"] for c in grid_cells(grid)]
    chosen: list[str] = []
    listed = [p.strip() for p in patterns.split(",") if p.strip()]
    report = list(grid.get("report", {}).get("cells", []))
    expanded = [q for p in listed for q in (report if p == "report" else [p])]
    for pattern in expanded:
        hits = [name for name in names if fnmatch.fnmatchcase(name, pattern)]
        if not hits:
            raise ValueError(f"--cells {pattern!r} matches no cell of experiments/grid.toml; "
                             f"cells are named TASK/LATENCY/NxCOHORT, e.g. {names[0]!r}")
        chosen += [name for name in hits if name not in chosen]
    return chosen


def grid_methods(grid: Mapping[str, Any], cohort: int,
                 cell: Mapping[str, Any] | None = None) -> list[str]:
    """The grid's methods of a cell: the default list, then every fixed code at every
    tolerance ``s < cohort`` (``frc`` only where ``s + 1`` divides the cohort). With ``cell``
    (a :func:`grid_cells` entry), also without the fixed codes that would train another
    model there (:func:`off_problem`)."""
    methods = list(grid["methods"].get("default", DEFAULT_METHODS))
    for code in grid["methods"].get("fixed_codes", []):
        for s in grid["methods"].get("fixed_s", []):
            if s < cohort and (code != "frc" or cohort % (s + 1) == 0):
                methods.append(f"{code}:{s}")
    if cell is not None:
        methods = [m for m in methods if off_problem(grid, cell, m) is None]
    return methods


def off_problem(grid: Mapping[str, Any], cell: Mapping[str, Any], method: str,
                run_config: Mapping[str, Any] | None = None) -> str | None:
    """Why the fixed code ``method`` (``CODE:s``) would train another model than the cell's
    other methods (``None``: it trains the same one; :func:`experiments.compare.code_fit`
    with ``grid=True``: the construction the grid's finished runs used, its fallback
    included).
    ``run_config``: the cell's own (a finished cell's ``settings.run_config``), else the grid
    file's for the cell."""
    if ":" not in method:
        return None
    from experiments.compare import cell_run_config, code_fit
    from fl_gradcode.config.keys import merge_config

    cfg = merge_config(run_config if run_config is not None
                       else cell_run_config(grid, cell["task"], cell["latency"]))
    return code_fit(method, int(cell["n"]), int(cell["cohort"]), cfg, grid=True)[1]


def _load(out: Path) -> dict[str, Any]:
    if not out.exists():
        return {"cells": {}}
    data = json.loads(out.read_text())
    if "cells" not in data:
        raise ValueError(f"{out} is not a grid file (no 'cells'): it holds one comparison; "
                         "pick another --out")
    return data


def merge(out: Path, grid: Mapping[str, Any], name: str | None = None,
          result: Mapping[str, Any] | None = None,
          skipped: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Merge one finished cell (and skipped cells) into ``out`` and rewrite its index and
    estimate; the file is replaced atomically."""
    data = _load(out)
    if name is not None and result is not None:
        data["cells"][name] = {**result, "runs": [stored_run(r) for r in result["runs"]]}
    by_name = {c["name"]: c for c in grid_cells(grid)}
    for done, entry in data["cells"].items():
        if done in by_name:
            data["cells"][done] = set_aside(grid, by_name[done], entry)
    data.setdefault("skipped", {}).update(skipped or {})
    for done in data["cells"]:
        data["skipped"].pop(done, None)
    everything = [c["name"] for c in grid_cells(grid)]
    data["done"] = [c for c in everything if c in data["cells"]]
    data["not_done"] = [c for c in everything if c not in data["cells"]]
    data["grid"] = {"file": "experiments/grid.toml", "seeds": grid["seeds"],
                    "rounds": grid["scale"]["rounds"], "cells": len(everything),
                    "methods_per_cell": {c["name"]: grid_methods(grid, c["cohort"], c)
                                         for c in grid_cells(grid)}}
    data["estimate"] = estimate(grid, data)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(dumps(data))
    tmp.replace(out)
    return data


def _source_cells(grid: Mapping[str, Any], sources: Sequence[Path],
                  names: Sequence[str] | None) -> list[tuple[str, Path, dict[str, Any]]]:
    """The cells of the grid files ``sources`` (only ``names`` when given): a cell the grid
    does not have, or one in several files, is refused (which run to keep is a choice to
    make by hand)."""
    known = {c["name"] for c in grid_cells(grid)}
    seen: dict[str, Path] = {}
    cells = []
    for source in sources:
        if not Path(source).is_file():
            raise ValueError(f"--merge {source}: no such file")
        for name, cell in _load(Path(source))["cells"].items():
            if names is not None and name not in names:
                continue
            if name not in known:
                raise ValueError(f"{source}: cell {name!r} is not in experiments/grid.toml")
            if name in seen:
                raise ValueError(f"cell {name!r} is in both {seen[name]} and {source}: "
                                 "merge one of them")
            seen[name] = Path(source)
            cells.append((name, Path(source), cell))
    if names is not None and not cells:
        raise ValueError(f"--cells {', '.join(names)}: in none of {', '.join(map(str, sources))}")
    return cells


def merge_files(out: Path, grid: Mapping[str, Any], sources: Sequence[Path],
                names: Sequence[str] | None = None) -> list[str]:
    """Merge every finished cell (only ``names`` when given) of the grid files ``sources``
    (cells run in parallel, each process with its own ``--out``) into ``out``; a cell in
    several files is refused. Returns the merged cells' names."""
    cells = _source_cells(grid, sources, names)
    for name, _, cell in cells:
        merge(out, grid, name, cell)
    return [name for name, _, _ in cells]


def merge_methods(out: Path, grid: Mapping[str, Any], sources: Sequence[Path],
                  methods: Sequence[str], names: Sequence[str] | None = None) -> list[str]:
    """Merge only ``methods`` of the cells of ``sources`` into ``out`` (re-runs of different
    methods made in parallel, each process with its own copy of the grid file), as a re-run
    of ``methods`` in place would have: each source cell's last re-run must have run every
    one of ``methods``; their runs replace those in ``out``'s cell, and of the settings that
    re-run changed (its ``replaced_settings``) the cell takes the ones ``methods`` give
    (:data:`SETTING_SOURCES`; the cell's shared settings too). Every other method's runs and
    settings stay as ``out`` has them; the re-run record names what the source ran
    (``ran``: its ``runtime_s`` is that whole re-run's) and the file (``merged_from``). Only
    the cells ``names`` when given. Refused: a cell ``out`` lacks or the grid does not have,
    one in several sources, a re-run ``out`` already has or older than one of ``out``'s
    re-runs of those methods. Returns the merged cells' names."""
    data = _load(out)
    merged: list[tuple[str, dict[str, Any]]] = []
    for name, source, cell in _source_cells(grid, sources, names):
        if name not in data["cells"]:
            raise ValueError(f"{source}: cell {name!r} is not in {out}: merge whole cells "
                             "(--merge without --methods)")
        last = (cell.get("reruns") or [{}])[-1]
        missing = [m for m in methods if m not in last.get("methods", [])]
        if missing:
            raise ValueError(f"{source}: the last re-run of {name!r} ran "
                             f"{last.get('methods', [])}, not {missing}: only methods it "
                             "ran can be merged method by method (--cells picks cells)")
        when = last.get("finished_utc") or ""
        for done in data["cells"][name].get("reruns", []):
            if not set(methods) & set(done["methods"]):
                continue
            if (done.get("finished_utc") or "") >= when:
                raise ValueError(f"{source}: {out} has {name!r}'s re-run of {done['methods']} "
                                 f"finished {done.get('finished_utc')}, not older than this "
                                 f"one ({when or 'undated'}): already merged, or newer")
        # the copy's cell is whole: its shared settings must be the file's
        _check_same_cell(data["cells"][name]["settings"], cell["settings"], methods)
        changed = {k: cell["settings"][k] for k in last.get("replaced_settings", {})
                   if k in cell["settings"]}
        result = {"runs": [r for r in cell["runs"] if r["method"] in methods],
                  "settings": changed, "runtime_s": last["runtime_s"],
                  "finished_utc": last.get("finished_utc")}
        entry = rerun_cell(data["cells"][name], result, list(methods), grid["rules"])
        entry["reruns"][-1].update(ran=list(last["methods"]), merged_from=str(source))
        merged.append((name, entry))
    for name, cell in merged:
        merge(out, grid, name, cell)
    return [name for name, _ in merged]


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def estimate(grid: Mapping[str, Any], data: Mapping[str, Any],
             task_factor: Mapping[str, float] | None = None) -> dict[str, Any]:
    """The whole grid's wall time on this machine, extrapolated from the finished cells.

    A method's run costs its mean wall time over the finished cells' runs of the same task
    (a fixed code not run yet: ``grouped-rs:2``'s times ``(s + 1) / 3``, the partitions per
    client), times ``cohort / 20`` (clients per round); a task with no finished cell yet
    costs digits-logreg's times the task's factor (its wall time per wait-for-all run over
    digits-logreg's, from ``results/compare_target_dev_TASK.json`` when it exists). A cell
    runs each method on the evaluation seeds, every multiple of ``deadline_grid`` but 1 for
    deadline-best, and wait-for-all and FedBuff's tuning settings (``fedbuff_tune``: the
    lists', or the mean number tried where finished cells grew them) and first-k's
    (``first_k_tune``: its list) on the development seeds."""
    walls: dict[str, dict[str, list[float]]] = {}
    for cell in data["cells"].values():
        scale = 20.0 / max(1, cell["settings"]["cohort"])
        own = walls.setdefault(cell["settings"].get("task", "digits-logreg"), {})
        for run in cell["runs"]:
            own.setdefault(run["method"], []).append(run["wall_s"] * scale)
    by_task = {task: {m: _mean(w) for m, w in methods.items()}
               for task, methods in walls.items()}
    if not by_task:
        return {"whole_grid_s": None, "reason": "no cell finished yet"}
    per_run = by_task.get("digits-logreg") or next(iter(by_task.values()))
    factors = dict(task_factor or _task_factors(per_run.get("wait-for-all")))
    seeds = len(grid["seeds"]["evaluation"])
    dev = len(grid["seeds"]["development"])
    extra_deadlines = len([m for m in grid["rules"]["deadline_grid"] if m != 1.0])
    rules = grid["rules"]
    # FedBuff's tuning: the lists' settings, or where finished cells grew them (amendment 16)
    # the mean number of settings those tried
    grown = [len(c["settings"]["fedbuff"]["tuning"]["grid"]) for c in data["cells"].values()
             if "extensions" in c["settings"].get("fedbuff", {}).get("tuning", {})]
    fedbuff_settings = ((_mean(grown) or len(rules["fedbuff_tune_server_lr"])
                         * len(rules["fedbuff_tune_buffer_fraction"]))
                        if rules.get("fedbuff_tune") else 0)

    def run_s(table: Mapping[str, float | None], method: str) -> float:
        fallback = _mean([w for w in table.values() if w is not None]) or 0.0
        if table.get(method) is not None:
            return float(table[method])
        if ":" in method and table.get("grouped-rs:2") is not None:
            return float(table["grouped-rs:2"]) * (int(method.split(":")[1]) + 1) / 3
        return table.get("deadline", fallback) if method == "deadline-best" else fallback

    cells: dict[str, float] = {}
    for cell in grid_cells(grid):
        own = cell["task"] in by_task
        table = by_task[cell["task"]] if own else per_run
        factor = (1.0 if own else factors.get(cell["task"], 1.0)) * cell["cohort"] / 20.0
        total = dev * run_s(table, "wait-for-all")
        for method in grid_methods(grid, cell["cohort"], cell):
            total += seeds * run_s(table, method)
            if method == "deadline-best":
                total += seeds * extra_deadlines * run_s(table, "deadline")
            if method == "fedbuff":
                total += dev * fedbuff_settings * run_s(table, "fedbuff")
            if method == "first-k" and rules.get("first_k_tune"):
                total += dev * len(rules["first_k_tune_overcommit"]) * run_s(table, "first-k")
        cells[cell["name"]] = total * factor
    remaining = sum(s for name, s in cells.items() if name not in data["cells"])
    return {"whole_grid_s": sum(cells.values()), "remaining_s": remaining,
            "per_cell_s": cells, "task_factor": factors,
            "per_run_s_at_cohort_20": per_run,
            "per_run_s_at_cohort_20_by_task": by_task,
            "formula": "per cell: (development seeds x (wait-for-all + FedBuff's tuning "
                       "settings) + evaluation seeds x "
                       "(each method + the deadline-best grid's other deadlines)) x the mean "
                       "wall time of the method's runs in the finished cells of the task, "
                       "scaled to cohort 20, x cohort / 20 (a task with no finished cell: "
                       "digits-logreg's runs x the task's factor); one process, torch on "
                       "one thread, this machine (2 cores shared); a FedBuff tuning run "
                       "costs what the finished FedBuff runs did (a smaller K takes more "
                       "server steps, each evaluated: an underestimate; its settings: the "
                       "lists', or the mean number tried where finished cells grew them "
                       "past an edge pick, fedbuff_tune_extend); re-runs of finished cells "
                       "are not counted"}


def _task_factors(digits_wfa: float | None) -> dict[str, float]:
    """A CNN task's wall time per wait-for-all run over digits-logreg's (the development
    target runs of ``results/compare_target_dev_TASK.json``)."""
    factors = {}
    results = Path(__file__).resolve().parents[1] / "results"
    for path in sorted(results.glob("compare_target_dev_*.json")):
        task = path.stem.removeprefix("compare_target_dev_")
        runs = json.loads(path.read_text())["runs"]
        walls = [r["wall_s"] for r in runs if r["method"] == "wait-for-all"]
        if walls and digits_wfa:
            factors[task] = _mean(walls) / digits_wfa
    return factors


def _coded(method: str) -> bool:
    return method not in (*RIVALS, "deadline", "deadline-best")


def _deadline_best(method: str) -> bool:
    return method == "deadline-best"


def _stated_deadline(method: str) -> bool:
    return method in ("deadline", "deadline-best") or _coded(method)


#: the settings a cell records from some of its methods only (key -> whether a method gives
#: it; every other key is the cell's, shared by all): a re-run of other methods leaves them
#: as they are (:func:`rerun_cell`)
SETTING_SOURCES: dict[str, Callable[[str], bool]] = {
    "fedbuff": lambda m: m == "fedbuff",
    "first_k": lambda m: m == "first-k",
    "auto_approximate": lambda m: m == "auto-approximate",
    "rivals_stop_dropped_work": lambda m: m in ("deadline", "deadline-best", "first-k"),
    "auto_stop_at_decode": lambda m: m in ("auto", "auto-approximate"),
    "codes_stop_at_decode": lambda m: ":" in m,
    "codes_own_deadline": lambda m: ":" in m,
    "code_deadlines_s": lambda m: ":" in m,
    "code_deadline_rule": lambda m: ":" in m,
    "stated_deadline_s": _stated_deadline,
    "deadline_rule": _stated_deadline,
    "coded_straggler_timeout_s": _coded,
    "coded_straggler_timeout_rule": _coded,
    "deadline_best_s": _deadline_best,
    "deadline_grid_s": _deadline_best,
    "deadline_grid_results": _deadline_best,
    "deadline_grid_read_back": _deadline_best,
    "deadline_grid_grown": _deadline_best,
}


#: settings every method of a cell shares: a re-run of some methods must have the cell's
SHARED_SETTINGS = ("task", "latency", "n", "cohort", "rounds", "target", "seeds", "dev_seeds",
                   "measured_partition_cost_s")


def _check_same_cell(old: Mapping[str, Any], new: Mapping[str, Any],
                     methods: Sequence[str]) -> None:
    """Refuse a re-run of ``methods`` made under other shared settings, or another run-config
    key a rival reads, than the cell's other runs (their runs would not compare); a key only
    coded runs read (an amendment to ``auto``) may differ and is recorded as replaced. Only
    the settings ``new`` holds are compared (a merge from a copy passes those its re-run
    changed)."""
    from fl_gradcode.config.keys import coded_only_keys

    differ = {k: (old[k], new[k]) for k in SHARED_SETTINGS
              if k in old and k in new and old[k] != new[k]}
    before, after = old.get("run_config") or {}, new.get("run_config") or {}
    coded = set(coded_only_keys())
    differ.update({f"run_config[{k!r}]": (before.get(k), after.get(k))
                   for k in sorted({*before, *after} - coded)
                   if "run_config" in old and "run_config" in new
                   and before.get(k) != after.get(k)})
    if differ:
        raise ValueError(
            f"a re-run of {list(methods)} in cell {old.get('task')}/{old.get('latency')}/"
            f"{old.get('n')}x{old.get('cohort')} differs from the cell's other runs in "
            + ", ".join(f"{k} ({a!r} there, {b!r} here)" for k, (a, b) in differ.items())
            + ": run the whole cell again (without --rerun)")


def rerun_cell(existing: Mapping[str, Any], result: Mapping[str, Any],
               methods: Sequence[str], rules: Mapping[str, Any]) -> dict[str, Any]:
    """A finished cell with ``methods`` run again (``result``: those methods' runs on the same
    cell and seeds): their runs replaced, the new deadline facts kept, the summary redone,
    and the re-run recorded under ``reruns`` with the settings it changed as they were
    (``replaced_settings``: key -> old value), so an amendment's effect stays readable."""
    _check_same_cell(existing["settings"], result["settings"], methods)
    runs = [r for r in existing["runs"] if r["method"] not in methods] + list(result["runs"])
    # a method's own settings change only with its runs (FedBuff's tuned pick stays when
    # another method runs again)
    facts = {k: v for k, v in result["settings"].items()
             if k not in ("methods", "quick", "set")
             and (k not in SETTING_SOURCES or any(map(SETTING_SOURCES[k], methods)))}
    settings = {**existing["settings"], **facts}
    old, new = (s.get("code_deadlines_s") or {} for s in (existing["settings"], facts))
    if old or new:  # per code: the codes run again have theirs (if any), the others keep
        settings["code_deadlines_s"] = {**{m: d for m, d in old.items() if m not in methods},
                                        **{m: d for m, d in new.items() if m in methods}}
    ran = [*existing["settings"].get("methods", []), *methods]
    settings["methods"] = list(dict.fromkeys(ran))  # the cell's, then any first run here
    # keys the re-run sets for the first time were absent (None)
    replaced = {k: existing["settings"].get(k) for k in [*facts, "code_deadlines_s"]
                if k in settings and existing["settings"].get(k) != settings[k]}
    reruns = [*existing.get("reruns", []),
              {"methods": list(methods), "finished_utc": result.get("finished_utc"),
               "runtime_s": result["runtime_s"], "replaced_settings": replaced}]
    return {**existing, "settings": settings, "runs": runs,
            "summary": summarize(runs), "reruns": reruns}


def set_aside(grid: Mapping[str, Any], cell: Mapping[str, Any],
              entry: Mapping[str, Any]) -> dict[str, Any]:
    """A finished cell without the runs of fixed codes that train another model there
    (:func:`off_problem`): they move to ``set_aside_runs``, and every such code of the grid
    (run or not) is named in ``methods_set_aside`` (method -> why); the summary is redone
    without them."""
    methods = {*grid_methods(grid, int(cell["cohort"])), *(r["method"] for r in entry["runs"])}
    own = entry.get("settings", {}).get("run_config")
    why = {m: off_problem(grid, cell, m, own) for m in sorted(methods)}
    why = {m: reason for m, reason in why.items() if reason is not None}
    if not why:
        return dict(entry)
    kept = [r for r in entry["runs"] if r["method"] not in why]
    moving = len(kept) < len(entry["runs"])
    # a (method, seed) set aside again replaces its earlier run
    by_run = {(r["method"], r["seed"]): r for r in entry.get("set_aside_runs", [])}
    by_run.update({(r["method"], r["seed"]): r for r in entry["runs"] if r["method"] in why})
    moved = list(by_run.values())
    settings = {**entry["settings"],
                "methods": [m for m in entry["settings"].get("methods", []) if m not in why]}
    return {**entry, "settings": settings, "runs": kept,
            # nothing moved: the runs, so the summary, are as they were
            "summary": (summarize(kept) if moving
                        else entry["summary"]) if entry.get("summary") else {},
            "set_aside_runs": moved,
            "methods_set_aside": {**entry.get("methods_set_aside", {}), **why}}


def journal_path(out: Path, name: str) -> Path:
    """Where a cell of ``out`` keeps its finished runs until it is merged
    (:class:`experiments.journal.Journal`): ``OUT.journal/TASK_LATENCY_NxC.jsonl``."""
    return out.with_name(out.stem + ".journal") / (name.replace("/", "_") + ".jsonl")


def check_grid(grid: Mapping[str, Any], patterns: str, methods: Sequence[str] | None = None,
               rerun: bool = False) -> list[str]:
    """The cells ``patterns`` name, after refusing (``ValueError``), before any run, what no
    cell could run: ``--rerun`` without ``--methods``, a pattern matching no cell, a method
    that is not one (:func:`experiments.compare.check_methods`), a fixed code a chosen cell
    sets aside (:func:`off_problem`)."""
    if rerun and not methods:
        raise ValueError("--rerun needs --methods: the methods to run again in the cells "
                         "already in --out")
    chosen = cell_names(grid, patterns)
    check_methods(list(methods or []))
    if grid["rules"].get("fedbuff_tune") and "fedbuff" in (methods or grid_methods(grid, 1)):
        check_tuning_lists(grid["rules"])
    if grid["rules"].get("first_k_tune") and "first-k" in (methods or grid_methods(grid, 1)):
        check_overcommit_list(grid["rules"])
    by_name = {c["name"]: c for c in grid_cells(grid)}
    for name in chosen:
        for method in methods or []:
            reason = off_problem(grid, by_name[name], method)
            if reason is not None:
                raise ValueError(f"--methods {method!r} in {name}: {reason}; the grid sets "
                                 "it aside there (experiments.run_grid.off_problem)")
    return chosen


def run_grid(grid: Mapping[str, Any], patterns: str, out: Path,
             methods: Sequence[str] | None = None, rerun: bool = False) -> int:
    """Run the cells matching ``patterns`` one after the other, merging each into ``out``.
    ``rerun``: a cell already in ``out`` runs only ``methods`` again (their runs replaced,
    the other methods' kept: for a change that touches only those methods); a cell not in
    ``out`` runs every method of the grid."""
    chosen = check_grid(grid, patterns, methods, rerun)
    done = _load(out)["cells"] if rerun else {}
    by_name = {c["name"]: c for c in grid_cells(grid)}
    rounds = int(grid["scale"]["rounds"])
    seeds, dev = list(grid["seeds"]["evaluation"]), list(grid["seeds"]["development"])
    for name in chosen:
        cell = by_name[name]
        task = grid["tasks"][cell["task"]]
        if "target" not in task:
            merge(out, grid, skipped={name: "the task has no target in experiments/grid.toml "
                                            "yet (fixed from development runs first)"})
            print(f"grid: {name} skipped (no target)")
            continue
        full = grid_methods(grid, cell["cohort"], cell)
        again = rerun and name in done
        chosen_methods = check_methods(list(methods) if methods and (again or not rerun)
                                       else full)
        started = _dt.datetime.now(_dt.UTC)
        journal = journal_path(out, name)
        result = run_cell(grid, cell["task"], cell["latency"], cell["n"], cell["cohort"],
                          rounds, seeds, dev, chosen_methods,
                          task_target(task, cell["n"], cell["cohort"]),
                          journal=journal, finished=done[name] if again else None)
        result = {**result, "started_utc": started.isoformat(timespec="seconds"),
                  "finished_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
                  "methods_not_run": [m for m in full if m not in chosen_methods]}
        if again:
            result = rerun_cell(done[name], result, chosen_methods, grid["rules"])
        merge(out, grid, name, result)
        journal.unlink(missing_ok=True)  # merged: the finished runs live in out now
        if not any(journal.parent.iterdir()):
            journal.parent.rmdir()
        print_summary(result)
        print(f"grid: {name} done in {result['runtime_s']:.1f} s, merged into {out}")
    return 0
