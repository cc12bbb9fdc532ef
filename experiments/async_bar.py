"""Coded asynchrony that reacts to what it observes: FedBuff over replicated partitions whose
clients serve a neighbour's partition only while it falls behind their own
(``experiments/grid.toml``, amendment 24), read beside the benchmark's verdict.

``python -m experiments.async_bar --phase dev`` picks ONE ``replicate_below`` (``theta``) for
every cell on the development seeds of the fifteen cheapest cells of amendment 23's order;
``python -m experiments.async_bar --phase eval [--cells PATTERNS]`` runs the pick on the
evaluation seeds of the cells given (amendment 23's order), paired by seed with the
benchmark's FedBuff and amendment 23's ``s = 1`` (same draws). The placement is amendment 23's
``s = 1`` (:class:`fl_gradcode.flower.asynchronous.ReplicatedFedBuff`); FedBuff's settings are
as tuned in each cell. FedBuff: Nguyen et al., AISTATS 2022,
https://arxiv.org/abs/2106.06639; the placement: Tandon et al., *Gradient Coding*, ICML 2017.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from experiments.async_replication import cell_of, cell_order, finished_cells, stored
from experiments.auto_lr import paired_ratio
from experiments.common import harness_environment, matching_cells, save_reading
from experiments.compare import load_grid
from experiments.deadline_best import tried_record
from experiments.rival_runs import run_replicated

__all__ = [
    "BAR",
    "CHOICES",
    "ERA",
    "LAG",
    "LATCH",
    "MARGIN",
    "METHOD",
    "NEED",
    "PRIOR",
    "RULE",
    "Reading",
    "auto_rule",
    "choose",
    "command",
    "dev_cells",
    "fixed_dev",
    "main",
    "ratio_to_best",
    "read_cell",
    "settings_of",
]

COMPARE = Path("results/compare.json")
REPLICATION = Path("results/async_replication.json")
OUT = Path("results/async_bar.json")
METHOD = "fedbuff-bar"
#: amendment 24: the placement, the bars tried, the tie-break, how many cells tune it
S = 1
CHOICES = (0.25, 0.5, 0.75)
TIE = 0.5
DEV_CELLS = 15
RULE = ("one theta for every cell among 0.25, 0.5, 0.75: per development cell, theta's median "
        "time to target over the development seeds (never reached: infinite) over the lowest "
        "of amendment 23's development medians for s = 0, 1, 2 (both infinite: 1; only "
        "theta's: infinite); the lowest worst ratio over the cells, then the lowest median "
        "ratio, then 0.5")


@dataclass(frozen=True)
class Reading:
    """One registered rule over amendment 23's placement ``s = 1``: its method's name, the
    knob it picks ONE value of for every cell (``choices``, ties to ``prefer`` then the
    lower), the rule's words, its results file and the ReplicatedFedBuff keywords of a
    value."""

    method: str
    knob: str
    choices: tuple[float, ...]
    prefer: float
    rule: str
    out: Path
    prog: str
    fixed: Mapping[str, Any] = field(default_factory=dict)

    def keywords(self, value: float) -> dict[str, Any]:
        """``run_replicated``'s keywords for one value of the knob."""
        return {**self.fixed, self.knob: float(value)}


#: amendment 24: the bar theta
BAR = Reading(METHOD, "replicate_below", CHOICES, TIE, RULE, OUT, "experiments.async_bar")
#: amendment 25: the margin z beside amendment 24's bar
MARGIN = Reading(
    "fedbuff-margin", "replicate_margin", (0.0, 1.0, 2.0, 3.0), 0.0,
    "one z for every cell among 0, 1, 2, 3 beside amendment 24's bar 0.75: per development "
    "cell, z's median time to target over the development seeds (never reached: infinite) "
    "over the lowest of amendment 23's development medians for s = 0, 1, 2 (both infinite: "
    "1; only z's: infinite); the lowest worst ratio over the cells, then the lowest median "
    "ratio, then the lower z",
    Path("results/async_margin.json"), "experiments.async_margin",
    {"replicate_below": 0.75})
#: amendment 26: the need ratio rho beside the bar 0.25
NEED = Reading(
    "fedbuff-need", "need_ratio", (1.25, 1.5, 2.0), 1.5,
    "one rho for every cell among 1.25, 1.5, 2 beside the bar 0.25 (a neighbour's partition "
    "whose last update was more than rho times as large as the own partition's is served "
    "as much as it): per development cell, rho's median time to target over the development "
    "seeds (never reached: infinite) over the lowest of amendment 23's development medians "
    "for s = 0, 1, 2 (both infinite: 1; only rho's: infinite); the lowest worst ratio over "
    "the cells, then the lowest median ratio, then 1.5",
    Path("results/async_need.json"), "experiments.async_need", {"replicate_below": 0.25})
#: amendment 27: the need ratio rho, latched, beside the bar 0.25
LATCH = Reading(
    "fedbuff-latch", "need_ratio", (1.5, 2.0, 3.0), 2.0,
    "one rho for every cell among 1.5, 2, 3 beside the bar 0.25, latched (a neighbour's "
    "partition whose last update was once more than rho times as large as the own "
    "partition's is served as much as it for the rest of the run): per development cell, "
    "rho's median time to target over the development seeds (never reached: infinite) over "
    "the lowest of amendment 23's development medians for s = 0, 1, 2 (both infinite: 1; "
    "only rho's: infinite); the lowest worst ratio over the cells, then the lowest median "
    "ratio, then 2",
    Path("results/async_latch.json"), "experiments.async_latch",
    {"replicate_below": 0.25, "need_latch": True})
#: amendment 28: the need ratio rho against the era, latched, beside the bar 0.25
ERA = Reading(
    "fedbuff-era", "need_ratio", (1.5, 2.0, 3.0), 2.0,
    "one rho for every cell among 1.5, 2, 3 beside the bar 0.25, latched, read against the "
    "era (a partition whose last three updates' norms, each over the median norm of the "
    "updates computed from the models of its own server step and the two before, have a "
    "geometric mean above rho, once it has two, is served as much as its holder's own "
    "partition for the rest of the run): per development cell, rho's median time to target "
    "over the development seeds (never reached: infinite) over the lowest of amendment 23's "
    "development medians for s = 0, 1, 2 (both infinite: 1; only rho's: infinite); the "
    "lowest worst ratio over the cells, then the lowest median ratio, then 2",
    Path("results/async_era.json"), "experiments.async_era",
    {"replicate_below": 0.25, "need_latch": True, "need_reference": "era"})
#: amendment 29: the need ratio rho against a cohort's era, latched, with the prior
PRIOR = Reading(
    "fedbuff-prior", "need_ratio", (1.5, 2.0, 3.0), 2.0,
    "one rho for every cell among 1.5, 2, 3 beside the bar 0.25, latched, read against a "
    "cohort's era, with the prior (amendment 28's rule with the era spanning ceil(cohort / "
    "K) steps before an update's own, and a partition read fewer than twice served as if "
    "needed): per development cell, rho's median time to target over the development seeds "
    "(never reached: infinite) over the lowest of amendment 23's development medians for "
    "s = 0, 1, 2 (both infinite: 1; only rho's: infinite); the lowest worst ratio over the "
    "cells, then the lowest median ratio, then 2",
    Path("results/async_prior.json"), "experiments.async_prior",
    {"replicate_below": 0.25, "need_latch": True, "need_reference": "cohort",
     "need_prior": True})

#: amendment 32: the class reading's level L (the bar 0 until it trips, then 1 for good)
LAG = Reading(
    "fedbuff-lag", "lag_level", (0.8, 0.9, 0.95), 0.9,
    "one L for every cell among 0.8, 0.9, 0.95 beside the bar 0 (FedBuff until it trips: "
    "once the median class recall on the held-out data is at least L while some class's "
    "best recall so far is below 0.1, every held partition gets the bar 1 for the rest of "
    "the run): per development cell, L's median time to target over the development seeds "
    "(never reached: infinite) over the lowest of amendment 23's development medians for "
    "s = 0, 1, 2 (both infinite: 1; only L's: infinite); the lowest worst ratio over the "
    "cells, then the lowest median ratio, then 0.9",
    Path("results/async_lag.json"), "experiments.async_lag", {"replicate_below": 0.0})


def dev_cells(grid: Mapping[str, Any], names: Sequence[str]) -> list[str]:
    """The cells the bar is picked on: the first :data:`DEV_CELLS` of amendment 23's order."""
    return cell_order(grid, list(names))[:DEV_CELLS]


def _median(record: Mapping[str, Any]) -> float:
    value = record["median_time_to_target_all_seeds"]
    return math.inf if value is None else float(value)


def ratio_to_best(mine: Mapping[str, Any], fixed: Mapping[str, Mapping[str, Any]]) -> float:
    """``mine``'s development median over the lowest of the fixed settings' (records of
    :func:`experiments.deadline_best.tried_record`): both infinite 1, only mine infinite."""
    best = min(_median(r) for r in fixed.values())
    own = _median(mine)
    if math.isinf(best):
        return 1.0 if math.isinf(own) else 0.0
    if best <= 0:
        return 1.0 if own <= 0 else math.inf
    return own / best


def choose(ratios: Mapping[float, Sequence[float]], prefer: float = TIE) -> float:
    """:data:`RULE`'s pick among ``ratios`` (a value -> its ratio in each cell): the lowest
    worst ratio, then the lowest median, then ``prefer``; a tie the rule leaves open (two
    other values equal on both ratios) goes to the lower value (the lower bar is nearer
    FedBuff; the lower margin nearer amendment 24)."""
    def score(value: float) -> tuple:
        values = list(ratios[value])
        return (max(values), statistics.median(values), value != prefer, value)
    return min(ratios, key=score)


def dev_phase(grid: Mapping[str, Any], data: Mapping[str, Mapping[str, Any]],
              replication: Mapping[str, Any], log: Callable[[str], None] = print,
              reading: Reading = BAR) -> dict[str, Any]:
    """Every value of ``reading``'s knob on the development seeds of :func:`dev_cells`; the
    pick."""
    cells: dict[str, Any] = {}
    for name in dev_cells(grid, list(data)):
        settings = data[name]["settings"]
        spec = cell_of(grid, settings)
        fixed = replication["cells"][name]["tuning"]
        tried = {}
        for value in reading.choices:
            runs = []
            for seed in settings["dev_seeds"]:
                runs.append(stored(run_replicated(S, int(seed), spec,
                                                  **reading.keywords(value))))
                log(f"  {name} {reading.knob} {value} seed {seed}: "
                    f"{runs[-1]['time_to_target']}")
            record = tried_record(runs)
            tried[str(value)] = {**record, "ratio_to_best_fixed": ratio_to_best(record, fixed),
                                 "replicated": [r["replicated"] for r in runs]}
        cells[name] = {"tried": tried, "fixed": {s: _median(r) for s, r in fixed.items()}}
    ratios = {value: [cells[c]["tried"][str(value)]["ratio_to_best_fixed"] for c in cells]
              for value in reading.choices}
    return {"rule": reading.rule, "cells": cells, "pick": choose(ratios, reading.prefer),
            "worst": {str(t): max(v) for t, v in ratios.items()},
            "median": {str(t): statistics.median(v) for t, v in ratios.items()}}


def read_cell(grid: Mapping[str, Any], name: str, cell: Mapping[str, Any],
              replication: Mapping[str, Any], theta: float,
              log: Callable[[str], None] = print, reading: Reading = BAR,
              earlier: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """The pick (``theta``: the value of ``reading``'s knob) run on the evaluation seeds of
    one finished cell, paired with FedBuff's, amendment 23's ``s = 1`` and, when given, an
    earlier reading's runs (``over_earlier``)."""
    t0 = time.perf_counter()
    settings = cell["settings"]
    spec = cell_of(grid, settings)
    runs = []
    for seed in settings["seeds"]:
        runs.append({**stored(run_replicated(S, int(seed), spec, **reading.keywords(theta))),
                     "method": reading.method})
        log(f"  {name} seed {seed}: {runs[-1]['time_to_target']}")
    fedbuff = [r for r in cell["runs"] if r["method"] == "fedbuff"]
    s1 = [r for r in replication["cells"].get(name, {}).get("runs", [])
          if r["method"] == f"fedbuff-replicated:{S}"]
    auto = [r for r in cell["runs"] if r["method"] == "auto"]
    return {"cell": name, "theta": theta, "s": S, "runs": runs,
            **({"over_earlier": paired_ratio(runs, earlier)} if earlier else {}),
            "over_fedbuff": paired_ratio(runs, fedbuff),
            "over_s1": paired_ratio(runs, s1) if s1 else None,
            "over_auto": paired_ratio(runs, auto),
            "runtime_s": time.perf_counter() - t0}


def fixed_dev(bar: Mapping[str, Any], s: int = 1) -> dict[str, Any] | None:
    """The fixed ``s``'s development record in the shape of a rule's (amendment 30): per
    development cell of amendment 24's record ``bar``, amendment 23's median for ``s`` over
    the lowest of its medians for s = 0, 1, 2 (:func:`ratio_to_best`'s conventions), and the
    worst and median of those ratios (``pick``: ``s``); ``None`` without the cells."""
    cells = bar.get("cells")
    if not cells:
        return None

    def record(value: float) -> dict[str, float]:
        return {"median_time_to_target_all_seeds": value}

    ratios = {name: ratio_to_best(record(cell["fixed"][str(s)]),
                                  {k: record(v) for k, v in cell["fixed"].items()})
              for name, cell in cells.items()}
    return {"pick": s, "worst": {str(s): max(ratios.values())},
            "median": {str(s): statistics.median(ratios.values())},
            "cells": {name: {"tried": {str(s): {"ratio_to_best_fixed": r}}}
                      for name, r in ratios.items()}}


def auto_rule(bar: Mapping[str, Any], margin: Mapping[str, Any] | None = None,
              need: Mapping[str, Any] | None = None, latch: Mapping[str, Any] | None = None,
              era: Mapping[str, Any] | None = None, prior: Mapping[str, Any] | None = None,
              lag: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ReplicatedFedBuff keywords the main job's ``s="auto"`` runs, from the development
    records (``dev``) of amendments 24, 25 and 26 on record, by the grid file's rules:
    amendment 24's bar; amendment 25's margin beside it, whatever its ratios; amendment 26's
    rule in their place when its pick's worst development ratio is lower (then its median;
    a tie keeps what runs); amendment 27's, then 28's, then 29's, by the same test, each in
    the place of what runs then; then amendment 30's fixed s = 1 (the bar 1, no need rule;
    :func:`fixed_dev` of ``bar``) by the same test; then amendment 32's class reading
    (``lag``) by the same test."""
    def score(dev: Mapping[str, Any]) -> tuple[float, float]:
        pick = str(dev["pick"])
        return float(dev["worst"][pick]), float(dev["median"][pick])

    rule = {**BAR.keywords(float(bar["pick"]))}
    best = score(bar)
    if margin is not None:
        rule = {**MARGIN.keywords(float(margin["pick"]))}
        best = score(margin)
    for reading, dev in ((NEED, need), (LATCH, latch), (ERA, era), (PRIOR, prior)):
        if dev is not None and score(dev) < best:
            rule, best = {**reading.keywords(float(dev["pick"]))}, score(dev)
    fixed = fixed_dev(bar)
    if fixed is not None and score(fixed) < best:
        rule, best = {"replicate_below": 1.0}, score(fixed)
    if lag is not None and score(lag) < best:
        rule = {**LAG.keywords(float(lag["pick"]))}
    return rule


def settings_of(reading: Reading) -> dict[str, Any]:
    """What a reading's results file says it ran."""
    return {"rule": reading.rule, "choices": list(reading.choices), "s": S,
            "compare": str(COMPARE), "replication": str(REPLICATION),
            **({"knob": reading.knob, "fixed": dict(reading.fixed)} if reading != BAR else {})}


#: what ``results/async_bar.json`` says it ran
SETTINGS = settings_of(BAR)


def main(argv: Sequence[str] | None = None, reading: Reading = BAR,
         description: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {reading.prog}",
                                     description=description or __doc__.split("\n\n")[0])
    parser.add_argument("--phase", choices=("dev", "eval"), required=True)
    parser.add_argument("--cells", default="*", help="comma-separated patterns (fnmatch) of "
                        "finished cells (eval), run in amendment 23's order")
    parser.add_argument("--out", type=Path, default=reading.out)
    args = parser.parse_args(argv)
    grid = load_grid()
    data = finished_cells(COMPARE)
    replication = json.loads(REPLICATION.read_text())
    if args.phase == "dev":
        with harness_environment():
            dev = dev_phase(grid, data, replication, reading=reading)
        save_reading(args.out, settings_of(reading), dev=dev)
        print(f"{reading.method}: picked {reading.knob} {dev['pick']} (worst {dev['worst']}, "
              f"median {dev['median']})", flush=True)
        return 0
    stored_dev = json.loads(args.out.read_text()).get("dev") if args.out.exists() else None
    if not stored_dev:
        raise SystemExit(f"python -m {reading.prog} --phase eval: {args.out} holds no "
                         "development pick; run --phase dev first")
    names = matching_cells(cell_order(grid, list(data)), args.cells, reading.prog)
    bar_cells = (json.loads(BAR.out.read_text()).get("cells", {})
                 if reading != BAR and BAR.out.exists() else {})
    for name in names:
        print(f"{reading.method}: {name}", flush=True)
        with harness_environment():
            got = read_cell(grid, name, data[name], replication, float(stored_dev["pick"]),
                            reading=reading,
                            earlier=bar_cells.get(name, {}).get("runs", ()))
        save_reading(args.out, settings_of(reading), (name, got))
        print(f"{reading.method}: {name}: over FedBuff {got['over_fedbuff']['geomean']}, over "
              f"s = 1 {(got['over_s1'] or {}).get('geomean')}", flush=True)
    return 0


def command(reading: Reading, doc: str | None) -> Callable[[Sequence[str] | None], int]:
    """A later reading's command line (``--phase dev|eval``, ``--cells``, ``--out``), its help
    the first paragraph of ``doc``."""
    def run(argv: Sequence[str] | None = None) -> int:
        return main(argv, reading, (doc or "").split("\n\n")[0] or None)
    return run


if __name__ == "__main__":
    raise SystemExit(main())
