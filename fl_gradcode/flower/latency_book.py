"""What the server knows of its nodes' latencies: one estimator over every node ever sampled,
the work each node has not returned, late replies, and the ``latency_state`` file (a warm
start across runs). The estimator is :class:`~fl_gradcode.adaptive.LatencyEstimator`
(censored reply times: Cox, Oakes, "Analysis of Survival Data", Chapman & Hall 1984).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Mapping
from logging import INFO, WARNING
from typing import Any

from flwr.common.logger import log

from ..adaptive import LatencyEstimator

__all__ = ["LatencyBook", "read_latency_state"]


def read_latency_state(path: str | None) -> dict[str, Any] | None:
    """The latency observations saved at ``path`` (``None``: no path, or no file yet),
    validated now so that a bad file stops the run before its first round."""
    if path is None or not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            state = json.load(fh)
        LatencyEstimator.validate_state(state)
    except (OSError, ValueError, OverflowError, RecursionError) as exc:
        raise ValueError(f"latency_state={path!r} is not a file of latency observations "
                         f"written by GradientCoding: {exc}") from exc
    return state


class LatencyBook:
    """One latency estimator over every node ever sampled (node id -> its index), seen
    through each round's cohort, with what the server knows of each node's unfinished work.

    ``outstanding``: node -> its jobs not known to be done, each ``[sent at, units, reply
    arrival (None: not yet), deadline (when its work stops)]``. ``late``: replies after their
    round ended, ``(arrival, estimator round id, node index, elapsed, stopped)`` (stopped: work
    abandoned at the deadline, censored there, not observed). Node names in the
    ``latency_state`` file are data partitions ``"id/of"`` (stable across runs, unlike node
    ids); a file's clients wait at reserved indices until a node of that partition is seen.
    """

    def __init__(self, *, seed: int, latency_state: str | None, meta: Mapping[str, Any]) -> None:
        self.seed = int(seed)
        self.path = latency_state
        self.meta = dict(meta)
        self.estimator: LatencyEstimator | None = None
        self.node_index: dict[int, int] = {}
        self.keys: list[str] = []  # the estimator's client names
        self.unclaimed: dict[str, int] = {}  # the file's clients not yet claimed by a node
        self.file_clients = 0  # clients read from the file, until one is claimed
        self.late: list[tuple[float, int, int, float, bool]] = []
        self.outstanding: dict[int, list[list[Any]]] = {}
        self.warm_start = read_latency_state(latency_state)
        if self.warm_start is not None:
            here, there = self.meta, self.warm_start.get("meta", {})
            differ = {k: there[k] for k in here if k in there and there[k] != here[k]}
            if differ:
                log(WARNING, "latency_state=%r was written by a run with %s (this run: %s); "
                    "its times may not compare with this run's", latency_state, differ,
                    {k: here[k] for k in differ})

    def view(self, cohort: list[int], now: float, key_of: Callable[[int], str]) -> Any:
        """The estimator seen through ``cohort``, fed with the late and outstanding replies.
        Nodes seen for the first time join it with no record, or with their data partition's
        record from the ``latency_state`` file (``key_of``: a node's name there)."""
        if self.estimator is None and self.warm_start is not None:
            self._read_warm_start()
        while len(self.keys) < len(self.node_index):  # indices set from outside
            self.keys.append(f"index:{len(self.keys)}")
        for node in cohort:
            if node not in self.node_index:
                key = key_of(node)
                i = self.unclaimed.pop(key, None)
                if i is None:  # new (or a partition already claimed: a distinct name)
                    i = len(self.keys)
                    self.keys.append(key if key not in self.keys else f"{key}#{i}")
                self.node_index[node] = i
        if self.file_clients and len(self.unclaimed) == self.file_clients:
            self.file_clients = 0  # (warned once)
            log(WARNING, "none of the %d clients in %s is a data partition of this cohort "
                "(named 'id/num-partitions'): the file informs nothing yet",
                len(self.unclaimed), self.path)
        if self.estimator is None:
            self.estimator = LatencyEstimator(len(self.keys), seed=self.seed)
        estimator = self.estimator
        if len(self.keys) > estimator.n:
            estimator.grow(len(self.keys))
        for item in list(self.late):
            arrival, rid, index, elapsed, stopped = item
            if arrival <= now:
                if stopped:  # abandoned at the deadline: only that it took longer is known
                    estimator.observe_pending(rid, index, elapsed)
                else:
                    estimator.observe_late(rid, index, elapsed)
                self.late.remove(item)
            else:  # still outstanding: only that it has not arrived by now is known
                # (a job stopped before it could start began after its round: nothing yet)
                estimator.observe_pending(rid, index, max(now - (arrival - elapsed), 0.0))
        members = [self.node_index[node] for node in cohort]
        if members == list(range(estimator.n)):
            return estimator  # every node, in order: the estimator itself
        return estimator.view(members)

    def _read_warm_start(self) -> None:
        """Start the estimator from the ``latency_state`` file: its clients at reserved
        indices that nodes claim by data partition when first seen (in this cohort, a later
        one, or never: a record not claimed is kept and written back with the rest)."""
        state, self.warm_start = self.warm_start, None
        clients = list(state["clients"])
        if clients:
            self.estimator = LatencyEstimator(len(clients), seed=self.seed)
            remembered = self.estimator.import_rounds(state, clients)
            self.keys = clients
            self.unclaimed = {key: i for i, key in enumerate(clients)}
            self.file_clients = len(clients)
        else:
            remembered = 0
        log(INFO, "latency observations of %d rounds and %d clients read from %s",
            remembered, len(clients), self.path)

    def pending_work(self, node: int, now: float, unknown: float) -> tuple[float, float]:
        """``(seconds since its current job started, units not returned)`` of a busy node:
        jobs whose replies arrived by ``now`` are done; the oldest other job started when it
        was sent or when the reply before it arrived. A node with no record (work sent before
        a restart) counts as ``unknown`` units (a full share of the placement) started now."""
        jobs = self.outstanding.get(node, [])
        done = [job for job in jobs if job[2] is not None and job[2] <= now]
        left = [job for job in jobs if job[2] is None or job[2] > now]
        self.outstanding[node] = left
        if not left:
            return 0.0, float(unknown)
        start = max([left[0][0], *(job[2] for job in done)])
        return now - start, float(sum(job[1] for job in left))

    def add_job(self, node: int, sent_at: float, units: float, deadline: float, *,
                behind: bool) -> None:
        """Record a job sent to ``node``: after its unfinished ones when ``behind`` (queued),
        else as its only one."""
        jobs = self.outstanding.get(node, []) if behind else []
        self.outstanding[node] = [*jobs, [sent_at, units, None, deadline]]

    def save(self) -> None:
        """Write the estimator's rounds to ``latency_state`` (a temporary file, then renamed:
        a run killed mid-write leaves the previous file). Never ends a run: a failure warns."""
        if self.path is None or self.estimator is None:
            return
        tmp = f"{self.path}.{os.getpid()}.tmp"
        try:
            # clients without work in any remembered round carry no information: left out,
            # so that names never claimed again (foreign, rejoined) leave once they age out
            state = self.estimator.export_rounds(self.keys, self.meta, informative_only=True)
            parent = os.path.dirname(os.path.abspath(self.path))
            os.makedirs(parent, exist_ok=True)
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(state, fh)
            os.replace(tmp, self.path)
        except Exception as exc:  # the run does not need the file: warn, go on
            log(WARNING, "could not write latency observations to %s: %s", self.path, exc)
            with contextlib.suppress(OSError):
                os.remove(tmp)
