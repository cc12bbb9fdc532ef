"""An in-process Flower Grid: replies become available after per-worker delays, no Ray.

Used by the tests (round logic with controlled delays) and by the experiments, which run the
real strategy and the real client computation in virtual time for 100+ clients on 2 cores.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict


def set_task_identity() -> None:
    """Messages can only be built inside a run: give this process a task identity."""
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id = 1
    TaskIdentity.task_id = 1
    TaskIdentity.node_id = SUPERLINK_NODE_ID


def coded_reply(msg: Message, updates: dict[int, np.ndarray], virtual_s: float = 0.0) -> Message:
    """An honest client: ``sum_j coef_j * u_j`` over its assigned partitions."""
    cfg = msg.content.config_records["config"]
    coded = np.zeros_like(next(iter(updates.values())))
    for j, c in zip(cfg["partitions"], cfg["coefficients"], strict=True):
        if j >= 0:
            coded = coded + c * updates[j]
    meta = MetricRecord(
        {
            "worker": int(cfg["worker"]),
            "server-round": int(cfg["server-round"]),
            "virtual-s": float(virtual_s),
        }
    )
    return Message(
        RecordDict({"coded": ArrayRecord({"update": Array(coded)}), "meta": meta}), reply_to=msg
    )


class LocalGrid:
    """``n`` nodes; ``respond(msg, worker) -> Message`` builds the reply, ``delay(worker, round)``
    says after how many seconds it can be pulled. Pulled replies are deleted, like Flower's."""

    def __init__(
        self,
        n: int,
        respond: Callable[[Message, int], Message],
        delay: Callable[[int, int], float] = lambda w, r: 0.0,
        node_ids: list[int] | None = None,
    ) -> None:
        self.node_ids = node_ids or [1000 + 7 * i for i in range(n)]
        self.worker = {node: i for i, node in enumerate(self.node_ids)}
        self.respond = respond
        self.delay = delay
        self._ready: dict[str, tuple[float, Message]] = {}
        self.pushed: list[Message] = []

    def get_node_ids(self) -> Iterable[int]:
        return list(self.node_ids)

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        ids = []
        now = time.monotonic()
        for msg in messages:
            mid = str(uuid.uuid4())
            msg.metadata.__dict__["_message_id"] = mid
            self.pushed.append(msg)
            worker = self.worker[msg.metadata.dst_node_id]
            if msg.metadata.message_type == "query":
                reply = Message(
                    RecordDict({"meta": MetricRecord({"worker": worker})}), reply_to=msg
                )
                wait = 0.0
            else:
                reply = self.respond(msg, worker)
                wait = self.delay(worker, int(msg.metadata.group_id or 0))
            if reply is not None:
                self._ready[mid] = (now + wait, reply)
            ids.append(mid)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        now = time.monotonic()
        out = []
        for mid in list(message_ids):
            if mid in self._ready and self._ready[mid][0] <= now:
                out.append(self._ready.pop(mid)[1])
        return out

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None):
        ids = set(self.push_messages(messages))
        t_end = time.monotonic() + (timeout or 3600)
        replies: list[Message] = []
        while ids and time.monotonic() < t_end:
            got = self.pull_messages(list(ids))
            for reply in got:
                ids.discard(reply.metadata.reply_to_message_id)
            replies.extend(got)
            if ids:
                time.sleep(0.005)
        return replies
