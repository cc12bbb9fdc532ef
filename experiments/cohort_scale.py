"""Client sampling at scale: 1,000 nodes, FedAvg samples a 100-node cohort per round, the code is
built over each cohort (k = 100: the members' own partitions replicated among them).

Runs the real ``GradientCoding`` wrapper around Flower's ``FedAvg(fraction_train=0.1)`` and the
real ``gradient_coding_mod`` + ClientApp over the in-process grid (no Ray: 1,000 Ray actors do
not fit 2 cores), in virtual time, with Pareto stragglers. Reports per round the server's wall
time (the in-process clients' computation and the handshake with new cohort members included),
the peak traced Python memory of the round (``tracemalloc``; clients included, so an upper bound
for the server), and checks each round against the cohort's example-weighted average computed
independently (plain numpy over the cohort's partitions).

Run: ``python -m experiments.cohort_scale [--quick]`` -> ``results/cohort_scale.json``.
"""

from __future__ import annotations

import argparse
import logging
import time
import tracemalloc
from pathlib import Path

import numpy as np

from experiments.common import save

ROOT = Path(__file__).resolve().parents[1]


def make_app(num_features: int, classes: int):
    """A tiny deterministic app (one gradient step of softmax regression on the node's own
    synthetic partition); its train handler is the quickstart's shape."""
    from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp

    from fl_gradcode.flower import gradient_coding_mod

    def partition(pid: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng([7, pid])
        size = 20 + pid % 17
        x = rng.standard_normal((size, num_features))
        y = rng.integers(0, classes, size)
        return x, y

    def step(w: np.ndarray, x: np.ndarray, y: np.ndarray, lr: float) -> np.ndarray:
        logits = x @ w
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        p[np.arange(len(y)), y] -= 1.0
        return w - lr * x.T @ p / len(y)

    def train(msg: Message, context) -> Message:
        pid = int(context.node_config["partition-id"])
        x, y = partition(pid)
        w = msg.content["arrays"]["w"].numpy()
        new = step(w, x, y, float(msg.content["config"]["lr"]))
        return Message(
            RecordDict({"arrays": ArrayRecord({"w": Array(new)}),
                        "metrics": MetricRecord({"num-examples": len(y)})}),
            reply_to=msg,
        )

    app = ClientApp(mods=[gradient_coding_mod])
    app.train()(train)
    return app, partition, step


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default="results/cohort_scale.json")
    args = parser.parse_args(argv)
    logging.getLogger("flwr").setLevel(logging.WARNING)
    from flwr.app import Array, ArrayRecord, ConfigRecord
    from flwr.serverapp.strategy import FedAvg

    from fl_gradcode.flower import GradientCoding
    from fl_gradcode.flower.testing import InProcessGrid
    from fl_gradcode.latency import Pareto

    nodes, cohort, s, rounds = (200, 20, 2, 2) if args.quick else (1000, 100, 10, 5)
    features, classes = 64, 10
    app, partition, step = make_app(features, classes)
    grid = InProcessGrid(app, nodes)
    strategy = GradientCoding(
        FedAvg(fraction_train=cohort / nodes, fraction_evaluate=0.0, min_available_nodes=nodes),
        code="grouped-rs", s=s, timing="virtual", latency=Pareto(scale=1.0, shape=1.5), seed=0,
    )
    w0 = np.zeros((features, classes))
    arrays = ArrayRecord({"w": Array(w0)})
    config = ConfigRecord({"lr": 0.5})
    wrapped = strategy.wrap_grid(grid)
    rows = []
    tracemalloc.start()
    for rnd in range(1, rounds + 1):
        tracemalloc.reset_peak()
        t0 = time.perf_counter()
        msgs = list(strategy.configure_train(rnd, arrays, config, wrapped))
        replies = wrapped.send_and_receive(msgs, timeout=600)
        new, _ = strategy.aggregate_train(rnd, replies)
        wall = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
        row = strategy.history[-1] if strategy.history else {}
        # independent oracle: the cohort's example-weighted average of one gradient step
        cohort_pids = sorted(strategy.identities[node].partition_id
                             for node in strategy.current_round.cohort)
        w = arrays["w"].numpy()
        num = sum(len(partition(p)[1]) * step(w, *partition(p), 0.5) for p in cohort_pids)
        den = sum(len(partition(p)[1]) for p in cohort_pids)
        expected = num / den
        err = None
        if new is not None:
            got = new["w"].numpy()
            err = float(np.linalg.norm(got - expected) / np.linalg.norm(expected))
            arrays = new
        rows.append({"round": rnd, "wall_s": wall, "peak_traced_mb": peak / 1e6,
                     "cohort": len(cohort_pids), "decode": row.get("decode"),
                     "clients_used": len(row.get("clients_used", [])),
                     "relative_error_vs_oracle": err})
        print(f"round {rnd}: {wall:6.2f} s wall, peak {peak / 1e6:7.1f} MB, cohort "
              f"{len(cohort_pids)}, {row.get('decode')} from {rows[-1]['clients_used']}, "
              f"rel. error {err}")
    tracemalloc.stop()
    result = {"benchmark": "cohort_scale", "quick": args.quick, "nodes": nodes,
              "cohort": cohort, "s": s, "model_params": features * classes, "rows": rows}
    save(result, args.out)
    return result


if __name__ == "__main__":
    main()
