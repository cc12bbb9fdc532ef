"""The ``target-held`` block: how long each method took to reach the target and stay there.

The benchmark's time to target (pre-registered, what the verdict reads) is the first
evaluation at or above the target. A run whose accuracy crosses the target and falls back is
credited at the crossing. This block shows, per finished cell of ``results/compare.json``
(evaluation seeds), a second reading of the same accuracy curves: the time the target was
*held*, the first evaluation after which every later one is at or above it (∞ when the run
ends below the target). It is added after the cells' results were seen, changes no verdict,
and is shown for auto, the two rivals that came closest to or beat it (FedBuff, first-k) and
the hindsight-best deadline (whose pick can favour a short deadline that crosses the target
on some seeds and falls back).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from tools.docgen.core import block, table
from tools.docgen.rivals import (
    compare_data,
    finished_cells,
    median,
    method_stats,
    reported_cells,
    seconds,
)

#: the methods shown, in order, and their column labels
HELD_METHODS = (("auto", "auto"), ("fedbuff", "FedBuff"), ("first-k", "first-k"),
                ("deadline-best", "deadline-best"))


def held_time(curve: Sequence[Sequence[float]], target: float) -> float:
    """The time of the first evaluation after which every later evaluation (itself included)
    is at or above ``target``; ``inf`` when the last one is below it. ``curve``: ``[time,
    accuracy, ...]`` per evaluation, in time order."""
    held = math.inf
    for point in curve:
        time, accuracy = float(point[0]), float(point[1])
        if accuracy < target:
            held = math.inf
        elif math.isinf(held):
            held = time
    return held


def render_held(data: Mapping[str, Any], report: Sequence[str]) -> str | None:
    """The table (one row per finished cell) and the count of cells where auto's and FedBuff's
    order by median time differs between the two readings; ``None`` with no finished cell."""
    rows, flips, counted = [], [], 0
    for name in finished_cells(data, report):
        cell = data["cells"][name]
        seeds = {int(s) for s in cell["settings"]["seeds"]}
        target = float(cell["settings"]["target"])
        row, medians = [name], {}
        for method, _ in HELD_METHODS:
            runs = [r for r in cell["runs"] if r["method"] == method and int(r["seed"]) in seeds]
            if not runs or any("accuracy_curve" not in r for r in runs):
                row.append("-")
                continue
            first = method_stats({"runs": runs})[method].median_time
            held_runs = [held_time(r["accuracy_curve"], target) for r in runs]
            held = median(held_runs)
            below = sum(math.isinf(h) for h in held_runs)
            medians[method] = (first, held)
            row.append(f"{seconds(first)} / {seconds(held)}"
                       + (f" ({below}/{len(runs)} end below)" if below else ""))
        rows.append(row)
        if "auto" in medians and "fedbuff" in medians:
            counted += 1
            (a_first, a_held), (f_first, f_held) = medians["auto"], medians["fedbuff"]
            if (a_first <= f_first) != (a_held <= f_held):
                flips.append(name)
    if not rows:
        return None
    header = ["cell", *(f"{label}: first / held" for _, label in HELD_METHODS)]
    listed = "; ".join(flips) if flips else "none"
    return (
        "Median time (evaluation seeds) to first reach the target / to hold it (the first "
        "evaluation after which none is below the target; ∞ when a run ends below it), and "
        "how many seeds end below the target. A reading added after the results were seen: "
        "the verdict above stays the pre-registered first-reach time.\n\n"
        + table(header, rows)
        + f"\n\nCells where auto and FedBuff swap order between the two readings: "
          f"{len(flips)} of {counted} ({listed}).")


@block("target-held")
def target_held() -> str | None:
    return render_held(compare_data(), reported_cells())
