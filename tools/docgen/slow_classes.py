"""The ``slow-classes`` blocks: the extension of the benchmark in which only the persistently
slow clients hold some classes (run-config ``slow-classes``; ``experiments/grid.toml``,
amendment 8; ``results/compare_slow_classes_C_NxN.json``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tools.docgen.core import RESULTS, block, load, table
from tools.docgen.rivals import (
    GOAL_SPEEDUP,
    GOAL_TIME,
    SHOWN,
    is_code,
    method_label,
    method_stats,
    ratio_text,
    seconds,
    times_text,
    verdict,
)

#: The runs amendment 8 registers, in its order: (slow classes, n).
RUNS: tuple[tuple[int, int], ...] = ((2, 20), (1, 20), (2, 100))


def file_name(classes: int, n: int) -> str:
    return f"compare_slow_classes_{classes}_{n}x{n}.json"


def _present() -> list[tuple[int, int, dict[str, Any]]]:
    return [(c, n, load(file_name(c, n))) for c, n in RUNS if (RESULTS / file_name(c, n)).exists()]


def _row(label: str, method: str, cell: Mapping[str, Any]) -> list[str]:
    stats = method_stats(cell).get(method)
    auto = method_stats(cell).get("auto")
    entry = cell.get("summary", {}).get(method)
    if stats is None:
        return [label, "not run", "-", "-"]
    return [label, f"{seconds(stats.median_time)} ({stats.reached}/{stats.seeds})",
            f"{100 * stats.median_final:.1f} %",
            "—" if method == "auto" else ratio_text(entry, auto)]


def render_cell(classes: int, n: int, cell: Mapping[str, Any]) -> str:
    """One run of the extension: every rival of the grid's table, auto-approximate and the
    fixed code with the lowest median time, then the grid's two readings on it."""
    stats = method_stats(cell)
    codes = [m for m in stats if is_code(m)]
    code = min(codes, key=lambda m: (stats[m].median_time, -stats[m].median_final, m),
               default=None)
    methods = ["auto", "auto-approximate", *SHOWN] + ([code] if code else [])
    s = cell["settings"]
    labels = {"deadline-best": f"deadline-best ({s.get('deadline_best_s', 0):.2f} s)",
              "deadline": f"deadline, stated rule ({s.get('stated_deadline_s', 0):.2f} s)"}
    rows = [_row(labels.get(m, method_label(m)), m, cell) for m in methods if m in stats]
    v = verdict("", cell)
    seeds = s.get("seeds", [])
    head = (f"**{classes} class{'es' if classes > 1 else ''} only with the slow clients, "
            f"n = {n}** "
            f"(`python -m experiments.compare --n {n} --set slow-classes={classes} ...`, "
            f"seeds {seeds[0]}–{seeds[-1]}, target {100 * float(s['target']):.0f} %):")
    reading = []
    if v.auto is not None and v.best is not None:
        reading.append(f"auto's median time is {times_text(v.time_ratio)} the best rival's "
                       f"({method_label(v.best)}): the grid's goal (at most {GOAL_TIME}×, "
                       f"final accuracy within half a point) is {'met' if v.met else 'not met'}")
    if v.uncoded is not None and v.speedup is not None:
        fast = v.speedup >= GOAL_SPEEDUP
        reading.append(f"the best rival that does not code ({method_label(v.uncoded)}) took "
                       f"{times_text(v.speedup)} auto's median time: auto "
                       f"{'is' if fast else 'is not'} at least {GOAL_SPEEDUP:g}× faster")
    legend = ("Median time over the seeds, a seed that never reached the target counting as ∞; "
              "time / auto: the geometric mean of the per-seed ratios over the seeds where "
              "both reached the target [95 % bootstrap interval], `(k/N)` when only k of the "
              "N seeds are, as in the grid's table; the last row is the fixed exact code with "
              "the lowest median time.")
    return (head + "\n\n" + table(["method", "median time to target (reached)",
                                   "median final accuracy", "time / auto [95 %]"], rows)
            + "\n\n" + legend
            + (" On the grid's two readings: " + "; ".join(reading) + "." if reading else ""))


#: A reading added after the runs: FedBuff (and auto) given four times the client work.
LONGER = "compare_slow_classes_2_20x20_fedbuff120.json"


def render_longer(longer: Mapping[str, Any], registered: Mapping[str, Any] | None) -> str:
    """FedBuff given more client work than the registered runs' 30 rounds."""
    stats = method_stats(longer)
    fed, auto = stats.get("fedbuff"), stats.get("auto")
    rounds = longer["settings"]["rounds"]
    base = method_stats(registered).get("auto") if registered else None
    text = (f"A reading added after these runs (`--methods auto,fedbuff --rounds {rounds}`, "
            f"the same seeds, 2 classes at n = 20): given the client work of {rounds} rounds "
            f"instead of 30, FedBuff reached the target on {fed.reached} of {fed.seeds} seeds")
    if fed.reached:
        text += f" (median time {seconds(fed.median_time)})"
    text += (f"; auto in the same runs: {seconds(auto.median_time)} "
             f"({auto.reached}/{auto.seeds})")
    if base is not None:
        text += f", in the registered 30-round runs {seconds(base.median_time)}"
    return text + "."


def render(present: Sequence[tuple[int, int, Mapping[str, Any]]],
           longer: Mapping[str, Any] | None = None) -> str | None:
    if not present:
        return None
    parts = [render_cell(c, n, cell) for c, n, cell in present]
    if longer is not None:
        registered = next((cell for c, n, cell in present if (c, n) == (2, 20)), None)
        parts.append(render_longer(longer, registered))
    return "\n\n".join(parts)


def render_headline(present: Sequence[tuple[int, int, Mapping[str, Any]]]) -> str | None:
    """One README line over the runs of the extension."""
    if not present:
        return None
    parts = []
    for classes, n, cell in present:
        v = verdict("", cell)
        stats = method_stats(cell)
        if v.auto is None or v.uncoded is None:
            continue
        never = [method_label(m) for m in ("deadline", "deadline-best", "first-k", "fedbuff")
                 if m in stats and stats[m].reached == 0]
        parts.append(
            f"{classes} class{'es' if classes > 1 else ''} at n = {n}: auto "
            f"{seconds(v.auto.median_time)} ({v.auto.reached}/{v.auto.seeds}), the best rival "
            f"that does not code {method_label(v.uncoded)} "
            f"{times_text(v.speedup)} auto's time"
            + (f", never reached by {', '.join(never)}" if never else ""))
    if not parts:
        return None
    return ("- **Where only the slow clients hold some classes** (an extension chosen after the "
            "grid's results and registered before its runs, `experiments/grid.toml` amendment "
            "8; not in the verdict above): " + "; ".join(parts)
            + " ([tables](docs/adaptive.md#where-only-the-slow-clients-hold-some-classes)).")


@block("slow-classes")
def slow_classes() -> str | None:
    return render(_present(), load(LONGER) if (RESULTS / LONGER).exists() else None)


@block("slow-classes-headline")
def slow_classes_headline() -> str | None:
    return render_headline(_present())


__all__ = ["RUNS", "file_name", "render", "render_cell", "render_headline"]
