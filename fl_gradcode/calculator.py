"""Does coding pay? Expected round time and speedup per straggler tolerance ``s`` and scheme.

A client computing ``L`` partitions takes ``partition_cost * L + delay``; the delay comes from a
latency model whose deterministic and random parts scale with ``L`` when the model is
load-scaled (``shifted-exponential``, ``bimodal``, ``persistent``) and do not otherwise
(``exponential``, ``pareto``, ``trace``). Uncoded waits for all ``n`` at ``L = 1``;
ignore-stragglers for the fastest ``n - s`` at ``L = 1`` (approximate); an exact code
for the ``(n-s)``-th arrival at ``L = s+1`` (``any n-s``: an upper bound for ``grouped-rs``,
which is FRC when ``(s+1) | n``); FRC for the first reply of every group of ``s+1``.

Run: ``python -m fl_gradcode.calculator --n 64 --latency bimodal --p 0.05 --slowdown 10``
or ``python -m fl_gradcode.calculator --preset seeds-64`` (a worked example: 64
workers, 5% stragglers, ``s = 3`` with 4x storage).
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from .latency import LATENCY_MODELS, make_latency, round_times

PRESETS = {
    "seeds-64": {
        "n": 64,
        "latency": "bimodal",
        "p": 0.05,
        "slowdown": 10.0,
        "scale": 1.0,
        "rate": 1.0,
        "partition_cost": 0.0,
        "s": [0, 1, 3, 7, 15],
        "highlight": 3,
        "note": "64 workers, 5% stragglers slowed 10x, s=3 (every partition stored 4x)",
    }
}


def table(
    n: int,
    latency: str,
    *,
    s_values: list[int],
    partition_cost: float = 0.0,
    samples: int = 4000,
    seed: int = 0,
    **model_args,
) -> dict:
    """Expected round times for each ``s`` and scheme, speedups vs uncoded, and the best."""
    model = make_latency(latency, seed=seed, **model_args)
    kw = {"partition_cost": partition_cost, "samples": samples, "seed": seed}
    uncoded = float(np.mean(round_times(model, n, 0, "uncoded", **kw)))
    rows = []
    for s in s_values:
        if not 0 <= s < n:
            raise ValueError(f"s={s} must satisfy 0 <= s < n={n}")
        row = {"s": s, "load": s + 1, "uncoded": uncoded}
        ignore = round_times(model, n, s, "ignore-stragglers", **kw)
        row["ignore-stragglers"] = float(np.mean(ignore))
        row["exact (any n-s)"] = float(np.mean(round_times(model, n, s, "mds", **kw)))
        row["frc"] = (
            float(np.mean(round_times(model, n, s, "frc", **kw))) if n % (s + 1) == 0 else None
        )
        rows.append(row)
    exact = [(r["exact (any n-s)"], r["s"], "exact (any n-s)") for r in rows]
    exact += [(r["frc"], r["s"], "frc") for r in rows if r["frc"] is not None]
    best_time, best_s, best_code = min(exact)
    return {
        "n": n,
        "latency": latency,
        "model_args": model_args,
        "partition_cost": partition_cost,
        "rows": rows,
        "best": {"s": best_s, "code": best_code, "time": best_time, "speedup": uncoded / best_time},
        "coding_pays": best_s > 0 and best_time < uncoded,
    }


def render(result: dict, highlight: int | None = None) -> str:
    lines = [
        f"n={result['n']}, latency={result['latency']} {result['model_args']}, "
        f"partition cost {result['partition_cost']}",
        f"{'s':>4}{'load':>6}{'uncoded':>10}{'ignore(n-s)':>13}{'any n-s':>10}{'frc':>10}"
        f"{'any n-s speedup':>17}",
    ]
    for r in result["rows"]:
        frc = "-" if r["frc"] is None else f"{r['frc']:.3f}"
        mark = "  <-" if r["s"] == highlight else ""
        lines.append(
            f"{r['s']:>4}{r['load']:>5}x{r['uncoded']:>10.3f}{r['ignore-stragglers']:>13.3f}"
            f"{r['exact (any n-s)']:>10.3f}{frc:>10}"
            f"{r['uncoded'] / r['exact (any n-s)']:>14.2f}x{mark}"
        )
    b = result["best"]
    verdict = "coding pays" if result["coding_pays"] else "coding does NOT pay: stay uncoded"
    lines.append(
        f"best exact choice: {b['code']} with s={b['s']} (E[T]={b['time']:.3f}, "
        f"{b['speedup']:.2f}x vs uncoded) -> {verdict}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS))
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--latency", choices=LATENCY_MODELS, default="bimodal")
    parser.add_argument("--scale", type=float, default=1.0, help="shift / Pareto scale")
    parser.add_argument("--rate", type=float, default=1.0)
    parser.add_argument("--shape", type=float, default=2.0, help="Pareto shape")
    parser.add_argument("--p", type=float, default=0.05, help="fraction of slow clients")
    parser.add_argument("--slowdown", type=float, default=10.0)
    parser.add_argument("--partition-cost", type=float, default=0.0)
    parser.add_argument("--s", default="", help="comma list of s (default: a spread up to n-1)")
    parser.add_argument("--samples", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    highlight = None
    if args.preset:
        preset = PRESETS[args.preset]
        print(preset["note"])
        n, latency = preset["n"], preset["latency"]
        model_args = {k: preset[k] for k in ("p", "slowdown", "scale", "rate")}
        cost, s_values, highlight = preset["partition_cost"], preset["s"], preset["highlight"]
    else:
        n, latency, cost = args.n, args.latency, args.partition_cost
        model_args = {"scale": args.scale, "rate": args.rate, "shape": args.shape, "p": args.p,
                      "slowdown": args.slowdown}
        s_values = [int(x) for x in args.s.split(",") if x] or sorted(
            {0, 1, 2, 3, n // 16, n // 8, n // 4, n // 2} - {n}
        )
    try:
        result = table(n, latency, s_values=s_values, partition_cost=cost,
                       samples=args.samples, seed=args.seed, **model_args)
    except ValueError as exc:  # e.g. drift: no one round-time distribution
        parser.error(str(exc))
    print(render(result, highlight))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
    return result


if __name__ == "__main__":
    main()
