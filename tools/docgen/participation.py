"""The ``participation`` block: whose data each method had taken in when it reached the target
under persistent stragglers (``python -m experiments.participation``,
``results/participation.json``)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

from tools.docgen.core import RESULTS, block, load, table

PARTICIPATION = "participation.json"
LABELS = {"auto": "auto", "deadline": "deadline (stated rule)",
          "deadline-best": "deadline-best", "first-k": "first-k", "fedbuff": "FedBuff"}


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def render_participation(data: Mapping[str, Any],
                         benchmark: Mapping[str, Any] | None = None) -> str | None:
    """One table per cell: each method's median share of slow clients' updates among those
    it took in before the target, the slow clients' median share of the data, its median
    time to target (a seed that never reached it counts as infinite) and the seeds that
    reached it."""
    if not data.get("cells"):
        return None
    parts = []
    for name, cell in data["cells"].items():
        runs = cell["runs"]
        seeds = sorted({r["seed"] for r in runs})
        data_share = _median([r["slow_data_share"] for r in runs if r["method"] == "auto"])
        rows = []
        for method in data["settings"]["methods"]:
            mine = [r for r in runs if r["method"] == method]
            shares = [r["slow_example_share"] for r in mine
                      if r.get("slow_example_share") is not None]
            times = [r["time_to_target"] if r["time_to_target"] is not None else float("inf")
                     for r in mine]
            reached = sum(r["time_to_target"] is not None for r in mine)
            share = _median(shares)
            time = _median(times)
            rows.append([LABELS.get(method, method),
                         "-" if share is None else f"{100 * share:.0f} %",
                         "never" if time is None or time == float("inf") else f"{time:.1f} s",
                         f"{reached}/{len(mine)}"])
        agree = sum(_same(r["time_to_target"], r.get("benchmark_time_to_target"))
                    for r in runs)
        since = _rerun_since(runs, benchmark, name)
        parts.append(
            f"**{name}** (seeds {_seeds(seeds)}; the slow clients hold a median "
            f"{100 * (data_share or 0):.0f} % of the training data; the time to target of "
            f"{agree} of {len(runs)} runs equals the benchmark's run of the same method and "
            "seed when these ran"
            + (f"; the benchmark has re-run {', '.join(since)} since, so those rows are "
               "not its runs now" if since else "") + "):\n\n"
            + table(["method", "slow clients' share of the examples taken in before the "
                     "target (a run that never reached it: in all its rounds)",
                     "median time to target", "reached"], rows))
    return "\n\n".join(parts)


def _seeds(seeds: list[int]) -> str:
    if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}–{seeds[-1]}"
    return ", ".join(map(str, seeds))


def _rerun_since(runs: list[Mapping[str, Any]], benchmark: Mapping[str, Any] | None,
                 name: str) -> list[str]:
    """The methods whose run of some seed in cell ``name`` of the benchmark
    (results/compare.json) has changed since these runs read it."""
    now = {(r["method"], r["seed"]): r["time_to_target"]
           for r in (benchmark or {}).get("cells", {}).get(name, {}).get("runs", [])}
    return sorted({r["method"] for r in runs if (r["method"], r["seed"]) in now
                   and not _same(now[r["method"], r["seed"]],
                                 r.get("benchmark_time_to_target"))})


def _same(mine: float | None, benchmark: float | None) -> bool:
    if mine is None or benchmark is None:
        return mine is None and benchmark is None
    return abs(mine - benchmark) <= 1e-6 * max(1.0, abs(benchmark))


def render_headline(data: Mapping[str, Any], cell: str,
                    benchmark: Mapping[str, Any] | None = None) -> str | None:
    """One README line: in ``cell``, the slow clients' median share of the data and of the
    examples each rival that does not wait, and auto, had taken in before the target; which
    methods ``benchmark`` (results/compare.json) has re-run since, when some were."""
    runs = data.get("cells", {}).get(cell, {}).get("runs")
    if not runs:
        return None
    since = _rerun_since(runs, benchmark, cell)
    seeds = ("the same seeds" if not since else "the same seeds, runs of the benchmark as "
             f"it was when these ran: it has re-run {', '.join(since)} since")

    def share(method: str, key: str = "slow_example_share") -> str:
        values = [r[key] for r in runs if r["method"] == method and r.get(key) is not None]
        value = _median(values)
        return "-" if value is None else f"{100 * value:.0f} %"

    return (f"- **What the faster rivals leave out** (cell `{cell}`, {seeds}; "
            "`python -m experiments.participation`): the persistently slow clients hold a "
            f"median {share('auto', 'slow_data_share')} of the training data; of the examples "
            f"each method had taken into its model when it reached the target (a run that "
            f"never did: over all its rounds), FedBuff's "
            f"were {share('fedbuff')} theirs, first-k's {share('first-k')}, the best "
            f"deadline's {share('deadline-best')}, auto's {share('auto')}: where only the "
            "slow clients hold some of the data, the rivals that do not wait train on the "
            "rest ([per method](docs/adaptive.md)).")


@block("participation-headline")
def participation_headline() -> str | None:
    if not (RESULTS / PARTICIPATION).exists():
        return None
    return render_headline(load(PARTICIPATION), "digits-logreg/persistent/20x20",
                           load("compare.json"))


@block("participation")
def participation() -> str | None:
    if not (RESULTS / PARTICIPATION).exists():
        return None
    return render_participation(load(PARTICIPATION), load("compare.json"))
