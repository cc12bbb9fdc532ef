"""auto with its server step tuned by FedBuff's rule (``python -m experiments.auto_lr``): the
rule's pick and growth, and a reading on a small cell that pairs with the cell's own runs."""

from __future__ import annotations

import math

import pytest

from experiments import compare
from experiments.auto_lr import choose_lr, paired_ratio, tune_cell


def _tried(table, calls):
    """``tried(lr)`` reading ``table[lr] = (median time or None, median final)``."""
    def tried(lr):
        calls.append(lr)
        time, final = table[lr]
        return {"median_time_to_target_all_seeds": time, "median_final_accuracy": final}
    return tried


def test_the_pick_grows_past_an_edge_and_stops_at_the_extensions_allowed():
    table = {0.25: (30.0, 0.9), 0.5: (20.0, 0.9), 1.0: (10.0, 0.9), 2.0: (8.0, 0.9),
             4.0: (9.0, 0.9), 8.0: (1.0, 0.9)}
    calls = []
    record = choose_lr([0.25, 0.5, 1.0], 2, _tried(table, calls))
    # 1.0 is the largest tried: 2.0 added; 2.0 the largest: 4.0 added; 2.0 beats 4.0
    assert calls == [0.25, 0.5, 1.0, 2.0, 4.0]
    assert record["chosen"] == 2.0 and record["extensions"] == [[2.0], [4.0]]
    assert record["at_edge"] is False
    calls = []
    record = choose_lr([0.25, 0.5, 1.0], 1, _tried(table, calls))
    assert calls == [0.25, 0.5, 1.0, 2.0] and record["chosen"] == 2.0
    assert record["at_edge"] is True  # 2.0 is the largest tried and could grow again


def test_never_reaching_ranks_last_then_accuracy_then_the_a_priori_lr():
    calls = []
    record = choose_lr([0.5, 1.0, 2.0], 0, _tried(
        {0.5: (None, 0.99), 1.0: (12.0, 0.80), 2.0: (12.0, 0.85)}, calls))
    assert record["chosen"] == 2.0  # same time, higher accuracy
    record = choose_lr([0.5, 1.0, 2.0], 0, _tried(
        {0.5: (12.0, 0.85), 1.0: (12.0, 0.85), 2.0: (12.0, 0.85)}, []))
    assert record["chosen"] == 1.0  # a tie: the a-priori step
    record = choose_lr([0.5, 2.0], 1, _tried({0.5: (None, 0.9), 2.0: (None, 0.8),
                                             0.25: (None, 0.95)}, calls := []))
    # none reached the target: the accuracies rank; 0.5 is the smallest tried, so it grows
    assert calls == [0.5, 2.0, 0.25] and record["chosen"] == 0.25 and record["at_edge"]


def test_a_bad_list_or_extension_is_refused_by_name():
    with pytest.raises(ValueError, match="fedbuff_tune_server_lr"):
        choose_lr([1.0, -2.0], 0, _tried({}, []))
    with pytest.raises(ValueError, match="fedbuff_tune_extend"):
        choose_lr([1.0], -1, _tried({}, []))


def test_paired_ratio_is_the_geometric_mean_over_the_seeds_both_reached():
    mine = [{"seed": 1, "time_to_target": 2.0}, {"seed": 2, "time_to_target": 9.0},
            {"seed": 3, "time_to_target": None}]
    theirs = [{"seed": 1, "time_to_target": 4.0}, {"seed": 2, "time_to_target": 1.0},
              {"seed": 3, "time_to_target": 5.0}]
    got = paired_ratio(mine, theirs)
    assert got["paired"] == 2 and got["seeds"] == 3
    assert got["geomean"] == pytest.approx(math.sqrt(0.5 * 9.0))


@pytest.fixture(scope="module")
def small_cell():
    """A small finished cell as the benchmark stores one (auto and FedBuff on two seeds)."""
    grid = compare.load_grid()
    with compare.harness_environment():
        result = compare.run_cell(grid, "digits-logreg", "persistent", 6, 6, 4, [10, 11],
                                  [0], ["auto", "fedbuff"], 0.5,
                                  rules_set={"fedbuff_tune": 0.0})
    return grid, result


def test_a_reading_pairs_with_the_cells_runs_and_the_lr_reaches_the_strategy(small_cell):
    grid, cell = small_cell
    grid = {**grid, "rules": {**grid["rules"], "fedbuff_tune_server_lr": [1.0, 3.0],
                              "fedbuff_tune_extend": 0}}
    with compare.harness_environment():
        reading = tune_cell(grid, "small", cell, log=lambda _: None)
    tried = {r["server_lr"]: r for r in reading["tuning"]["grid"]}
    assert sorted(tried) == [1.0, 3.0]
    # the key reached the server: another step, other accuracies on the same seed and draws
    assert tried[1.0]["per_seed"] != tried[3.0]["per_seed"]
    assert reading["server_lr"] in (1.0, 3.0)
    assert [r["seed"] for r in reading["runs"]] == [10, 11]
    assert {r["method"] for r in reading["runs"]} == {"auto-lr"}
    # auto at lr 1 reproduces the cell's own auto run of the first seed (same draws)
    auto10 = next(r for r in cell["runs"] if r["method"] == "auto" and r["seed"] == 10)
    assert reading["check"]["reproduces"] is True
    assert reading["check"]["benchmark_auto_time_to_target"] == auto10["time_to_target"]
    assert reading["deadline_s"] == cell["settings"]["coded_straggler_timeout_s"]
    fedbuff = {r["seed"]: r["time_to_target"] for r in cell["runs"] if r["method"] == "fedbuff"}
    ratios = [r["time_to_target"] / fedbuff[r["seed"]] for r in reading["runs"]
              if r["time_to_target"] is not None and fedbuff[r["seed"]] is not None]
    assert reading["over_fedbuff"]["paired"] == len(ratios)
    if ratios:
        assert reading["over_fedbuff"]["geomean"] == pytest.approx(
            math.exp(sum(map(math.log, ratios)) / len(ratios)))


def _runs(method, times, final=0.9):
    return [{"method": method, "seed": s, "time_to_target": t, "final_accuracy": final}
            for s, t in enumerate(times, start=10)]


def test_the_block_counts_the_goal_with_auto_lr_in_autos_place():
    from tools.docgen.auto_lr import render_auto_lr

    settings = {"latency": "trace", "run_config": {}}
    benchmark = {"cells": {
        "a": {"settings": settings, "runs": _runs("auto", [10, 10, 10])
              + _runs("fedbuff", [5, 5, 5]) + _runs("wait-for-all", [50, 50, 50])},
        "b": {"settings": settings, "runs": _runs("auto", [10, 10, 10])
              + _runs("fedbuff", [2, 2, 2])}}}
    reading = {"cells": {
        # a: auto-lr 5.1 s against FedBuff's 5 (1.02x: the goal met); b: 4 s against 2
        "a": {"runs": _runs("auto-lr", [5.1, 5.1, 5.1]), "server_lr": 2.0,
              "tuning": {"at_edge": False}, "check": {"reproduces": True},
              "over_fedbuff": {"geomean": 1.02, "ci95": None, "paired": 3, "seeds": 3},
              "over_auto": {"geomean": 0.51, "ci95": None, "paired": 3, "seeds": 3}},
        "b": {"runs": _runs("auto-lr", [4, 4, 4]), "server_lr": 4.0,
              "tuning": {"at_edge": True}, "check": {"reproduces": False},
              "over_fedbuff": {"geomean": 2.0, "ci95": None, "paired": 3, "seeds": 3},
              "over_auto": {"geomean": 0.4, "ci95": None, "paired": 3, "seeds": 3}}}}
    text = render_auto_lr(reading, benchmark, ["a", "b", "c"])
    assert "read in 2 of the 3 reported cells" in text
    assert "below auto's in 2 of 2" in text
    assert "in 1 of 2; with its runs in auto's place the goal is met in 1 of 2" in text
    assert "Not read yet: c." in text and "(not paired): b." in text
    assert "| b | 4 (edge) |" in text and "✗ 2.00× FedBuff" in text


def test_the_readme_line_counts_the_same_cells():
    from tools.docgen.auto_lr import render_headline

    settings = {"latency": "trace", "run_config": {}}
    benchmark = {"cells": {"a": {"settings": settings, "runs": _runs("auto", [10, 10])
                                 + _runs("fedbuff", [5, 5])}}}
    reading = {"cells": {"a": {"runs": _runs("auto-lr", [6, 6]), "server_lr": 2.0,
                               "over_auto": {"geomean": 0.6}}}}
    text = render_headline(reading, benchmark, ["a", "b"])
    # 6 s against FedBuff's 5 s: 1.2x, outside 1.05x; the goal is not met
    assert "picked 2; " in text and "read in 1 of the 2 cells" in text
    assert "0.60–0.60× the time of auto at lr 1" in text
    assert "point) in 0 of 1 and would meet the goal in 0 of 1" in text
