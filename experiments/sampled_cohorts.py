"""Adaptive coding under client sampling: a different cohort every round.

Flower's ``FedAvg(fraction_train=0.5)`` samples half of the ``n`` nodes each round (run-config
``fraction-train``); the code is built over each cohort. ``s="auto"`` keeps one latency
estimator over every node it has seen and looks at it through each round's cohort, so what it
learnt about a node survives the rounds the node is not sampled in. The scheme ``auto-reset``
reproduces the earlier behaviour (a new estimator whenever the cohort changes: every round here)
to measure what keeping the estimates is worth.

A setting of the one benchmark harness (:mod:`experiments.rival_runs`: the main job's strategy,
mod and ClientApp over the in-process grid, every run's cohorts drawn from its seed), virtual
time, softmax regression on the embedded digits (Dirichlet(0.5) partitions), the
time-to-accuracy experiment's settings (``lr = 1``, 0.1 s per partition): ``n = 24`` nodes,
cohorts of 12, ``s_max = 3``. Latency: ``persistent`` (each node slow with probability 0.1,
drawn once, then 20x slower in every round it is sampled: the simulated latency follows the
node, not its position in the cohort), per-round ``bimodal`` straggling and ``pareto`` delays.
Schemes (same seeds: the same cohorts every round, so every exact scheme has the same model
after each round and only the round times differ): ``uncoded``, ``exact`` (``grouped-rs``,
``s = 3``), ``auto-reset``, ``auto``, ``auto-exclude`` (``exclude-slow = 4``), and
``drop-stragglers``: what Flower users do today, Flower's own FedAvg sampling the same cohorts
(``rival_runs.start_rival("deadline", ...)``) and averaging the replies in by a round deadline,
3 times the 75th percentile of an uncoded client's time (``common.rival_deadline``, as in the
time-to-accuracy experiment), dropping the rest.

Reported per setting and scheme over seeds: virtual time to 90% test accuracy, mean round time,
the tolerances chosen, exact rounds.

``auto`` over ``auto-reset`` (time to target, mean over the seeds where both reach it) comes
with a 95% paired bootstrap interval (the seeds share cohorts, data and latency draws).

Run: ``python -m experiments.sampled_cohorts [--quick] [--seeds 3] [--jobs 2] [--latency L]
[--schemes a,b]`` -> ``results/sampled_cohorts.json`` (``--schemes``: run these and merge them
into the existing JSON of the same seeds and rounds); ten seeds of the persistent setting:
``--seeds 10 --latency persistent --out results/sampled_cohorts_10seeds``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from experiments.common import progress, quiet_flower, rival_deadline, save

SCHEMES = {
    "uncoded": {"code": "uncoded", "s": 0},
    "exact": {"code": "grouped-rs"},
    "auto-reset": {"s": "auto"},  # the estimator restarts whenever the cohort changes
    "auto": {"s": "auto"},
    "auto-exclude": {"s": "auto", "exclude-slow": 4.0},
    # Flower's FedAvg with a round deadline, dropping later replies (see one_run)
    "drop-stragglers": {"rival": "drop-stragglers"},
}
LATENCIES = {
    "persistent": {"latency": "persistent", "latency-scale": 0.1, "latency-rate": 10.0,
                   "latency-p": 0.1, "latency-slowdown": 20.0},
    "bimodal": {"latency": "bimodal", "latency-scale": 0.1, "latency-rate": 10.0,
                "latency-p": 0.1, "latency-slowdown": 20.0},
    "pareto": {"latency": "pareto", "latency-scale": 0.5, "latency-shape": 1.5},
}
BASE = {"dataset": "digits", "model": "logreg", "update": "gradient", "lr": 1.0,
        "virtual-compute": "none", "partition-cost-s": 0.1, "max-decode-error": 0.5,
        "partitioner": "dirichlet", "straggler-timeout": 1e6}
N, FRACTION, S_MAX = 24, 0.5, 3
#: schemes that are Flower's own strategy, not the wrapper
RIVAL_SCHEMES = ("drop-stragglers",)


def rival_run(scheme: str, latency: str, seed: int, rounds: int) -> dict:
    """Flower's FedAvg dropping the replies later than the 75th percentile of an uncoded
    client's time times 3 (``common.rival_deadline``), on the same seed, cohorts, data and
    latency draws as the coded runs."""
    from experiments.rival_runs import start_rival

    cfg = {**BASE, **LATENCIES[latency], "seed": seed, "num-rounds": rounds,
           "fraction-train": FRACTION}
    strategy = start_rival("deadline", cfg, N, deadline=rival_deadline(
        LATENCIES[latency], seed, BASE["partition-cost-s"])).strategy
    h = strategy.history
    return {
        "virtual_s": [r["virtual_s"] for r in h],
        "round_s": [r["round_virtual_s"] for r in h],
        "accuracy": [r["accuracy"] for r in h],
        # every reply in by the deadline: the round's exact FedAvg average
        "decode": [{"all": "exact", "partial": "approximate"}.get(r["decode"], r["decode"])
                   for r in h],
        "s": [0 for _ in h],
        "excluded": [0 for _ in h],
        "late_dropped": [r["late_dropped"] for r in h],
        "cohorts": [sorted(r["clients_used"] + r["stragglers"]) for r in h],
        "nodes_seen": len({p for r in h for p in r["clients_used"] + r["stragglers"]}),
        "deadline_s": float(strategy.deadline),
    }


def one_run(scheme: str, latency: str, seed: int, rounds: int) -> dict:
    from experiments.rival_runs import start_coded

    if scheme in RIVAL_SCHEMES:
        return rival_run(scheme, latency, seed, rounds)

    cfg = {**BASE, "s": S_MAX, "s-max": S_MAX, **SCHEMES[scheme], **LATENCIES[latency],
           "seed": seed, "num-rounds": rounds, "fraction-train": FRACTION}
    # auto-reset: the estimator restarts whenever the cohort changes (experiment-only)
    policy = None
    if scheme == "auto-reset":
        from experiments.policies import ResettingCodePolicy

        policy = ResettingCodePolicy
    strategy = start_coded(cfg, N, code_policy=policy, share_updates=True).strategy
    h = strategy.history
    return {
        "virtual_s": [r["virtual_s"] for r in h],
        "round_s": [r["round_virtual_s"] for r in h],
        "accuracy": [r["accuracy"] for r in h],
        "decode": [r["decode"] for r in h],
        "s": [r["s"] for r in h],
        "excluded": [len(r["excluded"]) for r in h],
        "nodes_seen": len(strategy.identities),
    }


def _job(job: tuple, rounds: int) -> dict:
    scheme, latency, seed = job
    quiet_flower()
    return one_run(scheme, latency, seed, rounds)


def _results(jobs: list, rounds: int, workers: int):
    """``(job, result)``: in this process (``workers == 1``), else every run in a fresh
    process."""
    if workers == 1:
        for job in progress(jobs, "sampled cohorts"):
            yield job, _job(job, rounds)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=ctx, max_tasks_per_child=1) as pool:
        futures = {pool.submit(_job, job, rounds): job for job in jobs}
        for future in progress(as_completed(futures), "sampled cohorts", total=len(jobs)):
            yield futures[future], future.result()


def time_to_target(run: dict, target: float) -> float:
    for t, a in zip(run["virtual_s"], run["accuracy"], strict=True):
        if a is not None and a >= target:
            return float(t)
    return float("nan")


def build_table(runs: dict, target: float) -> dict:
    table: dict = {}
    for latency, by in runs.items():
        table[latency] = {}
        for scheme, rs in by.items():
            tt = np.array([time_to_target(r, target) for r in rs])
            table[latency][scheme] = {
                "time_to_target_mean": float(np.mean(tt)) if np.isfinite(tt).all() else None,
                "time_to_target": [None if not np.isfinite(x) else float(x) for x in tt],
                "mean_round_s": float(np.mean([np.mean(r["round_s"]) for r in rs])),
                "mean_s": float(np.mean([np.mean(r["s"]) for r in rs])),
                "exact_rounds": float(np.mean([r["decode"].count("exact") for r in rs])),
                "rounds_with_exclusions": float(np.mean([np.count_nonzero(r["excluded"])
                                                         for r in rs])),
            }
        ref = table[latency].get("uncoded", {}).get("time_to_target_mean")
        for row in table[latency].values():
            if ref and row["time_to_target_mean"]:
                row["speedup_vs_uncoded"] = ref / row["time_to_target_mean"]
        if "auto" in by and "auto-reset" in by:  # what keeping the estimates is worth
            row = table[latency]["auto"]
            a = np.array([time_to_target(r, target) for r in by["auto"]])
            b = np.array([time_to_target(r, target) for r in by["auto-reset"]])
            both = np.isfinite(a) & np.isfinite(b)
            if both.sum() >= 2:
                row["vs_auto_reset"], row["vs_auto_reset_ci95"] = _paired(a[both], b[both])
                row["faster_than_auto_reset_on"] = int(np.sum(a[both] < b[both]))
                row["seeds_compared"] = int(both.sum())
            if len(by["auto"]) >= 2:  # mean round time: every seed, whether or not it reached
                a = np.array([np.mean(r["round_s"]) for r in by["auto"]])
                b = np.array([np.mean(r["round_s"]) for r in by["auto-reset"]])
                row["round_vs_auto_reset"], row["round_vs_auto_reset_ci95"] = _paired(a, b)
    return table


def _old_runs(path: Path, seeds: list[int], rounds: int, quick: bool) -> dict:
    """The runs of an earlier result file to merge new schemes into (``ValueError`` when it
    was run with other seeds, rounds or ``--quick``)."""
    import json

    old = json.loads(path.read_text()) if path.is_file() else {}
    if not old:
        return {}
    if (old.get("seeds"), old.get("rounds"), old.get("quick")) != (seeds, rounds, quick):
        raise ValueError(f"{path}: seeds {old.get('seeds')}, rounds {old.get('rounds')}, quick "
                         f"{old.get('quick')}; this run: {seeds}, {rounds}, {quick}: use "
                         "another --out")
    return old.get("runs", {})


def _paired(a: np.ndarray, b: np.ndarray) -> tuple[float, list[float]]:
    """``mean(a) / mean(b)`` and its 95% paired bootstrap interval (seeds resampled, seeded)."""
    idx = np.random.default_rng(0).integers(0, a.size, size=(4000, a.size))
    ratio = a[idx].mean(axis=1) / b[idx].mean(axis=1)
    return float(a.mean() / b.mean()), [float(np.quantile(ratio, 0.025)),
                                         float(np.quantile(ratio, 0.975))]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default="results/sampled_cohorts")
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 (default 3)")
    parser.add_argument("--jobs", type=int, default=2, help="runs in parallel processes")
    parser.add_argument("--latency", action="append", choices=sorted(LATENCIES), default=None,
                        help="run only this latency setting (repeatable)")
    parser.add_argument("--schemes", default=None,
                        help="comma-separated schemes to run, merged into the existing JSON "
                             "(--out) of the same seeds, rounds and --quick")
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds per run (default 30; 6 with --quick)")
    args = parser.parse_args(argv)
    if args.seeds is not None and args.seeds < 1:
        parser.error(f"--seeds {args.seeds}: expected >= 1")
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: expected >= 1")
    seeds = list(range(args.seeds if args.seeds is not None else 1 if args.quick else 3))
    if args.rounds is not None and args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: expected >= 1")
    rounds = args.rounds if args.rounds is not None else 6 if args.quick else 30
    latencies = args.latency or (["persistent"] if args.quick else list(LATENCIES))
    schemes = ["uncoded", "auto-reset", "auto"] if args.quick else list(SCHEMES)
    old_runs: dict = {}
    if args.schemes is not None:
        schemes = [x.strip() for x in args.schemes.split(",")]
        unknown = set(schemes) - set(SCHEMES)
        if unknown:
            parser.error(f"unknown --schemes {sorted(unknown)}; known: {list(SCHEMES)}")
        old_runs = _old_runs(Path(args.out).with_suffix(".json"), seeds, rounds, args.quick)
    jobs = [(scheme, lat, seed) for lat in latencies for scheme in schemes for seed in seeds]
    t0 = time.perf_counter()
    got: dict = {}
    for (scheme, lat, seed), result in _results(jobs, rounds, args.jobs):
        got.setdefault(lat, {}).setdefault(scheme, {})[seed] = result
    runs = {lat: {scheme: [got[lat][scheme][x] for x in seeds] for scheme in schemes}
            for lat in latencies}
    for lat, by in old_runs.items():  # --schemes: the other schemes' runs from the file
        runs[lat] = {**{k: v for k, v in by.items() if k not in schemes}, **runs.get(lat, {})}
    schemes = list(dict.fromkeys([*SCHEMES, *(k for by in runs.values() for k in by)]))
    runs = {lat: {k: by[k] for k in schemes if k in by} for lat, by in runs.items()}
    table = build_table(runs, args.target)
    print(f"n={N} nodes, cohorts of {int(N * FRACTION)}, s_max={S_MAX}, {len(seeds)} seed(s), "
          f"{rounds} rounds, target {args.target} ({time.perf_counter() - t0:.0f} s)")
    print(f"{'latency':<12}{'scheme':<14}{'time to target':>16}{'mean round':>12}{'mean s':>8}")
    for lat, rows in table.items():
        for scheme, r in rows.items():
            tt = r["time_to_target_mean"]
            print(f"{lat:<12}{scheme:<14}{'never' if tt is None else f'{tt:.1f} s':>16}"
                  f"{r['mean_round_s']:>10.2f} s{r['mean_s']:>8.2f}")
    result = {"n": N, "fraction_train": FRACTION, "s_max": S_MAX, "seeds": seeds,
              "rounds": rounds, "target": args.target, "base": BASE, "latencies": LATENCIES,
              "schemes": SCHEMES, "table": table, "runs": runs, "quick": args.quick}
    save(result, Path(args.out))
    return result


if __name__ == "__main__":
    main()
