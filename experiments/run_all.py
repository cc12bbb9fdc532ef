"""Regenerate every figure and table: ``python -m experiments.run_all [--quick]``.

Writes JSON + PNG into ``results/`` (``--quick``: smaller settings into ``results/quick/``,
for smoke tests). The full run took 675 s (11 minutes) on 2 cores here.
"""

from __future__ import annotations

import argparse
import importlib
import time
from pathlib import Path

EXPERIMENTS = [
    "bench_codes",
    "speedup_vs_s",
    "approx_error",
    "regime_map",
    "matmul_speedup",
    "bench_dp",
    "latency_vs_s",
    "bench_adaptive",
    "time_to_accuracy",
    "sampled_cohorts",
    "wire_precision",
]
# further passes merged into the same results: time_to_accuracy's hindsight oracles (a
# reference for the adaptive policy, run on top of the schemes compared), the warm start,
# and the schemes whose clients stop at the deadline
FOLLOW_UP = {"time_to_accuracy": [["--schemes", "oracle", "--jobs", "2"],
                                  ["--schemes", "auto-warm", "--jobs", "2"],
                                  ["--schemes", "approx-deadline-stop,auto-deadline,deadline-fit",
                                   "--jobs", "2"]]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default="", help="comma list of experiments")
    parser.add_argument("--out-dir", default=None, help="default: results/ (results/quick/)")
    args = parser.parse_args(argv)
    out = Path(args.out_dir or ("results/quick" if args.quick else "results"))
    t_all = time.perf_counter()
    names = [n for n in args.only.split(",") if n] or EXPERIMENTS
    for name in names:
        t0 = time.perf_counter()
        print(f"== {name}", flush=True)
        module = importlib.import_module(f"experiments.{name}")
        module.main([*(["--quick"] if args.quick else []), "--out", str(out / name)])
        for extra in FOLLOW_UP.get(name, []):
            module.main([*(["--quick"] if args.quick else []), "--out", str(out / name),
                         *extra])
        print(f"== {name} done in {time.perf_counter() - t0:.0f} s", flush=True)
    print(f"== all done in {time.perf_counter() - t_all:.0f} s", flush=True)


if __name__ == "__main__":
    main()
