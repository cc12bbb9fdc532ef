"""Benchmark of the exact codes: decoding accuracy, conditioning, load and decoder speed.

For each exact code and n in {12, 48, 96, 256}, s in {1, n/8, n/4}: the worst relative decoding
error and worst condition number over straggler sets of size s (every contiguous burst plus
random sets, or all sets when few), the load and its ratio to the optimum (s+1)/n; then the time
to compute a decoding vector cold (fresh code, empty cache) and cached at n = 1000, s = 100; and
``decoding_vector_cold_ms``: for EVERY exact code (frc at n = 1010 since it needs (s+1) | n;
uncoded tolerates no straggler), the median over random received sets of n - s clients of one
``decoding_vector`` call with empty caches (``with_weights`` clears them; B is reused).

Run: ``python -m experiments.bench_codes [--quick] [--out results/bench_codes.json]``.
Timings are ratios within one run on one machine; absolute numbers vary with the machine.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from experiments.common import save
from fl_gradcode.codes import make_code, straggler_patterns

CODES = ["frc", "crc", "grouped-rs", "comm-efficient"]
EXACT_CODES = ["frc", "crc", "grouped-rs", "comm-efficient", "uncoded"]


def accuracy_row(name: str, n: int, s: int, max_sets: int, seed: int) -> dict | None:
    try:
        code = make_code(name, n=n, s=s, seed=seed)
    except ValueError as exc:  # e.g. FRC when (s+1) does not divide n
        return {"code": name, "n": n, "s": s, "skipped": str(exc)}
    rng = np.random.default_rng(seed)
    length = 32
    updates = {j: rng.standard_normal(length) for j in range(code.k)}
    target = sum(code.weights[j] * updates[j] for j in range(code.k))
    replies = {i: code.encode(i, updates) for i in range(n)}
    worst_err, worst_cond, sets = 0.0, 1.0, 0
    for stragglers in straggler_patterns(n, s, max_sets=max_sets, seed=seed):
        got = {i: r for i, r in replies.items() if i not in stragglers}
        decoded = code.decode(got, length=length)
        worst_err = max(worst_err, float(np.linalg.norm(decoded - target) / np.linalg.norm(target)))
        worst_cond = max(worst_cond, code.condition_number(got))
        sets += 1
    return {
        "code": name,
        "n": n,
        "s": s,
        "k": code.k,
        "load": code.load,
        "load_fraction": code.load_fraction,
        # ratio to the lower bound: (s+1)/n, or (s+m)/n for communication-efficient codes
        "load_overhead": getattr(code, "load_overhead", code.load_fraction / ((s + 1) / n)),
        "straggler_sets": sets,
        "worst_relative_error": worst_err,
        "worst_condition": worst_cond,
    }


def timing_row(name: str, n: int, s: int, repeats: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    cold, cached = [], []
    build = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        code = make_code(name, n=n, s=s, seed=seed)
        build.append(time.perf_counter() - t0)
        stragglers = set(rng.choice(n, size=s, replace=False).tolist())
        alive = [i for i in range(n) if i not in stragglers]
        t0 = time.perf_counter()
        code.decoding_vector(alive)
        cold.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        code.decoding_vector(alive)
        cached.append(time.perf_counter() - t0)
    return {
        "code": name,
        "n": n,
        "s": s,
        "build_s": float(np.median(build)),
        "cold_s": float(np.median(cold)),
        "cached_s": float(np.median(cached)),
    }


def cold_decoding_row(name: str, n: int, s: int, sets: int, seed: int) -> dict:
    """Median time of ``decoding_vector`` on ``sets`` random sets of ``n - code.s`` clients,
    each on a copy of the code with empty caches (the code is built once)."""
    if name == "frc" and n % (s + 1):
        n += (s + 1) - n % (s + 1)  # FRC needs (s+1) | n: the next multiple (1010 for 1000, 100)
    code = make_code(name, n=n, s=s, seed=seed)
    rng = np.random.default_rng(seed)
    times = []
    for _ in range(sets):
        stragglers = set(rng.choice(n, size=code.s, replace=False).tolist())
        alive = [i for i in range(n) if i not in stragglers]
        fresh = code.with_weights(code.weights)  # same B, empty caches
        t0 = time.perf_counter()
        fresh.decoding_vector(alive)
        times.append(time.perf_counter() - t0)
    ms = np.array(times) * 1e3
    return {
        "code": name,
        "n": n,
        "s": code.s,
        "sets": sets,
        "median_ms": float(np.median(ms)),
        "min_ms": float(ms.min()),
        "max_ms": float(ms.max()),
        # 1-minute load average: BLAS threads stall when other processes hold the cores
        "load_average": os.getloadavg()[0],
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes and sets (smoke test)")
    parser.add_argument("--out", default="results/bench_codes.json")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    sizes = [12, 48] if args.quick else [12, 48, 96, 256]
    max_sets = 20 if args.quick else 100
    rows = []
    print(f"{'code':<15}{'n':>5}{'s':>5}{'k':>6}{'load':>6}{'overhead':>9}"
          f"{'sets':>6}{'worst rel err':>15}{'worst cond':>12}")
    for n in sizes:
        for s in sorted({1, n // 8, n // 4}):
            for name in CODES:
                row = accuracy_row(name, n, s, max_sets, args.seed)
                rows.append(row)
                if "skipped" in row:
                    print(f"{name:<15}{n:>5}{s:>5}   skipped: {row['skipped']}")
                    continue
                print(
                    f"{name:<15}{n:>5}{s:>5}{row['k']:>6}{row['load']:>6}"
                    f"{row['load_overhead']:>9.3f}{row['straggler_sets']:>6}"
                    f"{row['worst_relative_error']:>15.2e}{row['worst_condition']:>12.2e}"
                )
    n_t, s_t = (200, 20) if args.quick else (1000, 100)
    timings = []
    print(f"\ndecoding-vector time at n={n_t}, s={s_t} (median of 3; cold = fresh code)")
    for name in ("grouped-rs", "crc", "comm-efficient"):
        row = timing_row(name, n_t, s_t, repeats=3, seed=args.seed)
        timings.append(row)
        print(
            f"{name:<15} build {row['build_s'] * 1e3:8.1f} ms   cold {row['cold_s'] * 1e3:8.2f} ms"
            f"   cached {row['cached_s'] * 1e3:7.3f} ms"
        )
    sets = 3 if args.quick else 9
    cold = []
    print(f"\ncold decoding_vector (median of {sets} random sets, empty caches)")
    for name in EXACT_CODES:
        row = cold_decoding_row(name, n_t, s_t, sets=sets, seed=args.seed)
        cold.append(row)
        print(
            f"{name:<15} n={row['n']:<5} s={row['s']:<4} median {row['median_ms']:8.2f} ms"
            f"   (min {row['min_ms']:.2f}, max {row['max_ms']:.2f})"
        )
    result = {
        "benchmark": "bench_codes",
        "quick": args.quick,
        "seed": args.seed,
        "accuracy": rows,
        "timing": timings,
        "decoding_vector_cold_ms": {row["code"]: row["median_ms"] for row in cold},
        "decoding_vector_cold": cold,
    }
    save(result, args.out)
    return result


if __name__ == "__main__":
    main()
