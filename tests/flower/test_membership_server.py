"""Membership through the project's own entry points: ``server.app``'s ServerApp carries on
when a SuperNode dies (once Flower stops listing it), and the launchers
(``server.deploy_local``, ``server.launch``) exit non-zero when the ServerApp failed, run on a
fake Flower CLI.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from fl_gradcode.flower.testing import InProcessGrid
from tests.apps.numpy_app import pytestmark  # noqa: F401 (the warning filter applies here)


# ================================================================== the project's ServerApp
def test_server_app_carries_on_when_a_supernode_dies_instead_of_waiting_for_it(monkeypatch,
                                                                              tmp_path):
    """server.app's job on 6 in-process nodes (frc, s=1); node 5 leaves the grid's node list
    after round 2 (a killed SuperNode once Flower stops listing it). Flower's sampling must
    not wait for it (its wait loop sleeps: a sleep here fails the test instead of hanging);
    rounds 3-4 keep the federation's six partitions, node 5's computed by its replica."""
    from flwr.serverapp.strategy import strategy_utils

    import fl_gradcode.flower.testing as testing
    from server.app import run_in_process

    def stalled(seconds):
        raise AssertionError("Flower is waiting for nodes to connect")

    monkeypatch.setattr(strategy_utils, "sleep", stalled)

    class DyingGrid(InProcessGrid):
        last_round = 0

        def push_messages(self, messages):
            messages = list(messages)
            for msg in messages:
                if msg.metadata.group_id.isdigit():
                    self.last_round = max(self.last_round, int(msg.metadata.group_id))
            return super().push_messages(messages)

        def get_node_ids(self):
            nodes = super().get_node_ids()
            return nodes[:-1] if self.last_round >= 2 else nodes

    monkeypatch.setattr(testing, "InProcessGrid", DyingGrid)
    strategy, theta = run_in_process(
        {"code": "frc", "s": 1, "num-rounds": 4, "latency": "none", "virtual-compute": "none",
         "results-dir": str(tmp_path)}, 6)
    rows = strategy.history
    assert [r["decode"] for r in rows] == ["exact"] * 4
    assert [len(r["clients_used"]) + len(r["stragglers"]) for r in rows] == [6, 6, 6, 6]
    assert [r["missing_partitions"] for r in rows] == [[]] * 4
    assert np.all(np.isfinite(theta))


# ================================================================== launchers' exit codes
FAKE_FLWR = '''#!{python}
"""A stand-in for Flower's CLI: `run` streams a log and exits {run_rc} whatever the ServerApp
did (as flwr run --stream does); `ls` reports the run's status as flwr ls --format json."""
import json, sys
with open({calls!r}, "a") as fh:
    fh.write(json.dumps(sys.argv[1:]) + "\\n")
if sys.argv[1] == "run":
    print("Successfully started run 4242")
    print("ERROR :   ServerApp raised an exception")
    sys.exit({run_rc})
if sys.argv[1] == "ls":
    print("Displaying information for run ID 4242...")
    print(json.dumps({{"success": True, "runs": [{{"run-id": "4242", "status": {status!r},
                      "status-details": "ServerApp failed with exception: boom"}}]}}))
'''


FAKE_DAEMON = '''#!{python}
import time
time.sleep(60)
'''


def fake_flower(tmp_path, monkeypatch, status: str, run_rc: int = 0):
    """Fake ``flwr``, ``flower-superlink`` and ``flower-supernode`` next to a fake
    ``sys.executable`` (where both launchers look for Flower's binaries)."""
    import stat
    import sys

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.jsonl"
    scripts = {"flwr": FAKE_FLWR.format(python=sys.executable, calls=str(calls),
                                        status=status, run_rc=run_rc),
               "flower-superlink": FAKE_DAEMON.format(python=sys.executable),
               "flower-supernode": FAKE_DAEMON.format(python=sys.executable)}
    for name, text in scripts.items():
        path = bin_dir / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python"))
    monkeypatch.setenv("FL_GRADCODE_DP_KEY_FILE", str(tmp_path / "unused-keys.json"))
    return calls


def test_deploy_local_fails_when_the_runs_left_no_rounds_to_compare(tmp_path, monkeypatch):
    """Both runs completed (as the fake SuperLink says) but wrote no rounds.jsonl: exit 1 with
    the reason, not a traceback."""
    from server import deploy_local

    calls = fake_flower(tmp_path, monkeypatch, "finished:completed", 0)
    monkeypatch.setattr(deploy_local, "wait_for_port", lambda port, timeout=60.0: None)
    assert deploy_local.run(2, "num-rounds=1", workdir=tmp_path / "work", timeout=60) == 1
    runs = [c for c in _calls(calls) if c[0] == "run"]
    assert len(runs) == 2 and "rival='fedavg'" in runs[1][runs[1].index("--run-config") + 1]


def _calls(path) -> list[list[str]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize(("status", "run_rc", "expected"), [
    ("finished:failed", 0, 1),  # the ServerApp raised: flwr run still exits 0
    ("finished:stopped", 0, 1),
    ("finished:completed", 0, 0),
    ("finished:completed", 3, 3),  # flwr run's own failure is returned as is
])
def test_deploy_local_exits_non_zero_when_the_server_app_failed(tmp_path, monkeypatch, status,
                                                                run_rc, expected):
    from server import deploy_local

    calls = fake_flower(tmp_path, monkeypatch, status, run_rc)
    monkeypatch.setattr(deploy_local, "wait_for_port", lambda port, timeout=60.0: None)
    # the coded run's exit code (the FedAvg comparison after it: --no-compare)
    code = deploy_local.run(2, "num-rounds=1", workdir=tmp_path / "work", timeout=60,
                            compare=False)
    assert code == expected
    if run_rc == 0:  # the status is read from the deployment's SuperLink connection
        assert _calls(calls)[-1] == ["ls", "deploy", "--run-id", "4242", "--format", "json"]


@pytest.mark.parametrize(("status", "expected"), [("finished:failed", 1),
                                                  ("finished:completed", 0)])
def test_launch_exits_non_zero_when_the_server_app_failed(tmp_path, monkeypatch, status,
                                                          expected):
    from server import launch

    calls = fake_flower(tmp_path, monkeypatch, status)
    code = launch.main(["--no-compare", "--home", str(tmp_path / "home"),
                        "--results-dir", str(tmp_path / "results")])
    assert code == expected
    assert _calls(calls)[-1] == ["ls", "--run-id", "4242", "--format", "json"]
