"""Amendments 28 and 29 (``python -m experiments.async_era`` and ``async_prior``): the rules
run through the harness as the class's ``need_reference`` and ``need_prior``, each run
records how many partitions its latch lifted, and the overview of every online rule says
which one ``s='auto'`` runs."""

from __future__ import annotations

import math

import pytest

from experiments.async_bar import ERA, PRIOR, choose

pytestmark = [
    pytest.mark.filterwarnings("ignore:fraction_evaluate"),
    pytest.mark.filterwarnings("ignore:gradient_coding_mod. no partition key:UserWarning"),
]


def test_the_era_readings_pick_by_the_worst_then_the_median_then_two():
    for reading in (ERA, PRIOR):
        assert choose({1.5: [1.2, 1.0], 2.0: [1.2, 1.0], 3.0: [1.2, 0.9]},
                      reading.prefer) == 3.0
        assert choose({1.5: [1.2, 1.0], 2.0: [1.2, 1.0], 3.0: [1.3, 0.9]},
                      reading.prefer) == 2.0
    assert ERA.keywords(2) == {"replicate_below": 0.25, "need_latch": True,
                               "need_reference": "era", "need_ratio": 2.0}
    assert PRIOR.keywords(3) == {"replicate_below": 0.25, "need_latch": True,
                                 "need_reference": "cohort", "need_prior": True,
                                 "need_ratio": 3.0}


def test_each_run_records_its_rule_and_how_many_partitions_its_latch_lifted(small_cell):
    from experiments.async_replication import cell_of
    from experiments.rival_runs import run_replicated

    grid, result = small_cell
    spec = cell_of(grid, result["settings"])
    era = run_replicated(1, 10, spec, **ERA.keywords(1.0))
    prior = run_replicated(1, 10, spec, **PRIOR.keywords(1.0))
    assert era["method"] == "fedbuff-replicated:1@0.25^1%!"
    assert prior["method"] == "fedbuff-replicated:1@0.25^1%c?!"
    assert (era["need_reference"], prior["need_reference"], prior["need_prior"]) == (
        "era", "cohort", True)
    never = run_replicated(1, 10, spec, **ERA.keywords(1e9))
    assert never["needed"] == 0 < era["needed"] and 0 < prior["needed"]
    # the prior serves an unread partition as much as the own one: more replication
    assert prior["replicated"] > era["replicated"]


def _dev(pick, worst, median, needed_ratio):
    cells = {"slow-classes-2/digits-logreg/persistent/100x100": needed_ratio,
             "digits-logreg/bimodal/20x20": worst}
    return {"pick": pick, "worst": {str(pick): worst}, "median": {str(pick): median},
            "cells": {name: {"tried": {str(pick): {"ratio_to_best_fixed": r}}}
                      for name, r in cells.items()}}


def test_the_overview_says_which_rule_auto_runs_and_which_were_never_evaluated():
    import json
    from pathlib import Path

    from experiments.async_bar import BAR, LAG, LATCH, MARGIN, NEED, auto_rule
    from tools.docgen.async_rules import RULES, _row

    root = Path(__file__).resolve().parents[2]

    def dev(reading):
        path = root / reading.out
        return json.loads(path.read_text())["dev"] if path.exists() else None

    # the registered rule on the records on file, computed apart from the overview
    rule = auto_rule(dev(BAR), dev(MARGIN), dev(NEED), dev(LATCH), dev(ERA), dev(PRIOR),
                     dev(LAG))
    empty: dict = {"cells": {}, "settings": {"slow_classes": {}}}
    runs = []
    for amendment, _file, method, what, knob in RULES:
        reading = {24: BAR, 25: MARGIN, 26: NEED, 27: LATCH, 28: ERA, 29: PRIOR,
                   32: LAG}[amendment]
        record = dev(reading)
        if record is None:
            continue
        row, _ = _row(amendment, {"dev": record}, method, what, knob, empty, {})
        assert row[7] in ("not run", "amendment 24's runs (the same rule)")
        same = reading.keywords(float(record["pick"])) == rule and (amendment, record["pick"]) \
            != (25, 0.0)
        assert (row[6] == "yes") == same, amendment
        runs.append(row[6])
    # the fixed s = 1 (amendment 30) runs when the rule computed apart is the bar 1 alone
    from tools.docgen.async_rules import fixed_rule

    fixed = fixed_rule()
    if fixed is not None:
        row, _ = _row(*fixed, empty, {})
        assert (row[6] == "yes") == (rule == {"replicate_below": 1.0})
        runs.append(row[6])
    assert runs.count("yes") == 1
    latch, _ = _row(27, {"dev": _dev(1.5, 1.8, 1.09, 1.65)}, "fedbuff-latch", "as 26, latched",
                 "ρ", empty, {})
    assert latch[2:6] == ["ρ = 1.5", "1.80 (digits-logreg/bimodal/20x20)", "1.09", "1.65"]
    other, _ = _row(27, {"dev": _dev(7.0, math.inf, 1.0, math.inf)}, "fedbuff-latch",
                 "as 26, latched", "ρ", empty, {})
    assert other[3].startswith("∞") and other[6] == "no"
