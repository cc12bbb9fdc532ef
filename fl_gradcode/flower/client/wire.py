"""The wire encoding of a worker's one coded reply: the coded arrays in float64, or in the
global model's own float dtypes (``wire='model'``, chosen by the server when the code's error
amplification keeps the decoded result accurate); for communication-efficient codes one chunk
``sum_u Gamma[u, t] chunk_u`` of the flattened sum and count (Ye and Abbe, ICML 2018; Kadhe,
Koyluoglu and Ramchandran, 2020); each partition's own metrics attached for the inner
strategy's metric aggregation unless the DP release withholds them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from flwr.app import Message

from .. import partition_metrics, protocol
from ..protocol import Instruction
from .accumulate import CodedSum

__all__ = ["chunked", "coded_reply_message", "wire_dtypes"]


def wire_dtypes(instruction: Instruction,
                theta: Mapping[str, np.ndarray]) -> dict[str, np.dtype] | None:
    """The dtypes float arrays travel in (``None``: float64): the model's own under
    ``wire='model'`` (a chunk's dtype is decided with the chunk)."""
    if instruction.wire == "model" and not instruction.chunk_coefficients:
        return {name: theta[name].dtype for name in theta if theta[name].dtype.kind == "f"}
    return None


def chunked(coded: Mapping[str, np.ndarray], count: float,
            instruction: Instruction) -> np.ndarray:
    """``sum_u Gamma[u, t] chunk_u`` of ``[flattened arrays..., count]`` zero-padded to ``m L``
    (Ye and Abbe 2018; Kadhe, Koyluoglu and Ramchandran 2020)."""
    gamma = np.asarray(instruction.chunk_coefficients, dtype=np.float64)
    m = gamma.size
    flat = np.concatenate([*(v.reshape(-1) for v in coded.values()), [count]])
    length = -(-flat.size // m)
    padded = np.zeros(m * length)
    padded[: flat.size] = flat
    return gamma @ padded.reshape(m, length)


def coded_reply_message(msg: Message, instruction: Instruction, coded: CodedSum,
                        theta: Mapping[str, np.ndarray], global_arrays: Mapping[str, Any],
                        withhold_metrics: bool) -> Message:
    """The reply to ``msg``: ``coded``'s total encoded for the wire."""
    wire = wire_dtypes(instruction, theta)
    arrays = coded.total(theta, wire)
    if instruction.chunk_coefficients:  # communication-efficient: 1/m of the model
        chunk = chunked(arrays, coded.count, instruction)
        if instruction.wire == "model" and all(
            arr.dtype == "float32" for arr in global_arrays.values()
        ):
            chunk = chunk.astype(np.float32)
        reply = protocol.train_reply(msg, instruction, {protocol.CHUNK_KEY: chunk},
                                     coded.count, coded.sizes, {}, coded.compute_s)
    else:
        metrics = {} if withhold_metrics else coded.metric_sums or {}
        reply = protocol.train_reply(msg, instruction, arrays, coded.count, coded.sizes,
                                     metrics, coded.compute_s, dtypes=wire)
    if withhold_metrics:
        return reply  # un-noised (per-partition) metrics would undo the DP release
    return partition_metrics.attach(reply, coded.own_metrics)
