"""The readings that follow amendment 24's bar, each against FedBuff, amendment 23's ``s = 1``,
amendment 24's bar and the best rival of each cell read, with the goal's test
(:func:`tools.docgen.rivals.verdict`) applied to its runs in ``auto``'s place: the
``async-margin`` block (a margin ``z`` that waits for a lead beyond chance; ``python -m
experiments.async_margin``, ``results/async_margin.json``; the grid file's amendment 25) and
the ``async-need`` block (the bar lifted by the update norms; ``python -m
experiments.async_need``, ``results/async_need.json``; amendment 26) and the ``async-latch``
block (lifted for good; ``python -m experiments.async_latch``, ``results/async_latch.json``;
amendment 27), the ``async-era`` block (the need read against the era's updates; ``python
-m experiments.async_era``, ``results/async_era.json``; amendment 28) and the ``async-prior``
block (over a cohort's era, with a prior; ``python -m experiments.async_prior``,
``results/async_prior.json``; amendment 29) and the ``async-lag`` block (replication once the
model shows a class never learnt; ``python -m experiments.async_lag``,
``results/async_lag.json``; amendment 32)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fl_gradcode.flower.asynchronous import LAG_FLOOR
from tools.docgen.async_bar import (
    BAR,
    FIXED,
    FOOTNOTE,
    Read,
    counts_text,
    missing_cells,
    near_count,
    read_cells,
    share_text,
    tried_text,
    uncoded_text,
    worst_cell,
)
from tools.docgen.async_bar import METHOD as BAR_METHOD
from tools.docgen.async_bar import (
    headline as bar_headline,
)
from tools.docgen.async_replication import ASYNC, benchmark_cells, goal_text, time_text
from tools.docgen.async_rules import (
    FIXED_AMENDMENT,
    LAG_AMENDMENT,
    Against,
    against_fedbuff,
    auto_amendment,
    dev_worst_min,
    fixed_rule,
    registered,
)
from tools.docgen.auto_lr import paired_text
from tools.docgen.core import RESULTS, block, load, table
from tools.docgen.rivals import COMPARE, GOAL_TIME, reported_cells

MARGIN = "async_margin.json"
METHOD = "fedbuff-margin"


@dataclass(frozen=True)
class Later:
    """A reading after amendment 24's: its results file, method, knob's symbol, the sentence
    that says what it is (given the development record), and the value whose runs are
    amendment 24's (``None``: none)."""

    file: str
    method: str
    symbol: str
    intro: Callable[[Mapping[str, Any]], str]
    same_as_bar: float | None = None


def reproduced(data: Mapping[str, Any], bar: Mapping[str, Any]) -> tuple[int, int]:
    """``(equal, compared)``: development runs of ``z = 0`` whose time to target and final
    accuracy equal amendment 24's runs of its pick on the same cell and seed."""
    equal = compared = 0
    pick = str(bar.get("dev", {}).get("pick"))
    for name, cell in data.get("dev", {}).get("cells", {}).items():
        mine = cell["tried"].get("0.0", {}).get("per_seed", {})
        theirs = bar.get("dev", {}).get("cells", {}).get(name, {}).get("tried", {}).get(
            pick, {}).get("per_seed", {})
        for seed, run in mine.items():
            if seed in theirs:
                compared += 1
                equal += run == theirs[seed]
    return equal, compared


def _margin_intro(data: Mapping[str, Any], bar: Mapping[str, Any]) -> str:
    dev = data["dev"]
    equal, compared = reproduced(data, bar)
    return (
        "**A margin beyond chance** (`fedbuff-margin`, `python -m experiments.async_margin`, "
        "the grid file's amendment 25, registered after amendment 24's evaluation reading, "
        "which suggested it, and before any run of its own: amendment 24's bar θ = 0.75, and "
        "a client serves its neighbour's partition only while its own partition's jobs lead "
        "that partition's by more than z standard deviations of a difference of two counts "
        "of one rate, `own - theirs > z·sqrt(own + theirs)`; z = 0 is amendment 24's; ONE z "
        "for every cell, picked on the development seeds of amendment 24's fifteen cells by "
        f"its rule ({tried_text(dev)}): z = {float(dev['pick']):g}"
        + (f"; the development runs of z = 0 equal amendment 24's in {equal} of {compared}"
           if compared else "")
        + "). ")


def _described(title: str, method: str, amendment: int, after: str, rule: str
               ) -> Callable[[Mapping[str, Any], Mapping[str, Any]], str]:
    """The opening sentence of a need rule's block: its ``title``, method and command, the
    amendment that registered it ``after`` what, its ``rule``, and its development pick."""
    module = {26: "async_need", 27: "async_latch", 28: "async_era", 29: "async_prior"}[amendment]

    def intro(data: Mapping[str, Any], bar: Mapping[str, Any]) -> str:
        dev = data["dev"]
        return (f"**{title}** (`{method}`, `python -m experiments.{module}`, the grid file's "
                f"amendment {amendment}, registered after {after}, before any run of its own: "
                f"{rule}; ONE ρ for every cell, picked on the development seeds of amendment "
                f"24's fifteen cells by its rule ({tried_text(dev)}): "
                f"ρ = {float(dev['pick']):g}{_lifted(data)}). ")
    return intro


_need_intro = _described(
    "Replication by need", "fedbuff-need", 26,
    "amendment 25, with the diagnostic that preceded it",
    "a client computes its neighbour's partition while that partition's jobs are fewer than "
    "0.25 times its own partition's, or fewer than its own partition's when the neighbour's "
    "partition's last update was more than ρ times as large as its own partition's last "
    "update")
_latch_intro = _described(
    "Replication by need, latched", "fedbuff-latch", 27,
    "amendment 26's development runs in ten of its cells, which showed a needed partition's "
    "service swinging",
    "as amendment 26, but a partition whose last update was once more than ρ times as large "
    "as a holder's own partition's keeps the bar 1 for the rest of the run")
_era_intro = _described(
    "Replication by need read against the era", "fedbuff-era", 28,
    "amendment 27's evaluation reading and a diagnostic on one development seed",
    "as amendment 27, but a partition is needed once the geometric mean of its last three "
    "update norms (at least two), each over the median norm of the updates computed from the "
    "models of its own server step and the two before, is above ρ, so a stale update meets "
    "its era's and one neighbour's noisy reply decides nothing")
_prior_intro = _described(
    "Replication by need over a cohort's era, with a prior", "fedbuff-prior", 29,
    "amendment 28's development runs, which read late or not at all, and a replay of one "
    "development seed's norms",
    "as amendment 28, but the era is an update's own server step and the ceil(cohort / K) "
    "before it, and a partition read fewer than twice is served as if needed")


def _lifted(data: Mapping[str, Any]) -> str:
    """How many partitions the latch lifted in a reading's evaluation runs (when recorded)."""
    lifted = [(r["needed"], len(r["updates_per_partition"]))
              for cell in data.get("cells", {}).values() for r in cell["runs"] if "needed" in r]
    return (f"; the latch lifted a median {statistics.median(a / n for a, n in lifted):.0%} "
            "of the partitions in its evaluation runs" if lifted else "")


def _lag_intro(data: Mapping[str, Any], bar: Mapping[str, Any]) -> str:
    dev = data["dev"]
    runs = [r for cell in data.get("cells", {}).values() for r in cell["runs"]
            if "lagged_at" in r]
    switched = sum(r["lagged_at"] is not None for r in runs)
    return ("**Replication once a class is never learnt** (`fedbuff-lag`, `python -m "
            "experiments.async_lag`, the grid file's amendment 32, registered after the "
            "update-norm rules' readings and a diagnostic on development seed 0, before any "
            "run of its own: each client computes its own partition, as in FedBuff, until the "
            "server's evaluation shows the median class recall at least L while some class's "
            f"best recall so far is below {LAG_FLOOR:g}; then every held partition gets the "
            "bar 1, s = 1's least-served rule, for the rest of the run. The signal is read "
            "from the model on the server's held-out data, not from the updates the "
            "replication steers; ONE L for every cell, picked on the development seeds of "
            f"amendment 24's fifteen cells by its rule ({tried_text(dev)}): "
            f"L = {float(dev['pick']):g}"
            + (f"; it switched in {switched} of its {len(runs)} evaluation runs"
               if runs else "") + "). ")


MARGIN_READING = Later(MARGIN, METHOD, "z", _margin_intro, same_as_bar=0.0)
LAG_READING = Later("async_lag.json", "fedbuff-lag", "L", _lag_intro)
NEED_READING = Later("async_need.json", "fedbuff-need", "ρ", _need_intro)
LATCH_READING = Later("async_latch.json", "fedbuff-latch", "ρ", _latch_intro)
ERA_READING = Later("async_era.json", "fedbuff-era", "ρ", _era_intro)
PRIOR_READING = Later("async_prior.json", "fedbuff-prior", "ρ", _prior_intro)


def render(data: Mapping[str, Any], bar: Mapping[str, Any], replication: Mapping[str, Any],
           cells: Mapping[str, Mapping[str, Any]], report: Sequence[str],
           later: Later = MARGIN_READING) -> str | None:
    """A sentence on the pick and the counts, and one row per cell read (the development
    pick alone before any evaluation run)."""
    dev = data.get("dev")
    if not dev:
        return None
    pick = float(dev["pick"])
    text = later.intro(data, bar)
    read = read_cells(data, replication, cells, report, later.method, bar)
    if not read:
        return text + ("Its evaluation runs are amendment 24's (the pick is "
                       f"{later.symbol} = {pick:g})." if pick == later.same_as_bar
                       else "Not read on the evaluation seeds yet.")
    rows = []
    for name, stats, v, regret in read:
        mine = data["cells"][name]
        rows.append([
            name, time_text(stats.get("fedbuff")), time_text(stats.get(FIXED)),
            time_text(stats.get(BAR_METHOD)), time_text(stats[later.method]),
            paired_text(mine["over_fedbuff"]),
            "-" if mine.get("over_earlier") is None else paired_text(mine["over_earlier"]),
            "-" if regret is None else f"{regret:.2f}", share_text(mine["runs"]), goal_text(v),
            uncoded_text(v)])
    missing = missing_cells(data, replication, report)
    same, both, faster, slower = against_bar(read, later.method, bar, replication, cells,
                                             report)
    return (text + counts_text(read, later.method)
            + (f"; against amendment 24's bar θ = 0.75 (medians, the same seeds): faster in "
               f"{faster}, slower in {slower}, equal in {both - faster - slower} of "
               f"{both}" if both else "")
            + (f" (the bar in the same {len(same)} cells: within {GOAL_TIME:g}× of the lower "
               f"of FedBuff's and s = 1's in {near_count(same)}, the goal met in "
               f"{sum(v.met for _, _, v, _ in same)}, at worst {worst_cell(same)[1]:.2f}×)"
               if same else "")
            + ". Beside the verdict, which stays as registered; the evaluation seeds are the "
            "ones whose reading of amendment 24 suggested this rule"
            + (f". Not read yet: {', '.join(missing)}" if missing else "")
            + ". " + FOOTNOTE + "\n\n" + table(
                ["cell", "FedBuff", "s = 1", "θ = 0.75", f"{later.symbol} = {pick:g}",
                 "over FedBuff",
                 "over θ = 0.75", "over the lower of FedBuff and s = 1 (medians)",
                 "replicated", "goal with it (over the best rival)",
                 "the best rival that does not code, over it"], rows))


def against_bar(read: Read, method: str, bar: Mapping[str, Any],
                replication: Mapping[str, Any], cells: Mapping[str, Mapping[str, Any]],
                report: Sequence[str]) -> tuple[Read, int, int, int]:
    """Amendment 24's bar on the cells ``read``: its reading there, and in how many of them
    both ran, ``method``'s median was lower, and higher."""
    names = {name for name, *_ in read}
    same = read_cells({"cells": {k: v for k, v in bar.get("cells", {}).items() if k in names}},
                      replication, cells, report, BAR_METHOD)
    both = [(stats[method].median_time, stats[BAR_METHOD].median_time)
            for _, stats, _, _ in read if BAR_METHOD in stats]
    return (same, len(both), sum(mine < theirs for mine, theirs in both),
            sum(mine > theirs for mine, theirs in both))


def _loaded(later: Later) -> tuple[Mapping[str, Any], Mapping[str, Any], Mapping[str, Any],
                                   dict[str, Mapping[str, Any]]] | None:
    """``later``'s results, amendment 24's, amendment 23's and the benchmark's cells (``None``
    while one is missing)."""
    if not all((RESULTS / f).exists() for f in (later.file, BAR, ASYNC, COMPARE)):
        return None
    replication = load(ASYNC)
    return (load(later.file), load(BAR), replication,
            benchmark_cells(replication, load(COMPARE)))


def _block(later: Later) -> str | None:
    got = _loaded(later)
    return None if got is None else render(*got, reported_cells(), later)


@block("async-margin")
def async_margin() -> str | None:
    return _block(MARGIN_READING)


@block("async-need")
def async_need() -> str | None:
    return _block(NEED_READING)


@block("async-latch")
def async_latch() -> str | None:
    return _block(LATCH_READING)


@block("async-era")
def async_era() -> str | None:
    return _block(ERA_READING)


@block("async-prior")
def async_prior() -> str | None:
    return _block(PRIOR_READING)


@block("async-lag")
def async_lag() -> str | None:
    return _block(LAG_READING)


def _against_text(facts: Against) -> str:
    """A candidate's evaluation reading against FedBuff alone, in the README's words."""
    return (f"within {GOAL_TIME:g}× of FedBuff's median time in {facts.near_fedbuff} of "
            f"{facts.cells} cells, slower than it beyond chance (a paired 95 % interval) "
            f"in {len(facts.slower)} and faster in {len(facts.faster)}, the goal (against "
            f"the best rival) met in {facts.met}")


def lag_headline() -> str:
    """The README's sentence when ``s='auto'`` runs amendment 32's class reading: why (its
    development worst against the fixed ``s = 1``'s), and its evaluation reading beside the
    fixed ``s = 1``'s, against FedBuff alone and by the goal (empty without the files or
    before any evaluation run)."""
    fixed = fixed_rule()
    got = _loaded(LAG_READING)
    if fixed is None or got is None:
        return ""
    data, bar, replication, cells = got
    mine = read_cells(data, replication, cells, reported_cells(), LAG_READING.method, bar)
    if not mine:
        return ""
    names = {name for name, *_ in mine}
    theirs_data = {**fixed[1], "cells": {k: v for k, v in fixed[1]["cells"].items()
                                         if k in names}}
    theirs = read_cells(theirs_data, replication, cells, reported_cells(), fixed[2])

    ours = against_fedbuff(mine, data, LAG_READING.method, replication, cells)
    before = against_fedbuff(theirs, theirs_data, fixed[2], replication, cells)
    dev, fixed_dev = data["dev"], fixed[1]["dev"]
    hard = [v for _, _, v, _ in mine if v.hard]
    missing = missing_cells(data, replication, reported_cells())
    return (f" With no development seeds of its own, `s='auto'` runs amendment "
            f"{LAG_AMENDMENT}'s class reading (FedBuff until the server's evaluation shows the "
            f"median class recall at {float(dev['pick']):g} while a class has never been "
            f"above {LAG_FLOOR:g}, then s = 1's least-served rule for good): on the "
            "development seeds its worst ratio to the best fixed s, "
            f"{float(dev['worst'][str(dev['pick'])]):.2f}×, was below the fixed s = 1's "
            f"({float(fixed_dev['worst']['1']):.2f}×, which ran before it), the rule every "
            f"amendment applied; on the evaluation seeds it was {_against_text(ours)}; the fixed "
            f"s = 1 in the same cells {_against_text(before)}. Where stragglers are persistent or "
            "heavy-tailed on non-IID data it is at least 2× faster than the best rival that "
            f"does not code in {sum(v.fast for v in hard)} of {len(hard)}"
            + (f"; not read yet: {len(missing)} cells" if missing else "")
            + " ([all of them](docs/adaptive.md#coded-asynchrony-that-reacts)).")


def fixed_headline() -> str:
    """The README's sentence when ``s='auto'`` runs the fixed ``s = 1`` (amendment 30): why
    (its development worst against the online rules'), and its evaluation reading beside
    that of the online rule it replaced, against FedBuff alone (a reference neither is) and
    by the goal (empty without the files)."""
    fixed = fixed_rule()
    got = _loaded(LATCH_READING)
    if fixed is None or got is None:
        return ""
    data, bar, replication, cells = got
    online = read_cells(data, replication, cells, reported_cells(), LATCH_READING.method, bar)
    mine = read_cells(fixed[1], replication, cells, reported_cells(), fixed[2])
    if not (mine and online):
        return ""

    ours = against_fedbuff(mine, fixed[1], fixed[2], replication, cells)
    theirs = against_fedbuff(online, data, LATCH_READING.method, replication, cells)
    pairs = [(ours.near_fedbuff, theirs.near_fedbuff), (ours.met, theirs.met)]
    verdict_text = ("did as well there" if all(a == b for a, b in pairs)
                    else "did not do better there" if all(a <= b for a, b in pairs)
                    else "did better there" if all(a >= b for a, b in pairs)
                    else "did better by one count and worse by the other there")
    dev = fixed[1]["dev"]
    hard = [v for _, _, v, _ in mine if v.hard]
    return (f" With no development seeds of its own, `s='auto'` runs the fixed s = 1 "
            f"(amendment {FIXED_AMENDMENT}, added to the candidates after the online rules' "
            "evaluation runs): on the development seeds its worst ratio to the best fixed s, "
            f"{float(dev['worst']['1']):.2f}×, was below that of each of the {registered()} "
            f"online rules registered (the best {dev_worst_min():.2f}×), the rule every "
            "amendment applied; on the evaluation seeds it was "
            f"{_against_text(ours)}; the online rule it replaced (amendment 27) "
            f"{_against_text(theirs)}: the development pick "
            f"{verdict_text}. Where stragglers are persistent or heavy-tailed on non-IID data "
            "s = 1 is at least 2× faster than the best rival that does not code in "
            f"{sum(v.fast for v in hard)} of {len(hard)} "
            "([all of them](docs/adaptive.md#coded-asynchrony-that-reacts)).")


def headline() -> str:
    """One sentence for the README's coded-asynchrony line on the rule ``s='auto'`` runs
    (amendment 24's bar, amendment 26's to 29's rule when their development reading ranked
    first, or amendment 30's fixed s = 1, :func:`fixed_headline`; empty without its
    evaluation reading)."""
    from fl_gradcode.flower.asynchronous import (
        AUTO_NEED_LATCH,
        AUTO_NEED_RATIO,
        AUTO_NEED_REFERENCE,
        AUTO_REPLICATE_BELOW,
        AUTO_REPLICATE_MARGIN,
    )

    if AUTO_REPLICATE_MARGIN:
        raise ValueError("the README sentence describes no margin; say what s='auto' runs")
    amendment = auto_amendment()
    if amendment == LAG_AMENDMENT:
        return lag_headline()
    if amendment == FIXED_AMENDMENT:
        return fixed_headline()
    if not AUTO_NEED_LATCH and AUTO_NEED_RATIO == float("inf"):
        return bar_headline()
    later = {29: PRIOR_READING, 28: ERA_READING, 27: LATCH_READING}.get(amendment,
                                                                        NEED_READING)
    lift = "while" if amendment == 26 else "once"
    larger = ("its recent updates were over {:g}× the median of their era's"
              if AUTO_NEED_REFERENCE in ("era", "cohort")
              else "its last update was over {:g}× the own partition's")
    got = _loaded(later)
    if got is None:
        return ""
    data, bar, replication, cells = got
    read = read_cells(data, replication, cells, reported_cells(), later.method, bar)
    if not read:
        return ""
    near = near_count(read)
    worst = worst_cell(read)
    same, _, _, slower = against_bar(read, later.method, bar, replication, cells,
                                     reported_cells())
    return (f" With no development seeds of its own, `s='auto'` (amendment {amendment}: s = 1, "
            f"a neighbour's partition served below {AUTO_REPLICATE_BELOW:g}× the client's own, "
            "and as much as it "
            f"{lift} {larger.format(AUTO_NEED_RATIO)}) was "
            f"within {GOAL_TIME:g}× of the lower of FedBuff's and s = 1's median time in "
            f"{near} of {len(read)} cells read, at worst {worst[1]:.2f}× ({worst[0]}), the "
            f"earlier bar 0.75 in {near_count(same)} of the same cells, at worst "
            f"{worst_cell(same)[1]:.2f}×; picked by its worst development ratio, it was slower "
            "than "
            f"that bar by median in {slower} of them; it ranked first of the {registered()} "
            "online rules registered"
            + (f", none of which came within {GOAL_TIME:g}× of the best fixed s in every "
               f"development cell (the best at worst {dev_worst_min():.2f}×)"
               if dev_worst_min() > GOAL_TIME else "")
            + " ([all of them](docs/adaptive.md#coded-asynchrony-that-reacts)).")

