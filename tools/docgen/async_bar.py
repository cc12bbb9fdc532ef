"""The ``async-bar`` blocks: coded asynchrony whose clients serve a neighbour's partition only
while it falls behind their own (``python -m experiments.async_bar``,
``results/async_bar.json``; the grid file's amendment 24), against FedBuff, amendment 23's
fixed ``s = 1`` and the best rival of each cell read, with the goal's test
(:func:`tools.docgen.rivals.verdict`) applied to its runs in ``auto``'s place."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from tools.docgen.async_replication import (
    ASYNC,
    benchmark_cells,
    cells_read,
    goal_text,
    time_text,
)
from tools.docgen.auto_lr import paired_text, with_auto_lr
from tools.docgen.core import RESULTS, block, load, table
from tools.docgen.rivals import (
    COMPARE,
    EPS,
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

BAR = "async_bar.json"
METHOD = "fedbuff-bar"
FIXED = "fedbuff-replicated:1"


Read = list[tuple[str, dict[str, Stats], Verdict, float | None]]


def read_cells(data: Mapping[str, Any], replication: Mapping[str, Any],
               cells: Mapping[str, Mapping[str, Any]], order: Sequence[str],
               method: str = METHOD, earlier: Mapping[str, Any] | None = None) -> Read:
    """Each cell read, in ``order`` then the rest: ``(name, the stats of the cell's methods,
    amendment 23's s = 1, the reading's ``method`` and an ``earlier`` reading's, the goal's
    test with ``method`` in auto's place, its median over the lower of FedBuff's and
    s = 1's)``."""
    read = data.get("cells", {})
    out = []
    for name in cells_read(read, cells, order):
        runs = read[name]["runs"]
        fixed = [r for r in replication.get("cells", {}).get(name, {}).get("runs", [])
                 if r["method"] == FIXED and method != FIXED]  # s = 1's own reading: once
        before = list((earlier or {}).get("cells", {}).get(name, {}).get("runs", []))
        stats = {**method_stats(cells[name]), **method_stats({"runs": runs + fixed + before})}
        lower = [stats[m].median_time for m in ("fedbuff", FIXED) if m in stats]
        regret = time_over(stats[method].median_time, min(lower)) if lower else None
        out.append((name, stats, verdict(name, with_auto_lr(cells[name], runs)), regret))
    return out


def near_count(read: Read) -> int:
    """How many cells read are within the goal's time of the lower of FedBuff and s = 1."""
    return sum(r is not None and r <= GOAL_TIME * (1 + EPS) for *_, r in read)


def near_fedbuff_count(read: Read, method: str) -> int:
    """How many cells read have ``method``'s median time within the goal's time of
    FedBuff's."""
    return sum(time_over(stats[method].median_time, stats["fedbuff"].median_time)
               <= GOAL_TIME * (1 + EPS) for _, stats, _, _ in read if "fedbuff" in stats)


def worst_cell(read: Read) -> tuple[str, float]:
    """The cell read with the highest ratio to the lower of FedBuff and s = 1, and it
    (``("-", nan)`` when no cell has one)."""
    return max(((name, r) for name, _, _, r in read if r is not None), key=lambda x: x[1],
               default=("-", math.nan))


def counts_text(read: Read, method: str) -> str:
    """The reading's counts: near the lower of FedBuff and s = 1, near FedBuff, the goal,
    the hard cells' speed-up."""
    near = near_count(read)
    worst = worst_cell(read)
    near_fedbuff = near_fedbuff_count(read, method)
    fedbuff_never = sum(math.isinf(stats["fedbuff"].median_time) and
                        math.isfinite(stats[method].median_time)
                        for _, stats, _, _ in read if "fedbuff" in stats)
    met = sum(v.met for _, _, v, _ in read)
    hard = [(name, v) for name, _, v, _ in read if v.hard]
    return (
        f"Read on the evaluation seeds in {len(read)} cells: its median time to target is "
        f"within {GOAL_TIME:g}× of the lower of FedBuff's and s = 1's in {near} of "
        f"{len(read)} (at worst {worst[1]:.2f}×, {worst[0]}), within {GOAL_TIME:g}× of "
        f"FedBuff's in {near_fedbuff}"
        + (f" ({fedbuff_never} where FedBuff's median run never reached the target)"
           if fedbuff_never else "")
        + f"; with its runs in auto's place the goal (within "
        f"{GOAL_TIME:g}× of the best rival's median, final accuracy within 0.5 point) is met "
        f"in {met} of {len(read)}"
        + (f"; where stragglers are persistent or heavy-tailed on non-IID data it is at least "
           f"2× faster than the best rival that does not code in "
           f"{sum(v.fast for _, v in hard)} of {len(hard)}" if hard else ""))


def worst_text(value: float) -> str:
    """A ratio, ``∞`` for infinity."""
    return "∞" if math.isinf(value) else f"{value:.2f}"


def tried_text(dev: Mapping[str, Any]) -> str:
    """Each value tried on the development seeds: its worst and median ratio."""
    return ", ".join(f"{float(t):g}: worst {worst_text(dev['worst'][t])}, median "
                     f"{worst_text(dev['median'][t])}" for t in sorted(dev["worst"], key=float))


def missing_cells(data: Mapping[str, Any], replication: Mapping[str, Any],
                  report: Sequence[str]) -> list[str]:
    """The cells a reading has not read yet."""
    return [c for c in [*report, *data.get("settings", {}).get("slow_classes", {}),
                        *replication.get("settings", {}).get("slow_classes", {})]
            if c not in data.get("cells", {})]


def uncoded_text(v: Verdict) -> str:
    """The best rival that does not code, over the reading's method."""
    return ("-" if v.speedup is None or v.uncoded is None else
            f"{times_text(v.speedup)} {method_label(v.uncoded)}")


FOOTNOTE = ("Medians over the seeds (one that never reached the target counts as ∞); ratios: "
            "geometric mean of the per-seed ratios [95 % interval], `(k/N)` where only k "
            "seeds paired; replicated: the median share of its jobs that computed a "
            "neighbour's partition.")


def share_text(runs: Sequence[Mapping[str, Any]]) -> str:
    """The median share of the jobs that computed another partition than the client's own."""
    shares = [r["replicated"] / max(1, sum(r["updates_per_partition"])) for r in runs
              if "replicated" in r]
    return "-" if not shares else f"{statistics.median(shares):.0%}"


def render(data: Mapping[str, Any], replication: Mapping[str, Any],
           cells: Mapping[str, Mapping[str, Any]], report: Sequence[str]) -> str | None:
    """A sentence on the pick and the counts, and one row per cell read."""
    read = read_cells(data, replication, cells, report)
    dev = data.get("dev")
    if not read or not dev:
        return None
    rows = []
    for name, stats, v, regret in read:
        mine = data["cells"][name]
        rows.append([
            name, time_text(stats.get("fedbuff")), time_text(stats.get(FIXED)),
            time_text(stats[METHOD]),
            paired_text(mine["over_fedbuff"]),
            "-" if mine.get("over_s1") is None else paired_text(mine["over_s1"]),
            "-" if regret is None else f"{regret:.2f}", share_text(mine["runs"]), goal_text(v),
            uncoded_text(v)])
    missing = missing_cells(data, replication, report)
    text = (
        f"**Coded asynchrony that reacts** (`fedbuff-bar`, `python -m experiments.async_bar`, "
        "the grid file's amendment 24, registered after amendment 23's readings and before any "
        "run of its own: the placement s = 1; a client computes its neighbour's partition only "
        "while that partition's jobs are fewer than θ times its own partition's, else its own; "
        "θ = 1 is amendment 23's s = 1, θ = 0 FedBuff; ONE θ for every cell, picked on the "
        f"development seeds of the fifteen cheapest cells by the worst ratio of its median "
        f"time to target to the best of s = 0, 1, 2 there ({tried_text(dev)}): θ = "
        f"{float(dev['pick']):g}; the main job's `asynchronous=true s='auto'` ran it until "
        "amendment 27's rule ranked first on the same development seeds). "
        + counts_text(read, METHOD)
        + ". A method beside the verdict, which stays as registered"
        + (f". Not read yet: {', '.join(missing)}" if missing else "")
        + ". " + FOOTNOTE)
    return text + "\n\n" + table(
        ["cell", "FedBuff", "s = 1", f"θ = {float(dev['pick']):g}", "over FedBuff",
         "over s = 1", "over the lower of the two (medians)", "replicated",
         "goal with it (over the best rival)", "the best rival that does not code, over it"],
        rows)


def _loaded() -> tuple[Mapping[str, Any], Mapping[str, Any], dict[str, Mapping[str, Any]]
                       ] | None:
    if not all((RESULTS / f).exists() for f in (BAR, ASYNC, COMPARE)):
        return None
    replication = load(ASYNC)
    return load(BAR), replication, benchmark_cells(replication, load(COMPARE))


def headline() -> str:
    """One sentence for the README's coded-asynchrony line (empty without the reading)."""
    got = _loaded()
    if got is None or not got[0].get("dev") or not got[0].get("cells"):
        return ""
    data, replication, cells = got
    read = read_cells(data, replication, cells, reported_cells())
    near = near_count(read)
    worst = worst_cell(read)
    return (f" With no development seeds of its own, `s='auto'` (amendment 24: s = 1, a "
            f"neighbour's partition served only while it has fewer jobs than "
            f"{float(data['dev']['pick']):g}× the client's own) was within {GOAL_TIME:g}× of "
            f"the lower of FedBuff's and s = 1's median time in {near} of {len(read)} cells "
            f"read, at worst {worst[1]:.2f}× ({worst[0]}; "
            "[docs](docs/adaptive.md#coded-asynchrony-that-reacts)).")


@block("async-bar")
def async_bar() -> str | None:
    got = _loaded()
    return None if got is None else render(*got, reported_cells())
