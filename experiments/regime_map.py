"""Experiment 5: where does gradient coding pay? Best s over straggler severity and compute cost.

``n = 100`` clients. A client computing ``L`` partitions takes ``c L (1 + Exp(1)) + D``: ``c``
is the mean compute cost of one partition (load-scaled, with its own variability), ``D`` a
load-independent delay, ``Exp(1)`` for normal clients and ``slowdown`` times that for a
fraction ``p = 5%`` of slow ones (redrawn each round). For
every ``(c, slowdown)`` the Monte Carlo expected round time of an exact code tolerating ``s``
(the ``(n-s)``-th arrival at load ``s+1``, and FRC's group rule where ``(s+1) | n``) is
compared with uncoded (``s = 0``): the map shows the best ``s`` and its speedup; ``s = 0`` means
coding does not pay.

Run: ``python -m experiments.regime_map [--quick] [--out results/regime_map]``.
"""

from __future__ import annotations

import argparse

import numpy as np

from experiments.common import progress, pyplot, save
from fl_gradcode.latency import Bimodal, Exponential, ShiftedExponential, round_times


class ComputePlusDelay:
    """``c L (1 + Exp(1))`` of load-scaled compute plus a load-independent delay model."""

    load_scaled = True

    def __init__(self, cost: float, delay) -> None:
        self.compute = ShiftedExponential(shift=cost, rate=1.0 / cost)
        self.delay = delay

    def sample(self, size, rng, load=1.0):
        return self.compute.sample(size, rng, load) + self.delay.sample(size, rng, load)


def best_s(model, n, candidates, samples, seed):
    uncoded = float(np.mean(round_times(model, n, 0, "uncoded", samples=samples, seed=seed)))
    best = (uncoded, 0, "uncoded")
    for s in candidates:
        for scheme in ("mds", "frc"):
            if scheme == "frc" and n % (s + 1):
                continue
            t = float(np.mean(round_times(model, n, s, scheme, samples=samples, seed=seed)))
            best = min(best, (t, s, scheme))
    return best, uncoded


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default="results/regime_map")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    n, p = 100, 0.05
    costs = np.logspace(-2, 1, 4 if args.quick else 10)
    slowdowns = np.logspace(0, 2.5, 4 if args.quick else 10)
    candidates = [1, 3, 4, 9, 19, 24, 49] if args.quick else [1, 2, 3, 4, 6, 9, 14, 19, 24, 33,
                                                             49, 74, 99]
    samples = 300 if args.quick else 2000
    best_s_map = np.zeros((len(costs), len(slowdowns)), dtype=int)
    speedup = np.zeros_like(best_s_map, dtype=float)
    scheme = np.empty(best_s_map.shape, dtype=object)
    cells = [(i, j) for i in range(len(costs)) for j in range(len(slowdowns))]
    for i, j in progress(cells, "regime map"):
        delay = Bimodal(base=Exponential(rate=1.0), p=p, slowdown=float(slowdowns[j]))
        model = ComputePlusDelay(float(costs[i]), delay)
        (t, s, sch), uncoded = best_s(model, n, candidates, samples, args.seed)
        best_s_map[i, j], speedup[i, j], scheme[i, j] = s, uncoded / t, sch
    result = {"n": n, "p": p, "partition_cost": costs, "slowdown": slowdowns,
              "best_s": best_s_map, "speedup": speedup, "scheme": scheme.tolist(),
              "candidates": candidates, "samples": samples}
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"wspace": 0.35})
    extent = [0, len(slowdowns), 0, len(costs)]
    im0 = axes[0].imshow(best_s_map, origin="lower", aspect="auto", cmap="viridis", extent=extent)
    im1 = axes[1].imshow(np.log2(speedup), origin="lower", aspect="auto", cmap="RdBu",
                         vmin=-3, vmax=3, extent=extent)
    for i in range(len(costs)):
        for j in range(len(slowdowns)):
            axes[0].text(j + 0.5, i + 0.5, str(best_s_map[i, j]), ha="center", va="center",
                         fontsize=7, color="w")
            v = speedup[i, j]
            axes[1].text(j + 0.5, i + 0.5, f"{v:.2g}" if v < 10 else f"{v:.0f}", ha="center",
                         va="center", fontsize=6)
    fig.colorbar(im0, ax=axes[0], label="best s (0 = stay uncoded)")
    fig.colorbar(im1, ax=axes[1], label="log2 speedup of the best choice over uncoded")
    for ax in axes:
        ax.set_xticks(np.arange(len(slowdowns)) + 0.5, [f"{x:.3g}" for x in slowdowns],
                      rotation=45)
        ax.set_yticks(np.arange(len(costs)) + 0.5, [f"{c:.2g}" for c in costs])
        ax.set_xlabel(f"slowdown of the {p:.0%} slow clients (delay ~ Exp(1))")
        ax.set_ylabel("compute cost of one partition (units of mean delay)")
    axes[0].set_title(f"best straggler tolerance, n={n}")
    axes[1].set_title("speedup of the best choice (1 = coding does not pay)")
    pays = speedup > 1.0 + 1e-9
    print(f"coding pays in {pays.sum()} of {pays.size} cells; best speedup "
          f"{speedup.max():.2f}x; best s at the largest cost {costs[-1]:.3g}: "
          f"{best_s_map[-1].tolist()}; at the smallest cost {costs[0]:.3g}: "
          f"{best_s_map[0].tolist()}")
    save(result, args.out, fig)
    return result


if __name__ == "__main__":
    main()
