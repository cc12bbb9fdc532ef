"""The small numpy app and its FedAvg oracle (tests only).

The app is a tiny deterministic numpy "trainer": partition ``j`` moves the model toward its own
target, ``theta_j = theta - lr * (theta - target_j)``, and trains on ``10 + j`` examples, so
FedAvg's example-weighted average ``sum_j n_j theta_j / sum_j n_j`` is computed here by calling
the app's train handler once per partition (no mod, no code, no seeding involved).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pytest
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp

from fl_gradcode.flower.protocol import PROTOCOL_KEY

META_KEY = PROTOCOL_KEY + "-meta"
LR = 0.3
SHAPES = {"w": (3,), "b": (2, 2)}

pytestmark = [
    # the app draws no random numbers: the public-seed warning is irrelevant here
    pytest.mark.filterwarnings("ignore:gradient_coding_mod. no partition key:UserWarning"),
]



# =============================================================================== the tiny app
def target(partition: int, name: str) -> np.ndarray:
    """Partition ``j``'s optimum: differs per partition, non-linearly in ``j``."""
    size = int(np.prod(SHAPES[name]))
    base = np.linspace(-1.0, 2.0, size).reshape(SHAPES[name])
    return (partition + 1) * base + 0.25 * partition**2 + (1.0 if name == "b" else 0.0)


def num_examples(partition: int) -> int:
    return 10 + partition


def train(msg: Message, context: Context) -> Message:
    pid = int(context.node_config["partition-id"])
    lr = float(msg.content["config"]["lr"])
    new, loss = {}, 0.0
    for name, arr in msg.content["arrays"].items():
        theta = arr.numpy()
        new[name] = Array(theta - lr * (theta - target(pid, name)))
        loss += float(np.sum((theta - target(pid, name)) ** 2))
    metrics = MetricRecord({"train_loss": loss, "num-examples": num_examples(pid)})
    return Message(RecordDict({"arrays": ArrayRecord(new), "metrics": metrics}), reply_to=msg)


def evaluate(msg: Message, context: Context) -> Message:
    pid = int(context.node_config["partition-id"])
    loss = sum(
        float(np.sum((arr.numpy() - target(pid, name)) ** 2))
        for name, arr in msg.content["arrays"].items()
    )
    metrics = MetricRecord({"eval_loss": loss, "num-examples": num_examples(pid)})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)


def make_app(*mods) -> ClientApp:
    app = ClientApp(mods=list(mods))
    app.train()(train)
    app.evaluate()(evaluate)
    return app


def initial_arrays() -> ArrayRecord:
    rng = np.random.default_rng(7)
    return ArrayRecord({name: Array(rng.standard_normal(shape)) for name, shape in SHAPES.items()})


def as_dict(arrays: ArrayRecord) -> dict[str, np.ndarray]:
    return {name: arr.numpy().astype(np.float64) for name, arr in arrays.items()}


def flat(arrays: Mapping[str, np.ndarray]) -> np.ndarray:
    return np.concatenate([np.asarray(arrays[name], dtype=np.float64).ravel() for name in SHAPES])


# =============================================================================== the oracle
_oracle_ids = iter(range(10**9))


def call_app(theta: Mapping[str, np.ndarray], partition: int, num_parts: int):
    """The plain train handler on partition ``partition`` (what that node computes alone)."""
    content = RecordDict(
        {
            "arrays": ArrayRecord({k: Array(np.asarray(v)) for k, v in theta.items()}),
            "config": ConfigRecord({"lr": LR}),
        }
    )
    msg = Message(content, dst_node_id=1000 + partition, message_type=MessageType.TRAIN)
    msg.metadata.__dict__["_message_id"] = f"oracle-{next(_oracle_ids)}"
    ctx = Context(
        run_id=1,
        node_id=1000 + partition,
        node_config={"partition-id": partition, "num-partitions": num_parts},
        state=RecordDict(),
        run_config={},
    )
    reply = train(msg, ctx)
    return (
        as_dict(reply.content["arrays"]),
        float(reply.content["metrics"]["num-examples"]),
        float(reply.content["metrics"]["train_loss"]),
    )


def fedavg(theta: Mapping[str, np.ndarray], partitions, num_parts: int) -> dict[str, np.ndarray]:
    """FedAvg over ``partitions``: ``sum_j n_j theta_j / sum_j n_j``."""
    total, count = {k: 0.0 for k in theta}, 0.0
    for j in partitions:
        theta_j, n_j, _ = call_app(theta, j, num_parts)
        for k in theta:
            total[k] = total[k] + n_j * theta_j[k]
        count += n_j
    return {k: v / count for k, v in total.items()}


def fedavg_rounds(theta, rounds: int, num_parts: int):
    for _ in range(rounds):
        theta = fedavg(theta, range(num_parts), num_parts)
    return theta


def assert_model(got: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray]) -> None:
    np.testing.assert_allclose(flat(got), flat(expected), rtol=1e-9, atol=1e-12)


def theta0() -> dict[str, np.ndarray]:
    return as_dict(initial_arrays())

