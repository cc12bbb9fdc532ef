"""Experiment 1: round latency vs straggler tolerance s: closed form, Monte Carlo, measured rounds.

``n = 100`` clients (24 with ``--quick``), two latency models per partition of load ``L``:

* load-independent: ``T ~ Exp(1)`` whatever ``L`` (the classic model of Tandon et al.): an
  exact code waits for the ``(n-s)``-th arrival, ``E = H_n - H_s``;
* load-scaled: ``T = L (0.1 + Exp(10))`` (shifted exponential, ``L = s+1``):
  ``E = (s+1)(0.1 + (H_n - H_s)/10)``.

Closed forms (``expected_round_time``), Monte Carlo of the same order statistic and of FRC's
group rule, and measured rounds of the Flower strategy in virtual time (the one benchmark harness,
``experiments.rival_runs.start_coded``: the main job's strategy and ClientApp over an
in-process Grid; ``grouped-rs``, which is FRC when
``(s+1) | n``), mean ``round_virtual_s`` over rounds.

Run: ``python -m experiments.latency_vs_s [--quick] [--n N] [--out results/latency_vs_s]``.
"""

from __future__ import annotations

import argparse

import numpy as np

from experiments.common import progress, pyplot, quiet_flower, save
from fl_gradcode.latency import (
    Exponential,
    ShiftedExponential,
    expected_round_time,
    round_times,
)

MODELS = {
    "load-independent Exp(1)": (Exponential(rate=1.0), {"latency": "exponential",
                                                        "latency-rate": 1.0}),
    "load-scaled L(0.1 + Exp(10))": (ShiftedExponential(shift=0.1, rate=10.0),
                                     {"latency": "shifted-exponential", "latency-scale": 0.1,
                                      "latency-rate": 10.0}),
}


def measured(n: int, s: int, run_config: dict, rounds: int, seeds: list[int]) -> dict:
    """Round times of the real strategy: round 1 (every client idle, comparable with the iid
    theory) and later rounds (clients still busy with stale work are skipped: the protocol)."""
    from experiments.rival_runs import start_coded

    first, later = [], []
    for seed in seeds:
        cfg = {"code": "grouped-rs" if s else "uncoded", "s": s, "num-rounds": rounds,
               "virtual-compute": "none", "partition-cost-s": 0.0, "seed": seed,
               "straggler-timeout": 1e6, **run_config}
        times = [r["round_virtual_s"] for r in start_coded(cfg, n, share_updates=True).history]
        first.append(times[0])
        later.extend(times[1:])
    return {"first_round": float(np.mean(first)), "later_rounds": float(np.mean(later))}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default="results/latency_vs_s")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n", type=int, default=None,
                        help="clients (default 100; 24 with --quick); the measured s are those "
                             "below n")
    args = parser.parse_args(argv)
    if args.n is not None and args.n < 2:
        parser.error(f"--n {args.n}: expected >= 2")
    quiet_flower()
    n = args.n if args.n is not None else 24 if args.quick else 100
    s_grid = [*range(0, n, 5 if n > 50 else 1), n - 1]
    s_measured = [s for s in ([0, 3, 5] if args.quick else [0, 1, 3, 4, 9, 19, 24, 49])
                  if s < n]
    rounds = 2 if args.quick else 4
    seeds = [0] if args.quick else [0, 1, 2, 3, 4, 5]
    samples = 1000 if args.quick else 10000
    result = {"n": n, "s": s_grid, "s_measured": s_measured, "models": {}}
    for name, (model, run_config) in MODELS.items():
        entry = {"closed_form": [], "monte_carlo": [], "frc_monte_carlo": {}, "measured": {}}
        for s in s_grid:
            entry["closed_form"].append(expected_round_time(model, n, n - s, load=float(s + 1)))
            entry["monte_carlo"].append(float(np.mean(
                round_times(model, n, s, "mds", samples=samples, seed=args.seed))))
        for s in [d - 1 for d in range(1, n + 1) if n % d == 0]:  # every FRC-feasible s
            entry["frc_monte_carlo"][s] = float(np.mean(
                round_times(model, n, s, "frc", samples=samples, seed=args.seed)))
        for s in progress(s_measured, f"measured rounds, {name}"):
            entry["measured"][s] = measured(n, s, run_config, rounds, seeds)
        result["models"][name] = entry
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for ax, (name, e) in zip(axes, result["models"].items(), strict=True):
        ax.plot(s_grid, e["closed_form"], "-", label="closed form, (n-s)-th arrival")
        ax.plot(s_grid, e["monte_carlo"], "o", ms=3, label="Monte Carlo, (n-s)-th arrival")
        frc = e["frc_monte_carlo"]
        ax.plot(list(frc), list(frc.values()), "^--", ms=4, label="Monte Carlo, FRC group rule")
        m = e["measured"]
        ax.plot(list(m), [v["first_round"] for v in m.values()], "s", ms=6, mfc="none",
                label="measured Flower round 1 (grouped-rs, all idle)")
        ax.plot(list(m), [v["later_rounds"] for v in m.values()], "x", ms=6,
                label="measured later rounds (busy clients skipped)")
        ax.set_title(f"n={n}, {name}")
        ax.set_xlabel("s (stragglers tolerated; load s+1 partitions)")
        ax.set_ylabel("expected round time")
        ax.set_yscale("log")
        ax.legend(fontsize=8)
    for name, e in result["models"].items():
        print(name)
        for s, v in e["measured"].items():
            closed = expected_round_time(MODELS[name][0], n, n - s, load=float(s + 1))
            print(f"  s={s:3d}: closed form {closed:8.3f}  measured round 1 "
                  f"{v['first_round']:8.3f}  later rounds {v['later_rounds']:8.3f}")
    save(result, args.out, fig)
    return result


if __name__ == "__main__":
    main()
