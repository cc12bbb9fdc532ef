"""Flower's deployment engine on localhost: a SuperLink, three SuperNodes, one of them slow."""

from __future__ import annotations

import pytest

from fl_gradcode.results import read_rounds

pytestmark = pytest.mark.deployment


def test_rounds_complete_without_the_slow_supernode(tmp_path):
    from server.deploy_local import run

    results = tmp_path / "results"
    code = run(
        3,
        f"num-rounds=2 s=1 timing='wallclock' latency='none' straggler-timeout=60.0 "
        f"results-dir='{results}'",
        slow_node=2,
        slow_delay=300.0,
        workdir=tmp_path / "deploy",
        timeout=400,
        compare=False,  # plain FedAvg would wait the slow node's 300 s every round
    )
    assert code == 0
    rounds = read_rounds(results)
    assert [r["round"] for r in rounds] == [1, 2]
    assert all(r["decode"] == "exact" for r in rounds), rounds
    assert all(2 not in r["clients_used"] for r in rounds)
    # far below the slow node's 300 s: the rounds ended at the first decodable set
    assert all(r["wall_s"] < 60 for r in rounds)


def test_deploy_local_compares_its_rounds_with_plain_fedavg_on_the_same_nodes(tmp_path):
    """No slow node: the coded run, then plain Flower FedAvg (rival='fedavg') on the same
    SuperNodes; the saved report holds both runs' per-round wall times and their ratio."""
    import json
    import statistics

    from server.deploy_local import run

    results = tmp_path / "results"
    code = run(2, f"num-rounds=3 s=1 timing='wallclock' latency='none' "
               f"straggler-timeout=60.0 results-dir='{results}'",
               workdir=tmp_path / "deploy", timeout=400)
    assert code == 0
    coded, fedavg = read_rounds(results), read_rounds(tmp_path / "results-fedavg")
    assert len(coded) == len(fedavg) == 3
    report = json.loads((results / "overhead_vs_fedavg.json").read_text())
    assert report["coded_wall_s"] == [r["wall_s"] for r in coded]
    assert report["fedavg_wall_s"] == [r["wall_s"] for r in fedavg]
    ratio = (statistics.median(r["wall_s"] for r in coded[1:])
             / statistics.median(r["wall_s"] for r in fedavg[1:]))
    assert report["overhead_ratio"] == ratio
    config = json.loads((tmp_path / "results-fedavg" / "config.json").read_text())
    assert config["rival"] == "fedavg"
