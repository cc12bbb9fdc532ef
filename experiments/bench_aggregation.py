"""Server cost of one coded round at model scale, against Flower's FedAvg in the same run.

For params in {1e6, 1e7} (float32, 10 layers) and n in {20, 100} clients, code grouped-rs with
``s = n/5 - 1`` (FRC groups: 0/1 decoding, so replies travel in float32):

* ``fedavg_s``: Flower's ``FedAvg.aggregate_train`` on ``n - s`` ordinary replies (best of 3);
* ``coded_s``: ``GradientCoding.aggregate_train`` (wallclock configuration) on ``n - s`` coded
  replies of the same size, after each reply was validated once on arrival, structurally (what
  ``EarlyReturnGrid`` does while the round waits; values are checked in the decoding pass);
  ``validate_per_reply_s`` is that validation per reply and ``coded_with_validation_s`` the sum
  of both (best of 3; fresh messages each repeat);
* ``bytes_fedavg`` / ``bytes_coded``: one reply's array payload on the wire;
* ``reaction_ms_p50``: wallclock timing over the in-process grid, the replies that complete a
  decodable set become available at a known instant and the rest much later; the time from that
  instant until the round's ``send_and_receive`` returns (median of 5);
* ``peak_bytes``: peak traced memory (``tracemalloc``) of the coded aggregation above what the
  replies already hold, plus the replies' own bytes; compared with ``(replies + 2) x model``.

Run: ``python experiments/bench_aggregation.py [--quick]`` -> ``results/bench_aggregation.json``.
"""

from __future__ import annotations

import argparse
import gc
import logging
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
from _common import save

ROOT = Path(__file__).resolve().parents[1]
LAYERS = 10


def model(params: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    size = params // LAYERS
    return {f"layer{i}": rng.standard_normal(size).astype(np.float32) for i in range(LAYERS)}


def setup(n: int, s: int, params: int, wallclock: bool = False, delay=None):
    """A wrapper whose round ``1`` is configured over an in-process grid of ``n`` nodes."""
    from flwr.app import Array, ArrayRecord, ConfigRecord
    from flwr.clientapp import ClientApp
    from flwr.serverapp.strategy import FedAvg

    from fl_gradcode.flower import GradientCoding, gradient_coding_mod
    from fl_gradcode.flower.testing import InProcessGrid

    app = ClientApp(mods=[gradient_coding_mod])  # only answers the handshake here
    app.train()(lambda msg, ctx: None)
    grid = InProcessGrid(app, n, delay=delay)
    strategy = GradientCoding(
        FedAvg(fraction_evaluate=0.0, min_available_nodes=n, min_train_nodes=n),
        code="grouped-rs", s=s, timing="wallclock" if wallclock else "virtual", seed=0,
        straggler_timeout=60.0,
    )
    rng = np.random.default_rng(0)
    arrays = ArrayRecord({k: Array(v) for k, v in model(params, rng).items()})
    wrapped = strategy.wrap_grid(grid)
    return strategy, grid, wrapped, arrays, ConfigRecord({"lr": 0.1})


def coded_replies(strategy, messages, workers, params: int) -> list:
    """Honest coded replies (float32 when the wire is the model's dtype) for ``workers``."""
    from fl_gradcode.flower import protocol

    replies = []
    rng = np.random.default_rng(1)
    delta = model(params, rng)
    for worker in workers:
        msg = messages[worker]
        instruction = protocol.parse_instruction(msg.content)
        # honest: partition j's update is 0.01 (j + 1) delta, 100 examples each
        row = strategy._round.code.B[worker]
        factor = float(sum(row[j] * 0.01 * (j + 1) for j in np.flatnonzero(row)))
        coded = {k: v * np.float32(factor) for k, v in delta.items()}
        if instruction.wire != "model":
            coded = {k: v.astype(np.float64) for k, v in coded.items()}
        if not msg.metadata.message_id:
            msg.metadata.__dict__["_message_id"] = f"m{worker}"
        reply = protocol.train_reply(msg, instruction, coded, 100.0 * float(row.sum()),
                                     [100.0] * len(instruction.partition_ids), {}, 0.0)
        reply.metadata.__dict__["_src_node_id"] = msg.metadata.dst_node_id
        reply.metadata.__dict__["_message_id"] = f"r{worker}"
        replies.append(reply)
    return replies


def fedavg_replies(count: int, params: int) -> list:
    from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

    rng = np.random.default_rng(2)
    base = model(params, rng)
    replies = []
    for i in range(count):
        out = Message(RecordDict({"config": ConfigRecord({})}), dst_node_id=100 + i,
                      message_type="train")
        out.metadata.__dict__["_message_id"] = f"f{i}"
        content = RecordDict({
            "arrays": ArrayRecord({k: Array(v * np.float32(1 + i)) for k, v in base.items()}),
            "metrics": MetricRecord({"num-examples": 100 + i}),
        })
        replies.append(Message(content, reply_to=out))
    return replies


def decodable_workers(strategy) -> list[int]:
    """The first ``n - s`` workers in an order that decodes exactly only at the last one."""
    code = strategy._round.code
    n, s = code.n, code.s
    workers = list(range(n))[s:]  # the first s are the stragglers
    assert code.is_decodable(workers)
    return workers


def payload(msg) -> int:
    return sum(len(a.data) for rec in msg.content.array_records.values() for a in rec.values())


def bench(params: int, n: int, repeats: int) -> dict:
    from flwr.serverapp.strategy import FedAvg

    s = n // 5 - 1
    # wallclock configuration: replies are checked structurally on arrival and their values in
    # the decoding pass (the result is finite exactly when every reply it used is)
    strategy, _, wrapped, arrays, config = setup(n, s, params, wallclock=True)
    # FedAvg on the same number of replies
    count = n - s
    f_replies = fedavg_replies(count, params)
    fedavg = FedAvg()
    fed_times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fedavg.aggregate_train(1, f_replies)
        fed_times.append(time.perf_counter() - t0)
    bytes_fedavg = payload(f_replies[0])
    del f_replies
    gc.collect()
    coded_times, validate_times, peak = [], [], 0
    bytes_coded = 0
    model_bytes = params * 4
    for _ in range(repeats):
        msgs = list(strategy.configure_train(1, arrays, config, wrapped))
        by_worker = {strategy._round.cohort.index(m.metadata.dst_node_id): m for m in msgs}
        workers = decodable_workers(strategy)
        replies = coded_replies(strategy, by_worker, workers, params)
        bytes_coded = payload(replies[0])
        replies_bytes = sum(payload(r) for r in replies)
        gc.collect()
        tracemalloc.start()
        t0 = time.perf_counter()
        for reply in replies:  # what EarlyReturnGrid does as each reply arrives
            strategy.on_reply(reply)
        validate_times.append((time.perf_counter() - t0) / len(replies))
        t0 = time.perf_counter()
        out, _ = strategy.aggregate_train(1, replies)
        coded_times.append(time.perf_counter() - t0)
        _, traced = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert out is not None and strategy.history[-1]["decode"] == "exact"
        peak = max(peak, traced + replies_bytes)
        del replies, out
        gc.collect()
    reaction = reaction_ms(params, n, s)
    return {
        "params": params, "n": n, "s": s, "code": "grouped-rs", "replies": count,
        "wire": strategy.history[-1]["wire"],
        "fedavg_s": min(fed_times), "coded_s": min(coded_times),
        "validate_per_reply_s": min(validate_times),
        "coded_with_validation_s": min(coded_times) + count * min(validate_times),
        "speedup_vs_fedavg": min(fed_times) / min(coded_times),
        "speedup_with_validation": min(fed_times)
        / (min(coded_times) + count * min(validate_times)),
        "replies_read": strategy.history[-1]["replies_read"],
        "bytes_fedavg": bytes_fedavg, "bytes_coded": bytes_coded,
        "bytes_ratio": bytes_coded / bytes_fedavg,
        "reaction_ms_p50": reaction,
        "peak_bytes": peak, "peak_bound_bytes": (count + 2) * model_bytes,
        "peak_over_model": peak / model_bytes,
    }


def reaction_ms(params: int, n: int, s: int, repeats: int = 3) -> float:
    """Wallclock: the decodable set is complete at ``t_ready``; measure until return."""
    samples = []
    for _ in range(repeats):

        def delay(partition_id: int, rnd: int) -> float:
            if rnd == 0:  # the handshake
                return 0.0
            return 1.0 if partition_id >= s else 120.0  # the first s partitions straggle

        strategy, grid, wrapped, arrays, config = setup(n, s, params, wallclock=True, delay=delay)
        msgs = list(strategy.configure_train(1, arrays, config, wrapped))
        # answer with precomputed coded replies through the grid's delay mechanism
        by_worker = {strategy._round.cohort.index(m.metadata.dst_node_id): m for m in msgs}
        worker_of = {m.metadata.dst_node_id: w for w, m in by_worker.items()}
        # built before the round: pushing must not include the clients' serialization
        prebuilt = dict(zip(range(n), coded_replies(strategy, by_worker, range(n), params),
                            strict=True))
        for msg in msgs:
            msg.metadata.__dict__["_message_id"] = ""

        def run(msg, context, worker_of=worker_of, prebuilt=prebuilt):
            reply = prebuilt[worker_of[msg.metadata.dst_node_id]]
            reply.metadata.__dict__["_reply_to_message_id"] = msg.metadata.message_id
            return reply

        grid.apps = [run] * n
        wrapped.send_and_receive(msgs, timeout=60)
        t_end = time.monotonic()
        # the first decodable set is complete when, in order of availability, the replies
        # pullable so far first decode
        code = strategy._round.code
        available = {w: grid.available_at[by_worker[w].metadata.message_id] for w in range(n)}
        prefix, t_ready = [], None
        for w in sorted(range(n), key=available.__getitem__):
            prefix.append(w)
            if code.is_decodable(prefix):
                t_ready = available[w]
                break
        assert strategy.ready() and t_ready is not None
        samples.append((t_end - t_ready) * 1000)
        del prebuilt, grid, strategy, wrapped, msgs, run
        gc.collect()
    return float(statistics.median(samples))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default="results/bench_aggregation.json")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    logging.getLogger("flwr").setLevel(logging.WARNING)
    from fl_gradcode.flower.testing import set_task_identity

    set_task_identity()
    sizes = [(10_000, 20)] if args.quick else [
        (1_000_000, 20), (1_000_000, 100), (10_000_000, 20), (10_000_000, 100)
    ]
    repeats = 1 if args.quick else 3
    rows = []
    print(f"{'params':>10}{'n':>5}{'wire':>9}{'read':>5}{'FedAvg s':>10}{'coded s':>9}{'x':>7}"
          f"{'+valid.':>9}{'x':>7}{'MB fedavg':>10}{'MB coded':>9}{'react ms':>9}"
          f"{'peak/model':>11}")
    for params, n in sizes:
        row = bench(params, n, repeats)
        rows.append(row)
        print(f"{params:>10}{n:>5}{row['wire']:>9}{row['replies_read']:>5}{row['fedavg_s']:>10.3f}"
              f"{row['coded_s']:>9.3f}{row['speedup_vs_fedavg']:>6.1f}x"
              f"{row['coded_with_validation_s']:>9.3f}{row['speedup_with_validation']:>6.1f}x"
              f"{row['bytes_fedavg'] / 1e6:>10.1f}"
              f"{row['bytes_coded'] / 1e6:>9.1f}{row['reaction_ms_p50']:>9.1f}"
              f"{row['peak_over_model']:>8.1f} (bound {row['replies'] + 2})", flush=True)
    result = {"benchmark": "bench_aggregation", "quick": args.quick, "rows": rows}
    save(result, args.out)
    return result


if __name__ == "__main__":
    main()
