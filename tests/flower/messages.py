"""Single messages and contexts for calling the client mod directly, without a grid (tests only)."""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict

from fl_gradcode.flower import protocol
from fl_gradcode.flower.protocol import Instruction

DIM = 6


def train_instruction(**kw) -> Instruction:
    """A train instruction for worker 0 in round 1 holding partition 1 of 3; ``kw`` overrides."""
    base = dict(op=protocol.OP_TRAIN, round=1, worker=0, seed=3, nonce="n",
                partition_ids=(1,), num_partitions=(3,), coefficients=(1.0,))
    return Instruction(**{**base, **kw})


def train_message(instruction: Instruction, arrays: dict[str, np.ndarray] | None = None) -> Message:
    """A train message to node 7 carrying ``instruction`` and ``arrays`` (default: zeros(DIM)),
    its group id the round's number, as Flower's senders set it."""
    arrays = {"w": np.zeros(DIM)} if arrays is None else arrays
    content = RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in arrays.items()}),
                          "config": ConfigRecord({})})
    msg = Message(content, dst_node_id=7, message_type=MessageType.TRAIN)
    return protocol.instruction_message(msg.content, instruction, 7, str(instruction.round))


def node_context(node_config: dict | None = None) -> Context:
    """Node 7's context (default: partition 0 of 3)."""
    cfg = {"partition-id": 0, "num-partitions": 3} if node_config is None else node_config
    return Context(run_id=1, node_id=7, node_config=cfg, state=RecordDict(), run_config={})
