"""Run every test on its own, in a fresh interpreter: no test may rely on another having run.

Usage::

    python -m tools.tests_alone [-j JOBS] [-k EXPR] [-m MARKEXPR] [PATH ...]

Collects the node ids (``pytest --collect-only``), then runs ``python -m pytest <node id>``
once per test, ``JOBS`` at a time (default 2), each in a new process (cold imports, no warm
torch, no state left by an earlier test). A test that fails alone but passes in the suite
depends on another test. Results go to ``results/tests_alone.json``::

    {"passed": p, "failed": [node ids], "total": t, "runtime_s": ..., "command": ...}

Parametrised cases of one test function run in one process (``<file>::<function>``): they
share the function's code, and a fresh interpreter per case would multiply the run time by
the number of cases without isolating anything the cases do not already share.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the project's addopts without its random order: node ids at verbosity -1, doctests included
QUIET = ["-o", "addopts=-q --doctest-modules", "-p", "no:randomly", "-p", "no:cacheprovider"]


def collect(paths: list[str], extra: list[str]) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", *QUIET, *extra, *paths],
        cwd=ROOT, capture_output=True, text=True,
    )
    ids = [ln.strip() for ln in out.stdout.splitlines() if "::" in ln and " " not in ln.strip()]
    if not ids:
        raise SystemExit(f"collected no tests:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    # one process per test function: parametrised cases share it
    return list(dict.fromkeys(i.split("[", 1)[0] for i in ids))


def run_one(node: str) -> tuple[str, int, float, str]:
    t0 = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "pytest", *QUIET, "-x", node],
        cwd=ROOT, capture_output=True, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    errors = [ln for ln in out.stdout.splitlines() if ln.startswith(("E ", ">"))]
    return node, out.returncode, time.monotonic() - t0, "\n".join(errors[-40:])


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("paths", nargs="*", default=[], help="default: the testpaths")
    p.add_argument("-j", "--jobs", type=int, default=2)
    p.add_argument("-k", default=None, help="pytest -k expression")
    p.add_argument("-m", default=None, help="pytest -m marker expression")
    p.add_argument("--out", type=Path, default=ROOT / "results" / "tests_alone.json")
    args = p.parse_args(argv)
    extra = [*(["-k", args.k] if args.k else []), *(["-m", args.m] if args.m else [])]
    nodes = collect(args.paths, extra)
    t0 = time.monotonic()
    failed, slowest = [], []
    with ThreadPoolExecutor(args.jobs) as pool:
        for i, (node, rc, dt, tail) in enumerate(pool.map(run_one, nodes), 1):
            slowest.append((dt, node))
            if rc not in (0, 5):  # 5: every case deselected or skipped
                failed.append(node)
                print(f"FAILED alone: {node}\n{tail}", flush=True)
            if i % 50 == 0 or i == len(nodes):
                print(f"{i}/{len(nodes)} run, {len(failed)} failed "
                      f"({time.monotonic() - t0:.0f} s)", flush=True)
    result = {
        "passed": len(nodes) - len(failed), "failed": failed, "total": len(nodes),
        "unit": "test function (parametrised cases together), each in a fresh interpreter",
        "runtime_s": round(time.monotonic() - t0, 1),
        "slowest": [{"test": n, "s": round(t, 1)} for t, n in sorted(slowest)[-5:]],
        "command": "python -m tools.tests_alone " + " ".join(argv or sys.argv[1:]),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{result['passed']}/{result['total']} pass alone; wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
