"""FedBuff: buffered asynchronous aggregation, simulated on the coded runs' virtual clock.

Nguyen et al., *Federated Learning with Buffered Asynchronous Aggregation*, AISTATS 2022
(https://arxiv.org/abs/2106.06639), Algorithm 1. There are no rounds: up to ``concurrency``
clients train at any time, each on the global model current when it was sent; a finished
update ``Δ_i = θ_i − θ_sent`` with staleness ``τ_i`` (server steps applied since its model was
sent) is added to a buffer with weight ``(1 + τ_i)^(−1/2)``; after ``buffer_size`` (``K``)
updates the server applies ``θ ← θ + η_g · (Σ_i w_i Δ_i) / K`` and every idle slot is given
to a client drawn uniformly at random (seeded) among the idle ones, with the new model.

In virtual time it is an event simulation: a client's update arrives at its start plus its
compute plus the latency drawn for it (``client_delay(latency, worker=partition id,
round_index=j, load, seed)`` for the client's ``j``-th job, the draw of round ``j`` in a
synchronous run), exactly as the coded runs' arrivals, except that a regime that drifts at
a round (:class:`~fl_gradcode.latency.Drift`) changes when the federation reaches that round:
after ``(round - 1) * concurrency`` jobs sent, as many as a synchronous run of cohorts of
``concurrency`` has sent by then, not at each client's own ``round``-th job (at 1,000 clients
and 100 in flight, a client does only a few jobs in a run and would never see the change);
a client's compute is run (through the
grid, in this process) when it is sent its model. A client whose device is off (an infinite
delay; FedScale devices are read at the job's virtual start) sends no update: its slot is
free again when the server hears so (:func:`~fl_gradcode.latency.failure_notice`), and the
client is sent no work before its device is on again (:func:`~fl_gradcode.latency.back_on`;
with every idle client's device off, the slot waits for the first back on). Each server step
is one row of ``history`` (and ``rounds.jsonl``), with ``virtual_s`` the time it was applied.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Mapping, Sequence
from logging import WARNING
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Result

from ..flower.deadline import (
    check_charges,
    model_arrays,
    reply_bytes,
    reply_timing,
    virtual_arrival,
)
from ..flower.protocol import RejectedReply
from ..latency import LatencyModel, back_on, failure_notice
from ..results import RoundRecorder

__all__ = ["FedBuff", "staleness_weight"]


def staleness_weight(tau: int, exponent: float = 0.5) -> float:
    """FedBuff's weight of an update ``tau`` server steps stale: ``(1 + tau)^-exponent``
    (``1/sqrt(1 + tau)`` by default)."""
    if tau < 0:
        raise ValueError(f"staleness tau={tau!r} must be >= 0")
    return float((1.0 + tau) ** -exponent)


class FedBuff(FedAvg):
    """Buffered asynchronous aggregation (Nguyen et al., AISTATS 2022) as a Flower strategy.

    ``start(..., num_rounds=R)`` applies ``R`` server steps of ``buffer_size`` updates each.

    Parameters
    ----------
    buffer_size : int
        ``K``: updates per server step (``>= 1``).
    concurrency : int, optional
        Clients training at any time (default: every connected node; at most that many).
    server_lr : float
        ``η_g`` (``> 0``).
    staleness_exponent : float
        Weight ``(1 + τ)^-exponent`` (``0.5``: the paper's ``1/sqrt(1 + τ)``; 0: unweighted).
    latency, seed, partition_sizes, measured_compute, compute_cost_s, upload_bandwidth,
    results_dir, run_config :
        As :class:`~fl_gradcode.flower.deadline.DeadlineFedAvg`'s; ``seed`` also draws which
        idle client is sent the model next. The load of a client is its partition's size over
        the mean partition size (1 without ``partition_sizes``).
    **fedavg : Any
        FedAvg's own arguments (``arrayrecord_key``, ``configrecord_key``, ...).
    """

    def __init__(
        self,
        *,
        buffer_size: int,
        concurrency: int | None = None,
        server_lr: float = 1.0,
        staleness_exponent: float = 0.5,
        latency: LatencyModel | None = None,
        seed: int = 0,
        partition_sizes: Sequence[int] | None = None,
        measured_compute: bool = True,
        compute_cost_s: float = 0.0,
        upload_bandwidth: float | None = None,
        results_dir: str | None = None,
        run_config: Mapping[str, Any] | None = None,
        **fedavg: Any,
    ) -> None:
        ignored = [name for name in ("fraction_train", "min_train_nodes", "min_evaluate_nodes",
                                     "train_metrics_aggr_fn", "evaluate_metrics_aggr_fn")
                   if name in fedavg]
        ignored += [name for name, honoured in (("fraction_evaluate", 0.0),
                                                ("min_available_nodes", 1))
                    if name in fedavg and fedavg[name] != honoured]
        if ignored:
            raise ValueError(
                f"FedBuff does not read {ignored[0]}={fedavg[ignored[0]]!r}: it keeps "
                "`concurrency` jobs in flight on the nodes connected at its start and "
                "evaluates on the server only (evaluate_fn); leave it out")
        super().__init__(**fedavg)
        self.fraction_evaluate = 0.0  # no client evaluation (FedAvg's default would say 1.0)
        self._dtypes: dict[str, np.dtype] | None = None  # the model's, set by start
        if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or buffer_size < 1:
            raise ValueError(f"buffer_size={buffer_size!r} must be an integer >= 1")
        if concurrency is not None and (isinstance(concurrency, bool)
                                        or not isinstance(concurrency, int) or concurrency < 1):
            raise ValueError(f"concurrency={concurrency!r} must be an integer >= 1 or None")
        if not (math.isfinite(server_lr) and server_lr > 0):
            raise ValueError(f"server_lr={server_lr!r} must be > 0")
        if not (math.isfinite(staleness_exponent) and staleness_exponent >= 0):
            raise ValueError(f"staleness_exponent={staleness_exponent!r} must be >= 0")
        check_charges(compute_cost_s, upload_bandwidth)
        self.buffer_size = buffer_size
        self.concurrency = concurrency
        self.server_lr = float(server_lr)
        self.staleness_exponent = float(staleness_exponent)
        self.latency = latency
        self.seed = int(seed)
        self.partition_sizes = None if partition_sizes is None else [int(x)
                                                                     for x in partition_sizes]
        self.measured_compute = bool(measured_compute)
        self.compute_cost_s = float(compute_cost_s)
        self.upload_bandwidth = None if upload_bandwidth is None else float(upload_bandwidth)
        self.history: list[dict[str, Any]] = []
        self.recorder = (RoundRecorder(Path(results_dir), dict(run_config or {}))
                         if results_dir else None)
        self.now = 0.0  # virtual seconds

    # ------------------------------------------------------------------ one client's job
    def load(self, pid: int) -> float:
        """A client's load: its partition's size over the mean (1 when unknown)."""
        sizes = self.partition_sizes
        if sizes is None or not 0 <= pid < len(sizes) or not np.mean(sizes) > 0:
            return 1.0
        return sizes[pid] / float(np.mean(sizes))

    def arrival(self, pid: int, job: int, compute_s: float, nbytes: int,
                regime_round: int | None = None, load: float | None = None) -> float:
        """Seconds from a job's start (now) to its update's arrival (compute, latency,
        upload) on the device of partition ``pid``; ``regime_round``: the federation's round
        (a drifting regime's); ``load``: the job's (default: ``pid``'s partition's)."""
        return virtual_arrival(
            self.latency, seed=self.seed, pid=pid, round_index=job,
            load=self.load(pid) if load is None else load,
            compute_s=compute_s, nbytes=nbytes, measured_compute=self.measured_compute,
            compute_cost_s=self.compute_cost_s, upload_bandwidth=self.upload_bandwidth,
            start_s=self.now, regime_round=regime_round)

    def _parse(self, reply: Message | None, sent: Mapping[str, np.ndarray]
               ) -> tuple[dict[str, np.ndarray] | None, int, float, int, str]:
        """``(delta or None, partition id, compute s, examples, reason)`` of one reply; a
        reply that cannot be used is ``None`` with the reason (never raised: one bad reply
        does not stop the run), except a reply without the timing record (a setup error)."""
        if reply is None:
            return None, -1, 0.0, 0, "no reply"
        if reply.has_error():
            return None, -1, 0.0, 0, f"error reply: {reply.error.reason}"
        try:  # partition id -1: not in the node config (the node's rank times it)
            pid, compute, examples = reply_timing(reply, "FedBuff", self.weighted_by_key, -1)
        except RejectedReply as exc:
            return None, -1, 0.0, 0, str(exc)
        try:
            arrays = model_arrays(reply, {name: value.shape for name, value in sent.items()},
                                  self._dtypes)
        except RejectedReply as exc:
            return None, pid, compute, examples, str(exc)
        delta = {name: np.asarray(value, dtype=np.float64) - sent[name]
                 for name, value in arrays.items()}
        return delta, pid, compute, examples, ""

    def _job(self, grid: Grid, node: int, job: int, model: Mapping[str, np.ndarray],
             arrays: ArrayRecord, train_config: ConfigRecord, timeout: float
             ) -> tuple[dict[str, np.ndarray] | None, int, int, float, int, int, str]:
        """Send ``node`` its ``job``-th job (the current ``model``, as ``arrays``) and read
        the reply: ``(delta or None, the node's own partition id or -1, the partition the
        job computed or -1 (the node's own), compute s, examples, bytes up, reason)``."""
        config = ConfigRecord({**dict(train_config), "server-round": job})
        msg = Message(RecordDict({self.arrayrecord_key: arrays,
                                  self.configrecord_key: config}),
                      message_type=MessageType.TRAIN, dst_node_id=node, group_id=str(job))
        replies = list(grid.send_and_receive([msg], timeout=timeout))
        reply = replies[0] if replies else None
        delta, pid, compute, examples, reason = self._parse(reply, model)
        nbytes = reply_bytes(reply) if delta is not None and reply is not None else 0
        return delta, pid, -1, compute, examples, nbytes, reason

    def _nodes(self, grid: Grid, timeout: float) -> list[int]:
        """The nodes the run gives jobs to (every connected node, sorted)."""
        return sorted(grid.get_node_ids())

    def _settled(self, partition: int, delta: Mapping[str, np.ndarray] | None) -> None:
        """A job of ``partition`` came back, now: its model delta (``None``: no usable
        update)."""

    # ------------------------------------------------------------------ the run
    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
    ) -> Result:
        """Run ``num_rounds`` server steps; ``evaluate_fn(step, arrays)`` after each (and at
        step 0). Returns Flower's ``Result`` (the final arrays, the server-side metrics)."""
        if evaluate_config:
            raise ValueError("FedBuff sends no evaluate message (it evaluates on the server "
                             "only, evaluate_fn): evaluate_config would not be read")
        train_config = ConfigRecord() if train_config is None else train_config
        result = Result()
        dtypes = {k: v.numpy().dtype for k, v in initial_arrays.items()}
        self._dtypes = dtypes
        model = {k: np.asarray(v.numpy(), dtype=np.float64) for k, v in initial_arrays.items()}
        if evaluate_fn is not None:
            res = evaluate_fn(0, initial_arrays)
            if res is not None:
                result.evaluate_metrics_serverapp[0] = res
        nodes = self._nodes(grid, timeout)
        if not nodes:
            raise ValueError("FedBuff: no node is connected")
        slots = min(self.concurrency or len(nodes), len(nodes))
        rng = np.random.default_rng([self.seed, 0xFEDB])
        jobs = dict.fromkeys(nodes, 0)
        # each node's partition, from its valid replies; before one, its rank among the ids
        partition_of: dict[int, int] = {}
        sent = 0  # jobs dispatched: the federation is in round sent // slots + 1
        busy: set[int] = set()
        off_until: dict[int, float] = {}  # node reported off -> when its device is on again
        waiting = 0  # slots with no node on to take them, until the first is back on
        events: list[tuple[float, int, int | None, dict]] = []  # (arrival, seq, node, job)
        version, seq = 0, 0
        buffer: dict[str, np.ndarray] = {}
        used: list[dict[str, Any]] = []
        counters = {"bytes_up": 0, "compute_s": 0.0, "rejected": 0, "arrived": 0}
        step_start, wall0 = 0.0, time.monotonic()
        last_reason = ""

        def arrays_of(values: Mapping[str, np.ndarray]) -> ArrayRecord:
            return ArrayRecord({k: Array(v.astype(dtypes[k])) for k, v in values.items()})

        def dispatch() -> bool:
            """Send the current model to an idle node whose device is on (``False``: none
            ever will be: the slot stays empty)."""
            nonlocal seq, waiting, sent
            idle = [n for n in nodes if n not in busy]
            ready = [n for n in idle if off_until.get(n, 0.0) <= self.now]
            if not ready:  # every idle node's device is off: the slot waits for the first
                back = min(off_until[n] for n in idle)
                if math.isinf(back):
                    return False
                heapq.heappush(events, (back, seq, None, {}))
                seq, waiting = seq + 1, waiting + 1
                return True
            idle = ready
            node = idle[int(rng.integers(len(idle)))]
            jobs[node] += 1
            regime = sent // slots + 1  # as a synchronous run of cohorts of `slots`
            sent += 1
            delta, pid, part, compute, examples, nbytes, reason = self._job(
                grid, node, jobs[node], model, arrays_of(model), train_config, timeout)
            if pid < 0:  # no usable timing: the client's latency alone
                pid = partition_of.get(node, nodes.index(node))
            else:
                partition_of[node] = pid
            part = pid if part < 0 else part
            load = self.load(part)
            took = self.arrival(pid, jobs[node], compute, nbytes, regime, load)
            off = math.isinf(took) and self.latency is not None
            if off:
                # the device is off: its update never comes; the server hears so (Flower's
                # NODE_UNAVAILABLE) when the latency model says, and the slot is free again
                took = failure_notice(self.latency, worker=pid, round_index=jobs[node],
                                      load=load, seed=self.seed, start_s=self.now,
                                      regime_round=regime)
                delta, compute, nbytes, reason = None, 0.0, 0, "node unavailable (device off)"
            arrive = self.now + took
            busy.add(node)
            heapq.heappush(events, (arrive, seq, node, {
                "delta": delta, "pid": pid, "part": part, "version": version,
                "compute": compute, "examples": examples, "bytes": nbytes, "reason": reason,
                "off": off}))
            seq += 1
            return True

        def fill() -> None:
            """Give every free slot work (or a wait for the first device back on)."""
            while len(busy) + waiting < slots and dispatch():
                pass

        fill()
        while version < num_rounds and events:
            if counters["rejected"] > 100 * max(slots, self.buffer_size):
                log(WARNING, "FedBuff: %d updates in a row could not be used (last: %s); "
                    "stopping after %d server steps", counters["rejected"], last_reason,
                    version)
                break
            arrive, _, node, job = heapq.heappop(events)
            self.now = max(self.now, arrive)
            if node is None:  # a waiting slot: a device is back on
                waiting -= 1
                fill()
                continue
            busy.discard(node)
            if job["off"]:  # no work before its device is on again (none, for other models)
                off_until[node] = self.now + back_on(self.latency, worker=job["pid"],
                                                     at_s=self.now)
            self._settled(job["part"], job["delta"])
            counters["arrived"] += 1
            counters["compute_s"] += job["compute"]
            counters["bytes_up"] += job["bytes"]
            if job["delta"] is None:
                counters["rejected"] += 1
                last_reason = job["reason"]
            else:
                tau = version - job["version"]
                weight = staleness_weight(tau, self.staleness_exponent)
                for name, value in job["delta"].items():
                    buffer[name] = buffer.get(name, 0.0) + weight * value
                used.append({"pid": job["part"], "node_pid": job["pid"], "staleness": tau,
                             "examples": job["examples"]})
            if len(used) == self.buffer_size:
                for name in model:
                    model[name] = model[name] + self.server_lr * buffer[name] / self.buffer_size
                version += 1
                arrays = arrays_of(model)
                evaluation = evaluate_fn(version, arrays) if evaluate_fn is not None else None
                if evaluation is not None:
                    result.evaluate_metrics_serverapp[version] = evaluation
                self._record(version, used, counters, step_start, wall0, evaluation, arrays)
                buffer, used = {}, []
                counters = dict.fromkeys(counters, 0)
                counters["compute_s"] = 0.0
                step_start, wall0 = self.now, time.monotonic()
            fill()
        if version < num_rounds and not events:
            log(WARNING, "FedBuff: no client can take work (every idle client's device is "
                "never on again); stopping after %d server steps", version)
        result.arrays = arrays_of(model)
        return result

    def _record(self, version: int, used: list[dict[str, Any]], counters: Mapping[str, Any],
                step_start: float, wall0: float, evaluation: MetricRecord | None,
                arrays: ArrayRecord) -> None:
        row: dict[str, Any] = {
            "round": version,
            "decode": "buffered",
            "clients_used": [u["pid"] for u in used],
            "computed_by": [u["node_pid"] for u in used],
            "staleness": [u["staleness"] for u in used],
            "stragglers": [],
            "late_dropped": 0,
            "rejected": int(counters["rejected"]),
            "decode_error": None,
            "num_examples": int(sum(u["examples"] for u in used)),
            "updates_arrived": int(counters["arrived"]),
            "bytes_up": int(counters["bytes_up"]),
            "compute_s": float(counters["compute_s"]),
            "virtual_s": float(self.now),
            "round_virtual_s": float(self.now - step_start),
            "round_deadline_s": None,
            "wall_s": time.monotonic() - wall0,
            "accuracy": None,
            "loss": None,
        }
        for key in ("accuracy", "loss"):
            if evaluation is not None and key in evaluation:
                row[key] = float(evaluation[key])
        self.history.append(row)
        if self.recorder is not None:
            self.recorder.save_model({k: v.numpy() for k, v in arrays.items()})
            self.recorder.record(row)
