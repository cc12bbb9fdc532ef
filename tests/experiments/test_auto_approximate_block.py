"""The ``auto-approximate`` block of docs/adaptive.md, from a small synthetic
``results/compare.json``. Every expected value is worked out by hand in the comments."""

from __future__ import annotations

from tools.docgen import approximate


def _run(method, seed, time, final=0.6):
    return {"method": method, "seed": seed, "time_to_target": time, "final_accuracy": final}


def _cell(runs, summary):
    return {"settings": {"seeds": [10, 11]}, "runs": runs, "summary": summary}


def _data():
    # slow: auto 4, 6 (median 5.0 s); FedBuff 2, 3 (2.5 s, the best rival); auto-approximate
    # 3, 5 (4.0 s): 4.0 / 2.5 = 1.60x FedBuff's, above 1.05: not met
    slow = _cell([_run("auto", 10, 4.0), _run("auto", 11, 6.0),
                  _run("fedbuff", 10, 2.0), _run("fedbuff", 11, 3.0),
                  _run("auto-approximate", 10, 3.0), _run("auto-approximate", 11, 5.0)],
                 {"auto-approximate": {"seeds": 2, "reached_target": 2,
                                       "time_to_target_vs_auto": {
                                           "geomean": 0.79, "ci95": [0.75, 0.83],
                                           "per_seed": {"10": 0.75, "11": 0.83}}}})
    # fast: first-k 2, 2 (2.0 s, the best rival); auto-approximate 1, 3 (2.0 s), final
    # accuracy 0.6 on both: 1.00x, met; one seed of auto never reached the target
    fast = _cell([_run("auto", 10, 3.0), _run("auto", 11, None),
                  _run("first-k", 10, 2.0), _run("first-k", 11, 2.0),
                  _run("auto-approximate", 10, 1.0), _run("auto-approximate", 11, 3.0)],
                 {"auto-approximate": {"seeds": 2, "reached_target": 2,
                                       "time_to_target_vs_auto": {
                                           "geomean": 0.33, "ci95": [0.33, 0.33],
                                           "per_seed": {"10": 0.33, "11": None}}}})
    # without auto-approximate: not in the block
    old = _cell([_run("auto", 10, 1.0), _run("fedbuff", 10, 0.5)], {})
    # the slow cell recorded its knobs; the fast one ran before cells recorded them (p = 1,
    # tolerances "trust-region", no starvation bound)
    slow["settings"]["auto_approximate"] = {"error_power": 2.0, "run": 6, "tolerances": "all",
                                            "max_skew": 0.05}
    return {"cells": {"a/slow/2x2": slow, "b/fast/2x2": fast, "c/old/2x2": old},
            "done": ["a/slow/2x2", "b/fast/2x2", "c/old/2x2"]}


def test_the_block_judges_auto_approximate_by_autos_goal_in_the_cells_that_ran_it():
    text = approximate.render_approximate(_data(), ["b/fast/2x2", "a/slow/2x2"])
    assert text.startswith("`auto-approximate` within 1.05× of the best rival (the rule "
                           "auto is judged by) in 1 of the 2 finished cells that ran it")
    rows = [line for line in text.splitlines() if line.startswith("| ") and "/2x2" in line]
    # the reported order; auto's median on b: 3 and inf -> inf
    assert rows == [
        "| b/fast/2x2 | 1 | trust-region | off | 2.0 s (2/2) | ∞ | 0.33 (one pair, 2/2 reached) "
        "| ✓ 1.00× first-k |",
        "| a/slow/2x2 | 2 | all | 0.05 | 4.0 s (2/2) | 5.0 s | 0.79 [0.75, 0.83] ▼ "
        "| ✗ 1.60× FedBuff |",
    ]
    assert "c/old/2x2" not in text


def test_with_no_cell_that_ran_it_the_block_says_how_to_run_it():
    data = _data()
    data["cells"] = {"c/old/2x2": data["cells"]["c/old/2x2"]}
    data["done"] = ["c/old/2x2"]
    text = approximate.render_approximate(data, [])
    assert "has not run on a finished cell yet" in text
    assert "--rerun --methods auto-approximate" in text


def test_the_tuning_table_gives_each_cells_geometric_mean_and_marks_the_rules_choice():
    # cell a: seeds 0, 1; setting None: ratios 1 and 4 (geomean 2.000), setting 0.1: 1 and 1
    # (1.000); cell b: None 0.25 (0.250), 0.1 1 (1.000); the rule's value is the file's own
    data = {"settings": [
        {"knobs": {"run": 6, "max_skew": None}, "geomean": 0.5,
         "ratio_vs_auto": {"a/0": 1.0, "a/1": 4.0, "b/0": 0.25}},
        {"knobs": {"run": 6, "max_skew": 0.1}, "geomean": 1.0,
         "ratio_vs_auto": {"a/0": 1.0, "a/1": 1.0, "b/0": 1.0}}],
        "chosen": {"knobs": {"run": 6, "max_skew": 0.1}}}
    assert approximate.render_tuning(data, "max_skew").splitlines() == [
        "| cell | max_skew = None | max_skew = 0.1 (chosen) |",
        "|---|---|---|",
        "| a | 2.000 | 1.000 |",
        "| b | 0.250 | 1.000 |",
        "| every (cell, seed): the rule | 0.500 | 1.000 |"]
