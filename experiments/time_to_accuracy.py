"""Experiment 4: time to accuracy on non-IID data: uncoded, ignore-stragglers, exact, approximate.

The real strategy and client code (``server.app.run_in_process``: the ServerApp's setup, the
ClientApp's computation, an in-process Grid) in virtual time: softmax regression on the embedded
digits, ``gradient`` updates, ``lr = 1``, a modelled compute cost of ``partition-cost-s`` per
partition (a coded client computing ``s+1`` partitions pays ``s+1`` times), latency from a
Pareto model, a bimodal straggler model or replay of the AWS Lambda traces.

Schemes (same seeds, same partitions):

* ``uncoded``: synchronous, waits for all ``n``;
* ``ignore-stragglers``: the fastest ``n - s`` uncoded replies, rescaled (approximate, biased
  on non-IID partitions);
* ``exact``: ``grouped-rs`` tolerating ``s`` (FRC when ``(s+1) | n``): the uncoded iterate at
  each round, as soon as the replies decode;
* ``approx-deadline``: the expander code (load ``s+1``), least-squares decoding at a deadline
  (the 75th percentile of a coded client's time), exact when the replies happen to decode;
* ``auto``: ``s="auto"`` with ``s-max = s``: data placed once, the tolerance in ``0..s``
  chosen every round from the observed (censored) latencies.

A ``drift`` setting switches the latency regime at round 15 (Pareto delays, then load-scaled
bimodal straggling).

``n = 12`` (the scale of Tandon et al.'s EC2 runs, Dirichlet(0.5) partitions) with and without
partition-level DP; ``n = 100`` and ``n = 256`` (pathological 2-class partitions) without DP.
Reported per configuration over seeds: virtual time to the target accuracy and final accuracy
(mean and std), and the largest per-round accuracy gap to the uncoded run of the same seed.

Run: ``python experiments/time_to_accuracy.py [--quick] [--out results/time_to_accuracy]``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from _common import progress, pyplot, quiet_flower, save

SCHEMES = {
    "uncoded": {"code": "uncoded"},
    "ignore-stragglers": {"code": "ignore-stragglers"},
    "exact": {"code": "grouped-rs"},
    "approx-deadline": {"code": "expander", "min-replies": 0},
    "auto": {"s": "auto"},  # s chosen every round in 0..s (s-max), nested placement
}
LATENCIES = {
    "pareto": {"latency": "pareto", "latency-scale": 0.5, "latency-shape": 1.5},
    "bimodal": {"latency": "bimodal", "latency-scale": 0.1, "latency-rate": 10.0,
                "latency-p": 0.1, "latency-slowdown": 20.0},
    "trace": {"latency": "trace", "latency-trace": "canada"},
    # regime change at round 15: Pareto(0.5, 1.5) delays, then load-scaled bimodal straggling
    "drift": {"latency": "drift", "latency-scale": 0.5, "latency-shape": 1.5,
              "latency-rate": 10.0, "latency-p": 0.1, "latency-slowdown": 20.0,
              "latency-drift-round": 15},
}
# the nonce is pinned so that every scheme of one seed adds the same noise (comparable runs)
DP = {"noise-multiplier": 0.3, "clip-norm": 1.0, "dp": "partition", "dp-run-nonce": "tta"}
BASE = {"dataset": "digits", "model": "logreg", "update": "gradient", "lr": 1.0,
        "virtual-compute": "none", "partition-cost-s": 0.1, "max-decode-error": 0.5}


def deadline(latency: dict, load: int, seed: int) -> float:
    """75th percentile of one client's time at ``load`` partitions under the latency model."""
    from fl_gradcode.latency import client_times, make_latency

    args = {k.removeprefix("latency-").replace("-", "_"): v for k, v in latency.items()
            if k != "latency"}
    model = make_latency(latency["latency"], seed=seed, **args)
    t = client_times(model, 256, load, partition_cost=BASE["partition-cost-s"], samples=200,
                     rng=np.random.default_rng(seed))
    return float(np.quantile(t, 0.75))


def one_run(n, s, scheme, latency, dp, seed, rounds, partitioner):
    from server.app import run_in_process

    cfg = {**BASE, **SCHEMES[scheme], **LATENCIES[latency],
           "s": 0 if scheme == "uncoded" else s, "seed": seed, "num-rounds": rounds,
           "s-max": s,
           "partitioner": partitioner, "results-dir": f"/tmp/fl-gradcode-tta/{scheme}"}
    if scheme == "auto":
        cfg["s"] = "auto"
    cfg["straggler-timeout"] = (
        deadline(LATENCIES[latency], s + 1, seed) if scheme == "approx-deadline" else 1e6
    )
    if dp:
        cfg.update(DP)
    key_file = None
    if dp:  # the clients' key (a client-side secret), fixed per seed so runs are comparable
        key_file = Path(f"/tmp/fl-gradcode-tta/keys-{seed}.json")
        key_file.parent.mkdir(parents=True, exist_ok=True)
        key_file.write_text(json.dumps({"master": seed.to_bytes(32, "little").hex()}))
        key_file = str(key_file)
    strategy, _ = run_in_process(cfg, n, key_file=key_file)
    h = strategy.history
    return {
        "virtual_s": [r["virtual_s"] for r in h],
        "accuracy": [r["accuracy"] for r in h],
        "decode": [r["decode"] for r in h],
        "epsilon": h[-1]["epsilon"],
    }


def summarize(runs, target):
    tta, final = [], []
    for r in runs:
        hit = [t for t, a in zip(r["virtual_s"], r["accuracy"], strict=True) if a >= target]
        tta.append(hit[0] if hit else np.nan)
        final.append(r["accuracy"][-1])
    tta = np.array(tta, dtype=float)
    return {
        "time_to_target_mean": float(np.nanmean(tta)) if np.isfinite(tta).any() else None,
        "time_to_target_std": float(np.nanstd(tta)) if np.isfinite(tta).any() else None,
        "reached": int(np.isfinite(tta).sum()),
        "final_accuracy_mean": float(np.mean(final)),
        "final_accuracy_std": float(np.std(final)),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default="results/time_to_accuracy")
    parser.add_argument("--target", type=float, default=0.9)
    args = parser.parse_args(argv)
    quiet_flower()
    seeds = [0] if args.quick else [0, 1, 2]
    rounds = 8 if args.quick else 30
    setups = [(12, 3, "dirichlet", lat, dp) for lat in ("pareto", "bimodal", "trace")
              for dp in (False, True)]
    if not args.quick:
        setups += [(n, n // 8, "pathological", lat, False)
                   for n in (100, 256) for lat in ("bimodal", "trace")]
        setups += [(12, 3, "dirichlet", "drift", False), (100, 12, "pathological", "drift", False)]
    else:
        setups = setups[:2]
    jobs = [(setup, scheme, seed) for setup in setups for scheme in SCHEMES for seed in seeds]
    runs: dict = {}
    t0 = time.perf_counter()
    for (n, s, part, lat, dp), scheme, seed in progress(jobs, "time to accuracy"):
        key = f"n={n} s={s} {lat}{' +DP' if dp else ''}"
        runs.setdefault(key, {}).setdefault(scheme, []).append(
            one_run(n, s, scheme, lat, dp, seed, rounds, part)
        )
    table = {}
    for key, by_scheme in runs.items():
        ref = by_scheme["uncoded"]
        table[key] = {}
        for scheme, rs in by_scheme.items():
            row = summarize(rs, args.target)
            row["max_accuracy_gap_to_uncoded"] = float(max(
                np.max(np.abs(np.array(r["accuracy"]) - np.array(u["accuracy"])))
                for r, u in zip(rs, ref, strict=True)))
            row["exact_rounds"] = float(np.mean([r["decode"].count("exact") for r in rs]))
            row["epsilon"] = rs[0]["epsilon"]
            unc = table[key].get("uncoded", row)["time_to_target_mean"]
            if row["time_to_target_mean"] and unc:
                row["speedup_vs_uncoded"] = unc / row["time_to_target_mean"]
            table[key][scheme] = row
    print(f"target accuracy {args.target}, {len(seeds)} seed(s), {rounds} rounds "
          f"({time.perf_counter() - t0:.0f} s)")
    print(f"{'setup':<24}{'scheme':<19}{'time to target':>18}{'speedup':>9}"
          f"{'final acc':>16}{'gap':>8}")
    for key, rows in table.items():
        for scheme, r in rows.items():
            tt = ("never" if r["time_to_target_mean"] is None else
                  f"{r['time_to_target_mean']:.1f}±{r['time_to_target_std']:.1f}")
            sp = r.get("speedup_vs_uncoded")
            print(f"{key:<24}{scheme:<19}{tt:>18}{'' if sp is None else f'{sp:.2f}x':>9}"
                  f"{r['final_accuracy_mean']:>10.3f}±{r['final_accuracy_std']:.3f}"
                  f"{r['max_accuracy_gap_to_uncoded']:>8.3f}")
    plt = pyplot()
    from matplotlib import ticker

    keys = list(runs)
    cols = min(3, len(keys))
    rows_ = -(-len(keys) // cols)
    fig, axes = plt.subplots(rows_, cols, figsize=(5 * cols, 3.6 * rows_), squeeze=False)
    for ax, key in zip(axes.flat, keys, strict=False):
        for scheme, rs in runs[key].items():
            t = np.mean([r["virtual_s"] for r in rs], axis=0)
            a = np.mean([r["accuracy"] for r in rs], axis=0)
            ax.plot(t, a, label=scheme)
        ax.axhline(args.target, color="k", lw=0.6, ls=":")
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("virtual time (s)")
        ax.set_ylabel("test accuracy")
        ax.set_xscale("log")
        # few, plain tick labels: log axes spanning less than a decade otherwise print every
        # minor tick in scientific notation on top of each other
        ax.xaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0), numticks=6))
        ax.xaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    fig.tight_layout()
    result = {"target": args.target, "seeds": seeds, "rounds": rounds, "dp": DP, "base": BASE,
              "latencies": LATENCIES, "table": table, "runs": runs, "quick": args.quick}
    save(result, args.out, fig)
    return result


if __name__ == "__main__":
    main()
