"""The paired summary ``python -m experiments.compare`` stores and prints beside its runs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from experiments.summary import main, print_summary, ratio_interval, summarize


def test_the_summary_median_counts_an_unreached_seed_as_the_verdict_does(capsys):
    """The verdict's median: a seed that never reached the target is infinite (here the
    sorted times are 1, 2, inf, inf, inf: the median is inf, not the reached seeds' 1.5)."""
    def run(method, seed, time, final):
        return {"method": method, "seed": seed, "time_to_target": time,
                "final_accuracy": final, "client_compute_s": 1.0, "bytes_up": 1}

    runs = [run("auto", s, t, f) for s, t, f in [(0, 1.0, 0.9), (1, 2.0, 0.8),
                                                 (2, None, 0.5), (3, None, 0.6),
                                                 (4, None, 0.7)]]
    runs += [run("fedbuff", s, t, 0.9) for s, t in [(0, 3.0), (1, 1.0), (2, None), (3, 2.0),
                                                    (4, 9.0)]]
    summary = summarize(runs)
    auto, fedbuff = summary["auto"], summary["fedbuff"]
    assert auto["median_time_to_target"] == 1.5  # reached seeds only, as named
    assert auto["median_time_to_target_all_seeds"] is None  # infinite
    assert auto["median_final_accuracy"] == 0.7
    assert fedbuff["median_time_to_target_all_seeds"] == 3.0  # 1, 2, 3, 9, inf
    print_summary({"summary": summary})
    lines = capsys.readouterr().out.splitlines()
    assert "median time ∞" in lines[0] and "median time 3.00 s" in lines[1]


def test_a_ratio_over_one_seed_is_printed_without_an_interval(capsys):
    """One seed where both reached the target: the ratio has no interval, and is printed as
    a ratio over one seed (it was printed as if no seed had paired)."""
    def run(method, time):
        return {"method": method, "seed": 0, "time_to_target": time, "final_accuracy": 0.9,
                "client_compute_s": 1.0, "bytes_up": 1}

    summary = summarize([run("auto", 2.0), run("crc:1", 1.0)])
    assert summary["crc:1"]["time_to_target_vs_auto"]["ci95"] is None
    print_summary({"summary": summary})
    line = capsys.readouterr().out.splitlines()[1]
    assert "time / auto 0.50 on one seed (no interval)" in line
    assert "no seed where both" not in line


@pytest.mark.parametrize("pairs", [3, 6, 10])
def test_the_interval_covers_the_true_ratio_95_percent_of_the_time(pairs):
    """Simulated paired ratios, log-normal around a true ratio of 1.3 (2,000 draws, seeded):
    the t interval covers 1.3 in 95 % of draws (within simulation error), where a percentile
    bootstrap over the pairs (the interval the grid used before) covers clearly less."""
    rng = np.random.default_rng(pairs)
    truth = 1.3
    draws = np.exp(np.log(truth) + 0.4 * rng.standard_normal((2000, pairs)))
    covered = np.mean([lo <= truth <= hi for lo, hi in
                       (ratio_interval(list(d))["ci95"] for d in draws)])
    assert 0.93 <= covered <= 0.97

    def percentile_bootstrap(ratios):  # the former interval, written out here
        logs = np.log(ratios)
        means = logs[rng.integers(0, logs.size, size=(400, logs.size))].mean(axis=1)
        return np.exp(np.percentile(means, [2.5, 97.5]))

    boot = np.mean([lo <= truth <= hi for lo, hi in map(percentile_bootstrap, draws[:500])])
    assert boot < covered - 0.03


def test_stored_intervals_are_restated_from_their_per_seed_ratios(tmp_path):
    """python -m experiments.summary rewrites every paired entry's interval from its stored
    per-seed ratios (None: a seed not paired) in a grid file's cells and a single file."""
    entry = {"per_seed": {"10": 1.5, "11": None, "12": 2.0, "13": 3.0},
             "geomean": 9.0, "ci95": [0.0, 99.0]}
    grid = {"cells": {"a/b/1x1": {"summary": {"auto": {"seeds": 4},
                                              "fedbuff": {"time_to_target_vs_auto": entry}}}}}
    single = {"summary": {"fedbuff": {"bytes_up_vs_auto": entry}}, "runs": []}
    for name, data in (("grid.json", grid), ("one.json", single)):
        (tmp_path / name).write_text(json.dumps(data))
    main([str(tmp_path / "grid.json"), str(tmp_path / "one.json")])
    expected = ratio_interval([1.5, 2.0, 3.0])
    got = json.loads((tmp_path / "grid.json").read_text())["cells"]["a/b/1x1"]["summary"]
    assert got["fedbuff"]["time_to_target_vs_auto"]["ci95"] == pytest.approx(expected["ci95"])
    assert got["auto"] == {"seeds": 4}
    one = json.loads((tmp_path / "one.json").read_text())["summary"]["fedbuff"]
    assert one["bytes_up_vs_auto"]["geomean"] == pytest.approx(expected["geomean"])


def test_a_summary_without_auto_keeps_each_methods_line_and_says_why_no_ratio(capsys):
    """--methods without auto: each method's reached count, median time and final accuracy
    are still summarized and printed (the summary was empty), with no made-up ratio and a
    line saying that auto did not run; a method that never paired with auto says how often
    auto reached the target."""
    def run(method, seed, time):
        return {"method": method, "seed": seed, "time_to_target": time,
                "final_accuracy": 0.9, "client_compute_s": 1.0, "bytes_up": 1}

    runs = [run("wait-for-all", s, t) for s, t in [(0, 4.0), (1, None)]]
    runs += [run("deadline", s, t) for s, t in [(0, 2.0), (1, 3.0)]]
    summary = summarize(runs)
    assert set(summary) == {"wait-for-all", "deadline"}
    assert not any(key.endswith("_vs_auto") for entry in summary.values() for key in entry)
    print_summary({"summary": summary})
    lines = capsys.readouterr().out.splitlines()
    assert "reached 1/2" in lines[0] and "median time ∞" in lines[0]
    assert "reached 2/2" in lines[1] and "median time 2.50 s" in lines[1]
    assert "auto did not run" in lines[2] and "time / auto" not in "".join(lines[:2])
    with_auto = summarize([*runs, run("auto", 0, None), run("auto", 1, None)])
    print_summary({"summary": with_auto})
    line = capsys.readouterr().out.splitlines()[1]
    assert "no seed where both reached the target (auto 0/2)" in line
