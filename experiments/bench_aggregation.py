"""Server cost of one coded round at model scale, against Flower's FedAvg in the same run.

Grid (defaults): params in {1e6, 1e7} float32 parameters (10 layers), n in {20, 100}, s in
{2, 4, n/8}, every exact code (grouped-rs, frc where ``(s+1) | n``, crc, nested,
comm-efficient whose replies are ``1/m`` of the model; a combination a code refuses, a code
tolerating fewer than ``s`` stragglers or an approximate code is listed under ``skipped`` with
its reason). Each configuration runs with the
wire ``wire="auto"`` chooses and, when that is float64, once more with ``wire="model"``.
Replies are honest (partition ``j``'s update is ``0.01 (j+1) delta``, 100 examples each) from
the ``n - s`` workers left by a seeded random straggler pattern. Per row:

* ``fedavg_s``: Flower's ``FedAvg.aggregate_train`` on ``replies = n - s`` ordinary replies
  (``fedavg_buffers``: ``"shared"`` when distinct replies would hold more than 2 GB: one set
  of bytes behind every reply, which FedAvg reads layer by layer, 4 MB layers long gone from
  the cache when the next reply reads them);
* ``coded_s``: ``GradientCoding.aggregate_train`` (wallclock configuration) on the coded
  replies, after each was validated once on arrival, structurally (what ``EarlyReturnGrid``
  does while the round waits; values are checked in the decoding pass);
  ``validate_per_reply_s`` is that validation per reply and ``coded_with_validation_s`` the
  sum of both. FedAvg and coded are timed in the same process, interleaved, fresh messages
  each repeat; each figure is the median of ``--repeats`` (>= 3);
* ``bytes_fedavg`` / ``bytes_coded``: one reply's array payload on the wire;
* ``reaction_ms_p50`` (definition unchanged): wallclock round over the in-process grid, the
  replies that complete a decodable set become pullable at a known instant and the stragglers'
  120 s later; the time from that instant until the round's ``send_and_receive`` returns
  (median); ``result_ms_p50``: from the same instant until ``aggregate_train`` has returned
  the inner strategy's result (reaction + decoding);
* ``peak_bytes``: peak traced memory (``tracemalloc``, in a separate untimed repeat) of the
  validation and the aggregation above what the replies already hold, plus the replies' own
  bytes; ``peak_bound_bytes`` = ``(replies + 2) x model``;
* ``relative_error``: ``||decoded - reference|| / ||reference||`` of the decoded average
  against the float64 numpy reference; ``load_avg``: ``os.getloadavg()`` before the row.

Run: ``python -m experiments.bench_aggregation [--quick] [--codes grouped-rs,crc]
[--params 1000000] [--n 20,100] [--s 2,4,n/8] [--merge]`` -> ``results/bench_aggregation.json``
(``--merge`` keeps the rows of configurations this run does not measure: a grid too long for
one sitting is built in parts; every part's command is listed under ``runs``).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

from experiments.common import save

ROOT = Path(__file__).resolve().parents[1]
LAYERS = 10
CODES = ("grouped-rs", "frc", "crc", "nested", "comm-efficient")
DEFINITIONS = {
    "reaction_ms_p50": "median wallclock ms from the instant the replies completing a decodable "
                       "set become pullable until the round's send_and_receive returns",
    "result_ms_p50": "median wallclock ms from that instant until aggregate_train has returned "
                     "the inner strategy's result",
    "fedavg_s": "median s of flwr FedAvg.aggregate_train on `replies` replies",
    "coded_s": "median s of GradientCoding.aggregate_train on the same number of coded replies, "
               "each validated structurally on arrival (validate_per_reply_s) beforehand",
    "peak_bytes": "tracemalloc peak of validation + aggregation + the replies' bytes",
}


def model(params: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    size = params // LAYERS
    return {f"layer{i}": rng.standard_normal(size).astype(np.float32) for i in range(LAYERS)}


def setup(code: str, n: int, s: int, params: int, wire: str, delay=None):
    """A wallclock wrapper whose round ``1`` is configured over an in-process grid of ``n``
    nodes (model zero: the decoded model is the average itself)."""
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
        code=code, s=s, timing="wallclock", seed=0, straggler_timeout=60.0, wire=wire,
    )
    size = params // LAYERS
    arrays = ArrayRecord({f"layer{i}": Array(np.zeros(size, np.float32)) for i in range(LAYERS)})
    wrapped = strategy.wrap_grid(grid)
    return strategy, grid, wrapped, arrays, ConfigRecord({"lr": 0.1})


def configure(strategy, wrapped, arrays, config) -> dict:
    """Round 1's messages by worker."""
    msgs = list(strategy.configure_train(1, arrays, config, wrapped))
    return {strategy.current_round.cohort.index(m.metadata.dst_node_id): m for m in msgs}


def payloads(code, workers, params: int, float64: bool) -> dict:
    """Honest coded payloads (``ArrayRecord`` per worker): partition ``j``'s update is
    ``0.01 (j + 1) delta`` with 100 examples, so worker ``i`` sends
    ``sum_j B_ij 100 * 0.01 (j + 1) delta``; also the float64 reference average."""
    from flwr.app import Array, ArrayRecord

    from fl_gradcode.flower import protocol

    delta = model(params, np.random.default_rng(1))
    out = {}
    for worker in workers:
        row = code.B[worker]
        factor = float(sum(row[j] * (j + 1) for j in np.flatnonzero(row)))  # 100 * 0.01
        if code.chunks > 1:  # communication-efficient: 1/m of [arrays..., count]
            out[worker] = ArrayRecord({protocol.CHUNK_KEY: Array(chunk(
                code, worker, delta, factor, 100.0 * float(row.sum()), float64))})
            continue
        arrays = {}
        for k, v in delta.items():
            arrays[k] = (v.astype(np.float64) * factor if float64
                         else v * np.float32(factor))
        out[worker] = ArrayRecord({k: Array(v) for k, v in arrays.items()})
    k = code.k
    mean = sum(0.01 * (j + 1) for j in range(k)) / k  # equal sizes
    reference = {name: v.astype(np.float64) * mean for name, v in delta.items()}
    return out, reference


def chunk(code, worker: int, delta: dict, factor: float, count: float,
          float64: bool) -> np.ndarray:
    """A communication-efficient reply from its definition (Ye and Abbe 2018): the flattened
    ``[factor * delta..., count]`` zero-padded to ``m L`` and mixed by the worker's column of
    ``Gamma`` (``code.chunk_coefficients``), in the wire's dtype."""
    gamma = np.asarray(code.chunk_coefficients(worker), dtype=np.float64)
    length = sum(v.size for v in delta.values()) + 1
    width = -(-length // gamma.size)
    padded = np.zeros(gamma.size * width)
    at = 0
    for v in delta.values():
        padded[at:at + v.size] = v.astype(np.float64) * factor
        at += v.size
    padded[at] = count
    mixed = gamma @ padded.reshape(gamma.size, width)
    return mixed if float64 else mixed.astype(np.float32)


def coded_replies(strategy, messages: dict, workers, cached: dict) -> list:
    """Fresh reply messages of ``workers`` for this round around the ``cached`` payloads."""
    from fl_gradcode.flower import protocol

    replies = []
    for worker in workers:
        msg = messages[worker]
        instruction = protocol.parse_instruction(msg.content)
        row = strategy.current_round.code.B[worker]
        if not msg.metadata.message_id:
            msg.metadata.__dict__["_message_id"] = f"m{worker}"
        reply = protocol.train_reply(msg, instruction, {}, 100.0 * float(row.sum()),
                                     [100.0] * len(instruction.partition_ids), {}, 0.0)
        reply.content[protocol.PROTOCOL_KEY] = cached[worker]
        reply.metadata.__dict__["_src_node_id"] = msg.metadata.dst_node_id
        reply.metadata.__dict__["_message_id"] = f"r{worker}"
        replies.append(reply)
    return replies


def fedavg_replies(count: int, params: int, shared: bool = False) -> list:
    """``count`` ordinary replies; ``shared``: one set of array bytes for all (FedAvg reads a
    whole layer per reply and step, so at 4 MB layers a layer's bytes have left the cache
    before the next reply reads them: the time is the same, the memory ``1/count``)."""
    from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

    base = model(params, np.random.default_rng(2))
    one = {k: Array(v) for k, v in base.items()}
    replies = []
    for i in range(count):
        out = Message(RecordDict({"config": ConfigRecord({})}), dst_node_id=100 + i,
                      message_type="train")
        out.metadata.__dict__["_message_id"] = f"f{i}"
        arrays = (one if shared else
                  {k: Array(v * np.float32(1 + i)) for k, v in base.items()})
        content = RecordDict({
            "arrays": ArrayRecord(dict(arrays)),
            "metrics": MetricRecord({"num-examples": 100 + i}),
        })
        replies.append(Message(content, reply_to=out))
    return replies


def payload(msg) -> int:
    return sum(len(a.data) for rec in msg.content.array_records.values() for a in rec.values())


def stragglers_of(n: int, s: int, seed: int) -> list[int]:
    """The seeded random straggler pattern of a configuration."""
    return sorted(np.random.default_rng([seed, n, s]).choice(n, size=s, replace=False).tolist())


def relative_error(arrays, reference: dict) -> float:
    num = sum(float(np.sum((arrays[k].numpy().astype(np.float64) - r) ** 2))
              for k, r in reference.items())
    den = sum(float(np.sum(r ** 2)) for r in reference.values())
    return float(np.sqrt(num / den))


def bench(code_name: str, params: int, n: int, s: int, wire: str, repeats: int, seed: int,
          reaction_delay: float) -> dict:
    from flwr.serverapp.strategy import FedAvg

    load = os.getloadavg()
    strategy, _, wrapped, arrays, config = setup(code_name, n, s, params, wire)
    by_worker = configure(strategy, wrapped, arrays, config)
    code = strategy.current_round.code
    stragglers = stragglers_of(n, s, seed)
    workers = [w for w in range(n) if w not in stragglers]
    assert code.is_decodable(workers), (code_name, n, s, stragglers)
    float64 = strategy.current_round.wire != "model"
    cached, reference = payloads(code, workers, params, float64)
    for w in stragglers:  # never pulled, never read: any well-formed payload
        cached[w] = cached[workers[0]]
    count = len(workers)
    shared = fedavg_shared(params, count)
    f_replies = fedavg_replies(count, params, shared)
    fedavg = FedAvg()
    fed_times, coded_times, validate_times = [], [], []
    model_bytes = params * 4
    row: dict = {}
    for r in range(repeats + 1):  # the last repeat: untimed, traced (peak memory)
        traced = r == repeats
        if r:
            strategy, _, wrapped, arrays, config = setup(code_name, n, s, params, wire)
            by_worker = configure(strategy, wrapped, arrays, config)
        replies = coded_replies(strategy, by_worker, workers, cached)
        gc.collect()
        if not traced:
            t0 = time.perf_counter()
            fedavg.aggregate_train(1, f_replies)
            fed_times.append(time.perf_counter() - t0)
            gc.collect()
        else:
            tracemalloc.start()
        t0 = time.perf_counter()
        for reply in replies:  # what EarlyReturnGrid does as each reply arrives
            strategy.on_reply(reply)
        t1 = time.perf_counter()
        out, _ = strategy.aggregate_train(1, replies)
        t2 = time.perf_counter()
        last = strategy.history[-1]
        assert out is not None and last["decode"] == "exact", last
        if traced:
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            replies_bytes = sum(payload(x) for x in replies)
            row["peak_bytes"] = peak + replies_bytes
            row["relative_error"] = relative_error(out, reference)
        else:
            validate_times.append((t1 - t0) / count)
            coded_times.append(t2 - t1)
        row.update(wire=last["wire"], replies_read=last["replies_read"],
                   bytes_coded=payload(replies[0]))
        del replies, out
        gc.collect()
    bytes_fedavg = payload(f_replies[0])
    del f_replies
    gc.collect()
    reaction, result = reaction_ms(code_name, n, s, params, wire, stragglers, cached,
                                   repeats=max(1, repeats), delay=reaction_delay)
    med = statistics.median
    fed, coded, validate = med(fed_times), med(coded_times), med(validate_times)
    return {
        "params": params, "n": n, "s": s, "code": code_name, "wire_requested": wire,
        "wire": row["wire"], "replies": count, "replies_read": row["replies_read"],
        "stragglers": stragglers,
        "fedavg_s": fed, "coded_s": coded, "coded_over_fedavg": coded / fed,
        "speedup_vs_fedavg": fed / coded,
        "validate_per_reply_s": validate,
        "coded_with_validation_s": coded + count * validate,
        "speedup_with_validation": fed / (coded + count * validate),
        "fedavg_s_all": fed_times, "coded_s_all": coded_times,
        "bytes_fedavg": bytes_fedavg, "bytes_coded": row["bytes_coded"],
        "bytes_ratio": row["bytes_coded"] / bytes_fedavg,
        "reaction_ms_p50": reaction, "result_ms_p50": result,
        "peak_bytes": row["peak_bytes"], "peak_bound_bytes": (count + 2) * model_bytes,
        "peak_over_model": row["peak_bytes"] / model_bytes,
        "relative_error": row["relative_error"],
        "fedavg_buffers": "shared" if shared else "distinct",
        "load_avg": [round(x, 2) for x in load],
    }


def reaction_ms(code_name: str, n: int, s: int, params: int, wire: str, stragglers, cached,
                repeats: int, delay: float) -> tuple[float, float]:
    """Wallclock: the decodable set is complete at ``t_ready``; ms until the grid returns and
    until ``aggregate_train`` returns (medians)."""
    late = set(stragglers)
    samples, results = [], []
    for _ in range(repeats):

        def hold(partition_id: int, rnd: int) -> float:
            if rnd == 0:  # the handshake
                return 0.0
            return 120.0 if partition_id in late else delay

        strategy, grid, wrapped, arrays, config = setup(code_name, n, s, params, wire,
                                                        delay=hold)
        by_worker = configure(strategy, wrapped, arrays, config)
        worker_of = {m.metadata.dst_node_id: w for w, m in by_worker.items()}
        # built before the round: pushing must not include the clients' serialization
        prebuilt = dict(zip(range(n), coded_replies(strategy, by_worker, range(n), cached),
                            strict=True))
        for msg in by_worker.values():
            msg.metadata.__dict__["_message_id"] = ""

        def run(msg, context, worker_of=worker_of, prebuilt=prebuilt):
            reply = prebuilt[worker_of[msg.metadata.dst_node_id]]
            reply.metadata.__dict__["_reply_to_message_id"] = msg.metadata.message_id
            return reply

        grid.apps = [run] * n
        replies = wrapped.send_and_receive(list(by_worker.values()), timeout=60)
        t_end = time.monotonic()
        out, _ = strategy.aggregate_train(1, replies)
        t_result = time.monotonic()
        assert out is not None
        # the first decodable set is complete when, in order of availability, the replies
        # pullable so far first decode
        code = strategy.current_round.code
        available = {w: grid.available_at[by_worker[w].metadata.message_id] for w in range(n)}
        prefix, t_ready = [], None
        for w in sorted(range(n), key=available.__getitem__):
            prefix.append(w)
            if code.is_decodable(prefix):
                t_ready = available[w]
                break
        assert t_ready is not None
        samples.append((t_end - t_ready) * 1000)
        results.append((t_result - t_ready) * 1000)
        del prebuilt, grid, strategy, wrapped, by_worker, run, replies, out
        gc.collect()
    return float(statistics.median(samples)), float(statistics.median(results))


def fedavg_shared(params: int, count: int) -> bool:
    """FedAvg's replies share their bytes when they would hold more than 2 GB."""
    return params * 4 * count > 2e9


def auto_float64(code) -> bool:
    from fl_gradcode.flower.decoder import Decoder

    return Decoder(None, wire="auto", seed=0).wire_for(code) != "model"


def memory_needed(code, params: int, n: int, s: int, wire: str) -> int:
    """Bytes a row holds at once: the workers' payloads (8-byte values on a float64 wire),
    FedAvg's replies and a few models of working memory."""
    float64 = wire == "float64" or (wire == "auto" and auto_float64(code))
    fedavg = 1 if fedavg_shared(params, n - s) else n - s
    return params * ((n - s) * (8 if float64 else 4) + fedavg * 4 + 6 * 8)


def available_memory() -> int:
    """``MemAvailable`` of ``/proc/meminfo`` (no limit where it cannot be read)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62


def _key(row: dict) -> tuple:
    return (row["params"], row["n"], row["s"], row["code"], row.get("wire_requested", "auto"))


def merged(old: dict, rows: list, skipped: list, command: str) -> tuple[list, list, list]:
    """This run's rows and skips, plus the earlier ones of configurations it did not
    measure (in the grid's order: params, n, s, code)."""
    done = {_key(r)[:4] for r in rows} | {_key(s)[:4] for s in skipped}
    kept = [r for r in old.get("rows", []) if _key(r)[:4] not in done]
    kept_skips = [s for s in old.get("skipped", []) if _key(s)[:4] not in done]
    order = {c: i for i, c in enumerate(CODES)}

    def sort(items):
        return sorted(items, key=lambda r: (r["params"], r["n"], r["s"],
                                            order.get(r["code"], len(order)), r["code"],
                                            r.get("wire_requested", "auto") != "auto"))

    return sort(kept + rows), sort(kept_skips + skipped), [*old.get("runs", []), command]


def parse_list(text: str, kind=int) -> list:
    return [kind(float(x)) if kind is int else kind(x) for x in text.split(",") if x.strip()]


def s_values(tokens: list[str], n: int) -> list[int]:
    """``2``, ``4``, ``n/8`` -> distinct values of ``s`` for ``n``."""
    out = []
    for token in tokens:
        value = n // int(token[2:]) if token.startswith("n/") else int(token)
        if value not in out:
            out.append(value)
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small smoke setting")
    parser.add_argument("--codes", default=",".join(CODES))
    parser.add_argument("--params", default=None, help="e.g. 1e6,1e7")
    parser.add_argument("--n", default=None, help="e.g. 20,100")
    parser.add_argument("--s", default="2,4,n/8", help="values or n/<d>, e.g. 2,4,n/8")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-model-variant", action="store_true",
                        help="skip the wire='model' row of codes that auto-choose float64")
    parser.add_argument("--out", default="results/bench_aggregation.json")
    parser.add_argument("--merge", action="store_true",
                        help="keep the rows of --out this run does not measure again")
    args = parser.parse_args(argv)
    logging.getLogger("flwr").setLevel(logging.WARNING)
    from fl_gradcode.codes import make_code
    from fl_gradcode.flower.testing import set_task_identity

    set_task_identity()
    params_list = parse_list(args.params or ("10000" if args.quick else "1e6,1e7"))
    n_list = parse_list(args.n or ("20" if args.quick else "20,100"))
    codes = [c.strip() for c in args.codes.split(",") if c.strip()]
    repeats = args.repeats or (1 if args.quick else 3)
    delay = 0.05 if args.quick else 1.0
    rows, skipped = [], []
    print(f"{'params':>9}{'n':>4}{'s':>3} {'code':<11}{'wire':>8}{'rep':>4}{'read':>5}"
          f"{'FedAvg s':>9}{'coded s':>9}{'c/F':>6}{'react':>7}{'result':>7}{'MB c/F':>7}"
          f"{'peak/(r+2)':>11}{'rel.err':>9}{'load':>6}")
    for params in params_list:
        for n in n_list:
            for s in s_values([t.strip() for t in args.s.split(",")], n):
                for name in codes:
                    try:
                        code = make_code(name, n, s, seed=0)
                    except ValueError as exc:
                        skipped.append({"params": params, "n": n, "s": s, "code": name,
                                        "reason": str(exc)})
                        continue
                    if not code.is_exact:
                        skipped.append({"params": params, "n": n, "s": s, "code": name,
                                        "reason": "not an exact code"})
                        continue
                    if code.s < s:
                        skipped.append({"params": params, "n": n, "s": s, "code": name,
                                        "reason": f"tolerates {code.s} stragglers, not s={s}"})
                        continue
                    wires = ["auto"]
                    while wires:
                        wire = wires.pop(0)
                        need = memory_needed(code, params, n, s, wire)
                        if need > 0.8 * available_memory():
                            skipped.append({"params": params, "n": n, "s": s, "code": name,
                                            "wire_requested": wire,
                                            "reason": f"needs ~{need / 1e9:.1f} GB, more than "
                                                      "80% of the memory available"})
                            if (wire == "auto" and auto_float64(code)
                                    and not args.no_model_variant):
                                wires.append("model")
                            continue
                        row = bench(name, params, n, s, wire, repeats, args.seed, delay)
                        rows.append(row)
                        if wire == "auto" and row["wire"] != "model" and not args.no_model_variant:
                            wires.append("model")
                        print(f"{params:>9.0e}{n:>4}{s:>3} {name:<11}{row['wire']:>8}"
                              f"{row['replies']:>4}{row['replies_read']:>5}"
                              f"{row['fedavg_s']:>9.3f}{row['coded_s']:>9.3f}"
                              f"{row['coded_over_fedavg']:>6.2f}{row['reaction_ms_p50']:>7.1f}"
                              f"{row['result_ms_p50']:>7.1f}{row['bytes_ratio']:>7.1f}"
                              f"{row['peak_bytes'] / row['peak_bound_bytes']:>11.2f}"
                              f"{row['relative_error']:>9.1e}{row['load_avg'][0]:>6.2f}",
                              flush=True)
    command = " ".join(["python -m experiments.bench_aggregation",
                        *(sys.argv[1:] if argv is None else argv)])
    runs = [command]
    if args.merge and Path(args.out).exists():
        rows, skipped, runs = merged(json.loads(Path(args.out).read_text()), rows, skipped,
                                     command)
    result = {"benchmark": "bench_aggregation", "quick": args.quick, "repeats": repeats,
              "seed": args.seed, "definitions": DEFINITIONS, "rows": rows,
              "skipped": skipped, "runs": runs}
    save(result, args.out)
    return result


if __name__ == "__main__":
    main()
