"""First-hour regimes: where the main job's coded run wins, and a preset where it does not.

For each candidate regime (run-config overrides over :data:`BASE`) and each seed, the main job's
three runs are run by the one benchmark harness (:mod:`experiments.rival_runs`: in process, in
virtual time, the main job's ClientApp, cohorts drawn from the seed), on the same seeds and
latency draws:

* ``coded``: the coded run (``rival_runs.start_coded``: the main job's strategy);
* ``wait-for-all``: the main job's ``uncoded`` run (``server.launch.RUNS``: identity code, no
  deadline), the same runner;
* ``drop-stragglers``: Flower's own FedAvg dropping the replies later than ``straggler-timeout``
  (``rival_runs.start_rival("deadline", ...)``, the public ``DeadlineFedAvg``).

Each run's rows (those of its ``rounds.jsonl``) are summarised with the main job's own
:func:`server.launch.summarize` against the main job's target: the lowest final accuracy of the
three runs (as :func:`server.launch.compare`). A regime ``wins`` when, on every seed, the coded
run reaches the target at least twice as soon as wait-for-all and sooner than drop-stragglers,
with a final accuracy at least drop-stragglers'.

Usage: ``python -m experiments.first_hour [--seeds 0 1 2] [--regimes a b] [--clients 12]
[--rounds R] [--out ...]`` (``--rounds``: override every regime's ``num-rounds``, e.g. for a
smoke run).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from experiments.summary import fmt

ROOT = Path(__file__).resolve().parents[1]

#: The three runs of the main job, by their names in the JSON.
RUN_NAMES = ("coded", "wait-for-all", "drop-stragglers")

#: What every regime overrides: the run-config defaults when the committed results were
#: measured (bimodal p=0.1 x20 stragglers, a 10-s deadline, measured compute, s=3). Pinned
#: here, so that the regimes mean the same runs whatever the defaults are now (today's defaults
#: are this base with the recommended regime's overrides: tests/experiments/test_first_hour.py).
BASE: dict[str, Any] = {"s": 3, "s-max": 0, "latency": "bimodal", "latency-p": 0.1,
                        "straggler-timeout": 10.0, "virtual-compute": "measured",
                        "partition-cost-s": 0.0}

_NONE = {"virtual-compute": "none"}  # compute charged as partition-cost-s x load, not measured
_PERSISTENT = {"latency": "persistent", "latency-p": 0.2, "straggler-timeout": 2.0,
               **_NONE, "partition-cost-s": 0.05}
#: Candidate regimes: run-config overrides over :data:`BASE` and the other defaults (12
#: clients, 30 rounds, digits, Dirichlet(0.5), grouped-rs).
REGIMES: dict[str, dict[str, Any]] = {
    # the base itself (the main job's defaults before they became the recommended regime):
    # bimodal p=0.1 x20, 10-s deadline (drops nothing), measured compute
    "today": {},
    # today's latency with a deadline near the fast clients' coded time (it drops)
    "today-deadline": {"straggler-timeout": 2.0},
    # heavier tail: a fifth of the clients straggle each round, 20x slower; compute charged
    # at 0.05 s per partition (s+1 = 4x for a coded client)
    "bimodal-heavy": {"latency-p": 0.2, "straggler-timeout": 2.0, **_NONE,
                      "partition-cost-s": 0.05},
    # the same clients slow every round (slow hardware), a deadline that drops them
    "persistent": dict(_PERSISTENT),
    "persistent-t1.5": {**_PERSISTENT, "straggler-timeout": 1.5},
    # ... workers stop at the deadline instead of finishing work no round can use
    "persistent-stop": {**_PERSISTENT, "stop-late-work": True},
    # ... the tolerance chosen every round from observed latencies
    "persistent-auto": {**_PERSISTENT, "s": "auto"},
    # ... tolerating up to 4 slow clients (the default s-max is n // 4 = 3)
    "persistent-auto4": {**_PERSISTENT, "s": "auto", "s-max": 4},
    # ... more skewed data (Dirichlet 0.3): dropping the slow clients costs more accuracy
    "persistent-a0.3": {**_PERSISTENT, "dirichlet-alpha": 0.3},
    "persistent-auto4-a0.3": {**_PERSISTENT, "s": "auto", "s-max": 4, "dirichlet-alpha": 0.3},
    # ... measured compute (the defaults' virtual-compute) instead of a charged cost
    "persistent-measured": {"latency": "persistent", "latency-p": 0.2,
                            "straggler-timeout": 2.0},
    # ... compute dominates: 0.2 s per partition
    "persistent-cost0.2": {**_PERSISTENT, "partition-cost-s": 0.2},
    # Pareto tail (shape 1.5): rare, very slow replies
    "pareto": {"latency": "pareto", "latency-shape": 1.5, "straggler-timeout": 2.0, **_NONE,
               "partition-cost-s": 0.05},
    # no stragglers (light tail) and a real compute cost per partition (the default 10-s
    # deadline, which nothing reaches): coding only pays its s+1 = 4x compute
    "no-stragglers-cost": {"latency": "shifted-exponential", **_NONE,
                           "partition-cost-s": 0.2},
}


def run_overrides(name: str, regime: Mapping[str, Any]) -> dict[str, Any]:
    """The run config of run ``name`` (:data:`RUN_NAMES`) in ``regime``, as the main job
    builds it (:func:`server.launch.run_config_for`): the rivals leave out the coded-only keys,
    then the run's own keys replace the regime's."""
    from server.launch import CODED_ONLY, RUNS, override_values

    launch_name = {"wait-for-all": "uncoded"}.get(name, name)
    if launch_name not in RUNS:
        raise ValueError(f"run {name!r}; expected one of {RUN_NAMES}")
    own = override_values(RUNS[launch_name])
    keep = {k: v for k, v in regime.items()
            if k not in own and (name == "coded" or k not in CODED_ONLY)}
    return {**keep, **own}


def run_one(name: str, regime: Mapping[str, Any], seed: int, n: int,
            results_dir: Path | None = None) -> list[dict]:
    """Run ``name`` of the main job in ``regime`` with ``seed`` on ``n`` clients through the
    harness; its rows (``rounds.jsonl``'s). ``results_dir``: where the coded runs write their
    ``rounds.jsonl`` and model, as the main job does (default: nothing written)."""
    from experiments import rival_runs

    cfg = {**run_overrides(name, {**BASE, **regime}), "seed": seed,
           "results-dir": str(results_dir) if results_dir is not None else ""}
    if name == "drop-stragglers":  # its deadline: the run config's straggler-timeout
        return rival_runs.start_rival("deadline", cfg, n).history
    return rival_runs.start_coded(cfg, n, share_updates=True).history


def seed_row(rows: Mapping[str, list[dict]], seed: int) -> dict[str, Any]:
    """One seed's line: each run's :func:`server.launch.summarize` against the main job's
    target (the lowest final accuracy of the runs), and the coded run's speedups."""
    from server.launch import summarize

    finals = [r[-1]["accuracy"] for r in rows.values() if r]
    target = min((a for a in finals if a is not None), default=0.0)
    out: dict[str, Any] = {"seed": seed, "target": target}
    for name, run_rows in rows.items():
        s = summarize(name if name != "wait-for-all" else "uncoded", run_rows, target)
        out[name] = {"final": s["final"], "time_to": s["time_to"], "total_s": s["total_s"],
                     "exact_rounds": list(s["exact"]) if s["exact"] else None,
                     "mb_up": s["mb_up"], "compute_s": s["compute_s"],
                     "dropped": s["dropped"], "rounds": s["rounds"]}
    coded = out["coded"]["time_to"]
    for rival, key in (("wait-for-all", "speedup_vs_wait"), ("drop-stragglers",
                                                            "speedup_vs_drop")):
        other = out[rival]["time_to"] if rival in out else None
        # a run that never reached the target: no ratio (None), counted as a loss for coding
        out[key] = other / coded if coded and other else None
    return out


def seed_wins(row: Mapping[str, Any]) -> bool:
    """The goal on one seed: >= 2x sooner than wait-for-all, sooner than drop-stragglers,
    final accuracy >= drop-stragglers'."""
    vs_wait, vs_drop = row["speedup_vs_wait"], row["speedup_vs_drop"]
    final, drop_final = row["coded"]["final"], row["drop-stragglers"]["final"]
    return (vs_wait is not None and vs_wait >= 2.0 and vs_drop is not None and vs_drop > 1.0
            and final is not None and drop_final is not None and final >= drop_final - 1e-12)


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if len(known) == len(values) and known else None


def explore(regimes: Mapping[str, Mapping[str, Any]], seeds: Sequence[int], *,
            n: int = 12, rounds: int | None = None, log=print) -> dict[str, Any]:
    """Every regime x seed x run; the results document (see the module docstring)."""
    from fl_gradcode.config import merge_config

    out: dict[str, Any] = {
        "target": "lowest final accuracy of the three runs of the seed (server.launch.compare)",
        "goal": "coded reaches the target >= 2x sooner than wait-for-all and sooner than "
                "drop-stragglers, final accuracy >= drop-stragglers', on every seed",
        "num_clients": n, "seeds": list(seeds), "base": dict(BASE), "regimes": {},
    }
    for regime_name, regime in regimes.items():
        regime = {**regime, **({"num-rounds": rounds} if rounds else {})}
        merge_config(regime)  # unknown keys and wrong types: refused before any run
        t0 = time.perf_counter()
        per_seed = []
        for seed in seeds:
            rows = {name: run_one(name, regime, seed, n) for name in RUN_NAMES}
            row = seed_row(rows, seed)
            row["wins"] = seed_wins(row)
            per_seed.append(row)
            log(f"{regime_name} seed {seed}: target {row['target']:.3f}, "
                f"coded {fmt(row['coded']['time_to'])} s final {row['coded']['final']:.3f}, "
                f"wait {fmt(row['wait-for-all']['time_to'])} s "
                f"final {row['wait-for-all']['final']:.3f}, "
                f"drop {fmt(row['drop-stragglers']['time_to'])} s "
                f"final {row['drop-stragglers']['final']:.3f} "
                f"(dropped {row['drop-stragglers']['dropped']}); "
                f"x{fmt(row['speedup_vs_wait'])} vs wait, x{fmt(row['speedup_vs_drop'])} "
                f"vs drop; wins={row['wins']}")
        out["regimes"][regime_name] = {
            "run_config": dict(regime),
            "per_seed": per_seed,
            "median_speedup_vs_wait": _median([r["speedup_vs_wait"] for r in per_seed]),
            "median_speedup_vs_drop": _median([r["speedup_vs_drop"] for r in per_seed]),
            "wins": all(r["wins"] for r in per_seed),
            "runtime_s": time.perf_counter() - t0,
        }
    return out


def pick(result: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """``(recommended, losing_preset)``: the winning regime with the largest median speedup
    over wait-for-all, and the regime where coding loses most to wait-for-all."""
    regimes = result["regimes"]
    winners = [k for k, v in regimes.items() if v["wins"]]
    speed = {k: v["median_speedup_vs_wait"] or 0.0 for k, v in regimes.items()}
    recommended = max(winners, key=speed.get) if winners else None
    losers = [k for k, v in regimes.items() if not v["wins"]]
    losing = min(losers, key=speed.get) if losers else None
    return recommended, losing


def main(argv: list[str] | None = None) -> int:
    from server.launch import NUM_SUPERNODES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--regimes", nargs="+", default=list(REGIMES), choices=list(REGIMES))
    parser.add_argument("--clients", type=int, default=NUM_SUPERNODES)
    parser.add_argument("--rounds", type=int, default=None,
                        help="every regime's num-rounds (default: the run config's, 30)")
    parser.add_argument("--out", default=str(ROOT / "results" / "first_hour"))
    args = parser.parse_args(argv)
    import logging

    from flwr.common.logger import FLOWER_LOGGER

    FLOWER_LOGGER.setLevel(logging.WARNING)
    from experiments.common import save

    t0 = time.perf_counter()
    result = explore({k: REGIMES[k] for k in args.regimes}, args.seeds, n=args.clients,
                     rounds=args.rounds)
    result["recommended"], result["losing_preset"] = pick(result)
    result["runtime_s"] = time.perf_counter() - t0
    save(result, args.out)
    print(f"recommended: {result['recommended']}; losing preset: {result['losing_preset']}; "
          f"{result['runtime_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
