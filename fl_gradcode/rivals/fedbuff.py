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
A second ``start`` is a run of its own: its clock starts at zero with no job in flight, and
``history`` and ``rounds.jsonl`` hold its steps only.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Mapping, Sequence
from logging import INFO, WARNING
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
from ..flower.option_values import check_latency
from ..flower.protocol import RejectedReply
from ..latency import DeviceTrace, LatencyModel, back_on, client_delay, failure_notice
from ..results import RoundRecorder

__all__ = ["FedBuff", "buffer_size", "staleness_weight"]

#: wallclock timing: a node whose job failed gets no job for this long, doubled with each
#: failure in a row, at most the cap (a node that errors at once is not re-sent work at once)
WALL_BACKOFF_S = 0.05
WALL_BACKOFF_MAX_S = 30.0


def buffer_size(fraction: float, concurrency: int) -> int:
    """FedBuff's ``K`` as a ``fraction`` of the clients in flight: the smallest whole number of
    updates at least that fraction (at least 1)."""
    return max(1, math.ceil(fraction * concurrency - 1e-9))


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
    timing : {"virtual", "wallclock"}
        ``virtual`` (default): the event simulation above, one job at a time through the
        grid. ``wallclock``: the same algorithm in real time on any Flower ``Grid``: up to
        ``concurrency`` messages are in flight at once (``push_messages``), replies are
        pulled as they come (``pull_messages``, every ``poll_interval`` seconds), and a job
        unanswered after ``start``'s ``timeout`` is given up (its node is free again). The
        clients' latencies are their own: a plain ClientApp cannot be made to sleep a
        simulated ``latency``, so FedBuff refuses one here (``ReplicatedFedBuff``'s clients,
        with the coding mod, sleep it), and refuses the modelled charges (``compute_cost_s``,
        ``upload_bandwidth``). The rows' ``virtual_s`` are then real seconds since the start.
    poll_interval : float
        Seconds between two pulls while no reply is waiting (wallclock timing; ``> 0``).
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
        timing: str = "virtual",
        poll_interval: float = 0.005,
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
        check_latency(latency)
        self._check_timing(timing, poll_interval, latency, compute_cost_s, upload_bandwidth)
        self.timing = timing
        self.poll_interval = float(poll_interval)
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

    #: whether the clients can be made to sleep a simulated latency in wallclock timing
    sleeps_latency = False

    def _check_timing(self, timing: str, poll_interval: float, latency: LatencyModel | None,
                      compute_cost_s: float, upload_bandwidth: float | None) -> None:
        if timing not in ("virtual", "wallclock"):
            raise ValueError(f"timing={timing!r}: expected 'virtual' or 'wallclock'")
        if not (math.isfinite(poll_interval) and poll_interval > 0):
            raise ValueError(f"poll_interval={poll_interval!r} must be > 0 seconds")
        if timing != "wallclock":
            return
        name = type(self).__name__
        if latency is not None and not self.sleeps_latency:
            raise ValueError(
                f"latency={latency!r} with timing='wallclock': {name} sends plain Flower "
                "messages, so its clients cannot be made to sleep a simulated latency; use "
                "latency=None (the clients' real latencies) or ReplicatedFedBuff (s=0 is "
                "FedBuff; its clients, with gradient_coding_mod, sleep the drawn delay)")
        if isinstance(latency, DeviceTrace):
            raise ValueError(
                "latency=DeviceTrace (FedScale devices) with timing='wallclock': a device's "
                "on/off periods are simulated in virtual timing only; use timing='virtual'")
        if compute_cost_s or upload_bandwidth is not None:
            raise ValueError(
                f"compute_cost_s={compute_cost_s!r}, upload_bandwidth={upload_bandwidth!r} "
                "with timing='wallclock': these charges are modelled in virtual timing only "
                "(in real time compute and uploads take what they take); leave them out")

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

    def _message(self, node: int, job: int, arrays: ArrayRecord, train_config: ConfigRecord,
                 regime_round: int) -> tuple[Message, int]:
        """The message of ``node``'s ``job``-th job (the current model, as ``arrays``) and
        the partition it computes (-1: the node's own, read from its reply);
        ``regime_round``: the federation's round (a drifting regime's)."""
        config = ConfigRecord({**dict(train_config), "server-round": job})
        msg = Message(RecordDict({self.arrayrecord_key: arrays,
                                  self.configrecord_key: config}),
                      message_type=MessageType.TRAIN, dst_node_id=node, group_id=str(job))
        return msg, -1

    def _read(self, reply: Message | None, node: int, job: int, part: int,
              sent: Mapping[str, np.ndarray]
              ) -> tuple[dict[str, np.ndarray] | None, int, int, float, int, int, str]:
        """One reply to ``node``'s ``job``-th job, whose model was ``sent``: ``(delta or None,
        the node's own partition id or -1, the partition the job computed or -1 (the node's
        own), compute s, examples, bytes up, reason)``."""
        delta, pid, compute, examples, reason = self._parse(reply, sent)
        nbytes = reply_bytes(reply) if delta is not None and reply is not None else 0
        return delta, pid, part, compute, examples, nbytes, reason

    def _job(self, grid: Grid, node: int, job: int, model: Mapping[str, np.ndarray],
             arrays: ArrayRecord, train_config: ConfigRecord, timeout: float,
             regime_round: int = 1
             ) -> tuple[dict[str, np.ndarray] | None, int, int, float, int, int, str]:
        """Send ``node`` its ``job``-th job and read the reply (virtual timing): as
        :meth:`_read`."""
        msg, part = self._message(node, job, arrays, train_config, regime_round)
        replies = list(grid.send_and_receive([msg], timeout=timeout))
        return self._read(replies[0] if replies else None, node, job, part, model)

    def wall_delay(self, pid: int, job: int, load: float, regime_round: int) -> float:
        """Wallclock timing: the simulated latency the client of partition ``pid`` sleeps
        in its ``job``-th job (0 without ``latency``; virtual timing: 0, the clock adds
        it)."""
        if self.timing != "wallclock" or self.latency is None:
            return 0.0
        return client_delay(self.latency, worker=pid, round_index=job, load=load,
                            seed=self.seed, regime_round=regime_round)

    def _nodes(self, grid: Grid, timeout: float) -> list[int]:
        """The nodes the run gives jobs to (every connected node, sorted)."""
        return sorted(grid.get_node_ids())

    def _settled(self, partition: int, delta: Mapping[str, np.ndarray] | None,
                 sent_version: int = 0) -> None:
        """A job of ``partition`` came back, now: its model delta (``None``: no usable
        update), computed from the model of server step ``sent_version``."""

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
        # each run's clock starts at zero and its history and rounds.jsonl are its own (a
        # strategy may be started again)
        self.now, self.history = 0.0, []
        if self.recorder is not None:
            self.recorder.restart()
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
        wall = self.timing == "wallclock"
        # wallclock: message id -> (node, job, partition, version sent, model sent, sent at)
        inflight: dict[str, tuple[int, int, int, int, dict[str, np.ndarray], float]] = {}
        pulled: list[dict[str, Any]] = []  # wallclock: replies read, not yet taken in
        failures: dict[int, int] = {}  # wallclock: a node's failed jobs in a row
        last_good = 0.0  # wallclock: when the last usable update came (or the start)
        t0 = time.monotonic()

        def arrays_of(values: Mapping[str, np.ndarray]) -> ArrayRecord:
            return ArrayRecord({k: Array(v.astype(dtypes[k])) for k, v in values.items()})

        def dispatch() -> bool:
            """Send the current model to an idle node whose device is on (``False``: none
            ever will be: the slot stays empty)."""
            nonlocal seq, waiting, sent
            idle = [n for n in nodes if n not in busy]
            ready = [n for n in idle if off_until.get(n, 0.0) <= self.now]
            if not ready and wall:  # every idle node is backing off: pull() fills it later
                return False
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
            busy.add(node)
            if wall:  # in flight until its reply is pulled (or given up)
                msg, part = self._message(node, jobs[node], arrays_of(model), train_config,
                                          regime)
                ids = [mid for mid in grid.push_messages([msg]) if mid]
                if ids:
                    inflight[ids[0]] = (node, jobs[node], part, version, dict(model),
                                        time.monotonic())
                else:  # the grid did not take it: settled now, without an update
                    pulled.append(event(node, (None, -1, part, 0.0, 0, 0,
                                               "message not accepted by the grid"), version,
                                        time.monotonic() - t0))
                return True
            read = self._job(grid, node, jobs[node], model, arrays_of(model), train_config,
                             timeout, regime)
            job = event(node, read, version)
            pid, part = job["pid"], job["part"]
            took = self.arrival(pid, jobs[node], job["compute"], job["bytes"], regime,
                                self.load(part))
            if math.isinf(took) and self.latency is not None:
                # the device is off: its update never comes; the server hears so (Flower's
                # NODE_UNAVAILABLE) when the latency model says, and the slot is free again
                took = failure_notice(self.latency, worker=pid, round_index=jobs[node],
                                      load=self.load(part), seed=self.seed, start_s=self.now,
                                      regime_round=regime)
                job.update(delta=None, compute=0.0, bytes=0, off=True,
                           reason="node unavailable (device off)")
            heapq.heappush(events, (self.now + took, seq, node, job))
            seq += 1
            return True

        def event(node: int, read: tuple, sent_version: int, at: float = 0.0
                  ) -> dict[str, Any]:
            """The arrival of one job from what :meth:`_read` made of its reply (``at``:
            wallclock timing's arrival, seconds since the start)."""
            delta, pid, part, compute, examples, nbytes, reason = read
            if pid < 0:  # no usable timing: the client's latency alone
                pid = partition_of.get(node, nodes.index(node))
            else:
                partition_of[node] = pid
            return {"node": node, "delta": delta, "pid": pid,
                    "part": pid if part < 0 else part, "version": sent_version,
                    "compute": compute, "examples": examples, "bytes": nbytes,
                    "reason": reason, "off": False, "at": at}

        def pull() -> tuple[float, int, int | None, dict] | None:
            """Wallclock timing: the next reply in flight to come (or job given up), each
            timed when it was pulled; ``None`` when no update was usable for ``timeout``
            seconds. While waiting, a node whose back-off has ended takes a free slot, and the
            pulls back off from ``poll_interval`` to 0.1 s."""
            nonlocal seq
            wait = self.poll_interval
            while not pulled:
                self.now = time.monotonic() - t0
                if self.now - last_good > timeout:
                    return None
                fill()
                got = list(grid.pull_messages(list(inflight))) if inflight else []
                for reply in got:
                    mid = reply.metadata.reply_to_message_id
                    if mid not in inflight:
                        continue  # a duplicate, or a job already given up
                    node, job, part, sent_version, sent_model, _ = inflight.pop(mid)
                    pulled.append(event(node, self._read(reply, node, job, part, sent_model),
                                        sent_version, time.monotonic() - t0))
                clock = time.monotonic()
                for mid, (node, _job, part, sent_version, _, at) in list(inflight.items()):
                    if clock - at > timeout:
                        del inflight[mid]
                        pulled.append(event(node, (None, -1, part, 0.0, 0, 0,
                                                   f"no reply within timeout={timeout:g} s"),
                                            sent_version, clock - t0))
                if not pulled:
                    time.sleep(wait)
                    wait = min(2 * wait, max(self.poll_interval, 0.1))
            seq += 1
            job = pulled.pop(0)
            return job["at"], seq, job["node"], job

        def fill() -> None:
            """Give every free slot work (or a wait for the first device back on)."""
            while len(busy) + waiting < slots and dispatch():
                pass

        fill()
        while version < num_rounds and (wall or events):
            if counters["rejected"] > 100 * max(slots, self.buffer_size):
                log(WARNING, "FedBuff: %d updates in a row could not be used (last: %s); "
                    "stopping after %d server steps", counters["rejected"], last_reason,
                    version)
                break
            arrival = pull() if wall else heapq.heappop(events)
            if arrival is None:
                log(WARNING, "FedBuff: no usable update for %g s (last: %s); stopping after %d "
                    "server steps", timeout, last_reason or "none arrived", version)
                break
            arrive, _, node, job = arrival
            self.now = max(self.now, arrive)
            if node is None:  # a waiting slot: a device is back on
                waiting -= 1
                fill()
                continue
            busy.discard(node)
            if job["off"]:  # no work before its device is on again (none, for other models)
                off_until[node] = self.now + back_on(self.latency, worker=job["pid"],
                                                     at_s=self.now)
            self._settled(job["part"], job["delta"], job["version"])
            counters["arrived"] += 1
            counters["compute_s"] += job["compute"]
            counters["bytes_up"] += job["bytes"]
            if job["delta"] is None:
                counters["rejected"] += 1
                last_reason = job["reason"]
                if wall:  # no job before a back-off that doubles with each failure in a row
                    failures[node] = failures.get(node, 0) + 1
                    off_until[node] = self.now + min(
                        WALL_BACKOFF_S * 2.0 ** min(failures[node] - 1, 20), WALL_BACKOFF_MAX_S)
            else:
                failures[node], last_good = 0, self.now
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
        if inflight:
            log(INFO, "FedBuff: %d jobs still in flight at the end; their replies are not "
                "read", len(inflight))
        if version < num_rounds and not (wall or events):
            log(WARNING, "FedBuff: no client can take work (every idle client's device is "
                "never on again); stopping after %d server steps", version)
        result.arrays = arrays_of(model)
        return result

    def _step_facts(self) -> dict[str, Any]:
        """A subclass's facts to record in each server step's row (none here)."""
        return {}

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
        row.update(self._step_facts())
        self.history.append(row)
        if self.recorder is not None:
            self.recorder.save_model({k: v.numpy() for k, v in arrays.items()})
            self.recorder.record(row)
