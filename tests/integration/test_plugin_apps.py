"""The plug-in on apps shaped like Flower's own examples (``tests/apps``), run in-process.

``gradient_coding_mod`` on the client and ``GradientCoding`` around FedAvg / FedAdam on the
server, with Pareto stragglers in virtual time: the coded run must give the same model as the
uncoded run with the same seeds (quickstart app and Opacus DP-SGD app), and the FedAvg round
must equal an oracle computed here by calling the plain app's handler per partition. One
``simulation`` test runs ``examples/quickstart-pytorch-coded`` with the real ``flwr run``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.serverapp.strategy import FedAdam, FedAvg

from fl_gradcode.flower import GradientCoding
from fl_gradcode.flower.testing import InProcessGrid
from fl_gradcode.latency import Pareto
from tests.apps import opacus_app
from tests.apps import quickstart_pytorch_app as qs

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "quickstart-pytorch-coded"
NUM_NODES = 6
LR = 0.1
QS_RUN_CONFIG = {"batch-size": 16, "local-epochs": 1}
DP_RUN_CONFIG = {"target-delta": 1e-5, "max-grad-norm": 1.0}

pytestmark = [
    # expected here: the seeds are public on purpose (coded and uncoded runs must coincide)
    pytest.mark.filterwarnings("ignore:gradient_coding_mod. no partition key:UserWarning"),
    pytest.mark.filterwarnings("ignore:Secure RNG turned off:UserWarning"),
    pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning"),
    # tiny models: one thread is faster, and immune to OpenMP spinning on a busy 2-core machine
    pytest.mark.usefixtures("one_torch_thread"),
]


def flat(arrays) -> np.ndarray:
    return np.concatenate([a.astype(np.float64).ravel() for a in arrays.to_numpy_ndarrays()])


def run_coded(app_module, strategy, out: Path, *, code: str, s: int, run_config, num_rounds=3):
    """``GradientCoding(strategy)`` on ``NUM_NODES`` in-process nodes running ``app_module.app``."""
    grid = InProcessGrid(app_module.app, num_nodes=NUM_NODES, run_config=run_config)
    wrapper = GradientCoding(
        strategy,
        code=code,
        s=s,
        timing="virtual",
        latency=Pareto(scale=1.0, shape=1.5),
        seed=0,
        results_dir=str(out),
    )
    result = wrapper.start(
        grid=grid,
        initial_arrays=app_module.initial_arrays(),
        num_rounds=num_rounds,
        train_config=ConfigRecord({"lr": LR}),
        evaluate_fn=app_module.global_evaluate,
    )
    rounds = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
    return result, rounds


CASES = {
    "fedavg-quickstart": (qs, lambda: FedAvg(fraction_evaluate=0.0), "grouped-rs", QS_RUN_CONFIG),
    "fedadam-quickstart": (qs, lambda: FedAdam(fraction_evaluate=0.0), "frc", QS_RUN_CONFIG),
    "fedavg-opacus": (
        opacus_app,
        lambda: FedAvg(fraction_evaluate=0.0),
        "grouped-rs",
        DP_RUN_CONFIG,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_coded_run_with_stragglers_equals_uncoded_run(tmp_path, case):
    app_module, make_strategy, code, run_config = CASES[case]
    coded, coded_rounds = run_coded(
        app_module, make_strategy(), tmp_path / "coded", code=code, s=2, run_config=run_config
    )
    uncoded, uncoded_rounds = run_coded(
        app_module, make_strategy(), tmp_path / "uncoded", code="uncoded", s=0,
        run_config=run_config,
    )
    assert [r["decode"] for r in coded_rounds] == ["exact"] * 3
    assert [r["decode"] for r in uncoded_rounds] == ["exact"] * 3
    assert all(len(r["clients_used"]) == NUM_NODES for r in uncoded_rounds)
    # the Pareto tail leaves some replies out of every coded decoding (FRC: one per group)
    assert all(len(r["stragglers"]) >= 1 for r in coded_rounds), coded_rounds
    assert sum(len(r["stragglers"]) for r in coded_rounds) >= 3

    initial = flat(app_module.initial_arrays())
    a, b = flat(coded.arrays), flat(uncoded.arrays)
    assert np.all(np.isfinite(a))
    assert np.linalg.norm(a - b) / np.linalg.norm(b) <= 1e-5
    # ... and relative to how far training moved the model, so the check is not vacuous
    moved = np.linalg.norm(b - initial)
    assert moved / np.linalg.norm(initial) > 1e-2
    assert np.linalg.norm(a - b) / moved <= 1e-4
    if app_module is opacus_app:  # the apps' metrics are decoded too (example-weighted)
        for r in (1, 2, 3):
            eps_coded = coded.train_metrics_clientapp[r]["epsilon"]
            assert eps_coded == pytest.approx(uncoded.train_metrics_clientapp[r]["epsilon"])
            assert 1.0 < eps_coded < 10.0


def _oracle_round(initial, lr: float) -> np.ndarray:
    """FedAvg of one round computed without the plug-in: the plain app's own train handler,
    called once per partition j as partition j's node would call it, averaged by example count.
    (With ``SHUFFLE = False`` local training draws no random numbers, so seeding is moot.)"""
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, SUPERLINK_NODE_ID
    total, count = 0.0, 0.0
    for j in range(NUM_NODES):
        msg = Message(
            RecordDict({"arrays": initial, "config": ConfigRecord({"lr": lr})}),
            dst_node_id=100 + j,
            message_type=MessageType.TRAIN,
        )
        msg.metadata.__dict__["_message_id"] = f"oracle-{j}"
        context = Context(
            run_id=1,
            node_id=100 + j,
            node_config={"partition-id": j, "num-partitions": NUM_NODES},
            state=RecordDict(),
            run_config=dict(QS_RUN_CONFIG),
        )
        reply = qs.app_plain(msg, context)
        n_j = float(reply.content["metrics"]["num-examples"])
        total = total + n_j * flat(reply.content["arrays"])
        count += n_j
    return total / count


@pytest.mark.parametrize("code", ["grouped-rs", "frc"])
def test_coded_fedavg_round_equals_independent_oracle(tmp_path, monkeypatch, code):
    monkeypatch.setattr(qs, "SHUFFLE", False)
    initial = qs.initial_arrays()
    expected = _oracle_round(initial, LR)
    result, rounds = run_coded(
        qs, FedAvg(fraction_evaluate=0.0), tmp_path / code, code=code, s=2,
        run_config=QS_RUN_CONFIG, num_rounds=1,
    )
    assert rounds[0]["decode"] == "exact" and len(rounds[0]["stragglers"]) >= 1
    got = flat(result.arrays)
    moved = np.linalg.norm(expected - flat(initial))
    assert moved > 0
    assert np.linalg.norm(got - expected) / np.linalg.norm(expected) <= 1e-5
    assert np.linalg.norm(got - expected) / moved <= 1e-4


def test_coded_quickstart_learns_and_federated_evaluation_passes_through(tmp_path):
    result, rounds = run_coded(
        qs, FedAvg(fraction_evaluate=1.0), tmp_path / "learn", code="grouped-rs", s=2,
        run_config=QS_RUN_CONFIG,
    )
    accuracy = [result.evaluate_metrics_serverapp[r]["accuracy"] for r in range(4)]
    assert accuracy[0] < 0.2  # chance level at the start
    assert accuracy[3] > 0.4, accuracy
    assert [r["accuracy"] for r in rounds] == pytest.approx(accuracy[1:])
    # evaluate messages reach the app's own evaluate handler, untouched by the mod
    assert set(result.evaluate_metrics_clientapp) == {1, 2, 3}
    assert 0.0 <= result.evaluate_metrics_clientapp[3]["eval_acc"] <= 1.0
    # the app's train metrics are decoded too
    assert all(result.train_metrics_clientapp[r]["train_loss"] > 0 for r in (1, 2, 3))


def test_example_app_in_process(tmp_path, monkeypatch):
    """The example's own ServerApp main and ClientApp, on the in-process grid (no Ray)."""
    import tomllib

    monkeypatch.syspath_prepend(str(EXAMPLE))
    monkeypatch.chdir(tmp_path)  # the quickstart saves final_model.pt in the working directory
    from quickstart_coded import client_app, server_app

    pyproject = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())
    run_config = {
        **pyproject["tool"]["flwr"]["app"]["config"],
        "num-server-rounds": 2,
        "results-dir": str(tmp_path / "results"),
    }
    grid = InProcessGrid(client_app.app, num_nodes=NUM_NODES, run_config=run_config)
    context = Context(
        run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config
    )
    server_app.main(grid, context)
    rows = [json.loads(line) for line in (tmp_path / "results" / "rounds.jsonl").read_text()
            .splitlines()]
    assert [row["decode"] for row in rows] == ["exact", "exact"]
    assert all(len(row["stragglers"]) >= 1 for row in rows)
    assert rows[-1]["accuracy"] > 0.2
    assert (tmp_path / "final_model.pt").exists()


@pytest.mark.simulation
def test_example_app_runs_with_flwr_run(tmp_path):
    from tests.integration.flwr_local import flwr_executable, flwr_run

    if flwr_executable() is None:
        pytest.skip("the flwr CLI is not installed")
    results = tmp_path / "results"
    proc = flwr_run(
        EXAMPLE,
        home=tmp_path / "flwr-home",
        num_supernodes=6,
        run_config=f"num-server-rounds=2 results-dir='{results}'",
        cwd=tmp_path,
    )
    log = proc.stdout[-4000:]
    assert proc.returncode == 0, log
    rows = [json.loads(line) for line in (results / "rounds.jsonl").read_text().splitlines()]
    assert len(rows) == 2, log
    assert all("decode" in row for row in rows)
    assert rows[0]["decode"] == "exact", rows
    # virtual arrivals include the measured compute time, which under Ray (cold actors, first
    # data load) is large and noisy: a round-2 cohort thinned by still-busy nodes may have to
    # decode approximately at the straggler deadline
    assert rows[1]["decode"] in ("exact", "approx"), rows


def test_importing_the_mod_does_not_import_the_server_side():
    # Flower starts one ClientApp process per message: the mod's import is paid every time
    import subprocess
    import sys

    code = ("import sys; from fl_gradcode.flower import gradient_coding_mod; "
            "print(sorted(m for m in ('fl_gradcode.flower.wrapper', 'fl_gradcode.codes', "
            "'scipy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"


def _max_epsilon(records, weighting_key):
    """The Opacus example's kind of metric aggregation: the largest epsilon of any reply."""
    from flwr.app import MetricRecord

    return MetricRecord({"epsilon": max(float(next(iter(r.metric_records.values()))["epsilon"])
                                        for r in records)})


def test_opacus_max_epsilon_aggregator_sees_each_partitions_epsilon(tmp_path):
    """A max over the replies' epsilon (not a mean) stays a max over the partitions: the coded
    run (grouped-rs, s=2, stragglers) reports what Flower's own FedAvg reports on the plain
    app (no mod, no code), where each reply is one partition."""
    coded, rounds = run_coded(
        opacus_app, FedAvg(fraction_evaluate=0.0, train_metrics_aggr_fn=_max_epsilon),
        tmp_path / "coded", code="grouped-rs", s=2, run_config=DP_RUN_CONFIG, num_rounds=1)
    assert rounds[0]["decode"] == "exact" and rounds[0]["stragglers"]
    grid = InProcessGrid(opacus_app.app_plain, num_nodes=NUM_NODES, run_config=DP_RUN_CONFIG)
    flower = FedAvg(fraction_evaluate=0.0, train_metrics_aggr_fn=_max_epsilon).start(
        grid=grid, initial_arrays=opacus_app.initial_arrays(), num_rounds=1,
        train_config=ConfigRecord({"lr": LR}))
    expected = flower.train_metrics_clientapp[1]["epsilon"]
    assert coded.train_metrics_clientapp[1]["epsilon"] == pytest.approx(expected, rel=1e-9)


def _dead(msg: Message, context: Context, call_next) -> Message:
    """An OUTER client mod: the node's app fails every message, from the first one (the
    gradient-coding handshake included)."""
    raise RuntimeError("this node's app fails every message")


@pytest.mark.parametrize("make_strategy", [lambda: FedAvg(fraction_evaluate=0.0),
                                           lambda: FedAdam(fraction_evaluate=0.0)],
                         ids=["fedavg", "fedadam"])
def test_two_nodes_dead_from_the_first_message_leave_no_partition_out(tmp_path, make_strategy):
    """Flower's quickstart shape, 6 nodes, grouped-rs s=2: two nodes whose app fails every
    message from the first one never pass the handshake. s=2 is there to make two dead nodes
    harmless: their partitions are computed by their replicas, every round is exact, and the
    model equals the uncoded run over all six nodes (which has no dead node)."""
    from flwr.clientapp import ClientApp

    dead_app = ClientApp(mods=[_dead])
    apps = [dead_app if i in (0, 3) else qs.app for i in range(NUM_NODES)]
    results = {}
    for name, code, s, node_apps in [("coded", "grouped-rs", 2, apps),
                                     ("uncoded", "uncoded", 0, None)]:
        grid = InProcessGrid(None if node_apps else qs.app, num_nodes=NUM_NODES,
                             run_config=QS_RUN_CONFIG, **({"apps": node_apps} if node_apps
                                                          else {}))
        out = tmp_path / name
        wrapper = GradientCoding(make_strategy(), code=code, s=s, timing="virtual", seed=0,
                                 results_dir=str(out), warmup_timeout=5.0)
        results[name] = wrapper.start(grid=grid, initial_arrays=qs.initial_arrays(),
                                      num_rounds=3, train_config=ConfigRecord({"lr": LR}))
        results[name + "-rows"] = [json.loads(line) for line in
                                   (out / "rounds.jsonl").read_text().splitlines()]
    assert [r["decode"] for r in results["coded-rows"]] == ["exact"] * 3
    assert all(r["missing_partitions"] == [] for r in results["coded-rows"])
    a, b = flat(results["coded"].arrays), flat(results["uncoded"].arrays)
    initial = flat(qs.initial_arrays())
    assert np.linalg.norm(b - initial) / np.linalg.norm(initial) > 1e-2  # training moved it
    assert np.linalg.norm(a - b) / np.linalg.norm(b) <= 1e-5
