"""The grid's callbacks of a coded round: each reply validated once, as it arrives.

:class:`ReplyCollector` holds the round in progress (:class:`~.round_state.RoundState`) and
answers :class:`~fl_gradcode.flower.grid.EarlyReturnGrid`: a reply is parsed against the round's
layout and wire dtypes, its partition sizes checked against its own ``num-examples``, measured
by the round's integrity probe, and kept or rejected with a public reason; ``ready`` says when
the valid replies satisfy the stopping rule (a decodable set, cross-checked with ``verify``);
``prioritize`` orders a batch so that a decodable set is validated first.

The stopping rule is the exact decodability of a gradient code's replies (Tandon, Lei, Dimakis,
Karampatziakis, "Gradient Coding", ICML 2017, https://arxiv.org/abs/1612.03301); the
cross-check is :func:`~fl_gradcode.flower.integrity.verify_replies`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from logging import INFO, WARNING
from typing import Any

from flwr.app import Message, MetricRecord
from flwr.common.logger import log

from ..codes import GradientCode
from . import compat, partition_metrics, protocol
from .blas import serial_blas
from .clock import Clock
from .deadline_policy import DeadlinePolicy
from .integrity import (
    Probe,
    Verdict,
    applied_disagreement,
    reply_sizes,
    round_probe,
    verify_replies,
)
from .options import IntegrityOptions
from .protocol import RejectedReply
from .quarantine import Quarantine
from .reports import check_reply_sizes, public_reason
from .round_state import RoundState, is_chunked, payload_bytes
from .settle import placement_refusal, settle_replies

__all__ = ["ReplyCollector", "serial_blas"]


class ReplyCollector:
    """Validates the replies of the round in progress and counts those of earlier rounds."""

    def __init__(self, clock: Clock, deadlines: DeadlinePolicy, integrity: IntegrityOptions,
                 quarantine: Quarantine, fingerprints: compat.ReplyFingerprints) -> None:
        self.clock = clock
        self.deadlines = deadlines
        self.integrity = integrity
        self.quarantine = quarantine
        self.fingerprints = fingerprints
        self.state: RoundState | None = None
        self.warned_unverifiable = False
        self.warned_placement = False
        self.late = 0  # replies to earlier rounds dropped since the last row
        self.stopped_late = 0  # stop replies to earlier rounds, not yet in a row
        self.late_compute_s = 0.0  # the dropped late replies' client compute, not yet in a row

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

    def probe_for(self, state: RoundState, code_options: dict[str, Any]) -> Probe | None:
        """The round's integrity probe (:func:`~fl_gradcode.flower.integrity.round_probe`;
        ``None``: not checked). With ``verify``, a round without redundancy is warned once."""
        verify = self.integrity.verify
        probe = round_probe(state.code, state.reply_layout, verify, code_options)
        if verify and probe is None and not self.warned_unverifiable:
            log(WARNING, "verify=True: round %d uses s=0 (no redundancy): such rounds are "
                "applied unverified (verified=None in rounds.jsonl)", state.number)
            self.warned_unverifiable = True
        why = placement_refusal(state.code) if verify and probe is not None else None
        if why is not None and not self.warned_placement:
            log(WARNING, "verify=True: round %d uses code %s for %d clients and %s: such "
                "blocks are never settled and are left out of the decoding (choose a cohort "
                "size that s + 1 divides)", state.number, state.code.name, state.code.n, why)
            self.warned_placement = True
        return probe

    def on_unsent(self, messages: list[Message]) -> None:
        """Messages the grid refused: those workers are stragglers of this round, not busy."""
        state = self.state
        for msg in messages:
            if state is not None:
                worker = state.worker_of.get(msg.metadata.dst_node_id)
                state.sent.pop(worker, None)
            log(WARNING, "message to node %s was not accepted by the grid: straggler",
                msg.metadata.dst_node_id)

    def on_reply(self, reply: Message) -> None:
        """Validate a reply of the current round once, as it arrives."""
        state, mid = self.state, reply.metadata.message_id
        if state is None or (mid and mid in state.seen):
            return  # no open round, or validated already (``aggregate_train`` offers it again)
        with serial_blas():
            self._on_reply(state, reply)

    def _on_reply(self, state: RoundState, reply: Message) -> None:
        mid = reply.metadata.message_id
        if mid:
            state.seen.add(mid)
        reply_bytes = payload_bytes(reply)
        state.bytes_up += reply_bytes
        node = reply.metadata.src_node_id
        worker = state.worker_of.get(node)
        if worker is None and reply.has_error():
            # an error reply the SuperLink writes for an unreachable node carries its own id:
            # it is the failure of the node whose message it answers
            for w, sent in state.sent.items():
                if sent.metadata.message_id and (
                        sent.metadata.message_id == reply.metadata.reply_to_message_id):
                    worker, node = w, state.cohort[w]
                    break
        if (reply.has_error() and reply.error.code == protocol.STOPPED_CODE
                and worker in state.sent and worker not in state.answered
                and reply.metadata.group_id == str(state.number)):
            state.answered.add(worker)  # a straggler that stopped at the deadline: not a fault
            state.stopped.append(worker)
            log(INFO, "round %d: node %s stopped at the deadline (%s)", state.number, node,
                public_reason(reply.error.reason))
            return
        try:
            parsed = self._parse(state, reply, node, worker)
        except RejectedReply as why:
            state.reject(node, worker, str(why))
            if (self.integrity.verify and reply.has_error() and worker in state.sent
                    and reply.metadata.group_id in ("", str(state.number))):
                # its own reply says it failed: nobody else can fabricate that
                self.quarantine.offend(state.number, [node], "error replies")
            return
        parsed.extra["bytes"] = reply_bytes
        state.valid[worker] = parsed
        self.fingerprints.record(state.number, reply)  # cached: must not change afterwards
        if state.tracker is not None:
            state.tracker.add(worker)

    def _parse(self, state: RoundState, reply: Message, node: int, worker: int | None) -> Any:
        """The reply as a :class:`~.protocol.CodedReply`, or ``RejectedReply`` with why not."""
        if worker is None:
            raise RejectedReply("unknown sender")
        state.answered.add(worker)
        if worker not in state.sent:
            raise RejectedReply("sender was not sent work this round")
        if reply.metadata.group_id != str(state.number):
            raise RejectedReply(f"reply to round {reply.metadata.group_id!r}")
        if worker in state.valid:
            raise RejectedReply("duplicate sender")
        parsed = protocol.parse_reply(
            reply, worker=worker, round=state.number, layout=state.reply_layout,
            dtypes=state.wire_dtypes(), check_values=self.clock.checks_values_on_arrival,
        )
        try:
            check_reply_sizes(state.code, worker, parsed.sizes, parsed.num_examples)
        except RejectedReply:  # provably inconsistent with itself: an offence
            self.quarantine.offend(state.number, [node],
                                   "partition sizes that contradict its num-examples")
            raise
        # each partition's own metrics, for the inner strategy's metric aggregation
        parsed.extra["partition_metrics"] = partition_metrics.read(reply, len(parsed.sizes))
        if state.probe is not None:
            z, size = state.probe.measure(parsed.arrays, parsed.num_examples, parsed.metrics)
            parsed.extra["z"], parsed.extra["size"] = z, size
            # a handful of floats: plain Python, no numpy call per reply
            if not (all(map(math.isfinite, z.tolist()))
                    and (size is None or math.isfinite(size))):
                raise RejectedReply("arrays contain NaN or Inf, or overflow float64")
        return parsed

    def prioritize(self, replies: list[Message]) -> list[Message]:
        """Order a batch of replies pulled together so that a decodable set is validated first.

        Round-robin over the code's blocks still undecodable (the first reply of each such
        block, then the second, ...), then the rest in arrival order: when many replies arrive
        at once, the round can return after validating one reply per FRC group instead of all.
        """
        state = self.state
        if state is None or not self.clock.returns_early:
            return replies
        pending = state.decodability().pending_blocks
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
        state = self.state
        if not self.clock.returns_early or state is None:
            return False
        enough = self.deadlines.stopping_replies(state.code)
        if enough is not None and len(state.valid) >= enough:
            return True
        with serial_blas():
            if not state.decodability().decodable:
                return False
            if not self.integrity.verify or state.probe is None:
                return True
            return self.decodable(state.code)(sorted(state.valid))

    def decodable(self, code: GradientCode) -> Callable[[list[int]], bool]:
        """The stopping rule: ``min_replies`` (or ``n - s`` for approximate codes) valid
        replies, or a decodable set (with ``verify``: one the cross-check verified)."""
        enough = self.deadlines.stopping_replies(code)
        state = self.state

        def rule(workers: list[int]) -> bool:
            with serial_blas():
                return check(workers)

        def check(workers: list[int]) -> bool:
            if enough is not None and len(workers) >= enough:
                return True
            if not self.integrity.verify or state is None or state.probe is None:
                return bool(workers) and code.is_decodable(workers)
            return bool(workers) and self.settled(state, workers)

        return rule

    def settled(self, state: RoundState, workers: list[int]) -> bool:
        """``verify=True``'s stopping rule: some block settled, and every block that still
        can has (:mod:`~fl_gradcode.flower.settle`): ``s + 1`` of its workers were sent work
        and not rejected, and some of them are still to come."""
        verdict = self.verdict(state, workers)
        if verdict.status != "verified":
            return False
        done = set(workers) - set(verdict.unsettled) - set(verdict.excluded)
        for clients, _ in state.code.blocks:
            possible = [w for w in clients if w in state.sent
                        and not (w in state.answered and w not in state.valid)]
            if (len(possible) >= state.code.s + 1 and not done.intersection(clients)
                    and not set(possible) <= set(workers)):
                return False
        return True

    def verdict(self, state: RoundState, workers: list[int]) -> Verdict:
        """The integrity cross-check of ``workers``' replies (cached per round)."""
        z = {w: state.valid[w].extra["z"] for w in workers}
        sizes = reply_sizes({w: state.valid[w].extra for w in workers})
        check = settle_replies if self.integrity.verify else verify_replies
        return check(state.code, z, workers, self.integrity.verify_tolerance,
                     sizes, cache=state.probe.verdicts)

    def cross_check(self, state: RoundState, used: list[int]) -> tuple[list[int], Any]:
        """``(used, verdict)``: the replies left after the integrity cross-check excluded the
        inconsistent ones (their nodes, and those of an unresolved contradiction few enough
        to be one replica group, offend the quarantine); ``verdict`` ``None``: not checked."""
        if state.probe is None or len(used) <= int(not self.integrity.verify):
            return used, None
        with serial_blas():
            verdict = self.verdict(state, used)
        if self.integrity.verify:
            return self._settle(state, used, verdict), verdict
        used = [w for w in used if w not in verdict.excluded]
        for w in verdict.excluded:
            log(WARNING, "round %d: worker %d (node %s) contradicts the other replicas; "
                "excluded", state.number, w, state.cohort[w])
        self.quarantine.offend(state.number, [state.cohort[w] for w in verdict.excluded],
                               "excluded as inconsistent")
        # an unlocatable contradiction is an offence of those involved only when they are
        # few enough to be one replica group (FRC twins with s = 1); a contradiction
        # spread over a cyclic code's whole block says nothing about who is wrong
        if len(verdict.involved) <= state.code.s + 1:
            self.quarantine.offend(state.number, [state.cohort[w] for w in verdict.involved],
                                   "in a contradiction no single exclusion explains")
        return used, verdict

    def _settle(self, state: RoundState, used: list[int], verdict: Verdict) -> list[int]:
        """``verify=True``: the replies of the settled blocks; provably wrong replies are
        offences, unsettled blocks are left out and nobody in them is blamed."""
        for w in verdict.excluded:
            log(WARNING, "round %d: worker %d (node %s) contradicts s + 1 = %d agreeing "
                "replicas; excluded", state.number, w, state.cohort[w], state.code.s + 1)
        self.quarantine.offend(state.number, [state.cohort[w] for w in verdict.excluded],
                               "contradicted by s + 1 agreeing replicas")
        if verdict.unsettled:
            log(WARNING, "round %d: workers %s: no s + 1 = %d agreeing replicas settle their "
                "group (disagreement %.3g, or replies missing); left out of the decoding, "
                "nobody blamed", state.number, verdict.unsettled, state.code.s + 1,
                verdict.disagreement)
        drop = set(verdict.excluded) | set(verdict.unsettled)
        verdict.unsettled = sorted(set(verdict.unsettled) | set(state.left_out))
        return [w for w in used if w not in drop]

    def check_applied(self, state: RoundState, used: list[int], decoding: Any,
                      verdict: Any) -> None:
        """A verified round: the decoding actually applied must agree with the replicas too
        (:func:`~fl_gradcode.flower.integrity.applied_disagreement`); if not, the verdict
        becomes an unresolved contradiction."""
        if (verdict is None or verdict.status != "verified" or decoding is None
                or is_chunked(state.code)):
            return
        z = {w: state.valid[w].extra["z"] for w in used}
        sizes = reply_sizes({w: state.valid[w].extra for w in used})
        off = applied_disagreement(state.code, z, used, decoding.coefficients, sizes)
        if not off <= self.integrity.verify_tolerance:  # NaN/inf included: never agreement
            verdict.status, verdict.unresolved = "contradicted", True
            verdict.disagreement = max(verdict.disagreement, off)

    def withholds(self, state: RoundState, verdict: Any, decode: str) -> bool:
        """Nothing may be applied: the replies contradict each other unresolved, or with
        ``verify`` a decodable round's replies were not all cross-checked in time."""
        if verdict is not None and verdict.unresolved:
            log(WARNING, "round %d: replies disagree (relative %.3g) and no single reply "
                "explains it; nothing is applied", state.number, verdict.disagreement)
            return True
        if self.integrity.verify and state.probe is not None and decode != "skipped" and (
                verdict is None or verdict.status != "verified"):
            log(WARNING, "round %d: verify=True and the replies could not all be cross-checked "
                "before the deadline; nothing is applied", state.number)
            return True
        return False

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
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0.0
    return float(value) if math.isfinite(value) and value >= 0 else 0.0
