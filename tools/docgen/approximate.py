"""The ``auto-approximate`` block: ``s="auto"`` with approximate rounds, beside ``auto``.

``auto-approximate`` (the library's ``auto_approximate=True``, off by default) was added to
the grid after 16 cells had finished (an amendment in ``experiments/grid.toml``); its knobs
were tuned on the development seeds only (``results/auto_approximate_tuning.json``). Per
finished cell of ``results/compare.json`` that ran it (evaluation seeds): its median time to
target and how many seeds reached it, its time over auto's (the paired geometric mean and
interval of the cell's summary), and whether it would meet the goal auto is judged by
(median time at most :data:`~tools.docgen.rivals.GOAL_TIME` times the best rival's, median
final accuracy within :data:`~tools.docgen.rivals.GOAL_ACCURACY`). It is not a rival: the
verdict and the best rival are the ``compare-verdict`` block's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tools.docgen.core import RESULTS, block, load, table
from tools.docgen.rivals import (
    GOAL_TIME,
    compare_data,
    finished_cells,
    meets_goal,
    method_label,
    method_stats,
    ratio_text,
    reported_cells,
    seconds,
    time_over,
    times_text,
    verdict,
)

METHOD = "auto-approximate"


def render_approximate(data: Mapping[str, Any], report: Sequence[str]) -> str:
    """The block's text: a table of the finished cells that ran :data:`METHOD`."""
    done = [name for name in finished_cells(data, report)
            if any(r["method"] == METHOD for r in data["cells"][name].get("runs", []))]
    if not done:
        return (f"`{METHOD}` has not run on a finished cell yet (`python -m experiments.compare "
                f"--grid --rerun --methods {METHOD}`).")
    rows, met = [], 0
    for name in done:
        cell = data["cells"][name]
        stats = method_stats(cell)
        mine, auto = stats[METHOD], stats.get("auto")
        v = verdict(name, cell)
        if v.best is None:
            goal = "no rival run"
        else:
            ok = all(meets_goal(mine, v.best_stats))
            met += ok
            ratio = time_over(mine.median_time, v.best_stats.median_time)
            goal = f"{'✓' if ok else '✗'} {times_text(ratio)} {method_label(v.best)}"
        rows.append([name, f"{seconds(mine.median_time)} ({mine.reached}/{mine.seeds})",
                     "-" if auto is None else seconds(auto.median_time),
                     ratio_text(cell["summary"].get(METHOD), auto), goal])
    head = (f"`{METHOD}` within {GOAL_TIME}× of the best rival (the rule auto is judged by) "
            f"in {met} of the {len(done)} finished cells that ran it (evaluation seeds).")
    note = ("Columns: its median time to target (seeds reaching it); auto's; its time over "
            "auto's (paired geometric mean [95 % interval], ▼/▽ below 1 as in the table "
            "above); the goal against the cell's best rival, with its median time over that "
            "rival's.")
    return head + "\n\n" + table(["cell", METHOD, "auto", f"{METHOD} / auto",
                                  "goal (best rival)"], rows) + "\n\n" + note


@block("auto-approximate")
def auto_approximate() -> str:
    return render_approximate(compare_data(), reported_cells())


#: ``python -m experiments.noise_scale`` (development seeds): the gradient noise scale
NOISE = "noise_scale.json"


def render_noise(data: Mapping[str, Any]) -> str:
    """Per task and scale, the median over seeds of the clients' noise scale and the share
    of a whole-population step's progress that a step on ``B`` clients makes,
    ``1 / (1 + B_noise / B)``, at the full cohort and at a tenth of it."""
    groups: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    for row in data["rows"]:
        groups.setdefault((row["task"], row["n"], row["cohort"]), []).append(row)
    rows = []
    for (task, n, cohort), runs in groups.items():
        b = float(np.median([r["noise_scale_clients"] for r in runs]))
        clients = int(np.median([r["clients"] for r in runs]))
        tenth = max(1, round(clients / 10))
        rows.append([f"{task}/{n}x{cohort}", f"{b:.1f}",
                     f"{float(np.median([r['mean_examples'] for r in runs])):.1f}",
                     f"{100 / (1 + b / clients):.0f} %", f"{100 / (1 + b / tenth):.0f} %",
                     f"{100 * (1 + b / clients) / (1 + b / tenth):.0f} %"])
    seeds = ", ".join(str(s) for s in data["seeds"])
    return (f"Gradient noise scale at the initial model, development seeds {seeds} "
            "(`python -m experiments.noise_scale`, `results/noise_scale.json`; McCandlish et "
            "al. 2018): `B_noise` in clients, the examples a client holds, and the share of a "
            "whole-population step's progress a step on the cohort's replies makes, "
            "`1 / (1 + B_noise / B)`, with every reply and with a tenth of them, and the "
            "second over the first. Where that last share is well above a tenth, a round cut "
            "at a deadline that keeps a tenth of the replies, if it is ten times shorter, "
            "costs less per unit of progress than the full round. `auto-approximate` never "
            "prices such a deadline: its candidates are at most `short_fraction` of the "
            "replies short of the exact decoding (`ApproximateRounds`), and it prices them by "
            "`1 - e`, which a few replies of a non-IID cohort push towards no progress at "
            "all. This is consistent with the hindsight-best "
            "deadline being far shorter than the stated one in the natural-noniid cells. A "
            "diagnostic, not a change to `auto`; the noise scale grows as training converges, "
            "so this is its value at the start.\n\n"
            + table(["task/scale", "B_noise", "examples per client", "all replies",
                     "a tenth", "a tenth / all"], rows))


@block("noise-scale")
def noise() -> str | None:
    if not (RESULTS / NOISE).exists():
        return None
    return render_noise(load(NOISE))
