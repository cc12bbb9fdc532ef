"""Drop-stragglers: Flower's own FedAvg with a round deadline in virtual time (a baseline).

What Flower users do against stragglers today: sample the cohort, wait until a deadline,
average whatever arrived (FedAvg's example-weighted mean) and drop the rest. On non-IID data
this is biased towards the fast clients' data. :class:`DeadlineFedAvg` is a subclass of
``flwr.serverapp.strategy.FedAvg`` (Flower samples, sends and averages; none of the
gradient-coding wrapper is involved) whose ``aggregate_train`` keeps only the replies that
arrived by the deadline in virtual time, so that its accuracy-vs-time curve can be set beside
a coded run's on the same seeds and latency draws:

* a reply's virtual arrival is the client's measured compute (``compute-s``, reported by
  :func:`train_timing_mod` on the client) plus the delay the latency model samples for its
  partition id and round (:func:`fl_gradcode.latency.client_delay`, the draw the coded
  ServerApp uses), plus ``compute_cost_s * load`` and ``bytes / upload_bandwidth`` when set;
  ``load`` is the partition's size over the cohort's mean size (as for an uncoded client);
* the round ends at the deadline, or at the last arrival if every sampled client arrived
  before it; replies after it are dropped from the average; a client whose device is off
  (an infinite delay) never arrives, and counts as answered when the server hears so
  (:func:`fl_gradcode.latency.failure_notice`: Flower's ``NODE_UNAVAILABLE``);
* a dropped client is still busy with its late work: the next round's message waits for it,
  as a SuperNode runs messages one after the other (the same
  :class:`~fl_gradcode.flower.clock.VirtualClock` the coded runs use); with
  ``stop_dropped_work=True`` it abandons that work when the round that dropped it ends (as a
  coded run's ``stop_late_work`` stops a client's work at its deadline), and is free from
  then on, or from the end of its earlier job if that is later (the message expired
  before it could start).

Each round is written to ``rounds.jsonl`` (``results_dir``) with ``clients_used`` and
``stragglers`` as **partition ids**, ``decode`` ``"all"`` (every sampled client arrived),
``"partial"`` (some dropped) or ``"skipped"`` (none arrived: the model is kept), and
``arrivals_s``: each valid reply's own arrival (seconds after the round's start, before any
queueing), by partition id. A subclass ends rounds earlier through :meth:`round_complete`
(e.g. ``fl_gradcode.rivals.FirstK``: at the first ``K`` arrivals). A second ``start``
continues the federation: its clock goes on from the first run's end with the clients still
busy, and ``history`` and ``rounds.jsonl`` go on with its rounds (numbered from 1 again).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from logging import WARNING
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Result

from ..config.keys import KEYWORD_DEFAULTS
from ..latency import LatencyModel, client_delay, failure_notice
from ..results import RoundRecorder
from . import protocol
from .clock import (
    COMPUTE_COST_S,
    LATENCY,
    MEASURED_COMPUTE,
    UPLOAD_BANDWIDTH,
    RoundWindow,
    VirtualClock,
    job_start,
    timing_value,
)
from .finite import finite_number
from .option_values import check_latency, finite, whole
from .senders import answering_node

__all__ = ["TIMING_KEY", "DeadlineFedAvg", "check_charges", "reply_bytes", "reply_timing",
           "train_timing_mod", "virtual_arrival"]

#: ConfigRecord a plain train reply carries: ``partition-id`` and ``compute-s`` (Flower's
#: FedAvg checks only the ArrayRecord and the MetricRecord, so the app's metrics stay its own).
TIMING_KEY = "fl-gradcode-timing"


def train_timing_mod(msg: Message, context: Context, call_next: Callable) -> Message:
    """Client mod: time a plain (uncoded) train message's handler and report it.

    The reply gets a ConfigRecord :data:`TIMING_KEY` with the node's ``partition-id`` and the
    handler's ``compute-s``; the handler's random draws are seeded from ``(seed, round,
    partition)`` (the config's ``seed`` and ``server-round``), so a rerun draws the same, and
    the caller's RNG states (Python's, numpy's global, torch's if imported) are restored after,
    as the coding mod restores them: in one process the server's Flower samples its cohorts
    from Python's ``random``, which a client's seeding must not move.
    Gradient-coded messages and any other message pass through untouched.
    """
    if (msg.metadata.message_type != MessageType.TRAIN or not msg.has_content()
            or protocol.PROTOCOL_KEY in msg.content.config_records):
        return call_next(msg, context)
    from .client.seeding import partition_seed, reseeded

    pid = int(context.node_config.get("partition-id", -1))
    config = msg.content.config_records.get("config", ConfigRecord())
    seeded = "seed" in config and "server-round" in config
    seed = partition_seed(int(config["seed"]), int(config["server-round"]), pid) if seeded else None
    with reseeded(seed):
        t0 = time.perf_counter()
        reply = call_next(msg, context)
        compute_s = time.perf_counter() - t0
    if not reply.has_error():
        reply.content.config_records[TIMING_KEY] = ConfigRecord(
            {"partition-id": pid, "compute-s": float(compute_s)})
    return reply


def reply_timing(msg: Message, strategy: str, weighted_by_key: str,
                 lowest_partition: int | None = None) -> tuple[int, float, int]:
    """``(partition id, compute s, examples)`` of a valid train reply, from its
    :data:`TIMING_KEY` record and its metrics (``weighted_by_key``). A reply without the
    record is a setup error (``ValueError`` naming ``strategy``: the ClientApp lacks
    :func:`train_timing_mod`); a malformed value, or a partition id below
    ``lowest_partition``, raises :class:`~fl_gradcode.flower.protocol.RejectedReply` (the
    reply is dropped, the run goes on)."""
    if TIMING_KEY not in msg.content.config_records:
        raise ValueError(
            f"the train reply of node {msg.metadata.src_node_id} has no {TIMING_KEY!r} "
            f"record: {strategy} needs train_timing_mod in the ClientApp's mods "
            "(ClientApp(mods=[train_timing_mod, ...]))")
    timing = msg.content.config_records[TIMING_KEY]
    metrics = next(iter(msg.content.metric_records.values()), MetricRecord())
    try:
        return (whole("partition-id", timing["partition-id"], lowest_partition),
                finite("compute-s", timing["compute-s"]),
                int(finite(weighted_by_key, metrics.get(weighted_by_key, 0))))
    except (KeyError, TypeError, ValueError) as exc:
        raise protocol.RejectedReply(f"malformed reply: {exc}") from exc


def model_arrays(msg: Message, shapes: Mapping[str, tuple[int, ...]] | None,
                 dtypes: Mapping[str, np.dtype] | None = None) -> dict[str, np.ndarray]:
    """A train reply's model: its one ArrayRecord's arrays (views), the model's names and
    ``shapes`` (``None``: any), every value finite; else
    :class:`~fl_gradcode.flower.protocol.RejectedReply` naming what is wrong (Flower's FedAvg
    would end the run on the first two, broadcast a wrong shape into the model or spread a
    NaN)."""
    records = list(msg.content.array_records.values())
    if len(records) != 1:
        raise protocol.RejectedReply(f"malformed reply: {len(records)} ArrayRecords, expected 1")
    got = {name: protocol.array_view(a) for name, a in records[0].items()}
    if shapes is not None and set(got) != set(shapes):
        raise protocol.RejectedReply(f"malformed reply: arrays {sorted(got)}, expected the "
                                     f"model's {sorted(shapes)}")
    for name, value in got.items():
        if shapes is not None and value.shape != tuple(shapes[name]):
            raise protocol.RejectedReply(f"malformed reply: array {name!r} has shape "
                                         f"{value.shape}, the model's is {tuple(shapes[name])}")
        model = None if dtypes is None else np.dtype(dtypes[name])
        if value.dtype.kind not in "fiu" or (
                model is not None and not np.can_cast(model, value.dtype, "safe")):
            held = "real numbers" if model is None else f"the model's {model}"
            raise protocol.RejectedReply(f"malformed reply: array {name!r} has dtype "
                                         f"{value.dtype}, which cannot hold {held}")
        if not np.all(np.isfinite(value)):
            raise protocol.RejectedReply(f"malformed reply: array {name!r} is not finite")
    return got


def reply_layout(msg: Message, weighted_by_key: str
                 ) -> tuple[str, str, frozenset[tuple[str, int]]]:
    """What Flower's FedAvg requires to be the same in every reply it averages: the
    ArrayRecord's name, the MetricRecord's name, its keys and their lengths (a reply with
    one ArrayRecord, :func:`model_arrays`; the weight's own key aside: a reply without it
    weighs 0); a reply without exactly one MetricRecord raises
    :class:`~fl_gradcode.flower.protocol.RejectedReply`."""
    if len(msg.content.metric_records) != 1:
        raise protocol.RejectedReply(f"malformed reply: {len(msg.content.metric_records)} "
                                     "MetricRecords, expected 1")
    (arrays_name,) = msg.content.array_records.keys()
    ((metrics_name, metrics),) = msg.content.metric_records.items()
    return arrays_name, metrics_name, metric_layout(metrics, weighted_by_key)


def evaluate_replies(replies: Iterable[Message], weighted_by_key: str) -> list[Message]:
    """The evaluate replies Flower's metric average can take (the others are left out, where
    Flower's FedAvg would end the run): no error, one MetricRecord, a weight that is a finite
    number > 0, and the keys and lengths of most replies (ties: the earliest's)."""
    usable: list[tuple[Message, frozenset[tuple[str, int]]]] = []
    for msg in replies:
        if msg.has_error() or len(msg.content.metric_records) != 1:
            continue
        metrics = next(iter(msg.content.metric_records.values()))
        weight = metrics.get(weighted_by_key)
        if not (finite_number(weight) and weight > 0):
            continue
        usable.append((msg, metric_layout(metrics, weighted_by_key)))
    layouts = [layout for _, layout in usable]
    common = max(layouts, key=layouts.count) if layouts else None
    return [msg for msg, layout in usable if layout == common]


def metric_layout(metrics: MetricRecord, weighted_by_key: str) -> frozenset[tuple[str, int]]:
    """Each metric's key and length (-1: a number), the weight's own key aside: Flower's
    metric average adds the replies' values key by key, so a list beside a number, or lists
    of different lengths, cannot be averaged."""
    return frozenset((key, len(value) if isinstance(value, list) else -1)
                     for key, value in metrics.items() if key != weighted_by_key)


def reply_bytes(msg: Message) -> int:
    """Bytes of the values a reply's arrays hold (read from their headers: no copy)."""
    return int(sum(protocol.array_view(a).nbytes
                   for rec in msg.content.array_records.values() for a in rec.values()))


def check_charges(compute_cost_s: float, upload_bandwidth: float | None) -> None:
    """Refuse a compute charge that is not a finite number >= 0 or a non-positive upload
    bandwidth (by name)."""
    finite("compute_cost_s", compute_cost_s)
    if upload_bandwidth is not None and not upload_bandwidth > 0:
        raise ValueError(f"upload_bandwidth={upload_bandwidth!r} must be > 0 bytes/s or None")


def virtual_arrival(
    latency: LatencyModel | None, *, seed: int, pid: int, round_index: int, load: float,
    compute_s: float, nbytes: int, measured_compute: bool, compute_cost_s: float,
    upload_bandwidth: float | None, start_s: float | None = None,
    regime_round: int | None = None,
) -> float:
    """Virtual seconds from a job's start (virtual time ``start_s``) to its reply's arrival:
    the measured compute (if ``measured_compute``), ``compute_cost_s`` per unit of load, the
    latency model's delay for ``(pid, round_index, load)`` (``regime_round``: as
    :func:`~fl_gradcode.latency.client_delay`'s) and the upload of ``nbytes`` (the rivals' one
    clock)."""
    delay = 0.0 if latency is None else client_delay(
        latency, worker=pid, round_index=round_index, load=load, seed=seed, start_s=start_s,
        regime_round=regime_round)
    transfer = 0.0 if upload_bandwidth is None else nbytes / upload_bandwidth
    return (compute_s if measured_compute else 0.0) + compute_cost_s * load + delay + transfer


class DeadlineFedAvg(FedAvg):
    """Flower's FedAvg that averages only the replies that arrived by ``deadline`` (virtual s).

    Parameters
    ----------
    deadline : float
        Seconds after a round starts; later replies are dropped (``> 0``).
    latency : LatencyModel, optional
        The simulated delay model (``None``: no delay).
    seed : int
        Seed of the latency draws (``client_delay(..., seed=seed)``).
    partition_sizes : sequence of int, optional
        Examples per partition id (the load of a client); default: each reply's
        ``num-examples``.
    measured_compute : bool
        Add the client's measured ``compute-s`` to its arrival.
    compute_cost_s : float
        Modelled compute seconds per unit of load added to every arrival.
    upload_bandwidth : float, optional
        Bytes per second of a client's upload (``None``: instantaneous).
    results_dir : str, optional
        Where ``config.json``, ``rounds.jsonl`` and ``final_model.npz`` are written.
    stop_dropped_work : bool
        A client whose reply the round drops stops its work when the round ends, instead of
        finishing it while its next message waits (default ``False``: a SuperNode runs its
        messages one after the other to the end).
    run_config : mapping, optional
        Written to ``config.json``.
    **fedavg : Any
        FedAvg's own arguments (``fraction_train``, ``min_train_nodes``, ...).

    A reply Flower's FedAvg could not average is rejected (``rejected`` in its round's
    record), never passed on: an error, a malformed timing record or weight, arrays that are
    not the model's (names, shapes) or not finite, a layout other than most replies' (record
    names, metric keys), or a weight of no examples; the others are averaged. Such a reply
    takes no place among the first ``k`` of :class:`~fl_gradcode.rivals.FirstK`.

    The keywords it shares with ``GradientCoding`` (``latency``, ``seed`` and the timing
    charges) default to ``GradientCoding``'s, read from their one declaration (the ``seed``
    run-config key, :class:`~fl_gradcode.flower.options.TimingOptions`:
    :class:`~fl_gradcode.flower.clock.TimingDefault`).
    """

    def __init__(
        self,
        *,
        deadline: float,
        latency: LatencyModel | None = LATENCY,
        seed: int = KEYWORD_DEFAULTS["seed"],
        partition_sizes: Sequence[int] | None = None,
        measured_compute: bool = MEASURED_COMPUTE,
        compute_cost_s: float = COMPUTE_COST_S,
        upload_bandwidth: float | None = UPLOAD_BANDWIDTH,
        results_dir: str | None = None,
        run_config: Mapping[str, Any] | None = None,
        stop_dropped_work: bool = False,
        **fedavg: Any,
    ) -> None:
        super().__init__(**fedavg)
        if not isinstance(stop_dropped_work, bool):
            raise ValueError(f"stop_dropped_work={stop_dropped_work!r} must be True or False")
        self.stop_dropped_work = stop_dropped_work
        if not (isinstance(deadline, (int, float)) and np.isfinite(deadline) and deadline > 0):
            raise ValueError(f"deadline={deadline!r} must be a positive number of seconds")
        latency, measured_compute, compute_cost_s, upload_bandwidth = map(
            timing_value, (latency, measured_compute, compute_cost_s, upload_bandwidth))
        check_charges(compute_cost_s, upload_bandwidth)
        check_latency(latency)
        self.deadline = float(deadline)
        self.latency = latency
        self.seed = int(seed)
        self.partition_sizes = None if partition_sizes is None else [int(x)
                                                                     for x in partition_sizes]
        self.measured_compute = bool(measured_compute)
        self.compute_cost_s = float(compute_cost_s)
        self.upload_bandwidth = None if upload_bandwidth is None else float(upload_bandwidth)
        self.clock = VirtualClock(self.deadline)
        self.history: list[dict[str, Any]] = []
        self.recorder = (RoundRecorder(Path(results_dir), dict(run_config or {}))
                         if results_dir else None)
        self._sent: list[int] = []
        self._shapes: dict[str, tuple[int, ...]] | None = None  # set by configure_train
        self._dtypes: dict[str, np.dtype] | None = None
        self._messages: list[Message] = []
        self._rank: dict[int, int] = {}
        self._wall0 = 0.0
        self._pending: dict[str, Any] | None = None

    # ------------------------------------------------------------------ rounds
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> list[Message]:
        messages = list(super().configure_train(server_round, arrays, config, grid))
        self._sent = [m.metadata.dst_node_id for m in messages]
        self._messages = messages  # their ids (set when pushed) name a SuperLink's error
        # what a usable reply holds: the model's arrays, by name, shape and dtype
        self._shapes = {name: protocol.array_view(a).shape for name, a in arrays.items()}
        self._dtypes = {name: protocol.array_view(a).dtype for name, a in arrays.items()}
        # a node without a partition id (-1) is timed by its rank among the node ids
        self._rank = {node: i for i, node in enumerate(sorted(grid.get_node_ids()))}
        # a node still busy with late work starts this round's when it is done
        self.clock.start_round(queued={node: node for node in self._sent})
        self._wall0 = time.monotonic()
        return messages

    def aggregate_evaluate(self, server_round: int,
                           replies: Iterable[Message]) -> MetricRecord | None:
        """FedAvg's average of the evaluate replies it can take (:func:`evaluate_replies`)."""
        return super().aggregate_evaluate(server_round,
                                          evaluate_replies(replies, self.weighted_by_key))

    def _model_dtypes(self, arrays: ArrayRecord) -> ArrayRecord:
        """FedAvg's average in the model's float dtypes (Flower's takes the first reply's:
        a float64 reply first turned a float32 model into float64)."""
        dtypes = self._dtypes or {}
        if all(dtypes[name].kind != "f" or array.dtype == str(dtypes[name])
               for name, array in arrays.items()):
            return arrays
        return ArrayRecord({name: protocol.npy_array(array.numpy(), dtypes[name])
                            if dtypes[name].kind == "f" else array
                            for name, array in arrays.items()})

    def _node_of(self, msg: Message) -> int:
        """The node a reply answers for: its sender, or, for an error the SuperLink writes
        for a node that is gone (its sender is the SuperLink), the node of the message it
        answers."""
        return answering_node(msg, self._messages)

    def loads(self, timings: Mapping[int, tuple[int, float, int, int]]) -> dict[int, float]:
        """Each node's load: its partition's size over the cohort's mean (``timings``: node
        -> ``(partition id, compute s, num examples, reply bytes)``)."""
        sizes = {node: (self.partition_sizes[pid] if self.partition_sizes is not None
                        and 0 <= pid < len(self.partition_sizes) else examples)
                 for node, (pid, _, examples, _) in timings.items()}
        # the cohort's mean size (nodes that sent no valid reply count as the mean), taken
        # over the largest so that claimed sizes near float's range do not overflow it
        values = np.asarray([float(v) for v in sizes.values()])
        top = float(values.max()) if values.size else 0.0
        share = float(np.mean(values / top)) * top if top > 0 else 0.0
        return {node: size / share if share > 0 else 1.0 for node, size in sizes.items()}

    def arrivals(
        self, server_round: int, timings: Mapping[int, tuple[int, float, int, int]]
    ) -> dict[int, float]:
        """Virtual seconds after the round's start at which each node's reply arrives, from
        ``timings``: node -> ``(partition id, compute s, num examples, reply bytes)`` (any
        wait for the node's earlier work is added by the clock)."""
        loads = self.loads(timings)
        return {node: virtual_arrival(
                    self.latency, seed=self.seed, pid=pid, round_index=server_round,
                    load=loads[node], compute_s=compute, nbytes=nbytes,
                    measured_compute=self.measured_compute,
                    compute_cost_s=self.compute_cost_s, upload_bandwidth=self.upload_bandwidth,
                    start_s=job_start(self.clock, node))
                for node, (pid, compute, _, nbytes) in timings.items()}

    def failure_notices(
        self, server_round: int, timings: Mapping[int, tuple[int, float, int, int]],
        nodes: Iterable[int],
    ) -> dict[int, float]:
        """Seconds after each of ``nodes``' job start (the round's; the clock adds a queued
        node's wait) at which the server hears that it (its reply never arrives) is off, as
        the latency model says (Flower's ``NODE_UNAVAILABLE`` error); nodes it never hears of
        are left out."""
        nodes = list(nodes)
        if self.latency is None or not nodes:
            return {}
        loads = self.loads(timings)
        out = {node: failure_notice(self.latency, worker=timings[node][0],
                                    round_index=server_round, load=loads[node],
                                    seed=self.seed, start_s=job_start(self.clock, node))
               for node in nodes}
        return {node: t for node, t in out.items() if np.isfinite(t)}

    def _stop(self, late: Iterable[int], end: float) -> None:
        """The ``late`` nodes' work stops at the round's ``end`` (virtual time): each still
        busy then is busy until then, or until its earlier job ends if that is later."""
        clock = self.clock
        for node in late:
            if clock.busy_until.get(node, 0.0) > end:
                clock.busy_until[node] = max(end,
                                             clock.round_start + clock.backlog.get(node, 0.0))

    def round_complete(self, arrived: list[int]) -> bool:
        """Whether the round may end at once with the replies ``arrived`` (nodes, in arrival
        order, all by the deadline; only replies it can average, the others left out): never
        here (the round ends at the deadline or at the last
        arrival); a subclass closes it earlier (e.g. at the first ``K`` arrivals)."""
        return False

    def aggregate_train(
        self, server_round: int, replies: Any
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Keep the replies that arrived by the deadline (virtual time) and let FedAvg
        average them; record the round."""
        valid, errors, malformed = [], [], []
        timings: dict[int, tuple[int, float, int, int]] = {}
        weights: dict[int, float] = {}
        layouts: dict[int, tuple[str, str, frozenset[str]]] = {}
        seen: set[int] = set()
        answered: list[int] = []  # nodes whose answer held nothing usable
        for msg in replies:
            node = self._node_of(msg)
            if node in seen:  # a duplicate: the node's first reply counts, whatever it is
                continue
            seen.add(node)
            if msg.has_error():
                errors.append(msg)
                answered.append(node)
                continue
            try:  # a malformed reply is rejected (not passed on to FedAvg)
                pid, *rest = reply_timing(msg, "DeadlineFedAvg", self.weighted_by_key, -1)
                timing = (self._rank.get(node, -1) if pid == -1 else pid, *rest,
                          reply_bytes(msg))
                model_arrays(msg, self._shapes, self._dtypes)
                layouts[node] = reply_layout(msg, self.weighted_by_key)
                weights[node] = float(  # FedAvg's weight (a fraction too), finite
                    next(iter(msg.content.metric_records.values())).get(self.weighted_by_key, 0))
            except protocol.RejectedReply:
                malformed.append(msg)
                answered.append(node)
                continue
            timings[node] = timing
            valid.append(msg)
        # unusable, though timed like any reply: laid out otherwise than most replies (ties:
        # the earliest's; Flower's FedAvg ends the run on mixed layouts), or weighing no
        # examples (all such: a division by zero). Such a reply takes no place in the round
        # (first-k's K); on time it is rejected, late it is a straggler like any other
        values = list(layouts.values())
        common = max(values, key=values.count) if values else None
        unusable = {n for n in timings if not weights[n] > 0 or layouts[n] != common}
        # an infinite delay (a device off, e.g. latency=fedscale) never arrives: no reply;
        # the server hears of it when the latency model says (Flower's NODE_UNAVAILABLE)
        timed = self.arrivals(server_round, timings)
        arrivals = {n: t for n, t in timed.items() if np.isfinite(t)}
        failures = self.failure_notices(server_round, timings, timed.keys() - arrivals.keys())
        refused = [*errors, *malformed]  # answered, nothing usable
        window = self.clock.window(
            arrivals, lambda arrived: self.round_complete([n for n in arrived
                                                            if n not in unusable]),
            len(self._sent) - len(refused), failures)
        if not valid and len(refused) >= len(self._sent):  # every answer in, none usable
            window = RoundWindow([], self.clock.round_start)
        # a node heard of is free from then on (its message errored), as if it had replied
        self.clock.finish_round(self._sent, {**arrivals, **failures}, window.end,
                                answered=answered)
        if self.stop_dropped_work:  # and nodes not heard of by the round's end
            self._stop([*window.late, *failures], window.end)
        used = set(window.used)
        rejected = used & unusable  # on time but unusable (late: a straggler)
        used -= rejected
        kept = [m for m in valid if m.metadata.src_node_id in used]
        if kept and not math.isfinite(sum(weights[n] for n in used)):
            # FedAvg would divide by an infinite total (a model of zeros) or overflow: the
            # round is skipped and the model kept, as a coded round whose total overflows
            log(WARNING, "round %d: the replies' %s total overflows (partitions %s claim the "
                "most); the round is skipped and the model kept", server_round,
                self.weighted_by_key, sorted(timings[n][0] for n in sorted(
                    used, key=lambda n: -weights[n])[:3]))
            kept, used = [], set()
        arrays, metrics = super().aggregate_train(server_round, kept + errors)
        if arrays is not None and self._dtypes is not None:
            arrays = self._model_dtypes(arrays)
        pid = {node: t[0] for node, t in timings.items()}
        decode = "skipped" if not kept else ("all" if len(kept) == len(self._sent)
                                             else "partial")
        self._pending = {
            "round": server_round,
            "decode": decode,
            "clients_used": sorted(pid[n] for n in used),
            "stragglers": sorted(pid[n] for n in [*window.late, *(pid.keys() - arrivals.keys())]),
            "busy": sorted(pid[n] for n in pid if self.clock.backlog.get(n, 0.0) > 0),
            "late_dropped": len(window.late),
            "rejected": len(refused) + len(rejected),
            "decode_error": None,
            "num_examples": sum(timings[n][2] for n in used),
            "bytes_up": sum(t[3] for t in timings.values()),
            "compute_s": sum(t[1] for t in timings.values()),
            # each valid reply's own arrival (s after the round's start, before any queueing)
            "arrivals_s": {str(pid[n]): float(t) for n, t in sorted(arrivals.items())},
            "virtual_s": float(self.clock.now),
            "round_virtual_s": float(window.end - self.clock.round_start),
            "round_deadline_s": self.deadline,
            "wall_s": time.monotonic() - self._wall0,
            "accuracy": None,
            "loss": None,
        }
        if arrays is not None and self.recorder is not None:
            self.recorder.save_model({k: v.numpy() for k, v in arrays.items()})
        if not self._evaluating:
            self._flush(None)
        return arrays, metrics

    def _flush(self, evaluation: MetricRecord | None) -> None:
        row, self._pending = self._pending, None
        if row is None:
            return
        for key in ("accuracy", "loss"):
            if evaluation is not None and key in evaluation:
                row[key] = float(evaluation[key])
        self.history.append(row)
        if self.recorder is not None:
            self.recorder.record(row)

    _evaluating = False

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
        """Flower's ``start``; each round's row is written after ``evaluate_fn`` (if any)
        adds its accuracy and loss."""
        wrapped = None
        if evaluate_fn is not None:
            def wrapped(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
                result = evaluate_fn(server_round, arrays)
                if server_round > 0:
                    self._flush(result)
                return result

        self._evaluating = evaluate_fn is not None
        try:
            return super().start(grid=grid, initial_arrays=initial_arrays,
                                 num_rounds=num_rounds, timeout=timeout,
                                 train_config=train_config, evaluate_config=evaluate_config,
                                 evaluate_fn=wrapped)
        finally:
            self._evaluating = False
            self._flush(None)
