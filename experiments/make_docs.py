"""Render every result number, table and figure of README.md and docs/ from results/*.json.

A generated block is a marked region of a Markdown page::

    <!-- generated:NAME -->
    ... rendered by the function registered under NAME ...
    <!-- /generated:NAME -->

``python experiments/make_docs.py`` rewrites every block of README.md and docs/*.md (and draws
the figures below that no experiment draws); ``--check`` rewrites nothing and exits 1 listing
the stale blocks (and any block name without a renderer). Only JSON is read: no experiment runs.
Prose around a block is hand-written and states no measured number.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: import this checkout's fl_gradcode
    sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "results"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(
    r"(?P<open><!-- generated:(?P<name>[\w-]+) -->\n)(?P<body>.*?)"
    r"(?P<close><!-- /generated:(?P=name) -->)", re.S)
FIGURE_CODING = "results/coding_speedup.png"

RENDERERS: dict[str, Callable[[], str | None]] = {}


def block(name: str):
    """Register ``fn`` as the renderer of the blocks named ``name`` (``None``: keep the body)."""
    def register(fn: Callable[[], str | None]) -> Callable[[], str | None]:
        RENDERERS[name] = fn
        return fn
    return register


@functools.cache
def load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _num(value: float | None, fmt: str = ".2f") -> str:
    return "-" if value is None else format(value, fmt)


def ci(pair: list[float] | None) -> str:
    return "" if not pair else f" [{pair[0]:.2f}, {pair[1]:.2f}]"


# ---------------------------------------------------------------- time to accuracy
TTA = "time_to_accuracy.json"


def _tta_cell(entry: dict, speed: bool = True) -> str:
    if entry.get("time_to_target_mean") is None:
        return f"never (final {entry['final_accuracy_mean']:.3f})"
    text = f"{entry['time_to_target_mean']:.1f} ± {entry['time_to_target_std']:.1f}"
    if not speed:
        return text
    extra = f"{entry['speedup_vs_uncoded']:.2f}×"
    if entry.get("max_accuracy_gap_to_uncoded"):
        extra += f", gap {entry['max_accuracy_gap_to_uncoded']:.2f}"
    return f"{text} ({extra})"


def _best(row: dict, prefix: str) -> tuple[str, dict] | None:
    found = [(k, v) for k, v in row.items()
             if k.startswith(prefix) and v.get("time_to_target_mean") is not None]
    return min(found, key=lambda kv: kv[1]["time_to_target_mean"]) if found else None


def _label(name: str, setup: str) -> str:
    s_max = int(setup.split()[1][2:])
    if name == f"oracle s={s_max}":
        return f"{name}, the fixed s_max queued like auto"
    return name


def _no_dp(data: dict) -> list[str]:
    return [k for k in data["table"] if "+DP" not in k]


@block("tta-main")
def tta_main() -> str:
    data = load(TTA)
    rows = []
    for setup, row in data["table"].items():
        nested = _best(row, "nested s=")
        auto = row["auto"]
        nested_cell = "never" if nested is None else (
            f"{nested[0][len('nested '):]}: {_tta_cell(nested[1])}")
        if auto.get("vs_best_fixed") is None or auto.get("time_to_target_mean") is None:
            vs_fixed, vs_uncoded = "-", "-"
        else:
            vs_fixed = f"{auto['vs_best_fixed']:.2f} ({auto['best_fixed']})"
            vs_uncoded = f"{1 / auto['speedup_vs_uncoded']:.2f}"
        rows.append([setup, *(_tta_cell(row[k]) for k in
                              ("uncoded", "ignore-stragglers", "exact", "approx-deadline")),
                     nested_cell, _tta_cell(auto), vs_fixed, vs_uncoded])
    return table(["setup", "uncoded", "ignore-stragglers", "exact", "approx-deadline",
                  "best nested s=v", "auto", "auto vs best fixed", "auto vs uncoded"], rows)


@block("tta-same-information")
def tta_same_information() -> str:
    data = load(TTA)
    rows = []
    for setup in _no_dp(data):
        row = data["table"][setup]
        auto = row["auto"]
        cells = [setup]
        for prefix in ("nested s=", "nested-fit s="):
            best = _best(row, prefix)
            cells.append("never" if best is None else
                         f"{best[0].split()[-1]}: {_tta_cell(best[1], speed=False)}")
        cells.append(_tta_cell(auto, speed=False))
        cells.append(f"{auto['vs_best_fixed']:.2f} ({_label(auto['best_fixed'], setup)})"
                     + ci(auto.get("vs_best_fixed_ci95")))
        cells.append(f"{auto['vs_best_fixed_same_information']:.2f} "
                     f"({_label(auto['best_fixed_same_information'], setup)})"
                     + ci(auto.get("vs_best_fixed_same_information_ci95")))
        rows.append(cells)
    return table(["setup", "best nested s=v (clock)", "best nested-fit s=v (server's knowledge)",
                  "auto", "auto / best fixed, clock-informed rivals [95% CI]",
                  "auto / best fixed, same information [95% CI]"], rows)


@block("tta-oracle")
def tta_oracle() -> str:
    data = load(TTA)
    rows = []
    for setup in _no_dp(data):
        auto = data["table"][setup]["auto"]
        rows.append([
            setup,
            f"{auto['best_fixed_same_information']}: "
            f"{auto['best_fixed_same_information_time']:.1f}",
            f"{auto['time_to_target_mean']:.1f}",
            f"{auto['vs_best_fixed_same_information']:.2f}"
            + ci(auto.get("vs_best_fixed_same_information_ci95")),
            f"{auto['oracle'].split()[-1]}: {auto['oracle_time']:.1f}",
            f"{auto['oracle_start_cost']:.2f}",
            f"{auto['vs_oracle']:.2f}" + ci(auto.get("vs_oracle_ci95")),
            f"{auto['vs_best_fixed_final']:.2f} ({auto['best_fixed_final']})"
            + ci(auto.get("vs_best_fixed_final_ci95")),
            f"{auto['vs_best_fixed_same_information_final']:.2f} "
            f"({auto['best_fixed_same_information_final']})"
            + ci(auto.get("vs_best_fixed_same_information_final_ci95")),
        ])
    return table(["setup", "best fixed with auto's information (time to 90%)", "auto",
                  "auto / it [95% CI]", "oracle: best constant v after round 1 at s_max",
                  "its start cost (over the same v fixed from round 1)",
                  "auto / oracle [95% CI]",
                  "time to the final model: auto / best fixed [95% CI]",
                  "the same, rivals with auto's information [95% CI]"], rows)


def _adaptive_vs(auto: dict, key: str) -> str:
    value = auto.get(f"vs_best_fixed_{key}") if key else auto.get("vs_best_fixed")
    if value is None:
        return "-"
    best = auto.get(f"best_fixed_{key}") if key else auto.get("best_fixed")
    interval = auto.get(f"vs_best_fixed_{key}_ci95") if key else auto.get("vs_best_fixed_ci95")
    return f"{value:.2f} ({best})" + ci(interval)


@block("tta-adaptive-variants")
def tta_adaptive_variants() -> str:
    """Every adaptive scheme of the runs against the best fixed choice (three rival sets)."""
    data = load(TTA)
    rows = []
    for setup in _no_dp(data):
        for scheme, entry in data["table"][setup].items():
            if not scheme.startswith("auto"):
                continue
            rows.append([setup, scheme, _tta_cell(entry),
                         f"{entry['exact_rounds']:.1f}",
                         _adaptive_vs(entry, ""), _adaptive_vs(entry, "same_information"),
                         _adaptive_vs(entry, "with_deadline")])
    return table(["setup", "scheme", "time to 90% (speed-up vs uncoded)",
                  "exact rounds (of 30)", "vs best fixed, clock-informed [95% CI]",
                  "vs best fixed, same information [95% CI]",
                  "vs best fixed, same deadline rule [95% CI]"], rows)


def _time(entry: dict) -> str:
    """Mean time to the target over the seeds reaching it, how many if not all."""
    if entry.get("time_to_target_mean") is None:
        return "never"
    seeds = len(load(TTA)["seeds"])
    reached = entry.get("reached", seeds)
    more = f" ({reached} seeds)" if reached < seeds else ""
    return f"{entry['time_to_target_mean']:.1f}{more}"


def _runs(setup: str, scheme: str) -> list[dict]:
    return load(TTA)["runs"][setup][scheme]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


@block("tta-warm-start")
def tta_warm_start() -> str:
    data = load(TTA)
    rows = []
    counts = [0, 0]
    for setup in _no_dp(data):
        row = data["table"][setup]
        if "auto-warm" not in row:
            continue
        cold, warm = row["auto"], row["auto-warm"]
        rows.append([setup, _time(cold), _time(warm),
                     f"{cold['vs_best_fixed_same_information']:.2f} -> "
                     f"{warm['vs_best_fixed_same_information']:.2f}"
                     + ci(warm.get("vs_best_fixed_same_information_ci95")),
                     f"{cold['vs_best_fixed_final']:.2f} -> {warm['vs_best_fixed_final']:.2f}"
                     + ci(warm.get("vs_best_fixed_final_ci95")),
                     f"{cold['vs_best_fixed_same_information_final']:.2f} -> "
                     f"{warm['vs_best_fixed_same_information_final']:.2f} "
                     f"({warm['best_fixed_same_information_final']})"
                     + ci(warm.get("vs_best_fixed_same_information_final_ci95"))])
        counts[0] += cold["vs_best_fixed_same_information"] <= 1.05
        counts[1] += warm["vs_best_fixed_same_information"] <= 1.05
    return (table(["setup", "auto", "auto-warm", "/ best fixed, same information [95% CI]",
                   "to the final model [95% CI]",
                   "to the final model, same information [95% CI]"], rows)
            + f"\n\nWithin 1.05× of the best fixed choice with auto's information to "
            f"{data['target']:.0%}: {counts[1]} of these {len(rows)} settings warm against "
            f"{counts[0]} cold.")


@block("tta-stop-late-work")
def tta_stop_late_work() -> str:
    data = load(TTA)
    rows = []
    for setup in _no_dp(data):
        row = data["table"][setup]
        if "approx-deadline-stop" not in row:
            continue
        acc = {k: _mean([_mean(r["accuracy"]) for r in _runs(setup, k)])
               for k in ("approx-deadline", "approx-deadline-stop")}
        a, b = row["approx-deadline"], row["approx-deadline-stop"]
        rows.append([setup, _time(a), _time(b),
                     f"{acc['approx-deadline']:.3f} -> {acc['approx-deadline-stop']:.3f}",
                     f"{a['final_accuracy_mean']:.3f} -> {b['final_accuracy_mean']:.3f}"])
    return table(["setup", "approx-deadline", "-stop", "mean accuracy over rounds",
                  "final accuracy"], rows)


@block("tta-auto-deadline")
def tta_auto_deadline() -> str:
    data = load(TTA)
    rows = []
    for setup in _no_dp(data):
        row = data["table"][setup]
        if "auto-deadline" not in row:
            continue
        auto, dl = row["auto"], row["auto-deadline"]
        last = {k: _mean([r["virtual_s"][-1] for r in _runs(setup, k)])
                for k in ("auto", "auto-deadline")}
        decodes = [d for r in _runs(setup, "auto-deadline") for d in r["decode"]]
        best_dl = dl.get("best_fixed_with_deadline")
        rows.append([
            setup, f"{_time(auto)} -> {_time(dl)}",
            f"{dl['best_fixed']}: {dl['best_fixed_time']:.1f}",
            f"{dl['vs_best_fixed']:.2f}" + ci(dl.get("vs_best_fixed_ci95")),
            "-" if best_dl is None else
            f"{best_dl.split()[-1]}: {dl['best_fixed_with_deadline_time']:.1f}",
            "-" if best_dl is None else
            f"{dl['vs_best_fixed_with_deadline']:.2f}"
            + ci(dl.get("vs_best_fixed_with_deadline_ci95")),
            f"{last['auto']:.1f} -> {last['auto-deadline']:.1f}",
            f"{decodes.count('approx')} / {decodes.count('skipped')}"])
    missed = [r[-1] for r in rows if r[-1] != "0 / 0"]
    total = sum(len(r["decode"]) for k in _no_dp(data) if "auto-deadline" in data["table"][k]
                for r in _runs(k, "auto-deadline"))
    not_exact = sum(int(a) + int(b) for a, b in (m.split(" / ") for m in missed))
    return (table(["setup", "auto -> auto-deadline", "best fixed", "/ it [95% CI]",
                   "best fixed with the deadline", "/ it [95% CI]", "round 30",
                   "approx / skipped"], rows)
            + f"\n\nRounds of `auto-deadline` that were not exact: {not_exact} of {total}, "
            f"in {len(missed)} of the {len(rows)} settings.")


@block("tta-all-runs")
def tta_all_runs() -> str:
    """Every scheme of every setting: the complete record behind the tables and the notes."""
    data = load(TTA)
    rows = []
    for setup, row in data["table"].items():
        for scheme, e in row.items():
            gap = e.get("max_accuracy_gap_to_uncoded")
            rows.append([setup, scheme, _tta_cell(e, speed=False),
                         "-" if e.get("speedup_vs_uncoded") is None
                         else f"{e['speedup_vs_uncoded']:.2f}×",
                         f"{e['final_accuracy_mean']:.3f}",
                         f"{e['exact_rounds']:.1f}", "-" if gap is None else f"{gap:.2f}",
                         "-" if e.get("time_to_final_model_mean") is None
                         else f"{e['time_to_final_model_mean']:.1f}"])
    return table(["setup", "scheme", "time to 90% (virtual s)", "speed-up vs uncoded",
                  "final accuracy", "exact rounds (of 30)", "largest accuracy gap to uncoded",
                  "time to round 30 (auto schemes)"], rows)


@block("tta-10seeds")
def tta_10seeds() -> str:
    data = load("time_to_accuracy_10seeds.json")
    rows = []
    for setup, row in data["table"].items():
        auto = row.get("auto", {})
        rows.append([setup, _tta_cell(auto) if auto else "-",
                     _adaptive_vs(auto, ""),
                     "-" if auto.get("seeds_compared") is None else str(auto["seeds_compared"]),
                     _adaptive_vs(auto, "same_information"),
                     "-" if auto.get("vs_best_fixed_final") is None else
                     f"{auto['vs_best_fixed_final']:.2f} ({auto['best_fixed_final']})"
                     + ci(auto.get("vs_best_fixed_final_ci95"))])
    return table(["setup", "auto: time to 90% (speed-up vs uncoded)",
                  "auto / best fixed [95% CI]", "seeds compared",
                  "auto / best fixed, same information [95% CI]",
                  "time to the final model: auto / best fixed [95% CI]"], rows)


def _ratio(value: float) -> str:
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


WORST_COLUMNS = ["s=0", "s=1", "s=2", "s=s_max/4", "s=s_max/2", "s=s_max"]


@block("adaptive-worst-case")
def adaptive_worst_case() -> str:
    data = load(TTA)
    rows = []
    for rivals, title in (("same_information", "same information"),
                          ("with_deadline", "same deadline rule")):
        groups = data["worst_case"].get(rivals)
        if not groups:
            continue
        for group, entry in groups.items():
            count = len(entry["settings"])
            name = f"{title}, all ({count})" if group == "all" else f"{group} ({count})"
            cells = [name]
            for column in WORST_COLUMNS:
                value = entry["worst"].get(column)
                ran = entry["ran_in"].get(column, count)
                cells.append("" if value is None else
                             _ratio(value) + (f" ({ran})" if ran != count else ""))
            key = next((k for k in entry["worst"] if not k.startswith("s=")), None)
            cells.append("-" if key is None else
                         (f"`{key}` " if group == "all" else "") + _ratio(entry["worst"][key]))
            rows.append(cells)
    return table(["rivals, cohort (settings)", *WORST_COLUMNS, "adaptive"], rows)


@block("adaptive-goals")
def adaptive_goals() -> str:
    within = load(TTA)["goals"]["auto"]["within"]
    lines = []
    for entry in within.values():
        met, missed = entry["met"], entry["missed"]
        worst = max(missed.items(), key=lambda kv: kv[1]) if missed else None
        lines.append(
            f"- against {entry['rivals']}: within the goal in {len(met)} of "
            f"{len(met) + len(missed)} settings"
            + ("" if worst is None else f", worst {worst[1]:.2f}× ({worst[0]})"))
    return "\n".join(lines)


@block("adaptive-at-a-glance")
def adaptive_at_a_glance() -> str:
    data = load(TTA)
    tab, settings = data["table"], _no_dp(data)
    auto = {k: tab[k]["auto"] for k in settings}
    gaps = [tab[k]["auto"]["max_accuracy_gap_to_uncoded"] for k in tab]
    speed = {k: e["speedup_vs_uncoded"] for k, e in auto.items()}
    lo, hi = min(speed, key=speed.get), max(speed, key=speed.get)

    def within(scheme: str, key: str) -> str:
        ratios = {k: tab[k][scheme][key] for k in settings
                  if scheme in tab[k] and tab[k][scheme].get(key) is not None}
        hit = sum(v <= 1.05 for v in ratios.values())
        worst = max(ratios, key=ratios.get)
        return (f"{hit} of {len(ratios)} settings, worst {ratios[worst]:.2f}× "
                f"(`{worst}`)")

    return "\n".join([
        f"- **Exact and faster than uncoded**: largest accuracy gap of `auto` to the uncoded "
        f"run over all {len(tab)} settings (DP included): {max(gaps):g}; faster than uncoded "
        f"to {data['target']:.0%} in every setting without DP, from {speed[lo]:.2f}× "
        f"(`{lo}`) to {speed[hi]:.2f}× (`{hi}`).",
        f"- **Within 1.05× of the best fixed choice?** `auto` against fixed codes with the "
        f"same information: {within('auto', 'vs_best_fixed_same_information')}; a second "
        f"run reading the first's latencies (`auto-warm`): "
        f"{within('auto-warm', 'vs_best_fixed_same_information')}; deadlines from the "
        f"prediction (`auto-deadline`) against the same rivals: "
        f"{within('auto-deadline', 'vs_best_fixed_same_information')}, against fixed codes "
        f"given the same deadline rule: {within('auto-deadline', 'vs_best_fixed_with_deadline')}.",
    ])


@block("tta-goals")
def tta_goals() -> str:
    """The adaptive scheme's goals, measured: the ``goals`` entry of the time-to-accuracy JSON."""
    data = load(TTA)
    lines = []
    for scheme, goal in data["goals"].items():
        within = goal.get("within", {})
        counts = "; ".join(f"{len(e['met'])} of {len(e['met']) + len(e['missed'])} against "
                           f"{e['rivals']}" for e in within.values())
        lines.append(f"- `{scheme}` within 1.05× of the best fixed choice: {counts}.")
        drift = goal.get("drift", {})
        if drift:
            cells = ", ".join(f"`{k}` {_num(v['to_target'])} / {_num(v['to_final_model'])}"
                              for k, v in drift.items())
            lines.append(f"  Under drift, its time over the best fixed choice to "
                         f"{data['target']:.0%} / to the final model: {cells}.")
        if goal.get("speedup_pareto") is not None and goal.get("speedup_n256_bimodal"):
            lines.append(f"  Speed-up over uncoded under Pareto delays "
                         f"{goal['speedup_pareto']:.2f}×, at n = 256 under load-scaled bimodal "
                         f"straggling {goal['speedup_n256_bimodal']:.2f}×.")
        exact = goal.get("exact")
        if exact:
            lines.append(f"  Rounds equal to the uncoded run's in {len(exact['equal'])} "
                         f"settings, different in {len(exact['differ'])}, approximate in "
                         f"{len(exact['approximate'])}.")
    return "\n".join(lines)


@block("headline")
def headline() -> str:
    data = load(TTA)
    settings = _no_dp(data)
    tab = data["table"]
    auto = {k: tab[k]["auto"]["speedup_vs_uncoded"] for k in settings}
    exact = {k: tab[k]["exact"]["speedup_vs_uncoded"] for k in settings}
    lo, hi = min(auto, key=auto.get), max(auto, key=auto.get)
    heavy = next(k for k in settings if "pareto" in k)
    worst_exact = min(exact, key=exact.get)
    all_exact = all(tab[k]["auto"]["exact_rounds"] == data["rounds"] for k in tab)
    goal = data["goals"]["auto"]["within"]["same_information"]
    worst = max(goal["missed"], key=goal["missed"].get)
    same_info = (len(goal["met"]), len(goal["met"]) + len(goal["missed"]),
                 goal["missed"][worst], worst)
    return "\n".join([
        f"- **Buys**: a fixed exact code reaches {data['target']:.0%} accuracy "
        f"{exact[heavy]:.2f}× sooner than uncoded FedAvg under heavy-tailed delays "
        f"(`{heavy}`); "
        f"`s=\"auto\"` is {auto[lo]:.2f}× (`{lo}`) to {auto[hi]:.2f}× (`{hi}`) faster than "
        f"uncoded in all {len(settings)} settings without DP"
        + (", every round exact." if all_exact else "."),
        f"- **Costs**: each client computes `s+1` partitions; where straggling grows with the "
        f"work the fixed `s_max` loses ({exact[worst_exact]:.2f}× uncoded's speed at "
        f"`{worst_exact}`), and replicas see each other's raw partition data.",
        f"- **Not a free choice of `s`**: `s=\"auto\"` is within 1.05× of the best fixed code "
        f"(given the same information) in {same_info[0]} of {same_info[1]} settings, worst "
        f"{same_info[2]:.2f}× (`{same_info[3]}`); what it buys is robustness when the regime is "
        f"unknown.",
    ])


# ---------------------------------------------------------------- robustness
@block("fault-injection")
def fault_injection() -> str:
    d = load("fault_injection.json")
    return (f"`experiments/fault_injection.py` (`results/fault_injection.json`): "
            f"{d['scenarios']} randomized fault scenarios, {len(d['faults_injected'])} fault "
            f"kinds, {d['crashes']} crashes, {d['corrupted_models']} corrupted models, "
            f"{d['wrong_models_applied_as_verified']} wrong models applied as verified, "
            f"{d['runs_ended_by_node_failure']} runs ended by a node's failure "
            f"({d['faults_injected_total']:,} faults injected over {d['rounds']:,} rounds, "
            f"{len(d['invariant_violations'])} invariant violations).")


# ---------------------------------------------------------------- sampled cohorts
@block("sampled-cohorts")
def sampled_cohorts() -> str:
    d = load("sampled_cohorts.json")
    schemes = list(d["schemes"])
    rows = []
    for latency, row in d["table"].items():
        rows.append([latency, *(f"{row[s]['time_to_target_mean']:.1f} s "
                                f"({row[s]['mean_round_s']:.2f} s)" if s in row else "-"
                                for s in schemes)])
    auto = d["table"].get("persistent", {}).get("auto", {})
    note = ""
    if "vs_auto_reset" in auto:
        note = (f"\n\npersistent: auto / auto-reset {auto['vs_auto_reset']:.2f}"
                f"{ci(auto.get('vs_auto_reset_ci95'))} (time to {d['target']:.0%}), "
                f"{auto['round_vs_auto_reset']:.2f}{ci(auto.get('round_vs_auto_reset_ci95'))} "
                f"(mean round time); mean s {auto['mean_s']:.2f}; "
                f"{d['n']} nodes, fraction-train {d['fraction_train']}, s_max {d['s_max']}, "
                f"{len(d['seeds'])} seeds.")
    return table(["latency", *schemes], rows) + note


@block("sampled-cohorts-10seeds")
def sampled_cohorts_10seeds() -> str:
    d = load("sampled_cohorts_10seeds.json")
    auto = d["table"]["persistent"]["auto"]
    rows = [[s, "not on every seed" if e["time_to_target_mean"] is None else
             f"{e['time_to_target_mean']:.1f} s", f"{e['mean_round_s']:.2f} s",
             f"{e['mean_s']:.2f}"] for s, e in d["table"]["persistent"].items()]
    return (table(["scheme (persistent, 10 seeds)", "time to 90% (seeds that reach it)",
                   "mean round", "mean s"], rows)
            + f"\n\nauto / auto-reset {auto['vs_auto_reset']:.2f}"
            f"{ci(auto.get('vs_auto_reset_ci95'))}"
            f" (time), {auto['round_vs_auto_reset']:.2f}"
            f"{ci(auto.get('round_vs_auto_reset_ci95'))} (mean round time); auto faster on "
            f"{auto['faster_than_auto_reset_on']} of {auto['seeds_compared']} seeds compared.")


# ---------------------------------------------------------------- performance
@block("bandwidth-limited")
def bandwidth_limited() -> str:
    d = load("bandwidth_limited.json")
    by = {}
    for r in d["table"]:
        by.setdefault(r["upload_s"], {})[r["scheme"]] = r
    rows = []
    for upload, r in by.items():
        ce = r["comm-efficient"]
        rows.append([f"{upload:g}", *(f"{r[s]['time_to_target']:.2f} ({r[s]['round_s']:.3f} s)"
                                      for s in ("uncoded", "exact", "comm-efficient")),
                     f"{ce['speedup_vs_exact']:.2f}× (round {ce['round_speedup_vs_exact']:.2f}×)",
                     f"{ce['bytes_vs_uncoded']:.2f} / {r['exact']['bytes_vs_uncoded']:.2f}"])
    return table(["upload s (one full model)", "uncoded", "exact (grouped-rs)",
                  "comm-efficient", "comm-eff. vs exact (speed-up)",
                  "bytes per round vs uncoded (comm-eff. / exact)"], rows)


@block("bench-aggregation")
def bench_aggregation() -> str:
    rows = []
    for r in load("bench_aggregation.json")["rows"]:
        rows.append([f"{r['params']:.0e}".replace("e+0", "e"), r["n"], r["replies"],
                     r["replies_read"], f"{r['fedavg_s']:.3f}", f"{r['coded_s']:.3f}",
                     f"{r['speedup_vs_fedavg']:.1f}×",
                     f"{r['coded_with_validation_s']:.3f} ({r['speedup_with_validation']:.1f}×)",
                     f"{r['bytes_fedavg'] / 1e6:.1f} / {r['bytes_coded'] / 1e6:.1f}",
                     f"{r['reaction_ms_p50']:.1f}",
                     f"{r['peak_over_model']:.1f} "
                     f"(bound {r['peak_bound_bytes'] / (4 * r['params']):.0f})"])
    return table(["params", "n", "replies", "read", "FedAvg s", "coded s", "speed-up",
                  "+ validation s (speed-up)", "reply MB (FedAvg / coded)",
                  "reaction ms (p50)", "peak / model"], rows)


@block("bench-codes-cold")
def bench_codes_cold() -> str:
    rows = [[r["code"], r["n"], r["s"], r["sets"], f"{r['median_ms']:.1f}",
             f"{r['min_ms']:.1f}–{r['max_ms']:.1f}"]
            for r in load("bench_codes.json")["decoding_vector_cold"]]
    return table(["code", "n", "s", "random sets", "median ms", "range ms"], rows)


@block("bench-codes-accuracy")
def bench_codes_accuracy() -> str:
    rows = [[r["code"], r["n"], r["s"], r["load"], f"{r['load_overhead']:.2f}",
             r["straggler_sets"], f"{r['worst_relative_error']:.1e}",
             f"{r['worst_condition']:.3g}"]
            for r in load("bench_codes.json")["accuracy"] if "skipped" not in r]
    return table(["code", "n", "s", "load", "load overhead", "straggler sets",
                  "worst relative error", "worst condition"], rows)


@block("cohort-scale")
def cohort_scale() -> str:
    d = load("cohort_scale.json")
    rows = d["rows"]
    used = [r["clients_used"] for r in rows]
    wall = [r["wall_s"] for r in rows]
    mem = [r["peak_traced_mb"] for r in rows]
    err = max(r["relative_error_vs_oracle"] for r in rows)
    exact = sum(r["decode"] == "exact" for r in rows)
    return (f"{d['nodes']:,} nodes, cohorts of {d['cohort']}, s = {d['s']}, a "
            f"{d['model_params']}-parameter model, {len(rows)} rounds: {exact} exact, decoded "
            f"from {min(used)}–{max(used)} replies, largest relative difference to numpy FedAvg "
            f"over the cohort {err:.1e}; wall time per round {min(wall):.1f}–{max(wall):.1f} s; "
            f"peak traced memory per round {min(mem):.1f}–{max(mem):.1f} MB.")


@block("bench-dp")
def bench_dp() -> str:
    rows = [[r["model"], r["update"], r["dp"], f"{r['seconds'] * 1e3:.2f}",
             f"{r['ratio_vs_none']:.2f}×"] for r in load("bench_dp.json")["rows"]]
    return table(["model", "update", "dp", "ms per partition update", "vs no DP"], rows)


@block("bench-adaptive")
def bench_adaptive() -> str:
    full = load("bench_adaptive.json")
    d = full["decision"]
    cost = table(["what", "value"], [
        ["clients, s_max, candidate codes, partitions per client",
         f"{d['n']}, {d['s_max']}, {d['candidates']}, {d['storage']}"],
        ["placement and decode rules built once", f"{d['build_s']:.2f} s"],
        [f"refit after {d['rounds']} rounds", f"{d['refit_ms']:.0f} ms"],
        ["choose_s per decision", f"{d['choose_ms']:.1f} ms ({d['choose_over_fedavg']:.2f}× "
                                  f"FedAvg's aggregate_train on {d['n']} replies of a "
                                  f"{d['fedavg_params']:,}-float model: "
                                  f"{d['fedavg_ms']:.0f} ms)"],
        ["latency-state write (once per round)",
         f"{d['state_write_ms']:.1f} ms ({d['state_write_over_fedavg']:.2f}× that aggregation)"],
        ["latency-state read (once per run)",
         f"{d['state_read_ms']:.1f} ms, {d['state_bytes'] / 1e6:.1f} MB"],
    ])
    rows = []
    for latency, c in full["closed_loop"].items():
        best = c["best_fixed"]
        rows.append([latency, f"{c['adaptive_mean_round_s']:.2f} s",
                     f"s = {best}: {c['fixed_mean_round_s'][str(best)]:.2f} s",
                     f"{c['adaptive_over_best_fixed']:.2f}×",
                     ", ".join(str(v) for v in c["path"][:8]) + ", …"])
    loop = table(["latency", "auto: mean round", "best fixed s (Monte Carlo mean)",
                  "auto / best fixed", "chosen s, first rounds"], rows)
    return cost + "\n\nClosed loop:\n\n" + loop


# ---------------------------------------------------------------- theory and codes
@block("matmul-speedup")
def matmul_speedup() -> str:
    d = load("matmul_speedup.json")
    rows = []
    for c in d["curves"].values():
        rows.append([f"{c['rate']:g}", f"{c['uncoded']:.4f}", c["best_k"],
                     f"{c['best_speedup']:.2f}×", c["gc_best_s"], f"{c['gc_best_speedup']:.2f}×"])
    reg = d["regression"]
    sp = reg["speedup_vs_uncoded"]
    return (table(["rate", "uncoded E[T]", "best k", "MDS speedup", "best GC s", "GC speedup"],
                  rows)
            + f"\n\nOne least-squares problem (n = {reg['n']}, rate {reg['rate']:g}, "
            f"{reg['iterations']} iterations, identical iterates): coded mat-vecs "
            f"(k = {reg['k']}) {sp['mds-matvec']:.2f}× faster than uncoded, gradient coding "
            f"(s = {reg['s']}) {sp['gradient-coding']:.2f}×.")


@block("speedup-vs-s")
def speedup_vs_s() -> str:
    d = load("speedup_vs_s.json")
    rows = []
    for n, curve in d["curves"].items():
        s = curve["s"]
        fifth = s.index(min(s, key=lambda v: abs(v - int(n) / 5)))
        cells = [n, f"{curve['load_independent'][fifth]:.2f}× (s = {s[fifth]})"]
        for key in ("load_independent", "load_scaled", "load_scaled_heavy_tail"):
            best = max(range(len(s)), key=lambda i: curve[key][i])
            cells.append(f"{curve[key][best]:.2f}× (s = {s[best]})")
        rows.append(cells)
    return table(["N", "load-independent Exp(1), s ≈ N/5", "best s, load-independent",
                  "best s, load-scaled", "best s, load-scaled, random part 100× the shift"],
                 rows)


@block("latency-vs-s")
def latency_vs_s() -> str:
    d = load("latency_vs_s.json")
    rows = []
    for name, model in d["models"].items():
        for s, m in model["measured"].items():
            closed = model["closed_form"][d["s"].index(int(s))] if int(s) in d["s"] else None
            rows.append([name, s, f"{m['first_round']:.2f}", f"{m['later_rounds']:.2f}",
                         f"{model['frc_monte_carlo'][s]:.2f}",
                         "-" if closed is None else f"{closed:.2f}"])
    return table(["latency", "s", "measured first round", "measured later rounds",
                  "FRC group rule (Monte Carlo)", "(n−s)-th arrival (closed form)"], rows)


@block("regime-map")
def regime_map() -> str:
    d = load("regime_map.json")
    pays = sum(sp > 1.0 for row in d["speedup"] for sp in row)
    cells = sum(len(row) for row in d["speedup"])
    rows = [[f"{c:.3g}", *(f"{sp:,.0f}× (s={s})" if sp >= 100 else f"{sp:.3g}× (s={s})"
                           for sp, s in zip(sp_row, s_row, strict=True))]
            for c, sp_row, s_row in zip(d["partition_cost"], d["speedup"], d["best_s"],
                                        strict=True)]
    return (f"n = {d['n']}, {d['p']:.0%} slow clients, {d['samples']:,} Monte Carlo samples "
            f"per cell: coding pays in {pays} of {cells} cells. Rows: compute cost `c` per "
            f"partition over the mean delay; columns: the slow clients' slowdown; a cell: the "
            f"best speed-up over uncoded and its `s`.\n\n"
            + table(["c \\ slowdown", *(f"{v:.3g}×" for v in d["slowdown"])], rows))


@block("deployment-breakdown")
def deployment_breakdown() -> str:
    d = load("deployment_breakdown.json")
    rows = []
    for n, runs in d["runs"].items():
        for name, run in runs.items():
            m = run["median_steady"]
            rows.append([n, name, f"{m['round_s']:.1f}",
                         f"{run['flower_share_s']:.1f}" if "flower_share_s" in run else "-",
                         f"{run['ours_share_s']:.2f}" if "ours_share_s" in run else "-",
                         f"{m.get('clientapp_start_s', 0):.1f}",
                         f"{m.get('app_import_s', 0) + m.get('mod_import_s', 0):.1f}",
                         f"{m.get('mod_overhead_s', 0):.3f}",
                         f"{m.get('server_wrapper_s', 0):.3f}",
                         f"{run.get('round1_handshake_s', 0):.1f}",
                         f"{run['pull_calls']:,}" if "pull_calls" in run else "-"])
    return (f"{d['rounds']} rounds, `{d['code']}` with s = {d['s']}; medians of the rounds "
            f"after the first (seconds):\n\n"
            + table(["SuperNodes", "run", "round", "Flower's share", "ours", "ClientApp start",
                     "imports (app + mod)", "mod's own work", "wrapper", "round-1 handshake",
                     "SuperLink pulls per job"], rows))


@block("approx-error")
def approx_error() -> str:
    d = load("approx_error.json")
    rows = []
    for i, r in enumerate(d["r"]):
        rows.append([r, *(f"{d['mean_error'][k][i]:.3g}" for k in d["mean_error"]),
                     f"{d['frc_closed_form'][i]:.3g}"])
    return table(["stragglers", *d["mean_error"], "FRC closed form"], rows)


@block("calculator-seeds64")
def calculator_seeds64() -> str:
    d = load("calculator_seeds64.json")
    rows = [[f"{v:.1f}" if isinstance(v, float) else str(v) for v in r.values()]
            for r in d["rows"]]
    best = d["best"]
    return (table(list(d["rows"][0]), rows)
            + f"\n\nBest: `{best['code']}` at s = {best['s']}, expected round time "
            f"{best['time']:.1f} ({best['speedup']:.2f}× uncoded).")


# ---------------------------------------------------------------- test strength
@block("mutation")
def mutation() -> str:
    rows = []
    for module, e in load("mutation.json").items():
        if not isinstance(e, dict) or "killed" not in e or "total" not in e:
            continue
        rows.append([module, f"{e['killed']}/{e['total']}", f"{e['killed'] / e['total']:.2f}",
                     "yes" if e.get("full_population") else
                     f"sample of {e.get('population', '?')}",
                     e.get("killed_since_by_hand", 0), e.get("equivalent", 0),
                     "-" if e.get("score_excluding_equivalent") is None
                     else f"{e['score_excluding_equivalent']:.3f}"])
    return table(["module", "killed / total", "score", "full population",
                  "killed since by a test added after the run", "equivalent",
                  "score over non-equivalent, hand kills counted"], rows)


@block("coverage")
def coverage() -> str:
    cov, alone = load("coverage.json"), load("tests_alone.json")
    return (f"Line coverage of `fl_gradcode` {cov['fl_gradcode']:.1f}% "
            f"(`results/coverage.json`, per module in the JSON); every test function alone in "
            f"a fresh interpreter: {alone['passed']}/{alone['total']} passed at the last run "
            f"(`results/tests_alone.json`, the failures and their fixes listed there).")


# ---------------------------------------------------------------- options (config table)
def _from_config(name: str) -> str | None:
    try:
        import fl_gradcode.config as config
    except ImportError:
        return None
    fn = getattr(config, name, None)
    return None if fn is None else fn().strip("\n")


@block("options")
def options() -> str | None:
    return _from_config("options_markdown")


@block("codes")
def codes() -> str | None:
    return _from_config("codes_markdown")


@block("code-names")
def code_names() -> str:
    from fl_gradcode.codes import available_codes

    return "Registered codes (`fl_gradcode.codes.available_codes()`): " + ", ".join(
        f"`{name}`" for name in available_codes()) + "."


def _coding_figure_data() -> list[tuple[str, float, float]]:
    data = load(TTA)
    return [(k, data["table"][k]["exact"]["speedup_vs_uncoded"],
             data["table"][k]["auto"]["speedup_vs_uncoded"]) for k in _no_dp(data)]


@block("coding-figure")
def coding_figure() -> str:
    """The README's figure with a digest of the values it is drawn from: when the JSON changes,
    ``--check`` reports this block stale and a rewrite redraws the figure."""
    digest = hashlib.sha256(json.dumps(_coding_figure_data()).encode()).hexdigest()[:16]
    return (f"![speed-up to the target accuracy over uncoded FedAvg, per setting]"
            f"({FIGURE_CODING})\n<!-- drawn by experiments/make_docs.py from "
            f"results/{TTA}, data {digest} -->")


# ---------------------------------------------------------------- figures
def draw_coding_figure(path: Path) -> None:
    """Speed-up over uncoded FedAvg to the target accuracy, per setting (exact, auto)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    data = load(TTA)
    rows = _coding_figure_data()
    settings = [r[0] for r in rows]
    x = np.arange(len(settings))
    fig, ax = plt.subplots(figsize=(10, 3.6))
    for i, label in enumerate(("fixed exact code at s_max", 's="auto"')):
        ax.bar(x + (i - 0.5) * 0.38, [r[1 + i] for r in rows], 0.38, label=label)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_yscale("log")
    ticks = [0.25, 0.5, 1, 2, 4, 8, 16, 32]
    ax.set_yticks(ticks, [f"{v:g}×" for v in ticks])
    ax.minorticks_off()
    ax.set_xticks(x, settings, rotation=35, ha="right", fontsize=7)
    ax.set_ylabel(f"speed-up to {data['target']:.0%} vs uncoded")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


# ---------------------------------------------------------------- driver
def render(text: str, page: str) -> tuple[str, list[str]]:
    """``text`` with every block re-rendered, and the names of the stale blocks."""
    stale: list[str] = []

    def one(match: re.Match) -> str:
        name = match["name"]
        fn = RENDERERS.get(name)
        if fn is None:
            stale.append(f"{page}: {name} (no renderer)")
            return match[0]
        body = fn()
        if body is None:
            return match[0]
        new = match["open"] + body.strip("\n") + "\n" + match["close"]
        if new != match[0]:
            stale.append(f"{page}: {name}")
        return new

    return BLOCK.sub(one, text), stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="rewrite nothing; exit 1 listing the stale blocks")
    args = parser.parse_args(argv)
    stale_all: list[str] = []
    for path in PAGES:
        text = path.read_text()
        new, stale = render(text, str(path.relative_to(ROOT)))
        stale_all += stale
        if not args.check and new != text:
            path.write_text(new)
    figure = ROOT / FIGURE_CODING
    if args.check:
        if not figure.exists():
            stale_all.append(f"{FIGURE_CODING} (missing figure)")
        for line in stale_all:
            print("stale:", line)
        return 1 if stale_all else 0
    draw_coding_figure(figure)
    for line in stale_all:
        print("rewrote:", line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
