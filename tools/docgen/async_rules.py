"""The ``async-rules`` block: every online replication rule the grid file registered for the
asynchronous ``s='auto'`` (amendments 24 to 29 and 32) and the fixed ``s = 1`` (amendment 30),
one row each, from their results files: the
value picked on the development seeds, its worst and median development ratio to the best
fixed ``s`` (and the cell of the worst), its ratio in the cell whose slow clients hold data
no one else does at 100 clients, whether ``s='auto'`` runs it, and its evaluation reading
where it has one (how many cells read are within the goal's time of the lower of FedBuff's
and ``s = 1``'s median, and its worst; in how many its paired per-seed ratio to that lower
one is above or below 1 beyond chance, :func:`beyond_chance`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tools.docgen.async_bar import (
    FIXED,
    Read,
    near_count,
    near_fedbuff_count,
    read_cells,
    worst_cell,
    worst_text,
)
from tools.docgen.async_bar import METHOD as BAR_METHOD
from tools.docgen.async_replication import ASYNC, benchmark_cells
from tools.docgen.core import RESULTS, block, load, table
from tools.docgen.rivals import COMPARE, GOAL_TIME, reported_cells

#: the cell where the slow clients' data is needed most (no one else holds two classes)
NEEDED = "slow-classes-2/digits-logreg/persistent/100x100"

#: (amendment, results file, method of its evaluation runs, what the rule is, its knob)
RULES = (
    (24, "async_bar.json", BAR_METHOD, "a bar θ on a neighbour's service", "θ"),
    (25, "async_margin.json", "fedbuff-margin", "the bar 0.75 and a margin z beyond chance",
     "z"),
    (26, "async_need.json", "fedbuff-need", "the bar 0.25, 1 while the last update is over ρ× "
     "the own partition's", "ρ"),
    (27, "async_latch.json", "fedbuff-latch", "as 26, latched", "ρ"),
    (28, "async_era.json", "fedbuff-era", "as 27, the update against its era's median, over "
     "its last three", "ρ"),
    (29, "async_prior.json", "fedbuff-prior", "as 28 over a cohort's era, 1 until read twice",
     "ρ"),
    (32, "async_lag.json", "fedbuff-lag", "the bar 0 (FedBuff), 1 for good once the median "
     "class recall is L with a class never above 0.1", "L"),
)


def _on_file() -> list[tuple[int, Mapping[str, Any], str, str, str]]:
    """``(amendment, its results, method, what, knob)`` of each of :data:`RULES` with a
    development reading on file."""
    return [(amendment, load(file), method, what, knob)
            for amendment, file, method, what, knob in RULES
            if (RESULTS / file).exists() and load(file).get("dev")]


def beyond_chance(mine: Sequence[Mapping[str, Any]],
                  theirs: Sequence[Mapping[str, Any]]) -> int:
    """Whether the runs ``mine`` are slower (1) or faster (-1) than the runs ``theirs`` beyond
    chance, else 0: the 95 % interval of the geometric mean of the per-seed ratios of times
    to target (the benchmark's Student-t interval on their logarithms; a seed only one of
    the two reached counts as 2 or 0.5, neither as 1) lies wholly above or below 1. Every
    seed of ``mine`` must pair (else 0)."""
    from experiments.summary import paired_ratio, ratio_interval

    if not (mine and theirs):
        return 0
    by_seed = {r["seed"]: r["time_to_target"] for r in theirs}
    ratios = [paired_ratio(r["time_to_target"], by_seed[r["seed"]]) for r in mine
              if r["seed"] in by_seed]
    interval = ratio_interval(ratios)["ci95"] if len(ratios) == len(mine) else None
    if interval is None:
        return 0
    return 1 if interval[0] > 1 else -1 if interval[1] < 1 else 0


def chance_counts(data: Mapping[str, Any], method: str, replication: Mapping[str, Any],
                  cells: Mapping[str, Mapping[str, Any]], reference: str = "fedbuff"
                  ) -> tuple[list[str], list[str], int] | None:
    """``(slower, faster, cells)``: of the benchmark's cells the reading ran in (``cells``
    of them), those where its ``method``'s runs are slower or faster than the
    ``reference``'s (``"fedbuff"``, the benchmark's FedBuff, or :data:`FIXED`, amendment
    23's ``s = 1``) beyond chance (:func:`beyond_chance`); ``None`` when the reading is the
    reference itself."""
    if method == reference:
        return None
    signs: dict[str, int] = {}
    for name, cell in data.get("cells", {}).items():
        if name not in cells:
            continue
        mine = [r for r in cell["runs"] if r["method"] == method]
        theirs = ([r for r in cells[name]["runs"] if r["method"] == "fedbuff"]
                  if reference == "fedbuff" else
                  [r for r in replication.get("cells", {}).get(name, {}).get("runs", [])
                   if r["method"] == reference])
        if mine:
            signs[name] = beyond_chance(mine, theirs)
    return ([n for n, v in signs.items() if v > 0], [n for n, v in signs.items() if v < 0],
            len(signs))


def _chance_text(counts: tuple[list[str], list[str], int] | None) -> str:
    return ("-" if counts is None or not counts[2]
            else f"{len(counts[0])} slower, {len(counts[1])} faster")


#: the amendment that put the fixed s = 1 among the candidates (no online rule: the bar 1)
FIXED_AMENDMENT = 30
#: the amendment of the class reading (``lag_level``: FedBuff until a class is never learnt)
LAG_AMENDMENT = 32


def fixed_rule() -> tuple[int, Mapping[str, Any], str, str, str] | None:
    """Amendment 30's candidate as :func:`_on_file` gives a rule: the fixed ``s = 1``, its
    development record from amendment 24's file (:func:`experiments.async_bar.fixed_dev`)
    and its evaluation runs amendment 23's (``None`` without both files)."""
    from experiments.async_bar import fixed_dev

    if not all((RESULTS / f).exists() for f in ("async_bar.json", ASYNC)):
        return None
    dev = fixed_dev(load("async_bar.json").get("dev", {}))
    if dev is None:
        return None
    runs = {name: {"runs": [r for r in cell["runs"] if r["method"] == FIXED]}
            for name, cell in load(ASYNC).get("cells", {}).items()}
    return (FIXED_AMENDMENT, {"dev": dev, "cells": runs}, FIXED,
            "the fixed s = 1: the least-served held partition, no online rule", "s")


def registered() -> int:
    """How many of :data:`RULES` have a development reading on file."""
    return len(_on_file())


def dev_worst_min() -> float:
    """The lowest development worst ratio among the rules on file."""
    return min(float(data["dev"]["worst"][str(data["dev"]["pick"])])
               for _, data, *_ in _on_file())


def auto_amendment() -> int:
    """The amendment whose rule the main job's asynchronous ``s='auto'`` runs (read off the
    ``AUTO_*`` constants)."""
    from fl_gradcode.flower.asynchronous import (
        AUTO_LAG_LEVEL,
        AUTO_NEED_LATCH,
        AUTO_NEED_PRIOR,
        AUTO_NEED_RATIO,
        AUTO_NEED_REFERENCE,
        AUTO_REPLICATE_BELOW,
        AUTO_REPLICATE_MARGIN,
    )

    if AUTO_LAG_LEVEL is not None:
        return LAG_AMENDMENT
    need = AUTO_NEED_RATIO != float("inf")
    if not (need or AUTO_NEED_LATCH or AUTO_REPLICATE_MARGIN) and AUTO_REPLICATE_BELOW == 1.0:
        return FIXED_AMENDMENT
    return (29 if AUTO_NEED_REFERENCE == "cohort" and AUTO_NEED_PRIOR
            else 28 if AUTO_NEED_REFERENCE == "era" else 27 if AUTO_NEED_LATCH
            else 26 if need else 25 if AUTO_REPLICATE_MARGIN else 24)


def _runs_auto(amendment: int, pick: float) -> bool:
    """Whether the main job's asynchronous ``s='auto'`` runs this amendment's pick."""
    from fl_gradcode.flower.asynchronous import (
        AUTO_LAG_LEVEL,
        AUTO_NEED_RATIO,
        AUTO_REPLICATE_BELOW,
        AUTO_REPLICATE_MARGIN,
    )

    which = auto_amendment()
    value = {24: AUTO_REPLICATE_BELOW, 25: AUTO_REPLICATE_MARGIN,
             FIXED_AMENDMENT: 1.0, LAG_AMENDMENT: AUTO_LAG_LEVEL}.get(which, AUTO_NEED_RATIO)
    return which == amendment and value == pick


@dataclass(frozen=True)
class Against:
    """A candidate's evaluation reading against FedBuff alone: of ``cells`` read, how many
    are within the goal's time of FedBuff's median, how many meet the goal in auto's place,
    and the cells slower and faster than FedBuff beyond chance (:func:`chance_counts`)."""

    cells: int
    near_fedbuff: int
    met: int
    slower: list[str]
    faster: list[str]

    def chance(self) -> str:
        return f"{len(self.slower)} slower, {len(self.faster)} faster"


def against_fedbuff(read: Read, data: Mapping[str, Any], method: str,
                    replication: Mapping[str, Any],
                    cells: Mapping[str, Mapping[str, Any]]) -> Against:
    """The reading ``read`` (:func:`~tools.docgen.async_bar.read_cells` of ``data``'s
    ``method``) against FedBuff alone."""
    slower, faster, _ = chance_counts(data, method, replication, cells) or ([], [], 0)
    return Against(len(read), near_fedbuff_count(read, method),
                   sum(v.met for _, _, v, _ in read), slower, faster)


def _row(amendment: int, data: Mapping[str, Any], method: str, what: str, knob: str,
         replication: Mapping[str, Any], cells: Mapping[str, Mapping[str, Any]]
         ) -> tuple[list[str], Against | None]:
    """The overview's row of a candidate, and its reading against FedBuff (``None``: not
    read on the evaluation seeds)."""
    dev = data["dev"]
    pick = str(dev["pick"])
    ratios = {name: cell["tried"][pick]["ratio_to_best_fixed"]
              for name, cell in dev["cells"].items() if pick in cell["tried"]}
    worst = max(ratios, key=lambda name: ratios[name])
    read = read_cells(data, replication, cells, reported_cells(), method)
    where, value = worst_cell(read)
    facts = against_fedbuff(read, data, method, replication, cells) if read else None
    itself = " (it is one of the two)" if method == FIXED else ""
    reading = (f"{near_count(read)} of {len(read)}{itself}, at worst {value:.2f}× ({where})"
               if read else "amendment 24's runs (the same rule)" if amendment == 25
               and float(dev["pick"]) == 0.0 else "not run")
    return [str(amendment), what, f"{knob} = {float(dev['pick']):g}",
            f"{worst_text(dev['worst'][pick])} ({worst})", worst_text(dev["median"][pick]),
            worst_text(ratios[NEEDED]) if NEEDED in ratios else "-",
            "yes" if _runs_auto(amendment, float(dev["pick"])) else "no", reading,
            f"{facts.near_fedbuff} of {facts.cells}" if facts else "-",
            f"{facts.met} of {facts.cells}" if facts else "-",
            facts.chance() if facts else "-",
            _chance_text(chance_counts(data, method, replication, cells, FIXED))
            if facts else "-"], facts


def _best_fixed(records: list[Mapping[str, Any]]) -> str | None:
    """The fixed s with the lowest development median in :data:`NEEDED` (``None``: not
    run)."""
    for record in records:
        fixed = record["dev"]["cells"].get(NEEDED, {}).get("fixed")
        if fixed:
            return min(fixed, key=lambda s: float(fixed[s]))
    return None


@block("async-rules")
def async_rules() -> str | None:
    if not all((RESULTS / f).exists() for f in (ASYNC, COMPARE)):
        return None
    replication = load(ASYNC)
    cells = benchmark_cells(replication, load(COMPARE))
    on_file = _on_file()
    read = [_row(*rule, replication, cells) for rule in on_file]
    needed = [float(r[5]) for r, _ in read if r[5] not in ("-", "∞")]
    medians = {r[0]: float(r[4]) for r, _ in read if r[4] != "∞"}
    fixed = fixed_rule()
    if fixed is not None:
        on_file.append(fixed)
        read.append(_row(*fixed, replication, cells))
    read.sort(key=lambda got: int(got[0][0]))  # by amendment: the fixed s = 1 before 32
    rows = [row for row, _ in read]
    against = {row[0]: facts for row, facts in read if facts is not None}
    lowest = min(medians, key=lambda a: (medians[a], int(a)))
    best = _best_fixed([data for _, data, *_ in on_file])
    summary = (f" In {NEEDED}, the cell whose slow clients hold what no one else does, every "
               f"online rule took at least {min(needed):.2f}× the time of the best fixed s "
               f"(s = {best} there, serving every partition from the first job); the rule "
               f"with the lowest development median (amendment {lowest}, "
               f"{medians[lowest]:.2f}) took {dict((r[0], r[5]) for r in rows)[lowest]}× there."
               if needed and medians and best is not None else "")
    auto = str(auto_amendment())
    others = [a for a in against if a not in (auto, str(FIXED_AMENDMENT))]
    if auto in against and others:
        def said(facts: Against) -> str:
            return (f"{facts.near_fedbuff} within {GOAL_TIME:g}× of FedBuff's median, "
                    f"{facts.chance().replace(', ', ' and ')} than it beyond chance, the goal "
                    f"(against the best rival) met in {facts.met}")

        summary += (" Read against FedBuff alone (a reference none of them is, unlike the "
                    f"lower of FedBuff and s = 1), of {against[auto].cells} cells: the "
                    f"candidate s='auto' runs (amendment {auto}): {said(against[auto])}; "
                    + "; ".join(f"amendment {a}: {said(against[a])}" for a in others)
                    + ". These readings came after the evaluation runs; they pick nothing.")
    return ("Every online rule registered for the asynchronous `s='auto'`, each picked on "
            "the development seeds 0-2 of the same fifteen cells (its ratio: its median time "
            "to target over the best fixed s's, s = 0 being FedBuff; ∞: never reached), and "
            "read on the evaluation seeds 10-19 where it ran (cells within "
            f"{GOAL_TIME:g}× of the lower of FedBuff's and s = 1's median time), and the fixed "
            f"s = 1 they all start from (amendment {FIXED_AMENDMENT}, which put it among the "
            "candidates after the others' evaluation runs; its development ratios are the "
            "fixed medians every rule's ratio divides by, its evaluation runs amendment 23's). "
            "`s='auto'` runs the candidate whose development worst ratio ranked first; the "
            "evaluation seeds were seen between the amendments, so they are not an "
            "independent test of the family." + summary + "\n\n"
            + table(["amendment", "rule (s = 1)", "picked", "development worst (cell)",
                     "development median", f"development ratio in {NEEDED}",
                     "s='auto' runs it",
                     "evaluation: within the goal's time of the lower of FedBuff and s = 1",
                     "evaluation: within it of FedBuff", "evaluation: the goal in auto's place",
                     "evaluation: against FedBuff beyond chance",
                     "evaluation: against s = 1 beyond chance"], rows))


@block("fedbuff-auto-check")
def fedbuff_auto_check() -> str | None:
    """Whether ``--methods fedbuff-auto`` (``results/fedbuff_auto_check.json``, one cell of
    the benchmark run by the command) reproduced the evaluation runs of the rule ``s='auto'``
    runs in that cell, seed by seed."""
    if not (RESULTS / "fedbuff_auto_check.json").exists():
        return None
    from experiments.rival_runs import auto_rule_record

    check = load("fedbuff_auto_check.json")
    settings = check["settings"]
    name = f"{settings['task']}/{settings['latency_table']}/{settings['n']}x{settings['cohort']}"
    mine = [r for r in check["runs"] if r["method"] == "fedbuff-auto"]
    if not mine or any(r.get("auto_rule") != auto_rule_record() for r in mine):
        return (f"`results/fedbuff_auto_check.json` ran another rule than `s='auto'` runs now "
                f"in {name}: run the command below again to check it.")
    amendment = auto_amendment()
    _, data, method, *_ = next(rule for rule in [*_on_file(), fixed_rule()]
                               if rule is not None and rule[0] == amendment)
    theirs = {r["seed"]: r["time_to_target"]
              for r in data.get("cells", {}).get(name, {}).get("runs", [])
              if r["method"] == method}
    command = (f"python -m experiments.compare --task {settings['task']} --latency "
               f"{settings['latency_table']} --n {settings['n']} --methods fedbuff-auto "
               "--seeds 10-19 --out results/fedbuff_auto_check.json")
    if not theirs:
        return (f"`{command}` ran the rule `s='auto'` runs in {name}; amendment "
                f"{amendment}'s evaluation "
                "runs of that cell are not on record yet, so nothing is compared with them.")
    same = sum(r["seed"] in theirs and theirs[r["seed"]] == r["time_to_target"] for r in mine)
    return (f"Run so in {name} (`{command}`, FedBuff's tuning run again), its time to "
            "target equalled that of "
            f"amendment {amendment}'s evaluation run of "
            f"the same seed on {same} of {len(mine)} seeds.")
