"""Amendment 15's rule (experiments.stop_at_decode), on comparisons written by hand."""

from __future__ import annotations

import json
import math

import pytest

from experiments import stop_at_decode as rule_module


def _write(runs, cell, variant, times):
    task, latency, n, cohort = cell
    runs.mkdir(exist_ok=True)
    records = [{"method": "auto", "seed": s, "time_to_target": t} for s, t in zip(
        rule_module.SEEDS, times, strict=True)]
    records.append({"method": "wait-for-all", "seed": 0, "time_to_target": 99.0})
    (runs / f"{task}_{latency}_{n}x{cohort}_{variant}.json").write_text(
        json.dumps({"runs": records}))


def test_the_rule_is_the_geometric_mean_of_paired_ratios_with_misses_counted(tmp_path):
    runs = tmp_path / "runs"
    first, *rest = rule_module.CELLS
    # first cell: 10 -> 5 (0.5), a seed only "deadline" reaches (2), neither reaches (1)
    _write(runs, first, "deadline", [10.0, 4.0, None])
    _write(runs, first, "decode", [5.0, None, None])
    for cell in rest:  # every other seed: 8 -> 6 (0.75)
        _write(runs, cell, "deadline", [8.0] * 3)
        _write(runs, cell, "decode", [6.0] * 3)
    result = rule_module.rule(runs)
    name = "/".join([first[0], first[1], f"{first[2]}x{first[3]}"])
    assert result["cells"][name]["ratio"] == {"0": 0.5, "1": 2.0, "2": 1.0}
    assert result["cells"][name]["geomean"] == pytest.approx(1.0)
    pairs = 3 * len(rule_module.CELLS)
    expected = math.exp((3 * (len(rule_module.CELLS) - 1) * math.log(0.75)) / pairs)
    assert result["geomean"] == pytest.approx(expected)
    assert result["auto_stop_at_decode"] is True
    for cell in rest:  # slower with it everywhere: the rule stays off
        _write(runs, cell, "decode", [9.0] * 3)
    assert rule_module.rule(runs)["auto_stop_at_decode"] is False


def test_a_comparison_on_other_seeds_is_refused(tmp_path):
    runs = tmp_path / "runs"
    for cell in rule_module.CELLS:
        _write(runs, cell, "deadline", [8.0] * 3)
        _write(runs, cell, "decode", [6.0] * 3)
    task, latency, n, cohort = rule_module.CELLS[0]
    path = runs / f"{task}_{latency}_{n}x{cohort}_decode.json"
    path.write_text(json.dumps({"runs": [{"method": "auto", "seed": 10,
                                          "time_to_target": 1.0}]}))
    with pytest.raises(ValueError, match=r"expected auto's runs on seeds \[0, 1, 2\]"):
        rule_module.rule(runs)
