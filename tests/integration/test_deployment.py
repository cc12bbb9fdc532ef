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
    )
    assert code == 0
    rounds = read_rounds(results)
    assert [r["round"] for r in rounds] == [1, 2]
    assert all(r["decode"] == "exact" for r in rounds), rounds
    assert all(2 not in r["clients_used"] for r in rounds)
    # far below the slow node's 300 s: the rounds ended at the first decodable set
    assert all(r["wall_s"] < 60 for r in rounds)
