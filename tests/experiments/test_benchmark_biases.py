"""The notes under the results table on the benchmark's design asymmetries, counted from a
small hand-made ``results/compare.json``: runs that ended (rounds spent) before auto reached
the target on the same seed, and fixed codes whose rounds were mostly skipped at the stated
deadline. Every expected count is worked out by hand in the comments."""

from __future__ import annotations

from tools.docgen import biases


def _run(method, seed, time, total, decodes=None):
    run = {"method": method, "seed": seed, "time_to_target": time, "final_accuracy": 0.8,
           "total_virtual_s": total}
    return {**run, "decodes": decodes} if decodes is not None else run


def _data():
    a = [  # auto reaches at 10 s on seed 10, never on seed 11
        _run("auto", 10, 10.0, 40.0), _run("auto", 11, None, 40.0),
        # ended at 8 s < 10 s without reaching: counted
        _run("deadline-best", 10, None, 8.0),
        # ended at 12 s > 10 s: auto had reached first, not counted
        _run("first-k", 10, None, 12.0),
        # auto never reached on seed 11: nothing to compare, not counted
        _run("deadline-best", 11, None, 3.0),
        # reached: not counted
        _run("fedbuff", 10, 2.0, 5.0),
        # a fixed code ending at 9 s: counted under "fixed codes"; 10 rounds, 3 skipped
        _run("crc:4", 10, None, 9.0, {"exact": 5, "approx": 2, "skipped": 3}),
        _run("crc:4", 11, 20.0, 30.0, {"exact": 9, "approx": 1, "skipped": 0}),
        # auto-approximate and the stated-rule deadline are not the verdict's rivals: not
        # counted though they ended at 1 s
        _run("auto-approximate", 10, None, 1.0), _run("deadline", 10, None, 1.0),
    ]
    b = [_run("auto", 10, 30.0, 60.0),
         _run("first-k", 10, None, 20.0),  # counted: 20 < 30
         # 10 rounds, 2 skipped: under a quarter
         _run("grouped-rs:2", 10, 25.0, 50.0, {"exact": 8, "approx": 0, "skipped": 2})]
    return {"cells": {"x/bimodal/20x20": {"runs": a}, "x/pareto/20x20": {"runs": b},
                      "x/trace/20x20": {"runs": [_run("auto", 10, 5.0, 9.0)]}}}


def test_runs_that_ended_before_auto_reached_the_target_are_counted_by_method():
    data = _data()
    (note,) = biases.short_horizons(data, list(data["cells"]))
    # deadline-best 1 (cell x/bimodal), first-k 1 (x/pareto), the code 1: 3 runs, 2 cells
    assert "3 runs of rivals in 2 of the 3 finished cells" in note
    assert "(deadline-best 1, first-k 1, fixed codes 1)" in note
    assert biases.short_horizons(data, ["x/trace/20x20"]) == []


def test_codes_whose_rounds_were_mostly_skipped_are_counted():
    data = _data()
    # crc:4 over both seeds: 3 skipped of 20 rounds = 15 %, under a quarter: no note
    assert biases.codes_deadline(data, list(data["cells"])) == []
    data["cells"]["x/bimodal/20x20"]["runs"][7]["decodes"] = {"exact": 4, "approx": 0,
                                                               "skipped": 6}
    (note,) = biases.codes_deadline(data, list(data["cells"]))
    # crc:4 now 9 of 20 = 45 %; grouped-rs:2 2 of 10 = 20 %: 1 of the 2 pairs
    assert "in 1 of those 2 (cell, code) pairs" in note
    assert "(most: crc:4 in x/bimodal/20x20: 45 %)" in note
    # a code that stopped waiting at its own deadline (amendment 21) is not a pair of the
    # count: crc:4's own deadline leaves grouped-rs:2 alone, 20 %: no note
    data["cells"]["x/bimodal/20x20"]["settings"] = {"code_deadlines_s": {"crc:4": 3.0}}
    assert biases.codes_deadline(data, list(data["cells"])) == []


def test_drift_runs_that_repeat_the_pareto_cell_are_counted_per_cell():
    def cell(latency, times, drift_round=None):
        runs = [_run(m, seed, t, 50.0) for (m, seed), t in times.items()]
        cfg = {"latency-drift-round": drift_round} if drift_round else {}
        return {"settings": {"latency": latency, "run_config": cfg}, "runs": runs}

    pareto = cell("pareto", {("auto", 10): 5.0, ("auto", 11): 7.0, ("fedbuff", 10): 3.0,
                             ("first-k", 10): None})
    # auto seed 10 and fedbuff equal pareto's: 2 of 4; auto seed 11 differs; first-k never
    # reached in either (not a repeat: nothing was reached)
    drift = cell("drift", {("auto", 10): 5.0, ("auto", 11): 9.0, ("fedbuff", 10): 3.0,
                           ("first-k", 10): None}, drift_round=15)
    data = {"cells": {"t/pareto/20x20": pareto, "t/drift/20x20": drift,
                      "u/drift/20x20": drift}}  # u has no pareto cell: not counted
    (note,) = biases.drift_repeats(data, list(data["cells"]))
    assert "(round 15)" in note
    assert "t/drift/20x20 2 of 4 (auto 1 of 2)" in note and "u/drift" not in note
    # the pareto cell not finished: nothing to compare
    assert biases.drift_repeats(data, ["t/drift/20x20"]) == []
    # no run repeats: no note
    other = cell("drift", {("auto", 10): 6.0, ("fedbuff", 10): 4.0})
    data["cells"]["t/drift/20x20"] = other
    assert biases.drift_repeats(data, ["t/pareto/20x20", "t/drift/20x20"]) == []
