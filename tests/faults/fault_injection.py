"""Seeded fault-injection suite over the public API: ``gradient_coding_mod`` + ``GradientCoding``
+ ``InProcessGrid``, against an independent numpy FedAvg oracle.

A scenario is ``(seed, n, code, s, timing, verify, rounds)`` plus faults drawn per
``(round, node)`` and per round. Faults are injected from outside the plug-in:

* inside the app (the ClientApp's train handler): an ``Error`` reply, an exception, NaN values;
* by an OUTER client mod around the real mod (``ClientApp(mods=[fault_mod,
  gradient_coding_mod])``) that rewrites the coded reply: Inf, wrong shape, wrong dtype (int /
  bool arrays), missing records, corrupt or truncated ``.npy`` bytes, metrics of the wrong type,
  a verbatim replay of an earlier round's reply, a forged worker claim, and the value forgeries
  (finite but wrong: 1e30 scaling, a scaled reply, an honestly computed reply for forged
  coefficients, an earlier round's arrays relabelled as this round's); it also reports the
  compute seconds (deterministic in virtual time; beyond the straggler deadline in an all-slow
  or all-busy round);
* by the grid (``InProcessGrid`` options): a crash mid-round (no reply, ever), a duplicated
  reply, a reply whose sender id is unknown or another node's; in wallclock scenarios the
  grid's per-reply delays (short Pareto delays; all-slow and all-busy rounds).

Invariants checked in every scenario (each failure is listed as a violation): the server never
raises; every round's model is finite, with the initial arrays' shapes and dtypes; exactly one
history row and one ``rounds.jsonl`` row per round, ``decode`` in {exact, approx, skipped}; an
approx round has ``decode_error <= max_decode_error``; a skipped round keeps the model bit for bit;
an exact round's model equals the oracle's FedAvg over all partitions of the previous round's
model (1e-6 relative) -- unless a value forgery was decoded in a scenario without redundancy to
catch it (``verify=False`` or ``s = 0``: then only finiteness); a reply the protocol must reject
is never decoded, and (virtual timing, every reply validated) every such fault appears among the
round's rejection reasons with the expected reason and no honest reply is rejected; an
all-slow / all-busy round decodes nothing; after an all-busy round the next round waits until a
node is free (virtual timing) rather than being spent on nothing; the integrity check never
excludes an honest reply as inconsistent; ``final_model.npz`` is the last decoded model.

Edge faults (``tests/faults/fault_kinds.py``, drawn from their own stream on top of the above,
on by default on the command line, ``run_suite(edge_faults=True)``): forgers that know
everything public, blind sparse forgers, overflow, partition-size forgery, handshake failures
(also of a node first sampled in a later round), identity clashes and ``(0, 1)`` claims,
replayed instructions sent to the client mod, lost wallclock replies. Their invariants: no run
ends by a node's failure (``runs_ended_by_node_failure``), a round recorded ``verified`` never
has a model off the oracle (``wrong_models_applied_as_verified``), the oracle averages the
partitions present in the round, a replayed instruction is refused, a lost reply's node is
free again within ``fault_kinds.EXPIRY_BOUND_S``. The replies the outer mod rewrites and their
expected rejection reasons are in ``tests/faults/fault_replies.py``.

The suite's parts: the fault kinds, the scenarios and the numpy oracle in
``tests/faults/fault_scenarios.py``; the injector (app, outer mod, grid) in
``tests/faults/fault_injector.py``; one scenario run and its invariants checked in
``tests/faults/fault_invariants.py``. This module runs the suite (``run_suite``), reports it and
writes the JSON; it re-exports the parts the tests use.

Run: ``python -m tests.faults.fault_injection [--full] [--scenarios N] [--seed S] [--out PATH]
[--no-edge-faults]`` (default: a fast slice of 40 scenarios; ``--full``: 500 scenarios and
``results/fault_injection.json``).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from tests.faults import fault_kinds as edges
from tests.faults.fault_injector import Injector
from tests.faults.fault_invariants import RTOL, quiet, run_scenario
from tests.faults.fault_kinds import EDGE_FAULTS
from tests.faults.fault_scenarios import (
    ALL_FAULTS,
    ALL_SHAPES,
    CODES,
    REASONS,
    REJECTED,
    SHAPES,
    SIZES,
    VALUE_FORGING,
    Scenario,
    flat_model,
    initial_model,
    make_scenario,
    node_ids_for,
    oracle,
    rng_for,
)

# the suite's parts, as the tests read them here
__all__ = [
    "ALL_FAULTS", "ALL_SHAPES", "CODES", "FAST_SCENARIOS", "FULL_SCENARIOS", "REASONS", "RTOL",
    "SHAPES", "SIZES", "VALUE_FORGING", "Injector", "Scenario", "edges", "flat_model",
    "initial_model", "main", "make_scenario", "node_ids_for", "oracle", "quiet", "report",
    "rng_for", "run_scenario", "run_suite",
]

ROOT = Path(__file__).resolve().parents[2]
FAST_SCENARIOS = 40
FULL_SCENARIOS = 500


# ------------------------------------------------------------------ the suite
def run_suite(
    num: int = FAST_SCENARIOS, seed: int = 0, progress: bool = False, edge_faults: bool = False
) -> dict[str, Any]:
    """Run ``num`` scenarios of suite ``seed`` (``edge_faults``: with the kinds of
    ``fault_kinds`` too); the counts (and every violation)."""
    t0 = time.perf_counter()
    faults, decodes, mix = Counter(), Counter(), Counter()
    matched, forgers, edge_outcomes = Counter(), Counter(), Counter()
    refused: list[str] = []
    totals = Counter()
    violations: list[str] = []
    slowest = (0.0, "")
    max_rel = 0.0
    for index in range(num):
        scn = make_scenario(seed, index, edge_faults)
        out = run_scenario(scn)
        mix[f"code={scn.code}"] += 1
        mix[f"timing={scn.timing}"] += 1
        mix[f"verify={scn.verify}"] += 1
        mix[f"n={scn.n}"] += 1
        mix[f"s={scn.s}"] += 1
        faults.update(kind for kind, _, _ in out.injected)
        decodes.update(row.get("decode") for row in out.rows)
        matched.update(out.matched)
        forgers.update(out.forger_outcomes)
        edge_outcomes.update(out.edge_outcomes)
        totals["wrong_verified"] += out.wrong_verified
        totals["ended"] += int(out.ended_by_node_failure)
        totals["raw_dp"] += sum(what == "raw" for _, _, _, what, _ in out.dp_attacks)
        if out.refused is not None:
            refused.append(f"{scn.describe()}: {out.refused}")
        totals["rounds"] += len(out.rows)
        totals["crashes"] += int(out.crashed)
        totals["corrupted_models"] += out.corrupted
        totals["exact_compared"] += out.compared
        totals["exact_not_compared"] += out.not_compared
        totals["rejected_replies"] += sum(int(r.get("rejected", 0)) for r in out.rows)
        totals["late_dropped"] += sum(int(r.get("late_dropped", 0)) for r in out.rows)
        totals["excluded_inconsistent"] += sum(len(r.get("inconsistent") or []) for r in out.rows)
        totals["honest_excluded"] += out.honest_excluded
        totals["exact_missing"] += out.exact_missing
        totals["honest_punished"] += out.honest_punished
        max_rel = max(max_rel, out.max_rel_error)
        violations.extend(f"{scn.describe()}: {v}" for v in out.violations)
        if out.wall_s > slowest[0]:
            slowest = (out.wall_s, scn.describe())
        if progress and (index + 1) % 50 == 0:
            print(f"  {index + 1}/{num} scenarios, {len(violations)} violations, "
                  f"{time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    return {
        "scenarios": num,
        "seed": seed,
        "rounds": totals["rounds"],
        "faults_injected": {k: faults.get(k, 0) for k in ALL_FAULTS + EDGE_FAULTS},
        "faults_injected_total": sum(faults.values()),
        "rejections_matched": {k: matched.get(k, 0) for k in REJECTED},
        "value_forgeries": dict(sorted(forgers.items())),
        "decode": {k: decodes.get(k, 0) for k in ("exact", "approx", "skipped")},
        "exact_rounds_compared_with_oracle": totals["exact_compared"],
        "exact_rounds_not_compared": totals["exact_not_compared"],
        "max_relative_error": max_rel,
        "rejected_replies": totals["rejected_replies"],
        "late_dropped": totals["late_dropped"],
        "excluded_inconsistent": totals["excluded_inconsistent"],
        "honest_excluded_as_inconsistent": totals["honest_excluded"],
        "crashes": totals["crashes"],
        "corrupted_models": totals["corrupted_models"],
        "edge_faults": edge_faults,
        "wrong_models_applied_as_verified": totals["wrong_verified"],
        "runs_ended_by_node_failure": totals["ended"],
        "exact_rounds_with_partition_missing": totals["exact_missing"],
        "honest_nodes_punished": totals["honest_punished"],
        "raw_releases_by_dp_nodes": totals["raw_dp"],
        "edge_fault_outcomes": dict(sorted(edge_outcomes.items())),
        "configurations_refused": refused,
        "invariant_violations": violations,
        "mix": dict(sorted(mix.items())),
        "runtime_s": round(time.perf_counter() - t0, 2),
        "slowest_scenario": {"wall_s": round(slowest[0], 2), "scenario": slowest[1]},
    }


def report(result: dict[str, Any]) -> str:
    lines = [
        f"scenarios: {result['scenarios']} (seed {result['seed']}), rounds: {result['rounds']}",
        f"faults injected: {result['faults_injected_total']}",
        *(f"  {k:<20} {v}" for k, v in result["faults_injected"].items()),
        "rejected with the expected reason (virtual timing): "
        + ", ".join(f"{k} {v}" for k, v in result["rejections_matched"].items()),
        "value forgeries: " + ", ".join(f"{k} {v}" for k, v in result["value_forgeries"].items()),
        "rounds: " + ", ".join(f"{k} {v}" for k, v in result["decode"].items()),
        f"exact rounds compared with the oracle: {result['exact_rounds_compared_with_oracle']} "
        f"(max relative error {result['max_relative_error']:.1e}; "
        f"{result['exact_rounds_not_compared']} not compared: a value forgery decoded without "
        "redundancy)",
        f"rejected replies: {result['rejected_replies']}, late dropped: "
        f"{result['late_dropped']}, excluded as inconsistent: {result['excluded_inconsistent']} "
        f"(honest replies among them: {result['honest_excluded_as_inconsistent']})",
        "mix: " + ", ".join(f"{k} {v}" for k, v in result["mix"].items()),
        f"crashes: {result['crashes']}",
        f"corrupted models: {result['corrupted_models']}",
        f"edge faults: {result['edge_faults']}; wrong models applied as verified: "
        f"{result['wrong_models_applied_as_verified']}; runs ended by a node's failure: "
        f"{result['runs_ended_by_node_failure']}; raw releases by nodes with a DP policy: "
        f"{result['raw_releases_by_dp_nodes']}",
        *(f"  {k:<40} {v}" for k, v in result["edge_fault_outcomes"].items()),
        f"configurations refused: {len(result['configurations_refused'])}",
        *(f"  - {v}" for v in result["configurations_refused"]),
        f"invariant violations: {len(result['invariant_violations'])}",
        *(f"  - {v}" for v in result["invariant_violations"]),
        f"runtime: {result['runtime_s']:.1f} s (slowest scenario "
        f"{result['slowest_scenario']['wall_s']} s)",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help=f"{FULL_SCENARIOS} scenarios")
    parser.add_argument("--scenarios", type=int, default=None, help="number of scenarios")
    parser.add_argument("--seed", type=int, default=0, help="suite seed")
    parser.add_argument("--no-edge-faults", action="store_true",
                        help="without the fault kinds of tests/faults/fault_kinds.py")
    parser.add_argument("--out", default=None, help="JSON output (default with --full: "
                        "results/fault_injection.json)")
    args = parser.parse_args(argv)
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:  # pragma: no cover
        pass
    num = args.scenarios or (FULL_SCENARIOS if args.full else FAST_SCENARIOS)
    result = run_suite(num, args.seed, progress=True, edge_faults=not args.no_edge_faults)
    print(report(result))
    out = args.out or (str(ROOT / "results" / "fault_injection.json") if args.full else None)
    if out:
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        saved = {**result, "machine": {"python": platform.python_version(),
                                       "cpu": platform.machine()}}
        path.write_text(json.dumps(saved, indent=2) + "\n")
        print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
