"""The coded round in progress, one part per owner: who was asked, what arrived, what is
verified, how the window closed, what was decoded.

A round's facts each have one owner, which builds (or, while replies arrive, alone updates)
its part; everyone else reads them through :class:`RoundState`'s read-only properties:

* :class:`RoundPlan` (the opener, :mod:`~fl_gradcode.flower.opener`): number, code, cohort,
  partitions, the members sent nothing, the model's layout, the reply dtype, the integrity probe;
* :class:`~fl_gradcode.flower.dispatch.Requests` (the dispatcher): who was asked, with which
  message;
* :class:`~fl_gradcode.flower.collector.Arrivals` (the reply collector, the grid's callbacks):
  the valid replies, the rejected ones with their public reason, the refused messages, the
  stopped workers, the bytes received;
* :class:`~fl_gradcode.flower.verifier.SizeCheck` and
  :class:`~fl_gradcode.flower.verifier.Verification` (the verifier, the one owner of
  integrity): the agreed partition sizes and the replies they outvote; the replies the
  cross-check keeps and its verdict;
* :class:`~fl_gradcode.flower.closer.Closing` (the closer): the clock's window;
* :class:`~fl_gradcode.flower.records.RoundOutcome` (the aggregator): what was decoded.

Each phase of the aggregation returns the state with its own part filled in
(``dataclasses.replace``), so a round reads top to bottom. :class:`RoundView` is the small
public view (``GradientCoding.current_round``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from logging import DEBUG
from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np
from flwr.app import ArrayRecord, Message, RecordDict
from flwr.common.logger import log

from ..codes import GradientCode
from . import protocol
from .integrity import Probe
from .protocol import CodedReply, Identity
from .records import RoundOutcome, split_reason
from .reports import public_reason

if TYPE_CHECKING:  # the owners' modules import this one
    from .closer import Closing
    from .collector import Arrivals
    from .dispatch import Requests
    from .verifier import SizeCheck, Verification

__all__ = [
    "Rejection",
    "RoundPlan",
    "RoundState",
    "RoundView",
    "array_key",
    "is_chunked",
    "partition_key",
    "payload_bytes",
    "rejection",
]


@dataclass(frozen=True)
class RoundView:
    """A read-only view of the coded round in progress (``GradientCoding.current_round``).

    ``number``: the server round; ``cohort``: worker index -> node id; ``code``: the code of
    the round (``code.B[w]``: worker w's coefficients); ``wire``: the reply dtype (``"model"``
    or ``"float64"``); ``array_key``: the inner strategy's ``ArrayRecord`` holding the model;
    ``sent``: the workers sent work (and not refused by the grid); ``valid``: the workers whose
    reply was accepted so far (both sorted); ``rejected``: ``(node, public reason)`` of each
    refused reply so far."""

    number: int
    cohort: tuple[int, ...]
    code: GradientCode
    wire: str
    array_key: str = "arrays"
    sent: tuple[int, ...] = ()
    valid: tuple[int, ...] = ()
    rejected: tuple[tuple[int, str], ...] = ()

    def worker_of(self, node: int) -> int:
        """The worker index of cohort member ``node``."""
        return self.cohort.index(node)


@dataclass(frozen=True)
class Rejection:
    """A refused reply: its node, worker (``None``: unknown sender), public one-line reason
    and the traceback the client sent (``None``: none)."""

    node: int
    worker: int | None
    reason: str
    detail: str | None = None


def rejection(round_number: int, node: int, worker: int | None, reason: str) -> Rejection:
    """A rejected reply with its public reason (one line of at most ``MAX_REASON_CHARS``
    characters: the text may come from the client), said in the log."""
    summary, detail = split_reason(reason)
    reason = public_reason(summary)
    log(DEBUG, "round %d: rejected reply from node %s (worker %s): %s", round_number, node,
        "?" if worker is None else worker, reason)
    return Rejection(node, worker, reason, detail)


@dataclass(frozen=True)
class RoundPlan:
    """What the opener decided for the round (owner: :mod:`~fl_gradcode.flower.opener`)."""

    number: int
    code: GradientCode
    cohort: tuple[int, ...]  # worker index -> node id
    partitions: tuple[Identity, ...]  # code partition j -> the data partition it stands for
    busy: tuple[int, ...]  # workers sent nothing: busy
    excluded: tuple[int, ...]  # workers with nothing to compute (``s="auto"``)
    quarantined: tuple[int, ...]  # nodes sent no work: quarantine
    layout: Mapping[str, tuple[int, ...]]
    reply_layout: Mapping[str, tuple[int, ...]]
    dtypes: Mapping[str, np.dtype]
    theta: Mapping[str, np.ndarray]  # zero-copy views of the global arrays, model dtype
    array_key: str
    wire: str
    wall_start: float
    probe: Probe | None = None  # random projections of the integrity checks (None: unchecked)
    worker_of: Mapping[int, int] = field(init=False, repr=False, compare=False)
    wire_dtypes: Mapping[str, np.dtype] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # derived once: node -> worker, and the dtype every reply array must have
        object.__setattr__(self, "worker_of", MappingProxyType(
            {node: w for w, node in enumerate(self.cohort)}))
        object.__setattr__(self, "wire_dtypes", MappingProxyType(
            wire_dtypes(self.code, self.dtypes, self.wire)))


@dataclass(frozen=True)
class RoundState:
    """The round's parts (module docstring), read through typed read-only properties.

    The parts filled by the aggregation's phases are ``None`` until their phase ran."""

    plan: RoundPlan
    requests: Requests
    arrivals: Arrivals
    sizes_check: SizeCheck | None = None
    closing: Closing | None = None
    verification: Verification | None = None
    outcome: RoundOutcome | None = None

    # ------------------------------------------------------------------ the plan
    @property
    def number(self) -> int:
        return self.plan.number

    @property
    def code(self) -> GradientCode:
        return self.plan.code

    @property
    def cohort(self) -> tuple[int, ...]:
        return self.plan.cohort

    @property
    def partitions(self) -> tuple[Identity, ...]:
        return self.plan.partitions

    @property
    def busy(self) -> tuple[int, ...]:
        return self.plan.busy

    @property
    def excluded(self) -> tuple[int, ...]:
        return self.plan.excluded

    @property
    def quarantined(self) -> tuple[int, ...]:
        return self.plan.quarantined

    @property
    def theta(self) -> Mapping[str, np.ndarray]:
        return self.plan.theta

    @property
    def dtypes(self) -> Mapping[str, np.dtype]:
        return self.plan.dtypes

    @property
    def array_key(self) -> str:
        return self.plan.array_key

    @property
    def wire(self) -> str:
        return self.plan.wire

    @property
    def probe(self) -> Probe | None:
        return self.plan.probe

    @property
    def worker_of(self) -> Mapping[int, int]:
        return self.plan.worker_of

    # ------------------------------------------------------------------ who was asked
    @property
    def sent(self) -> Mapping[int, Message]:
        """Worker -> the message it was sent (the grid accepted it)."""
        refused = self.arrivals.unsent
        if not refused:
            return self.requests.messages
        return MappingProxyType({w: m for w, m in self.requests.messages.items()
                                 if w not in refused})

    @property
    def bytes_down(self) -> int:
        return self.requests.bytes_down

    # ------------------------------------------------------------------ what arrived
    @property
    def answered(self) -> frozenset[int]:
        """Workers with any reply (valid or not)."""
        return frozenset(self.arrivals.answered)

    @property
    def valid(self) -> Mapping[int, CodedReply]:
        """Worker -> its valid reply, less those the size check or the decoder dropped."""
        dropped = set()
        if self.sizes_check is not None:
            dropped |= self.sizes_check.dropped
        if self.outcome is not None:
            dropped |= {r.worker for r in self.outcome.dropped}
        valid = self.arrivals.valid
        if not dropped:
            return valid
        return MappingProxyType({w: r for w, r in valid.items() if w not in dropped})

    @property
    def rejections(self) -> tuple[Rejection, ...]:
        """Every refused reply of the round, in the order refused."""
        out = tuple(self.arrivals.rejections)
        if self.sizes_check is not None:
            out += self.sizes_check.rejections
        if self.outcome is not None:
            out += self.outcome.dropped
        return out

    @property
    def rejected(self) -> list[tuple[int, str]]:
        """``(node, public reason)`` of each refused reply."""
        return [(r.node, r.reason) for r in self.rejections]

    @property
    def rejected_details(self) -> list[tuple[int | None, str, str | None]]:
        """``(worker, reason, traceback)`` of each refused reply (for ``debug.log``)."""
        return [(r.worker, r.reason, r.detail) for r in self.rejections]

    @property
    def stopped(self) -> list[int]:
        """Workers stopped at the deadline: by their own reply, then by the clock's window."""
        stopped = list(self.arrivals.stopped)
        if self.closing is not None:
            stopped += self.closing.stopped
        return stopped

    @property
    def bytes_up(self) -> int:
        """Payload bytes of the replies that travelled."""
        untravelled = 0 if self.closing is None else self.closing.untravelled_bytes
        return self.arrivals.bytes_up - untravelled

    # ------------------------------------------------------------------ what is verified
    @property
    def sizes(self) -> Mapping[int, float]:
        """Code partition -> its checked size (empty before the size check)."""
        return MappingProxyType({}) if self.sizes_check is None else self.sizes_check.sizes

    @property
    def left_out(self) -> tuple[int, ...]:
        """``verify``: workers whose sizes were contested, none blamed."""
        return () if self.sizes_check is None else self.sizes_check.left_out

    def view(self) -> RoundView:
        """The public view of the round (:class:`RoundView`)."""
        return RoundView(self.number, self.cohort, self.code, self.wire, self.array_key,
                         tuple(sorted(self.sent)), tuple(sorted(self.valid)),
                         tuple(self.rejected))


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
