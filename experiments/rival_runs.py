"""One run of one method of ``python -m experiments.compare``, in process and in virtual time.

Every method runs the main job's ClientApp (``clients.app.make_client_app``: the real train
handler, ``train_timing_mod`` and the coding mod) on an in-process grid (no Ray, no
``flwr run``), with the main job's run config (``fl_gradcode/config/keys.py``) for data,
model, latency draws and seeds, and each round's cohort drawn from the seed
(:func:`fl_gradcode.flower.seeded_sampling`):

* ``auto`` and ``CODE:s``: the main job's coded strategy (``server.app.build``) with ``s=auto``
  or the fixed exact code ``CODE`` tolerating ``s``;
* ``wait-for-all``, ``deadline`` (a given deadline), ``first-k``, ``fedbuff``: the public
  rivals of :mod:`fl_gradcode.rivals` over the same initial model, evaluation and train config
  (``server.app.build_rival``).

A counting mod inside the coding mod sees every partition a client computes, late and wasted
work included, so ``client_compute_s`` is the compute the virtual clock charges for all of them:
the measured seconds when ``virtual-compute=measured``, plus ``partition-cost-s`` times the
partition's size over the mean partition size (0 where neither is charged, as under
``latency=fedscale``, whose devices' compute is inside their trace latency:
``partitions_computed`` counts that work). Coded runs share a partition's update between
its replicas within a round (``make_gradient_coding_mod(cache)``: they would compute it
bit-identically, and each replica is still charged its computation); :class:`SharedUpdates`
counts every replica's use of a shared update as that replica's computation, so the
accounting is the same as without sharing.

:func:`start_coded` and :func:`start_rival` run any run config this way (the one place that
builds and runs the rivals): :func:`run_coded` / :func:`run_rival` for a cell of
``experiments.compare``, and the time-to-accuracy scripts (``time_to_accuracy``,
``first_hour``, ``sampled_cohorts``, ``bandwidth_limited``, ``latency_vs_s``) as settings of
this harness.
"""

from __future__ import annotations

import hashlib
import json
import math
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Context, Message, MessageType

from experiments.cell import Cell, stop_rule
from fl_gradcode.config import merge_config
from fl_gradcode.data import run_partitions
from fl_gradcode.flower import make_gradient_coding_mod, seeded_sampling
from fl_gradcode.flower.asynchronous import auto_keywords
from fl_gradcode.rivals import (
    DeadlineFedAvg,
    FedBuff,
    FirstK,
    WaitForAll,
    train_timing_mod,
)

#: Methods that are not a fixed code (``CODE:s``) and need no deadline of their own.
RIVALS = ("wait-for-all", "first-k", "fedbuff", "fedbuff-replicated", "fedbuff-auto")
#: Every method's name but the fixed codes (``CODE:s``).
METHOD_NAMES = ("auto", "auto-approximate", "wait-for-all", "deadline", "deadline-best",
                "first-k", "fedbuff", "fedbuff-replicated", "fedbuff-auto")
#: The methods that run FedBuff's rules (its K and server lr, tuned where the cell says).
FEDBUFF_METHODS = ("fedbuff", "fedbuff-replicated", "fedbuff-auto")


@dataclass
class ComputeCounter:
    """A client mod (innermost) recording ``(partition id, seconds)`` of every train call."""

    calls: list[tuple[int, float]] = field(default_factory=list)

    def __call__(self, msg: Message, context: Context, call_next: Any) -> Message:
        if msg.metadata.message_type != MessageType.TRAIN:
            return call_next(msg, context)
        t0 = time.perf_counter()
        reply = call_next(msg, context)
        self.calls.append((int(context.node_config.get("partition-id", -1)),
                           time.perf_counter() - t0))
        return reply


class SharedUpdates(dict):
    """The coding mod's per-round cache of partition updates, counting each replica's use of
    a shared update into ``counter`` (a computation the counting mod did not see)."""

    def __init__(self, counter: ComputeCounter) -> None:
        super().__init__()
        self.counter = counter

    def get(self, key: Any, default: Any = None) -> Any:
        result = super().get(key, default)
        if result is not None and isinstance(key, tuple) and hasattr(result, "compute_s"):
            self.counter.calls.append((int(key[0]), float(result.compute_s)))
        return result


def _client_app(counter: ComputeCounter, share: bool = False) -> Any:
    """The main job's ClientApp with ``counter`` innermost; ``share``: replicas share each
    round's partition updates (:class:`SharedUpdates`)."""
    from clients.app import fault_injection_mod, make_client_app

    cache = SharedUpdates(counter) if share else None
    return make_client_app([train_timing_mod, fault_injection_mod,
                            make_gradient_coding_mod(cache), counter])


def _summary(method: str, seed: int, rows: list[dict[str, Any]], cell: Cell,
             cfg: Mapping[str, Any], counter: ComputeCounter, wall_s: float,
             **extra: Any) -> dict[str, Any]:
    """One run's record of the JSON (``runs``)."""
    _, index = run_partitions(cfg, cell.n)
    sizes = np.array([len(p) for p in index], dtype=np.float64)
    mean = float(sizes.mean()) if sizes.size and sizes.mean() > 0 else 1.0
    measured = str(cfg["virtual-compute"]) == "measured"
    cost = float(cfg["partition-cost-s"])
    compute = sum((seconds if measured else 0.0)
                  + cost * (sizes[pid] / mean if 0 <= pid < sizes.size else 1.0)
                  for pid, seconds in counter.calls)
    reached = [r for r in rows if r.get("accuracy") is not None
               and r["accuracy"] >= cell.target]
    return {
        "method": method,
        "seed": int(seed),
        "time_to_target": float(reached[0]["virtual_s"]) if reached else None,
        "final_accuracy": rows[-1]["accuracy"] if rows else None,
        "rounds": len(rows),
        "bytes_up": int(sum(int(r.get("bytes_up") or 0) for r in rows)),
        "client_compute_s": float(compute),
        "total_virtual_s": float(rows[-1]["virtual_s"]) if rows else 0.0,
        "partitions_computed": len(counter.calls),
        "measured_compute_s": float(sum(s for _, s in counter.calls)),
        "wall_s": wall_s,
        # (virtual s, test accuracy, test loss) after each round / server step
        "accuracy_curve": [[float(r["virtual_s"]), r.get("accuracy"), r.get("loss")]
                           for r in rows],
        **extra,
    }


def parse_code(method: str) -> tuple[str, int]:
    """``"grouped-rs:2"`` -> ``("grouped-rs", 2)``; a clear error for anything else."""
    name, _, s = method.partition(":")
    if not name or not (s.isascii() and s.isdigit()) or s != str(int(s)):
        raise ValueError(f"method {method!r}: a fixed code is written CODE:s, e.g. "
                         "'grouped-rs:2' (s without leading zeros); the other methods are "
                         f"{', '.join(METHOD_NAMES)}")
    return name, int(s)


def start_cell_coded(method: str, seed: int, cell: Cell, share: bool = True
                     ) -> tuple[HarnessRun, dict[str, Any]]:
    """``(run, its run config)`` of ``auto``, ``auto-approximate`` (``auto`` with
    ``auto-approximate = true``) or ``CODE:s`` in ``cell``: the main job's coded strategy;
    ``share``: replicas share each round's partition updates (same numbers, less wall
    time)."""
    cfg = coded_config(method, seed, cell)
    return start_coded(cfg, cell.n, share_updates=share, key_file=nodes_key_file(cfg)), cfg


def nodes_key_file(cfg: Mapping[str, Any]) -> str | None:
    """Under a DP mode whose noise is keyed (``dp`` partition or sample), the key file the
    benchmark gives every node, as their operators would (``None`` otherwise). The benchmark
    plays every node: one key per seed, so that the runs of one seed compare (as
    ``experiments.time_to_accuracy``'s), written to the temporary directory."""
    if str(cfg["dp"]) not in ("partition", "sample"):
        return None
    seed = int(cfg["seed"])
    path = Path(tempfile.gettempdir()) / "fl-gradcode-benchmark" / f"dp-keys-{seed}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    master = hashlib.sha256(f"fl-gradcode benchmark nodes;seed={seed}".encode()).hexdigest()
    path.write_text(json.dumps({"master": master}))
    return str(path)


def coded_config(method: str, seed: int, cell: Cell) -> dict[str, Any]:
    """The run config of ``auto``, ``auto-approximate`` or ``CODE:s`` in ``cell``."""
    extra = ({"s": "auto"} if method == "auto"
             else {"s": "auto", "auto-approximate": True} if method == "auto-approximate"
             else dict(zip(("code", "s"), parse_code(method), strict=True)))
    rule = stop_rule(method)
    if rule is not None and getattr(cell, rule):
        extra["stop-late-work"] = "decode"
    return cell.config(seed, **extra)


def run_coded(method: str, seed: int, cell: Cell, share: bool = True,
              client_times: bool = False) -> dict[str, Any]:
    """The record of :func:`start_cell_coded`'s run; ``client_times``: with every valid
    reply's arrival (``client_times_s``: seconds from its round's start, before any
    queueing), the times the stated deadline rule reads."""
    run, cfg = start_cell_coded(method, seed, cell, share)
    rows = run.history
    decodes = {kind: sum(r.get("decode") == kind for r in rows)
               for kind in ("exact", "approx", "skipped")}
    extra: dict[str, Any] = {"decodes": decodes}
    if ":" in method:  # a fixed code: the partitions of the code its rounds ran
        extra["code_partitions"] = int(run.strategy.code_for(cell.cohort).k)
    if client_times:
        extra["client_times_s"] = [t for row in rows for t in row["arrivals_s"].values()]
    if rows and rows[-1].get("epsilon") is not None:  # under DP: the run's ε (at delta)
        extra["epsilon"] = float(rows[-1]["epsilon"])
    return _summary(method, seed, rows, cell, cfg, run.counter, run.wall_s, **extra)


def start_cell_rival(method: str, seed: int, cell: Cell, deadline: float | None = None
                     ) -> tuple[HarnessRun, dict[str, Any]]:
    """``(run, its run config)`` of ``wait-for-all``, ``first-k``, ``fedbuff``, or
    ``deadline`` with ``deadline`` seconds in ``cell``, by the cell's rules."""
    cfg = cell.config(seed, rival="fedavg")
    if method == "deadline" and deadline is None:
        raise ValueError("the deadline method needs a deadline")
    run = start_rival(method, cfg, cell.n, cohort=cell.cohort, deadline=deadline,
                      k=cell.first_k(), overcommit=cell.overcommit,
                      buffer_size=cell.fedbuff_buffer(), server_lr=cell.fedbuff_server_lr,
                      staleness_exponent=cell.fedbuff_staleness_exponent,
                      rounds=cell.fedbuff_steps() if method == "fedbuff" else cell.rounds,
                      stop_dropped_work=bool(cell.rivals_stop_dropped_work))
    return run, cfg


def run_rival(method: str, seed: int, cell: Cell, deadline: float | None = None,
              label: str | None = None) -> dict[str, Any]:
    """The record of :func:`start_cell_rival`'s run (recorded as ``label``, default the
    method)."""
    run, cfg = start_cell_rival(method, seed, cell, deadline)
    strategy = run.strategy
    record = _summary(label or method, seed, strategy.history, cell, cfg, run.counter,
                      run.wall_s, **run.extra)
    if method == "wait-for-all":  # the client times the stated deadline rule reads
        record["client_times_s"] = [t for row in strategy.history
                                    for t in row["arrivals_s"].values()]
    return record


def run_replicated(s: int, seed: int, cell: Cell, replicate_below: float = 1.0,
                   replicate_margin: float = 0.0, need_ratio: float = math.inf,
                   need_latch: bool = False, need_reference: str = "own",
                   need_prior: bool = False, lag_level: float | None = None) -> dict[str, Any]:
    """The record of ``fedbuff-replicated`` with ``s`` extra copies of each partition
    (:class:`fl_gradcode.flower.asynchronous.ReplicatedFedBuff`, ``replicate_below``,
    ``replicate_margin``, ``need_ratio``, ``need_latch``, ``need_reference``,
    ``need_prior``, ``lag_level``) in ``cell``, with FedBuff's rules of the cell (method
    ``fedbuff-replicated:s``, with ``@theta`` below 1, ``~z`` above 0, ``^rho`` when finite,
    ``%`` against the era, ``%c`` a cohort's, ``?`` with the prior, ``!`` latched and
    ``&L`` with the class reading; ``lagged_at``: the virtual time it switched, or None);
    ``updates_per_partition``: how many updates of each partition entered the model;
    ``replicated``: how many jobs computed another partition than the client's own;
    ``needed``: how many partitions the latch lifted to the bar 1."""
    cfg = cell.config(seed, rival="fedavg")
    run = start_rival("fedbuff-replicated", cfg, cell.n, cohort=cell.cohort,
                      buffer_size=cell.fedbuff_buffer(), server_lr=cell.fedbuff_server_lr,
                      staleness_exponent=cell.fedbuff_staleness_exponent,
                      rounds=cell.fedbuff_steps(), replicas=s, replicate_below=replicate_below,
                      replicate_margin=replicate_margin, need_ratio=need_ratio,
                      need_latch=need_latch, need_reference=need_reference,
                      need_prior=need_prior, lag_level=lag_level)
    counts = [0] * cell.n
    for row in run.history:
        for pid in row["clients_used"]:
            counts[pid] += 1
    replicated = sum(j != c for row in run.history
                     for j, c in zip(row["clients_used"], row["computed_by"], strict=True))
    label = (f"fedbuff-replicated:{s}" + ("" if replicate_below == 1.0 else
                                          f"@{replicate_below:g}")
             + ("" if replicate_margin == 0.0 else f"~{replicate_margin:g}")
             + ("" if math.isinf(need_ratio) else f"^{need_ratio:g}")
             + {"own": "", "era": "%", "cohort": "%c"}[need_reference]
             + ("?" if need_prior else "") + ("!" if need_latch else "")
             + ("" if lag_level is None else f"&{lag_level:g}"))
    bar: dict[str, Any] = {"replicated": replicated} if s else {}
    if replicate_below != 1.0:
        bar.update(replicate_below=replicate_below)
    if replicate_margin != 0.0:
        bar.update(replicate_margin=replicate_margin, replicated=replicated)
    if not math.isinf(need_ratio):
        bar.update(need_ratio=need_ratio, replicated=replicated)
    if need_latch:
        bar.update(need_latch=True, needed=len(run.strategy.needed))
    if need_reference != "own":
        bar.update(need_reference=need_reference, need_prior=need_prior)
    if lag_level is not None:
        bar.update(lag_level=lag_level, lagged_at=run.strategy.lagged_at, replicated=replicated)
    return _summary(label, seed, run.history, cell, cfg, run.counter, run.wall_s, s=s,
                    updates_per_partition=counts, **bar)


def auto_rule_record() -> dict[str, Any]:
    """The keywords of the main job's asynchronous ``s='auto'`` (:func:`auto_keywords`) as a
    run records them in JSON: an infinite need ratio as ``None``."""
    return {k: (None if isinstance(v, float) and math.isinf(v) else v)
            for k, v in auto_keywords().items()}


def run_auto_replicated(seed: int, cell: Cell) -> dict[str, Any]:
    """The record of ``fedbuff-auto``: :func:`run_replicated` with the keywords of the main
    job's asynchronous ``s='auto'``, recorded as ``auto_rule`` (:func:`auto_rule_record`)."""
    rule = auto_keywords()
    return {**run_replicated(rule.pop("s"), seed, cell, **rule), "method": "fedbuff-auto",
            "auto_rule": auto_rule_record()}


# ============================================================================= any run config
@dataclass
class HarnessRun:
    """One finished run of the harness: the ``strategy`` (its ``history``: one row per round
    or server step), the merged run ``config`` it ran with, the ``counter`` of the partitions
    its clients computed, the wall seconds of ``strategy.start`` and the method's own facts
    (``extra``: the deadline, ``k``, the buffer size)."""

    strategy: Any
    config: dict[str, Any]
    counter: ComputeCounter
    wall_s: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def history(self) -> list[dict[str, Any]]:
        return self.strategy.history


def _start(strategy: Any, built: tuple, cfg: dict[str, Any], n: int, rounds: int, *,
           share_updates: bool = False, key_file: str | None = None,
           extra: Mapping[str, Any] | None = None) -> HarnessRun:
    """Run ``strategy`` (``built``: ``(initial arrays, evaluate_fn, train_config)``) for
    ``rounds`` rounds on ``n`` in-process nodes of the main job's ClientApp."""
    from fl_gradcode.flower.testing import InProcessGrid

    counter = ComputeCounter()
    # share_updates: replicas in this process share a partition's update (each charged, and
    # each replica's use counted as its computation: SharedUpdates)
    app = _client_app(counter, share=share_updates)
    node_config = (lambda i: {"dp-key-file": key_file}) if key_file else None
    grid = InProcessGrid(app, n, run_config=cfg, node_config=node_config)
    initial, evaluate_fn, train_config = built
    t0 = time.perf_counter()
    strategy.start(grid=grid, initial_arrays=initial, num_rounds=rounds, timeout=3600,
                   train_config=train_config, evaluate_fn=evaluate_fn)
    return HarnessRun(strategy, cfg, counter, time.perf_counter() - t0, dict(extra or {}))


def start_coded(run_config: Mapping[str, Any], n: int, *, code_policy: Any = None,
                key_file: str | None = None, share_updates: bool = False) -> HarnessRun:
    """The main job's coded strategy (``server.app.build``) with ``run_config`` (merged over
    the key table's defaults; ``timing=virtual``) on ``n`` nodes for ``num-rounds`` rounds,
    its cohorts drawn from ``seed``.

    ``code_policy``: ``GradientCoding``'s keyword (an experiment's reference scheme);
    ``key_file``: the nodes' DP key file; ``share_updates``: the replicas of a partition share
    its computed update (each still charged its measured compute in ``compute_s``, and each
    replica's use counted by the counter as its computation): faster, the same numbers."""
    strategy, built, cfg = coded_strategy(run_config, n, code_policy)
    return _start(strategy, built, cfg, n, int(cfg["num-rounds"]),
                  share_updates=share_updates, key_file=key_file)


def coded_strategy(run_config: Mapping[str, Any], n: int, code_policy: Any = None
                   ) -> tuple[Any, tuple, dict[str, Any]]:
    """``(strategy, (initial arrays, evaluate_fn, train_config), merged run config)`` of
    :func:`start_coded`, built, not run."""
    from server.app import build

    cfg = charged_once(merge_config({**run_config, "timing": "virtual", "num-clients": n}), n)
    strategy, *built = build(cfg, n, code_policy)  # its cohorts drawn from the seed
    return strategy, tuple(built), cfg


def charged_once(cfg: dict[str, Any], n: int) -> dict[str, Any]:
    """``cfg`` with ``virtual-compute=measured-once`` measured now and charged as a fixed
    ``partition-cost-s`` (:func:`fl_gradcode.tasks.charged_measured_cost`): the strategy
    and the run's ``client_compute_s`` then charge the same seconds (the ServerApp's own
    measurement would be charged beside the key's default). Other configs are unchanged."""
    if str(cfg["virtual-compute"]) != "measured-once":
        return cfg
    from fl_gradcode.tasks import charged_measured_cost

    return {**cfg, **charged_measured_cost(cfg, n)}


def _given(**rules: float | None) -> dict[str, float]:
    return {name: float(value) for name, value in rules.items() if value is not None}


def rival_strategy(method: str, run_config: Mapping[str, Any], n: int, *,
                   cohort: int | None = None, deadline: float | None = None,
                   k: int | None = None, overcommit: float | None = None,
                   buffer_size: int | None = None, server_lr: float | None = None,
                   staleness_exponent: float | None = None, stop_dropped_work: bool = False,
                   replicas: int = 0, replicate_below: float = 1.0,
                   replicate_margin: float = 0.0, need_ratio: float = math.inf,
                   need_latch: bool = False, need_reference: str = "own",
                   need_prior: bool = False, lag_level: float | None = None
                   ) -> tuple[Any, tuple, dict[str, Any], dict[str, Any]]:
    """A public rival of :mod:`fl_gradcode.rivals` with ``run_config`` on ``n`` nodes, on the
    main job's initial model, evaluation and train config (``server.app.build_rival``):

    * ``wait-for-all``; ``deadline`` (``deadline`` seconds; default the run config's
      ``straggler-timeout``): cohorts of ``cohort`` nodes (default ``fraction-train``'s)
      drawn from ``seed``;
    * ``first-k``: sample ``ceil(overcommit k)``, keep the first ``k`` (default: ``cohort``);
    * ``fedbuff``: ``cohort`` clients in flight, a server step every ``buffer_size``
      arrivals (required), ``server_lr``, updates weighted
      ``(1 + staleness)^-staleness_exponent``;
    * ``fedbuff-replicated``: FedBuff's rules over partitions each held by ``replicas + 1``
      clients (:class:`fl_gradcode.flower.asynchronous.ReplicatedFedBuff`, ``s = replicas``,
      its ``replicate_below``, ``replicate_margin``, ``need_ratio``, ``need_latch``,
      ``need_reference``, ``need_prior``, ``lag_level``).

    A rule left ``None`` is the rival class's own default (``FirstK``, ``FedBuff``).
    ``stop_dropped_work``: ``deadline`` and ``first-k`` stop a dropped client's work when its
    round ends (``DeadlineFedAvg``'s option).

    Returns ``(strategy, (initial arrays, evaluate_fn, train_config), merged run config,
    the method's facts)``, built, not run (:func:`start_rival` runs it)."""
    if method in ("fedbuff", "fedbuff-replicated") and buffer_size is None:
        raise ValueError(f"{method} needs buffer_size (K, updates per server step; the "
                         "benchmark's is fedbuff_buffer_fraction of the cohort)")
    from server.app import build_rival, cohort_size, run_latency
    from server.rival_config import shared_keys  # the coded runs' keys: rivals run without

    cfg = charged_once(merge_config({**shared_keys(run_config), "rival": "fedavg",
                                     "timing": "virtual", "num-clients": n}), n)
    cohort = cohort_size(cfg, n) if cohort is None else int(cohort)
    _, *built = build_rival(cfg, n, classes=lag_level is not None)
    _, index = run_partitions(cfg, n)
    common = {
        "latency": run_latency(cfg, n), "seed": int(cfg["seed"]),
        "partition_sizes": [len(p) for p in index],
        "measured_compute": str(cfg["virtual-compute"]) == "measured",
        "compute_cost_s": float(cfg["partition-cost-s"]),
        "upload_bandwidth": float(cfg["upload-bandwidth"]) or None,
        "fraction_evaluate": 0.0, "min_available_nodes": 1,
    }
    sample = {"fraction_train": float(cfg["fraction-train"]), "min_train_nodes": cohort}
    extra: dict[str, Any] = {}
    if method == "wait-for-all":
        strategy = WaitForAll(**common, **sample)
    elif method == "deadline":
        deadline = float(cfg["straggler-timeout"] if deadline is None else deadline)
        strategy = DeadlineFedAvg(deadline=deadline, stop_dropped_work=stop_dropped_work, **common,
                                  **sample)
        extra = {"deadline_s": deadline}
    elif method == "first-k":
        k = cohort if k is None else int(k)
        strategy = FirstK(k=k, **_given(overcommit=overcommit), stop_dropped_work=stop_dropped_work,
                          **common)
        extra = {"k": k, "sampled": strategy.sample_size}
    elif method in ("fedbuff", "fedbuff-replicated"):
        buffer_size = int(buffer_size)  # type: ignore[arg-type]  # checked on entry
        knobs = {"buffer_size": buffer_size, "concurrency": cohort,
                 **_given(server_lr=server_lr, staleness_exponent=staleness_exponent),
                 **common}
        extra = {"buffer_size": buffer_size, "concurrency": cohort}
        if method == "fedbuff":
            strategy = FedBuff(**knobs)
        else:
            from fl_gradcode.flower.asynchronous import ReplicatedFedBuff

            strategy = ReplicatedFedBuff(s=int(replicas), replicate_below=replicate_below,
                                         replicate_margin=replicate_margin,
                                         need_ratio=need_ratio, need_latch=need_latch,
                                         need_reference=need_reference,
                                         need_prior=need_prior, lag_level=lag_level,
                                         **knobs)
            extra["s"] = int(replicas)
    else:
        raise ValueError(f"method {method!r} is not a rival; expected one of "
                         f"{(*RIVALS, 'deadline')}")
    if method not in ("fedbuff", "fedbuff-replicated"):
        seeded_sampling(strategy, int(cfg["seed"]))
    return strategy, tuple(built), cfg, extra


def start_rival(method: str, run_config: Mapping[str, Any], n: int, *,
                rounds: int | None = None, **rules: Any) -> HarnessRun:
    """:func:`rival_strategy`'s rival (``rules``: its keywords), run for ``rounds`` rounds or
    server steps (default ``num-rounds``)."""
    strategy, built, cfg, extra = rival_strategy(method, run_config, n, **rules)
    return _start(strategy, built, cfg, n,
                  int(cfg["num-rounds"]) if rounds is None else int(rounds), extra=extra)
