"""Communication-efficient gradient coding through the plug-in: replies 1/m of the model."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg

from fl_gradcode.flower import GradientCoding, gradient_coding_mod
from fl_gradcode.flower.testing import InProcessGrid
from fl_gradcode.latency import Pareto
from tests.flower.harness import SamplingRecorder

SHAPES = {"w": (30, 20), "b": (21,)}  # 621 values: m never divides it (padding exercised)


def target(pid: int, name: str) -> np.ndarray:
    return np.random.default_rng([5, pid, len(name)]).standard_normal(SHAPES[name])


def train(msg: Message, context) -> Message:
    pid = int(context.node_config["partition-id"])
    new = {}
    for name in SHAPES:
        theta = msg.content["arrays"][name].numpy()
        new[name] = Array((theta - 0.3 * (theta - target(pid, name))).astype(np.float32))
    return Message(RecordDict({"arrays": ArrayRecord(new),
                               "metrics": MetricRecord({"num-examples": 7 + 2 * pid})}),
                   reply_to=msg)


def oracle(rounds: int, n: int) -> dict[str, np.ndarray]:
    theta = {name: np.zeros(shape) for name, shape in SHAPES.items()}
    sizes = np.array([7 + 2 * j for j in range(n)], dtype=float)
    for _ in range(rounds):
        theta = {
            name: sum(sizes[j] * (t - 0.3 * (t - target(j, name))) for j in range(n))
            / sizes.sum()
            for name, t in theta.items()
        }
    return theta


def run(code: str, s: int, n: int = 6, m: int | None = None, rounds: int = 3,
        fraction_train: float = 1.0):
    app = ClientApp(mods=[gradient_coding_mod])
    app.train()(train)
    inner = FedAvg(fraction_train=fraction_train, fraction_evaluate=0.0, min_available_nodes=n)
    strategy = GradientCoding(inner, code=code, s=s, m=m, latency=Pareto(1.0, 1.5), seed=1)
    initial = ArrayRecord({k: Array(np.zeros(v, np.float32)) for k, v in SHAPES.items()})
    result = strategy.start(grid=InProcessGrid(app, n), initial_arrays=initial,
                            num_rounds=rounds, train_config=ConfigRecord({}))
    return strategy, {k: result.arrays[k].numpy() for k in SHAPES}


@pytest.mark.parametrize(("n", "s", "m"), [(6, 1, 2), (8, 1, 3), (6, 0, 3)])
def test_comm_efficient_decodes_the_example_weighted_average(n, s, m):
    strategy, theta = run("comm-efficient", s, n=n, m=m)
    expected = oracle(3, n)
    assert all(r["decode"] == "exact" for r in strategy.history)
    for name in SHAPES:
        err = np.linalg.norm(theta[name] - expected[name]) / np.linalg.norm(expected[name])
        assert err <= 1e-5


def test_comm_efficient_replies_are_one_mth_of_the_model():
    coded, _ = run("comm-efficient", 1, n=6, m=2, rounds=1)
    plain, _ = run("uncoded", 0, n=6, rounds=1)
    per_reply_coded = coded.history[0]["bytes_up"] / 6
    per_reply_plain = plain.history[0]["bytes_up"] / 6
    # 622 values / 2 in float32 vs 621 float32 values (+ .npy headers)
    assert per_reply_coded / per_reply_plain == pytest.approx(0.5, abs=0.08)


def test_with_every_node_a_code_with_fewer_partitions_trains_on_the_apps_data_split_k_ways(
        caplog):
    """n = 7, s = 1, m = 2: groups of s + m = 3 give k = 6 partitions. The round is FedAvg
    over the app's data split into 6 partitions (partition-id j of 6), and a WARNING says so."""
    import logging

    with caplog.at_level(logging.WARNING, logger="flwr"):
        strategy, theta = run("comm-efficient", 1, n=7, m=2)
    expected = oracle(3, 6)
    assert all(r["decode"] == "exact" for r in strategy.history)
    for name in SHAPES:
        err = np.linalg.norm(theta[name] - expected[name]) / np.linalg.norm(expected[name])
        assert err <= 1e-5
    assert any("k=6 partitions for 7 clients" in r.getMessage() for r in caplog.records)


def test_a_sampled_cohort_with_fewer_code_partitions_than_members_gets_an_exact_code(caplog):
    """8 nodes, FedAvg samples 4 a round; comm-efficient s = 1, m = 2 has k = 3 partitions
    for 4 members: split 3 ways, the app's data would be all 8 nodes' data, not the
    cohort's. The rounds run grouped-rs with s = 1 instead (a WARNING says so), and each is
    FedAvg over the sampled nodes' own partitions."""
    import logging
    import random

    random.seed(3)
    app = ClientApp(mods=[gradient_coding_mod])
    app.train()(train)
    inner = SamplingRecorder(fraction_train=0.5, fraction_evaluate=0.0, min_available_nodes=8)
    strategy = GradientCoding(inner, code="comm-efficient", s=1, m=2,
                              latency=Pareto(1.0, 1.5), seed=1)
    grid = InProcessGrid(app, 8)
    initial = ArrayRecord({k: Array(np.zeros(v, np.float32)) for k, v in SHAPES.items()})
    with caplog.at_level(logging.WARNING, logger="flwr"):
        result = strategy.start(grid=grid, initial_arrays=initial, num_rounds=3,
                                train_config=ConfigRecord({}))
    assert [r["decode"] for r in strategy.history] == ["exact"] * 3
    assert any("k=3 partitions for a sampled cohort of 4" in r.getMessage()
               and "using grouped-rs with s=1" in r.getMessage() for r in caplog.records)
    theta = {name: np.zeros(shape) for name, shape in SHAPES.items()}
    for nodes in inner.sampled:  # numpy FedAvg over the sampled partitions
        parts = [grid.index[node] for node in nodes]
        sizes = np.array([7 + 2 * j for j in parts], dtype=float)
        theta = {name: sum(sz * (th - 0.3 * (th - target(j, name)))
                           for j, sz in zip(parts, sizes, strict=True)) / sizes.sum()
                 for name, th in theta.items()}
    assert len(inner.sampled) == 3
    for name in SHAPES:
        got = result.arrays[name].numpy()
        assert np.linalg.norm(got - theta[name]) <= 1e-5 * np.linalg.norm(theta[name])


def test_a_sampled_cohort_whose_code_has_one_partition_per_member_runs():
    """The same sampling with s + m = 4 dividing the cohort: every round exact."""
    strategy, _ = run("comm-efficient", 1, n=8, m=3, fraction_train=0.5)
    assert [r["decode"] for r in strategy.history] == ["exact"] * 3
