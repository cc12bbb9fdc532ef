"""Time to accuracy when uploads are bandwidth-limited: communication-efficient coding vs the rest.

Setting (a setting of the one benchmark harness, :mod:`experiments.rival_runs`: virtual
time, the main job's ServerApp builders and ClientApp over the in-process grid, plug-in path):
softmax regression on digits, ``n = 12`` clients, Dirichlet(0.5) partitions, gradient updates;
a client's reply arrives after ``compute + delay + bytes / bandwidth`` with modelled compute
``partition-cost-s`` per partition of load and a heavy-tailed ``pareto`` straggler delay (the
regime where exact coding pays; see the time-to-accuracy table).
``bandwidth`` is set per regime so that uploading one full model takes ``upload_s``
seconds (``upload_s = 0``: instantaneous uploads).

Schemes (same seeds): ``uncoded`` (FedAvg waiting for everyone), ``exact`` (grouped-rs at
``s``: load ``s + 1``, full-size replies), ``comm-efficient`` (Kadhe-Koyluoglu-Ramchandran /
Ye-Abbe at ``s`` and ``m``: load ``s + m``, replies ``1/m`` of the model), and
``drop-stragglers``: what Flower users do today, Flower's own FedAvg
(``rival_runs.start_rival("deadline", ...)``) averaging the replies in by a round deadline, 3
times the 75th percentile of an uncoded client's compute and delay (``common.rival_deadline``)
plus one full model's upload time, dropping the rest. Reported per regime and scheme: mean time
to the target accuracy over seeds, mean round time, bytes uploaded per round and their ratio to
uncoded's.

References: Ye, Abbe, "Communication-Computation Efficient Gradient Coding", ICML 2018;
Kadhe, Koyluoglu, Ramchandran, "Communication-Efficient Gradient Coding for Straggler
Mitigation in Distributed Learning", ISIT 2020 (about 16% lower round time on EC2).

Run: ``python -m experiments.bandwidth_limited [--quick] [--schemes a,b]`` ->
``results/bandwidth_limited.json`` (``--schemes``: run these and merge their rows into the
existing JSON of the same seeds and regimes).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np

from experiments.common import quiet_flower, rival_deadline, save

N, S, M = 12, 2, 2
COST_S = 0.05  # modelled compute per partition of load
SCHEMES = ("uncoded", "exact", "comm-efficient", "drop-stragglers")


def run_one(scheme: str, upload_s: float, seed: int, rounds: int, model_bytes: int) -> dict:
    from experiments.rival_runs import start_coded

    config = {
        "num-rounds": rounds, "seed": seed, "latency": "pareto", "virtual-compute": "none",
        "partition-cost-s": COST_S, "straggler-timeout": 1e6,
        "upload-bandwidth": model_bytes / upload_s if upload_s > 0 else 0.0,
    }
    if scheme == "drop-stragglers":
        return rival_run(config, upload_s, seed)
    if scheme == "uncoded":
        config.update({"code": "uncoded", "s": 0})
    elif scheme == "exact":
        config.update({"code": "grouped-rs", "s": S})
    else:
        config.update({"code": "comm-efficient", "s": S, "m": M})
    rows = start_coded(config, N, share_updates=True).history
    return {
        "virtual_s": [float(r["virtual_s"]) for r in rows],
        "accuracy": [r["accuracy"] for r in rows],
        "bytes_up": [int(r["bytes_up"]) for r in rows],
        "exact": sum(r["decode"] == "exact" for r in rows),
        "wire": rows[-1]["wire"],
    }


def rival_run(config: dict, upload_s: float, seed: int) -> dict:
    """Flower's FedAvg dropping the replies later than its deadline (the module docstring), on
    the coded runs' seed, data and latency draws."""
    from experiments.rival_runs import start_rival
    from fl_gradcode.config import DEFAULTS

    latency = {k: DEFAULTS[k] if k != "latency" else config["latency"]
               for k in ("latency", "latency-scale", "latency-shape")}
    deadline = rival_deadline(latency, seed, COST_S) + upload_s
    rows = start_rival("deadline", config, N, deadline=deadline).history
    return {
        "virtual_s": [float(r["virtual_s"]) for r in rows],
        "accuracy": [r["accuracy"] for r in rows],
        "bytes_up": [int(r["bytes_up"]) for r in rows],
        "exact": sum(r["decode"] == "all" for r in rows),  # every reply in: FedAvg's average
        "wire": "model",
        "late_dropped": [int(r["late_dropped"]) for r in rows],
        "deadline_s": deadline,
    }


def time_to(target: float, run: dict) -> float | None:
    for t, acc in zip(run["virtual_s"], run["accuracy"], strict=True):
        if acc is not None and acc >= target:
            return t
    return None


def model_size() -> int:
    """Bytes of the logreg model on digits (64 inputs, 10 classes; float64 parameters)."""
    return (64 * 10 + 10) * 8


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default="results/bandwidth_limited.json")
    parser.add_argument("--schemes", default=None,
                        help="comma-separated schemes to run, merged into the existing JSON")
    args = parser.parse_args(argv)
    quiet_flower()
    seeds = [0] if args.quick else [0, 1, 2]
    rounds = 3 if args.quick else 30
    regimes = [2.0] if args.quick else [0.0, 0.1, 0.5, 2.0]
    schemes = list(SCHEMES)
    target = 0.85
    mb = model_size()
    table = []
    if args.schemes is not None:
        schemes = [x.strip() for x in args.schemes.split(",")]
        if set(schemes) - set(SCHEMES):
            parser.error(f"unknown --schemes {sorted(set(schemes) - set(SCHEMES))}; known: "
                         f"{list(SCHEMES)}")
        table = _old_rows(Path(args.out), seeds, regimes, schemes)
    print(f"{'upload_s':>9}{'scheme':>16}{'t->' + str(target):>10}{'round s':>9}"
          f"{'bytes/round':>12}{'x uncoded':>10}{'exact':>7}")
    for upload_s in regimes:
        runs = {sc: [run_one(sc, upload_s, seed, rounds, mb) for seed in seeds] for sc in schemes}
        base_bytes = (statistics.mean(np.mean(r["bytes_up"]) for r in runs["uncoded"])
                      if "uncoded" in runs else next(
                          r["bytes_per_round"] for r in table
                          if r["upload_s"] == upload_s and r["scheme"] == "uncoded"))
        for scheme in schemes:
            times = [time_to(target, r) for r in runs[scheme]]
            reached = [t for t in times if t is not None]
            round_s = statistics.mean(r["virtual_s"][-1] / len(r["virtual_s"])
                                      for r in runs[scheme])
            bytes_round = statistics.mean(np.mean(r["bytes_up"]) for r in runs[scheme])
            row = {
                "upload_s": upload_s, "scheme": scheme, "target": target,
                "time_to_target": statistics.mean(reached) if len(reached) == len(times)
                else None,
                "reached": len(reached), "seeds": len(seeds), "round_s": round_s,
                "bytes_per_round": bytes_round, "bytes_vs_uncoded": bytes_round / base_bytes,
                "exact_rounds": statistics.mean(r["exact"] for r in runs[scheme]),
                "rounds": rounds, "wire": runs[scheme][0]["wire"],
                "final_accuracy": statistics.mean(r["accuracy"][-1] for r in runs[scheme]),
            }
            if "late_dropped" in runs[scheme][0]:
                row["late_dropped_per_round"] = statistics.mean(
                    np.mean(r["late_dropped"]) for r in runs[scheme])
                row["deadline_s"] = runs[scheme][0]["deadline_s"]
            table.append(row)
            ttt = "never" if row["time_to_target"] is None else f"{row['time_to_target']:.2f}"
            print(f"{upload_s:>9}{scheme:>16}{ttt:>10}{round_s:>9.3f}{bytes_round:>12.0f}"
                  f"{row['bytes_vs_uncoded']:>10.2f}{row['exact_rounds']:>7.1f}", flush=True)
    order = {name: i for i, name in enumerate(SCHEMES)}
    table.sort(key=lambda r: (regimes.index(r["upload_s"]), order[r["scheme"]]))
    for upload_s in regimes:  # speed-ups within a regime
        rows = {r["scheme"]: r for r in table if r["upload_s"] == upload_s}
        for r in rows.values():
            for other in ("uncoded", "exact"):
                a, b = r["time_to_target"], rows[other]["time_to_target"]
                r[f"speedup_vs_{other}"] = (b / a) if a and b else None
                r[f"round_speedup_vs_{other}"] = rows[other]["round_s"] / r["round_s"]
    result = {
        "experiment": "bandwidth_limited", "quick": args.quick, "n": N, "s": S, "m": M,
        "partition_cost_s": COST_S, "latency": "pareto", "model_bytes": mb, "seeds": seeds,
        "table": table,
    }
    save(result, Path(args.out))
    return result


def _old_rows(path: Path, seeds: list[int], regimes: list[float], schemes: list[str]) -> list:
    """The rows of an earlier result file other than ``schemes``' (``ValueError`` when it was
    run with other seeds or regimes)."""
    old = json.loads(path.read_text()) if path.is_file() else {}
    rows = old.get("table", [])
    if old and (old.get("seeds") != seeds
                or sorted({r["upload_s"] for r in rows}) != sorted(regimes)):
        raise ValueError(f"{path}: seeds {old.get('seeds')} and regimes "
                         f"{sorted({r['upload_s'] for r in rows})}; this run: {seeds}, "
                         f"{sorted(regimes)}: use another --out")
    return [r for r in rows if r["scheme"] not in schemes]


if __name__ == "__main__":
    main()
