"""Cost of DP on the client: per-round compute with partition DP and Opacus sample DP vs none.

One client of a 12-client code tolerating 3 stragglers computes its 4 partitions (non-IID
digits) and encodes them, exactly as the ClientApp does (``clients.app.compute_reply``), for
``dp`` in {none, partition, sample}, models MLP and CNN, ``local`` updates (1 epoch, batch 32)
and ``gradient`` updates. Reported: median seconds per round over repeats and the ratio to
``dp=none`` in the same run (targets: partition <= 1.1x; sample is Opacus' per-sample cost).

Run: ``python experiments/bench_dp.py [--quick] [--out results/bench_dp.json]``.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np
from _common import save

ROOT = Path(__file__).resolve().parents[1]


def client_round_time(model: str, update: str, dp: str, repeats: int) -> float:
    from flwr.app import ConfigRecord

    from clients.app import compute_reply
    from fl_gradcode.codes import make_code
    from fl_gradcode.config import merge_config
    from fl_gradcode.data import load_dataset
    from fl_gradcode.learning import make_model
    from fl_gradcode.privacy import NoiseKeys
    from fl_gradcode.strategy import to_array_record
    from server.app import CLIENT_KEYS

    cfg = merge_config({"model": model, "update": update, "dp": dp, "latency": "none"})
    code = make_code("grouped-rs", n=12, s=3)
    data = load_dataset("digits", 0)
    net = make_model(model, data.input_shape, data.num_classes)
    arrays = to_array_record({k: p.detach().numpy() for k, p in net.named_parameters()})
    record = ConfigRecord(
        {
            **{k: cfg[k] for k in CLIENT_KEYS},
            "server-round": 1,
            "worker": 0,
            "partitions": list(code.assignment(0)),
            "coefficients": [float(c) for c in code.encoding_coefficients(0)],
            "num-partitions": code.k,
            "update": update,
            "lr": 0.1,
            "timing": "virtual",
            "dp": dp,
            "clip-norm": 1.0,
            "noise-multiplier": 1.0,
            "dp-noise": "identical",
        }
    )
    keys = NoiseKeys(master=bytes(32))
    compute_reply(record, arrays, 0.0, keys)  # warm-up: data, partitions, model cached
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        compute_reply(record, arrays, 0.0, keys)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default="results/bench_dp.json")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    sys.path.insert(0, str(ROOT))
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
