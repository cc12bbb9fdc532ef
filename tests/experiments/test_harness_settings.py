"""The time-to-accuracy scripts are settings of the one benchmark harness
(:mod:`experiments.rival_runs`): each runs end to end on a tiny setting through it, and a run of
one of them is the harness's own run of the same run config (same rows, round for round)."""

from __future__ import annotations

import json

import pytest

from experiments import (
    bandwidth_limited,
    first_hour,
    latency_vs_s,
    rival_runs,
    sampled_cohorts,
    time_to_accuracy,
)

pytestmark = [pytest.mark.filterwarnings("ignore:gradient_coding_mod. no partition key"),
              pytest.mark.usefixtures("one_torch_thread")]


def _calls(monkeypatch) -> list[str]:
    """Count the harness's runs (the scripts' only way to run a strategy)."""
    calls: list[str] = []
    coded, rival = rival_runs.start_coded, rival_runs.start_rival
    monkeypatch.setattr(rival_runs, "start_coded",
                        lambda *a, **k: calls.append("coded") or coded(*a, **k))
    monkeypatch.setattr(rival_runs, "start_rival",
                        lambda method, *a, **k: calls.append(method) or rival(method, *a, **k))
    return calls


def test_time_to_accuracy_tiny_run_goes_through_the_harness(tmp_path, monkeypatch):
    calls = _calls(monkeypatch)
    out = tmp_path / "tta"
    result = time_to_accuracy.main(["--quick", "--only", "n=12 s=3 pareto", "--schemes",
                                    "uncoded,exact,drop-stragglers", "--rounds", "2",
                                    "--out", str(out)])
    assert sorted(calls) == ["coded", "coded", "deadline"]
    saved = json.loads(out.with_suffix(".json").read_text())
    assert saved["rounds"] == 2 and saved["table"] == result["table"]
    runs = saved["runs"]["n=12 s=3 pareto"]
    assert set(runs) == {"uncoded", "exact", "drop-stragglers"}
    assert all(len(r["accuracy"]) == 2 for rs in runs.values() for r in rs)
    # exact coding computes the uncoded run's models
    assert runs["exact"][0]["accuracy"] == runs["uncoded"][0]["accuracy"]


def test_time_to_accuracy_rival_is_the_harness_deadline_run():
    """The script's drop-stragglers run is the harness's deadline rival on its run config."""
    from experiments.common import rival_deadline

    run = time_to_accuracy.rival_run(4, "drop-stragglers", "bimodal", False, 1, 3, "dirichlet")
    limit = rival_deadline(time_to_accuracy.LATENCIES["bimodal"], 1,
                           time_to_accuracy.BASE["partition-cost-s"])
    cfg = {**time_to_accuracy.BASE, **time_to_accuracy.LATENCIES["bimodal"], "seed": 1,
           "num-rounds": 3, "partitioner": "dirichlet"}
    rows = rival_runs.start_rival("deadline", cfg, 4, deadline=limit).history
    assert run["virtual_s"] == [r["virtual_s"] for r in rows]
    assert run["accuracy"] == [r["accuracy"] for r in rows]
    assert run["deadline_s"] == limit


def test_first_hour_tiny_run_goes_through_the_harness(tmp_path, monkeypatch):
    calls = _calls(monkeypatch)
    out = tmp_path / "fh"
    assert first_hour.main(["--seeds", "0", "--regimes", "persistent-auto4", "--clients", "4",
                            "--rounds", "2", "--out", str(out)]) == 0
    assert sorted(calls) == ["coded", "coded", "deadline"]
    saved = json.loads(out.with_suffix(".json").read_text())
    (row,) = saved["regimes"]["persistent-auto4"]["per_seed"]
    for name in first_hour.RUN_NAMES:
        assert row[name]["rounds"] == 2 and row[name]["compute_s"] is not None
    assert saved["recommended"] in (None, "persistent-auto4")


def test_sampled_cohorts_tiny_run_goes_through_the_harness(tmp_path, monkeypatch):
    calls = _calls(monkeypatch)
    result = sampled_cohorts.main(["--quick", "--jobs", "1", "--rounds", "2", "--schemes",
                                   "uncoded,drop-stragglers", "--out", str(tmp_path / "sc")])
    assert sorted(calls) == ["coded", "deadline"]
    runs = result["runs"]["persistent"]
    # the rival samples the coded run's cohorts (both drawn from the seed by the harness)
    assert runs["drop-stragglers"][0]["nodes_seen"] == runs["uncoded"][0]["nodes_seen"]
    assert all(len(c) == 12 for c in runs["drop-stragglers"][0]["cohorts"])


def test_bandwidth_limited_tiny_run_goes_through_the_harness(tmp_path, monkeypatch):
    calls = _calls(monkeypatch)
    result = bandwidth_limited.main(["--quick", "--out", str(tmp_path / "bw.json")])
    assert sorted(calls) == ["coded", "coded", "coded", "deadline"]
    rows = {r["scheme"]: r for r in result["table"]}
    assert set(rows) == set(bandwidth_limited.SCHEMES)
    assert rows["uncoded"]["bytes_vs_uncoded"] == 1.0
    assert rows["comm-efficient"]["bytes_vs_uncoded"] < 1.0  # replies of 1/m of the model


def test_latency_vs_s_tiny_run_goes_through_the_harness(tmp_path, monkeypatch):
    calls = _calls(monkeypatch)
    result = latency_vs_s.main(["--quick", "--n", "6", "--out", str(tmp_path / "lat")])
    assert result["s_measured"] == [0, 3, 5]
    assert calls == ["coded"] * (len(latency_vs_s.MODELS) * 3)  # one seed per s and model
    for entry in result["models"].values():
        assert set(entry["measured"]) == {0, 3, 5}


@pytest.mark.parametrize("method", ["coded", "wait-for-all", "deadline", "first-k", "fedbuff"])
def test_measured_once_charges_the_strategy_what_the_runs_record_charges(method):
    """``virtual-compute=measured-once`` given to the harness directly (not through compare's
    charge_once): the strategy charges one measured cost per partition update, and the merged
    run config the run's client_compute_s reads states that same cost, not the key's default
    partition-cost-s beside a measurement."""
    from fl_gradcode.config import DEFAULTS

    run_config = {"virtual-compute": "measured-once", "num-rounds": 1}
    if method == "coded":
        strategy, _, cfg = rival_runs.coded_strategy(run_config, 4)
        charged = strategy.options.timing.compute_cost_s
    else:
        strategy, _, cfg, _ = rival_runs.rival_strategy(
            method, run_config, 4, **({"buffer_size": 2} if method == "fedbuff" else {}))
        charged = strategy.compute_cost_s
    assert cfg["virtual-compute"] == "none"
    assert charged == cfg["partition-cost-s"] != DEFAULTS["partition-cost-s"]
    assert 0 < charged < 1.0
