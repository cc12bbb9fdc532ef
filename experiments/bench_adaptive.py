"""Cost and closed-loop behaviour of the adaptive tolerance (``fl_gradcode.adaptive``).

* ``decision``: at ``n`` clients with every stable ``s <= s_max`` of the nested placement as a
  candidate, after ``rounds`` rounds of a shifted-exponential latency with 5% of the clients
  10x slower (steady state: the rounds the estimator keeps by default), the time to build the
  placement and its decode rules once, to refit the estimator after a round, and to choose
  ``s`` (``choose_s``, 256 Monte Carlo samples); medians of ``repeats``; with the time of
  Flower's own ``FedAvg.aggregate_train`` on ``n`` replies of a ``params``-float32 model
  measured in the same run, so that ``choose_ms / fedavg_ms`` says what the decision adds to a
  round's server work;
* ``closed_loop``: the policy in a loop (choose, one round with early return, observe,
  late replies reported) under three latency models, its mean round time from round 5 on
  against each fixed tolerance's expected round time (Monte Carlo, 2,000 rounds): load-scaled
  bimodal straggling, a heavy-tailed delay that ignores the load, and a compute-bound shifted
  exponential where coding cannot pay.

Run: ``python -m experiments.bench_adaptive [--quick] [--out results/bench_adaptive]``.
Timings are for this machine; the ratios to FedAvg are measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from experiments.common import quiet_flower, save
from fl_gradcode.adaptive import LatencyEstimator, choose_s, code_loads, decode_rule
from fl_gradcode.codes import NestedPlacement
from fl_gradcode.latency import ShiftedExponential


def fedavg_ms(n: int, params: int, repeats: int) -> float:
    """Median time of Flower's ``FedAvg.aggregate_train`` on ``n`` replies (milliseconds)."""
    from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
    from flwr.serverapp.strategy import FedAvg

    from fl_gradcode.flower.testing import set_task_identity

    set_task_identity()  # messages built outside a run need a run id
    rng = np.random.default_rng(2)
    base = rng.standard_normal(params).astype(np.float32)
    replies = []
    for i in range(n):
        out = Message(RecordDict({"config": ConfigRecord({})}), dst_node_id=100 + i,
                      message_type="train")
        out.metadata.__dict__["_message_id"] = f"f{i}"
        content = RecordDict({"arrays": ArrayRecord({"w": Array(base * np.float32(1 + i))}),
                              "metrics": MetricRecord({"num-examples": 100 + i})})
        replies.append(Message(content, reply_to=out))
    strategy, times = FedAvg(), []
    for _ in range(repeats):
        t0 = time.perf_counter()
        strategy.aggregate_train(1, replies)
        times.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(times))


def decision(n: int, s_max: int, rounds: int, repeats: int, params: int) -> dict:
    t0 = time.perf_counter()
    placement = NestedPlacement(n, s_max)
    for s in placement.stable_values:
        decode_rule(placement.code(s))
    build_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    est = LatencyEstimator(n, halflife=20.0)
    model = ShiftedExponential(shift=1.0, rate=1.0)
    slow = rng.random(n) < 0.05
    s = s_max
    for _ in range(rounds):
        code = placement.code(s)
        loads = code_loads(code, 1.0)
        t = model.sample(n, rng, 1.0) * loads * np.where(slow, 10.0, 1.0)
        end = float(decode_rule(code).times(t[None, :])[0])
        est.update(np.where(t <= end, t, np.nan), loads, end)
        s = choose_s(placement, est, samples=256).s
    fits, choices = [], []
    for r in range(repeats):
        est.invalidate()  # force a refit, as after a new round
        t1 = time.perf_counter()
        est.fit()
        t2 = time.perf_counter()
        d = choose_s(placement, est, samples=256, rng=np.random.default_rng(r))
        choices.append(time.perf_counter() - t2)
        fits.append(t2 - t1)
    # the warm-start file (latency_state): written after every round, read once per run
    keys = [f"{i}/{n}" for i in range(n)]
    writes, reads = [], []
    for _ in range(repeats):
        t1 = time.perf_counter()
        text = json.dumps(est.export_rounds(keys))
        t2 = time.perf_counter()
        LatencyEstimator(n).import_rounds(json.loads(text), keys)
        reads.append(time.perf_counter() - t2)
        writes.append(t2 - t1)
    fed = fedavg_ms(n, params, repeats)
    choose = 1e3 * float(np.median(choices))
    write = 1e3 * float(np.median(writes))
    return {"n": n, "s_max": s_max, "rounds": est.n_rounds,
            "candidates": len(placement.stable_values), "storage": placement.storage,
            "build_s": build_s, "refit_ms": 1e3 * float(np.median(fits)), "choose_ms": choose,
            "fedavg_params": params, "fedavg_ms": fed, "choose_over_fedavg": choose / fed,
            "state_write_ms": write, "state_read_ms": 1e3 * float(np.median(reads)),
            "state_bytes": len(text), "state_write_over_fedavg": write / fed,
            "chosen_s": d.s, "expected_s": {str(k): v for k, v in d.expected_times.items()},
            "slow_clients": int(slow.sum()), "loadavg": os.getloadavg()[0]}


def _bimodal(rng, L):  # compute-bound, 10% of clients 20x slower in each round
    return L * (0.1 + rng.exponential(0.1, L.size)) * np.where(rng.random(L.size) < 0.1, 20, 1)


def _pareto(rng, L):  # small compute plus a heavy-tailed delay that ignores the load
    return 0.01 * L + 1.0 + rng.pareto(1.5, L.size)


def _shifted(rng, L):  # compute-bound shifted exponential: coding cannot pay
    return L * (1.0 + rng.exponential(1.0, L.size))


SCENARIOS = {"bimodal": _bimodal, "pareto": _pareto, "shifted-exp": _shifted}


def closed_loop(n: int, s_max: int, rounds: int, reference_rounds: int = 2000) -> dict:
    placement = NestedPlacement(n, s_max)
    fixed = sorted({0, 1, 3, s_max // 4, s_max // 2, s_max} & set(placement.stable_values))
    out = {}
    for name, draw in SCENARIOS.items():
        rng = np.random.default_rng(0)
        est = LatencyEstimator(n)
        s, path, ends = choose_s(placement, est).s, [], []
        for _ in range(rounds):
            code = placement.code(s)
            loads = code_loads(code)
            t = draw(rng, loads)
            end = float(decode_rule(code).times(t[None, :])[0])
            rid = est.update(np.where(t <= end, t, np.nan), loads, end)
            for i in np.flatnonzero(t > end):
                est.observe_late(rid, int(i), float(t[i]))
            path.append(s)
            ends.append(end)
            s = choose_s(placement, est).s
        ref_rng = np.random.default_rng(1)
        ref = {}
        for f in fixed:
            code = placement.code(f)
            T = np.stack([draw(ref_rng, code_loads(code)) for _ in range(reference_rounds)])
            ref[f] = float(decode_rule(code).times(T).mean())
        best = min(ref, key=ref.get)
        adaptive = float(np.mean(ends[5:]))
        out[name] = {"adaptive_mean_round_s": adaptive, "path": path,
                     "fixed_mean_round_s": {str(k): v for k, v in ref.items()},
                     "best_fixed": best, "adaptive_over_best_fixed": adaptive / ref[best]}
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default="results/bench_adaptive")
    args = parser.parse_args(argv)
    quiet_flower()
    if args.quick:
        dec = decision(n=24, s_max=6, rounds=10, repeats=2, params=10_000)
        loop = closed_loop(n=12, s_max=3, rounds=12, reference_rounds=200)
    else:
        dec = decision(n=256, s_max=64, rounds=120, repeats=5, params=1_000_000)
        loop = closed_loop(n=100, s_max=24, rounds=40)
    print(f"n={dec['n']}, s_max={dec['s_max']}: placement + {dec['candidates']} codes + rules "
          f"built once in {dec['build_s']:.2f} s (storage {dec['storage']} partitions/client)")
    print(f"refit after a round {dec['refit_ms']:.1f} ms; choose_s {dec['choose_ms']:.1f} ms; "
          f"FedAvg.aggregate_train on {dec['n']} replies of {dec['fedavg_params']} floats "
          f"{dec['fedavg_ms']:.1f} ms (choose_s / FedAvg {dec['choose_over_fedavg']:.2f})")
    print(f"latency_state file ({dec['rounds']} rounds, {dec['state_bytes'] / 1e6:.2f} MB): "
          f"written in {dec['state_write_ms']:.1f} ms ({dec['state_write_over_fedavg']:.2f}x "
          f"FedAvg), read in {dec['state_read_ms']:.1f} ms")
    for name, r in loop.items():
        refs = ", ".join(f"s={k}: {v:.2f}" for k, v in r["fixed_mean_round_s"].items())
        print(f"  {name:11s} adaptive {r['adaptive_mean_round_s']:.2f} (last s={r['path'][-1]}, "
              f"{r['adaptive_over_best_fixed']:.2f}x the best fixed); fixed {refs}")
    result = {"quick": args.quick, "decision": dec, "closed_loop": loop}
    save(result, args.out)
    return result


if __name__ == "__main__":
    main()
