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
    settings = {"task": task, "latency_table": latency, "n": n, "cohort": cohort,
                "run_config": {"stop-late-work": "decode"} if variant == "decode" else {}}
    (runs / f"{task}_{latency}_{n}x{cohort}_{variant}.json").write_text(
        json.dumps({"settings": settings, "runs": records}))


def _every_cell(tmp_path):
    """Comparisons of every cell (8 s -> 6 s on each seed) and the first cell's decode file."""
    runs = tmp_path / "runs"
    for cell in rule_module.CELLS:
        _write(runs, cell, "deadline", [8.0] * 3)
        _write(runs, cell, "decode", [6.0] * 3)
    task, latency, n, cohort = rule_module.CELLS[0]
    return runs, runs / f"{task}_{latency}_{n}x{cohort}_decode.json"


def test_the_rule_is_the_geometric_mean_of_paired_ratios_with_misses_counted(tmp_path):
    runs = tmp_path / "runs"
    first, *rest = rule_module.CELLS
    # first cell: a seed only "decode" reaches (0.5), only "deadline" (2), neither (1)
    _write(runs, first, "deadline", [None, 4.0, None])
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
    runs, path = _every_cell(tmp_path)
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "runs": [{"method": "auto", "seed": 10,
                                                  "time_to_target": 1.0}]}))
    with pytest.raises(ValueError, match=r"expected auto's runs on seeds \[0, 1, 2\]"):
        rule_module.rule(runs)


def test_a_comparison_of_another_variant_or_cell_is_refused(tmp_path):
    runs, path = _every_cell(tmp_path)
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "settings": {**data["settings"], "run_config": {}}}))
    with pytest.raises(ValueError, match=r"at the deadline; expected .*decode"):
        rule_module.rule(runs)
    path.write_text(json.dumps({**data, "settings": {**data["settings"], "n": 7}}))
    with pytest.raises(ValueError, match=r"expected \('digits-logreg'"):
        rule_module.rule(runs)
