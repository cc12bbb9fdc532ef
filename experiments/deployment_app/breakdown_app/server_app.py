"""ServerApp: the same job as Flower's FedAvg (``mode=fedavg``) or wrapped in GradientCoding
(``mode=coded``), with wall-clock timestamps of every strategy call, push and pulled reply.

``mode=coded-tuned`` tries two server-side changes without touching the wrapper: the wrapper's
grid polls every ``tuned-poll-s`` instead of 5 ms, and the handshake's ``send_and_receive``
polls at that interval too instead of Flower's 3 s.

The grid is wrapped in ``TimingGrid`` (the wrapper's ``EarlyReturnGrid`` wraps it in turn), so
pushes and pulls are stamped whoever makes them; ``send_and_receive`` runs Flower's own
implementation of the wrapped grid with the stamped push and pull. The stamps are written to
``stamp-dir/server-<mode>.json`` at the end.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

EVENTS: list[dict[str, Any]] = []


def stamp(event: str, **fields: Any) -> None:
    EVENTS.append({"event": event, **fields})


class TimingGrid:
    """Delegates to ``grid``; stamps pushes, pulled replies and ``send_and_receive`` calls."""

    def __init__(self, grid: Grid, fast_poll_s: float = 0.0) -> None:
        self._grid = grid
        self.pull_calls = 0
        self.fast_poll_s = fast_poll_s

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        messages = list(messages)
        t0 = time.time()
        ids = list(self._grid.push_messages(messages))
        t1 = time.time()
        for msg, mid in zip(messages, ids, strict=False):
            stamp("push", t0=t0, t1=t1, message_id=mid, node_id=msg.metadata.dst_node_id,
                  group_id=msg.metadata.group_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        message_ids = list(message_ids)
        t0 = time.time()
        replies = list(self._grid.pull_messages(message_ids))
        t1 = time.time()
        self.pull_calls += 1
        for reply in replies:
            stamp("pull", t0=t0, t1=t1, message_id=reply.metadata.message_id,
                  reply_to=reply.metadata.reply_to_message_id,
                  node_id=reply.metadata.src_node_id, created_at=reply.metadata.created_at,
                  error=reply.has_error())
        return replies

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        messages = list(messages)
        t0 = time.time()
        if self.fast_poll_s > 0:
            replies = self._push_and_poll(messages, timeout)
        else:
            replies = list(type(self._grid).send_and_receive(self, messages, timeout=timeout))
        stamp("send_and_receive", t0=t0, t1=time.time(), sent=len(messages),
              received=len(replies), pull_calls=self.pull_calls)
        return replies


    def _push_and_poll(self, messages: list[Message], timeout: float | None) -> list[Message]:
        """Flower's send_and_receive with a ``fast_poll_s`` pull interval instead of 3 s."""
        pending = set(self.push_messages(messages))
        t_end = time.monotonic() + (timeout if timeout is not None else 3600.0)
        replies: list[Message] = []
        while pending and time.monotonic() < t_end:
            for reply in self.pull_messages(pending):
                pending.discard(reply.metadata.reply_to_message_id)
                replies.append(reply)
            if pending:
                time.sleep(self.fast_poll_s)
        return replies


def timed(cls: type) -> type:
    """``cls`` with its configure_train / aggregate_train / on_reply calls stamped."""

    class Timed(cls):
        def configure_train(self, server_round, arrays, config, grid):
            t0 = time.time()
            out = list(super().configure_train(server_round, arrays, config, grid))
            stamp("configure_train", round=server_round, t0=t0, t1=time.time(),
                  sent=len(out))
            return out

        def aggregate_train(self, server_round, replies):
            replies = list(replies)
            t0 = time.time()
            out = super().aggregate_train(server_round, replies)
            stamp("aggregate_train", round=server_round, t0=t0, t1=time.time(),
                  replies=len(replies))
            return out

        if hasattr(cls, "on_reply"):

            def on_reply(self, reply):
                t0 = time.time()
                super().on_reply(reply)
                stamp("on_reply", t0=t0, t1=time.time(), message_id=reply.metadata.message_id)

    Timed.__name__ = f"Timed{cls.__name__}"
    return Timed


def wait_for_nodes(grid: Grid, want: int, timeout: float = 120.0) -> None:
    t_end = time.monotonic() + timeout
    while len(list(grid.get_node_ids())) < want:
        if time.monotonic() > t_end:
            raise RuntimeError(f"fewer than {want} SuperNodes connected within {timeout} s")
        time.sleep(0.1)


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    mode, n = str(cfg["mode"]), int(cfg["num-clients"])
    stamp_dir = Path(str(cfg["stamp-dir"]))
    cpu0, t_main = time.process_time(), time.time()
    wait_for_nodes(grid, n)
    stamp("nodes_ready", t=time.time())
    d, k = int(cfg["features"]), int(cfg["classes"])
    initial = ArrayRecord({"w": Array(np.zeros((d, k), np.float32)),
                           "b": Array(np.zeros(k, np.float32))})
    common = {"fraction_evaluate": 0.0, "min_available_nodes": n, "min_train_nodes": n}
    tuned = mode == "coded-tuned"
    timing_grid = TimingGrid(grid, fast_poll_s=float(cfg["tuned-poll-s"]) if tuned else 0.0)
    grid_for_start: Any = timing_grid
    if mode in ("fedavg", "fedavg-torch"):  # the ClientApp reads app-imports-torch
        strategy = timed(FedAvg)(**common)
    elif mode in ("coded", "coded-tuned"):
        from fl_gradcode.flower import GradientCoding

        strategy = timed(GradientCoding)(
            FedAvg(**common), code=str(cfg["code"]), s=int(cfg["s"]), timing="wallclock",
            results_dir=str(stamp_dir / "results-coded"),
            straggler_timeout=float(cfg["straggler-timeout"]),
        )
        if tuned:  # the wrapper's grid, polling every tuned-poll-s instead of 5 ms
            grid_for_start = strategy.wrap_grid(timing_grid)
            grid_for_start.poll_interval = float(cfg["tuned-poll-s"])
    else:
        raise ValueError(f"mode={mode!r}; expected 'fedavg', 'fedavg-torch', 'coded' or "
                         "'coded-tuned'")
    strategy.start(grid=grid_for_start, initial_arrays=initial, num_rounds=int(cfg["num-rounds"]),
                   timeout=120.0, train_config=ConfigRecord({"lr": float(cfg["lr"])}))
    out = {"mode": mode, "n": n, "main_start": t_main, "main_end": time.time(),
           "serverapp_cpu_s": time.process_time() - cpu0, "pull_calls": timing_grid.pull_calls,
           "events": EVENTS}
    (stamp_dir / f"server-{mode}.json").write_text(json.dumps(out))
