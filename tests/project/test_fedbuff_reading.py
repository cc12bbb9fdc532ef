"""FedBuff's time to target read as often as a synchronous round (docs/adaptive.md's
``fedbuff-evaluation`` block and the README's headline): the readings are taken where a
round's would be, from the runs' stored accuracy curves."""

from __future__ import annotations

import math

import pytest

from tools.docgen.fedbuff import per_round_reading, render_evaluation, time_at_rounds


def _curve(accuracies):
    # server step j (1-based) ends at virtual second j
    return [[float(j), a, 0.0] for j, a in enumerate(accuracies, start=1)]


def test_the_readings_are_the_first_steps_whose_updates_reach_each_multiple_of_the_cohort():
    # K = 3, cohort 5: rounds' worth of updates reached at steps 2, 4, 5, 7, 9, 10
    acc = [0.1, 0.2, 0.9, 0.3, 0.4, 0.9, 0.5, 0.9, 0.9, 0.9]
    assert time_at_rounds(_curve(acc), 0.8, 3, 5) == 9.0  # steps 3 and 6 are not readings
    assert time_at_rounds(_curve(acc), 0.95, 3, 5) == math.inf
    # K larger than the cohort: every step reaches at least one multiple
    assert time_at_rounds(_curve([0.1, 0.9]), 0.8, 7, 5) == 2.0
    # K = the cohort: every step is a reading (the benchmark's reading)
    assert time_at_rounds(_curve([0.1, None, 0.9]), 0.8, 4, 4) == 3.0
    with pytest.raises(ValueError, match="buffer=0"):
        time_at_rounds(_curve(acc), 0.8, 0, 5)


def _cell():
    runs = [{"method": "fedbuff", "seed": 10, "time_to_target": 3.0, "buffer_size": 2,
             "final_accuracy": 0.9, "accuracy_curve": _curve([0.1, 0.1, 0.9, 0.1, 0.9, 0.9])},
            {"method": "fedbuff", "seed": 11, "time_to_target": 2.0, "buffer_size": 2,
             "final_accuracy": 0.9, "accuracy_curve": _curve([0.1, 0.9, 0.9, 0.9, 0.9, 0.9])},
            {"method": "auto", "seed": 10, "time_to_target": 10.0, "final_accuracy": 0.9},
            {"method": "auto", "seed": 11, "time_to_target": 5.0, "final_accuracy": 0.9}]
    return {"settings": {"target": 0.8, "cohort": 4}, "runs": runs}


def test_a_cells_reading_gives_the_medians_and_the_paired_ratio_to_auto():
    reading = per_round_reading(_cell())
    # readings at steps 2, 4, 6: seed 10 at 6 s (3 s every step), seed 11 at 2 s
    assert reading["buffer"] == 2 and reading["steps_per_round"] == 2
    assert reading["every_step"] == pytest.approx(2.5)
    assert reading["per_round"] == pytest.approx(4.0)
    assert reading["ratio_vs_auto"] == pytest.approx(math.sqrt(6 / 10 * 2 / 5))
    no_curve = _cell()
    del no_curve["runs"][0]["accuracy_curve"]
    assert per_round_reading(no_curve) is None


def test_the_block_lists_each_finished_cell_with_both_readings():
    data = {"cells": {"digits-logreg/persistent/20x20": _cell()}}
    text = render_evaluation(data, ["digits-logreg/persistent/20x20", "digits-logreg/x/1x1"])
    row = [line for line in text.splitlines() if line.startswith("| digits-logreg")]
    assert row == ["| digits-logreg/persistent/20x20 | 2 (2) | 2.5 s | 4.0 s | 1.60× | 3.00× "
                   "| 1.88× |"]
    assert "is 1.60× the benchmark's in 1 of the 1 finished cells" in text


def test_a_curve_that_is_not_the_benchmarks_or_mixed_buffers_give_no_reading():
    wrong = _cell()
    wrong["runs"][0]["time_to_target"] = 5.0  # its curve first reaches the target at 3 s
    assert per_round_reading(wrong) is None
    mixed = _cell()
    mixed["runs"][1]["buffer_size"] = 4
    assert per_round_reading(mixed) is None


def test_the_block_counts_the_cells_where_auto_would_meet_the_goal_read_per_round():
    # auto 4 s on both seeds; FedBuff 3 s every step (auto misses the 1.05x), 6 s read per
    # round (steps 2, 4, 6 of K = 2 in a cohort of 4; it crosses at steps 3 and 6): auto
    # would meet the goal
    cell = _cell()
    for run in cell["runs"]:
        if run["method"] == "fedbuff":
            run["accuracy_curve"] = _curve([0.1, 0.1, 0.9, 0.1, 0.1, 0.9])
            run["time_to_target"] = 3.0
        else:
            run["time_to_target"] = 4.0
    name = "digits-logreg/persistent/20x20"
    text = render_evaluation({"cells": {name: cell}}, [name])
    assert f"auto would meet the goal in 1 more cell ({name})" in text
    assert "0.75× read every step and 1.50× per round" in text
