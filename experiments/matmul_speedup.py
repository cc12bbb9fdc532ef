"""Coded matrix multiplication vs gradient coding: expected speedup, best k, and one problem.

Part 1 (Lee et al. 2018, the seed's "coded matmul speedup vs k" plot, n = 100): a worker with
load ``L`` takes ``L * (shift + Exp(rate))``. Uncoded waits for all ``n`` at load ``1/n``; an
MDS code waits for the ``k``-th at load ``1/k``. Closed form (``expected_round_time``) against
Monte Carlo, the best ``k`` per rate, and, for contrast, gradient coding with tolerance ``s``
(load ``(s+1)/n``, wait for ``n - s``) under the same model.

Part 2 (both pillars on one problem): least-squares gradient descent on synthetic data with
``n`` workers and virtual timing (sampled latencies, no sleeping); the unit of load is one
full gradient (two full mat-vecs). Per iteration, uncoded
waits for all ``n``; coded mat-vecs (``X w`` then ``X^T r``) wait twice for the ``k``-th;
gradient coding (``grouped-rs``) waits once for the fastest decodable set with load
``(s+1)/n``. All three compute the exact gradient, so the iterates agree; only time differs.

Run: ``python -m experiments.matmul_speedup [--quick] [--out results/matmul_speedup]``
(writes ``.json`` and ``.png``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from fl_gradcode.codes import make_code
from fl_gradcode.latency import ShiftedExponential, expected_round_time
from fl_gradcode.matmul import coded_least_squares_gradient


def speedup_curves(n: int, rates: list[float], mc_samples: int, seed: int) -> dict:
    out = {}
    rng = np.random.default_rng(seed)
    for rate in rates:
        model = ShiftedExponential(shift=1.0, rate=rate)
        uncoded = expected_round_time(model, n, n, load=1.0 / n)
        ks = np.arange(1, n + 1)
        mds = np.array([expected_round_time(model, n, int(k), load=1.0 / k) for k in ks])
        gc = np.array(
            [expected_round_time(model, n, n - s, load=(s + 1) / n) for s in range(n)]
        )
        mc_k = ks[:: max(1, n // 10)]
        mc = []
        for k in mc_k:
            t = np.sort(model.sample((mc_samples, n), rng, 1.0 / k), axis=1)[:, k - 1]
            mc.append(float(t.mean()))
        best = int(ks[np.argmin(mds)])
        out[str(rate)] = {
            "rate": rate,
            "uncoded": uncoded,
            "mds_expected": mds.tolist(),
            "mds_speedup": (uncoded / mds).tolist(),
            "mc_k": mc_k.tolist(),
            "mc_expected": mc,
            "best_k": best,
            "best_speedup": float(uncoded / mds.min()),
            "gc_expected": gc.tolist(),
            "gc_best_s": int(np.argmin(gc)),
            "gc_best_speedup": float(uncoded / gc.min()),
        }
    return out


def regression_race(n: int, k: int, s: int, iters: int, rate: float, seed: int) -> dict:
    """Least-squares GD under virtual time: uncoded, coded mat-vec (MDS), gradient coding."""
    rng = np.random.default_rng(seed)
    rows, dim = 40 * n, 20
    X = rng.standard_normal((rows, dim))
    y = X @ rng.standard_normal(dim) + 0.1 * rng.standard_normal(rows)
    lr = 1.0 / np.linalg.norm(X, 2) ** 2
    model = ShiftedExponential(shift=1.0, rate=rate)
    fwd, bwd = coded_least_squares_gradient(X, y, n=n, k=k, seed=seed)
    code = make_code("grouped-rs", n=n, s=s)
    parts = np.array_split(np.arange(rows), code.k)
    lat = np.random.default_rng(seed + 1)
    schemes = {"uncoded": [], "mds-matvec": [], "gradient-coding": []}
    w = {name: np.zeros(dim) for name in schemes}
    clock = dict.fromkeys(schemes, 0.0)
    for _ in range(iters):
        # uncoded: each worker computes its 1/n of the gradient; wait for all n
        t = model.sample(n, lat, 1.0 / n)
        clock["uncoded"] += float(t.max())
        w["uncoded"] = w["uncoded"] - lr * X.T @ (X @ w["uncoded"] - y)
        # coded mat-vecs: two rounds, each worker does 1/k of one product (half a gradient's
        # work, so load 0.5/k in gradient units), wait for the k-th in each round
        wm = w["mds-matvec"]
        t1 = model.sample(n, lat, 0.5 / k)
        first = np.argsort(t1)[:k]
        r = fwd.decode({int(i): fwd.task(int(i), wm) for i in first}) - y
        t2 = model.sample(n, lat, 0.5 / k)
        second = np.argsort(t2)[:k]
        g = bwd.decode({int(i): bwd.task(int(i), r) for i in second})
        clock["mds-matvec"] += float(np.sort(t1)[k - 1] + np.sort(t2)[k - 1])
        w["mds-matvec"] = wm - lr * g
        # gradient coding: load (s+1)/n, stop at the first decodable prefix of arrivals
        wg = w["gradient-coding"]
        t3 = model.sample(n, lat, code.load_fraction)
        order = np.argsort(t3)
        updates = {j: X[idx].T @ (X[idx] @ wg - y[idx]) for j, idx in enumerate(parts)}
        for m in range(1, n + 1):
            if code.is_decodable(order[:m].tolist()):
                break
        arrived = [int(i) for i in order[:m]]
        g = code.decode({i: code.encode(i, updates) for i in arrived})
        clock["gradient-coding"] += float(t3[order[m - 1]])
        w["gradient-coding"] = wg - lr * g
    ref = w["uncoded"]
    return {
        "n": n,
        "k": k,
        "s": s,
        "iterations": iters,
        "rate": rate,
        "virtual_time": clock,
        "speedup_vs_uncoded": {name: clock["uncoded"] / c for name, c in clock.items()},
        "distance_to_uncoded": {
            name: float(np.linalg.norm(v - ref) / np.linalg.norm(ref)) for name, v in w.items()
        },
        "loss": {name: float(np.mean((X @ v - y) ** 2)) for name, v in w.items()},
    }


def plot(curves: dict, n: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for key, c in curves.items():
        ks = np.arange(1, n + 1)
        (line,) = axes[0].plot(ks, c["mds_speedup"], label=f"MDS, rate={c['rate']}")
        axes[0].plot(
            c["mc_k"], [c["uncoded"] / m for m in c["mc_expected"]], "o", color=line.get_color()
        )
        axes[0].axvline(c["best_k"], color=line.get_color(), ls=":", lw=0.8)
        axes[1].plot(
            np.arange(n), c["uncoded"] / np.array(c["gc_expected"]), label=f"GC, rate={key}"
        )
    for ax in axes:
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_ylabel("speedup over uncoded (expected)")
        ax.legend()
    axes[0].set_xlabel("k (recovery threshold); dots: Monte Carlo, dotted: best k")
    axes[1].set_xlabel("s (gradient-coding straggler tolerance)")
    axes[1].set_yscale("log")
    fig.suptitle(f"n={n}, load-scaled shifted exponential L*(1 + Exp(rate))")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default="results/matmul_speedup")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    n = 100
    rates = [1.0, 0.1, 0.01]
    curves = speedup_curves(n, rates, 2000 if args.quick else 20000, args.seed)
    print(f"n={n}, T = L*(1 + Exp(rate)); uncoded waits for all n at load 1/n")
    print(f"{'rate':>6}{'uncoded':>10}{'best k':>8}{'MDS speedup':>13}{'GC best s':>11}"
          f"{'GC speedup':>12}")
    for c in curves.values():
        print(
            f"{c['rate']:>6}{c['uncoded']:>10.4f}{c['best_k']:>8}{c['best_speedup']:>13.2f}"
            f"{c['gc_best_s']:>11}{c['gc_best_speedup']:>12.2f}"
        )
    race = regression_race(
        n=20, k=14, s=4, iters=20 if args.quick else 100, rate=0.1, seed=args.seed
    )
    print(
        f"\nleast-squares GD, n={race['n']}, {race['iterations']} iterations, rate={race['rate']}"
    )
    for name, t in race["virtual_time"].items():
        print(
            f"  {name:<16} virtual time {t:8.3f}  speedup {race['speedup_vs_uncoded'][name]:5.2f}"
            f"  distance to uncoded iterate {race['distance_to_uncoded'][name]:.1e}"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"n": n, "curves": curves, "regression": race, "quick": args.quick}
    out.with_suffix(".json").write_text(json.dumps(result, indent=2))
    plot(curves, n, out.with_suffix(".png"))
    print(f"\nwrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")
    return result


if __name__ == "__main__":
    main()
