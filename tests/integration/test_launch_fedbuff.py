"""The main job's FedBuff run and its presets as the ServerApp builds them: every run config
the launcher writes is one the app accepts, not only one whose keys are known."""

from __future__ import annotations

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
    # lr, and K its fraction of the run's cohort (at least one update)
    import json
    import math

    from server.asynchronous import build_async
    from server.launch import MAIN_JOB_FEDBUFF

    pick = json.loads(MAIN_JOB_FEDBUFF.read_text())
    for overrides, cohort in (("", N), ("fraction-train=0.5", N // 2),
                              ("server-lr=0.5 num-rounds=3", N)):
        cfg = _config("fedbuff", overrides)
        k = max(1, math.ceil(pick["buffer_fraction"] * cohort - 1e-9))
        assert (cfg["server-lr"], cfg["buffer-size"]) == (pick["server_lr"], k), overrides
        strategy, *_ = build_async(cfg, N)
        assert strategy.buffer_size == k


def test_the_tuned_buffer_is_a_fraction_of_the_cohort(tmp_path):
    from server.launch import fedbuff_refusal, fedbuff_tuned

    pick = tmp_path / "pick.json"
    pick.write_text('{"server_lr": 4.0, "buffer_fraction": 0.25}')
    assert fedbuff_tuned({}, 12, pick) == {"server-lr": "4.0", "buffer-size": "3"}
    assert fedbuff_tuned({"fraction-train": 0.5}, 12, pick)["buffer-size"] == "2"
    assert fedbuff_tuned({"fraction-train": 0.1}, 12, pick)["buffer-size"] == "1"
    assert fedbuff_tuned({"asynchronous": True}, 12, pick) == {}
    # without its tuning FedBuff does not run untuned in silence: it is skipped, saying why
    reason = fedbuff_refusal({}, 12, tmp_path / "none.json")
    assert reason is not None and "experiments.main_job_fedbuff" in reason


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
