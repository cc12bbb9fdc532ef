"""Notes under the results table on asymmetries of the benchmark's design that the verdict
keeps (found by an audit of the harness; not amendments): every method runs the same number
of rounds, not the same virtual time; the fixed codes stop waiting at a deadline set
from clients computing one partition; a drift cell whose runs end before its regime drifts
repeats its pareto cell. Each note is counted from ``results/compare.json``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tools.docgen.rivals import CRITERION_RIVALS, is_code, method_label

__all__ = ["codes_deadline", "drift_repeats", "short_horizons"]


def short_horizons(data: Mapping[str, Any], done: Sequence[str]) -> list[str]:
    """The runs of the verdict's rivals (:data:`CRITERION_RIVALS` and the fixed codes) that
    ended (their rounds, or FedBuff's updates, spent) without
    reaching the target at a virtual time before auto reached it on the same seed: the
    verdict counts them as never reaching it, where a common time budget would have let
    them go on."""
    counts: dict[str, int] = {}
    cells: set[str] = set()
    for name in done:
        runs = data["cells"][name]["runs"]
        auto = {r["seed"]: r["time_to_target"] for r in runs if r["method"] == "auto"}
        for r in runs:
            reached = auto.get(r["seed"])
            rival = r["method"] in CRITERION_RIVALS or is_code(r["method"])
            if not rival or r["time_to_target"] is not None \
                    or reached is None or r.get("total_virtual_s") is None:
                continue
            if float(r["total_virtual_s"]) < float(reached):
                key = "fixed codes" if is_code(r["method"]) else method_label(r["method"])
                counts[key] = counts.get(key, 0) + 1
                cells.add(name)
    if not counts:
        return []
    total = sum(counts.values())
    by = ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    return [f"Every method runs the grid's rounds (FedBuff as many client updates), not the "
            f"same virtual time, so a method whose rounds are short stops early: {total} "
            f"runs of rivals in {len(cells)} of the {len(done)} finished cells ended without "
            f"reaching the target before auto reached it on the same seed ({by}); the "
            "verdict counts them as never reaching it, which can flatter auto (some might "
            "never have reached it: a common virtual-time budget per cell would tell; not "
            "amended)."]


def codes_deadline(data: Mapping[str, Any], done: Sequence[str]) -> list[str]:
    """The (cell, fixed code) pairs at least a quarter of whose rounds were skipped (the
    replies in by the deadline decoded above ``max-decode-error``, or none came), among the
    pairs whose code stopped waiting at the stated deadline, set from wait-for-all's clients
    computing one partition, while a code's clients compute ``s + 1`` (the codes that
    predate the grid file's amendment 21, which gives each code its own deadline)."""
    pairs, many = 0, []
    for name in done:
        by: dict[str, list[int]] = {}
        own = data["cells"][name].get("settings", {}).get("code_deadlines_s") or {}
        for r in data["cells"][name]["runs"]:
            if (is_code(r["method"]) and r["method"] not in own
                    and isinstance(r.get("decodes"), Mapping)):
                got = by.setdefault(r["method"], [0, 0])
                got[0] += int(r["decodes"].get("skipped", 0))
                got[1] += sum(int(v) for v in r["decodes"].values())
        for method, (skipped, total) in by.items():
            pairs += 1
            if total and 4 * skipped >= total:
                many.append((-skipped / total, name, method))
    if not many:
        return []
    many.sort()
    most = "; ".join(f"{m} in {n}: {-100 * f:.0f} %" for f, n, m in many[:3])
    return [f"Where the fixed codes predate amendment 21 they stop waiting at the stated "
            f"deadline, set from wait-for-all's clients computing one partition, while a "
            f"code's clients compute s + 1: in {len(many)} of those {pairs} (cell, code) "
            f"pairs at least a quarter of a code's rounds were skipped, the replies in by "
            f"then decoding too poorly or none coming (most: {most}), while auto chooses s "
            "knowing the deadline, so there the best-code column may flatter auto (amended: "
            "each code's own deadline, run where its cell's codes ran again)."]


def drift_repeats(data: Mapping[str, Any], done: Sequence[str]) -> list[str]:
    """The drift cells whose runs reached the target at exactly the virtual time of the same
    run (method, seed) in the cell's pareto sibling (``TASK/pareto/SCALE``): latency
    ``drift`` is pareto's until its drift round, so those runs ended before the regime
    changed and repeat pareto's reading. Counted only where both cells are finished (a
    lower bound: a run whose sibling was re-run at another commit is not matched)."""
    found = []
    for name in done:
        task, latency, scale = [*name.split("/"), "", ""][:3]
        sibling = f"{task}/pareto/{scale}"
        if latency != "drift" or sibling not in done:
            continue
        times = {(r["method"], r["seed"]): r["time_to_target"]
                 for r in data["cells"][sibling]["runs"]}
        pairs = same = auto = seeds = 0
        for r in data["cells"][name]["runs"]:
            key = (r["method"], r["seed"])
            if key not in times:
                continue
            pairs += 1
            seeds += r["method"] == "auto"
            if r["time_to_target"] is not None and times[key] == r["time_to_target"]:
                same += 1
                auto += r["method"] == "auto"
        if same:
            found.append((-same / pairs, f"{name} {same} of {pairs} (auto {auto} of {seeds})"))
    if not found:
        return []
    found.sort()
    drift_round = next((data["cells"][n]["settings"].get("run_config", {}).get(
        "latency-drift-round") for n in done if "/drift/" in n
        and "settings" in data["cells"][n]), None)
    when = f" (round {drift_round})" if drift_round is not None else ""
    return [f"Latency drift is pareto's until it drifts{when}: runs that reach the target "
            f"before then read the pareto regime again. Runs of a drift cell that reached the "
            f"target at exactly the virtual time of the same method and seed in the pareto "
            f"cell of its task and scale: {'; '.join(text for _, text in found)}; where most "
            "do, the drift row is not independent evidence of a drifting regime."]
