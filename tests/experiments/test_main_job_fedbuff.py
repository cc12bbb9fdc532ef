"""The main job's FedBuff settings follow the grid file's rule (amendment 31): the committed
pick is the one the rule's ranking gives over the settings it recorded (recomputed here from
their per-seed runs with numpy's median, not the library's ranking), in the main job's own
setting, and the rule runs end to end."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from experiments import main_job_fedbuff as mjf
from experiments.compare import load_grid

ROOT = Path(__file__).resolve().parents[2]


def _rank(tried: list[dict], a_priori: tuple[float, float]) -> dict:
    """The rule's ranking, from each setting's per-seed runs: lowest median time to target (a
    seed that never reached it: infinite), highest median final accuracy, the a-priori one,
    the order tried."""
    def key(item):
        i, t = item
        times = [math.inf if r["time_to_target"] is None else r["time_to_target"]
                 for r in t["per_seed"].values()]
        finals = [r["final_accuracy"] for r in t["per_seed"].values()]
        return (float(np.median(times)), -float(np.median(finals)),
                (t["server_lr"], t["buffer_fraction"]) != a_priori, i)

    return min(enumerate(tried), key=key)[1]


def test_the_committed_pick_is_the_rules_in_the_main_jobs_setting():
    from experiments.compare_cli import HARNESS_KEYS
    from fl_gradcode.config import DEFAULTS
    from server.launch import MAIN_JOB_FEDBUFF, NUM_SUPERNODES

    data = json.loads(MAIN_JOB_FEDBUFF.read_text())
    grid = load_grid()
    rules, settings, tuning = grid["rules"], data["settings"], data["tuning"]
    assert settings["n"] == settings["cohort"] == NUM_SUPERNODES
    assert settings["dev_seeds"] == tuning["dev_seeds"] == grid["seeds"]["development"]
    assert settings["rounds"] == grid["scale"]["rounds"]
    assert set(settings["run_config"]) == set(DEFAULTS) - set(HARNESS_KEYS)
    assert {k: DEFAULTS[k] for k in settings["run_config"]} == settings["run_config"]
    # and the keys the harness sets are the main job's too: its rounds, every node, virtual
    assert (DEFAULTS["num-rounds"], DEFAULTS["fraction-train"], DEFAULTS["timing"]) == (
        settings["rounds"], 1.0, "virtual")
    tried = tuning["grid"]
    assert all(len(t["per_seed"]) == len(settings["dev_seeds"]) for t in tried)
    # every setting of the grid file's lists was tried, and the growths were the rule's
    pairs = {(t["server_lr"], t["buffer_fraction"]) for t in tried}
    assert {(lr, f) for lr in rules["fedbuff_tune_server_lr"]
            for f in rules["fedbuff_tune_buffer_fraction"]} <= pairs
    assert len(tuning["extensions"]) <= rules["fedbuff_tune_extend"]
    a_priori = (rules["fedbuff_server_lr"], rules["fedbuff_buffer_fraction"])
    best = _rank(tried, a_priori)
    assert (data["server_lr"], data["buffer_fraction"]) == (best["server_lr"],
                                                            best["buffer_fraction"])
    assert data["buffer_size"] == max(1, math.ceil(best["buffer_fraction"] * NUM_SUPERNODES
                                                   - 1e-9))


def test_the_rule_runs_and_picks_a_setting_it_tried():
    grid = load_grid()
    grid["scale"] = {**grid["scale"], "rounds": 2}
    grid["seeds"] = {**grid["seeds"], "development": [0, 1]}
    grid["rules"] = {**grid["rules"], "fedbuff_tune_server_lr": [0.5, 1.0],
                     "fedbuff_tune_buffer_fraction": [0.5], "fedbuff_tune_extend": 0}
    result = mjf.main_job_fedbuff(grid, 4, log=lambda _: None)
    tried = result["tuning"]["grid"]
    assert [(t["server_lr"], t["buffer_fraction"]) for t in tried] == [(0.5, 0.5), (1.0, 0.5)]
    best = _rank(tried, (1.0, 0.25))
    assert (result["server_lr"], result["buffer_fraction"]) == (best["server_lr"], 0.5)
    assert result["buffer_size"] == 2 and result["server_steps"] == 4  # 2 rounds x 4 / K 2
    assert result["settings"]["n"] == result["settings"]["cohort"] == 4


def test_the_readme_says_how_the_main_jobs_fedbuff_was_chosen():
    from server.launch import MAIN_JOB_FEDBUFF

    data = json.loads(MAIN_JOB_FEDBUFF.read_text())
    readme = (ROOT / "README.md").read_text()
    assert (f"its FedBuff run's server lr ({data['server_lr']:g}) and buffer "
            f"(K = {data['buffer_size']}) by the benchmark's FedBuff tuning rule") in readme
    assert "python -m experiments.main_job_fedbuff" in readme


def test_the_rule_runs_in_another_setting_and_the_launcher_reads_its_pick(tmp_path):
    """``--run-config`` tunes FedBuff in the user's own setting (here 6 nodes, a cohort of
    3, persistent stragglers at p = 0.5): its runs take those keys, the pick records them,
    and the launcher's label then names no departure for that run."""
    from server.fedbuff_run import care, read_pick, retune_command, tuned_keys
    from server.launch import dropped

    grid = load_grid()
    grid["scale"] = {**grid["scale"], "rounds": 2}
    grid["seeds"] = {**grid["seeds"], "development": [0]}
    grid["rules"] = {**grid["rules"], "fedbuff_tune_server_lr": [0.5, 1.0],
                     "fedbuff_tune_buffer_fraction": [0.5], "fedbuff_tune_extend": 0}
    values = {"latency-p": 0.5, "fraction-train": 0.5, "code": "frc", "s": 1, "num-rounds": 2}
    result = mjf.main_job_fedbuff(grid, 6, log=lambda _: None, overrides=values)
    settings = result["settings"]
    assert (settings["n"], settings["cohort"], settings["rounds"]) == (6, 3, 2)
    assert settings["run_config"]["latency-p"] == 0.5
    assert "code" not in settings["run_config"] or settings["run_config"]["code"] != "frc"
    assert result["buffer_size"] == 2  # half of the cohort of 3, rounded up
    path = tmp_path / "pick.json"
    path.write_text(json.dumps(result))
    assert read_pick(path)["cohort"] == 3
    assert care(values, 6, dropped("fedbuff"), path) == (
        f"tuned on development seeds 0 by the benchmark's rule in the setting it records "
        f"({path})")
    assert retune_command(values, 6, path) is None
    assert tuned_keys(values, 6, path)["buffer-size"] == "2"
    # the committed pick (12 nodes, every one in the cohort) is outside this setting
    label = care(values, 6, dropped("fedbuff"))
    assert "6 nodes (tuned at 12)" in label and "a cohort of 3 (tuned at 12)" in label
    command = retune_command(values, 6)
    assert command is not None and "--num-supernodes 6" in command
    assert ("--run-config \"latency-p=0.5 fraction-train=0.5 code='frc' s=1 num-rounds=2\""
            in command)


@pytest.mark.parametrize(("text", "named"), [("server-lr=2.0", "server-lr=2.0"),
                                             ("buffer-size=3", "buffer-size=3"),
                                             ("timing='wallclock'", "timing='wallclock'")])
def test_keys_the_rule_cannot_take_are_refused_before_any_run(text, named, capsys):
    with pytest.raises(SystemExit) as exc:
        mjf.main(["--run-config", text, "--out", "/dev/null"])
    assert exc.value.code == 2 and named in capsys.readouterr().err



@pytest.mark.parametrize(("flags", "written"), [
    ([], "results/main_job_fedbuff.json"),
    (["--num-supernodes", "12"], "results/main_job_fedbuff.json"),
    (["--run-config", "latency-p=0.3"], "results/main_job_fedbuff_here.json"),
    (["--num-supernodes", "6"], "results/main_job_fedbuff_here.json"),
    (["--target", "0.9"], "results/main_job_fedbuff_here.json"),
    (["--target", "0.85"], "results/main_job_fedbuff.json"),  # the grid's target
    (["--run-config", "latency-p=0.3", "--out", "mine.json"], "mine.json")])
def test_a_pick_made_in_another_setting_does_not_replace_the_committed_one(
        tmp_path, monkeypatch, flags, written):
    # the launcher reads results/main_job_fedbuff.json as the main job's default setting's pick:
    # the command run in another setting wrote over it unless given --out
    monkeypatch.chdir(tmp_path)
    result = {"server_lr": 1.0, "buffer_size": 1, "buffer_fraction": 0.1,
              "settings": {"cohort": 12}}
    monkeypatch.setattr(mjf, "main_job_fedbuff", lambda *a, **k: dict(result))
    assert mjf.main(flags) == 0
    assert [str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.json")] == [written]
