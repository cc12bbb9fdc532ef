"""An in-process Flower Grid that runs real ClientApps (mods included) without Ray.

Used by the tests and the experiments: the real ``gradient_coding_mod`` and the real app's
handlers run in this process, one node after the other; replies can be held back by a
wall-clock ``delay(worker, round)`` for wallclock tests. Pulled replies are deleted, like
Flower's, and re-pulling an id returns nothing.

Grid-level faults for fault-injection tests (each a callable of ``(node index, round)``, like
``delay``; every injection is appended to ``InProcessGrid.injected``): ``crash`` (the node
crashes mid-round: the message is accepted and the app runs, but no reply is ever delivered),
``duplicate`` (the reply is delivered twice: a copy with a fresh message id, answering the same
message, is pullable together with it) and ``src_node_id`` (the reply's sender id is rewritten
to the returned id, e.g. an unknown node or another node; ``None`` leaves it alone).
"""

from __future__ import annotations

import copy
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from flwr.app import Context, Error, Message, RecordDict

__all__ = ["InProcessGrid", "set_task_identity"]


def set_task_identity() -> None:
    """Messages can only be built inside a run: give this process a task identity."""
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id = 1
    TaskIdentity.task_id = 1
    TaskIdentity.node_id = SUPERLINK_NODE_ID


class InProcessGrid:
    """``num_nodes`` nodes running ``app`` (a ``flwr.clientapp.ClientApp`` or any callable
    ``(Message, Context) -> Message``) in this process.

    Parameters
    ----------
    app : ClientApp or callable
        The ClientApp every node runs (or ``apps``: one per node).
    num_nodes : int
        Number of nodes; node ``i`` has node config ``partition-id=i``,
        ``num-partitions=num_nodes`` (plus ``node_config(i)`` if given).
    run_config : mapping, optional
        The run config every ClientApp's Context carries.
    delay : callable, optional
        ``delay(partition_id, round) -> seconds`` before a reply can be pulled (wall clock).
    node_ids : list of int, optional
        The nodes' ids (default: large pseudo-random-looking ids, not in partition order).
    crash : callable, optional
        ``crash(partition_id, round) -> bool``: the node crashes after computing (no reply).
    duplicate : callable, optional
        ``duplicate(partition_id, round) -> bool``: the reply is delivered twice.
    src_node_id : callable, optional
        ``src_node_id(partition_id, round) -> int | None``: the sender id the reply carries.
    hold : callable, optional
        ``hold(partition_id, round) -> int | None``: the reply can be pulled only once a
        message of that later round has been pushed (a reply that comes in late whatever the
        machine's load, unlike a ``delay``), after its ``delay`` if any.

    ``round`` is the message's ``group_id`` when it is a number, else 0 (e.g. the handshake).
    """

    def __init__(
        self,
        app: Any,
        num_nodes: int,
        run_config: Mapping[str, Any] | None = None,
        *,
        delay: Callable[[int, int], float] | None = None,
        node_config: Callable[[int], Mapping[str, Any]] | None = None,
        node_ids: list[int] | None = None,
        apps: list[Any] | None = None,
        crash: Callable[[int, int], bool] | None = None,
        duplicate: Callable[[int, int], bool] | None = None,
        src_node_id: Callable[[int, int], int | None] | None = None,
        hold: Callable[[int, int], int | None] | None = None,
    ) -> None:
        set_task_identity()
        if num_nodes < 1:
            raise ValueError(f"num_nodes={num_nodes!r} must be >= 1")
        self.node_ids = list(node_ids) if node_ids else [
            (7919 * (i + 3)) % 100003 + 100000 * (i % 3) + 1 for i in range(num_nodes)
        ]
        if len(set(self.node_ids)) != num_nodes:
            raise ValueError("node_ids must be distinct, one per node")
        self.apps = list(apps) if apps else [app] * num_nodes
        self.delay = delay
        self._crash = crash
        self._duplicate = duplicate
        self._src_node_id = src_node_id
        self._hold = hold
        self._held: dict[str, int] = {}  # message id -> the round whose push releases it
        self.injected: list[tuple[str, int, int]] = []  # (fault, node index, round)
        self.contexts = {
            node: Context(
                run_id=1,
                node_id=node,
                node_config={
                    "partition-id": i,
                    "num-partitions": num_nodes,
                    **(dict(node_config(i)) if node_config else {}),
                },
                state=RecordDict(),
                run_config=dict(run_config or {}),
            )
            for i, node in enumerate(self.node_ids)
        }
        self.index = {node: i for i, node in enumerate(self.node_ids)}
        self._ready: dict[str, tuple[float, Message]] = {}
        self._copies: dict[str, tuple[float, Message]] = {}  # duplicated replies
        # message id -> when its reply is pullable (a held reply: also once its round is sent)
        self.available_at: dict[str, float] = {}
        self.pushed = 0
        self.run_id = 1

    def get_node_ids(self) -> Iterable[int]:
        return list(self.node_ids)

    def _run(self, msg: Message) -> Message:
        node = msg.metadata.dst_node_id
        app = self.apps[self.index[node]]
        try:
            reply = app(msg, self.contexts[node])
        except Exception as exc:  # what Flower does with a ClientApp exception
            reply = Message(Error(0, f"ClientAppException: {type(exc).__name__}: {exc}"),
                            reply_to=msg)
        reply.metadata.__dict__["_src_node_id"] = node
        if not reply.metadata.message_id:
            reply.metadata.__dict__["_message_id"] = str(uuid.uuid4())
        return reply

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        ids = []
        for msg in messages:
            if msg.metadata.dst_node_id not in self.index:
                ids.append("")
                continue
            group = msg.metadata.group_id
            server_round = int(group) if group.isdigit() else 0
            index = self.index[msg.metadata.dst_node_id]
            until = self._hold(index, server_round) if self._hold is not None else None
            if until is not None and until <= server_round:
                raise ValueError(f"hold({index}, {server_round}) = {until!r}: the round that "
                                 f"releases a reply must be later than {server_round}")
            for held, release in list(self._held.items()):
                if server_round >= release:  # a later round's push releases the reply
                    del self._held[held]
            mid = str(uuid.uuid4())
            msg.metadata.__dict__["_message_id"] = mid
            self.pushed += 1
            reply = self._run(msg)
            wait = 0.0
            if self.delay is not None:
                wait = self.delay(index, server_round)
            ids.append(mid)
            if self._crash is not None and self._crash(index, server_round):
                self.injected.append(("crash", index, server_round))
                continue  # crashed: accepted, computed, never answered
            if self._src_node_id is not None:
                src = self._src_node_id(index, server_round)
                if src is not None:
                    self.injected.append(("src_node_id", index, server_round))
                    reply.metadata.__dict__["_src_node_id"] = int(src)
            self._ready[mid] = (time.monotonic() + wait, reply)
            self.available_at[mid] = self._ready[mid][0]
            if until is not None:
                self.injected.append(("hold", index, server_round))
                self._held[mid] = int(until)
            if self._duplicate is not None and self._duplicate(index, server_round):
                self.injected.append(("duplicate", index, server_round))
                twin = copy.deepcopy(reply)
                twin.metadata.__dict__["_message_id"] = str(uuid.uuid4())
                self._copies[mid] = (self._ready[mid][0], twin)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        now = time.monotonic()
        out = []
        for mid in list(message_ids):
            if mid in self._ready and self._ready[mid][0] <= now and mid not in self._held:
                out.append(self._ready.pop(mid)[1])
                if mid in self._copies:
                    out.append(self._copies.pop(mid)[1])
        return out

    def next_reply_in(self, message_ids: Iterable[str]) -> float | None:
        """Seconds until the first reply to one of ``message_ids`` can be pulled (``<= 0``:
        one can be pulled now; ``None``: none will, e.g. all pulled, crashed or held). A grid that
        knows this lets :class:`~fl_gradcode.flower.grid.EarlyReturnGrid` pull right then
        instead of on a fixed poll interval."""
        ready = self._ready
        due = [ready[mid][0] for mid in message_ids if mid in ready and mid not in self._held]
        return min(due) - time.monotonic() if due else None

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> list[Message]:
        # in push order (a dict, not a set of random ids): the replies come back in the
        # same order in every run, so sums over them are the same to the last bit
        ids = dict.fromkeys(mid for mid in self.push_messages(messages) if mid)
        t_end = time.monotonic() + (timeout or 3600)
        replies: list[Message] = []
        while ids and time.monotonic() < t_end:
            got = self.pull_messages(list(ids))
            for reply in got:
                ids.pop(reply.metadata.reply_to_message_id, None)
            replies.extend(got)
            if ids:
                time.sleep(0.002)
        return replies

    @property
    def pending(self) -> int:
        """Replies not pulled yet (memory held by the grid)."""
        return len(self._ready) + len(self._copies)
