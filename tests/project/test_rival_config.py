"""A rival run (Flower's own FedAvg) refuses, naming it, a run-config key it would not apply,
instead of running without it: the client faults (injected into coded messages only) and
the coded-only keys set away from their defaults."""

from __future__ import annotations

import pytest

from fl_gradcode.config import coded_only_keys, merge_config


def _build(tmp_path, **overrides):
    from server.app import build_rival

    cfg = merge_config({"results-dir": str(tmp_path / "r"), "rival": "drop-stragglers",
                        **overrides})
    return build_rival(cfg, 6)


@pytest.mark.parametrize(("overrides", "named"), [
    ({"slow-workers": "1", "slow-delay-s": 5.0}, "slow-workers='1'"),
    ({"nan-workers": "0,2"}, "nan-workers='0,2'"),
])
def test_client_faults_are_refused_as_the_rival_would_run_without_them(tmp_path, overrides,
                                                                       named):
    with pytest.raises(ValueError, match=rf"{named}.*coded messages only"):
        _build(tmp_path, **overrides)


@pytest.mark.parametrize(("overrides", "named"), [
    ({"verify": True}, "verify=True"),
    ({"roster": "/nonexistent/roster.json"}, "roster='/nonexistent/roster.json'"),
    ({"code": "bgc"}, "code='bgc'"),
    ({"s": 2}, "s=2"),
    ({"busy": "fit"}, "busy='fit'"),
    ({"max-decode-error": 0.1}, "max-decode-error=0.1"),
    # the coded run's wait for a node's first reply; the rival waits round-timeout for all
    ({"warmup-timeout": 5.0}, "warmup-timeout=5.0"),
])
def test_a_coded_only_key_away_from_its_default_is_refused(tmp_path, overrides, named):
    with pytest.raises(ValueError, match=rf"{named}.*read by coded runs only"):
        _build(tmp_path, **overrides)


def test_the_defaults_of_every_coded_only_key_are_taken(tmp_path):
    """The run config always carries every key: their defaults are 'not given'."""
    assert "rival" in coded_only_keys()
    strategy, *_ = _build(tmp_path)
    assert strategy.deadline == merge_config({})["straggler-timeout"]


def test_the_launcher_skips_the_rival_with_faults_and_says_why():
    from server.launch import rival_refusal

    assert rival_refusal({"slow-workers": "1"}).startswith("slow-workers='1'")
    assert rival_refusal({"s": 2, "verify": True}) is None  # coded-only: dropped for it
    assert rival_refusal({}) is None


def test_the_benchmarks_rivals_run_without_the_coded_only_keys():
    """experiments' rivals share the cell's run config with the coded runs: the coded-only
    keys there are the coded runs', so the rivals' runs drop them (not refused)."""
    from experiments.rival_runs import start_rival

    cfg = merge_config({"s-max": 2, "busy": "fit", "num-rounds": 1, "results-dir": ""})
    run = start_rival("wait-for-all", cfg, 4)
    assert run is not None


def test_the_deployment_baseline_takes_the_coded_runs_config_but_not_its_faults(tmp_path):
    from server.app import build_rival

    base = {"results-dir": str(tmp_path / "r"), "rival": "fedavg", "s": 1,
            "timing": "wallclock", "latency": "none"}
    build_rival(merge_config(base), 4)  # deploy_local passes the coded run's s: not read
    with pytest.raises(ValueError, match=r"slow-workers='1'.*coded messages only"):
        build_rival(merge_config({**base, "slow-workers": "1"}), 4)

