"""The registry side of the benchmark: the pre-registered grid file (``experiments/grid.toml``),
a cell's run config and rivals' rules (:func:`grid_cell`), the compute a task is charged
(:func:`charge_at`, :func:`charge_once`), and the checks a cell, its fixed codes and its
runs' configs pass before any run (:func:`check_cell`, :func:`code_fit`, :func:`check_codes`,
:func:`check_builds`).

:mod:`experiments.compare` (the command) re-exports these names.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from experiments.compare_cli import RIVAL_RULES
from experiments.journal import Journal
from experiments.rival_runs import (
    FEDBUFF_METHODS,
    METHOD_NAMES,
    RIVALS,
    Cell,
    coded_config,
    coded_strategy,
    parse_code,
    rival_strategy,
)
from fl_gradcode.codes.cohort import Fallback
from fl_gradcode.config.keys import KEYS

__all__ = [
    "COMPUTE_KEYS",
    "GRID",
    "built_code",
    "cell_own_keys",
    "cell_rules",
    "cell_run_config",
    "charge_at",
    "charge_once",
    "check_builds",
    "check_cell",
    "check_codes",
    "check_methods",
    "code_fit",
    "grid_cell",
    "grid_code_k",
    "load_grid",
    "lookup",
    "needs_stated_deadline",
    "registry_config",
    "task_target",
    "with_rules",
]

GRID = Path(__file__).with_name("grid.toml")


def load_grid(path: Path = GRID) -> dict[str, Any]:
    """The pre-registered grid (``experiments/grid.toml``)."""
    with open(path, "rb") as fh:
        return tomllib.load(fh)


def lookup(grid: Mapping[str, Any], kind: str, name: str) -> dict[str, Any]:
    """The table ``[kind.name]`` (``kind``: ``tasks`` or ``latency``); a placeholder or an
    unknown name is refused, naming the ones there are."""
    tables = grid.get(kind, {})
    if name not in tables:
        raise ValueError(f"unknown {kind.rstrip('s')} {name!r}; experiments/grid.toml has "
                         f"{sorted(tables)}")
    table = tables[name]
    if table.get("placeholder"):
        raise ValueError(f"{kind} {name!r} is a placeholder in experiments/grid.toml (its run "
                         "config is not defined yet): fill its table in, or pick another")
    return dict(table)


#: The registry entry a table of each kind names: (its key, fl_gradcode.tasks' lookup).
_ENTRY = {"tasks": "task", "latency": "regime"}


def registry_config(kind: str, name: str, table: Mapping[str, Any]) -> dict[str, Any]:
    """The run config of the table ``[kind.name]``: the :mod:`fl_gradcode.tasks` entry it
    names (``task = ...`` -> ``make_task(...).config``, ``regime = ...`` ->
    ``make_regime(...)``) and the table's own ``run_config`` keys, which may add keys but not
    restate the entry's (a task or regime is declared once)."""
    from fl_gradcode.tasks import make_regime, make_task

    field = _ENTRY[kind]
    if field not in table:
        raise ValueError(f"[{kind}.{name}] in experiments/grid.toml names no entry of "
                         f"fl_gradcode.tasks: add {field} = \"...\"")
    entry = str(table[field])
    base = dict(make_task(entry).config) if kind == "tasks" else make_regime(entry)
    extra = dict(table.get("run_config", {}))
    restated = sorted(set(extra) & set(base))
    if restated:
        raise ValueError(f"[{kind}.{name}] in experiments/grid.toml restates {restated}, "
                         f"already set by fl_gradcode.tasks' {entry!r}: declare them once "
                         "(drop them from the table, or change the registry entry)")
    return {**base, **extra}


def cell_run_config(grid: Mapping[str, Any], task: str, latency: str,
                    sets: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A cell's run config: ``{**regime, **task, **sets}`` (``latency=''``: no regime, the key
    table's defaults), each from :func:`registry_config`."""
    regime = (registry_config("latency", latency, lookup(grid, "latency", latency))
              if latency else {})
    return {**regime, **registry_config("tasks", task, lookup(grid, "tasks", task)),
            **(sets or {})}


def cell_own_keys(grid: Mapping[str, Any], task: str, latency: str,
                  sets: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The keys a cell sets itself: its grid tables' own ``run_config`` and ``sets`` (not
    the registry entries', which are the main job's)."""
    return {**(lookup(grid, "latency", latency).get("run_config", {}) if latency else {}),
            **lookup(grid, "tasks", task).get("run_config", {}), **(sets or {})}


def grid_cell(grid: Mapping[str, Any], task: str, latency: str, n: int, cohort: int,
              rounds: int, target: float, sets: Mapping[str, Any] | None = None) -> Cell:
    """The :class:`Cell` of ``task`` under ``latency`` at ``(n, cohort)``: its run config
    (:func:`cell_run_config`) and the rivals' rules of the grid file."""
    return Cell(run_config=cell_run_config(grid, task, latency, sets), n=n, cohort=cohort,
                rounds=rounds, target=target, **cell_rules(grid))


def cell_rules(grid: Mapping[str, Any]) -> dict[str, float]:
    """The rivals' rules of the grid file that are :class:`Cell`'s fields (the names
    ``--rule`` takes but the tunings' growth limits, which the tunings read from the rules
    themselves), as numbers."""
    fields = {f.name for f in dataclasses.fields(Cell)}
    return {name: float(grid["rules"][name]) for name in RIVAL_RULES if name in fields}


def with_rules(grid: Mapping[str, Any], rules: Mapping[str, float] | None) -> dict[str, Any]:
    """``grid`` with some of its rivals' rules replaced (``--rule``)."""
    return {**grid, "rules": {**grid["rules"], **(rules or {})}}


def task_target(table: Mapping[str, Any], n: int, cohort: int) -> float:
    """The target accuracy of a task's table at ``(n, cohort)``: the scale's own
    (``targets = {"NxCOHORT" = ...}``, fixed from development seeds where wait-for-all does
    not reach the task's target in the grid's rounds) else the task's ``target``."""
    return float(table.get("targets", {}).get(f"{n}x{cohort}", table["target"]))


#: Run-config keys a partition update's compute depends on (besides the data split): a cell
#: whose ``--set`` changes one is measured, not charged a grid file's ``charge_s``.
COMPUTE_KEYS = frozenset({"dataset", "model", "update", "local-epochs", "batch-size"})


def charge_at(charges: Mapping[str, float], n: int) -> tuple[float | None, str | None]:
    """``(seconds, how)`` charged per partition at ``n`` nodes from a task's ``charge_s``
    (values measured once at some ``n``, fixed in the grid file): the value at ``n``
    (``how`` ``None``: the grid file's own words); at another ``n``, the log-log line through
    the two listed ``n`` around it (or the nearest two, beyond them; with one listed ``n``,
    proportional to the mean partition size, ``1 / n``), so that a cell off the grid charges
    the same on every run instead of a wall-clock measurement taken under whatever load the
    machine has. ``(None, None)``: no ``charge_s`` (the cell measures once)."""
    if not charges:
        return None, None
    if str(n) in charges:
        return float(charges[str(n)]), None
    points = sorted((int(k), float(v)) for k, v in charges.items())
    if len(points) == 1:
        (n0, c0), = points
        return c0 * n0 / n, (f"charge_s of the grid file at n={n0} ({c0:g} s) scaled by the "
                             f"mean partition size (x {n0}/{n}), charged to every method as "
                             "partition-cost-s")
    right = next((i for i, (k, _) in enumerate(points) if k > n), len(points) - 1)
    (n0, c0), (n1, c1) = points[max(right - 1, 0)], points[max(right, 1)]
    slope = (math.log(c1) - math.log(c0)) / (math.log(n1) - math.log(n0))
    value = c0 * (n / n0) ** slope
    return value, (f"charge_s of the grid file at n={n0} and n={n1} ({c0:g} s, {c1:g} s), "
                   f"on the log-log line through them at n={n}, charged to every method as "
                   "partition-cost-s")


def charge_once(cell: Cell, seed: int, journal: Journal | None = None,
                fixed: float | None = None, fixed_how: str | None = None
                ) -> tuple[Cell, dict[str, Any]]:
    """For a cell whose run config says ``virtual-compute=measured-once``: measure one
    partition update once (:func:`fl_gradcode.tasks.charged_measured_cost`, on ``seed``'s
    data) and charge that value to every method and seed of the cell (``partition-cost-s``
    with ``virtual-compute=none``); other cells are returned as they are. ``journal``: the
    value measured by an earlier process of the cell is charged again (measured and kept
    there the first time). ``fixed``: the value measured before any result and stated in
    the grid file (``charge_s`` of the task's table), charged instead of a measurement now:
    a measurement taken while other work shares the machine is slower (twice as slow with
    two other processes on this 2-core machine), and would change the cell's virtual
    times."""
    if str(cell.run_config.get("virtual-compute")) != "measured-once":
        return cell, {}
    from fl_gradcode.tasks import charged_cost, charged_measured_cost

    if fixed is not None:
        charged = charged_cost(fixed)
        facts = {"compute_charge": fixed_how or (
            "measured once on this machine, idle, before any evaluation run, and fixed in "
            "experiments/grid.toml (charge_s of the task), charged to every method as "
            "partition-cost-s")}
    else:
        charged = journal.meta("charge") if journal is not None else None
        if charged is None:
            charged = charged_measured_cost(cell.config(seed), cell.n)
            if journal is not None:
                journal.set_meta("charge", charged)
        facts = {"measured_on_seed": int(seed),
                 "compute_charge": "measured once per cell "
                                   "(fl_gradcode.tasks.charged_measured_cost), charged to "
                                   "every method as partition-cost-s"}
    cell = dataclasses.replace(cell, run_config={**cell.run_config, **charged})
    return cell, {"measured_partition_cost_s": float(charged["partition-cost-s"]), **facts}


def check_methods(methods: Sequence[str]) -> list[str]:
    for method in methods:
        if method not in METHOD_NAMES:
            parse_code(method)  # CODE:s, or a clear error
    return list(methods)


def check_cell(cell: Cell, task: str, seeds: Sequence[int]) -> None:
    """Refuse, before any run, run-config keys the table does not know (or of the wrong
    type), a task whose data cannot be split into ``n`` partitions (e.g. 1,437 digits
    into 1,000 Dirichlet partitions), naming the task and ``n``, and a latency model the
    ServerApp could not build (an unknown name, a parameter out of range)."""
    from fl_gradcode.data import run_partitions
    from server.app import run_latency

    for seed in seeds:
        cfg = cell.config(seed)
        try:
            run_partitions(cfg, cell.n)
        except ValueError as exc:
            if any(str(exc).startswith(f"{key}=") for key in cfg):  # a key's value refused
                raise ValueError(f"task {task!r}: {exc}") from exc
            raise ValueError(f"task {task!r} cannot be split into n={cell.n} partitions "
                             f"(partitioner {cfg['partitioner']!r}, seed {seed}): {exc}; "
                             "use a smaller --n, another partitioner (--set partitioner=iid) "
                             "or a task with more data") from exc
    cfg = cell.config(seeds[0])  # a latency parameter's validity does not depend on the seed
    try:
        run_latency(cfg, cell.n)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"latency {cfg['latency']!r}: {exc}") from exc


@functools.cache
def _cohort_code(code: str, s: int, cohort: int, m: int | None) -> tuple[Any, str | None]:
    """``server.app.cohort_code``, built once per ``(code, s, cohort, m)``."""
    from server.app import cohort_code

    return cohort_code(code, s, cohort, m)


def built_code(code: str, s: int, cohort: int, m: int | None) -> tuple[int, Fallback | None]:
    """``(k, why)`` of the code the ServerApp builds for a cohort: ``why`` is ``None`` when it
    is ``code`` itself, else why it built another (its fallback); each ``(code, s, cohort,
    m)`` is built once. An unknown code name is refused."""
    built, why = _cohort_code(code, s, cohort, m)
    return built.k, why


def grid_code_k(code: str, s: int, cohort: int, m: int | None) -> int:
    """``k`` of the construction the grid's finished runs of ``code`` used: comm-efficient's
    groups of ``s + m`` clients owned ``s + m`` partitions each, ``floor(cohort / (s + m))
    (s + m)`` of them (18 at 20 with ``s + m = 3``), where the ServerApp now builds one
    partition per client (its groups owning their members' partitions); any other code as
    the ServerApp builds it (the same build as :func:`built_code`)."""
    built, _ = _cohort_code(code, s, cohort, m)
    if code == "comm-efficient" and getattr(built, "own_partitions", False):
        load = built.s + built.m
        return cohort // load * load
    return built.k


def code_fit(method: str, n: int, cohort: int, cfg: Mapping[str, Any], *, grid: bool = False
             ) -> tuple[Fallback | None, str | None]:
    """``(fallback, other_model)`` of the fixed code ``method`` (``CODE:s``) in a cell of
    ``n`` nodes sampling ``cohort`` a round, under the run config ``cfg`` (merged):
    ``fallback``, why the ServerApp builds another code than the one named (``frc:2`` for 20
    clients: it runs ``grouped-rs``); ``other_model``, why the code it builds trains another
    model than the cell's other methods. ``None``: no such problem.

    A code with ``k`` partitions for a cohort of ``c`` clients codes the clients' own
    partitions when ``k = c``. Else, with every node in the cohort, the ServerApp split the
    app's whole data into ``k`` partitions (it warned; with ``slow-classes`` it refused): the
    same round only where the update is one full-batch gradient (the round's sum is the full
    gradient however the data is split; local epochs of minibatch SGD on other partitions
    train another model). With sampled cohorts it ran ``grouped-rs`` with the same ``s`` in
    its place (its partitions would be the whole data's, not the cohort's). The ServerApp
    now builds every code with ``k`` = the cohort, so a code it builds trains the cell's
    model; ``grid=True`` judges the construction the grid's finished runs used instead
    (:func:`grid_code_k`), which is how the grid's cells keep the methods they ran."""
    code, s = parse_code(method)
    m = cfg["m"] if code == "comm-efficient" else None  # the other codes take no m
    k, fallback = built_code(code, s, cohort, m)
    if grid:
        k = grid_code_k(code, s, cohort, m)
    slow_classes = int(cfg.get("slow-classes", 0))
    if k == cohort or (n == cohort and cfg["update"] == "gradient" and not slow_classes):
        return fallback, None
    why = (f"the cohort is sampled (of n = {n}): the ServerApp would run grouped-rs in its "
           "place (this code's k partitions would be the whole data's, not the cohort's)"
           if n != cohort else
           f"slow-classes = {slow_classes} gives classes to the slow clients' own partitions, "
           "which k partitions of the data are not (the ServerApp refused it)"
           if slow_classes else
           f"update = {cfg['update']!r} is not one full-batch gradient, so k partitions of "
           "the data train another model")
    return fallback, (f"{method} has k = {k} partitions for a cohort of {cohort}"
                      + (f" (m = {m})" if m is not None else "") + f": {why}")


def check_codes(cell: Cell, methods: Sequence[str]) -> None:
    """Refuse, before any run, a fixed code the ServerApp would not run as named or that
    would train another model than the cell's other methods (:func:`code_fit`): an unknown
    name; a code that cannot take the cohort (``frc:2`` for 20 clients); a code whose ``k``
    partitions are not the cohort's members where that changes the model trained."""
    for method in methods:
        if ":" not in method:
            continue
        fallback, other = code_fit(method, cell.n, cell.cohort, cell.config(0))
        name, s = parse_code(method)
        cfg = cell.config(0)
        built, _ = _cohort_code(name, s, cell.cohort, cfg["m"] if name == "comm-efficient"
                                else None)
        if fallback is None and built.s != s:  # e.g. uncoded, which tolerates no straggler
            raise ValueError(f"{method}: {name} is built with s = {built.s}, not {s}; write "
                             f"{name}:{built.s}")
        if fallback is not None:
            raise ValueError(f"{method}: {fallback.reason} (the ServerApp would run "
                             f"{fallback.code} with s={fallback.s} in its place for a cohort "
                             f"of {fallback.n}; the benchmark runs a code only as named); pick "
                             f"a tolerance the code takes for a cohort of {cell.cohort}, or "
                             "another code")
        if other is not None:
            raise ValueError(f"{other}; pick s with s + m dividing the cohort, or another "
                             "code")


def needs_stated_deadline(methods: Sequence[str], own_timeout: bool) -> bool:
    """Whether a cell runs wait-for-all on its development seeds for the stated deadline:
    for ``deadline`` and ``deadline-best``, and for coded methods unless the cell sets
    ``straggler-timeout`` itself (``own_timeout``)."""
    coded = [m for m in methods if m not in (*RIVALS, "deadline", "deadline-best")]
    return bool({"deadline", "deadline-best"} & set(methods)) or (bool(coded)
                                                                  and not own_timeout)


def check_builds(cell: Cell, methods: Sequence[str], seed: int, own_timeout: bool) -> None:
    """Refuse, before any run, a run config some run of the cell could not be built with
    (the keys' values, checked where the runs check them: the main job's ServerApp and the
    rivals' strategies), naming the method and the run-config keys: a bad ``--set`` value
    fails here, not hours into a cell. Wait-for-all is built where the cell runs it (asked,
    or for the stated deadline: :func:`needs_stated_deadline`); first-k needs ``ceil(c K)``
    nodes. A task charging measured compute is built without measuring it (its runs are
    charged once, :func:`charge_once`)."""
    if cell.run_config.get("virtual-compute") == "measured-once":
        cell = dataclasses.replace(cell, run_config={**cell.run_config,
                                                     "virtual-compute": "none"})

    def refuse(method: str, exc: Exception) -> ValueError:
        text = str(exc)
        named = [f"{k.keyword} is run-config key {k.name!r}" for k in KEYS
                 if k.keyword and k.keyword != k.name and f"{k.keyword}=" in text]
        return ValueError(f"{method} cannot run with this cell's run config: {text}"
                          + (f" ({'; '.join(named)})" if named else ""))

    for method in methods:
        if method in ("auto", "auto-approximate") or ":" in method:
            try:
                coded_strategy(coded_config(method, seed, cell), cell.n)
            except (ValueError, TypeError) as exc:
                raise refuse(method, exc) from exc
    rivals: dict[str, dict[str, Any]] = {}
    waits = "wait-for-all" in methods or needs_stated_deadline(methods, own_timeout)
    if cell.private:  # a plain Flower strategy applies no DP: the wrapper waits for all
        plain = [m for m in methods if m in ("deadline", "deadline-best", "first-k",
                                             *FEDBUFF_METHODS)]
        if plain:
            raise ValueError(
                f"{plain[0]} cannot run with dp={cell.config(seed)['dp']!r}: it is a plain "
                "Flower strategy, which applies no DP; drop it from --methods (under DP the "
                "benchmark runs auto, the fixed codes and wait-for-all, which is then the "
                "wrapper with code 'uncoded' and no deadline, applying the same DP)")
        if waits:
            try:
                coded_strategy(coded_config("uncoded:0", seed, cell), cell.n)
            except (ValueError, TypeError) as exc:
                raise refuse("wait-for-all", exc) from exc
    elif waits:
        rivals["wait-for-all"] = {}  # deadline and deadline-best: the same build
    if "first-k" in methods:
        k = cell.first_k()
        if math.ceil(cell.overcommit * k - 1e-9) > cell.n:
            raise ValueError(f"first-k: sampling ceil({cell.overcommit:g} x {k}) nodes of n = "
                             f"{cell.n} is impossible; use a larger --n")
        rivals["first-k"] = {"k": k, "overcommit": cell.overcommit}
    for fedbuff in FEDBUFF_METHODS:
        if fedbuff in methods:
            rivals[fedbuff] = {"buffer_size": cell.fedbuff_buffer()}
    if "fedbuff-auto" in rivals:  # the main job's s='auto', built as fedbuff-replicated
        from fl_gradcode.flower.asynchronous import auto_keywords

        rule = auto_keywords()
        rivals["fedbuff-auto"].update(replicas=rule.pop("s"), **rule)
    for method, rules in rivals.items():
        try:
            rival_strategy("fedbuff-replicated" if method == "fedbuff-auto" else method,
                           cell.config(seed), cell.n, cohort=cell.cohort, **rules)
        except (ValueError, TypeError) as exc:
            raise refuse(method, exc) from exc
