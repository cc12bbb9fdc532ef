"""Asynchronous rounds in real time, in Flower's simulation engine: Flower's own FedAvg
against the synchronous coded rounds and FedBuff with and without replicated partitions.

One ``flwr.simulation.run_simulation`` (Ray backend) per seed runs the main job's task
(digits softmax regression on Dirichlet(0.5) partitions, its run-config defaults) on ``n``
SuperNodes, and its ServerApp runs the methods one after the other on the same grid, each
from the same initial model (after one untimed warm-up round; each seed in another order of
the methods, rotated), in **wallclock** timing:

* ``flower-fedavg``: Flower's own ``FedAvg``, waiting for every reply, ``rounds`` rounds;
* ``coded``: ``GradientCoding(FedAvg, code="grouped-rs", s=1)``, wallclock rounds ending at the
  first decodable set of replies (the main job's deadline as its approximate fallback);
* ``fedbuff``: the main job's ``asynchronous=true`` with ``s = 0`` (FedBuff step for step:
  :class:`fl_gradcode.flower.asynchronous.ReplicatedFedBuff`, ``server.asynchronous``);
* ``fedbuff-replicated``: the same with ``s = 1``.

The asynchronous ones take as many client updates as ``rounds`` synchronous rounds (``n``
in flight, a server step every ``K = ceil(n / 4)`` updates, server lr 1: the main job's and
the benchmark's a-priori FedBuff settings). Every method is read (the server evaluates) once
per ``n`` client updates: after every round, after every ``ceil(n / K)``-th server step (read
after every step, FedBuff's curve has four times the chances to cross the target with a
noisy step first: a first pass read it so and was discarded). Every client sleeps after its
train handler, for every method alike (a client mod keyed by its partition and the message's
round or job number): ``slow_s`` seconds on the persistently slow partitions, else
``0.05 + Exp(mean 0.15)`` s drawn from ``(seed, round, partition)``. Ray runs ``n`` actors
at once (sleeping takes no CPU). The time to the target accuracy is the wall time from the
method's start to its first reading at or above it. Ratios are against Flower's FedAvg of the
same seed, measured in the same process.

Nothing here was tuned, and the seeds are evaluation seeds (``--seeds``, default 10-19). The
settings were fixed before the first run except three changes that runs showed were needed
(none chosen by which method it favours): Flower's FedAvg messages carry their round in the
config, not the group id (the first pass slept none of them); the warm-up rounds (the first
pass charged Ray's start-up to the first method); the reading once per ``n`` updates. A run's
methods share the machine with each other and with whatever else runs, so the times are those
of this 2-core machine.
Run: ``python -m experiments.bench_async_wallclock`` -> ``results/bench_async_wallclock.json``
(``--quick``: a tiny smoke run).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from experiments.common import checkout_commit, quiet_flower, save

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("flower-fedavg", "coded", "fedbuff", "fedbuff-replicated")


def client_delay_s(partition: int, number: int, seed: int, slow: tuple[int, ...],
                   slow_s: float) -> float:
    """The sleep of ``partition``'s job of round (or job number) ``number``."""
    if partition in slow:
        return float(slow_s)
    rng = np.random.default_rng([seed, number, partition])
    return 0.05 + float(rng.exponential(0.15))


def sleep_mod(msg: Any, context: Any, call_next: Any) -> Any:
    """Client mod: after a numbered train message's handler, sleep :func:`client_delay_s`
    (the slow partitions and their sleep are in the train config: ``bench-slow``,
    ``bench-slow-s``)."""
    from flwr.app import MessageType

    reply = call_next(msg, context)
    if msg.metadata.message_type != MessageType.TRAIN or not msg.has_content():
        return reply
    config = msg.content.config_records.get("config")
    if config is None or "bench-slow-s" not in config:
        return reply
    # the coded rounds and FedBuff number their messages (group id: the round, the job);
    # Flower's FedAvg leaves the group id empty and puts the round in the config
    group = msg.metadata.group_id
    number = int(group) if group.isdigit() else int(config.get("server-round", -1))
    if number < 0:
        return reply
    slow = tuple(int(x) for x in str(config["bench-slow"]).split(",") if x)
    time.sleep(client_delay_s(int(context.node_config["partition-id"]), number,
                              int(config["seed"]), slow, float(config["bench-slow-s"])))
    return reply


def client_app() -> Any:
    from clients.app import fault_injection_mod, make_client_app
    from fl_gradcode.flower import gradient_coding_mod
    from fl_gradcode.rivals import train_timing_mod

    return make_client_app([sleep_mod, train_timing_mod, fault_injection_mod,
                            gradient_coding_mod])


def method_strategy(method: str, cfg: dict[str, Any], n: int) -> tuple[Any, int, int]:
    """``(strategy, rounds or server steps, steps per reading)``."""
    from flwr.serverapp.strategy import FedAvg

    from server.app import build
    from server.asynchronous import build_async

    rounds = int(cfg["num-rounds"])
    if method == "flower-fedavg":
        return (FedAvg(fraction_evaluate=0.0, min_available_nodes=n, min_train_nodes=n),
                rounds, 1)
    if method == "coded":
        return build({**cfg, "code": "grouped-rs", "s": 1}, n)[0], rounds, 1
    s = {"fedbuff": 0, "fedbuff-replicated": 1}[method]
    strategy, *_, steps = build_async({**cfg, "asynchronous": True, "s": s}, n)
    return strategy, steps, math.ceil(n / strategy.buffer_size)


def run_methods(grid: Any, cfg: dict[str, Any], n: int, methods: tuple[str, ...],
                target: float, slow: tuple[int, ...], slow_s: float, drain_s: float
                ) -> list[dict[str, Any]]:
    """Every method on ``grid``, one after the other (``drain_s`` between two: the jobs an
    asynchronous run left in flight finish), after one untimed round of Flower's FedAvg and
    one of the coded rounds, without sleeps (the simulation engine starts its actors on the
    first messages; the coded rounds' handshake)."""
    from flwr.app import ConfigRecord

    from server.app import model_and_evaluation, run_partitions

    data, _ = run_partitions(cfg, n)
    initial, evaluate_fn, train_config = model_and_evaluation(cfg, data)
    for warm in ("flower-fedavg", "coded"):
        method_strategy(warm, cfg, n)[0].start(grid=grid, initial_arrays=initial, num_rounds=1,
                                         timeout=600, train_config=train_config)
    train_config = ConfigRecord({**dict(train_config), "bench-slow": ",".join(map(str, slow)),
                                 "bench-slow-s": float(slow_s)})
    runs = []
    for method in methods:
        strategy, rounds, every = method_strategy(method, cfg, n)
        curve: list[tuple[float, float]] = []
        t0 = time.monotonic()

        def timed(step: int, arrays: Any, t0: float = t0, curve: list = curve,
                  every: int = every) -> Any:
            if step % every:
                return None  # read once per n client updates, as a round is
            metrics = evaluate_fn(step, arrays)
            curve.append((time.monotonic() - t0, float(metrics["accuracy"])))
            return metrics

        strategy.start(grid=grid, initial_arrays=initial, num_rounds=rounds, timeout=600,
                       train_config=train_config, evaluate_fn=timed)
        wall = time.monotonic() - t0
        reached = [t for t, acc in curve[1:] if acc >= target]
        runs.append({"method": method, "seed": int(cfg["seed"]), "rounds_or_steps": rounds,
                     "time_to_target_s": reached[0] if reached else None,
                     "final_accuracy": curve[-1][1], "wall_s": wall,
                     "curve": [[round(t, 4), acc] for t, acc in curve]})
        print(f"  seed {cfg['seed']} {method}: time to {target:.2f} "
              f"{'never' if not reached else format(reached[0], '.2f') + ' s'}, final "
              f"{curve[-1][1]:.3f}, {wall:.1f} s", flush=True)
        time.sleep(drain_s)
    return runs


def run_seed(seed: int, n: int, rounds: int, methods: tuple[str, ...], target: float,
             slow: tuple[int, ...], slow_s: float) -> list[dict[str, Any]]:
    from flwr.app import Context
    from flwr.serverapp import Grid, ServerApp
    from flwr.simulation import run_simulation

    from fl_gradcode.config import merge_config

    cfg = merge_config({"seed": seed, "num-rounds": rounds, "num-clients": n,
                        "timing": "wallclock", "latency": "none", "results-dir": ""})
    out: list[dict[str, Any]] = []
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        from server.app import wait_for_nodes

        wait_for_nodes(grid, n)
        out.extend(run_methods(grid, cfg, n, methods, target, slow, slow_s,
                               drain_s=slow_s + 0.5))

    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    run_simulation(app, client_app(), num_supernodes=n,
                   backend_config={"client_resources": {"num_cpus": 2 / n},
                                   "init_args": {"num_cpus": 2, "log_to_driver": False}})
    if not out:
        raise RuntimeError(f"seed {seed}: the ServerApp produced no result (see its log)")
    return out


def summarize(runs: list[dict[str, Any]], methods: tuple[str, ...]) -> dict[str, Any]:
    """Per method: median time to target over the seeds (a seed that never reached it as
    infinity), the seeds that reached it, and its per-seed ratios to Flower's FedAvg, to the
    coded rounds and to FedBuff over the seeds where both reached it (geometric mean, 95 % Student-t
    interval on their logarithms: :func:`experiments.summary.ratio_interval`)."""
    from experiments.summary import ratio_interval

    def times(method: str) -> dict[int, float | None]:
        return {r["seed"]: r["time_to_target_s"] for r in runs if r["method"] == method}

    def ratio(mine: dict[int, float | None], theirs: dict[int, float | None]
              ) -> dict[str, Any]:
        pairs = [mine[s] / theirs[s] for s in mine if mine[s] and theirs.get(s)]
        return {**ratio_interval(pairs), "paired_seeds": len(pairs)}

    out = {}
    for method in methods:
        mine = times(method)
        values = [math.inf if t is None else t for t in mine.values()]
        median = float(np.median(values)) if values else math.inf
        out[method] = {
            "median_time_to_target_s": None if math.isinf(median) else median,
            "reached": sum(t is not None for t in mine.values()),
            "seeds": len(mine),
            "ratio_to_flower_fedavg": ratio(mine, times("flower-fedavg")),
            "ratio_to_coded": ratio(mine, times("coded")),
            "ratio_to_fedbuff": ratio(mine, times("fedbuff")),
            "median_final_accuracy": float(np.median(
                [r["final_accuracy"] for r in runs if r["method"] == method])),
        }
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default=",".join(map(str, range(10, 20))))
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--target", type=float, default=0.85)
    parser.add_argument("--slow", default="3", help="the persistently slow partitions")
    parser.add_argument("--slow-s", type=float, default=1.5)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--quick", action="store_true", help="a tiny smoke run")
    parser.add_argument("--out", default="results/bench_async_wallclock.json")
    args = parser.parse_args(argv)
    quiet_flower()
    methods = tuple(m for m in args.methods.split(",") if m)
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise SystemExit(f"--methods: {unknown[0]!r} is not one of {METHODS}")
    seeds = [int(s) for s in args.seeds.split(",")]
    rounds, slow_s = args.rounds, args.slow_s
    if args.quick:
        seeds, rounds, slow_s = seeds[:1], 2, 0.3
    slow = tuple(int(x) for x in args.slow.split(",") if x)
    settings = {"n": args.n, "rounds": rounds, "target": args.target, "slow": list(slow),
                "slow_s": slow_s, "seeds": seeds, "methods": list(methods),
                "buffer_size": max(1, math.ceil(args.n / 4)), "s": 1, "quick": args.quick,
                "readings": "once per n client updates", "argv": list(argv or sys.argv[1:]),
                "commit": checkout_commit(mark_changes=True)}
    t0 = time.monotonic()
    runs = []
    for i, seed in enumerate(seeds):  # each seed runs the methods in another order
        order = methods[i % len(methods):] + methods[:i % len(methods)]
        runs.extend(run_seed(seed, args.n, rounds, order, args.target, slow, slow_s))
    result = {"settings": settings, "runs": runs, "summary": summarize(runs, methods),
              "wall_s": time.monotonic() - t0, "loadavg": list(os.getloadavg())}
    for method, row in result["summary"].items():
        print(f"{method:20} median {row['median_time_to_target_s']} s "
              f"({row['reached']}/{row['seeds']}), x Flower FedAvg "
              f"{row['ratio_to_flower_fedavg']['geomean']}")
    save(result, args.out)
    return result


if __name__ == "__main__":
    main()
