"""The main job's defaults (``s-max``, ``auto-margin``), chosen by the rule written in
``experiments/grid.toml`` (``[rules]``, ``defaults_candidates``) before any result.

``python -m experiments.choose_defaults [--quick] [--out results/defaults_dev.json]
[--no-resume]``: an interrupted run resumes from ``OUT.partial.json`` (its finished cells).

The rule (copied into the JSON from the grid file): among ``s-max`` in {2, 4, n // 4} and
``auto-margin`` in {0, 0.1, 0.2}, the setting with the lowest median, over the development
seeds and every latency regime at (n, cohort) = (20, 20) on digits-logreg, of
time_to_target(auto) / time_to_target(best fixed exact code of the same seed); ties: the
smaller ``s-max``, then the smaller ``auto-margin``. Evaluation seeds never enter the choice.

How it is applied, through the harness of ``python -m experiments.compare`` only
(:func:`experiments.compare.run_cell`, the same runs as a cell of the grid):

* seeds: the grid's development seeds (0, 1, 2); regimes: every ``[latency.*]`` table;
* the fixed exact codes: the grid's ``[methods]`` (``fixed_codes`` x ``fixed_s``, ``frc`` only
  where ``s + 1`` divides the cohort: :func:`experiments.run_grid.grid_methods`), each run once
  per (regime, seed) and shared by the nine candidates; "the best fixed exact code of the same
  seed" is the lowest time to target among them on that (regime, seed);
* every coded run (fixed codes and ``auto``) stops waiting at the stated deadline rule, as
  amended in the grid file: the fixed codes' cell computes it (from wait-for-all on the
  development seeds) and each candidate's ``auto`` runs with that ``straggler-timeout``;
* ``s-max = 0`` is the key table's ``n // 4`` (``max(1, n // 4)``, at most ``cohort - 1``:
  5 at n = 20); ties compare that effective value.

Ratios with a run that never reaches the target (its time to target is infinite):

* ``auto`` misses, the best code reaches it: the ratio is infinite (``"inf"`` in the JSON);
* ``auto`` reaches it, no code does: the ratio is 0 (``auto`` is better than every code);
* neither reaches it: the ratio is undefined (``null``) and that (regime, seed) is left out
  of that candidate's median.

The median is taken over the defined ratios (infinite ones included: a median falling on or
between infinities is infinite); a candidate with no defined ratio has no median and ranks
last.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from experiments.compare import GRID, load_grid, lookup, run_cell
from experiments.run_grid import grid_methods

__all__ = ["QUICK", "best_fixed", "choose", "effective_s_max", "main", "median_ratio",
           "ratio", "rule_text"]

TASK = "digits-logreg"
N = COHORT = 20
RULE_READING = (
    "ratio = time_to_target(auto) / min over the fixed exact codes of time_to_target, per "
    "(regime, development seed); a run that never reaches the target has an infinite time. "
    "auto misses and the best code reaches: ratio inf; auto reaches and no code does: ratio 0; "
    "neither reaches: undefined (null), left out of that candidate's median. The median is "
    "over the defined ratios, infinities included; a candidate with no defined ratio ranks "
    "last. s-max = 0 means max(1, n // 4) (at most cohort - 1); ties compare that value, then "
    "auto-margin.")
#: The quick slice (a test): two regimes, one seed, a small federation, few rounds, a low
#: target and two fixed codes.
QUICK = {"n": 6, "rounds": 2, "seeds": [0], "regimes": ["persistent", "bimodal"],
         "target": 0.4, "fixed_codes": ["grouped-rs:1", "crc:2"]}


# ============================================================================= the rule
def rule_text(path: Path = GRID) -> str:
    """The rule's comment in ``[rules]`` of the grid file, as written there."""
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines)
                 if line.startswith("# The rule by which the main job's defaults"))
    out = []
    for line in lines[start:]:
        if not line.startswith("#"):
            break
        out.append(line.lstrip("#").strip())
    return " ".join(out)


def effective_s_max(s_max: int, n: int, cohort: int) -> int:
    """The largest tolerance ``s=auto`` uses for the run-config value ``s_max`` (0: the key
    table's ``max(1, n // 4)``), at most ``cohort - 1``."""
    value = max(1, n // 4) if s_max == 0 else int(s_max)
    return min(value, cohort - 1)


def best_fixed(times: Mapping[str, float | None]) -> tuple[str | None, float]:
    """``(code, time)`` of the fixed code reaching the target first (``(None, inf)`` when
    none does); ties: the first in ``times``' order."""
    best: tuple[str | None, float] = (None, math.inf)
    for code, t in times.items():
        if t is not None and t < best[1]:
            best = (code, float(t))
    return best


def ratio(auto: float | None, best: float) -> float | None:
    """``auto / best`` with a missed target as infinity; ``None`` when both are infinite."""
    a = math.inf if auto is None else float(auto)
    if math.isinf(a) and math.isinf(best):
        return None
    if math.isinf(best):
        return 0.0
    return a / best


def median_ratio(ratios: Sequence[float | None]) -> float | None:
    """The median of the defined ratios (infinities included); ``None`` when none is."""
    known = sorted(r for r in ratios if r is not None)
    if not known:
        return None
    mid = len(known) // 2
    if len(known) % 2:
        return known[mid]
    lo, hi = known[mid - 1], known[mid]
    return math.inf if math.isinf(hi) else (lo + hi) / 2


def choose(candidates: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """The candidate with the lowest median (no median: last); ties: the smaller effective
    ``s-max``, then the smaller ``auto-margin``."""
    def rank(c: Mapping[str, Any]) -> tuple:
        m = c["median"]
        return (m is None, math.inf if m is None else m, c["s_max_effective"],
                c["auto-margin"])

    return min(candidates, key=rank)


def encode(value: float | None) -> float | str | None:
    """JSON: ``"inf"`` for infinity, ``None`` for undefined."""
    if value is None:
        return None
    return "inf" if math.isinf(value) else float(value)


# ============================================================================= the runs
class Progress:
    """Finished :func:`run_cell` results, kept in ``path`` so an interrupted run resumes
    (only when its settings are the same)."""

    def __init__(self, path: Path | None, settings: Mapping[str, Any]) -> None:
        self.path = path
        self.settings = json.loads(json.dumps(settings))
        self.done: dict[str, Any] = {}
        if path is not None and path.exists():
            data = json.loads(path.read_text())
            if data.get("settings") != self.settings:
                raise SystemExit(f"{path} holds an unfinished run with other settings "
                                 f"({data.get('settings')}): pass another --out, or "
                                 "--no-resume to discard it")
            self.done = data["done"]

    def get(self, key: str, make: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        if key not in self.done:
            self.done[key] = make()
            if self.path is not None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self.path.write_text(json.dumps({"settings": self.settings,
                                                 "done": self.done}))
        return self.done[key]


def _slim(result: Mapping[str, Any]) -> dict[str, Any]:
    """What this script keeps of a cell's result (no accuracy curves)."""
    keep = ("method", "seed", "time_to_target", "final_accuracy", "rounds",
            "client_compute_s", "wall_s", "decodes")
    return {"settings": {k: result["settings"].get(k) for k in
                         ("coded_straggler_timeout_s", "coded_straggler_timeout_rule",
                          "stated_deadline_s", "deadline_rule", "run_config")},
            "runs": [{k: r[k] for k in keep if k in r} for r in result["runs"]],
            "runtime_s": result["runtime_s"]}


def run(grid: Mapping[str, Any], *, n: int, cohort: int, rounds: int, seeds: Sequence[int],
        regimes: Sequence[str], target: float, fixed: Sequence[str], quick: bool = False,
        progress: Path | None = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Apply the rule: every candidate's ratios per regime and seed, its median, the choice."""
    from fl_gradcode.config.keys import key

    t0 = time.perf_counter()
    space = grid["rules"]["defaults_candidates"]
    candidates = [(int(s), float(m)) for s in space["s-max"] for m in space["auto-margin"]]
    settings = {"task": TASK, "n": n, "cohort": cohort, "rounds": rounds, "target": target,
                "seeds": list(seeds), "regimes": list(regimes), "fixed_codes": list(fixed),
                "candidates": [{"s-max": s, "auto-margin": m} for s, m in candidates],
                "quick": bool(quick)}
    done = Progress(progress, settings)

    def cell(regime: str, label: str, methods: Sequence[str],
             sets: Mapping[str, Any]) -> dict[str, Any]:
        def make() -> dict[str, Any]:
            log(f"choose_defaults: {regime}, {label}")
            return _slim(run_cell(grid, TASK, regime, n, cohort, rounds, seeds, seeds,
                                  methods, target, sets, quick, log))
        return done.get(f"{regime}|{label}", make)

    deadlines: dict[str, float] = {}
    fixed_times: dict[str, dict[str, dict[str, float | None]]] = {}
    best: dict[str, dict[str, dict[str, Any]]] = {}
    for regime in regimes:
        result = cell(regime, "fixed codes", fixed, {})
        deadlines[regime] = float(result["settings"]["coded_straggler_timeout_s"])
        by = {(r["method"], r["seed"]): r["time_to_target"] for r in result["runs"]}
        fixed_times[regime] = {str(s): {c: by[c, s] for c in fixed} for s in seeds}
        best[regime] = {}
        for s in seeds:
            code, t = best_fixed(fixed_times[regime][str(s)])
            best[regime][str(s)] = {"code": code, "time_to_target": encode(t)}
    rows = []
    for s_max, margin in candidates:
        label = f"s-max={s_max},auto-margin={margin}"
        times: dict[str, dict[str, Any]] = {}
        ratios: dict[str, dict[str, Any]] = {}
        finals: dict[str, dict[str, Any]] = {}
        flat: list[float | None] = []
        for regime in regimes:
            result = cell(regime, label, ["auto"],
                          {"s-max": s_max, "auto-margin": margin,
                           "straggler-timeout": deadlines[regime]})
            by = {r["seed"]: r for r in result["runs"]}
            times[regime], ratios[regime], finals[regime] = {}, {}, {}
            for s in seeds:
                t = by[s]["time_to_target"]
                _, b = best_fixed(fixed_times[regime][str(s)])
                value = ratio(t, b)
                flat.append(value)
                times[regime][str(s)] = t
                ratios[regime][str(s)] = encode(value)
                finals[regime][str(s)] = by[s]["final_accuracy"]
        med = median_ratio(flat)
        rows.append({"s-max": s_max, "s_max_effective": effective_s_max(s_max, n, cohort),
                     "auto-margin": margin, "median": med,
                     "defined_ratios": sum(v is not None for v in flat),
                     "time_to_target": times, "ratios": ratios, "final_accuracy": finals})
        log(f"  {label}: median ratio {med} over {rows[-1]['defined_ratios']} pairs")
    chosen = choose(rows)
    current = {"s-max": int(key("s-max").default),
               "auto-margin": float(key("auto-margin").default)}
    current_row = next((r for r in rows if r["s-max"] == current["s-max"]
                        and r["auto-margin"] == current["auto-margin"]), None)
    for r in rows:
        r["median"] = encode(r["median"])
    return {
        "rule": rule_text(),
        "rule_reading": RULE_READING,
        "ratio_encoding": "a number; \"inf\" for infinity; null for undefined",
        "settings": settings,
        "coded_straggler_timeout_s": deadlines,
        "fixed_code_time_to_target": fixed_times,
        "best_fixed_code": best,
        "candidates": rows,
        "chosen": {k: chosen[k] for k in ("s-max", "s_max_effective", "auto-margin",
                                          "median")},
        "current_defaults": {**current,
                             "median": current_row["median"] if current_row else None},
        "runtime_s": time.perf_counter() - t0,
    }


# ============================================================================= the command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.choose_defaults",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="",
                        help="default: results/defaults_dev.json (--quick: "
                             "results/defaults_dev_quick.json)")
    parser.add_argument("--quick", action="store_true", help=f"the quick slice: {QUICK}")
    parser.add_argument("--no-resume", action="store_true",
                        help="ignore (and overwrite) OUT.partial.json of an earlier run")
    args = parser.parse_args(argv)
    import torch

    grid = load_grid()
    task = lookup(grid, "tasks", TASK)
    out = Path(args.out or ("results/defaults_dev_quick.json" if args.quick
                            else "results/defaults_dev.json"))
    partial = out.with_name(out.stem + ".partial.json")
    if args.no_resume and partial.exists():
        partial.unlink()
    if args.quick:
        kw = {"n": QUICK["n"], "cohort": QUICK["n"], "rounds": QUICK["rounds"],
              "seeds": QUICK["seeds"], "regimes": QUICK["regimes"],
              "target": QUICK["target"], "fixed": QUICK["fixed_codes"]}
    else:
        kw = {"n": N, "cohort": COHORT, "rounds": int(grid["scale"]["rounds"]),
              "seeds": list(grid["seeds"]["development"]), "regimes": list(grid["latency"]),
              "target": float(task["target"]),
              "fixed": [m for m in grid_methods(grid, COHORT) if ":" in m]}
    flwr_logger, threads = logging.getLogger("flwr"), torch.get_num_threads()
    level = flwr_logger.level
    flwr_logger.setLevel(logging.ERROR)
    torch.set_num_threads(1)  # small models: threads only contend
    try:
        result = run(grid, quick=args.quick, progress=partial, **kw)
    finally:
        flwr_logger.setLevel(level)
        torch.set_num_threads(threads)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    partial.unlink(missing_ok=True)
    chosen, current = result["chosen"], result["current_defaults"]
    print(f"chosen: s-max {chosen['s-max']} (effective {chosen['s_max_effective']}), "
          f"auto-margin {chosen['auto-margin']}, median ratio {chosen['median']}; current "
          f"defaults s-max {current['s-max']}, auto-margin {current['auto-margin']}: median "
          f"{current['median']}")
    print(f"wrote {out} ({result['runtime_s']:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
