"""End-to-end cost of gradient coding in Flower's simulation engine: coded rounds against
Flower's FedAvg with the same app, without stragglers (wall time), with stragglers (time to
accuracy, virtual clock) and at scale (1,000 nodes, 100-node cohorts).

Every part runs ONE ``flwr.simulation.run_simulation`` (Ray backend, ``num_cpus=1`` per client:
an actor pool of the machine's CPU count; Flower runs every SuperNode on those few actors)
whose ServerApp alternates the strategies on the same grid, so coded and FedAvg rounds share
the machine's load (``loadavg`` is recorded beside each block):

* ``no_stragglers``: ``n`` SuperNodes, the CNN of ``experiments/perf_app.py`` (1.2M
  parameters), blocks of rounds alternating Flower's ``FedAvg`` and
  ``GradientCoding(FedAvg, code, s)`` (virtual timing without latency: a coded round waits for
  every reply, as FedAvg does, so the difference is the coding's own cost plus the ``s+1``x
  compute), each block started from the same initial model. Per round: wall time, the app's
  own compute (its train handler's time, logged by every actor), and the coded model's
  relative difference from FedAvg's after the same rounds (``rel_diff_vs_fedavg``). The
  overhead beyond the compute the code asks for: ``wall_coded / (wall_fedavg + s *
  compute_fedavg) - 1`` (``compute`` = the handler's time summed over clients / actors);
  goal <= 0.10.
* ``stragglers``: the same federation, coded against wait-for-all FedAvg (the wrapper with the
  identity code, ``code='uncoded' s=0``, no deadline) and against what Flower users do today,
  Flower's FedAvg dropping the replies later than a round deadline (``DeadlineFedAvg``, deadline
  ``common.rival_deadline``: 3 times the 75th percentile of an uncoded client's time), a
  Pareto latency model in **virtual time** (``measured_compute=False``, ``compute_cost_s`` per
  partition of average size), the same draws for all three: the accuracy after each round and
  the virtual time to the target accuracy. Coded and wait-for-all decode the same exact average
  every round, so their accuracy curves coincide and the times differ; the rival averages
  whatever arrived in time.
* ``scale``: 1,000 SuperNodes, ``FedAvg(fraction_train=0.1)`` (100-node cohorts) alone and
  wrapped, the small MLP of ``perf_app`` (4.8k parameters: the messaging is measured), wall
  time per round and the peak RSS of the whole process tree (this process, Ray's processes and
  actors; sampled every 0.2 s from /proc). ``handshake_s``: the time of the coded strategy's
  ``identify`` exchange with cohort members it has not met (most members of a random cohort
  of 100 out of 1,000 in the first rounds), part of its round time.

``--engine inprocess`` runs the same ServerApp logic on the in-process test grid (no Ray; for
smoke tests only). Run: ``python -m experiments.bench_end_to_end`` ->
``results/bench_end_to_end.json``; ``--parts`` picks parts, ``--quick`` tiny sizes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from experiments.common import quiet_flower, rival_deadline, save

ROOT = Path(__file__).resolve().parents[1]

PARTS = ("no_stragglers", "stragglers", "scale")


# ---------------------------------------------------------------- process-tree memory
def tree_rss_bytes(root: int | None = None) -> int:
    """Resident memory of process ``root`` (default: this one) and all its descendants."""
    root = os.getpid() if root is None else root
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    total, stack = 0, [root]
    page = os.sysconf("SC_PAGE_SIZE")
    while stack:
        pid = stack.pop()
        try:
            with open(f"/proc/{pid}/statm") as fh:
                total += int(fh.read().split()[1]) * page
        except OSError:
            pass
        stack.extend(children.get(pid, []))
    return total


class PeakRSS:
    """Samples :func:`tree_rss_bytes` every ``period`` seconds in a thread; ``take()`` returns
    the peak since the last ``take()``."""

    def __init__(self, period: float = 0.2) -> None:
        self.period, self.peak, self._stop = period, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_rss_bytes())
            self._stop.wait(self.period)

    def take(self) -> int:
        peak, self.peak = max(self.peak, tree_rss_bytes()), 0
        return peak

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


# ---------------------------------------------------------------- timed blocks of rounds
def _app_compute(log: Path | None, start: float, end: float) -> float:
    """Seconds the app's train handler ran (summed over actors) between ``start`` and ``end``
    (wall clock)."""
    if log is None or not log.exists():
        return float("nan")
    total = 0.0
    for line in log.read_text().splitlines():
        rec = json.loads(line)
        if rec["start"] >= start and rec["end"] <= end:
            total += rec["end"] - rec["start"]
    return total


def run_block(strategy: Any, grid: Any, arrays: Any, rounds: int, config: Any,
              evaluate: bool, hidden: int, log: Path | None) -> tuple[list[dict], Any]:
    """``strategy.start`` for ``rounds`` rounds; per round its wall time (between the
    evaluation hooks Flower's ``start`` calls after every round, evaluation excluded), the app's
    compute in that window and (``evaluate``) the test accuracy."""
    from experiments import perf_app

    marks: list[tuple[float, float]] = []
    accuracy: list[float | None] = []
    loads: list[list[float]] = []

    def evaluate_fn(server_round: int, arrays):
        from flwr.app import MetricRecord

        t_in = time.time()
        acc = perf_app.accuracy(hidden, arrays) if evaluate and server_round > 0 else None
        if server_round > 0:
            accuracy.append(acc)
        marks.append((t_in, time.time()))
        loads.append(list(os.getloadavg()))
        return MetricRecord({"accuracy": acc}) if acc is not None else None

    result = strategy.start(grid=grid, initial_arrays=arrays, num_rounds=rounds,
                            train_config=config, evaluate_fn=evaluate_fn)
    rows = []
    for r in range(1, len(marks)):
        start, end = marks[r - 1][1], marks[r][0]
        rows.append({"round": r, "wall_s": end - start,
                     "app_compute_s": _app_compute(log, start, end),
                     "handshake_s": grid.seconds("identify", start, end)
                     if isinstance(grid, TimedGrid) else 0.0,
                     "accuracy": accuracy[r - 1], "loadavg": loads[r]})
    return rows, result.arrays


class TimedGrid:
    """A grid that records when each ``send_and_receive`` ran and what it carried
    (``identify``: the coded strategy's handshake; ``train``; ``other``); everything else is
    the wrapped grid's."""

    def __init__(self, grid: Any) -> None:
        self.grid, self.calls = grid, []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.grid, name)

    def send_and_receive(self, messages: Any, *args: Any, **kwargs: Any) -> Any:
        from fl_gradcode.flower import protocol

        messages = list(messages)
        kind = "other"
        for msg in messages:
            rec = msg.content.config_records.get(protocol.PROTOCOL_KEY) \
                if msg.has_content() else None
            kind = "identify" if rec is not None and rec.get("op") == protocol.OP_IDENTIFY \
                else "train" if msg.metadata.message_type.startswith("train") else kind
        t0 = time.time()
        try:
            return self.grid.send_and_receive(messages, *args, **kwargs)
        finally:
            self.calls.append((kind, t0, time.time()))

    def seconds(self, kind: str, start: float, end: float) -> float:
        """Seconds spent in ``kind`` calls that ran between ``start`` and ``end``."""
        return sum(t1 - t0 for k, t0, t1 in self.calls if k == kind and t0 >= start
                   and t1 <= end)


def _flat(arrays: Any) -> np.ndarray:
    return np.concatenate([np.asarray(arrays[k].numpy(), np.float64).reshape(-1)
                           for k in arrays.keys()])


def _wrap(inner: Any, **kw: Any) -> Any:
    from fl_gradcode.flower import GradientCoding

    return GradientCoding(inner, **kw)


def _rival(n: int, deadline: float, latency: Any, compute_cost_s: float) -> Any:
    """What Flower users do today: Flower's FedAvg averaging the replies in by a round
    deadline in virtual time (``DeadlineFedAvg``), on the coded runs' latency draws."""
    from fl_gradcode.flower.deadline import DeadlineFedAvg

    return DeadlineFedAvg(deadline=deadline, latency=latency, seed=0, measured_compute=False,
                          compute_cost_s=compute_cost_s, fraction_evaluate=0.0,
                          min_available_nodes=n, min_train_nodes=n)


def _fedavg(n: int, fraction: float = 1.0) -> Any:
    from flwr.serverapp.strategy import FedAvg

    return FedAvg(fraction_train=fraction, fraction_evaluate=0.0, min_available_nodes=n,
                  min_train_nodes=max(2, int(n * fraction)))


# ---------------------------------------------------------------- the three parts
def part_no_stragglers(grid: Any, plan: dict, log: Path | None) -> dict:
    from flwr.app import ConfigRecord

    from experiments import perf_app

    n, s, hidden, reps, rounds = (plan[k] for k in ("n", "s", "hidden", "reps", "rounds"))
    config = ConfigRecord({"hidden": hidden, "lr": 0.05})
    init = perf_app.initial_arrays(hidden, seed=0)
    blocks: list[dict] = []
    decodes: set[str] = set()
    for rep in range(reps + 1):  # block 0 of each: warm-up (actors start, torch imports)
        # a fresh strategy per block (round numbers restart); its first round includes the
        # coded strategy's handshake with its cohort (steady state: rounds 2, 3, ...)
        coded = _wrap(_fedavg(n), code=plan["code"], s=s, timing="virtual", latency=None,
                      measured_compute=False, seed=0)
        for name, strategy in (("fedavg", _fedavg(n)), ("coded", coded)):
            t0 = time.time()
            rows, final = run_block(strategy, grid, init, rounds, config, False, hidden, log)
            blocks.append({"strategy": name, "rep": rep, "warmup": rep == 0, "rows": rows,
                           "wall_s": time.time() - t0, "final": _flat(final)})
        decodes |= {str(row.get("decode")) for row in coded.history}
    reference = next(b["final"] for b in blocks if b["strategy"] == "fedavg")
    for b in blocks:
        b["rel_diff_vs_fedavg"] = float(np.linalg.norm(b["final"] - reference)
                                        / np.linalg.norm(reference))
        del b["final"]
    measured = [b for b in blocks if not b["warmup"]]

    def median(name: str, key: str, first: bool = False) -> float:
        return float(np.median([r[key] for b in measured if b["strategy"] == name
                                for r in (b["rows"][:1] if first else b["rows"][1:])]))

    actors = plan["actors"]
    wall_f, wall_c = median("fedavg", "wall_s"), median("coded", "wall_s")
    comp_f = median("fedavg", "app_compute_s") / actors
    comp_c = median("coded", "app_compute_s") / actors
    return {
        "n": n, "s": s, "code": plan["code"], "params": perf_app.num_params(hidden),
        "rounds_per_block": rounds, "reps": reps, "actors": actors,
        "fedavg_round_s": wall_f, "coded_round_s": wall_c,
        "coded_vs_fedavg": wall_c / wall_f,
        "fedavg_compute_s": comp_f, "coded_compute_s": comp_c,
        "overhead_beyond_compute": wall_c / (wall_f + s * comp_f) - 1,
        "overhead_beyond_measured_compute": wall_c / (wall_f - comp_f + comp_c) - 1,
        "first_round_s": {"fedavg": median("fedavg", "wall_s", True),
                          "coded": median("coded", "wall_s", True)},
        "max_rel_diff_vs_fedavg": max(b["rel_diff_vs_fedavg"] for b in blocks),
        "decodes": sorted(decodes),
        "goal": {"overhead_beyond_compute": 0.10},
        "blocks": blocks,
    }


def part_stragglers(grid: Any, plan: dict, log: Path | None) -> dict:
    from flwr.app import ConfigRecord

    from experiments import perf_app
    from fl_gradcode.latency import Pareto

    n, s, hidden, rounds = (plan[k] for k in ("n", "s", "hidden", "straggler_rounds"))
    config = ConfigRecord({"hidden": hidden, "lr": 0.05})
    init = perf_app.initial_arrays(hidden, seed=0)
    scale, shape = 1.0, 1.5  # one latency model for the three runs and the rival's deadline
    latency = Pareto(scale=scale, shape=shape)
    common = {"timing": "virtual", "latency": latency, "measured_compute": False,
              "compute_cost_s": plan["compute_cost_s"], "seed": 0}
    deadline = rival_deadline({"latency": "pareto", "latency-scale": scale,
                               "latency-shape": shape}, 0, plan["compute_cost_s"])
    runs = {}
    for name, kw in (("coded", {"code": plan["code"], "s": s}),
                     ("wait_for_all", {"code": "uncoded", "s": 0,
                                       "straggler_timeout": 1e6}),
                     ("drop_stragglers", None)):
        strategy = (_wrap(_fedavg(n), **kw, **common) if kw is not None
                    else _rival(n, deadline, latency, plan["compute_cost_s"]))
        t0 = time.time()
        rows, final = run_block(strategy, grid, init, rounds, config, True, hidden, log)
        # the round log's virtual_s is the clock at the round's end (elapsed since the start)
        elapsed = [float(h.get("virtual_s") or 0.0) for h in strategy.history]
        for row, h, v, before in zip(rows, strategy.history, elapsed, [0.0, *elapsed],
                                     strict=False):
            row.update({"virtual_round_s": v - before, "virtual_elapsed_s": v,
                        "decode": h.get("decode")})
        runs[name] = {"rows": rows, "wall_s": time.time() - t0, "final": _flat(final),
                      "wire": (strategy.wire_for(strategy.code_for(n)) if kw is not None
                               else "model")}
    target = plan["target"]

    def time_to(name: str) -> float | None:
        for row in runs[name]["rows"]:
            if row["accuracy"] is not None and row["accuracy"] >= target:
                return row["virtual_elapsed_s"]
        return None

    diff = float(np.linalg.norm(runs["coded"]["final"] - runs["wait_for_all"]["final"])
                 / np.linalg.norm(runs["wait_for_all"]["final"]))
    for run in runs.values():
        del run["final"]
    t_coded, t_wait = time_to("coded"), time_to("wait_for_all")
    t_drop = time_to("drop_stragglers")
    return {
        "n": n, "s": s, "code": plan["code"], "params": perf_app.num_params(hidden),
        "clock": "virtual", "latency": f"pareto(scale={scale}, shape={shape})",
        "compute_cost_s": plan["compute_cost_s"], "rounds": rounds, "target": target,
        "time_to_target_s": {"coded": t_coded, "wait_for_all": t_wait,
                             "drop_stragglers": t_drop},
        "speedup_vs_wait_for_all": (t_wait / t_coded) if t_coded and t_wait else None,
        "speedup_vs_drop_stragglers": (t_drop / t_coded) if t_coded and t_drop else None,
        "drop_stragglers_deadline_s": deadline,
        "final_accuracy": {name: run["rows"][-1]["accuracy"] for name, run in runs.items()},
        "rel_diff_coded_vs_wait_for_all": diff, "runs": runs,
        "note": "coded and wait-for-all decode the exact example-weighted average every "
                "round; their models differ by the rounding of the replies in their wire "
                "dtype, which training amplifies over the rounds; drop_stragglers averages the "
                "replies in by its deadline (decode 'all' or 'partial' per round)",
    }


def part_scale(grid: Any, plan: dict, log: Path | None) -> dict:
    from flwr.app import ConfigRecord

    from experiments import perf_app

    nodes, cohort, s, reps, rounds = (plan[k] for k in ("nodes", "cohort", "scale_s",
                                                        "scale_reps", "scale_rounds"))
    hidden = 0
    config = ConfigRecord({"hidden": hidden, "lr": 0.1})
    init = perf_app.initial_arrays(hidden, seed=0)
    fraction = cohort / nodes
    rss = PeakRSS()
    rss.take()
    blocks = []
    decodes: set[str] = set()
    try:
        for rep in range(reps):
            coded = _wrap(_fedavg(nodes, fraction), code=plan["code"], s=s, timing="virtual",
                          latency=None, measured_compute=False, seed=0)
            for name, strategy in (("fedavg", _fedavg(nodes, fraction)), ("coded", coded)):
                rss.take()
                t0 = time.time()
                rows, _ = run_block(strategy, grid, init, rounds, config, True, hidden, log)
                blocks.append({"strategy": name, "rep": rep, "rows": rows,
                               "wall_s": time.time() - t0, "peak_rss_bytes": rss.take()})
            decodes |= {str(h.get("decode")) for h in coded.history}
    finally:
        rss.stop()

    def median(name: str, key: str = "wall_s") -> float:
        return float(np.median([r[key] for b in blocks if b["strategy"] == name
                                for r in b["rows"][1:] or b["rows"]]))

    return {
        "nodes": nodes, "cohort": cohort, "s": s, "code": plan["code"],
        "params": perf_app.num_params(hidden), "actors": plan["actors"],
        "rounds_per_block": rounds, "reps": reps,
        "fedavg_round_s": median("fedavg"), "coded_round_s": median("coded"),
        "coded_vs_fedavg": median("coded") / median("fedavg"),
        "coded_handshake_s": median("coded", "handshake_s"),
        "app_compute_s": {"fedavg": median("fedavg", "app_compute_s") / plan["actors"],
                          "coded": median("coded", "app_compute_s") / plan["actors"]},
        "peak_rss_bytes": {name: max(b["peak_rss_bytes"] for b in blocks
                                     if b["strategy"] == name) for name in ("fedavg", "coded")},
        "decodes": sorted(decodes),
        "blocks": blocks,
    }


RUNNERS = {"no_stragglers": part_no_stragglers, "stragglers": part_stragglers,
           "scale": part_scale}


# ---------------------------------------------------------------- engines
def run_part(part: str, plan: dict, engine: str) -> dict:
    """Run ``part`` in one simulation (Ray) or on the in-process grid."""
    from experiments import perf_app

    nodes = plan["nodes"] if part == "scale" else plan["n"]
    client_app = perf_app.timed_app if part == "stragglers" else perf_app.coded_app
    log = Path(tempfile.mkdtemp(prefix="flgc-perf-")) / "app.jsonl"
    os.environ[perf_app.LOG_ENV] = str(log)
    out: dict = {}
    if engine == "inprocess":
        from fl_gradcode.flower.testing import InProcessGrid

        grid = InProcessGrid(client_app, nodes)
        out.update(RUNNERS[part](TimedGrid(grid), plan, log))
        return out
    from flwr.app import Context
    from flwr.serverapp import Grid, ServerApp
    from flwr.simulation import run_simulation

    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        out.update(RUNNERS[part](TimedGrid(grid), plan, log))

    # Ray's workers import experiments.perf_app (the pickled ClientApp refers to it) and this
    # checkout's fl_gradcode
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    run_simulation(app, client_app, num_supernodes=nodes,
                   backend_config={"client_resources": {"num_cpus": 1},
                                   "init_args": {"num_cpus": plan["actors"],
                                                 "log_to_driver": False}})
    if not out:
        raise RuntimeError(f"part {part!r}: the ServerApp produced no result (see its log)")
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default=",".join(PARTS),
                        help=f"comma-separated subset of {PARTS}")
    parser.add_argument("--engine", choices=("ray", "inprocess"), default="ray")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke tests)")
    parser.add_argument("--out", default="results/bench_end_to_end.json")
    args = parser.parse_args(argv)
    parts = [p for p in args.parts.split(",") if p]
    bad = [p for p in parts if p not in PARTS]
    if bad:
        parser.error(f"--parts holds {bad}; expected a subset of {PARTS}")
    quiet_flower()
    plan = {"n": 20, "s": 2, "code": "grouped-rs", "hidden": 128, "reps": 3, "rounds": 3,
            "straggler_rounds": 12, "compute_cost_s": 1.0, "target": 0.85,
            "nodes": 1000, "cohort": 100, "scale_s": 4, "scale_reps": 4, "scale_rounds": 5,
            "actors": (os.cpu_count() or 1) if args.engine == "ray" else 1}
    if args.quick:
        plan.update(n=4, s=1, hidden=0, reps=1, rounds=2, straggler_rounds=2, target=0.2,
                    nodes=20, cohort=10, scale_s=2, scale_reps=1, scale_rounds=2)
    previous = {}
    out = Path(args.out).with_suffix(".json")
    if out.exists() and set(parts) != set(PARTS):  # rerun some parts: keep the others
        previous = json.loads(out.read_text())
    result = {**previous, "benchmark": "bench_end_to_end", "quick": args.quick,
              "engine": args.engine, "plan": plan, "command": " ".join(
                  ["python -m experiments.bench_end_to_end", *(argv or sys.argv[1:])])}
    for part in parts:
        t0 = time.time()
        result[part] = run_part(part, plan, args.engine)
        result[part]["command"] = result["command"]
        result[part]["part_wall_s"] = time.time() - t0
        print(f"{part}: " + json.dumps({k: v for k, v in result[part].items()
                                       if not isinstance(v, (list, dict))}), flush=True)
    result.pop("machine", None)
    save(result, out)
    return result


if __name__ == "__main__":
    main()
