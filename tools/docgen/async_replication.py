"""The ``async-replication`` blocks: FedBuff over replicated partitions
(``python -m experiments.async_replication``, ``results/async_replication.json``; the grid
file's amendment 23) against FedBuff, ``auto`` and the best rival of each cell read (the
benchmark's cells, and the slow-classes cells of amendment 8), with the goal's test
(:func:`tools.docgen.rivals.verdict`) applied to its runs in ``auto``'s place."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from tools.docgen.auto_lr import paired_text, with_auto_lr
from tools.docgen.core import RESULTS, ROOT, block, ci, load, table
from tools.docgen.rivals import (
    COMPARE,
    EPS,
    GOAL_ACCURACY,
    GOAL_SPEEDUP,
    GOAL_TIME,
    Stats,
    Verdict,
    method_label,
    method_stats,
    reported_cells,
    time_over,
    times_text,
    verdict,
)

ASYNC = "async_replication.json"
WALLCLOCK = "bench_async_wallclock.json"
METHOD = "fedbuff-replicated"


def benchmark_cells(data: Mapping[str, Any], compare: Mapping[str, Any]
                    ) -> dict[str, Mapping[str, Any]]:
    """Every cell the reading may name, by name: ``results/compare.json``'s, then the
    slow-classes files its settings list."""
    cells: dict[str, Mapping[str, Any]] = dict(compare.get("cells", {}))
    for name, path in data.get("settings", {}).get("slow_classes", {}).items():
        if (ROOT / path).exists():
            cells[name] = json.loads((ROOT / path).read_text())
    return cells


def cells_read(read: Mapping[str, Any], cells: Mapping[str, Any], order: Sequence[str]
               ) -> list[str]:
    """The cells of a reading (``read``) that the benchmark has (``cells``), in ``order``
    then the rest."""
    names = [c for c in order if c in read] + [c for c in read if c not in order]
    return [c for c in names if c in cells]


def _read(data: Mapping[str, Any], cells: Mapping[str, Mapping[str, Any]],
          order: Sequence[str]) -> list[tuple[str, dict[str, Stats], Verdict]]:
    """Each cell read, in ``order`` then the rest: ``(name, the stats of the cell's methods
    and of fedbuff-replicated (the pick) and its fixed s, the goal's test with the pick in
    auto's place)``."""
    read = data.get("cells", {})
    out = []
    for name in cells_read(read, cells, order):
        runs = read[name]["runs"]
        stats = {**method_stats(cells[name]), **method_stats({"runs": runs})}
        pick = [r for r in runs if r["method"] == METHOD]
        out.append((name, stats, verdict(name, with_auto_lr(cells[name], pick))))
    return out


def time_text(s: Stats | None) -> str:
    """A method's median time to target and how many seeds reached it (``-``: not run)."""
    if s is None:
        return "-"
    t = "never" if math.isinf(s.median_time) else f"{s.median_time:.1f} s"
    return f"{t} ({s.reached}/{s.seeds})"


def _fixed_one(read: Sequence[tuple[str, dict[str, Stats], Verdict]]) -> str:
    """A sentence on s = 1 fixed a priori (no development seeds) against FedBuff."""
    ratios = [(name, time_over(stats[f"{METHOD}:1"].median_time,
                               stats["fedbuff"].median_time))
              for name, stats, _ in read
              if f"{METHOD}:1" in stats and stats.get("fedbuff") is not None]
    if not ratios:
        return ""
    near = sum(r <= GOAL_TIME * (1 + EPS) for _, r in ratios)
    worst = max(ratios, key=lambda x: x[1])
    return (f" Fixed a priori at s = 1 (no development runs), its median time to target is "
            f"within {GOAL_TIME:g}× of FedBuff's in {near} of {len(ratios)} cells, at worst "
            f"{times_text(worst[1])} FedBuff's ({worst[0]}), and below it in "
            f"{sum(r < 1 for _, r in ratios)}.")


def goal_text(v: Verdict) -> str:
    """The goal's test of a method in auto's place, over the best rival."""
    if v.best is None or v.best_stats is None or v.auto is None:
        return "-"
    return (("✓" if v.met else "✗")
            + f" {time_over(v.auto.median_time, v.best_stats.median_time):.2f}× "
            f"{method_label(v.best)}"
            + ("" if v.accuracy_ok else
               f", accuracy {100 * (v.auto.median_final - v.best_stats.median_final):+.1f} pt"))


def render(data: Mapping[str, Any], cells: Mapping[str, Mapping[str, Any]],
           report: Sequence[str]) -> str | None:
    """A sentence of counts and one row per cell read."""
    read = _read(data, cells, report)
    if not read:
        return None
    rows, unpaired = [], []
    replicated = [(name, stats, v) for name, stats, v in read if data["cells"][name]["s"]]
    met = sum(v.met for *_, v in replicated)
    faster_auto = sum(stats.get("auto") is not None
                      and stats[METHOD].median_time < stats["auto"].median_time
                      for _, stats, _ in replicated)
    twice = sum(v.fast for *_, v in replicated)
    beats_fedbuff = sum(stats.get("fedbuff") is not None
                        and stats[METHOD].median_time < stats["fedbuff"].median_time
                        for _, stats, _ in replicated)
    for name, stats, v in read:
        mine = data["cells"][name]
        if not mine["check"]["reproduces"]:
            unpaired.append(name)
        rows.append([
            name, str(mine["s"]), time_text(stats.get("auto")), time_text(stats.get("fedbuff")),
            time_text(stats[METHOD]), time_text(stats.get(f"{METHOD}:1")),
            time_text(stats.get(f"{METHOD}:2")), paired_text(mine["over_fedbuff"]),
            paired_text(mine["over_auto"]), goal_text(v),
            "-" if v.speedup is None or v.uncoded is None else
            f"{times_text(v.speedup)} {method_label(v.uncoded)}"])
    reported = [c for c in report if c in data.get("cells", {})]
    missing = [c for c in [*report, *data.get("settings", {}).get("slow_classes", {})]
               if c not in data.get("cells", {})]
    n = len(replicated)
    text = (
        f"**FedBuff over replicated partitions** (`{METHOD}`, "
        "`python -m experiments.async_replication`, the grid file's amendment 23, registered "
        "after the benchmark's results and before its own evaluation runs, after probes on "
        "development seeds; its counting rule was settled after a first pass, discarded, of "
        "which two cells' summary lines were seen (both s = 0): every partition held by s + 1 "
        "clients as in gradient coding's cyclic placement, each job the held partition served "
        "least so far, FedBuff's settings as tuned in the cell; s chosen on the development "
        "seeds among 0, 1, 2, s = 0 being FedBuff; evaluation seeds, paired with the "
        f"benchmark's runs): read in {len(read)} cells ({len(reported)} of the "
        f"{len(report)} reported cells, and the slow-classes cells read). The development "
        f"seeds picked s = 0 in {len(read) - n} of them: there it is FedBuff itself, the "
        "same runs, so it meets the goal by construction and is no evidence for replication. "
        f"They picked s ≥ 1 in {n}" + (
            f" ({', '.join(name for name, *_ in replicated)}): there its median time to "
            f"target is below FedBuff's in {beats_fedbuff} of {n} and below auto's in "
            f"{faster_auto} of {n}, and with its runs in auto's place the goal (within "
            f"{GOAL_TIME:g}× of the best rival's median, final accuracy within "
            f"{100 * GOAL_ACCURACY:g} point) is met in {met} of {n}; it is at least "
            f"{GOAL_SPEEDUP:g}× faster than the best rival that does not code in {twice} of "
            f"{n}." if n else ".")
        + _fixed_one(read)
        + " The columns s = 1 and s = 2 are the fixed settings' own runs (what the pick "
        "would have run had the development seeds picked otherwise). A new method beside "
        "the verdict: the verdict and auto stay as registered."
        + (f" Not read yet: {', '.join(missing)}." if missing else "")
        + (f" s = 0 did not reproduce the benchmark's FedBuff run (not paired): "
           f"{', '.join(unpaired)}." if unpaired else
           " In every cell read, s = 0 reproduced the benchmark's FedBuff run of the first "
           "evaluation seed (same draws).")
        + " Medians over the seeds (one that never reached the target counts as ∞); "
        "ratios: geometric mean of the per-seed ratios [95 % interval], `(k/N)` where only "
        "k seeds paired.")
    return text + "\n\n" + table(
        ["cell", "s picked", "auto", "FedBuff", METHOD, "s = 1", "s = 2",
         "pick / FedBuff", "pick / auto", "goal with the pick (over the best rival)",
         "the best rival that does not code, over the pick"], rows)


def render_headline(data: Mapping[str, Any], cells: Mapping[str, Mapping[str, Any]],
                    report: Sequence[str]) -> str | None:
    """One README line: where replication gives FedBuff what it lacks."""
    read = _read(data, cells, report)
    if not read:
        return None
    replicated = [(name, stats, v) for name, stats, v in read if data["cells"][name]["s"]]
    won = "; ".join(
        f"{name}: {time_text(stats[METHOD])} against FedBuff's {time_text(stats.get('fedbuff'))}, "
        f"auto's {time_text(stats.get('auto'))}" for name, stats, _ in replicated)
    return (f"- **Coded asynchrony** (`{METHOD}`: FedBuff whose clients hold s + 1 "
            "partitions as in gradient coding and compute the least-served one; s chosen on "
            "the development seeds, 0 being FedBuff; the grid file's amendment 23, registered "
            "after the benchmark's results, before its own evaluation runs; "
            f"`python -m experiments.async_replication`, {len(read)} cells read): the "
            f"development seeds picked s = 0, FedBuff itself, in {len(read) - len(replicated)} "
            f"and s ≥ 1 in {len(replicated)}"
            + (f" ({won}; median time to target over all seeds, one that never reached it as "
               "∞; (k/N): the seeds that reached it); there it was at least "
               f"{GOAL_SPEEDUP:g}× faster than the best rival that does not code in "
               f"{sum(v.fast for *_, v in replicated)} of {len(replicated)}"
               if replicated else "")
            + " ([docs](docs/adaptive.md#coded-asynchrony-fedbuff-over-replicated-partitions)).")


def _cells() -> tuple[Mapping[str, Any], dict[str, Mapping[str, Any]]] | None:
    if not (RESULTS / ASYNC).exists() or not (RESULTS / COMPARE).exists():
        return None
    data = load(ASYNC)
    return data, benchmark_cells(data, load(COMPARE))


@block("async-replication-headline")
def async_replication_headline() -> str | None:
    got = _cells()
    if got is None:
        return None
    from tools.docgen.async_margin import headline  # it reads this module's files
    from tools.docgen.unseen import headline_sentence

    return (render_headline(*got, reported_cells()) + headline() + headline_sentence()
            + wallclock_sentence())


def wallclock_sentence() -> str:
    """The real-time measurement in Flower's simulation engine
    (``results/bench_async_wallclock.json``), one sentence (empty without it)."""
    if not (RESULTS / WALLCLOCK).exists():
        return ""
    d = load(WALLCLOCK)
    st, summary = d["settings"], d["summary"]

    def part(method: str, label: str, key: str = "ratio_to_flower_fedavg") -> str:
        ratio = summary[method][key]
        return (f"{label} {ratio['geomean']:.2f}×{ci(ratio['ci95'])}"
                if ratio["geomean"] is not None else f"{label} never")

    seeds, slow = st["seeds"], len(st["slow"])
    return (f" In real time, in Flower's simulation engine ({st['n']} SuperNodes, {slow} "
            f"persistently slow; seeds {seeds[0]}–{seeds[-1]}; the main job's "
            f"`asynchronous=true`, [performance](docs/performance.md#asynchronous-rounds-in-"
            f"real-time)), the time to {st['target']:.0%} over Flower's FedAvg's: "
            + ", ".join([part("fedbuff-replicated", f"FedBuff over replicated partitions "
                              f"(s = {st['s']})"),
                         part("fedbuff", "FedBuff"),
                         part("coded", "coded rounds")])
            + "; over FedBuff's: "
            + part("fedbuff-replicated", "replicated", "ratio_to_fedbuff")
            + " (geometric means of per-seed ratios [95 % interval]).")


@block("async-replication")
def async_replication() -> str | None:
    got = _cells()
    return None if got is None else render(*got, reported_cells())
