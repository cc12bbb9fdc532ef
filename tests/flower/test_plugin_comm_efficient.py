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


def run(code: str, s: int, n: int = 6, m: int | None = None, rounds: int = 3):
    app = ClientApp(mods=[gradient_coding_mod])
    app.train()(train)
    strategy = GradientCoding(FedAvg(fraction_evaluate=0.0, min_available_nodes=n), code=code,
                              s=s, m=m, latency=Pareto(1.0, 1.5), seed=1)
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
