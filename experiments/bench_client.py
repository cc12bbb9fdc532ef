"""Client cost of ``gradient_coding_mod`` at model scale: time and peak memory beyond the app's
own training, for ``s+1`` partitions of a 10M-parameter CNN.

The same ClientApp (``experiments/perf_app.py``, its train handler timed from inside) runs the
same ``s+1`` partitions twice per repetition, interleaved: once as ``s+1`` plain train messages
(what ``s+1`` FedAvg clients would run), once as ONE coded train message through
``gradient_coding_mod``. The mod's overhead is the coded call's wall time minus the time spent
inside the app's handler during that call (measured in the same call, so training noise does
not enter it). Reported per setting (medians over the repetitions):

* ``mod_overhead_s`` and its ratio to one partition's training step (``app_partition_s``, the
  handler's time for one partition; goal <= 5 %) and to the whole app time;
* ``components_s``: the operations the mod performs, timed alone on the same arrays (an
  attribution, not a second measurement): ``deserialize`` (the app's ``s+1`` replies read as
  arrays), ``encode`` (the float64 differences ``theta_j - theta`` and their weighted sum),
  ``serialize`` (the one reply in the wire dtype, ``protocol.npy_array``);
* ``peak_extra_bytes``: peak traced memory (``tracemalloc``: numpy and Python allocations;
  torch's own tensors are not traced) of the coded call minus that of one plain partition call,
  also in units of the model's float32 size (``peak_extra_models``);
* ``reply_bytes`` (coded) and ``plain_reply_bytes`` (one FedAvg client's reply).

Settings: ``s`` in {2, 4}, wire ``model`` (float32) and ``float64``, and one setting with five
local epochs per partition (``local_epochs``: the mod's cost does not grow with the training).

The coded reply is checked against the example-weighted combination computed here from the
plain replies in numpy (``max_rel_error``).

Run: ``python -m experiments.bench_client`` -> ``results/bench_client.json``;
``--quick``: the 4.8k-parameter MLP, one repetition (smoke tests).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import tracemalloc
from pathlib import Path

import numpy as np

from experiments.common import save

ROOT = Path(__file__).resolve().parents[1]
HIDDEN_10M = 1084  # Net(1084): 10.0M parameters


def _median(xs: list[float]) -> float:
    return float(statistics.median(xs))


def _reply_bytes(msg) -> int:
    return sum(len(a.data) for rec in msg.content.array_records.values() for a in rec.values())


def measure(hidden: int, s: int, k: int, wire: str, reps: int, seed: int = 0,
            epochs: int = 1) -> dict:
    from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
    from flwr.clientapp import ClientApp

    from experiments import perf_app
    from fl_gradcode.codes import make_code
    from fl_gradcode.flower import gradient_coding_mod, protocol
    from fl_gradcode.flower.testing import set_task_identity

    set_task_identity()
    inside: list[float] = []

    def timed_train(msg, context):
        t0 = time.perf_counter()
        try:
            return perf_app.train(msg, context)
        finally:
            inside.append(time.perf_counter() - t0)

    coded_app, plain_app = ClientApp(mods=[gradient_coding_mod]), ClientApp()
    coded_app.train()(timed_train)
    plain_app.train()(timed_train)
    code = make_code("grouped-rs", k, s, seed=seed)
    worker = 0
    pids = tuple(int(j) for j in code.assignment(worker))
    coefs = tuple(float(c) for c in code.encoding_coefficients(worker))
    arrays = perf_app.initial_arrays(hidden, seed)
    params = sum(int(np.prod(a.shape)) for a in arrays.values())
    content = RecordDict({"arrays": arrays,
                          "config": ConfigRecord({"hidden": hidden, "lr": 0.05,
                                                  "local-epochs": epochs})})
    instruction = protocol.Instruction(
        op="train", round=1, worker=worker, seed=seed, nonce="bench", partition_ids=pids,
        num_partitions=(k,) * len(pids), coefficients=coefs, wire=wire)

    def ctx(pid: int) -> Context:
        return Context(run_id=1, node_id=1, node_config={"partition-id": pid,
                                                         "num-partitions": k},
                       state=RecordDict(), run_config={})

    rows: dict[str, list[float]] = {key: [] for key in
                                    ("plain_total_s", "app_partition_s", "coded_total_s",
                                     "coded_app_s", "mod_overhead_s")}
    plain_replies, coded_reply = [], None

    def plain_round() -> list:
        return [plain_app(Message(content, dst_node_id=1, message_type=MessageType.TRAIN),
                          ctx(pid)) for pid in pids]

    def coded_call():
        reply = coded_app(protocol.instruction_message(content, instruction, 1, "1"),
                          ctx(pids[0]))
        if reply.has_error():
            raise RuntimeError(reply.error.reason)
        return reply

    plain_round(), coded_call()  # warm-up (data loading, first-call costs)
    for _ in range(reps):
        # s+1 plain calls (FedAvg's clients), then one coded call: interleaved per repetition
        inside.clear()
        t0 = time.perf_counter()
        plain_replies = plain_round()
        rows["plain_total_s"].append(time.perf_counter() - t0)
        rows["app_partition_s"].append(_median(inside))
        inside.clear()
        t0 = time.perf_counter()
        coded_reply = coded_call()
        total = time.perf_counter() - t0
        rows["coded_total_s"].append(total)
        rows["coded_app_s"].append(sum(inside))
        rows["mod_overhead_s"].append(total - sum(inside))
    # memory in a pass of its own (tracemalloc slows every allocation: never timed)
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    plain_app(Message(content, dst_node_id=1, message_type=MessageType.TRAIN), ctx(pids[0]))
    plain_peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    coded_call()
    coded_peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    # independent check: the example-weighted combination of the plain replies, in numpy
    theta = {name: np.asarray(a.numpy(), np.float64) for name, a in arrays.items()}
    expected = {name: np.zeros_like(v) for name, v in theta.items()}
    for coef, reply in zip(coefs, plain_replies, strict=True):
        count = float(reply.content["metrics"]["num-examples"])
        for name in theta:
            expected[name] += coef * count * (
                np.asarray(reply.content["arrays"][name].numpy(), np.float64) - theta[name])
    got = coded_reply.content[protocol.PROTOCOL_KEY]
    err = max(float(np.linalg.norm(np.asarray(got[n].numpy(), np.float64) - expected[n])
                    / max(np.linalg.norm(expected[n]), 1e-300)) for n in theta)
    components = _components(plain_replies, arrays, coefs, wire, reps)
    med = {key: _median(v) for key, v in rows.items()}
    model_bytes = 4 * params
    return {
        "params": params, "hidden": hidden, "s": s, "k": k, "wire": wire, "reps": reps,
        "local_epochs": epochs,
        **med,
        "mod_overhead_vs_partition": med["mod_overhead_s"] / med["app_partition_s"],
        "mod_overhead_vs_app": med["mod_overhead_s"] / med["coded_app_s"],
        "coded_vs_plain": med["coded_total_s"] / med["plain_total_s"],
        "components_s": components,
        "peak_coded_bytes": coded_peak, "peak_plain_bytes": plain_peak,
        "peak_extra_bytes": coded_peak - plain_peak,
        "peak_extra_models": (coded_peak - plain_peak) / model_bytes,
        "reply_bytes": _reply_bytes(coded_reply),
        "plain_reply_bytes": _reply_bytes(plain_replies[0]),
        "max_rel_error": err,
        "raw": rows,
        "loadavg": list(os.getloadavg()),
    }


def _components(replies, arrays, coefs, wire: str, reps: int) -> dict[str, float]:
    """The mod's operations timed alone on the same arrays (medians)."""
    from fl_gradcode.flower import protocol
    from fl_gradcode.flower.encoding import coded_update

    names = list(arrays.keys())
    times: dict[str, list[float]] = {"deserialize": [], "encode": [], "serialize": []}
    for _ in range(max(reps, 3)):
        t0 = time.perf_counter()
        views = [{n: protocol.array_view(r.content["arrays"][n]) for n in names}
                 for r in replies]
        theta = {n: protocol.array_view(arrays[n]) for n in names}
        t1 = time.perf_counter()
        weights = [coef * float(reply.content["metrics"]["num-examples"])
                   for coef, reply in zip(coefs, replies, strict=True)]
        dtype = np.float32 if wire == "model" else np.float64
        # the mod's own sum, written in the wire dtype
        coded = coded_update(weights, views, theta, dict.fromkeys(names, dtype))
        t2 = time.perf_counter()
        _ = [protocol.npy_array(coded[n], dtype) for n in names]
        t3 = time.perf_counter()
        times["deserialize"].append(t1 - t0)
        times["encode"].append(t2 - t1)
        times["serialize"].append(t3 - t2)
    return {key: _median(v) for key, v in times.items()}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", default="results/bench_client.json")
    args = parser.parse_args(argv)
    hidden, reps = (0, 1) if args.quick else (HIDDEN_10M, args.reps)
    settings = [(2, "model", 1), (2, "float64", 1)] if args.quick else [
        (2, "model", 1), (4, "model", 1), (2, "float64", 1), (2, "model", 5)]
    rows = []
    for s, wire, epochs in settings:
        row = measure(hidden, s, 20, wire, reps, epochs=epochs)
        rows.append(row)
        print(f"params={row['params']:,} s={s} wire={wire} epochs={epochs}: app/partition "
              f"{row['app_partition_s']:.3f} s, mod overhead {row['mod_overhead_s']:.3f} s "
              f"({row['mod_overhead_vs_partition']:.1%} of one partition), peak extra "
              f"{row['peak_extra_models']:.2f} models, err {row['max_rel_error']:.1e}")
    result = {
        "benchmark": "bench_client", "quick": args.quick,
        "command": "python -m experiments.bench_client" + (" --quick" if args.quick else "")
                   + (f" --reps {args.reps}" if args.reps != 5 else ""),
        "goal": {"mod_overhead_vs_partition": 0.05},
        "code": "grouped-rs", "rows": rows,
    }
    save(result, args.out)
    return result


if __name__ == "__main__":
    main()
