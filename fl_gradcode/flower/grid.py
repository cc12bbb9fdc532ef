"""``EarlyReturnGrid``: a delegating wrapper of Flower's ``Grid`` whose coded rounds end early.

``Strategy.start`` only ever calls ``grid.send_and_receive``, and Flower's wrapper strategies
hold a strategy by composition and call the base ``start``; substituting the grid is the one
place where early return works under any wrapper. Coded TRAIN rounds push, poll, and return
when the strategy's stopping rule holds (each reply is handed to ``strategy.on_reply`` once, as
it arrives) or its wall-clock deadline passes. Unanswered messages are remembered; their replies
are pulled in later rounds and handed to ``strategy.on_late_reply`` (which frees the node and
the link state). An unanswered message is given up after a bounded time (``abandon_ttl``,
default the strategy's ``round_timeout``, never beyond the message's own TTL, after which
Flower discards it): a node whose reply was lost is then free again instead of busy for ever.
Every other message keeps Flower's semantics.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from contextlib import nullcontext
from logging import WARNING
from typing import Any, Protocol

from flwr.app import Message, MessageType
from flwr.common.logger import log

from . import protocol
from .blas import serial_blas

__all__ = ["EarlyReturnGrid"]

_BACKOFF_STEPS = 3  # the shortest wait is poll_interval / 2**3


class _RoundOwner(Protocol):
    def on_reply(self, reply: Message) -> None: ...
    def on_late_reply(self, reply: Message) -> None: ...
    def ready(self) -> bool: ...
    def deadline_s(self, timeout: float | None) -> float: ...
    def first_reply_deadline_s(self) -> float | None: ...
    def on_unsent(self, messages: list[Message]) -> None: ...


def _is_coded_train(messages: list[Message]) -> bool:
    if not messages or messages[0].metadata.message_type != MessageType.TRAIN:
        return False
    rec = messages[0].content.config_records.get(protocol.PROTOCOL_KEY)
    return rec is not None and rec.get("op") == protocol.OP_TRAIN


class EarlyReturnGrid:
    """Wraps ``grid``; coded TRAIN rounds return at ``strategy.ready()`` or the deadline."""

    def __init__(self, grid: Any, strategy: _RoundOwner, poll_interval: float = 0.005,
                 abandon_ttl: float | None = None) -> None:
        if abandon_ttl is not None and not abandon_ttl > 0:
            raise ValueError(f"abandon_ttl={abandon_ttl!r} must be > 0 seconds (or None: the "
                             "strategy's round_timeout)")
        self._grid = grid
        self._strategy = strategy
        self.poll_interval = poll_interval
        self.abandon_ttl = abandon_ttl
        self.abandoned: dict[str, int] = {}  # message id -> destination node
        self._expires: dict[str, float] = {}  # message id -> when it is given up (monotonic)
        self.expired = 0  # abandoned messages given up without a reply

    def _ttl(self, msg: Message | None) -> float:
        """Seconds an abandoned message is waited for: ``abandon_ttl`` (default the strategy's
        ``round_timeout``, else Flower's message TTL), never beyond what is left of the
        message's own TTL."""
        limit = self.abandon_ttl
        if limit is None:
            limit = getattr(self._strategy, "round_timeout", None)
        if msg is not None:
            try:
                left = float(msg.metadata.ttl) - max(time.time() - float(msg.metadata.created_at),
                                                     0.0)
                limit = left if limit is None else min(limit, left)
            except (AttributeError, TypeError, ValueError):
                pass
        return max(float(limit if limit is not None else 3600.0), 0.0)

    def _abandon(self, pending: dict[str, int], sent: dict[str, Message]) -> None:
        now = time.monotonic()
        for mid, node in pending.items():
            self.abandoned[mid] = node
            self._expires[mid] = now + self._ttl(sent.get(mid))

    def expire(self) -> list[int]:
        """Give up abandoned messages past their bound: their nodes are free again. Returns
        those nodes (each warned in the log)."""
        now = time.monotonic()
        gone = [mid for mid in self.abandoned if self._expires.get(mid, now + 1.0) <= now]
        nodes = []
        for mid in gone:
            node = self.abandoned.pop(mid)
            self._expires.pop(mid, None)
            self.expired += 1
            nodes.append(node)
            log(WARNING, "node %s never answered message %s: given up, the node is free again",
                node, mid)
        return nodes

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)

    @property
    def inner(self) -> Any:
        return self._grid

    def busy_nodes(self) -> set[int]:
        self.expire()
        return set(self.abandoned.values())

    def collect_late(self) -> None:
        """Pull replies to earlier rounds that have arrived (frees their nodes); give up those
        past their bound."""
        if not self.abandoned:
            return
        self.expire()
        if not self.abandoned:
            return
        for reply in self._grid.pull_messages(list(self.abandoned)):
            self._drop_if_late(reply)

    def wait_until_free(self, nodes: set[int], timeout: float) -> None:
        """Block (pulling late replies) until one of ``nodes`` is free or ``timeout`` passes."""
        t_end = time.monotonic() + timeout
        while nodes and nodes <= self.busy_nodes() and time.monotonic() < t_end:
            self.collect_late()
            if nodes <= self.busy_nodes():
                time.sleep(self.poll_interval)

    def _drop_if_late(self, reply: Message) -> None:
        """A reply to an abandoned message of an earlier round frees its node; others are
        ignored (not ours to judge)."""
        rid = reply.metadata.reply_to_message_id
        if rid in self.abandoned:
            del self.abandoned[rid]
            self._expires.pop(rid, None)
            self._strategy.on_late_reply(reply)

    def push(self, messages: list[Message]) -> dict[str, Message]:
        """Push; a message Flower did not accept (no id) is reported as unsent.

        ``HttpGrid`` returns one id per message (``None`` where refused); ``InMemoryGrid``
        leaves refused messages out of a shorter list, after setting every message's id: then
        ids are matched to messages by ``message_id``, never by position.
        """
        ids = list(self._grid.push_messages(messages))
        if len(ids) != len(messages):
            accepted = {str(mid) for mid in ids if mid}
            ids = [m.metadata.message_id if m.metadata.message_id in accepted else None
                   for m in messages]
        sent, unsent = {}, []
        for index, msg in enumerate(messages):
            mid = ids[index]
            if mid:
                sent[mid] = msg
            else:
                unsent.append(msg)
        if unsent:
            self._strategy.on_unsent(unsent)
        return sent

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> list[Message]:
        msgs = list(messages)
        if not _is_coded_train(msgs):
            self.collect_late()
            return list(self._grid.send_and_receive(msgs, timeout=timeout))
        sent = self.push(msgs)
        pending = {mid: msg.metadata.dst_node_id for mid, msg in sent.items()}
        t_end = time.monotonic() + self._strategy.deadline_s(timeout)
        first_reply_s = self._strategy.first_reply_deadline_s()
        replies: list[Message] = []
        answered: set[str] = set()
        done = False
        quiet = 0  # empty pulls in a row
        # virtual timing: a node silent for long after the others answered is hung
        hang_after = getattr(getattr(self._strategy, "clock", None), "hang_after_s", None)
        last = time.monotonic()  # the round's start, then its latest reply
        longest_gap = 0.0
        while pending:
            asked = [*pending, *self.abandoned]
            pulled = list(self._grid.pull_messages(asked))
            prioritize = getattr(self._strategy, "prioritize", None)
            if prioritize is not None and not done and len(pulled) > 1:
                pulled = prioritize(pulled)  # the replies that complete a decodable set first
            with serial_blas() if pulled else nullcontext():  # once per batch: each reply's
                # own block is then free
                for reply in pulled:
                    rid = reply.metadata.reply_to_message_id
                    if rid in pending:
                        del pending[rid]
                        now = time.monotonic()
                        longest_gap, last = max(longest_gap, now - last), now
                        answered.add(rid)
                        replies.append(reply)
                        if not done:  # validated as it arrives; the rest after the return
                            self._strategy.on_reply(reply)
                            done = self._strategy.ready()
                    elif rid in answered:  # a second reply to one message: rejected, counted
                        self._strategy.on_reply(reply)
                    else:
                        self._drop_if_late(reply)
            if first_reply_s is not None and replies:  # deadline counts from the first reply
                t_end = min(t_end, time.monotonic() + first_reply_s)
                first_reply_s = None
            if done or not pending:
                break
            left = t_end - time.monotonic()
            if hang_after is not None and replies:
                silent = last + hang_after(longest_gap) - time.monotonic()
                if silent <= 0 < left:
                    self._warn_hung(pending, time.monotonic() - last, longest_gap)
                    break
                left = min(left, silent)
            if left <= 0:
                break
            quiet = 0 if pulled else quiet + 1
            time.sleep(min(self._next_wait(asked, quiet), left))
        self._abandon(pending, sent)
        return replies

    def _warn_hung(self, pending: dict[str, int], silent_s: float, gap_s: float) -> None:
        nodes = sorted(set(pending.values()))
        log(WARNING, "node(s) %s sent no reply %.1f s (real time) after the round's last "
            "reply (the longest real wait for a reply this round was %.2f s): taken for hung, "
            "they are stragglers of this virtual-timing round, which stops waiting for them "
            "(a node silent for max(straggler_timeout, %g x that wait) is; round_timeout is "
            "the bound otherwise)", ", ".join(map(str, nodes)), silent_s, gap_s,
            getattr(getattr(self._strategy, "clock", None), "HANG_FACTOR", 0.0))

    def _next_wait(self, asked: list[str], quiet: int) -> float:
        """Seconds to sleep before the next pull, never more than ``poll_interval``.

        A grid that knows when its next reply becomes pullable (``next_reply_in(ids)``,
        e.g. :class:`~fl_gradcode.flower.testing.InProcessGrid`) is pulled right then.
        Otherwise the wait backs off: ``poll_interval / 8`` after a pull that returned
        replies (replies tend to arrive together), doubling with each empty pull in a row
        (``quiet`` counts them) up to ``poll_interval``.
        """
        hint = getattr(self._grid, "next_reply_in", None)
        if hint is not None:
            wait = hint(asked)
            if wait is not None:
                return min(max(float(wait), 0.0), self.poll_interval)
        return self.poll_interval * 2.0 ** (min(quiet, _BACKOFF_STEPS) - _BACKOFF_STEPS)
