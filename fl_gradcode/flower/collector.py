"""The grid's callbacks of a coded round: each reply validated once, as it arrives.

:class:`ReplyCollector` holds the round in progress (:class:`~.round_state.RoundState`) and
answers :class:`~fl_gradcode.flower.grid.EarlyReturnGrid` directly: a reply is parsed against
the round's layout and wire dtypes, its partition sizes checked against its own
``num-examples``, measured by the round's integrity probe, and kept or rejected with a public
reason in the round's :class:`Arrivals` (of which the collector is the one owner); ``ready``
says when the valid replies satisfy the stopping rule (the verifier's:
:meth:`~fl_gradcode.flower.verifier.RoundVerifier.stopping_rule`); ``prioritize`` orders a
batch so that a decodable set is validated first; ``deadline_s`` and ``first_reply_deadline_s``
are the deadline policy's for the round in progress; ``collect`` validates what the grid did
not and ends the round's collection.

The stopping rule is the exact decodability of a gradient code's replies (Tandon, Lei, Dimakis,
Karampatziakis, "Gradient Coding", ICML 2017, https://arxiv.org/abs/1612.03301).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from logging import INFO, WARNING
from types import MappingProxyType
from typing import NamedTuple

from flwr.app import Message, MetricRecord
from flwr.common.logger import log

from ..codes.tracker import DecodabilityTracker
from . import compat, partition_metrics, protocol
from .blas import serial_blas
from .clock import Clock
from .deadline_policy import DeadlinePolicy
from .dispatch import Requests
from .finite import finite_number
from .options import IntegrityOptions
from .protocol import CodedReply, RejectedReply
from .quarantine import Quarantine
from .reports import check_reply_sizes, public_reason
from .round_state import Rejection, RoundPlan, RoundState, payload_bytes, rejection
from .senders import answering_node
from .verifier import RoundVerifier

__all__ = ["Arrivals", "Collected", "ReplyCollector", "serial_blas"]


class Arrivals:
    """What arrived in a round (owner: the reply collector, which alone updates it while the
    round collects): the valid replies, the workers that answered at all, the rejected
    replies, the workers stopped at the deadline by their own reply, the messages the grid
    refused, the payload bytes received; the decodability of the valid replies, tracked per
    reply. Read-only to everyone else."""

    def __init__(self, code: object) -> None:
        self._code = code
        self._valid: dict[int, CodedReply] = {}
        self._answered: set[int] = set()
        self._rejections: list[Rejection] = []
        self._stopped: list[int] = []
        self._unsent: set[int] = set()
        self._seen: set[str] = set()  # message ids already parsed
        self._bytes_up = 0
        self._tracker: DecodabilityTracker | None = None

    @property
    def valid(self) -> Mapping[int, CodedReply]:
        return MappingProxyType(self._valid)

    @property
    def answered(self) -> frozenset[int]:
        return frozenset(self._answered)

    @property
    def rejections(self) -> tuple[Rejection, ...]:
        return tuple(self._rejections)

    @property
    def stopped(self) -> tuple[int, ...]:
        return tuple(self._stopped)

    @property
    def unsent(self) -> frozenset[int]:
        return frozenset(self._unsent)

    @property
    def bytes_up(self) -> int:
        return self._bytes_up

    # the collector's writes (this module only: tests/flower/test_round_owners.py)
    def receive(self, message_id: str, payload: int) -> None:
        """A reply of ``payload`` bytes arrived (``message_id``: parsed once)."""
        if message_id:
            self._seen.add(message_id)
        self._bytes_up += payload

    def has_seen(self, message_id: str) -> bool:
        return bool(message_id) and message_id in self._seen

    def answer(self, worker: int) -> None:
        """``worker`` replied (valid or not)."""
        self._answered.add(worker)

    def stop(self, worker: int) -> None:
        """``worker`` replied that it stopped at the deadline."""
        self._answered.add(worker)
        self._stopped.append(worker)

    def accept(self, worker: int, reply: CodedReply) -> None:
        """``worker``'s reply is valid."""
        self._valid[worker] = reply
        if self._tracker is not None:
            self._tracker.add(worker)

    def reject(self, refused: Rejection) -> None:
        """A reply refused, with its public reason."""
        self._rejections.append(refused)

    def refuse_message(self, worker: int) -> None:
        """The grid did not accept ``worker``'s message: it was never asked."""
        self._unsent.add(worker)

    def decodability(self) -> DecodabilityTracker:
        """The decodability of the valid replies, built on first use and updated per reply."""
        if self._tracker is None:
            self._tracker = self._code.tracker()  # type: ignore[attr-defined]
            for worker in self._valid:
                self._tracker.add(worker)
        return self._tracker


class Collected(NamedTuple):
    """A round's collection, ended: its state, and the replies to earlier rounds dropped
    (``late``, with their client compute ``late_compute_s``) and stopped at their deadline
    (``stopped_late``) since the last row."""

    state: RoundState
    late: int
    stopped_late: int
    late_compute_s: float = 0.0


class ReplyCollector:
    """Validates the replies of the round in progress and counts those of earlier rounds; the
    one handler of the grid's callbacks.

    ``verifier``: the round's stopping rule and integrity (``None``: one built from
    ``integrity``, ``deadlines`` and ``quarantine``)."""

    def __init__(self, clock: Clock, deadlines: DeadlinePolicy, integrity: IntegrityOptions,
                 quarantine: Quarantine, fingerprints: compat.ReplyFingerprints,
                 verifier: RoundVerifier | None = None) -> None:
        self.clock = clock
        self.deadlines = deadlines
        self.integrity = integrity
        self.quarantine = quarantine
        self.fingerprints = fingerprints
        self.verifier = verifier if verifier is not None else RoundVerifier(
            integrity, deadlines, quarantine)
        self._state: RoundState | None = None
        self._arrivals: Arrivals | None = None
        self.late = 0  # replies to earlier rounds dropped since the last row
        self.stopped_late = 0  # stop replies to earlier rounds, not yet in a row
        self.late_compute_s = 0.0  # the dropped late replies' client compute, not yet in a row

    @property
    def state(self) -> RoundState | None:
        """The round in progress (``None``: none)."""
        return self._state

    @property
    def round_timeout(self) -> float:
        """Seconds an unanswered message is waited for (the grid's bound)."""
        return self.deadlines.options.round_timeout

    def open(self, plan: RoundPlan, requests: Requests) -> RoundState:
        """Start collecting the replies of the round ``plan`` opened (``requests``: who was
        asked); its state."""
        self._arrivals = Arrivals(plan.code)
        self._state = RoundState(plan, requests, self._arrivals)
        return self._state

    def clear(self) -> None:
        """No round in progress (replies are then late or ignored)."""
        self._state = self._arrivals = None

    def collect(self, replies: Iterable[Message]) -> Collected:
        """Validate the ``replies`` the grid did not hand over (each once) and end the round's
        collection: its state and the late counts since the last row."""
        assert self._state is not None, "collect follows open"
        for reply in replies:
            self.on_reply(reply)
        late, stopped_late = self.take_late()
        return Collected(self._state, late, stopped_late, self.take_late_compute_s())

    def take_late(self) -> tuple[int, int]:
        """``(late replies dropped, late stop replies)`` since the last call."""
        counts = (self.late, self.stopped_late)
        self.late = self.stopped_late = 0
        return counts

    def take_late_compute_s(self) -> float:
        """Client compute (the mod's ``compute-s``) of the late replies dropped since the last
        call: work the clients did even though no round decoded it."""
        seconds, self.late_compute_s = self.late_compute_s, 0.0
        return seconds

    # ------------------------------------------------------------------ the grid's callbacks
    def deadline_s(self, timeout: float | None) -> float:
        """Wall-clock limit of the round in progress (the deadline policy's)."""
        state = self._state
        return self.deadlines.grid_deadline_s(
            self.clock, None if state is None else state.number,
            () if state is None else state.sent.values(), timeout)

    def first_reply_deadline_s(self) -> float | None:
        """Wallclock round 1: the straggler deadline counts from the first reply (start-up)."""
        state = self._state
        return self.deadlines.first_reply_deadline_s(self.clock,
                                                     None if state is None else state.number)

    def on_unsent(self, messages: list[Message]) -> None:
        """Messages the grid refused: those workers are stragglers of this round, not busy."""
        state, arrivals = self._state, self._arrivals
        for msg in messages:
            if state is not None and arrivals is not None:
                worker = state.worker_of.get(msg.metadata.dst_node_id)
                if worker is not None:
                    arrivals.refuse_message(worker)
            log(WARNING, "message to node %s was not accepted by the grid: straggler",
                msg.metadata.dst_node_id)

    def on_reply(self, reply: Message) -> None:
        """Validate a reply of the current round once, as it arrives."""
        state, arrivals, mid = self._state, self._arrivals, reply.metadata.message_id
        if state is None or arrivals is None or arrivals.has_seen(mid):
            return  # no open round, or validated already (``aggregate_train`` offers it again)
        with serial_blas():
            self._on_reply(state, arrivals, reply)

    def _on_reply(self, state: RoundState, arrivals: Arrivals, reply: Message) -> None:
        reply_bytes = payload_bytes(reply)
        arrivals.receive(reply.metadata.message_id, reply_bytes)
        sent = state.sent
        # an error reply the SuperLink writes for an unreachable node is the failure of the
        # node whose message it answers; any other reply speaks for its sender only
        node = answering_node(reply, sent.values())
        worker = state.worker_of.get(node)
        if (reply.has_error() and reply.error.code == protocol.STOPPED_CODE
                and worker in sent and worker not in arrivals.answered
                and reply.metadata.group_id == str(state.number)):
            arrivals.stop(worker)  # a straggler that stopped at the deadline: not a fault
            log(INFO, "round %d: node %s stopped at the deadline (%s)", state.number, node,
                public_reason(reply.error.reason))
            return
        try:
            parsed = self._parse(state, arrivals, reply, node, worker)
        except RejectedReply as why:
            arrivals.reject(rejection(state.number, node, worker, str(why)))
            if (self.integrity.verify and reply.has_error() and worker in sent
                    and reply.metadata.group_id in ("", str(state.number))):
                # its own reply says it failed: nobody else can fabricate that
                self.quarantine.offend(state.number, [node], "error replies")
            return
        assert worker is not None  # a reply without a worker is rejected
        parsed.extra["bytes"] = reply_bytes
        arrivals.accept(worker, parsed)
        self.fingerprints.record(state.number, reply)  # cached: must not change afterwards

    def _parse(self, state: RoundState, arrivals: Arrivals, reply: Message, node: int,
               worker: int | None) -> CodedReply:
        """The reply as a :class:`~.protocol.CodedReply`, or ``RejectedReply`` with why not."""
        if worker is None:
            raise RejectedReply("unknown sender")
        arrivals.answer(worker)
        if worker not in state.sent:
            raise RejectedReply("sender was not sent work this round")
        if reply.metadata.group_id != str(state.number):
            raise RejectedReply(f"reply to round {reply.metadata.group_id!r}")
        if worker in arrivals.valid:
            raise RejectedReply("duplicate sender")
        parsed = protocol.parse_reply(
            reply, worker=worker, round=state.number, layout=state.plan.reply_layout,
            dtypes=dict(state.plan.wire_dtypes),
            check_values=self.clock.checks_values_on_arrival,
        )
        try:
            check_reply_sizes(state.code, worker, parsed.sizes, parsed.num_examples)
        except RejectedReply:  # provably inconsistent with itself: an offence
            self.quarantine.offend(state.number, [node],
                                   "partition sizes that contradict its num-examples")
            raise
        # each partition's own metrics, for the inner strategy's metric aggregation
        # (as many as it holds: a worker holding none reports partition-sizes [0] and no
        # partition's metrics)
        parsed.extra["partition_metrics"] = partition_metrics.read(
            reply, len(state.code.assignment(worker)))
        if state.probe is not None:
            z, size = state.probe.measure(parsed.arrays, parsed.num_examples, parsed.metrics)
            parsed.extra["z"], parsed.extra["size"] = z, size
            # a handful of floats: plain Python, no numpy call per reply
            if not (all(map(math.isfinite, z.tolist()))
                    and all(map(math.isfinite, size.tolist()))):
                raise RejectedReply("arrays contain NaN or Inf, or overflow float64")
        return parsed

    def prioritize(self, replies: list[Message]) -> list[Message]:
        """Order a batch of replies pulled together so that a decodable set is validated first.

        Round-robin over the code's blocks still undecodable (the first reply of each such
        block, then the second, ...), then the rest in arrival order: when many replies arrive
        at once, the round can return after validating one reply per FRC group instead of all.
        """
        state, arrivals = self._state, self._arrivals
        if state is None or arrivals is None or not self.clock.returns_early:
            return replies
        pending = arrivals.decodability().pending_blocks
        block_of = state.code.block_of
        seen: dict[int, int] = {}
        keys = []
        for index, reply in enumerate(replies):
            worker = state.worker_of.get(reply.metadata.src_node_id)
            block = block_of(worker) if worker is not None else -1
            if block in pending:
                seen[block] = seen.get(block, 0) + 1
                keys.append((0, seen[block], index))
            else:
                keys.append((1, 0, index))
        return [replies[i] for *_, i in sorted(keys)]

    def ready(self) -> bool:
        """Early return: the valid replies so far satisfy the stopping rule.

        Exact decodability is tracked per reply (only the new reply's block is re-solved);
        the full rule (``min_replies``, ``verify``) runs once the valid replies decode.
        """
        state, arrivals = self._state, self._arrivals
        if not self.clock.returns_early or state is None or arrivals is None:
            return False
        enough = self.deadlines.stopping_replies(state.code)
        if enough is not None and len(arrivals.valid) >= enough:
            return True
        with serial_blas():
            if not arrivals.decodability().decodable:
                return False
            if not self.integrity.verify or state.probe is None:
                return True
            return self.verifier.stopping_rule(state, state.code)(sorted(arrivals.valid))

    def on_late_reply(self, reply: Message) -> None:
        """A reply to an earlier round: counted and dropped, never decoded."""
        if reply.has_error() and reply.error.code == protocol.STOPPED_CODE:
            self.stopped_late += 1
            log(INFO, "node %s stopped its work on round %s at the deadline",
                reply.metadata.src_node_id, reply.metadata.group_id)
            return
        self.late += 1
        self.late_compute_s += claimed_compute_s(reply)
        log(INFO, "dropped late reply from node %s to round %s",
            reply.metadata.src_node_id, reply.metadata.group_id)


def claimed_compute_s(reply: Message) -> float:
    """The ``compute-s`` a coded reply claims (finite and non-negative), else 0: for replies
    that are counted but not parsed (late ones); never raises on a malformed reply."""
    try:
        meta = reply.content.get(protocol.PROTOCOL_KEY + "-meta")
        value = meta.get("compute-s") if isinstance(meta, MetricRecord) else None
    except Exception:  # an error reply has no content; a hostile one may have anything
        return 0.0
    return float(value) if finite_number(value) and value >= 0 else 0.0
