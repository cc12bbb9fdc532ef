"""The best deadline in hindsight (``deadline-best``): the deadline rival run at each multiple
of the stated rule's deadline on the reported seeds, and the one the verdict's own rule ranks
first (:func:`best_deadline`).

A finished cell keeps what its grid of deadlines gave (``deadline_grid_results``, each
deadline's per-seed numbers in the cells run since they were kept, and the pick's runs);
:func:`prior_deadlines` reads that back, so a grid of multiples extended by an amendment runs
only the deadlines it adds. The pick over old and new deadlines is exact: it was the best of
the old ones by the same total order (median time to target over all seeds, then median final
accuracy, then the shorter deadline), so the best of the union is the best of it and the new
ones."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from experiments.summary import median_known, median_time

__all__ = ["PriorDeadlines", "best_deadline", "deadline_best", "prior_deadlines", "rank_medians",
           "tried_record"]

Runs = list[dict[str, Any]]


def best_deadline(records: Mapping[float, Sequence[Mapping[str, Any]]]) -> float:
    """The grid deadline a reader would call best by the rule every method is ranked by: the
    lowest median time to target over all seeds (a seed that never reached it counts as
    infinitely slow), then the highest median final accuracy, then the shorter deadline."""
    def score(deadline: float) -> tuple:
        time, final = rank_medians(records[deadline])
        return (time, -final, deadline)

    return min(records, key=score)


def rank_medians(runs: Sequence[Mapping[str, Any]]) -> tuple[float, float]:
    """The median time to target over all ``runs`` (``inf`` where the median run never
    reached it) and the median final accuracy: what :func:`best_deadline` ranks by."""
    finals = [float(r["final_accuracy"] or 0.0) for r in runs]
    return median_time([r["time_to_target"] for r in runs]), float(np.median(finals))


def tried_record(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A tuned setting's runs as a tuning's record keeps them: their medians
    (:func:`rank_medians`; ``None`` for a median run that never reached the target) and
    each seed's time to target and final accuracy."""
    time, final = rank_medians(runs)
    return {"median_time_to_target_all_seeds": None if math.isinf(time) else time,
            "median_final_accuracy": final,
            "per_seed": {str(r["seed"]): {"time_to_target": r["time_to_target"],
                                          "final_accuracy": r["final_accuracy"]}
                         for r in runs}}


@dataclasses.dataclass(frozen=True)
class PriorDeadlines:
    """What a finished cell's ``deadline-best`` ran: the stated deadline its grid was built
    on, its pick (``pick_s``), the runs of the deadlines whose per-seed numbers it kept (the
    pick's: its stored runs), and the stored entries of the others (only their aggregates
    were kept; none is the pick, so none can be the best of a larger grid)."""

    stated_s: float
    pick_s: float
    runs: Mapping[float, Runs]
    entries: Mapping[float, Mapping[str, Any]]

    def find(self, deadline: float) -> float | None:
        """The stored deadline equal to ``deadline`` (up to rounding), else ``None``."""
        return next((d for d in (*self.runs, *self.entries)
                     if math.isclose(d, deadline, rel_tol=1e-9)), None)


#: The settings a finished cell's runs depend on, besides the code: a read-back needs them equal.
SAME = ("task", "n", "cohort", "rounds", "target", "seeds", "dev_seeds", "run_config",
        "rivals_stop_dropped_work")


def prior_deadlines(cell: Mapping[str, Any], settings: Mapping[str, Any] | None = None,
                    log: Callable[[str], None] = print) -> PriorDeadlines | None:
    """The :class:`PriorDeadlines` of a finished cell of the grid file; ``None`` (every
    deadline runs) when it ran no ``deadline-best``, when ``settings`` (the cell about to
    run) differ from its own in any of :data:`SAME`, or when its stored ``deadline-best``
    runs are not those of its ``deadline_best_s``. The code is not compared (a finished cell
    keeps no digest of it): a change to the deadline rival runs every deadline again, since
    a grid with no new deadline reads nothing back (:func:`deadline_best`)."""
    stored = cell.get("settings", {})
    best = stored.get("deadline_best_s")
    if best is None or "stated_deadline_s" not in stored:
        return None
    changed = [k for k in SAME if settings is not None and stored.get(k) != settings.get(k)]
    if changed:
        log(f"compare: the stored cell differs in {changed}: every deadline runs again")
        return None
    picked = [dict(r) for r in cell["runs"] if r["method"] == "deadline-best"]
    if not picked or any(not math.isclose(float(r.get("deadline_s", math.nan)), float(best),
                                          rel_tol=1e-9) for r in picked):
        log("compare: the stored deadline-best runs are not those of deadline_best_s: every "
            "deadline runs again")
        return None
    runs: dict[float, Runs] = {}
    entries: dict[float, Mapping[str, Any]] = {}
    for entry in stored.get("deadline_grid_results", []):
        d = float(entry["deadline_s"])
        if "per_seed" in entry:
            runs[d] = [{"method": "deadline-best", "seed": int(seed), "skeleton": True,
                        **numbers} for seed, numbers in entry["per_seed"].items()]
        else:
            entries[d] = entry
    entries.pop(float(best), None)
    runs[float(best)] = picked
    return PriorDeadlines(float(stored["stated_deadline_s"]), float(best), runs, entries)


def _worse(entry: Mapping[str, Any], seeds: int, score: tuple[float, float]) -> bool:
    """Whether an aggregates-only entry ranks below a pick scoring ``score`` (median time
    over all seeds, median final accuracy) whatever its per-seed numbers were: its median
    seed never reached the target while the pick's did, or every seed reached it and its
    median time is larger."""
    reached, median = int(entry["reached"]), entry.get("median_time_to_target")
    if 2 * reached <= seeds:
        return math.isfinite(score[0])
    return reached == seeds and median is not None and float(median) > score[0]


def _entry(deadline: float, runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    time, final = rank_medians(runs)
    return {"deadline_s": deadline,
            "reached": sum(r["time_to_target"] is not None for r in runs),
            "median_time_to_target": median_known([r["time_to_target"] for r in runs]),
            # what best_deadline ranks by (null: the median seed never reached it)
            "median_time_to_target_all_seeds": time if math.isfinite(time) else None,
            "median_final_accuracy": final,
            "mean_final_accuracy": float(np.mean([r["final_accuracy"] or 0.0 for r in runs])),
            # every seed's numbers, so that the pick can be read again under any rule
            "per_seed": {str(r["seed"]): {"time_to_target": r["time_to_target"],
                                          "final_accuracy": r["final_accuracy"]}
                         for r in runs}}


def _grows_past(prior: PriorDeadlines, grid: Sequence[float]) -> bool:
    """Whether ``prior``'s pick is the shortest or the longest deadline of ``grid`` and the
    deadline a growth tries next (half or twice it) is not stored: a grid that adds nothing
    is then an extension, not a re-run."""
    for edge, step in ((min(grid), 0.5), (max(grid), 2.0)):
        if math.isclose(prior.pick_s, edge, rel_tol=1e-9):
            return prior.find(prior.pick_s * step) is None
    return False


def deadline_best(grid: Sequence[float], seeds: Sequence[int],
                  run: Callable[[float, int], dict[str, Any]], stated: float,
                  prior: PriorDeadlines | None = None,
                  log: Callable[[str], None] = print,
                  extend: int = 0) -> tuple[Runs, dict[str, Any]]:
    """``(the pick's runs, facts)`` over the deadlines ``grid``: each run on every seed by
    ``run(deadline, seed)``, except, when ``grid`` adds deadlines to ``prior``'s (an
    extended grid), those ``prior`` holds: its runs, and its aggregates-only entries that
    rank below its pick whatever their seeds did (the others run again). ``prior``'s stated
    deadline must be ``stated``, else every deadline runs; a grid that adds nothing reads
    nothing back (a re-run after a change runs every deadline), unless it will grow past
    ``prior``'s pick (below). ``extend``: while the pick is the shortest deadline tried, half
    of it is tried next, while it is the longest, twice it, and the pick is made again over
    every deadline tried, at most ``extend`` times (``facts["deadline_grid_grown"]``)."""
    if prior is not None and not math.isclose(prior.stated_s, stated, rel_tol=1e-9):
        log(f"compare: the stated deadline is {stated:.6g} s, the stored one "
            f"{prior.stated_s:.6g} s: every deadline of the grid runs again")
        prior = None
    grows = extend > 0 and prior is not None and _grows_past(prior, grid)
    if prior is not None and all(prior.find(d) is not None for d in grid) and not grows:
        prior = None  # nothing added: this is a re-run, not an extension
    tried: dict[float, Runs] = {}
    kept: dict[float, Mapping[str, Any]] = {}
    read: set[float] = set()

    def attempt(d: float) -> None:
        old = prior.find(d) if prior is not None else None
        if old is not None and old in prior.runs:
            tried[d] = [dict(r) for r in prior.runs[old]]
            read.add(d)
        elif old is not None and _worse(prior.entries[old], len(seeds),
                                        rank_medians(prior.runs[prior.pick_s])):
            kept[d] = {**prior.entries[old], "deadline_s": d}
            read.add(d)
        else:
            tried[d] = [run(d, seed) for seed in seeds]

    def pick() -> float:
        best = best_deadline(tried)
        if any(r.get("skeleton") for r in tried[best]):  # only numbers kept: run it for real
            tried[best] = [run(best, seed) for seed in seeds]
            read.discard(best)
            best = best_deadline(tried)
        return best

    searched = list(grid)
    for d in searched:
        attempt(d)
    best, grown = pick(), 0
    while grown < extend and best in (min(searched), max(searched)):
        d = best / 2 if best == min(searched) else best * 2
        log(f"compare: deadline-best: the pick {best:.6g} s is at the edge of the deadlines "
            f"tried: {d:.6g} s tried next")
        searched.append(d)
        attempt(d)
        best, grown = pick(), grown + 1
    read_back = len(read)
    if prior is not None:
        log(f"compare: deadline-best: {read_back} of {len(searched)} deadlines read back from "
            "the cell, the others run")
    results = {**{d: _entry(d, rs) for d, rs in tried.items()}, **kept}
    facts = {"deadline_best_s": best, "deadline_grid_s": sorted(searched),
             "deadline_grid_results": [results[d] for d in sorted(results)],
             "deadline_grid_read_back": read_back,
             **({"deadline_grid_grown": grown} if extend > 0 else {})}
    return [{k: v for k, v in r.items() if k != "skeleton"} for r in tried[best]], facts
