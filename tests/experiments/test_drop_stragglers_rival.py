"""The drop-stragglers rival (Flower's FedAvg with a round deadline) in the experiments that
report time to accuracy: it runs on a small setting, on the coded runs' seed and draws, with
the documented deadline, and merges into an existing result file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from experiments import bandwidth_limited, common, sampled_cohorts, time_to_accuracy

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.filterwarnings("ignore:gradient_coding_mod. no partition key")


def test_the_rival_deadline_is_the_slack_times_the_75th_percentile_at_load_1():
    from fl_gradcode.latency import client_times, make_latency

    latency = time_to_accuracy.LATENCIES["bimodal"]
    model = make_latency("bimodal", seed=3, scale=0.1, rate=10.0, p=0.1, slowdown=20.0)
    times = client_times(model, 256, 1, partition_cost=0.1, samples=200,
                         rng=np.random.default_rng(3))
    expected = 3.0 * float(np.quantile(times, 0.75))
    assert common.rival_deadline(latency, 3, 0.1) == pytest.approx(expected)
    # the approximate scheme's deadline is the same function at load s+1, unchanged
    assert time_to_accuracy.deadline(latency, 4, 3) == pytest.approx(
        common.quantile_deadline(latency, 4, 3, 0.1))


def test_time_to_accuracy_rival_runs_with_its_deadline_and_refuses_dp():
    run = time_to_accuracy.one_run(4, 1, "drop-stragglers", "pareto", False, 0, 2, "dirichlet")
    assert len(run["accuracy"]) == 2 and run["epsilon"] is None
    assert set(run["decode"]) <= {"exact", "approximate", "skipped"}
    assert run["deadline_s"] == pytest.approx(common.rival_deadline(
        time_to_accuracy.LATENCIES["pareto"], 0, time_to_accuracy.BASE["partition-cost-s"]))
    assert len(run["late_dropped"]) == 2
    with pytest.raises(ValueError, match="plain Flower FedAvg"):
        time_to_accuracy.rival_run(4, "drop-stragglers", "pareto", True, 0, 2, "dirichlet")


def test_time_to_accuracy_runs_no_rival_with_dp(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(time_to_accuracy, "_results", lambda jobs, rounds, workers: seen.extend(
        jobs) or iter(()))
    monkeypatch.setattr(time_to_accuracy, "_write", lambda *a, **k: {})
    time_to_accuracy.main(["--quick", "--schemes", "drop-stragglers,uncoded", "--out",
                           str(tmp_path / "t")])
    rivals = [setup for setup, scheme, _ in seen if scheme == "drop-stragglers"]
    assert rivals and not any(setup[4] for setup in rivals)  # no +DP setup
    assert any(setup[4] for setup, scheme, _ in seen if scheme == "uncoded")


def test_sampled_cohorts_rival_merges_into_the_existing_file(tmp_path, monkeypatch):
    out = tmp_path / "sc"
    earlier = {"persistent": {"uncoded": [{"virtual_s": [1.0, 2.0], "round_s": [1.0, 1.0],
                                           "accuracy": [0.5, 0.95], "decode": ["exact"] * 2,
                                           "s": [0, 0], "excluded": [0, 0]}]}}
    out.with_suffix(".json").write_text(json.dumps(
        {"seeds": [0], "rounds": 6, "quick": True, "runs": earlier}))
    rival = {"virtual_s": [0.5, 1.0], "round_s": [0.5, 0.5], "accuracy": [0.6, 0.9],
             "decode": ["exact", "approximate"], "s": [0, 0], "excluded": [0, 0]}
    monkeypatch.setattr(sampled_cohorts, "_results", lambda jobs, rounds, workers: [
        (job, rival) for job in jobs])
    result = sampled_cohorts.main(["--quick", "--schemes", "drop-stragglers", "--out",
                                   str(out)])
    assert list(result["runs"]["persistent"]) == ["uncoded", "drop-stragglers"]
    row = result["table"]["persistent"]["drop-stragglers"]
    assert row["time_to_target_mean"] == 1.0  # 0.9 reached at 1.0 s
    assert row["speedup_vs_uncoded"] == pytest.approx(2.0)  # uncoded: 0.95 at 2.0 s
    with pytest.raises(ValueError, match="seeds"):
        sampled_cohorts.main(["--quick", "--seeds", "2", "--schemes", "drop-stragglers",
                              "--out", str(out)])


def test_sampled_cohorts_rival_samples_the_coded_runs_cohorts():
    run = sampled_cohorts.one_run("drop-stragglers", "pareto", 0, 2)
    uncoded = sampled_cohorts.one_run("uncoded", "pareto", 0, 2)
    assert len(run["cohorts"]) == 2 and all(len(c) == 12 for c in run["cohorts"])
    assert run["deadline_s"] == pytest.approx(common.rival_deadline(
        sampled_cohorts.LATENCIES["pareto"], 0, sampled_cohorts.BASE["partition-cost-s"]))
    assert run["nodes_seen"] == len({p for c in run["cohorts"] for p in c})
    assert uncoded["nodes_seen"] == run["nodes_seen"]


def test_bandwidth_limited_rival_runs_on_the_same_draws():
    run = bandwidth_limited.run_one("drop-stragglers", 0.5, 0, 2, bandwidth_limited.model_size())
    uncoded = bandwidth_limited.run_one("uncoded", 0.5, 0, 2, bandwidth_limited.model_size())
    assert len(run["accuracy"]) == len(run["late_dropped"]) == 2
    # the deadline: the rule at the run's latency, plus one model's upload time
    from fl_gradcode.config import DEFAULTS

    latency = {"latency": "pareto", "latency-scale": DEFAULTS["latency-scale"],
               "latency-shape": DEFAULTS["latency-shape"]}
    assert run["deadline_s"] == pytest.approx(
        common.rival_deadline(latency, 0, bandwidth_limited.COST_S) + 0.5)
    # every client uploads one full model (the wrapper's uncoded replies carry a little more)
    assert run["bytes_up"][0] == bandwidth_limited.N * bandwidth_limited.model_size()
    assert uncoded["bytes_up"][0] >= run["bytes_up"][0]
    assert run["virtual_s"][0] <= run["deadline_s"] + 1e-9
