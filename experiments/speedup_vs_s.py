"""Experiment 2: expected speedup of exact gradient coding over uncoded vs s, for several N.

The classic plot (Tandon et al.) uses load-independent exponential times (``T ~ Exp(1)``
whatever the work), so waiting for the fastest ``N - s`` looks like a free win: speedup
``H_N / (H_N - H_s)``. With the coded load counted (shifted exponential
``T = L (1 + Exp(1))``, ``L`` = partitions computed), a client tolerating ``s`` stragglers
works ``s+1`` times longer and the speedup is
``(1 + H_N) / ((s+1)(1 + H_N - H_s))`` (Lee et al. 2018 model): below 1 for every ``s`` at
rate 1; only when the random part dwarfs the shift (rate 0.01) does near-full replication pay.
Closed forms from ``fl_gradcode.latency.expected_round_time``, checked by Monte Carlo.

Run: ``python -m experiments.speedup_vs_s [--quick] [--out results/speedup_vs_s]``.
"""

from __future__ import annotations

import argparse

import numpy as np

from experiments.common import progress, pyplot, save
from fl_gradcode.latency import (
    Exponential,
    ShiftedExponential,
    expected_round_time,
    round_times,
)


def curves(N: int, mc_samples: int) -> dict:
    s = np.unique(np.linspace(0, N - 1, min(N, 60)).astype(int))
    free = Exponential(rate=1.0)
    loaded = ShiftedExponential(shift=1.0, rate=1.0)
    heavy = ShiftedExponential(shift=1.0, rate=0.01)  # random part 100x the shift
    base_free = expected_round_time(free, N, N)
    base_loaded = expected_round_time(loaded, N, N, load=1.0)
    base_heavy = expected_round_time(heavy, N, N, load=1.0)
    out = {"s": s.tolist(), "load_independent": [], "load_scaled": [],
           "load_scaled_heavy_tail": [], "mc": {}}
    for si in s:
        out["load_independent"].append(base_free / expected_round_time(free, N, N - si))
        out["load_scaled"].append(
            base_loaded / expected_round_time(loaded, N, N - si, load=float(si + 1))
        )
        out["load_scaled_heavy_tail"].append(
            base_heavy / expected_round_time(heavy, N, N - si, load=float(si + 1))
        )
    picks = s[:: max(1, len(s) // 6)]
    out["mc"] = {
        "s": picks.tolist(),
        "load_independent": [
            base_free / float(np.mean(round_times(free, N, int(si), "mds", samples=mc_samples)))
            for si in picks
        ],
        "load_scaled": [
            base_loaded
            / float(np.mean(round_times(loaded, N, int(si), "mds", samples=mc_samples)))
            for si in picks
        ],
    }
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default="results/speedup_vs_s")
    args = parser.parse_args(argv)
    sizes = [10, 50, 100] if args.quick else [10, 50, 100, 500]
    samples = 500 if args.quick else 4000
    result = {"N": sizes, "curves": {}}
    for N in progress(sizes, "speedup vs s"):
        result["curves"][str(N)] = curves(N, samples)
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=False)
    for N in sizes:
        c = result["curves"][str(N)]
        for ax, key in zip(axes, ("load_independent", "load_scaled"), strict=True):
            (line,) = ax.plot(np.array(c["s"]) / N, c[key], label=f"N={N}")
            ax.plot(np.array(c["mc"]["s"]) / N, c["mc"][key], "o", color=line.get_color(), ms=3)
            if key == "load_scaled":
                ax.plot(np.array(c["s"]) / N, c["load_scaled_heavy_tail"], "--",
                        color=line.get_color(), lw=1)
    axes[0].set_title("Load-independent: T ~ Exp(1)", fontsize=10)
    axes[1].set_title("Coded load counted: T = L (1 + Exp(rate))\nsolid: rate 1, dashed: rate 0.01",
                      fontsize=10)
    for ax in axes:
        ax.set_yscale("log")
    for ax in axes:
        ax.axhline(1, color="k", lw=0.8)
        ax.set_xlabel("s / N (fraction of stragglers tolerated)")
        ax.set_ylabel("expected speedup over uncoded (dots: Monte Carlo)")
        ax.legend()
    fig.tight_layout()
    for N in sizes:
        c = result["curves"][str(N)]
        i = int(np.argmax(c["load_scaled"]))
        j = int(np.argmax(c["load_scaled_heavy_tail"]))
        print(f"N={N:4d}: load-independent speedup at s=N/5: "
              f"{np.interp(N / 5, c['s'], c['load_independent']):6.2f}x | load counted: best "
              f"{c['load_scaled'][i]:.2f}x at s={c['s'][i]}; heavy tail: best "
              f"{c['load_scaled_heavy_tail'][j]:.2f}x at s={c['s'][j]}")
    save(result, args.out, fig)
    return result


if __name__ == "__main__":
    main()
