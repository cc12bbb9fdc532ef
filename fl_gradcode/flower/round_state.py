"""The coded round in progress: what was sent, what came back, what was rejected.

:class:`RoundState` is the one record a round's collaborators share: the configuration step
fills it (code, cohort, messages sent), the reply collector adds replies as they arrive
(:meth:`RoundState.reject` counts the refused ones with their public reason), and the
aggregation reads it to decode and to write the round's row.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from logging import DEBUG
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, Message, RecordDict
from flwr.common.logger import log

from ..codes import GradientCode
from . import protocol
from .protocol import CodedReply, Identity
from .records import split_reason
from .reports import public_reason

__all__ = ["RoundState", "RoundView", "array_key", "is_chunked", "partition_key", "payload_bytes"]


@dataclass(frozen=True)
class RoundView:
    """A read-only view of the coded round in progress (``GradientCoding.current_round``)."""

    number: int  # the server round
    cohort: tuple[int, ...]  # worker index -> node id
    code: GradientCode  # the code of the round (``code.B[w]``: worker w's coefficients)
    wire: str  # the reply dtype: "model" or "float64"


@dataclass
class RoundState:
    """Bookkeeping of the round in progress."""

    number: int
    code: GradientCode
    cohort: list[int]  # worker index -> node id
    partitions: list[Identity]  # code partition j -> the data partition it stands for
    sent: dict[int, Message]  # worker -> message sent
    busy: list[int]
    layout: dict[str, tuple[int, ...]]
    reply_layout: dict[str, tuple[int, ...]]
    dtypes: dict[str, np.dtype]
    theta: dict[str, np.ndarray]
    array_key: str
    wall_start: float
    valid: dict[int, CodedReply] = field(default_factory=dict)
    answered: set[int] = field(default_factory=set)  # workers with any reply (valid or not)
    rejected: list[tuple[int, str]] = field(default_factory=list)
    rejected_details: list[tuple[int | None, str, str | None]] = field(default_factory=list)
    left_out: list[int] = field(default_factory=list)  # verify: contested sizes, none blamed
    seen: set[str] = field(default_factory=set)  # message ids already parsed
    wire: str = "float64"
    probe: Any = None  # random projections for the integrity checks (None: not checked)
    bytes_up: int = 0  # payload bytes of every reply of this round
    stopped: list[int] = field(default_factory=list)  # workers stopped at the deadline
    bytes_down: int = 0  # payload bytes of every instruction of this round
    excluded: list[int] = field(default_factory=list)  # workers with nothing to compute
    tracker: Any = None  # exact decodability of the valid replies, updated per reply
    quarantined: list[int] = field(default_factory=list)  # nodes sent no work: quarantine
    sizes: dict[int, float] = field(default_factory=dict)  # code partition -> checked size

    @cached_property
    def worker_of(self) -> dict[int, int]:
        return {node: w for w, node in enumerate(self.cohort)}

    def reject(self, node: int, worker: int | None, reason: str) -> None:
        """Count a rejected reply with its public reason (one line of at most
        ``MAX_REASON_CHARS`` characters: the text may come from the client), and say so in the
        log."""
        summary, detail = split_reason(reason)
        reason = public_reason(summary)
        self.rejected.append((node, reason))
        # (worker, reason, traceback): logged with the partition when the round is recorded
        self.rejected_details.append((worker, reason, detail))
        log(DEBUG, "round %d: rejected reply from node %s (worker %s): %s", self.number, node,
            "?" if worker is None else worker, reason)

    def decodability(self) -> Any:
        """The round's decodability tracker, built on first use from the valid replies."""
        if self.tracker is None:
            self.tracker = self.code.tracker()
            for worker in self.valid:
                self.tracker.add(worker)
        return self.tracker

    def wire_dtypes(self) -> dict[str, np.dtype]:
        """The dtype every reply array must have in this round (the instruction's ``wire``);
        computed once per code, model dtypes and wire (asked once per reply)."""
        key = (self.code, self.dtypes, self.wire)
        cached = self.__dict__.get("_wire_dtypes")
        if cached is None or any(a is not b for a, b in zip(cached[0], key, strict=True)):
            cached = self.__dict__["_wire_dtypes"] = (key, wire_dtypes(*key))
        return dict(cached[1])


def array_key(content: RecordDict, preferred: str) -> str:
    """The key of the model's ``ArrayRecord`` in the inner strategy's train content: the
    strategy's ``preferred`` key, else the only ``ArrayRecord``."""
    if preferred in content.array_records:
        return preferred
    if len(content.array_records) == 1:
        return next(iter(content.array_records))
    raise ValueError(f"the inner strategy's train content has no ArrayRecord {preferred!r}")


def is_chunked(code: GradientCode) -> bool:
    """A code whose replies are chunks (``1/m`` of the model: communication-efficient)."""
    return code.chunks > 1


def partition_key(identity: Identity) -> tuple[int, int]:
    """A data partition's key: ``(partition id, number of partitions)``."""
    return (identity.partition_id, identity.num_partitions)


def payload_bytes(msg: Message) -> int:
    """Bytes of the arrays a message carries (what dominates its size on the wire)."""
    if msg.has_error():
        return 0
    try:
        return sum(
            len(arr.data)
            for rec in msg.content.values()
            if isinstance(rec, ArrayRecord)
            for arr in rec.values()
        )
    except Exception:  # a malformed message is counted as empty, rejected elsewhere
        return 0


def wire_dtypes(code: GradientCode, dtypes: Mapping[str, np.dtype],
                wire: str) -> dict[str, np.dtype]:
    """The dtype every reply array must have: with ``wire="model"`` the model's own float
    dtypes (a chunk, which mixes every array: float32 when they all are), else float64."""
    if code.chunks == 1:  # the model's own arrays (:meth:`ReplyLayout.of`)
        return {name: np.dtype(d) if wire == "model" and np.dtype(d).kind == "f"
                else np.dtype(np.float64) for name, d in dtypes.items()}
    float32 = wire == "model" and all(np.dtype(d) == np.float32 for d in dtypes.values())
    return {protocol.CHUNK_KEY: np.dtype(np.float32 if float32 else np.float64)}
