"""The main job's FedBuff run and its presets as the ServerApp builds them: every run config
the launcher writes is one the app accepts, not only one whose keys are known."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from flwr.common.config import parse_config_args

from fl_gradcode.config import merge_config

N = 12  # the launcher's SuperNodes


def _config(run: str, overrides: str) -> dict:
    from server.launch import run_config_for

    return merge_config(parse_config_args([run_config_for(run, overrides, Path("/tmp/r"))]))


@pytest.mark.parametrize("preset", ["", "coding-wins", "coding-loses"])
def test_every_run_of_the_defaults_and_the_presets_builds(preset):
    from server.app import build, build_rival
    from server.asynchronous import build_async
    from server.launch import preset_overrides

    overrides = preset_overrides(preset) if preset else ""
    build(_config("coded", overrides), N)  # raises on a key the coded run would refuse
    build_rival(_config("drop-stragglers", overrides), N)
    build(_config("uncoded", overrides), N)
    build_async(_config("fedbuff", overrides), N)


def test_the_fedbuff_run_of_an_asynchronous_job_keeps_its_buffer_and_drops_its_rule():
    from server.asynchronous import build_async

    cfg = _config("fedbuff", "asynchronous=true s='auto' buffer-size=4 num-rounds=2")
    assert (cfg["asynchronous"], cfg["s"], cfg["buffer-size"]) == (True, 0, 4)
    assert cfg["server-lr"] == 1.0  # the job's own, not FedBuff's tuned one
    strategy, *_ = build_async(cfg, N)
    assert strategy.s == 0 and strategy.buffer_size == 4


def test_the_fedbuff_run_of_a_coded_job_runs_the_tuned_pick():
    # the committed pick of the grid file's rule (results/main_job_fedbuff.json): its server
    # lr, its K at the nodes it was tuned at (as recorded), the staleness weight it ran with
    import json

    from server.asynchronous import build_async
    from server.launch import MAIN_JOB_FEDBUFF

    pick = json.loads(MAIN_JOB_FEDBUFF.read_text())
    assert pick["settings"]["n"] == N
    for overrides in ("", "server-lr=0.5 num-rounds=3"):
        cfg = _config("fedbuff", overrides)
        assert (cfg["server-lr"], cfg["buffer-size"]) == (pick["server_lr"],
                                                          pick["buffer_size"]), overrides
        strategy, *_ = build_async(cfg, N)
        assert strategy.buffer_size == pick["buffer_size"]
        assert strategy.staleness_exponent == pick["staleness_exponent"]


def _harness_k(fraction: float, n: int, cohort: int) -> int:
    """K as the benchmark's cell computes it for a buffer ``fraction`` of ``cohort``."""
    import dataclasses

    from experiments.registry import grid_cell, load_grid

    cell = grid_cell(load_grid(), "digits-logreg", "", n, cohort, 30, 0.85)
    return dataclasses.replace(cell, fedbuff_buffer_fraction=fraction).fedbuff_buffer()


def test_the_tuned_buffer_is_the_benchmarks_fraction_of_the_run_cohort(tmp_path):
    from server.fedbuff_run import tuned_keys

    pick = tmp_path / "pick.json"
    pick.write_text(json.dumps({"server_lr": 4.0, "buffer_fraction": 0.25, "settings": {
        "n": 12, "rounds": 30, "dev_seeds": [0], "run_config": {}}}))
    for values, n, cohort in (({}, 12, 12), ({"fraction-train": 0.5}, 12, 6),
                              ({"fraction-train": 0.1}, 12, 1), ({}, 40, 40),
                              ({"num-clients": 20}, 12, 20)):  # the nodes the app waits for
        assert tuned_keys(values, n, pick) == {
            "server-lr": "4.0", "buffer-size": str(_harness_k(0.25, max(n, cohort), cohort))}
    assert tuned_keys({"asynchronous": True}, 12, pick) == {}


@pytest.mark.parametrize("content", [None, "not json", '{"server_lr": 2}',
                                     '{"server_lr": -1, "buffer_fraction": 0.5}'])
def test_without_a_readable_pick_fedbuff_is_skipped_saying_why(tmp_path, monkeypatch, content):
    # FedBuff does not run untuned in silence, and the main job still ends with its table
    from server import fedbuff_run
    from server.launch import fedbuff_refusal
    from tests.integration.launching import launch_main

    path = tmp_path / "pick.json"
    if content is not None:
        path.write_text(content)
    reason = fedbuff_refusal({}, 12, path)
    assert reason is not None and "experiments.main_job_fedbuff" in reason and str(path) in reason
    monkeypatch.setattr(fedbuff_run, "MAIN_JOB_FEDBUFF", path)
    code, configs = launch_main(tmp_path, monkeypatch, ["--run-config", "num-rounds=2"])
    assert code == 0 and len(configs) == 3 and not any("run-fedbuff" in c for c in configs)
    assert launch_main.compared[0][3] is None


def test_the_label_names_what_departs_from_the_tuning_setting(tmp_path, monkeypatch):
    from tests.integration.launching import launch_main

    launch_main(tmp_path / "a", monkeypatch, ["--run-config", "num-rounds=2"])
    plain = launch_main.keywords[0]["fedbuff_care"]
    assert plain.startswith("tuned on development seeds 0, 1, 2 by the benchmark's rule in "
                            "the main job's default setting") and "num-rounds=2" in plain
    launch_main(tmp_path / "b", monkeypatch, ["--num-supernodes", "40", "--run-config",
                                              "latency-p=0.3"])
    away = launch_main.keywords[0]["fedbuff_care"]
    assert "a cohort of 40 (tuned at 12)" in away and "latency-p=0.3" in away
    assert "num-rounds" not in away
    # a key FedBuff does not read (the code of the coded rounds) is not a departure
    launch_main(tmp_path / "c", monkeypatch, ["--run-config", "code='frc' s=1"])
    assert "run outside it" not in launch_main.keywords[0]["fedbuff_care"]


def test_a_replaced_server_lr_is_said(tmp_path, monkeypatch, capsys):
    from tests.integration.launching import launch_main

    code, configs = launch_main(tmp_path, monkeypatch, ["--run-config",
                                                         "server-lr=0.5 num-rounds=2"])
    assert code == 0 and "server-lr=0.5" in configs[0]  # the coded run keeps the user's
    out = capsys.readouterr().out
    assert "the fedbuff run replaces server-lr=0.5" in out


@pytest.mark.parametrize("fault", ["slow-workers='0'", "nan-workers='1,2'"])
def test_faults_of_coded_rounds_skip_the_fedbuff_run_naming_why(fault):
    # a round's fault names a position in the cohort, an asynchronous job's a partition id:
    # run as it stands, FedBuff would be faulted on other clients than the coded run
    from server.launch import fedbuff_refusal, override_values, parse_overrides

    reason = fedbuff_refusal(override_values(parse_overrides(f"{fault} slow-delay-s=1.0 "
                                                             "virtual-compute='measured'")))
    assert reason is not None and fault.split("=")[0] in reason and "partition" in reason


@pytest.mark.parametrize("fault", ["slow-workers='0'", "nan-workers='1,2'"])
def test_faults_of_an_asynchronous_job_reach_its_fedbuff_run(fault):
    # both runs name the faulty client by its partition id: the same clients, no refusal
    from server.asynchronous import build_async
    from server.launch import fedbuff_refusal, override_values, parse_overrides

    overrides = f"asynchronous=true {fault} slow-delay-s=1.0 virtual-compute='measured'"
    assert fedbuff_refusal(override_values(parse_overrides(overrides))) is None
    cfg = _config("fedbuff", overrides)
    assert cfg[fault.split("=")[0]] == fault.split("=")[1].strip("'")
    build_async(cfg, N)


def _pick(tmp_path, lr=4.0, fraction=0.25):
    path = tmp_path / "pick.json"
    path.write_text(json.dumps({"server_lr": lr, "buffer_fraction": fraction, "settings": {
        "n": 12, "rounds": 30, "dev_seeds": [0, 1, 2], "run_config": {"latency-p": 0.2}}}))
    return path


def test_the_asynchronous_hint_carries_fedbuffs_tuned_keys_unless_the_user_set_one(tmp_path):
    # without them the suggested mode and its FedBuff baseline would run the key table's
    # untuned lr 1 and K = cohort / 4 (3 of 12), not what the fedbuff run beside rounds ran
    from server.fedbuff_run import async_tuned

    pick = _pick(tmp_path)
    assert async_tuned({}, 12, pick) == "server-lr=4.0 buffer-size=3"
    assert async_tuned({"fraction-train": 0.5}, 12, pick) == "server-lr=4.0 buffer-size=2"
    assert async_tuned({"server-lr": 0.5}, 12, pick) is None  # the user's lr is theirs
    assert async_tuned({"buffer-size": 2}, 12, pick) is None
    assert async_tuned({}, 12, tmp_path / "missing.json") is None


def test_the_hinted_asynchronous_job_runs_the_pick_and_its_label_says_so(tmp_path):
    from server.asynchronous import build_async
    from server.fedbuff_run import async_tuned, care
    from server.launch import MAIN_JOB_FEDBUFF, dropped, override_values, parse_overrides

    committed = json.loads(MAIN_JOB_FEDBUFF.read_text())
    text = f"asynchronous=true s='auto' {async_tuned({}, N)}"
    strategy, *_ = build_async(_config("coded", text), N)
    assert (strategy.server_lr, strategy.buffer_size) == (committed["server_lr"],
                                                          committed["buffer_size"])
    label = care(override_values(parse_overrides(text)), N, dropped("fedbuff"))
    assert label.startswith("the coded job's own, FedBuff's: tuned on development seeds")
    assert "run outside it" not in label  # asynchrony and s are the coded job's, not FedBuff's
    away = care(override_values(parse_overrides(text + " latency-p=0.3")), N,
                dropped("fedbuff"))
    assert away.endswith("run outside it: latency-p=0.3")


def test_an_untuned_asynchronous_job_is_labelled_untuned_naming_the_pick(tmp_path):
    from server.fedbuff_run import care
    from server.launch import dropped

    pick = _pick(tmp_path)
    label = care({"asynchronous": True, "s": "auto"}, 12, dropped("fedbuff"), pick)
    assert label.startswith("the coded job's own, untuned (server lr 1, K 3;")
    assert "add server-lr=4.0 buffer-size=3 to --run-config" in label
    assert care({"asynchronous": True}, 12, dropped("fedbuff"),
                tmp_path / "missing.json") == "the coded job's own, untuned"


def test_the_launcher_hands_the_table_the_tuned_keys_of_the_hint(tmp_path, monkeypatch):
    from tests.integration.launching import launch_main

    pick = _pick(tmp_path, lr=3.0, fraction=0.5)  # K: half the 12 nodes' cohort
    launch_main(tmp_path / "a", monkeypatch, ["--fedbuff-pick", str(pick),
                                              "--run-config", "num-rounds=2"])
    assert launch_main.keywords[0]["async_tuned"] == "server-lr=3.0 buffer-size=6"
    launch_main(tmp_path / "b", monkeypatch, ["--run-config", "num-rounds=2 server-lr=0.5"])
    assert launch_main.keywords[0]["async_tuned"] is None


def test_an_asynchronous_jobs_server_lr_is_fedbuffs_step_not_the_synchronous_rivals(
        tmp_path, monkeypatch, capsys):
    # wait-for-all and drop-stragglers run plain FedAvg (lr 1), as the benchmark's do: an
    # asynchronous job's server-lr (FedBuff's step) neither changes the one nor skips the other
    from server.launch import rival_refusal
    from tests.integration.launching import launch_main

    text = "asynchronous=true s='auto' server-lr=2.0 buffer-size=1 num-rounds=2"
    assert rival_refusal(override_values(parse_overrides(text))) is None
    code, configs = launch_main(tmp_path, monkeypatch, ["--run-config", text])
    assert code == 0 and len(configs) == 4
    by_run = {c.split("results-dir=")[1].split("'")[1].rsplit("/", 1)[1]: c for c in configs}
    assert "server-lr=2.0" in by_run["run"] and "server-lr=2.0" in by_run["run-fedbuff"]
    assert "server-lr" not in by_run["run-uncoded"]
    assert "server-lr" not in by_run["run-drop-stragglers"]
    assert merge_config(parse_config_args([by_run["run-uncoded"]]))["server-lr"] == 1.0
    assert "leave out server-lr=2.0" in capsys.readouterr().out
    # in rounds, server-lr is every synchronous run's server step: the uncoded run keeps it
    _, configs = launch_main(tmp_path / "b", monkeypatch, ["--run-config",
                                                           "server-lr=0.5 num-rounds=2"])
    assert sum("server-lr=0.5" in c for c in configs) == 2  # the coded and the uncoded run


from server.launch import override_values, parse_overrides  # noqa: E402


def test_the_launcher_runs_a_pick_it_is_given_and_says_how_to_tune_one(tmp_path, monkeypatch,
                                                                      capsys):
    from tests.integration.launching import launch_main

    pick = _pick(tmp_path)  # tuned at 12 nodes, 30 rounds, latency-p 0.2
    code, configs = launch_main(tmp_path / "a", monkeypatch, [
        "--fedbuff-pick", str(pick), "--run-config", "num-rounds=30 latency-p=0.2"])
    fedbuff = next(c for c in configs if "run-fedbuff" in c)
    assert code == 0 and "server-lr=4.0" in fedbuff and "buffer-size=3" in fedbuff
    assert launch_main.keywords[0]["fedbuff_care"].endswith(f"({pick})")
    assert "to tune FedBuff in this setting" not in capsys.readouterr().out
    # outside the pick's setting: the command that tunes it there, and how to pass it
    launch_main(tmp_path / "b", monkeypatch, ["--run-config", "latency-p=0.3 num-rounds=2"])
    out = capsys.readouterr().out
    assert ("to tune FedBuff in this setting: python -m experiments.main_job_fedbuff "
            "--run-config \"latency-p=0.3 num-rounds=2\" --out "
            "results/main_job_fedbuff_here.json, then add --fedbuff-pick "
            "results/main_job_fedbuff_here.json to this command") in out


def test_outside_the_deadlines_setting_the_launcher_says_how_to_pick_it_there(
        tmp_path, monkeypatch, capsys):
    # the round deadline (the coded run's and drop-stragglers') was picked by the stated
    # rule in the main job's default setting; where the run departs from it and leaves the
    # deadline at its default, the command that picks it there is printed
    from tests.integration.launching import launch_main

    launch_main(tmp_path / "a", monkeypatch, ["--run-config", "latency-p=0.3"])
    out = capsys.readouterr().out
    assert ("python -m experiments.main_job_deadline --run-config \"latency-p=0.3\"" in out
            and "run outside it: latency-p=0.3" in out)
    # a key only coded rounds read is no departure of wait-for-all's runs
    launch_main(tmp_path / "b", monkeypatch, ["--run-config", "code='frc' s=1"])
    assert "main_job_deadline" not in capsys.readouterr().out
    # nor is it said where the user set the deadline, or the job has none (asynchronous)
    launch_main(tmp_path / "c", monkeypatch, ["--run-config",
                                              "latency-p=0.3 straggler-timeout=3.0"])
    launch_main(tmp_path / "d", monkeypatch, ["--run-config",
                                              "latency-p=0.3 asynchronous=true s='auto'"])
    assert "main_job_deadline" not in capsys.readouterr().out
    # a wall-clock deadline is real seconds: the rule's virtual-time runs cannot pick it
    from server.launch import deadline_retune

    assert deadline_retune({"timing": "wallclock", "latency": "none"}, 12) is None


def test_the_fedbuff_retune_line_says_what_an_asynchronous_job_needs_and_skips_wallclock():
    # an asynchronous job's FedBuff keeps the job's own lr and K: a pick file changes
    # nothing there, so the line says to set the keys; a wall-clock run gets no line
    from server.fedbuff_run import retune_command

    line = retune_command({"asynchronous": True, "s": "auto", "server-lr": 2.0,
                           "buffer-size": 1, "num-rounds": 10}, N)
    assert line is not None and line.endswith(
        "then add --fedbuff-pick results/main_job_fedbuff_here.json to this command and set "
        "server-lr and buffer-size to the lr and K it prints")
    assert retune_command({"timing": "wallclock"}, N) is None
    assert "--fedbuff-pick" in retune_command({"num-rounds": 10}, N)


def test_a_pick_timed_to_another_target_is_not_called_the_default_setting(tmp_path):
    # a pick made with --target in the default setting was labelled "the main job's default
    # setting", whose grid target (0.85 for digits-logreg) it was not timed to
    from server.fedbuff_run import care
    from server.launch import MAIN_JOB_FEDBUFF, dropped

    committed = json.loads(MAIN_JOB_FEDBUFF.read_text())
    assert "the main job's default setting" in care({}, N, dropped("fedbuff"))
    other = tmp_path / "pick.json"
    committed["settings"]["target"] = 0.9
    other.write_text(json.dumps(committed))
    label = care({}, N, dropped("fedbuff"), other)
    assert "default setting" not in label
    assert "the setting it records (time to accuracy 0.9, the grid's is 0.85)" in label


@pytest.mark.parametrize("value", ["it's", "$HOME `id` a\\b", "x'$y", "a!b", "it's \"x\"",
                                   "two\nlines", "ends in \\", "it's \U0001F600"])
def test_the_printed_commands_give_the_rule_the_users_values_through_a_shell(value, tmp_path):
    # the retune lines print --run-config for a user to paste into an interactive shell: a
    # single quote in a string broke its TOML, and $, backticks or ! were expanded
    import subprocess
    import sys

    from server.fedbuff_run import retune_command

    values = {"roster": value, "num-rounds": 10}
    line = retune_command(values, N)
    command = line.split("python -m experiments.main_job_fedbuff ", 1)[1].split(" --out ")[0]
    got = tmp_path / "argv"
    script = ("set -o history -o histexpand\n"
              f"{sys.executable} -c 'import sys; open(sys.argv[1], \"w\").write(sys.argv[3])' "
              f"{got} {command}\n")
    subprocess.run(["bash", "--norc", "-i"], input=script, capture_output=True, text=True,
                   check=False, timeout=60)
    assert override_values(parse_overrides(got.read_text())) == values
