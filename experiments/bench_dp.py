"""Cost of DP on the client: per-round compute with partition DP and Opacus sample DP vs none.

One client of a 12-client code tolerating 3 stragglers computes its 4 partitions (non-IID
digits) and encodes them through the real ClientApp and its coding mod, for
``dp`` in {none, partition, sample}, models MLP and CNN, ``local`` updates (1 epoch, batch 32)
and ``gradient`` updates. Reported: median seconds per round over repeats and the ratio to
``dp=none`` in the same run (targets: partition <= 1.1x; sample is Opacus' per-sample cost).

Run: ``python -m experiments.bench_dp [--quick] [--out results/bench_dp.json]``.
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import numpy as np

from experiments.common import save

ROOT = Path(__file__).resolve().parents[1]


def client_round_time(model: str, update: str, dp: str, repeats: int) -> float:
    """Median seconds of one coded train message (worker 0 of grouped-rs n=12, s=3: four
    partitions) through the real ClientApp and its coding mod."""
    import dataclasses
    import itertools
    import json
    import tempfile
    import uuid

    from flwr.app import Array, ArrayRecord, ConfigRecord, Context, RecordDict

    from clients.app import make_client_app
    from fl_gradcode.codes import make_code
    from fl_gradcode.config import merge_config
    from fl_gradcode.data import load_dataset
    from fl_gradcode.flower import protocol
    from fl_gradcode.flower.testing import set_task_identity
    from fl_gradcode.learning import make_model
    from server.app import CLIENT_KEYS

    set_task_identity()
    cfg = merge_config({"model": model, "update": update, "dp": dp, "latency": "none"})
    code = make_code("grouped-rs", n=12, s=3)
    data = load_dataset("digits", 0)
    net = make_model(model, data.input_shape, data.num_classes)
    arrays = ArrayRecord({k: Array(p.detach().numpy()) for k, p in net.named_parameters()})
    parts = tuple(code.assignment(0))
    instruction = protocol.Instruction(
        op=protocol.OP_TRAIN, round=1, worker=0, seed=0, nonce=f"bench-{uuid.uuid4().hex}",
        partition_ids=parts, num_partitions=(code.k,) * len(parts),
        coefficients=tuple(float(c) for c in code.encoding_coefficients(0)),
        dp=dp, clip_norm=1.0, noise_multiplier=1.0,
    )
    content = RecordDict(
        {"arrays": arrays, "config": ConfigRecord({"lr": 0.1, **{k: cfg[k] for k in CLIENT_KEYS}})}
    )
    key_file = Path(tempfile.mkdtemp()) / "keys.json"
    key_file.write_text(json.dumps({"master": bytes(32).hex()}))
    app = make_client_app()
    context = Context(run_id=1, node_id=1, state=RecordDict(), run_config=cfg,
                      node_config={"partition-id": 0, "num-partitions": 12,
                                   "dp-key-file": str(key_file)})

    rounds = itertools.count(1)

    def once() -> float:
        # a fresh (nonce, round) per call: a node with keys refuses one it already answered
        job = dataclasses.replace(instruction, round=next(rounds))
        msg = protocol.instruction_message(content, job, 1, str(job.round))
        msg.metadata.__dict__["_message_id"] = "bench"
        t0 = time.perf_counter()
        reply = app(msg, context)
        elapsed = time.perf_counter() - t0
        if reply.has_error():
            raise RuntimeError(reply.error.reason)
        return elapsed

    once()  # warm-up: data, partitions, model cached
    return float(np.median([once() for _ in range(repeats)]))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default="results/bench_dp.json")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    repeats = 2 if args.quick else 7
    models = ["mlp"] if args.quick else ["mlp", "cnn"]
    rows = []
    print(f"{'model':<6}{'update':<10}{'dp':<11}{'s/round':>10}{'vs none':>9}")
    for model in models:
        for update in ("local", "gradient"):
            base = None
            for dp in ("none", "partition", "sample"):
                t = client_round_time(model, update, dp, repeats)
                base = base or t
                rows.append({"model": model, "update": update, "dp": dp, "seconds": t,
                             "ratio_vs_none": t / base})
                print(f"{model:<6}{update:<10}{dp:<11}{t:>10.4f}{t / base:>8.2f}x")
    result = {"benchmark": "bench_dp", "quick": args.quick, "repeats": repeats,
              "rows": rows}
    save(result, args.out)
    return result


if __name__ == "__main__":
    main()
