"""A one-array numpy app and its FedAvg oracle (tests only): ``w`` of ``DIM`` values, partition
``j`` trains as ``theta_j = theta - 0.5 (theta - target_j)`` on ``10 + 3j`` examples; and
``scaling_mod``, an outer client mod that scales one node's coded reply."""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict

from fl_gradcode.flower import protocol

DIM = 40


def target(pid: int) -> np.ndarray:
    return np.random.default_rng([11, pid]).standard_normal(DIM)


def train(msg: Message, context) -> Message:
    """Deterministic: theta_j = theta - 0.5 (theta - target_j), n_j = 10 + 3j."""
    pid = int(context.node_config["partition-id"])
    theta = msg.content["arrays"]["w"].numpy()
    new = theta - 0.5 * (theta - target(pid))
    return Message(
        RecordDict({"arrays": ArrayRecord({"w": Array(new)}),
                    "metrics": MetricRecord({"num-examples": 10 + 3 * pid})}),
        reply_to=msg,
    )


def oracle(rounds: int, n: int) -> np.ndarray:
    """Plain numpy FedAvg over all partitions (independent of the mod and the wrapper)."""
    theta = np.zeros(DIM)
    sizes = np.array([10 + 3 * j for j in range(n)], dtype=float)
    for _ in range(rounds):
        models = np.array([theta - 0.5 * (theta - target(j)) for j in range(n)])
        theta = sizes @ models / sizes.sum()
    return theta


def scaling_mod(bad_partition: int, factor: float):
    """An outer mod: the node with ``bad_partition`` scales its coded reply."""

    def mod(msg, context, call_next):
        reply = call_next(msg, context)
        if int(context.node_config["partition-id"]) != bad_partition or reply.has_error():
            return reply
        record = reply.content.array_records.get(protocol.PROTOCOL_KEY)
        if record is None:
            return reply
        for name in list(record.keys()):
            record[name] = Array(record[name].numpy() * factor)
        return reply

    return mod
