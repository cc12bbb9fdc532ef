"""Time-to-accuracy blocks: the main and adaptive tables of docs/results.md and
docs/adaptive.md, from results/time_to_accuracy*.json."""

from __future__ import annotations

import numpy as np

from tools.docgen.core import block, ci, load, num, table

TTA = "time_to_accuracy.json"


def run_time_to_target(run: dict, target: float) -> float | None:
    """The first virtual time at which one run's test accuracy reached ``target`` (``None``:
    never), read from its curve."""
    return next((float(t) for t, a in zip(run["virtual_s"], run["accuracy"], strict=True)
                 if a is not None and a >= target), None)


def paired_speedup(data: dict, setting: str, method: str, reference: str) -> float | None:
    """How many times sooner ``method`` reached the target than ``reference`` in
    ``setting``: the geometric mean over seeds of the per-seed ratios reference / method
    (the seeds where both reached it; ``None``: no such seed). A ratio of mean times lets
    one slow seed carry the mean."""
    runs = data["runs"][setting]
    if method not in runs or reference not in runs:
        return None
    ratios = [r / m for ref, met in zip(runs[reference], runs[method], strict=True)
              if (r := run_time_to_target(ref, data["target"])) is not None
              and (m := run_time_to_target(met, data["target"])) is not None]
    return float(np.exp(np.mean(np.log(ratios)))) if ratios else None


def _seeds(data: dict) -> str:
    return ", ".join(str(x) for x in data["seeds"])


def tta_cell(entry: dict, speed: bool = True) -> str:
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


def no_dp(data: dict) -> list[str]:
    return [k for k in data["table"] if "+DP" not in k]


def _rival_cell(entry: dict | None, seeds: int) -> str:
    """The drop-stragglers cell: ``tta_cell``, and on how many seeds it reached the target when
    not on all ("-": not run in this setting)."""
    if entry is None:
        return "-"
    reached = entry.get("reached", seeds)
    note = (f" on {reached} of {seeds} seeds"
            if 0 < reached < seeds and entry.get("time_to_target_mean") is not None else "")
    return tta_cell(entry) + note


@block("tta-main")
def tta_main() -> str:
    data = load(TTA)
    rows = []
    # Flower's FedAvg dropping stragglers at a deadline: a column once the JSON has it
    rival = any("drop-stragglers" in row for row in data["table"].values())
    for setup, row in data["table"].items():
        nested = _best(row, "nested s=")
        auto = row["auto"]
        nested_cell = "never" if nested is None else (
            f"{nested[0][len('nested '):]}: {tta_cell(nested[1])}")
        if auto.get("vs_best_fixed") is None or auto.get("time_to_target_mean") is None:
            vs_fixed, vs_uncoded = "-", "-"
        else:
            vs_fixed = f"{auto['vs_best_fixed']:.2f} ({auto['best_fixed']})"
            vs_uncoded = f"{1 / auto['speedup_vs_uncoded']:.2f}"
        rows.append([setup, *(tta_cell(row[k]) for k in
                              ("uncoded", "ignore-stragglers", "exact", "approx-deadline")),
                     *([_rival_cell(row.get("drop-stragglers"), len(data["seeds"]))]
                       if rival else []),
                     nested_cell, tta_cell(auto), vs_fixed, vs_uncoded])
    return table(["setup", "uncoded", "ignore-stragglers", "exact", "approx-deadline",
                  *(["drop-stragglers (Flower FedAvg, deadline)"] if rival else []),
                  "best nested s=v", "auto", "auto vs best fixed", "auto vs uncoded"], rows)


@block("tta-same-information")
def tta_same_information() -> str:
    data = load(TTA)
    rows = []
    for setup in no_dp(data):
        row = data["table"][setup]
        auto = row["auto"]
        cells = [setup]
        for prefix in ("nested s=", "nested-fit s="):
            best = _best(row, prefix)
            cells.append("never" if best is None else
                         f"{best[0].split()[-1]}: {tta_cell(best[1], speed=False)}")
        cells.append(tta_cell(auto, speed=False))
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
    for setup in no_dp(data):
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


def adaptive_vs(auto: dict, key: str) -> str:
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
    for setup in no_dp(data):
        for scheme, entry in data["table"][setup].items():
            if not scheme.startswith("auto"):
                continue
            rows.append([setup, scheme, tta_cell(entry),
                         f"{entry['exact_rounds']:.1f}",
                         adaptive_vs(entry, ""), adaptive_vs(entry, "same_information"),
                         adaptive_vs(entry, "with_deadline")])
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
    for setup in no_dp(data):
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
    for setup in no_dp(data):
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
    for setup in no_dp(data):
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
    total = sum(len(r["decode"]) for k in no_dp(data) if "auto-deadline" in data["table"][k]
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
            rows.append([setup, scheme, tta_cell(e, speed=False),
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
        rows.append([setup, tta_cell(auto) if auto else "-",
                     adaptive_vs(auto, ""),
                     "-" if auto.get("seeds_compared") is None else str(auto["seeds_compared"]),
                     adaptive_vs(auto, "same_information"),
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
    tab, settings = data["table"], no_dp(data)
    auto = {k: tab[k]["auto"] for k in settings}
    gaps = [tab[k]["auto"]["max_accuracy_gap_to_uncoded"] for k in tab]
    speed = {k: paired_speedup(data, k, "auto", "uncoded") for k in auto}
    speed = {k: v for k, v in speed.items() if v is not None}
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
        f"run over all {len(tab)} settings (DP included): {max(gaps):g}; "
        + (f"faster than uncoded to {data['target']:.0%} in every setting without DP"
           if speed[lo] > 1 else f"to {data['target']:.0%}, without DP")
        + f", from {speed[lo]:.2f}× (`{lo}`) to {speed[hi]:.2f}× (`{hi}`) as fast "
        f"(geometric means of the per-seed ratios, seeds {_seeds(data)}).",
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
            cells = ", ".join(f"`{k}` {num(v['to_target'])} / {num(v['to_final_model'])}"
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



@block("tta-setup")
def tta_setup() -> str:
    """The experiment's fixed inputs, from the JSON: target, seeds, rounds, compute, DP, latency."""
    data = load(TTA)
    base, dp = data["base"], data["dp"]
    rows = [[name, ", ".join(f"{k.removeprefix('latency-')} "
                             + (format(v, "g") if isinstance(v, float) else str(v))
                             for k, v in spec.items() if k != "latency")]
            for name, spec in data["latencies"].items()]
    return (f"Target accuracy {data['target']:.0%} (test accuracy; \"time to the target\" below), "
            f"{len(data['seeds'])} seeds, {data['rounds']} rounds, {base['model']} on "
            f"{base['dataset']} with {base['update']} updates (learning rate {base['lr']:g}), "
            f"modelled compute {base['partition-cost-s']:g} s per partition (a coded client "
            f"pays `s+1` of them); `+DP` settings: {dp['dp']}-level DP, noise multiplier "
            f"σ = {dp['noise-multiplier']:g}, clip norm C = {dp['clip-norm']:g}. Latency "
            f"settings (run-config `latency-*` keys):\n\n"
            + table(["latency", "parameters"], rows))


@block("tta-warm-start-s")
def tta_warm_start_s() -> str:
    """Where the warm runs start and how long they stay at ``s_max``: per seed, from the runs."""
    data = load(TTA)
    rows = []
    for setup in no_dp(data):
        if "auto-warm" not in data["table"][setup]:
            continue
        s_max = int(setup.split()[1][2:])
        cells = [setup]
        for key in ("s", "at_max"):
            for scheme in ("auto", "auto-warm"):
                runs = _runs(setup, scheme)
                values = [r["s"][0] if key == "s" else sum(v == s_max for v in r["s"])
                          for r in runs]
                cells.append(", ".join(str(v) for v in values))
        rows.append(cells)
    return table(["setup", "round-1 s per seed: auto", "auto-warm",
                  f"rounds at s_max per seed (of {data['rounds']}): auto", "auto-warm"], rows)
