"""The rivals blocks: ``python -m experiments.compare --grid``'s cells (results/compare.json).

``compare-table``: one row per finished cell (task / latency / n x cohort), auto's median time
to target, each rival's time to target over auto's (paired per-seed ratios, as
:func:`experiments.compare.summarize` wrote them), and the verdict of the benchmark's goal;
under it, the cells of the reported set (``[report] cells`` of ``experiments/grid.toml``) not
run yet and the estimated run time. ``compare-verdict``: the same verdicts as sentences (the
cells where auto misses the goal, with the rival and the ratio; the count where it meets it)
and, where stragglers are persistent or heavy-tailed on non-IID data, whether auto is at least
:data:`GOAL_SPEEDUP` times faster than the best rival that does not code.

The goal, from the runs of a cell (evaluation seeds): auto's median time to target is at most
:data:`GOAL_TIME` times the best rival's, the best rival being the lowest median time to target
among :data:`CRITERION_RIVALS` and every fixed code (``CODE:s``), and auto's median final
accuracy is at most :data:`GOAL_ACCURACY` below that rival's. Medians are over the cell's
seeds; a seed that never reached the target counts as an infinite time. A missing
``results/compare.json`` is a grid with no cell finished yet.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fl_gradcode.config import merge_config
from tools.docgen.core import RESULTS, ROOT, block, load, table

COMPARE = "compare.json"
GRID_FILE = ROOT / "experiments" / "grid.toml"
#: the rival columns, in order (then the best fixed code)
SHOWN = ("wait-for-all", "deadline", "deadline-best", "first-k", "fedbuff")
#: the rivals the goal is measured against, besides every fixed code (``deadline``, the
#: stated rule, is shown but its hindsight-best version stands for it)
CRITERION_RIVALS = ("wait-for-all", "deadline-best", "first-k", "fedbuff")
GOAL_TIME = 1.05
GOAL_ACCURACY = 0.005
GOAL_SPEEDUP = 2.0
#: latency regimes with persistent or heavy-tailed stragglers
HARD_REGIMES = ("persistent", "pareto")
EPS = 1e-9
_HEADER = {"wait-for-all": "wait-for-all", "deadline": "deadline",
           "deadline-best": "deadline-best", "first-k": "first-k", "fedbuff": "FedBuff"}


def is_code(method: str) -> bool:
    """A fixed exact code (``CODE:s``)."""
    return ":" in method


def median(values: Sequence[float]) -> float:
    """The median (``inf`` allowed: a seed that never reached the target)."""
    ordered = sorted(values)
    if not ordered:
        return math.inf
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


@dataclass(frozen=True)
class Stats:
    """One method of one cell, over its seeds."""

    median_time: float  # inf where the median seed never reached the target
    median_final: float
    reached: int
    seeds: int


def method_stats(cell: Mapping[str, Any]) -> dict[str, Stats]:
    """Every method's :class:`Stats` from the cell's runs."""
    times: dict[str, list[float]] = {}
    finals: dict[str, list[float]] = {}
    for run in cell.get("runs", []):
        t = run.get("time_to_target")
        times.setdefault(run["method"], []).append(math.inf if t is None else float(t))
        finals.setdefault(run["method"], []).append(float(run.get("final_accuracy") or 0.0))
    return {m: Stats(median(ts), median(finals[m]), sum(math.isfinite(t) for t in ts), len(ts))
            for m, ts in times.items()}


def best_method(stats: Mapping[str, Stats], methods: Sequence[str]) -> str | None:
    """The method of ``methods`` with the lowest median time, then the highest median final
    accuracy, then its name."""
    present = [m for m in methods if m in stats]
    if not present:
        return None
    return min(present, key=lambda m: (stats[m].median_time, -stats[m].median_final, m))


@dataclass(frozen=True)
class Verdict:
    """The goal on one cell."""

    name: str
    auto: Stats | None
    best: str | None  # the best rival (None: no rival run)
    best_stats: Stats | None
    time_ratio: float | None  # auto's median time over the best rival's (inf: only it reached)
    time_ok: bool
    accuracy_ok: bool
    uncoded: str | None  # the best rival that does not code
    speedup: float | None  # the best uncoded rival's median time over auto's
    hard: bool  # persistent or heavy-tailed stragglers on non-IID data

    @property
    def fast(self) -> bool:
        """At least :data:`GOAL_SPEEDUP` times faster than the best rival that does not
        code."""
        return self.speedup is not None and self.speedup >= GOAL_SPEEDUP * (1 - EPS)

    @property
    def met(self) -> bool:
        return self.auto is not None and self.best is not None and self.time_ok \
            and self.accuracy_ok


def time_over(a: float, b: float) -> float:
    """``a / b`` for times (``inf`` allowed; both infinite: 1, neither reached)."""
    if math.isinf(a) and math.isinf(b):
        return 1.0
    if math.isinf(a):
        return math.inf
    return a / b if b > 0 else math.inf


def meets_goal(mine: Stats, best: Stats) -> tuple[bool, bool]:
    """``(time_ok, accuracy_ok)``: ``mine``'s median time to target at most
    :data:`GOAL_TIME` times ``best``'s, its median final accuracy at most
    :data:`GOAL_ACCURACY` below ``best``'s."""
    return (mine.median_time <= GOAL_TIME * best.median_time * (1 + EPS),
            mine.median_final >= best.median_final - GOAL_ACCURACY - EPS)


def verdict(name: str, cell: Mapping[str, Any]) -> Verdict:
    """The goal's verdict on ``cell`` (see the module's docstring)."""
    stats = method_stats(cell)
    auto = stats.get("auto")
    rivals = [m for m in stats if m in CRITERION_RIVALS or is_code(m)]
    best = best_method(stats, rivals)
    uncoded = best_method(stats, [m for m in rivals if not is_code(m)])
    s = cell.get("settings", {})
    # as the run read it (a key the cell leaves unset is the key table's default)
    partitioner = str(merge_config(s["run_config"])["partitioner"]) if "run_config" in s else ""
    hard = s.get("latency") in HARD_REGIMES and partitioner not in ("", "iid")
    if auto is None or best is None:
        return Verdict(name, auto, best, stats.get(best or ""), None, False, False, uncoded,
                       None, hard)
    b = stats[best]
    speedup = None if uncoded is None else time_over(stats[uncoded].median_time, auto.median_time)
    return Verdict(
        name, auto, best, b, time_over(auto.median_time, b.median_time),
        *meets_goal(auto, b), uncoded=uncoded, speedup=speedup, hard=hard)


# ---------------------------------------------------------------- formatting
def method_label(method: str) -> str:
    return _HEADER.get(method, method)


def times_text(value: float) -> str:
    return "∞" if math.isinf(value) else f"{value:.2f}×"


def seconds(value: float) -> str:
    return "∞" if math.isinf(value) else f"{value:.1f} s"


def stats_cell(stats: Stats | None) -> str:
    """A method's median time to target and how many seeds reached it (``not run``)."""
    if stats is None:
        return "not run"
    return f"{seconds(stats.median_time)} ({stats.reached}/{stats.seeds})"


def ratio_text(entry: Mapping[str, Any] | None, auto: Stats | None) -> str:
    """``geomean [lo, hi]`` with ▼ (interval below 1) or ▽ (only the mean below 1) when every
    seed paired, and ``(k/N)`` (no mark) when only k of the N seeds are; one pair alone has
    no interval."""
    if entry is None:
        return "not run"
    ratio = entry.get("time_to_target_vs_auto", {})
    seeds = int(entry.get("seeds", 0))
    reached = int(entry.get("reached_target", 0))
    if ratio.get("geomean") is None:
        if reached == 0:
            return "never"
        if auto is not None and auto.reached == 0:
            return f"auto never ({reached}/{seeds}) ▼"
        return f"no pair ({reached}/{seeds})"
    paired = sum(v is not None for v in ratio.get("per_seed", {}).values())
    if paired < 2:  # one pair has no interval
        return f"{ratio['geomean']:.2f} (one pair, {reached}/{seeds} reached)"
    lo, hi = ratio["ci95"]
    # a ratio over the k < N seeds both reached is conditioned on reaching: no mark
    mark = "" if paired < seeds else " ▼" if hi < 1.0 else " ▽" if ratio["geomean"] < 1.0 \
        else ""
    return (f"{ratio['geomean']:.2f} [{lo:.2f}, {hi:.2f}]{mark}"
            + ("" if paired == seeds else f" ({paired}/{seeds})"))


def _verdict_cell(v: Verdict) -> str:
    if v.auto is None:
        return "auto not run"
    if v.best is None:
        return "no rival run"
    both_never = math.isinf(v.auto.median_time) and math.isinf(v.best_stats.median_time)
    ratio = "neither reached the target," if both_never else times_text(v.time_ratio)
    text = f"{'✓' if v.met else '✗'} {ratio} {method_label(v.best)}"
    if not v.accuracy_ok:
        text += f", accuracy {_points(v)}"
    return text


def _points(v: Verdict) -> str:
    return f"{100 * (v.auto.median_final - v.best_stats.median_final):+.1f} pt"


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.0f} h"


# ---------------------------------------------------------------- the data
def grid_data() -> dict[str, Any]:
    with open(GRID_FILE, "rb") as fh:
        return tomllib.load(fh)


def reported_cells() -> list[str]:
    """The reported set, ``[report] cells`` of the grid file, in its order."""
    return list(grid_data().get("report", {}).get("cells", []))


def compare_data() -> dict[str, Any]:
    """``results/compare.json``; a missing file is a grid with no cell finished."""
    if not (RESULTS / COMPARE).exists():
        return {"cells": {}, "done": [], "not_done": [], "estimate": {}}
    return load(COMPARE)


def finished_cells(data: Mapping[str, Any], report: Sequence[str]) -> list[str]:
    """The finished cells: the reported set's in its order, then any other."""
    done = [c for c in data.get("done", data.get("cells", {})) if c in data.get("cells", {})]
    return [c for c in report if c in done] + [c for c in done if c not in report]


def render_table(data: Mapping[str, Any], report: Sequence[str]) -> str:
    """The ``compare-table`` block from a ``results/compare.json``'s content."""
    done = finished_cells(data, report)
    notes = [_progress(data, report, done)]
    if not done:
        return "No cell finished yet. " + notes[0]
    header = ["cell", "auto: median time (reached)", *(method_label(m) for m in SHOWN), "best code",
              f"auto within {GOAL_TIME}× of the best rival"]
    rows = []
    for name in done:
        cell = data["cells"][name]
        v = verdict(name, cell)
        summary = cell.get("summary", {})
        stats = method_stats(cell)
        code = best_method(stats, [m for m in stats if is_code(m)])
        rows.append([name, stats_cell(v.auto),
                     *(ratio_text(summary.get(m), v.auto) for m in SHOWN),
                     "not run" if code is None else
                     f"{code} {ratio_text(summary.get(code), v.auto)}",
                     _verdict_cell(v)])
    first = data["cells"][done[0]]["settings"]
    seeds = first.get("seeds", [])
    legend = (
        f"Rows: cells TASK/LATENCY/N×COHORT, {first.get('rounds')} rounds, seeds "
        f"{seeds[0]}-{seeds[-1]} (evaluation). **auto**: its median time to target over "
        "the seeds, a seed that never reached the target counting as ∞, and how many "
        "reached it. **Rival columns** (and **best code**, the fixed exact code with the "
        "lowest median time to target): the rival's time to target over auto's, geometric "
        "mean of the per-seed ratios [95 % Student-t interval on their logarithms] over "
        "the seeds where both reached the target, `(k/N)` when only k of the N seeds are; "
        "below 1 the rival is faster: ▼ the whole interval, ▽ only the mean, marked only "
        "when every seed paired (over k < N seeds the ratio is conditioned on reaching the "
        "target and does not say which is faster); `never`: the rival never reached "
        "the target; `auto never (k/N) ▼`: auto never did and the rival did on k seeds. "
        f"**Verdict**: ✓ where auto's median time to target is at most {GOAL_TIME}× the best "
        "rival's (the lowest median among wait-for-all, deadline-best, first-k, FedBuff and "
        "every fixed code; the stated-rule deadline is shown, its hindsight-best version "
        f"counted) and auto's median final accuracy is at most {100 * GOAL_ACCURACY:g} point "
        "below that rival's; ✗ otherwise. It shows auto's median time over that rival's and "
        "names it (∞: only the rival reached the target; `neither reached`: the accuracies "
        "decide).")
    not_run = sorted({m for name in done for m in data["cells"][name].get("methods_not_run", [])})
    if not_run:
        notes.append("Not run in some finished cells: " + ", ".join(not_run) + ".")
    aside: dict[str, list[str]] = {}
    for name in done:
        for method in data["cells"][name].get("methods_set_aside", {}):
            aside.setdefault(method, []).append(name)
    for method, names in sorted(aside.items()):
        notes.append(f"Set aside in {len(names)} of {len(done)} finished cells ({method}): "
                     "in the construction the grid ran, its partitions are not the cohort's "
                     "there, so its rounds train another model (`methods_set_aside` of a cell "
                     "says why; the ServerApp now gives every code one partition per client).")
    from tools.docgen.rival_notes import (
        auto_stops,
        codes_own,
        codes_stop,
        deadline_grids,
        fedbuff_tuned,
        first_k_care,
        rival_fixes,
        split_codes,
    )

    notes += split_codes(data, done)
    notes += deadline_grids(data, done)
    notes += rival_fixes(data, done)
    notes += auto_stops(data, done)
    notes += codes_stop(data, done)
    notes += codes_own(data, done)
    notes += fedbuff_tuned(data, done)
    notes += first_k_care(data, done)
    from tools.docgen.biases import codes_deadline, drift_repeats, short_horizons

    notes += short_horizons(data, done)
    notes += codes_deadline(data, done)
    notes += drift_repeats(data, done)
    return table(header, rows) + "\n\n" + " ".join([legend, *notes])


def _progress(data: Mapping[str, Any], report: Sequence[str], done: Sequence[str]) -> str:
    """The reported set's progress: cells finished, cells not run, the run time."""
    cells = data.get("cells", {})
    finished = [c for c in report if c in done]
    missing = [c for c in report if c not in done]
    text = f"Reported set (`[report] cells` of `experiments/grid.toml`): {len(finished)} of " \
           f"{len(report)} cells finished"
    if finished:
        wall = sum(float(cells[c].get("runtime_s", 0.0)) for c in finished)
        again = sum(float(r.get("runtime_s", 0.0)) for c in finished
                    for r in cells[c].get("reruns", []))
        text += f" ({_duration(wall)} of wall time on this machine"
        if again:
            text += (f", and {_duration(again)} more re-running some of their methods after "
                     "amendments of the grid file")
        text += ")"
    text += "." if not missing else "; not run yet: " + ", ".join(missing) + "."
    est = data.get("estimate", {}) or {}
    per_cell = est.get("per_cell_s") or {}
    if missing and all(c in per_cell for c in missing):
        left = sum(float(per_cell[c]) for c in missing)
        text += f" Their estimated run time: about {_duration(left)} on this machine"
        if est.get("whole_grid_s"):
            text += (f" (the whole grid of {len(per_cell)} cells: about "
                     f"{_duration(float(est['whole_grid_s']))})")
        text += (", extrapolated from the finished cells' run times "
                 "(`estimate` in `results/compare.json`).")
    elif missing:
        reason = est.get("reason", "no cell finished yet")
        text += f" No estimate of their run time yet ({reason}: it is extrapolated from " \
                "the finished cells' run times)."
    return text


def render_verdict(data: Mapping[str, Any], report: Sequence[str]) -> str:
    """The ``compare-verdict`` block: the goal's verdicts as sentences."""
    done = finished_cells(data, report)
    if not done:
        return (f"No cell finished yet: the grid's verdicts (auto within {GOAL_TIME}× of the "
                "best rival, and against the best rival that does not code under persistent "
                "or heavy-tailed stragglers) appear here as cells finish.")
    verdicts = [verdict(name, data["cells"][name]) for name in done]
    met = [v for v in verdicts if v.met]
    missed = [v for v in verdicts if not v.met]
    lines = [f"- **auto within {GOAL_TIME}× of the best rival** (median time to target, "
             f"final accuracy within {100 * GOAL_ACCURACY:g} point; evaluation seeds): "
             f"in {len(met)} of the {len(verdicts)} finished cells."
             + ("" if not missed else " Not in: " + "; ".join(_missed(v) for v in missed)
                + ".")]
    beaten_by: dict[str, int] = {}
    for v in missed:
        if v.best is not None:
            beaten_by[method_label(v.best)] = beaten_by.get(method_label(v.best), 0) + 1
    if beaten_by:
        lines.append("- **The best rival where auto misses**: " + ", ".join(
            f"{name} in {count} of {len(missed)}" for name, count in
            sorted(beaten_by.items(), key=lambda kv: (-kv[1], kv[0]))) + ".")
    codes = _against_codes(data, done)
    if codes and beaten_by:
        lines[-1] += " " + codes[0]
    elif codes:
        lines.append("- " + codes[0])
    hard = [v for v in verdicts if v.hard and v.auto is not None and v.uncoded is not None]
    if hard:
        fast = [v for v in hard if v.fast]
        lines.append(
            f"- **Persistent or heavy-tailed stragglers** (latency {', '.join(HARD_REGIMES)}) "
            f"on non-IID partitions: auto is at least {GOAL_SPEEDUP:g}× faster than the best "
            f"rival that does not code ({', '.join(method_label(m) for m in CRITERION_RIVALS)}; "
            f"median time to target) in {len(fast)} of {len(hard)} cells: "
            + "; ".join(f"{v.name} {_speed(v)} ({method_label(v.uncoded)})" for v in hard) + ".")
    else:
        lines.append("- **Persistent or heavy-tailed stragglers** (latency "
                     f"{', '.join(HARD_REGIMES)}) on non-IID partitions: no such cell "
                     "finished yet.")
    return "\n".join(lines)


def _against_codes(data: Mapping[str, Any], done: Sequence[str]) -> list[str]:
    """Whether choosing s online pays: in how many finished cells auto's median time to
    target is within the goal's factor of the best fixed code's (chosen in hindsight), over
    the cells by the care their codes had (:func:`~tools.docgen.rival_notes.codes_care`:
    amendments 19 and 21, 19 only, neither)."""
    from tools.docgen.rival_notes import codes_care

    within: dict[int, list[int]] = {2: [0, 0], 1: [0, 0], 0: [0, 0]}
    for name in done:
        cell = data["cells"][name]
        stats = method_stats(cell)
        code = best_method(stats, [m for m in stats if is_code(m)])
        if code is None or "auto" not in stats:
            continue
        care = codes_care(cell)
        within[care][1] += 1
        within[care][0] += time_over(stats["auto"].median_time,
                                     stats[code].median_time) <= GOAL_TIME * (1 + EPS)
    words = {2: "where the codes stop their late work when their round ends, as auto's does, "
                "and each stops waiting at the deadline rule read from its own clients' times",
             1: "where the codes stop their late work when their round ends but wait until "
                "wait-for-all's deadline",
             0: "whose codes predate both (their clients computed on until wait-for-all's "
                "deadline)"}
    parts = [f"in {k} of the {n} cells {words[care]}" for care, (k, n) in within.items() if n]
    if not parts:
        return []
    return [f"**auto against the best fixed code in hindsight** (its median time to target "
            f"within {GOAL_TIME}× of the fastest code's, time only): " + "; ".join(parts)
            + "."]


def _speed(v: Verdict) -> str:
    """How many times faster auto is than the best uncoded rival."""
    if math.isinf(v.speedup):
        return "∞ (only auto reached the target)"
    if math.isinf(v.auto.median_time):
        return "(auto never reached the target)"
    return f"{v.speedup:.2f}×"


def _missed(v: Verdict) -> str:
    if v.auto is None:
        return f"{v.name} (auto not run)"
    if v.best is None:
        return f"{v.name} (no rival run)"
    rival = method_label(v.best)
    if math.isinf(v.auto.median_time) and not math.isinf(v.best_stats.median_time):
        why = (f"auto's median time to target ∞, {rival}'s "
               f"{seconds(v.best_stats.median_time)}")
    elif math.isinf(v.auto.median_time):
        why = "neither auto nor any rival reached the target (median)"
    else:
        why = f"auto {times_text(v.time_ratio)} {rival}'s median time to target"
    if not v.accuracy_ok:
        why += f", final accuracy {_points(v)} against {rival}'s"
    return f"{v.name} ({why})"


def render(data: Mapping[str, Any], report: Sequence[str]) -> str:
    """The ``compare-table`` block: the verdicts, then the table (with no cell finished:
    only the table's note)."""
    if not finished_cells(data, report):
        return render_table(data, report)
    return render_verdict(data, report) + "\n\n" + render_table(data, report)


@block("compare-table")
def compare_table() -> str:
    return render(compare_data(), reported_cells())


@block("compare-verdict")
def compare_verdict() -> str:
    return render_verdict(compare_data(), reported_cells())


# ---------------------------------------------------------------- the README's first screen
#: The cell of the main job's task and latency regime (digits softmax regression, a fifth of
#: the clients persistently 20x slower) at the grid's smallest scale.
MAIN_CELL = "digits-logreg/persistent/20x20"
_RIVAL_WORDS = {
    "wait-for-all": "FedAvg waiting for every client",
    "deadline": "Flower's FedAvg dropping the replies after the stated-rule deadline",
    "deadline-best": "the same after the best deadline in hindsight",
    "first-k": "first-k over-commitment",
    "fedbuff": "FedBuff (buffered asynchronous aggregation)",
}


def render_headline(data: Mapping[str, Any], report: Sequence[str],
                    deadline: Mapping[str, Any] | None = None,
                    fedbuff: Mapping[str, Any] | None = None) -> str:
    """What the main job's coding buys, loses and costs on the evaluation seeds of
    :data:`MAIN_CELL` (paired geometric-mean ratios, as the table's), and the goal's count
    over every finished cell. ``deadline``: ``results/main_job_deadline.json`` (how the main
    job's deadline was chosen); ``fedbuff``: ``results/main_job_fedbuff.json`` (how its
    FedBuff run's settings were)."""
    from fl_gradcode.config import DEFAULTS

    cell = data.get("cells", {}).get(MAIN_CELL)
    if cell is None:
        return (f"No evaluation result for the main job's regime yet (`{MAIN_CELL}` of "
                "`python -m experiments.compare --grid`).")
    summary, stats = cell["summary"], method_stats(cell)
    auto = stats["auto"]
    seeds = cell["settings"]["seeds"]
    development = grid_data()["seeds"]["development"]
    dev = f"{development[0]}–{development[-1]}"
    ratio = {m: (summary.get(m, {}).get("time_to_target_vs_auto") or {}).get("geomean")
             for m in _RIVAL_WORDS}
    ratio = {m: r for m, r in ratio.items() if r is not None and math.isfinite(r)}
    words = dict(_RIVAL_WORDS)
    decode = cell["settings"].get("auto_stop_at_decode") is True
    if cell["settings"].get("rivals_stop_dropped_work") is True:
        words["deadline"] += (" (its dropped clients stopping their work when the round ends, "
                              "as auto's stop theirs "
                              + ("when its round ends)" if decode else "at its deadline)"))
    wins = [f"{r:.2f}× sooner than {words[m]}" for m, r in ratio.items() if r >= 1]
    reached = {m: (f" on the {stats[m].reached} of {stats[m].seeds} seeds it reached the target"
                   if m in stats and stats[m].reached < stats[m].seeds else "")
               for m in ratio}
    from tools.docgen.fedbuff import per_round_reading  # it reads this module's helpers

    read = (per_round_reading(cell) or {}).get("ratio_vs_auto")
    if read is not None and "fedbuff" in reached:  # read after every step, a round once
        reached["fedbuff"] += (f" ({read:.2f}× read as often as a round is, a reading "
                               "after the results: [docs](docs/adaptive.md#at-a-glance))")
    losses = [f"{words[m]} took {r:.2f}× auto's time{reached[m]}"
              for m, r in ratio.items() if r < 1]
    verdicts = [verdict(c, data["cells"][c]) for c in finished_cells(data, report)]
    met = sum(v.met for v in verdicts)
    wfa = summary.get("wait-for-all", {})
    compute = (wfa.get("client_compute_s_vs_auto") or {}).get("geomean")
    upload = (wfa.get("bytes_up_vs_auto") or {}).get("geomean")
    lines = [
        f"- **Buys** (`python -m experiments.compare`, which runs cell `{MAIN_CELL}` into "
        "`results/compare_cell.json`: the main job's task "
        f"and latency regime at {cell['settings']['n']} clients; evaluation seeds "
        f"{seeds[0]}–{seeds[-1]}, reported only: knobs tuned on the development seeds, but for "
        "the hindsight-best deadline and the amendments the grid file lists): `s=\"auto\"`"
        + (" (with `stop-late-work=\"decode\"`, virtual time only: late work stops when a "
           "round ends; the grid file's amendment 15)" if decode else "") + " reached "
        f"{cell['settings']['target']:.0%} test accuracy in a median {seconds(auto.median_time)}"
        f" of virtual time ({auto.reached}/{auto.seeds} seeds), "
        + ("; ".join(wins) if wins else "sooner than no rival")
        + " (geometric means of per-seed ratios).",
        "- **Loses**: " + ("; ".join(losses) if losses else "to no rival in this cell")
        + f". Over the {len(verdicts)} finished cells auto is within {GOAL_TIME:g}× of the best "
        f"rival in {met}: the table below says where it is not.",
    ]
    if compute is not None and upload is not None:
        lines.append(
            f"- **Costs**: a coded client computes up to `s+1` partitions a round: auto's "
            f"clients computed {1 / compute:.2f}× wait-for-all's client compute over the "
            f"{cell['settings']['rounds']} rounds, and uploaded {1 / upload:.2f}× its bytes.")
    lines.append(
        "- **How the defaults were chosen**: `s-max` and `auto-margin` by the rule in "
        f"`experiments/grid.toml` on the development seeds {dev}; "
        + (f"the main job's deadline (`straggler-timeout`, {deadline['straggler_timeout_s']:g} "
           "s) by the grid file's stated deadline rule on the same seeds in the main job's own "
           f"setting ({deadline['settings']['n']} clients; `python -m "
           "experiments.main_job_deadline`); " if deadline else "the main job's deadline; ")
        + (f"its FedBuff run's server lr ({fedbuff['server_lr']:g}) and buffer "
           f"(K = {fedbuff['buffer_size']}) by the benchmark's FedBuff tuning rule on the same "
           "seeds and setting (`python -m experiments.main_job_fedbuff`, amendment 31); "
           if fedbuff else "")
        + "its "
        + f"latency regime by `experiments/first_hour.py`, also on seeds {dev} ([its "
        "results](docs/results.md#the-main-jobs-regimes-experimentsfirst_hourpy), not a "
        f"headline). The main job below runs on its own seed (`seed`, default "
        f"{DEFAULTS['seed']}): its table is that run's, not this result.")
    return "\n".join(lines)


@block("headline-compare")
def headline_compare() -> str:
    return render_headline(compare_data(), reported_cells(), load("main_job_deadline.json"),
                           load("main_job_fedbuff.json"))
