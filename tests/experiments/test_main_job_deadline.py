"""The main job's round deadline follows the rule of experiments/grid.toml: the value the key
table holds is the one the committed run of the rule gives, recomputed here from the client
times it recorded (numpy's quantile, not the library's rule), and the rule runs end to end."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from experiments import main_job_deadline as mjd
from experiments.compare import load_grid

ROOT = Path(__file__).resolve().parents[2]


def test_the_key_table_holds_the_rules_value():
    from fl_gradcode.config import DEFAULTS
    from server.launch import NUM_SUPERNODES

    data = json.loads((ROOT / "results" / "main_job_deadline.json").read_text())
    grid = load_grid()
    rules = grid["rules"]
    settings = data["settings"]
    assert settings["n"] == settings["cohort"] == NUM_SUPERNODES
    assert settings["dev_seeds"] == grid["seeds"]["development"]
    assert settings["rounds"] == grid["scale"]["rounds"]
    # the main job's setting: every key the runs had (but those the harness sets per run) is
    # the key table's default, latency and compute charge included
    from experiments.compare_cli import HARNESS_KEYS

    assert set(settings["run_config"]) == set(DEFAULTS) - set(HARNESS_KEYS)
    assert {k: DEFAULTS[k] for k in settings["run_config"]} == settings["run_config"]
    times = [t for seed in grid["seeds"]["development"]
             for t in data["client_times_s"][str(seed)]]
    assert len(times) == len(grid["seeds"]["development"]) * NUM_SUPERNODES * settings["rounds"]
    expected = rules["deadline_slack"] * float(np.quantile(times, rules["deadline_quantile"]))
    assert math.isclose(data["stated_deadline_s"], expected, rel_tol=1e-12)
    assert DEFAULTS["straggler-timeout"] == round(expected, rules["main_job_deadline_digits"])


def test_the_rule_runs_and_rounds(monkeypatch):
    grid = load_grid()
    grid["scale"] = {**grid["scale"], "rounds": 2}
    grid["seeds"] = {**grid["seeds"], "development": [0, 1]}
    result = mjd.main_job_deadline(grid, 4, log=lambda _: None)
    times = [t for seed in ("0", "1") for t in result["client_times_s"][seed]]
    assert len(times) == 2 * 4 * 2 and all(t > 0 for t in times)
    expected = 3.0 * float(np.quantile(times, 0.75))
    assert math.isclose(result["stated_deadline_s"], expected, rel_tol=1e-12)
    assert result["straggler_timeout_s"] == round(expected, 2)
    assert result["settings"]["n"] == result["settings"]["cohort"] == 4


def test_the_rule_runs_in_another_setting_and_reads_its_keys():
    """``--run-config`` picks the deadline in the user's own setting: a cohort of 3 of 6
    nodes, and slower stragglers (p = 0.5), whose client times the rule reads: the deadline
    is the rule's on those times and longer than the same rule's at p = 0 (no straggler)."""
    grid = load_grid()
    grid["scale"] = {**grid["scale"], "rounds": 2}
    grid["seeds"] = {**grid["seeds"], "development": [0, 1]}
    slow = mjd.main_job_deadline(grid, 6, log=lambda _: None,
                                 overrides={"fraction-train": 0.5, "latency-p": 0.5,
                                            "code": "frc"})
    settings = slow["settings"]
    assert (settings["n"], settings["cohort"]) == (6, 3)
    assert settings["run_config"]["latency-p"] == 0.5
    times = [t for seed in ("0", "1") for t in slow["client_times_s"][seed]]
    assert len(times) == 2 * 3 * 2
    assert math.isclose(slow["stated_deadline_s"], 3.0 * float(np.quantile(times, 0.75)),
                        rel_tol=1e-12)
    fast = mjd.main_job_deadline(grid, 6, log=lambda _: None,
                                 overrides={"fraction-train": 0.5, "latency-p": 0.0})
    assert fast["stated_deadline_s"] < slow["stated_deadline_s"]


def test_the_deadline_itself_is_refused_before_any_run(capsys):
    import pytest

    with pytest.raises(SystemExit) as exc:
        mjd.main(["--run-config", "straggler-timeout=3.0", "--out", "/dev/null"])
    assert exc.value.code == 2 and "straggler-timeout=3.0" in capsys.readouterr().err


@pytest.mark.parametrize(("flags", "written"), [
    ([], "results/main_job_deadline.json"),
    (["--num-supernodes", "12"], "results/main_job_deadline.json"),
    (["--run-config", "latency-p=0.3"], "results/main_job_deadline_here.json"),
    (["--num-supernodes", "6"], "results/main_job_deadline_here.json"),
    (["--run-config", "latency-p=0.3", "--out", "mine.json"], "mine.json")])
def test_a_pick_made_in_another_setting_does_not_replace_the_committed_one(
        tmp_path, monkeypatch, flags, written):
    # the launcher reads results/main_job_deadline.json as the main job's default setting's pick:
    # the command run in another setting wrote over it unless given --out
    monkeypatch.chdir(tmp_path)
    result = {"straggler_timeout_s": 1.0, "stated_deadline_s": 1.0}
    monkeypatch.setattr(mjd, "main_job_deadline", lambda *a, **k: dict(result))
    assert mjd.main(flags) == 0
    assert [str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.json")] == [written]
