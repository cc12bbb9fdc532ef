"""The ``auto-approximate`` block: ``s="auto"`` with approximate rounds, beside ``auto``.

``auto-approximate`` (the library's ``auto_approximate=True``, off by default) was added to
the grid after 16 cells had finished (an amendment in ``experiments/grid.toml``); its knobs
were tuned on the development seeds only (``results/auto_approximate_tuning.json``, then
``results/auto_approximate_tuning_power.json``, then
``results/auto_approximate_tuning_tolerances.json``). Per
finished cell of ``results/compare.json`` that ran it (evaluation seeds): its median time to
target and how many seeds reached it, its time over auto's (the paired geometric mean and
interval of the cell's summary), and whether it would meet the goal auto is judged by
(median time at most :data:`~tools.docgen.rivals.GOAL_TIME` times the best rival's, median
final accuracy within :data:`~tools.docgen.rivals.GOAL_ACCURACY`). It is not a rival: the
verdict and the best rival are the ``compare-verdict`` block's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from tools.docgen.core import block, load, table
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
#: The progress model's power of the runs made before a cell recorded its knobs (the
#: library's default then; ``experiments/grid.toml``, amendment 10).
POWER_BEFORE = 1.0
#: The tolerances its approximate rounds were priced at in runs made before a cell recorded
#: that knob (``experiments/grid.toml``, amendment 13).
TOLERANCES_BEFORE = "trust-region"


def skew_text(cell: Mapping[str, Any]) -> str:
    """The starvation bound a cell's :data:`METHOD` runs had (``max_skew``; ``off``: none,
    as in every run made before the cells recorded it, ``experiments/grid.toml`` amendment
    14)."""
    bound = knob(cell, "max_skew", None)
    return "off" if bound is None else f"{bound:g}"


def knob(cell: Mapping[str, Any], name: str, before: Any) -> Any:
    """The knob ``name`` a cell's :data:`METHOD` runs had (its ``settings.auto_approximate``;
    ``before``: runs made before the cell recorded it)."""
    return (cell.get("settings", {}).get("auto_approximate") or {}).get(name, before)


def power_text(cell: Mapping[str, Any]) -> str:
    """The ``error_power`` a cell's :data:`METHOD` runs had."""
    return f"{knob(cell, 'error_power', POWER_BEFORE):g}"


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
        rows.append([name, power_text(cell), str(knob(cell, "tolerances", TOLERANCES_BEFORE)),
                     skew_text(cell),
                     f"{seconds(mine.median_time)} ({mine.reached}/{mine.seeds})",
                     "-" if auto is None else seconds(auto.median_time),
                     ratio_text(cell["summary"].get(METHOD), auto), goal])
    head = (f"`{METHOD}` within {GOAL_TIME}× of the best rival (the rule auto is judged by) "
            f"in {met} of the {len(done)} finished cells that ran it (evaluation seeds).")
    note = ("Columns: the progress model's `error_power` its runs had (the cell's "
            "`settings.auto_approximate`; runs made before the cells recorded their knobs had "
            f"{POWER_BEFORE:g}); the tolerances its approximate rounds were priced at "
            f"(`tolerances`; before the cells recorded it, {TOLERANCES_BEFORE}); its "
            "starvation bound (`max_skew`; off before the cells recorded it); its median "
            "time to target (seeds reaching it); auto's; its "
            "time over "
            "auto's (paired geometric mean [95 % interval], ▼/▽ below 1 as in the table "
            "above); the goal against the cell's best rival, with its median time over that "
            "rival's.")
    return head + "\n\n" + table(["cell", "p", "tolerances", "max skew", METHOD, "auto",
                                  f"{METHOD} / auto",
                                  "goal (best rival)"], rows) + "\n\n" + note


@block("auto-approximate")
def auto_approximate() -> str:
    return render_approximate(compare_data(), reported_cells())


def render_tuning(data: Mapping[str, Any], knob: str) -> str:
    """A tuning file of ``experiments.tune_auto_approximate`` (development seeds): per cell,
    the geometric mean over its seeds of each setting's paired ratio to ``auto`` (the
    setting labelled by ``knob``, the one its grid varies), then the rule's value over every
    (cell, seed), the chosen setting's column marked."""
    settings = data["settings"]
    labels = [str(s["knobs"][knob]) for s in settings]
    chosen = labels[[s["knobs"] for s in settings].index(data["chosen"]["knobs"])]

    def geomean(values: list[float]) -> float:
        return math.exp(sum(map(math.log, values)) / len(values))

    cells = list(dict.fromkeys(k.rsplit("/", 1)[0] for k in settings[0]["ratio_vs_auto"]))
    def of(cell: str, setting: Mapping[str, Any]) -> float:
        return geomean([v for k, v in setting["ratio_vs_auto"].items()
                        if k.rsplit("/", 1)[0] == cell])

    rows = [[cell] + [f"{of(cell, s):.3f}" for s in settings] for cell in cells]
    rows.append(["every (cell, seed): the rule"] + [f"{s['geomean']:.3f}" for s in settings])
    header = ["cell"] + [f"{knob} = {x}" + (" (chosen)" if x == chosen else "") for x in labels]
    return table(header, rows)


@block("auto-approximate-skew-tuning")
def skew_tuning() -> str:
    return render_tuning(load("auto_approximate_tuning_skew.json"), "max_skew")


def render_stop_at_decode(data: Mapping[str, Any]) -> str:
    """Amendment 15's rule (``experiments.stop_at_decode``, development seeds): per cell,
    auto's time to target per seed with its work stopped at the round's deadline and at its
    end, their paired ratios' geometric mean, then the rule's value and verdict."""
    def times(values: Mapping[str, float | None]) -> str:
        return ", ".join("∞" if t is None else f"{t:.1f}" for t in values.values())

    rows = [[name, times(cell["time_to_target"]["deadline"]),
             times(cell["time_to_target"]["decode"]), f"{cell['geomean']:.3f}"]
            for name, cell in data["cells"].items()]
    rows.append(["every (cell, seed): the rule", "", "",
                 f"**{data['geomean']:.3f}** ({'on' if data['auto_stop_at_decode'] else 'off'})"])
    seeds = data["seeds"]
    return table(["cell", f"at the deadline: seeds {seeds[0]}–{seeds[-1]} (s)",
                  "at the round's end (s)", "time ratio"], rows)


@block("auto-stop-at-decode")
def stop_at_decode() -> str:
    return render_stop_at_decode(load("auto_stop_at_decode_dev.json"))
