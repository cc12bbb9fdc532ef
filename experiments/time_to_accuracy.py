"""Experiment 4: time to accuracy on non-IID data: uncoded, ignore-stragglers, exact, approximate.

The real strategy and client code (``server.app.run_in_process``: the ServerApp's setup, the
ClientApp's computation, an in-process Grid) in virtual time: softmax regression on the embedded
digits, ``gradient`` updates, ``lr = 1``, a modelled compute cost of ``partition-cost-s`` per
partition (a coded client computing ``s+1`` partitions pays ``s+1`` times), latency from a
Pareto model, a bimodal straggler model (per round or persistent) or replay of the AWS Lambda
traces.

Schemes (same seeds, same partitions):

* ``uncoded``: synchronous, waits for all ``n``;
* ``ignore-stragglers``: the fastest ``n - s`` uncoded replies, rescaled (approximate, biased
  on non-IID partitions);
* ``drop-stragglers``: what Flower users do today: Flower's own FedAvg with a round deadline
  (``server.app.run_rival_in_process``, not our wrapper) averaging the replies in by the
  deadline and dropping the rest; the deadline is 3 times the 75th percentile of an uncoded
  client's time (``common.rival_deadline``: slack over the fast clients, as in the main job).
  Not run with DP (plain FedAvg applies none);
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
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from experiments.common import (
    progress,
    pyplot,
    quantile_deadline,
    quiet_flower,
    rival_deadline,
    save,
    save_figure,
)

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
ADAPTIVE = ("auto", "auto-exclude", "auto-warm", "auto-deadline")
# run only when --schemes names them
ON_REQUEST = ("auto-warm", "approx-deadline-stop", "auto-deadline")
WARM_SEED_OFFSET = 1000  # auto-warm: the earlier run's seed is the seed plus this
DEADLINE_FACTOR = 3.0  # auto-deadline, deadline-fit s=v: the deadline over the prediction
# with the nested s=v schemes (busy clients queued from the simulator's clock): auto's
# hindsight rivals; with the nested-fit s=v schemes (queued from the server's knowledge, as
# auto): the rivals that know what auto knows
EXACT_FIXED = ("uncoded", "exact")


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


def _nested_key(scheme: str) -> tuple[int, int]:
    """``(v, 0)`` for ``nested s=v``, ``(v, 1)`` for ``nested-fit s=v``, ``(v, 2)`` for
    ``oracle s=v``, ``(v, 3)`` for ``deadline-fit s=v`` (legend order)."""
    kinds = ("nested s=", "nested-fit s=", "oracle s=", "deadline-fit s=")
    kind = next(i for i, prefix in enumerate(kinds) if scheme.startswith(prefix))
    return int(scheme.split("=")[-1]), kind


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
    from server.app import run_in_process

    if scheme in RIVAL_SCHEMES:
        return rival_run(n, scheme, latency, dp, seed, rounds, partitioner)

    cfg = {**BASE, "s": 0 if scheme == "uncoded" else s, **scheme_config(scheme),
           **LATENCIES[latency], "seed": seed, "num-rounds": rounds, "s-max": s,
           "partitioner": partitioner,
           # one directory per process: concurrent partial runs must not share a model file
           "results-dir": f"/tmp/fl-gradcode-tta/{os.getpid()}/{scheme.replace(' ', '-')}"}
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
    strategy, _ = run_in_process(cfg, n, key_file=key_file, code_policy=_policy(scheme))
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
    from server.app import run_rival_in_process

    if dp:
        raise ValueError(f"scheme {scheme!r} is plain Flower FedAvg: it applies no DP")
    cfg = {**BASE, **LATENCIES[latency], "seed": seed, "num-rounds": rounds,
           "partitioner": partitioner, "rival": scheme,
           "straggler-timeout": rival_deadline(LATENCIES[latency], seed,
                                               BASE["partition-cost-s"]),
           "results-dir": f"/tmp/fl-gradcode-tta/{os.getpid()}/{scheme}"}
    strategy, _ = run_rival_in_process(cfg, n)
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


def _times_to_target(rs: list, target: float | None) -> np.ndarray:
    """Per run, the virtual time of the first round at or above ``target`` (``nan``: never).

    ``target=None``: the time to the final model, i.e. of the last round, for runs whose
    every round decoded exactly (``nan`` otherwise). Every such run of one seed computes the
    same sequence of models, so this compares the time to the same final model, over all
    rounds: both regimes of a drift setting (a target reached before the switch measures only
    the first regime)."""
    if target is None:
        return np.array([r["virtual_s"][-1] if all(d == "exact" for d in r["decode"])
                         else np.nan for r in rs], dtype=float)
    return np.array([next((t for t, a in zip(r["virtual_s"], r["accuracy"], strict=True)
                           if a >= target), np.nan) for r in rs], dtype=float)


def summarize(runs, target):
    tta = _times_to_target(runs, target)
    final = [r["accuracy"][-1] for r in runs]
    return {
        "time_to_target_mean": float(np.nanmean(tta)) if np.isfinite(tta).any() else None,
        "time_to_target_std": float(np.nanstd(tta)) if np.isfinite(tta).any() else None,
        "reached": int(np.isfinite(tta).sum()),
        "final_accuracy_mean": float(np.mean(final)),
        "final_accuracy_std": float(np.std(final)),
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


def ratio_ci(auto: list, fixed: list, target: float | None,
              draws: int = 4000) -> tuple[float, float]:
    """95% paired bootstrap interval (percentile) of ``mean(auto) / mean(fixed)`` over the
    seeds where both reached the target: seeds resampled with replacement, the same seeds for
    both (runs of one seed share data, partitions and latency draws); ``nan`` with fewer than
    two such seeds. Seeded: the same runs give the same interval."""
    a, f = _times_to_target(auto, target), _times_to_target(fixed, target)
    if len(a) != len(f):
        return (math.nan, math.nan)
    both = np.isfinite(a) & np.isfinite(f)
    a, f = a[both], f[both]
    if len(a) < 2:
        return (math.nan, math.nan)
    idx = np.random.default_rng(0).integers(0, len(a), size=(draws, len(a)))
    ratio = a[idx].mean(axis=1) / f[idx].mean(axis=1)
    return float(np.quantile(ratio, 0.025)), float(np.quantile(ratio, 0.975))


def build_table(runs: dict, target: float) -> dict:
    """Per configuration and scheme: time to target, final accuracy, gap to uncoded; for
    ``auto`` also its time over the best exact fixed choice (``vs_best_fixed``)."""
    table = {}
    for key, by_scheme in runs.items():
        ref = by_scheme.get("uncoded")
        table[key] = {}
        for scheme, rs in by_scheme.items():
            row = summarize(rs, target)
            if ref is not None and len(ref) == len(rs):
                row["max_accuracy_gap_to_uncoded"] = float(max(
                    np.max(np.abs(np.array(r["accuracy"]) - np.array(u["accuracy"])))
                    for r, u in zip(rs, ref, strict=True)))
            row["exact_rounds"] = float(np.mean([r["decode"].count("exact") for r in rs]))
            row["epsilon"] = rs[0]["epsilon"]
            unc = summarize(ref, target)["time_to_target_mean"] if ref else None
            if row["time_to_target_mean"] and unc:
                row["speedup_vs_uncoded"] = unc / row["time_to_target_mean"]
            table[key][scheme] = row
        for name in ADAPTIVE:
            _compare_with_fixed(table[key], runs[key], name, target)
            _compare_with_fixed(table[key], runs[key], name, None)
        _compare_with_oracle(table[key], runs[key], target)
        _compare_with_oracle(table[key], runs[key], None)
    return table


def _mean_on_seeds(rs: list, target: float | None, seeds: np.ndarray) -> float | None:
    """Mean time to target of ``rs`` over ``seeds`` (auto's), or ``None`` if it did not reach
    the target on each of them."""
    f = _times_to_target(rs, target)
    if len(f) != len(seeds) or not np.isfinite(f[seeds]).all():
        return None
    return float(np.mean(f[seeds]))


def _same_information(scheme: str, rs: list) -> bool:
    """A fixed choice whose busy clients are queued by auto's rule from the server's
    knowledge: ``nested-fit s=v``, or an ``oracle s=v`` run that kept one ``s`` in every round
    (``v = s_max``: the same runs as ``nested-fit s=s_max``, checked run for run)."""
    if scheme.startswith("nested-fit s="):
        return True
    return scheme.startswith("oracle s=") and len({s for r in rs for s in r["s"]}) == 1


def _compare_with_oracle(table: dict, runs: dict, target: float | None) -> None:
    """``auto`` against the best ``oracle s=v`` (the best constant ``v`` after the mandated
    round at ``s_max``; not a lower bound: a policy that changes ``s`` can beat it), on the
    seeds where auto reached the target, in place: ``vs_oracle`` (what auto's choices cost
    against it), ``oracle_start_cost`` (its time over the same ``v`` fixed from round 1 with
    the same information, ``nested-fit s=v``: what the round at ``s_max`` costs) and
    ``oracle_vs_best_fixed``; ``target=None``: to the final model (keys end in ``_final``)."""
    auto = table.get("auto")
    if auto is None or (target is not None and not auto["time_to_target_mean"]):
        return
    a = _times_to_target(runs["auto"], target)
    seeds = np.isfinite(a)
    if not seeds.any():
        return
    final = "_final" if target is None else ""
    bounds = {}
    for k in runs:
        # forced to one v, a round can lack a decodable set (e.g. v = 0 with a client skipped
        # as too busy): such a run computes other models and is no reference
        if k.startswith("oracle s=") and all(d == "exact" for r in runs[k] for d in r["decode"]):
            mean = _mean_on_seeds(runs[k], target, seeds)
            if mean is not None:
                bounds[k] = mean
    if not bounds:
        return
    best = min(bounds, key=bounds.get)
    auto[f"oracle{final}"] = best
    auto[f"oracle{final}_time"] = bounds[best]
    auto[f"oracle{final}_compared"] = sorted(bounds, key=_nested_key)
    auto[f"vs_oracle{final}"] = float(np.mean(a[seeds])) / bounds[best]
    auto[f"vs_oracle{final}_ci95"] = list(ratio_ci(runs["auto"], runs[best], target))
    if f"best_fixed{final}_time" in auto:
        auto[f"oracle_vs_best_fixed{final}"] = bounds[best] / auto[f"best_fixed{final}_time"]
    fixed_v = f"nested-fit s={best.removeprefix('oracle s=')}"
    if _same_information(best, runs[best]):  # v = s_max: no round differs from the fixed v
        auto[f"oracle_start_cost{final}"] = 1.0
    elif fixed_v in runs and (mean := _mean_on_seeds(runs[fixed_v], target, seeds)) is not None:
        auto[f"oracle_start_cost{final}"] = bounds[best] / mean


def _compare_with_fixed(table: dict, runs: dict, name: str, target: float | None) -> None:
    """An adaptive scheme's time over the best exact fixed choice in hindsight, in place;
    ``_with_deadline``: over the best ``deadline-fit s=v`` (fixed codes with the deadline rule
    of ``auto-deadline``), when they were run.

    ``target=None``: the time to the final model instead (keys end in ``_final``; see
    :func:`_times_to_target`: only runs whose every round was exact)."""
    auto = table.get(name)
    if auto is None or (target is not None and not auto["time_to_target_mean"]):
        return
    # on the seeds where auto reached the target; a fixed choice competes if it reached
    # it on each of them (exact schemes share the iterates: the same seeds reach it)
    a = _times_to_target(runs[name], target)
    seeds = np.isfinite(a)
    if not seeds.any():
        return
    final = "_final" if target is None else ""
    clock = {k for k in table if k.startswith("nested s=")}
    same = {k for k in table if _same_information(k, runs[k])}
    # fixed codes with auto-deadline's rule: rounds may be approximate or skipped, as its
    with_deadline = {k for k in table if k.startswith("deadline-fit s=")}
    reached = {}  # every fixed choice that reached the target on auto's seeds
    for k in table:
        if k in EXACT_FIXED or k in clock or k in same or k in with_deadline:
            mean = _mean_on_seeds(runs[k], target, seeds)
            if mean is not None:
                reached[k] = mean
    for kind, suffix, base in ((clock, "", EXACT_FIXED), (same, "_same_information", EXACT_FIXED),
                               (with_deadline, "_with_deadline", ())):
        fixed = {k: t for k, t in reached.items() if k in base or k in kind}
        if not any(k in kind for k in fixed) and suffix:
            continue  # no such fixed code in this setting
        if fixed:
            best = min(fixed, key=fixed.get)
            suffix += final
            auto[f"best_fixed{suffix}"] = best
            auto[f"best_fixed{suffix}_time"] = fixed[best]
            auto[f"vs_best_fixed{suffix}"] = float(np.mean(a[seeds])) / fixed[best]
            auto[f"fixed_compared{suffix}"] = sorted(fixed)
            auto[f"seeds_compared{final}"] = int(seeds.sum())
            low, high = ratio_ci(runs[name], runs[best], target)
            auto[f"vs_best_fixed{suffix}_ci95"] = [low, high]
    if final and reached:
        auto["time_to_final_model_mean"] = float(np.mean(a[seeds]))


# one colour per scheme in every figure (approx-deadline-stop shares approx-deadline's)
SCHEME_COLORS = dict(zip([*SCHEMES, *ON_REQUEST],
                         ["C0", "C1", "C2", "C3", "C4", "C5", "C8", "C6", "C3", "C9"],
                         strict=True))
GOAL_FACTOR = 1.05  # an adaptive scheme should take at most this over the best fixed choice
# the comparisons the goals are read from: (table key suffix, what the rivals are, the
# adaptive schemes it is a like-for-like comparison for)
GOAL_RIVALS = (("", "fixed codes queued from the virtual clock, uncoded, exact", ADAPTIVE),
               ("_same_information", "fixed codes with the adaptive scheme's information",
                ADAPTIVE),
               ("_with_deadline", "fixed codes with auto-deadline's deadline rule",
                ("auto-deadline",)))
GOALS_SPEEDUP = (("speedup_pareto", "n=12 s=3 pareto", 2.0),
                 ("speedup_n256_bimodal", "n=256 s=32 bimodal", 1.0))


def goals(table: dict, factor: float = GOAL_FACTOR) -> dict:
    """Each adaptive scheme against the goals of adaptive coding, read from ``table``:

    * ``within``: per rival kind (``GOAL_RIVALS``), the settings where its time to target is at
      most ``factor`` times the best fixed choice's (``vs_best_fixed*``; ``best_fixed``
      names it) and those where it is not (``missed``, with the ratio, ``None`` when the
      scheme did not reach the target on as many seeds as some other scheme of the setting:
      an unbounded ratio); settings where no scheme reached the target on any seed (the DP
      ones) or without that comparison are left out;
    * ``drift``: per ``drift`` / ``drift-early`` setting, its ratio to the best fixed choice
      to the target and to the final model, and whether each is strictly below 1 (``None``:
      not measured, e.g. no time to the final model for a run with rounds that were not
      exact);
    * ``speedup_pareto`` / ``speedup_n256_bimodal``: its speed-up over uncoded there, and
      ``speedup_met``: whether each is at least its goal (2 and 1);
    * ``exact``: the settings where every round was exact and matched the uncoded run
      (``equal``: largest accuracy gap 0), where every round was exact but the accuracy
      differs (``differ``: a broken exactness), and where some rounds were approximate or
      skipped by design (``approximate``: ``auto-deadline``'s missed deadlines).
    """
    out: dict = {}
    for name in ADAPTIVE:
        rows = {key: by[name] for key, by in table.items() if name in by}
        if not rows:
            continue
        result: dict = {"within": {}, "drift": {},
                        "exact": {"equal": [], "differ": [], "approximate": []}}
        for suffix, rivals, schemes in GOAL_RIVALS:
            if name not in schemes:
                continue
            ratios: dict = {}
            best: dict = {}
            for key, r in rows.items():
                ratio = r.get(f"vs_best_fixed{suffix}")
                if ratio is not None:
                    # compared on its seeds: a rival that also reached the target on others
                    # makes the ratio unbounded
                    most = max((table[key][k].get("reached", 0)
                                for k in r.get(f"fixed_compared{suffix}", ()) if k in table[key]),
                               default=0)
                    ratios[key] = ratio if r.get("reached", 0) >= most else math.inf
                    best[key] = r.get(f"best_fixed{suffix}")
                elif not suffix and (table[key].get("uncoded", {}).get("reached", 0)
                                     > r.get("reached", 0)):
                    ratios[key] = math.inf  # uncoded reached the target on a seed it did not
            if ratios:
                result["within"][suffix.lstrip("_") or "hindsight"] = {
                    "rivals": rivals,
                    "met": sorted(k for k, v in ratios.items() if v <= factor),
                    "missed": {k: (v if math.isfinite(v) else None)
                               for k, v in sorted(ratios.items()) if v > factor},
                    "best_fixed": dict(sorted(best.items()))}
        for key, r in rows.items():
            if key.endswith(("drift", "drift-early")):
                to_target, final = r.get("vs_best_fixed"), r.get("vs_best_fixed_final")
                result["drift"][key] = {
                    "to_target": to_target, "to_final_model": final,
                    "strictly_better_to_target": None if to_target is None else to_target < 1,
                    "strictly_better_to_final_model": None if final is None else final < 1}
            rounds = table[key].get("uncoded", {}).get("exact_rounds")
            gap = r.get("max_accuracy_gap_to_uncoded")
            if gap is None or rounds is None:
                continue
            if r.get("exact_rounds") != rounds:
                result["exact"]["approximate"].append(key)
            else:
                result["exact"]["equal" if gap == 0.0 else "differ"].append(key)
        result["speedup_met"] = {}
        for label, key, goal in GOALS_SPEEDUP:
            result[label] = rows.get(key, {}).get("speedup_vs_uncoded")
            if result[label] is not None:
                result["speedup_met"][label] = result[label] >= goal
        out[name] = result
    return out


def _relative_v(v: int, s_max: int) -> str:
    """A fixed tolerance named relative to ``s_max``, so that one name covers every scale."""
    for name, value in (("0", 0), ("s_max", s_max), ("1", 1), ("2", 2),
                        ("s_max/4", s_max // 4), ("s_max/2", s_max // 2)):
        if v == value:
            return name
    return str(v)


def worst_case(table: dict, seeds: int | None = None) -> dict:
    """What not knowing the regime costs: per group of rivals, every fixed choice (named
    relative to ``s_max``: ``s=0``, ``s=1``, ``s=2``, ``s=s_max/4``, ``s=s_max/2``, ``s=s_max``)
    and the adaptive scheme that has the same information, its time to target over the
    fastest of them all in each setting, and the worst of these ratios over the settings
    (``worst``, ``worst_setting``), over all settings (``all``) and per cohort size
    (``n=12``, ...). A choice that did not reach the target on every seed of a setting
    (``seeds``; ``None``: as many as the most of any member) is listed in ``never`` there (an
    unbounded ratio), not in ``worst``, so every ratio compares means over the same seeds;
    ``ran_in`` counts the settings it ran in (``s_max/4`` and ``s_max/2`` are not distinct
    choices at ``s_max = 3``). Groups:

    * ``same_information``: ``auto`` against uncoded (``s=0``), every ``nested-fit s=v``
      (busy clients queued by auto's rule) and, for ``s=s_max``, the faster of ``exact`` and
      ``oracle s=s_max`` (the fixed ``s_max`` queued like auto) where it ran;
    * ``with_deadline``: ``auto-deadline`` against every ``deadline-fit s=v``.

    Only settings where the adaptive scheme and at least two fixed choices ran count, and
    where some member reached the target (not the DP ones)."""
    groups = {"same_information": ("auto", "nested-fit s="),
              "with_deadline": ("auto-deadline", "deadline-fit s=")}
    out: dict = {}
    for group, (adaptive, prefix) in groups.items():
        ratios: dict = {}  # setting -> {member: ratio, inf if it did not reach the target}
        for key, by in table.items():
            if adaptive not in by:
                continue
            s_max = int(key.split(" s=")[1].split()[0])
            members = {f"s={_relative_v(int(k.removeprefix(prefix)), s_max)}": by[k]
                       for k in by if k.startswith(prefix)}
            if group == "same_information":
                if "uncoded" in by:
                    members["s=0"] = by["uncoded"]
                fixed_max = [by[k] for k in ("exact", f"oracle s={s_max}") if k in by]
                if fixed_max:
                    members["s=s_max"] = min(fixed_max, key=lambda r: (
                        -r["reached"], r["time_to_target_mean"] or math.inf))
            if len(members) < 2:
                continue
            members[adaptive] = by[adaptive]
            every = seeds if seeds is not None else max(r["reached"] for r in members.values())
            times = {m: (r["time_to_target_mean"] if r["reached"] >= every
                         and r["time_to_target_mean"] is not None else math.inf)
                     for m, r in members.items()}
            best = min(times.values())
            if math.isfinite(best):
                ratios[key] = {m: t / best for m, t in times.items()}
        scopes = {"all": list(ratios)}
        for key in ratios:
            scopes.setdefault(key.split()[0], []).append(key)
        for scope, keys in scopes.items():
            if not keys:
                continue
            names = sorted({m for k in keys for m in ratios[k]},
                           key=lambda m: (m == adaptive, m))
            finite = {m: {k: ratios[k][m] for k in keys
                          if m in ratios[k] and math.isfinite(ratios[k][m])} for m in names}
            out.setdefault(group, {})[scope] = {
                "settings": keys,
                "worst": {m: max(f.values()) if f else None for m, f in finite.items()},
                "worst_setting": {m: max(f, key=f.get) if f else None
                                  for m, f in finite.items()},
                "never": {m: [k for k in keys if m in ratios[k]
                              and not math.isfinite(ratios[k][m])] for m in names},
                "ran_in": {m: sum(m in ratios[k] for k in keys) for m in names}}
    return out


def plot_adaptive(table: dict, factor: float = GOAL_FACTOR):
    """The goals at a glance: per setting (without DP), the time to target of ``auto``,
    ``auto-warm`` and ``auto-deadline`` (``auto-exclude``, identical to ``auto`` in most
    settings, is left out) over the best fixed choice with the same information (left;
    ``auto-deadline``: with the same deadline rule where those rivals ran, hollow: against
    rivals without a deadline), with its 95% paired bootstrap interval (an ``x`` at the right
    edge: no ratio, it did not reach the target), and its speed-up over uncoded (right)."""
    plt = pyplot()
    from matplotlib import ticker

    keys = [k for k in table if not k.endswith("+DP")
            and any(name in table[k] for name in ADAPTIVE)]
    names = [x for x in ("auto", "auto-warm", "auto-deadline") if any(x in table[k] for k in keys)]
    colors = SCHEME_COLORS
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 0.42 * len(keys) + 1.8), sharey=True,
                                      gridspec_kw={"width_ratios": (3, 2)})
    offsets = dict(zip(names, (np.linspace(-0.25, 0.25, len(names)) if len(names) > 1
                               else [0.0]), strict=True))
    never = []  # (y, colour) of schemes without a ratio
    for name in names:
        for row, key in enumerate(keys):
            r = table[key].get(name)
            if r is None:
                continue
            y = row + offsets[name]
            suffix = "_same_information"
            if name == "auto-deadline" and r.get("vs_best_fixed_with_deadline") is not None:
                suffix = "_with_deadline"
            hollow = name == "auto-deadline" and suffix == "_same_information"
            ratio = r.get(f"vs_best_fixed{suffix}")
            if ratio is not None:
                ci = r.get(f"vs_best_fixed{suffix}_ci95") or [None, None]
                if None not in ci and all(np.isfinite(ci)):
                    left.plot(ci, [y, y], color=colors[name], lw=1.2)
                left.plot([ratio], [y], "o", color=colors[name], ms=5,
                          mfc="white" if hollow else colors[name])
            else:
                never.append((y, colors[name]))
            speed = r.get("speedup_vs_uncoded")
            if speed is not None:
                right.plot([speed], [y], "o", color=colors[name], ms=5)
    for name in names:  # legend entries
        left.plot([], [], "o-", color=colors[name], label=name)
    left.plot([], [], "o", color=colors["auto-deadline"], mfc="white",
              label="auto-deadline, rivals without a deadline")
    left.axvline(1.0, color="k", lw=0.8)
    left.axvline(factor, color="k", lw=0.8, ls="--", label=f"{factor:g}x (the goal's factor)")
    xmax = left.get_xlim()[1]
    left.set_xlim(right=xmax)
    for y, color in never:  # at the right edge, once the limits are known
        left.plot([xmax], [y], "x", color=color, ms=6, clip_on=False)
    left.set_xlabel("time to target / best fixed choice with the same information "
                    "(auto-deadline: the same deadline rule), 95% CI", fontsize=8)
    left.set_yticks(range(len(keys)), keys, fontsize=8)
    left.invert_yaxis()
    fig.legend(*left.get_legend_handles_labels(), loc="upper center", ncol=5, fontsize=8,
               frameon=False, bbox_to_anchor=(0.5, 0.985))
    right.axvline(1.0, color="k", lw=0.8)
    right.set_xscale("log")
    right.xaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0), numticks=6))
    right.xaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
    right.xaxis.set_minor_formatter(ticker.NullFormatter())
    right.set_xlabel("speed-up over uncoded (time to target)", fontsize=8)
    for ax in (left, right):
        ax.grid(True, axis="x", lw=0.3, alpha=0.5)
        ax.tick_params(labelsize=7)
        for row in range(len(keys)):
            ax.axhline(row + 0.5, color="0.85", lw=0.5)
    fig.suptitle("Adaptive coding against its goals (mean over seeds)", fontsize=10, y=1.02)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    return fig


def plot(runs: dict, target: float):
    plt = pyplot()
    from matplotlib import ticker

    keys = list(runs)
    cols = min(3, len(keys))
    rows_ = -(-len(keys) // cols)
    fig, axes = plt.subplots(rows_, cols, figsize=(5.2 * cols, 3.9 * rows_), squeeze=False)
    main_colors = SCHEME_COLORS
    handles = {}
    nested = sorted({_nested_key(s)[0] for by in runs.values() for s in by
                     if s not in main_colors
                     and not s.startswith(("oracle s=", "deadline-fit s="))})
    # one grey level per tolerance in every panel (darker: smaller s); dotted: nested-fit
    shades = dict(zip(nested, np.linspace(0.15, 0.7, max(len(nested), 1)), strict=False))
    for ax, key in zip(axes.flat, keys, strict=False):
        for scheme, rs in runs[key].items():
            if scheme.startswith(("oracle s=", "deadline-fit s=")):
                continue  # hindsight references, deadline rivals: in the table only
            t = np.mean([r["virtual_s"] for r in rs], axis=0)
            a = np.mean([r["accuracy"] for r in rs], axis=0)
            if scheme in main_colors:
                style = {"color": main_colors[scheme], "lw": 2.0 if scheme in ADAPTIVE else 1.3}
                if scheme == "auto-exclude":  # dashed: auto stays visible where they agree
                    style["ls"] = "--"
                if scheme in ON_REQUEST:  # dash-dot: the scheme it varies keeps its colour
                    style["ls"] = "-."
            else:
                v, fit = _nested_key(scheme)
                style = {"color": str(shades[v]), "lw": 0.9, "ls": ":" if fit else "--"}
            (line,) = ax.plot(t, a, label=scheme, **style)
            handles.setdefault(scheme, line)
        ax.axhline(target, color="k", lw=0.6, ls=":")
        ax.set_title(key, fontsize=9, pad=4)
        ax.set_xlabel("virtual time (s)", fontsize=8)
        ax.set_ylabel("test accuracy", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.set_xscale("log")
        # few, plain tick labels: log axes spanning less than a decade otherwise print every
        # minor tick in scientific notation on top of each other
        ax.xaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0), numticks=6))
        ax.xaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
        ax.xaxis.set_minor_locator(ticker.LogLocator(base=10, subs="auto", numticks=12))
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())
        ax.grid(True, which="major", lw=0.3, alpha=0.5)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    order = [s for s in main_colors if s in handles]
    order += sorted((s for s in handles if s not in main_colors), key=_nested_key)
    fig.legend([handles[s] for s in order], order, loc="upper center", ncol=min(len(order), 9),
               fontsize=8, frameon=False, bbox_to_anchor=(0.5, 1.0))
    fig.suptitle(f"time to {target:.0%} test accuracy (mean over seeds; nested s=v: fixed "
                 "tolerance on auto's placement; dotted nested-fit: busy clients queued from "
                 "the server's knowledge, as auto)", fontsize=10, y=1.025)
    fig.tight_layout(rect=(0, 0, 1, 0.97), h_pad=1.6, w_pad=1.2)
    return fig


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
    args = parser.parse_args(argv)
    if args.seeds is not None and args.seeds < 1:
        parser.error(f"--seeds {args.seeds}: expected >= 1")
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: expected >= 1")
    quiet_flower()
    seeds = list(range(args.seeds if args.seeds is not None else 1 if args.quick else 3))
    rounds = 8 if args.quick else 30
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
        if old.get("quick") == args.quick and old.get("seeds") == seeds:
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
    save(result, args.out, plot(runs, args.target) if figure else None)
    if figure and result["goals"]:
        print(f"wrote {save_figure(plot_adaptive(table), f'{args.out}_adaptive.png')}")
    return result


if __name__ == "__main__":
    main()
