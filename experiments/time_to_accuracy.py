"""Experiment 4: time to accuracy on non-IID data: uncoded, ignore-stragglers, exact, approximate.

A setting of the one benchmark harness (:mod:`experiments.rival_runs`: the main job's
ServerApp builders and ClientApp over an in-process Grid, cohorts drawn from the seed; coded
runs through ``start_coded``, the rival through ``start_rival``) in virtual time: softmax
regression on the embedded digits, ``gradient`` updates, ``lr = 1``, a modelled compute cost
of ``partition-cost-s`` per partition (a coded client computing ``s+1`` partitions pays
``s+1`` times), latency from a Pareto model, a bimodal straggler model (per round or
persistent) or replay of the AWS Lambda traces.

Schemes (same seeds, same partitions):

* ``uncoded``: synchronous, waits for all ``n``;
* ``ignore-stragglers``: the fastest ``n - s`` uncoded replies, rescaled (approximate, biased
  on non-IID partitions);
* ``drop-stragglers``: what Flower users do today: Flower's own FedAvg with a round deadline
  (``rival_runs.start_rival("deadline", ...)``: the public ``DeadlineFedAvg``, not our
  wrapper) averaging the replies in by the deadline and dropping the rest; the deadline is 3
  times the 75th percentile of an uncoded client's time (``common.rival_deadline``: slack
  over the fast clients, as in the main job). Not run with DP (plain FedAvg applies none);
* ``exact``: ``grouped-rs`` tolerating ``s`` (FRC when ``(s+1) | n``): the uncoded iterate at
  each round, as soon as the replies decode;
* ``approx-deadline``: the expander code (load ``s+1``), least-squares decoding at a deadline
  (the 75th percentile of a coded client's time), exact when the replies happen to decode;
* ``auto``: ``s="auto"`` with ``s-max = s``: data placed once, the tolerance in ``0..s``
  chosen every round from the observed (censored) latencies; busy clients get work queued
  behind their current job when they are expected to finish it in time (``busy="queue"``);
* ``auto-exclude``: ``auto`` with heterogeneity-aware assignment (``exclude-slow = 4``):
  clients estimated at least 4 times slower may be sent nothing for a round, their
  partitions shared by the rest of their super-block, when that is predicted faster;
* ``nested s=v``: the fixed tolerance ``v`` on the same nested placement (the code ``auto``
  would use at ``s = v``), a busy client queued when its current job ends within the last
  round's duration, read from the virtual clock (a simulator's knowledge): with ``uncoded``
  (``s = 0``) and ``exact`` (``s = s-max``) the fixed choices ``auto`` is compared with in
  hindsight (``v`` in ``{1, 2, s/4, s/2}``);
* ``nested-fit s=v``: the same fixed codes with busy clients queued by ``auto``'s rule from
  the server's knowledge (``busy="fit"``: the estimator and the work not yet returned), so
  that the comparison isolates the choice of ``s`` (``vs_best_fixed_same_information``);
* ``oracle s=v``: a hindsight reference, not a policy: ``auto``'s machinery with its choice
  replaced by ``v`` once it has an observation. Round 1 runs at ``s_max``, as the adaptive
  rule must with nothing observed, then the fixed ``v``: what an online policy that guessed
  the best constant ``v`` right after its first round would take (not a lower bound: a policy
  that changes ``s`` can beat it). Over ``nested-fit s=v`` it prices the round at ``s_max``
  (``oracle_start_cost``); ``auto / oracle`` prices auto's choices. ``oracle s=s_max`` keeps
  ``s_max`` in every round: the same runs as ``nested-fit s=s_max``, a fixed rival with the
  same information.
* ``auto-warm`` (run on request: ``--schemes auto-warm``): ``auto`` warm-started from the
  latency observations (run-config ``latency-state``) of an earlier ``auto`` run on the same
  federation with another seed (``seed + 1000``: other latency draws, the same persistently
  slow clients through ``latency-seed``), so that round 1 is chosen from them instead of at
  ``s_max``: what a federation that trains many models pays after its first. (The trace
  replays the same rows whatever the seed: a file from it would foretell the run, so it is
  not run there; nor with DP, whose runs never reach the target.)
* ``auto-deadline`` (run on request: ``--schemes auto-deadline``): ``auto`` with
  ``auto-deadline = 3``: each round's deadline is 3 times its predicted time and work stops
  there (a round not decoded by then decodes approximately or is skipped).
* ``deadline-fit s=v`` (run on request: ``--schemes deadline-fit``): the fixed rivals of
  ``auto-deadline`` with its deadline rule (``nested-fit s=v`` with ``auto-deadline = 3``: the
  deadline is 3 times the fixed code's own predicted round time, work stops there), for every
  ``v`` in ``{0, 1, 2, s/4, s/2, s}`` (``vs_best_fixed_with_deadline``).
* ``approx-deadline-stop`` (run on request: ``--schemes approx-deadline-stop``):
  ``approx-deadline`` with ``stop-late-work``: a client still computing at the deadline stops
  there (its reply could no longer be used) instead of finishing, so its next round's work is
  not queued behind stale work.

A ``drift`` setting switches the latency regime at round 15 (Pareto delays, then load-scaled
bimodal straggling), ``drift-early`` at round 4 (every exact scheme reaches 90% at round 7 or
15, so only there does the time to target span both regimes; the time to the final model
spans both in either); a ``persistent`` setting is the bimodal model with its slow clients fixed
(each client is slow with probability 0.1, drawn once from the run seed, and then 20 times
slower in every round: heterogeneous hardware; 0, 2 and 3 of 12 clients on seeds 0-2, 7, 11
and 9 of 100).

``n = 12`` (the scale of Tandon et al.'s EC2 runs, Dirichlet(0.5) partitions) with and without
partition-level DP; ``n = 100`` and ``n = 256`` (pathological 2-class partitions) without DP.
Reported per configuration over seeds: virtual time to the target accuracy and final accuracy
(mean and std), and the largest per-round accuracy gap to the uncoded run of the same seed.

Run: ``python -m experiments.time_to_accuracy [--quick] [--out results/time_to_accuracy]``;
``--only "n=256 s=32 bimodal" --schemes auto,uncoded`` runs a part and merges it into the
existing JSON (a configuration's scheme is replaced with all its seeds), then rebuilds the table
and the figure from everything in the file.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import time
from pathlib import Path
from typing import Any

from experiments.common import (
    progress,
    quantile_deadline,
    quiet_flower,
    rival_deadline,
    save,
    save_figure,
)
from experiments.tta_table import (
    ADAPTIVE,
    EXACT_FIXED,
    build_table,
    goals,
    nested_key,
    ratio_ci,
    summarize,
    worst_case,
)

#: the tables' functions (:mod:`experiments.tta_table`) are this module's too
__all__ = ["ADAPTIVE", "BASE", "LATENCIES", "SCHEMES", "build_table", "deadline", "goals",
           "main", "one_run", "ratio_ci", "rival_run", "scheme_config", "summarize",
           "worst_case"]

SCHEMES = {
    "uncoded": {"code": "uncoded"},
    "ignore-stragglers": {"code": "ignore-stragglers"},
    "exact": {"code": "grouped-rs"},
    "approx-deadline": {"code": "expander", "min-replies": 0},
    "auto": {"s": "auto"},  # s chosen every round in 0..s (s-max), nested placement
    # auto, and clients estimated 4x slower or more may compute nothing (the others of their
    # super-block share their partitions) when that is predicted faster
    "auto-exclude": {"s": "auto", "exclude-slow": 4.0},
    # Flower's FedAvg with a round deadline, dropping later replies (see one_run)
    "drop-stragglers": {"rival": "drop-stragglers"},
}
#: schemes that are Flower's own strategy, not the wrapper (no DP, no code, no s)
RIVAL_SCHEMES = ("drop-stragglers",)
# run only when --schemes names them
ON_REQUEST = ("auto-warm", "approx-deadline-stop", "auto-deadline")
WARM_SEED_OFFSET = 1000  # auto-warm: the earlier run's seed is the seed plus this
DEADLINE_FACTOR = 3.0  # auto-deadline, deadline-fit s=v: the deadline over the prediction


def nested_values(s_max: int) -> list[int]:
    """The intermediate fixed tolerances run on the nested placement of ``s_max``."""
    return sorted({v for v in (1, 2, s_max // 4, s_max // 2) if 0 < v < s_max})


def scheme_config(scheme: str) -> dict:
    if scheme.startswith("oracle s="):
        return {"s": "auto"}  # auto's machinery, its choice replaced (see _policy)
    if scheme.startswith("nested s="):
        return {"code": "nested", "s": int(scheme.removeprefix("nested s=")), "busy": "queue"}
    if scheme.startswith("nested-fit s="):
        return {"code": "nested", "s": int(scheme.removeprefix("nested-fit s=")), "busy": "fit"}
    if scheme.startswith("deadline-fit s="):
        return {"code": "nested", "s": int(scheme.removeprefix("deadline-fit s=")),
                "busy": "fit", "auto-deadline": DEADLINE_FACTOR}
    if scheme == "auto-warm":
        return {"s": "auto"}  # and latency-state: an earlier run's file (see one_run)
    if scheme == "auto-deadline":
        return {"s": "auto", "auto-deadline": DEADLINE_FACTOR}
    if scheme == "approx-deadline-stop":
        return {**SCHEMES["approx-deadline"], "stop-late-work": True}
    return SCHEMES[scheme]


def schemes_for(s_max: int) -> list[str]:
    return [*SCHEMES, *(f"nested s={v}" for v in nested_values(s_max)),
            *(f"nested-fit s={v}" for v in nested_values(s_max))]


def oracle_schemes(s_max: int) -> list[str]:
    """The hindsight references (run on request: ``--schemes oracle``): every fixed choice
    after the round at ``s_max``."""
    return [f"oracle s={v}" for v in (0, *nested_values(s_max), s_max)]


def deadline_schemes(s_max: int) -> list[str]:
    """The fixed rivals of ``auto-deadline`` (run on request: ``--schemes deadline-fit``):
    every fixed choice, ``s = 0`` and ``s_max`` included, with the same deadline rule."""
    return [f"deadline-fit s={v}" for v in (0, *nested_values(s_max), s_max)]


_nested_key = nested_key  # (the legend order of the fixed codes; tta_table's)


def _policy(scheme: str) -> Any:
    """For ``oracle s=v``: ``s="auto"`` deciding among ``[v]`` once its estimator has data
    (:class:`policies.HindsightCodePolicy`). Any other scheme: the strategy's own policy."""
    if not scheme.startswith("oracle s="):
        return None
    from experiments.policies import HindsightCodePolicy

    return functools.partial(HindsightCodePolicy, v=int(scheme.removeprefix("oracle s=")))


LATENCIES = {
    "pareto": {"latency": "pareto", "latency-scale": 0.5, "latency-shape": 1.5},
    "bimodal": {"latency": "bimodal", "latency-scale": 0.1, "latency-rate": 10.0,
                "latency-p": 0.1, "latency-slowdown": 20.0},
    "trace": {"latency": "trace", "latency-trace": "canada"},
    # the bimodal model with the slow clients fixed (heterogeneous hardware): each client is
    # slow with probability 0.1, drawn once from the run seed, then 20x slower in every round
    "persistent": {"latency": "persistent", "latency-scale": 0.1, "latency-rate": 10.0,
                   "latency-p": 0.1, "latency-slowdown": 20.0},
    # regime change at round 15: Pareto(0.5, 1.5) delays, then load-scaled bimodal straggling
    "drift": {"latency": "drift", "latency-scale": 0.5, "latency-shape": 1.5,
              "latency-rate": 10.0, "latency-p": 0.1, "latency-slowdown": 20.0,
              "latency-drift-round": 15},
    # the same switch at round 4: every exact scheme reaches 90% at round 7 or 15 here, so
    # with the switch at round 15 the time to target measures the Pareto regime alone
    "drift-early": {"latency": "drift", "latency-scale": 0.5, "latency-shape": 1.5,
                    "latency-rate": 10.0, "latency-p": 0.1, "latency-slowdown": 20.0,
                    "latency-drift-round": 4},
}
# the nonce is pinned so that every scheme of one seed adds the same noise while their models
# agree (the keyed noise is bound to the received model: schemes whose models part draw
# independent noise from then on)
DP = {"noise-multiplier": 0.3, "clip-norm": 1.0, "dp": "partition", "dp-run-nonce": "tta"}
BASE = {"dataset": "digits", "model": "logreg", "update": "gradient", "lr": 1.0,
        "virtual-compute": "none", "partition-cost-s": 0.1, "max-decode-error": 0.5}


def deadline(latency: dict, load: int, seed: int) -> float:
    """75th percentile of one client's time at ``load`` partitions under the latency model."""
    return quantile_deadline(latency, load, seed, BASE["partition-cost-s"])


def one_run(n, s, scheme, latency, dp, seed, rounds, partitioner, latency_state=None,
            latency_seed=None):
    from experiments.rival_runs import start_coded

    if scheme in RIVAL_SCHEMES:
        return rival_run(n, scheme, latency, dp, seed, rounds, partitioner)

    cfg = {**BASE, "s": 0 if scheme == "uncoded" else s, **scheme_config(scheme),
           **LATENCIES[latency], "seed": seed, "num-rounds": rounds, "s-max": s,
           "partitioner": partitioner, "results-dir": ""}
    cfg["straggler-timeout"] = (
        deadline(LATENCIES[latency], s + 1, seed) if scheme.startswith("approx-deadline")
        else 1e6
    )
    if dp:
        cfg.update(DP)
    if scheme == "auto-warm":  # an earlier auto run on the same federation leaves the file
        cfg["latency-state"] = f"/tmp/fl-gradcode-tta/{os.getpid()}/latency-{seed}.json"
        Path(cfg["latency-state"]).unlink(missing_ok=True)
        one_run(n, s, "auto", latency, dp, seed + WARM_SEED_OFFSET, rounds, partitioner,
                latency_state=cfg["latency-state"], latency_seed=seed)
    elif latency_state is not None:
        cfg["latency-state"] = latency_state
    if latency_seed is not None:  # the federation's slow clients of another seed
        cfg["latency-seed"] = latency_seed
    key_file = None
    if dp:  # the clients' key (a client-side secret), fixed per seed so runs are comparable
        key_file = Path(f"/tmp/fl-gradcode-tta/keys-{os.getpid()}-{seed}.json")
        key_file.parent.mkdir(parents=True, exist_ok=True)
        key_file.write_text(json.dumps({"master": seed.to_bytes(32, "little").hex()}))
        key_file = str(key_file)
    strategy = start_coded(cfg, n, key_file=key_file, code_policy=_policy(scheme),
                           share_updates=True).strategy
    h = strategy.history
    return {
        "virtual_s": [r["virtual_s"] for r in h],
        "accuracy": [r["accuracy"] for r in h],
        "decode": [r["decode"] for r in h],
        "epsilon": h[-1]["epsilon"],
        "s": [r["s"] for r in h],
        "busy_mode": strategy.busy_mode,
        **({"excluded": [len(r["excluded"]) for r in h]} if "exclude-slow" in cfg else {}),
    }


#: a rival's round outcome -> the wrapper's word for it: every reply averaged is the exact
#: FedAvg average of the round
RIVAL_DECODE = {"all": "exact", "partial": "approximate", "skipped": "skipped"}


def rival_run(n, scheme, latency, dp, seed, rounds, partitioner) -> dict:
    """One run of a rival scheme (:data:`RIVAL_SCHEMES`): Flower's FedAvg dropping the replies
    later than 3 times the 75th percentile of an uncoded client's time
    (``common.rival_deadline``), on the same seed, data,
    partitions and latency draws as the coded runs."""
    from experiments.rival_runs import start_rival

    if dp:
        raise ValueError(f"scheme {scheme!r} is plain Flower FedAvg: it applies no DP")
    cfg = {**BASE, **LATENCIES[latency], "seed": seed, "num-rounds": rounds,
           "partitioner": partitioner, "results-dir": ""}
    strategy = start_rival("deadline", cfg, n, deadline=rival_deadline(
        LATENCIES[latency], seed, BASE["partition-cost-s"])).strategy
    h = strategy.history
    return {
        "virtual_s": [r["virtual_s"] for r in h],
        "accuracy": [r["accuracy"] for r in h],
        "decode": [RIVAL_DECODE[r["decode"]] for r in h],
        "epsilon": None,
        "s": [0 for _ in h],
        "busy_mode": "skip",
        "late_dropped": [r["late_dropped"] for r in h],
        "deadline_s": float(strategy.deadline),
    }


def setups_for(quick: bool) -> list[tuple]:
    setups = [(12, 3, "dirichlet", lat, dp) for lat in ("pareto", "bimodal", "trace")
              for dp in (False, True)]
    if quick:
        return setups[:2]
    setups += [(n, n // 8, "pathological", lat, False)
               for n in (100, 256) for lat in ("bimodal", "trace")]
    setups += [(12, 3, "dirichlet", "drift", False), (100, 12, "pathological", "drift", False)]
    setups += [(12, 3, "dirichlet", "persistent", False),
               (100, 12, "pathological", "persistent", False)]
    setups += [(12, 3, "dirichlet", "drift-early", False),
               (100, 12, "pathological", "drift-early", False)]
    return setups


def setup_key(n: int, s: int, lat: str, dp: bool) -> str:
    return f"n={n} s={s} {lat}{' +DP' if dp else ''}"



def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default="results/time_to_accuracy")
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--only", action="append", default=None, metavar="SETUP",
                        help='run only this configuration (e.g. "n=256 s=32 bimodal"; '
                             "repeatable) and merge into the existing JSON")
    parser.add_argument("--schemes", default=None,
                        help="comma-separated schemes to run (e.g. auto,uncoded,nested s=1); "
                             "'nested' = every nested s=v, 'nested-fit' every nested-fit "
                             "s=v; merged into the existing JSON")
    parser.add_argument("--seeds", type=int, default=None,
                        help="seeds 0..N-1 (default 3; 1 with --quick); use another --out for "
                             "other seed counts (a file holds one seed list)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="runs in parallel processes (each run is one process's work)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds per run (default 30; 8 with --quick); use another --out "
                             "for other round counts")
    args = parser.parse_args(argv)
    if args.seeds is not None and args.seeds < 1:
        parser.error(f"--seeds {args.seeds}: expected >= 1")
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: expected >= 1")
    if args.rounds is not None and args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: expected >= 1")
    quiet_flower()
    seeds = list(range(args.seeds if args.seeds is not None else 1 if args.quick else 3))
    rounds = args.rounds if args.rounds is not None else 8 if args.quick else 30
    setups = setups_for(args.quick)
    if args.only:
        known = {setup_key(n, s, lat, dp) for n, s, _, lat, dp in setups}
        unknown = set(args.only) - known
        if unknown:
            parser.error(f"unknown --only {sorted(unknown)}; known: {sorted(known)}")
        setups = [x for x in setups if setup_key(x[0], x[1], x[3], x[4]) in args.only]
    wanted = None if args.schemes is None else [x.strip() for x in args.schemes.split(",")]

    def chosen(s_max: int) -> list[str]:
        names = schemes_for(s_max)
        if wanted is None:
            return names
        return [x for x in [*names, *oracle_schemes(s_max), *deadline_schemes(s_max),
                            *ON_REQUEST] if x in wanted
                or ("nested" in wanted and x.startswith("nested s="))
                or ("nested-fit" in wanted and x.startswith("nested-fit s="))
                or ("oracle" in wanted and x.startswith("oracle s="))
                or ("deadline-fit" in wanted and x.startswith("deadline-fit s="))]

    def warm_ok(setup: tuple) -> bool:  # a trace replays the same rows whatever the seed
        return setup[3] != "trace" and not setup[4]

    jobs = [(setup, scheme, seed) for setup in setups for scheme in chosen(setup[1])
            if (scheme != "auto-warm" or warm_ok(setup))
            and (scheme not in RIVAL_SCHEMES or not setup[4]) for seed in seeds]
    out_json = Path(args.out).with_suffix(".json")
    partial = args.only is not None or wanted is not None
    runs: dict = {}
    partial_runs: list | None = None
    if partial:  # say what this run merges, after what earlier partial runs merged
        old = json.loads(out_json.read_text()) if out_json.is_file() else {}
        if (old.get("quick") == args.quick and old.get("seeds") == seeds
                and old.get("rounds", rounds) == rounds):
            runs = old.get("runs", {})
        partial_runs = [*old.get("partial_runs", []), {
            "setups": sorted({setup_key(n, s, lat, dp) for (n, s, _, lat, dp), _, _ in jobs}),
            "schemes": sorted({scheme for _, scheme, _ in jobs}),
            "date": time.strftime("%Y-%m-%d")}]
    t0 = time.perf_counter()
    fresh: dict = {}
    for ((n, s, _, lat, dp), scheme, seed), result in _results(jobs, rounds, args.jobs):
        key = setup_key(n, s, lat, dp)
        fresh.setdefault(key, {}).setdefault(scheme, {})[seed] = result
        if len(fresh[key][scheme]) == len(seeds):  # complete: merge (and keep on disk)
            fresh[key][scheme] = [fresh[key][scheme][x] for x in seeds]
            runs.setdefault(key, {})[scheme] = fresh[key][scheme]
            if partial:
                _write(runs, args, seeds, rounds, figure=False, partial_runs=partial_runs)
            print(f"{key:<24}{scheme:<19}done ({time.perf_counter() - t0:.0f} s)", flush=True)
    order = [setup_key(n, s, lat, dp) for n, s, _, lat, dp in setups_for(args.quick)]
    runs = {k: runs[k] for k in [*order, *(k for k in runs if k not in order)] if k in runs}
    table = build_table(runs, args.target)
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
                  f"{r.get('max_accuracy_gap_to_uncoded', float('nan')):>8.3f}")
        for name in ADAPTIVE:
            auto = rows.get(name, {})
            if "vs_best_fixed" in auto:
                print(f"{key:<24}{name} / best fixed ({auto['best_fixed']}): "
                      f"{auto['vs_best_fixed']:.2f}")
            if "vs_best_fixed_same_information" in auto:
                print(f"{key:<24}{name} / best fixed, same information "
                      f"({auto['best_fixed_same_information']}): "
                      f"{auto['vs_best_fixed_same_information']:.2f}")
        for name in ADAPTIVE:
            auto = rows.get(name, {})
            if "vs_best_fixed_final" in auto:
                print(f"{key:<24}{name} / best fixed, time to the final model "
                      f"({auto['best_fixed_final']}): {auto['vs_best_fixed_final']:.2f}")
        if "vs_oracle" in rows.get("auto", {}):
            auto = rows["auto"]
            print(f"{key:<24}auto / hindsight oracle ({auto['oracle']}): "
                  f"{auto['vs_oracle']:.2f}; its start cost: "
                  f"{auto.get('oracle_start_cost', float('nan')):.2f}")
    return _write(runs, args, seeds, rounds, figure=True, table=table,
                  partial_runs=partial_runs)


def _job(job: tuple, rounds: int) -> dict:
    (n, s, part, lat, dp), scheme, seed = job
    quiet_flower()
    return one_run(n, s, scheme, lat, dp, seed, rounds, part)


def _results(jobs: list, rounds: int, workers: int):
    """``(job, result)`` in job order (one process) or as they complete (``workers`` > 1)."""
    if workers == 1:
        for job in progress(jobs, "time to accuracy"):
            yield job, _job(job, rounds)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    # spawn: a fresh interpreter per worker (no forked Flower/Ray state)
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(_job, job, rounds): job for job in jobs}
        for future in progress(as_completed(futures), "time to accuracy", total=len(jobs)):
            yield futures[future], future.result()


def _write(runs, args, seeds, rounds, figure: bool, table: dict | None = None,
           partial_runs: list | None = None) -> dict:
    table = build_table(runs, args.target) if table is None else table
    nested = {key: sorted({s for s in by if s.startswith(("nested s=", "nested-fit s="))},
                          key=_nested_key) for key, by in runs.items()}
    result = {"target": args.target, "seeds": seeds, "rounds": rounds, "dp": DP, "base": BASE,
              "latencies": LATENCIES, "table": table, "runs": runs, "quick": args.quick,
              "fixed_schemes": {key: [*EXACT_FIXED, *v] for key, v in nested.items()},
              "busy": {"auto": "queue (fit)", "auto-exclude": "queue (fit)",
                       "auto-warm": "queue (fit)",
                       "approx-deadline-stop": "skip; work stopped at the deadline",
                       "auto-deadline": "queue (fit); work stopped at 3x the predicted time",
                       "nested s=v": "queue (virtual clock)",
                       "nested-fit s=v": "fit (server's knowledge, as auto)",
                       "deadline-fit s=v": "fit; work stopped at 3x the predicted time",
                       "others": "skip"}}
    result["goals"] = goals(table)
    result["worst_case"] = worst_case(table, len(seeds))
    if partial_runs is not None:
        result["partial_runs"] = partial_runs
    from experiments.tta_plots import plot, plot_adaptive

    save(result, args.out, plot(runs, args.target) if figure else None)
    if figure and result["goals"]:
        print(f"wrote {save_figure(plot_adaptive(table), f'{args.out}_adaptive.png')}")
    return result


if __name__ == "__main__":
    main()
