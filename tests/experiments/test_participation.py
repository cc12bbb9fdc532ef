"""experiments.participation: the slow clients' share of the updates a method took in before
its target, counted from round rows by hand, and one small run end to end."""

from __future__ import annotations

import pytest

from experiments import participation

COHORT = [0, 1, 2, 3, 4]
SLOW = {3, 4}


def _coded(missing, accuracy):
    return {"partitions": {"used": []}, "missing_partitions": missing, "accuracy": accuracy,
            "virtual_s": 1.0 + len(missing)}


def _rival(used, accuracy, at):
    return {"clients_used": used, "accuracy": accuracy, "virtual_s": at}


def test_a_coded_round_takes_in_the_cohort_but_its_missing_partitions():
    rows = [_coded([], 0.1), _coded([4], 0.5), _coded([3, 4], 0.9)]
    got = participation.share_before_target(rows, COHORT, SLOW, target=0.5)
    # rounds 1 and 2 (the second reaches 0.5): 5 + 4 partitions, 2 + 1 of them slow
    assert got == {"time_to_target": 2.0, "updates": 9, "slow_updates": 3,
                   "slow_update_share": pytest.approx(3 / 9),
                   "slow_example_share": pytest.approx(3 / 9)}
    # weighed by examples: partitions 0..4 hold 1, 1, 1, 3, 3
    sizes = [1, 1, 1, 3, 3]
    got = participation.share_before_target(rows, COHORT, SLOW, 0.5, sizes)
    assert got["slow_example_share"] == pytest.approx((6 + 3) / (9 + 6))


def test_a_skipped_coded_round_takes_in_nothing():
    rows = [{**_coded([], None), "decode": "skipped"}, {**_coded([], 0.9), "decode": "exact"}]
    got = participation.share_before_target(rows, COHORT, SLOW, target=0.5)
    assert (got["updates"], got["slow_updates"]) == (5, 2)


def test_a_rival_takes_in_the_updates_it_averaged_and_a_run_never_reaching_counts_all():
    rows = [_rival([0, 1], 0.2, 1.0), _rival([3], 0.3, 2.0), _rival([0, 4, 2], 0.4, 3.0)]
    got = participation.share_before_target(rows, COHORT, SLOW, target=0.9)
    assert got == {"time_to_target": None, "updates": 6, "slow_updates": 2,
                   "slow_update_share": pytest.approx(2 / 6),
                   "slow_example_share": pytest.approx(2 / 6)}
    assert participation.share_before_target([], COHORT, SLOW, 0.5)["slow_update_share"] is None


def test_a_small_cell_end_to_end_counts_every_method_and_its_slow_clients():
    grid = participation.load_grid(participation.GRID)
    name = "digits-logreg/persistent/6x6"
    compare = {"cells": {name: {"settings": {"stated_deadline_s": 1.5,
                                             "deadline_best_s": 0.6,
                                             "coded_straggler_timeout_s": 1.5},
                                "runs": []}}}
    out = participation.measure(grid, compare, [0], log=lambda _: None,
                                cells_run=[("digits-logreg", "persistent", 6)], rounds=3)
    runs = out["cells"][name]["runs"]
    assert [r["method"] for r in runs] == list(participation.METHODS)
    for run in runs:
        assert 0 <= run["slow_updates"] <= run["updates"]
        assert run["benchmark_time_to_target"] is None  # no benchmark runs given
    # the slow clients are the persistent model's of seed 0 (a fifth, 20x slower)
    from fl_gradcode.latency import make_latency

    model = make_latency("persistent", p=0.2, slowdown=20.0, scale=0.1, rate=10.0, seed=0)
    assert {r["slow_clients"] for r in runs} == {sum(model.is_slow(w) for w in range(6))}


def test_the_rivals_run_as_the_benchmark_cell_recorded_them():
    tuned = {"cohort": 20, "rivals_stop_dropped_work": True, "auto_stop_at_decode": True,
             "fedbuff": {"server_lr": 0.5, "buffer_fraction": 0.1, "buffer_size": 2}}
    assert participation.recorded_rules(tuned) == {
        "rivals_stop_dropped_work": 1.0, "auto_stop_at_decode": 1.0,
        "fedbuff_server_lr": 0.5, "fedbuff_buffer_fraction": 0.1}
    # a cell from before the stop and before buffer_fraction was recorded
    old = {"cohort": 20, "fedbuff": {"server_lr": 1.0, "buffer_size": 5}}
    rules = participation.recorded_rules(old)
    assert rules == {"rivals_stop_dropped_work": 0.0, "auto_stop_at_decode": 0.0,
                     "fedbuff_server_lr": 1.0, "fedbuff_buffer_fraction": 0.25}
    import dataclasses

    from experiments.compare import grid_cell, load_grid
    cell = dataclasses.replace(grid_cell(load_grid(), "digits-logreg", "persistent", 20, 20,
                                         30, 0.85), **rules)
    assert cell.fedbuff_buffer() == 5 and cell.fedbuff_steps() == 120


def test_the_participation_table_names_the_methods_the_benchmark_re_ran_since():
    from tools.docgen.participation import render_participation

    def run(method, seed, time, benchmark):
        return {"method": method, "seed": seed, "time_to_target": time,
                "benchmark_time_to_target": benchmark, "slow_example_share": 0.1,
                "slow_data_share": 0.2}

    cell = "digits-logreg/persistent/20x20"
    data = {"settings": {"methods": ["auto", "fedbuff"]}, "cells": {cell: {"runs": [
        run("auto", 10, 5.0, 5.0), run("fedbuff", 10, 2.0, 2.0)]}}}
    same = {"cells": {cell: {"runs": [{"method": "auto", "seed": 10, "time_to_target": 5.0},
                                      {"method": "fedbuff", "seed": 10,
                                       "time_to_target": 2.0}]}}}
    text = render_participation(data, same)
    assert "2 of 2 runs equals the benchmark's run" in text and "re-run" not in text
    same["cells"][cell]["runs"][0]["time_to_target"] = 4.0  # auto re-run since
    text = render_participation(data, same)
    assert "the benchmark has re-run auto since, so those rows are not its runs now" in text


def test_the_readme_line_says_when_the_benchmark_re_ran_its_methods_since():
    """The README's participation line reads "the same seeds" as the benchmark's; once the
    benchmark has re-run a method of the cell, the line says its runs are the benchmark's
    as it was, and names the method."""
    from tools.docgen.participation import render_headline

    cell = "digits-logreg/persistent/20x20"
    runs = [{"method": m, "seed": 10, "time_to_target": t, "benchmark_time_to_target": t,
             "slow_example_share": 0.1, "slow_data_share": 0.2}
            for m, t in (("auto", 5.0), ("fedbuff", 2.0))]
    data = {"cells": {cell: {"runs": runs}}}
    now = {"cells": {cell: {"runs": [{"method": "auto", "seed": 10, "time_to_target": 5.0},
                                     {"method": "fedbuff", "seed": 10,
                                      "time_to_target": 2.0}]}}}
    line = render_headline(data, cell, now)
    assert f"(cell `{cell}`, the same seeds; " in line and "re-run" not in line
    now["cells"][cell]["runs"][1]["time_to_target"] = 1.5  # FedBuff re-run since
    line = render_headline(data, cell, now)
    assert "as it was when these ran: it has re-run fedbuff since" in line
