"""Coded asynchrony that reacts (``python -m experiments.async_bar``): the rule that picks one
bar for every cell, a reading on a small cell paired with its FedBuff runs, and the generated
block's counts."""

from __future__ import annotations

import math

import pytest

from experiments import compare
from experiments.async_bar import choose, ratio_to_best, read_cell


def _rec(time):
    return {"median_time_to_target_all_seeds": time, "median_final_accuracy": 0.9}


def test_the_ratio_is_to_the_best_fixed_setting_and_reads_never_as_infinite():
    fixed = {"0": _rec(4.0), "1": _rec(2.0), "2": _rec(None)}
    assert ratio_to_best(_rec(3.0), fixed) == pytest.approx(1.5)
    assert math.isinf(ratio_to_best(_rec(None), fixed))
    never = {"0": _rec(None), "1": _rec(None)}
    assert ratio_to_best(_rec(None), never) == 1.0
    assert ratio_to_best(_rec(5.0), never) == 0.0


def test_the_pick_has_the_lowest_worst_ratio_then_median_then_one_half():
    assert choose({0.25: [1.0, 1.6], 0.5: [1.2, 1.3], 0.75: [1.0, 1.4]}) == 0.5
    assert choose({0.25: [1.0, 1.3], 0.5: [1.2, 1.3], 0.75: [1.1, 1.3, 1.3]}) == 0.25
    assert choose({0.25: [1.3, 1.3], 0.5: [1.3, 1.3], 0.75: [1.3, 1.3]}) == 0.5
    assert choose({0.25: [1.3, 1.3], 0.75: [1.3, 1.3]}) == 0.25
    assert choose({0.25: [math.inf], 0.5: [9.0], 0.75: [math.inf]}) == 0.5


def test_a_reading_runs_the_bar_on_the_evaluation_seeds_paired_with_fedbuff(small_cell,
                                                                            monkeypatch):
    from experiments.async_replication import cell_of
    from experiments.rival_runs import run_replicated
    from fl_gradcode.flower.asynchronous import ReplicatedFedBuff, cyclic_placement

    grid, cell = small_cell
    with compare.harness_environment():
        reading = read_cell(grid, "small", cell, {"cells": {}}, 0.0, log=lambda _: None)
        at_one = read_cell(grid, "small", cell, {"cells": {}}, 1.0, log=lambda _: None)

        def least_served(self, node):  # amendment 23's rule, written out again
            ident = self.identities[node]
            held = cyclic_placement(ident.partition_id, ident.num_partitions, self.s)
            return min(held, key=lambda j: (self.served.get(j, 0), held.index(j)))

        monkeypatch.setattr(ReplicatedFedBuff, "choose", least_served)
        fixed = [{**run_replicated(1, seed, cell_of(grid, cell["settings"])), "s": 1}
                 for seed in (10, 11)]
    fedbuff = [r for r in cell["runs"] if r["method"] == "fedbuff"]
    # a bar of 0 is FedBuff: the same times as the cell's own FedBuff runs, nothing replicated
    assert [r["time_to_target"] for r in reading["runs"]] == [
        r["time_to_target"] for r in fedbuff]
    assert all(r["replicated"] == 0 for r in reading["runs"])
    assert reading["over_fedbuff"]["paired"] == sum(
        r["time_to_target"] is not None for r in fedbuff)
    assert reading["over_s1"] is None  # no reading of s = 1 given
    # a bar of 1 is the least-served rule of amendment 23, run for run
    assert [(r["time_to_target"], r["final_accuracy"], r["updates_per_partition"])
            for r in at_one["runs"]] == [
        (r["time_to_target"], r["final_accuracy"], r["updates_per_partition"]) for r in fixed]


def test_s_auto_runs_the_rule_the_development_records_on_record_pick():
    import json
    import math
    from pathlib import Path

    from experiments.async_bar import BAR, ERA, LAG, LATCH, MARGIN, NEED, PRIOR, auto_rule
    from fl_gradcode.flower.asynchronous import (
        AUTO_LAG_LEVEL,
        AUTO_NEED_LATCH,
        AUTO_NEED_PRIOR,
        AUTO_NEED_RATIO,
        AUTO_NEED_REFERENCE,
        AUTO_REPLICATE_BELOW,
        AUTO_REPLICATE_MARGIN,
        AUTO_S,
    )

    root = Path(__file__).resolve().parents[2]
    dev = json.loads((root / BAR.out).read_text())["dev"]
    ratios = {float(t): [c["tried"][t]["ratio_to_best_fixed"] for c in dev["cells"].values()]
              for t in dev["worst"]}
    assert choose(ratios) == dev["pick"]

    def later(reading):
        path = root / reading.out
        return json.loads(path.read_text())["dev"] if path.exists() else None

    rule = {"replicate_below": 1.0, "replicate_margin": 0.0, "need_ratio": math.inf,
            "need_latch": False, "need_reference": "own", "need_prior": False,
            "lag_level": None,
            **auto_rule(dev, later(MARGIN), later(NEED), later(LATCH), later(ERA),
                        later(PRIOR), later(LAG))}
    assert (rule["replicate_below"], rule["replicate_margin"], rule["need_ratio"],
            rule["need_latch"], rule["need_reference"], rule["need_prior"],
            rule["lag_level"]) == (
        AUTO_REPLICATE_BELOW, AUTO_REPLICATE_MARGIN, AUTO_NEED_RATIO, AUTO_NEED_LATCH,
        AUTO_NEED_REFERENCE, AUTO_NEED_PRIOR, AUTO_LAG_LEVEL) and AUTO_S == 1


def test_auto_takes_the_margin_whatever_and_the_need_rule_only_when_it_ranks_first():
    from experiments.async_bar import auto_rule

    def dev(pick, worst, median):
        return {"pick": pick, "worst": {str(pick): worst}, "median": {str(pick): median}}

    bar = dev(0.75, 2.0, 1.0)
    assert auto_rule(bar) == {"replicate_below": 0.75}
    assert auto_rule(bar, dev(2.0, 3.0, 1.0)) == {"replicate_below": 0.75,
                                                  "replicate_margin": 2.0}
    assert auto_rule(bar, dev(0.0, 2.0, 1.0), dev(1.5, 2.0, 1.0)) == {
        "replicate_below": 0.75, "replicate_margin": 0.0}  # a tie keeps what runs
    assert auto_rule(bar, dev(0.0, 2.0, 1.0), dev(1.5, 2.0, 0.9)) == {
        "replicate_below": 0.25, "need_ratio": 1.5}
    assert auto_rule(bar, dev(1.0, 2.5, 1.0), dev(1.25, 2.2, 1.3)) == {
        "replicate_below": 0.25, "need_ratio": 1.25}
    # amendment 27's against what runs after amendment 26: here amendment 26's
    assert auto_rule(bar, dev(1.0, 2.5, 1.0), dev(1.25, 2.2, 1.3), dev(2.0, 2.3, 1.0)) == {
        "replicate_below": 0.25, "need_ratio": 1.25}
    assert auto_rule(bar, dev(1.0, 2.5, 1.0), dev(1.25, 2.2, 1.3), dev(2.0, 2.1, 1.0)) == {
        "replicate_below": 0.25, "need_ratio": 2.0, "need_latch": True}
    # amendment 28's against what runs after amendment 27
    latched = (bar, dev(1.0, 2.5, 1.0), dev(1.25, 2.2, 1.3), dev(1.5, 1.8, 1.09))
    assert auto_rule(*latched, dev(2.0, 1.8, 1.09)) == {
        "replicate_below": 0.25, "need_ratio": 1.5, "need_latch": True}  # a tie keeps it
    assert auto_rule(*latched, dev(3.0, 1.8, 1.05)) == {
        "replicate_below": 0.25, "need_ratio": 3.0, "need_latch": True,
        "need_reference": "era"}
    # amendment 29's against what runs after amendment 28: here amendment 27's
    assert auto_rule(*latched, dev(1.5, 2.1, 1.05), dev(2.0, 1.7, 1.2)) == {
        "replicate_below": 0.25, "need_ratio": 2.0, "need_latch": True,
        "need_reference": "cohort", "need_prior": True}
    assert auto_rule(*latched, dev(1.5, 2.1, 1.05), dev(2.0, 1.9, 1.0)) == {
        "replicate_below": 0.25, "need_ratio": 1.5, "need_latch": True}
    # amendment 32's class reading against what runs after amendment 30 (here no bar file's
    # cells: amendment 27's)
    assert auto_rule(*latched, None, None, dev(0.9, 1.5, 1.0)) == {
        "replicate_below": 0.0, "lag_level": 0.9}
    assert auto_rule(*latched, None, None, dev(0.9, 1.8, 1.09)) == {  # a tie keeps what runs
        "replicate_below": 0.25, "need_ratio": 1.5, "need_latch": True}


def _runs(method, times, final=0.9, **extra):
    return [{"method": method, "seed": s, "time_to_target": t, "final_accuracy": final, **extra}
            for s, t in enumerate(times, start=10)]


def test_the_block_counts_the_bar_against_the_lower_of_fedbuff_and_s_one():
    from tools.docgen.async_bar import render

    settings = {"latency": "persistent", "run_config": {}}
    cells = {
        "a": {"settings": settings, "runs": _runs("auto", [10, 10]) + _runs("fedbuff", [5, 5])},
        "b": {"settings": settings, "runs": _runs("auto", [10, 10])
              + _runs("fedbuff", [None, None])},
    }
    replication = {"cells": {"a": {"runs": _runs("fedbuff-replicated:1", [8, 8])},
                             "b": {"runs": _runs("fedbuff-replicated:1", [2, 2])}},
                   "settings": {"slow_classes": {}}}
    ratio = {"geomean": 1.0, "ci95": None, "paired": 2, "seeds": 2}
    parts = {"replicated": 1, "updates_per_partition": [2, 2]}
    data = {"dev": {"pick": 0.5, "worst": {"0.25": 1.5, "0.5": 1.2, "0.75": 1.3},
                    "median": {"0.25": 1.0, "0.5": 1.0, "0.75": 1.1}},
            "cells": {
                # a: 5.1 s against FedBuff's 5 and s = 1's 8: within 1.05x of the lower
                "a": {"runs": _runs("fedbuff-bar", [5.1, 5.1], **parts), "over_fedbuff": ratio,
                      "over_s1": ratio},
                # b: 3 s against s = 1's 2 (FedBuff never): 1.5x the lower
                "b": {"runs": _runs("fedbuff-bar", [3, 3], **parts), "over_fedbuff": ratio,
                      "over_s1": None}},
            "settings": {}}
    text = render(data, replication, cells, ["a", "b", "c"])
    assert "θ = 0.5; the main job's `asynchronous=true s='auto'` ran it until" in text
    assert "0.25: worst 1.50, median 1.00" in text
    assert "within 1.05× of FedBuff's in 2 (1 where FedBuff's median run never reached" in text
    assert ("within 1.05× of the lower of FedBuff's and s = 1's in 1 of 2 (at worst 1.50×, b), "
            "within 1.05× of FedBuff's in 2") in text
    assert "Not read yet: c." in text
    assert "| a | 5.0 s (2/2) | 8.0 s (2/2) | 5.1 s (2/2) |" in text
    assert "| 1.50 | 25% |" in text


def _dev(pick, worst, median, cells=None):
    """A development record of one pick, as the readings' files hold it."""
    return {"pick": pick, "worst": {str(pick): worst}, "median": {str(pick): median},
            **({"cells": cells} if cells else {})}


#: amendment 23's development medians for s = 0, 1, 2 in four cells (s = 1's ratio to the
#: best: 1.5, 1, 2, 1; worst 2.0, median 1.25)
FIXED_CELLS = {"a": {"fixed": {"0": 2.0, "1": 3.0, "2": 2.5}},
               "b": {"fixed": {"0": math.inf, "1": 4.0, "2": 5.0}},
               "c": {"fixed": {"0": 2.0, "1": 4.0, "2": 3.0}},
               "d": {"fixed": {"0": math.inf, "1": math.inf, "2": math.inf}}}


def test_the_fixed_s1_replaces_the_rule_only_when_its_development_worst_is_lower():
    """Amendment 30: the fixed s = 1's ratios are amendment 23's medians for s = 1 over the
    lowest of s = 0, 1, 2 in each development cell (never reached: infinite; all never: 1)."""

    from experiments.async_bar import auto_rule, fixed_dev

    dev, cells = _dev, FIXED_CELLS
    fixed = fixed_dev(dev(0.75, 2.0, 1.0, cells))
    assert fixed["worst"] == {"1": 2.0} and fixed["median"] == {"1": 1.25}  # mean: 1.375
    assert {n: c["tried"]["1"]["ratio_to_best_fixed"] for n, c in fixed["cells"].items()} == {
        "a": 1.5, "b": 1.0, "c": 2.0, "d": 1.0}
    # worse than the bar's worst 1.9: the bar stays; better than 2.5: s = 1 runs
    assert auto_rule(dev(0.75, 1.9, 1.0, cells)) == {"replicate_below": 0.75}
    assert auto_rule(dev(0.75, 2.5, 1.0, cells)) == {"replicate_below": 1.0}
    # a tie on the worst goes to the median, a full tie keeps what runs
    assert auto_rule(dev(0.75, 2.0, 1.3, cells)) == {"replicate_below": 1.0}
    assert auto_rule(dev(0.75, 2.0, 1.25, cells)) == {"replicate_below": 0.75}
    # against the latched rule running after amendment 29
    bar = dev(0.75, 2.5, 1.0, cells)
    assert auto_rule(bar, None, None, dev(1.5, 2.1, 1.09)) == {"replicate_below": 1.0}
    assert auto_rule(bar, None, None, dev(1.5, 1.8, 1.0)) == {
        "replicate_below": 0.25, "need_ratio": 1.5, "need_latch": True}


def test_the_class_reading_must_beat_what_runs_then_the_fixed_s1_once_it_took_over():
    """Amendment 32's test is against what runs after amendment 30: the fixed s = 1 when it
    replaced the rule (its own ratios, not the replaced rule's), else the rule; the worst
    ratio first, then the median, a full tie keeping what runs."""

    from experiments.async_bar import auto_rule

    dev, cells = _dev, FIXED_CELLS
    took_over = dev(0.75, 2.5, 1.0, cells)  # the fixed s = 1 (worst 2.0, median 1.25) runs
    lag = {"replicate_below": 0.0, "lag_level": 0.9}
    assert auto_rule(took_over, lag=dev(0.9, 2.2, 1.0)) == {"replicate_below": 1.0}
    assert auto_rule(took_over, lag=dev(0.9, 1.9, 1.5)) == lag
    assert auto_rule(took_over, lag=dev(0.9, 2.0, 1.2)) == lag
    assert auto_rule(took_over, lag=dev(0.9, 2.0, 1.25)) == {"replicate_below": 1.0}
    stayed = dev(0.75, 1.9, 1.0, cells)  # the bar runs (worst 1.9): the reading must beat it
    assert auto_rule(stayed, lag=dev(0.9, 1.95, 0.5)) == {"replicate_below": 0.75}
    assert auto_rule(stayed, lag=dev(0.9, 1.9, 0.99)) == lag
