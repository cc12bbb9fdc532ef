"""FedBuff over replicated partitions read beside the benchmark
(``python -m experiments.async_replication``): the rule's pick of ``s``, a reading on a small
cell that pairs with the cell's own FedBuff runs, and the generated block's counts."""

from __future__ import annotations

import math

import pytest

from experiments import compare
from experiments.async_replication import read_cell
from experiments.fedbuff_tuning import choose_replication as choose_s


def _rec(time, final):
    return {"median_time_to_target_all_seeds": time, "median_final_accuracy": final}


def test_the_pick_is_the_fastest_then_the_most_accurate_then_s_one_then_the_order():
    assert choose_s({0: _rec(5.0, 0.9), 1: _rec(4.0, 0.8), 2: _rec(4.5, 0.95)}) == 1
    assert choose_s({0: _rec(None, 0.99), 1: _rec(9.0, 0.5), 2: _rec(None, 0.9)}) == 1
    assert choose_s({0: _rec(4.0, 0.9), 1: _rec(4.0, 0.8), 2: _rec(4.0, 0.95)}) == 2
    assert choose_s({0: _rec(4.0, 0.9), 1: _rec(4.0, 0.9), 2: _rec(4.0, 0.9)}) == 1
    assert choose_s({0: _rec(4.0, 0.9), 2: _rec(4.0, 0.9)}) == 0
    assert choose_s({0: _rec(None, 0.9), 1: _rec(None, 0.9), 2: _rec(None, 0.95)}) == 2


def test_a_reading_pairs_with_the_cells_fedbuff_and_reads_every_s(small_cell):
    grid, cell = small_cell
    with compare.harness_environment():
        reading = read_cell(grid, "small", cell, log=lambda _: None)
    fedbuff = [r for r in cell["runs"] if r["method"] == "fedbuff"]
    # s = 0 is FedBuff: its development record is the cell's tuning, its check run the cell's
    tuned = cell["settings"]["fedbuff"]["tuning"]["grid"][0]
    assert reading["tuning"]["0"]["per_seed"] == tuned["per_seed"]
    assert reading["check"]["reproduces"] is True
    assert reading["check"]["fedbuff_time_to_target"] == fedbuff[0]["time_to_target"]
    assert set(reading["tuning"]) == {"0", "1", "2"}
    by_method = {}
    for r in reading["runs"]:
        by_method.setdefault(r["method"], []).append(r)
    assert {m: [r["seed"] for r in rs] for m, rs in by_method.items()} == {
        "fedbuff-replicated:1": [10, 11], "fedbuff-replicated:2": [10, 11],
        "fedbuff-replicated": [10, 11]}
    # the pick's runs are FedBuff's own (s = 0) or the picked s's
    pick = reading["s"]
    source = fedbuff if pick == 0 else by_method[f"fedbuff-replicated:{pick}"]
    assert [r["time_to_target"] for r in by_method["fedbuff-replicated"]] == \
        [r["time_to_target"] for r in source]
    # every partition of the cohort entered the model under replication
    for r in by_method["fedbuff-replicated:1"]:
        assert len(r["updates_per_partition"]) == 6 and min(r["updates_per_partition"]) > 0
    pairs = [(r["time_to_target"], f["time_to_target"])
             for r, f in zip(by_method["fedbuff-replicated"], fedbuff, strict=True)
             if r["time_to_target"] is not None and f["time_to_target"] is not None]
    assert reading["over_fedbuff"]["paired"] == len(pairs)
    if pairs:
        assert reading["over_fedbuff"]["geomean"] == pytest.approx(
            math.exp(sum(math.log(a / b) for a, b in pairs) / len(pairs)))


def _runs(method, times, final=0.9):
    return [{"method": method, "seed": s, "time_to_target": t, "final_accuracy": final}
            for s, t in enumerate(times, start=10)]


def _reading(pick_times, s, reproduces=True):
    return {"runs": _runs("fedbuff-replicated", pick_times)
            + _runs("fedbuff-replicated:1", pick_times) + _runs("fedbuff-replicated:2", [9, 9]),
            "s": s, "check": {"reproduces": reproduces},
            "over_fedbuff": {"geomean": 1.0, "ci95": None, "paired": 2, "seeds": 2},
            "over_auto": {"geomean": 0.5, "ci95": None, "paired": 2, "seeds": 2}}


def test_the_block_counts_the_goal_with_the_pick_in_autos_place():
    from tools.docgen.async_replication import render, render_headline

    settings = {"latency": "persistent", "run_config": {}}
    cells = {
        # a: the pick 5.1 s against FedBuff's 5 (1.02x: the goal met), not below FedBuff
        "a": {"settings": settings, "runs": _runs("auto", [10, 10])
              + _runs("fedbuff", [5, 5]) + _runs("wait-for-all", [50, 50])},
        # b: FedBuff never reaches the target; the pick 2 s, auto 10 s: faster than both
        "b": {"settings": settings, "runs": _runs("auto", [10, 10])
              + _runs("fedbuff", [None, None])},
    }
    data = {"cells": {"a": _reading([5.1, 5.1], 0), "b": _reading([2, 2], 1, False)},
            "settings": {"slow_classes": {"b": "results/b.json", "d": "results/d.json"}}}
    text = render(data, cells, ["a", "c"])
    assert "read in 2 cells (1 of the 2 reported cells" in text
    # a: the pick is s = 0 (FedBuff itself): counted apart, not as evidence
    assert "picked s = 0 in 1 of them" in text
    assert "They picked s ≥ 1 in 1 (b): there its median time to target is below FedBuff's " \
           "in 1 of 1 and below auto's in 1 of 1" in text
    assert "(within 1.05× of the best rival's median, final accuracy within 0.5 point) is " \
           "met in 1 of 1;" in text
    # b: FedBuff, the only rival that does not code, never reached the target
    assert "at least 2× faster than the best rival that does not code in 1 of 1." in text
    assert "Fixed a priori at s = 1 (no development runs), its median time to target is " \
           "within 1.05× of FedBuff's in 2 of 2 cells, at worst 1.02× FedBuff's (a), and " \
           "below it in 1." in text
    assert "Not read yet: c, d." in text and "(not paired): b." in text
    assert "| b | 1 | 10.0 s (2/2) | never (0/2) | 2.0 s (2/2) |" in text
    assert "| a | 0 | 10.0 s (2/2) | 5.0 s (2/2) | 5.1 s (2/2) |" in text
    line = render_headline(data, cells, ["a", "c"])
    assert "picked s = 0, FedBuff itself, in 1 and s ≥ 1 in 1 (b: 2.0 s (2/2) against " \
           "FedBuff's never (0/2), auto's 10.0 s (2/2);" in line


def test_without_fedbuffs_tuning_it_runs_on_fedbuffs_given_settings_and_under_dp_refuses():
    grid = compare.load_grid()
    with compare.harness_environment():
        cell = compare.run_cell(grid, "digits-logreg", "persistent", 6, 6, 4, [10], [0],
                                ["fedbuff", "fedbuff-replicated"], 0.5, log=lambda _: None,
                                rules_set={"fedbuff_tune": 0.0})
    facts = cell["settings"]["fedbuff_replicated"]
    fedbuff = next(r for r in cell["runs"] if r["method"] == "fedbuff")
    # s = 0's development record is FedBuff's run with the settings given, on seed 0
    assert set(facts["tried"]) == {"0", "1", "2"} and "tuning" not in cell["settings"]["fedbuff"]
    mine = next(r for r in cell["runs"] if r["method"] == "fedbuff-replicated")
    if facts["chosen"] == 0:
        assert mine["time_to_target"] == fedbuff["time_to_target"]
    with pytest.raises(ValueError, match="fedbuff-replicated cannot run with dp="):
        compare.run_cell(grid, "digits-logreg", "persistent", 6, 6, 4, [10], [0],
                         ["fedbuff-replicated"], 0.5, {"dp": "partition"}, log=lambda _: None)


def test_the_benchmark_command_runs_it_on_fedbuffs_tuned_settings():
    """``--methods fedbuff,fedbuff-replicated``: s picked on the development seeds (s = 0 from
    FedBuff's own runs), the pick's runs on the evaluation seeds, FedBuff's tuning shared."""
    grid = compare.load_grid()
    grid = {**grid, "rules": {**grid["rules"], "fedbuff_tune_server_lr": [1.0],
                              "fedbuff_tune_buffer_fraction": [0.5],
                              "fedbuff_tune_extend": 0}}
    with compare.harness_environment():
        cell = compare.run_cell(grid, "digits-logreg", "persistent", 6, 6, 4, [10, 11], [0],
                                ["fedbuff", "fedbuff-replicated"], 0.5, log=lambda _: None)
    facts = cell["settings"]["fedbuff_replicated"]
    tried = facts["tried"]
    assert set(tried) == {"0", "1", "2"} and facts["dev_seeds"] == [0]
    assert tried["0"]["per_seed"] == cell["settings"]["fedbuff"]["tuning"]["grid"][0]["per_seed"]
    assert facts["chosen"] == choose_s({int(s): rec for s, rec in tried.items()})
    mine = [r for r in cell["runs"] if r["method"] == "fedbuff-replicated"]
    assert [r["seed"] for r in mine] == [10, 11] and {r["s"] for r in mine} == {facts["chosen"]}
    if facts["chosen"] == 0:
        fedbuff = [r for r in cell["runs"] if r["method"] == "fedbuff"]
        assert [r["time_to_target"] for r in mine] == [r["time_to_target"] for r in fedbuff]
    else:
        assert all(len(r["updates_per_partition"]) == 6 for r in mine)


def test_a_pattern_matching_no_finished_cell_is_refused_naming_the_cells(tmp_path):
    from experiments.async_replication import main

    with pytest.raises(SystemExit, match=r"no finished cell matches 'no-such/\*'; there are "
                                         r"\[.*'digits-logreg/persistent/20x20'"):
        main(["--cells", "no-such/*", "--out", str(tmp_path / "out.json")])
    assert not (tmp_path / "out.json").exists()
