"""Blocks of every other experiment: robustness, sampled cohorts, performance, theory and
codes, test strength."""

from __future__ import annotations

from tools.docgen.core import block, ci, command, load, num, table


# ---------------------------------------------------------------- robustness
@block("fault-injection")
def fault_injection() -> str:
    d = load("fault_injection.json")
    # the invariants the suite checks, each a guarantee stated in docs/integrity.md,
    # docs/membership.md or docs/privacy.md (a key missing from an older file: not checked)
    checked = [
        ("crashes", "crashes"),
        ("corrupted_models", "corrupted models"),
        ("wrong_models_applied_as_verified", "wrong models applied as verified"),
        ("runs_ended_by_node_failure", "runs ended by a node's failure"),
        ("exact_rounds_with_partition_missing", "rounds labelled exact with a partition missing"),
        ("honest_nodes_punished", "honest nodes quarantined or excluded"),
        ("raw_releases_by_dp_nodes", "raw releases by a node with a DP policy"),
    ]
    counts = ", ".join(f"{d[key]} {label}" for key, label in checked if key in d)
    return (f"`tests/faults/fault_injection.py` (`results/fault_injection.json`): "
            f"{d['scenarios']} randomized fault scenarios, {len(d['faults_injected'])} fault "
            f"kinds, {counts} "
            f"({d['faults_injected_total']:,} faults injected over {d['rounds']:,} rounds, "
            f"{len(d['invariant_violations'])} invariant violations).")


# ---------------------------------------------------------------- sampled cohorts
@block("sampled-cohorts")
def sampled_cohorts() -> str:
    d = load("sampled_cohorts.json")
    schemes = list(d["schemes"])
    rows = []
    for latency, row in d["table"].items():
        rows.append([latency, *(("not on every seed"
                                 if row[s]["time_to_target_mean"] is None else
                                 f"{row[s]['time_to_target_mean']:.1f} s")
                                + f" ({row[s]['mean_round_s']:.2f} s)" if s in row else "-"
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
    if "drop-stragglers" in schemes:
        note += ("\n\ndrop-stragglers: Flower's own FedAvg on the same cohorts, averaging the "
                 "replies in by a round deadline (3 times the 75th percentile of an uncoded "
                 "client's time: `common.rival_deadline`) and dropping the rest.")
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
    # Flower's FedAvg dropping stragglers at a deadline, once the JSON has it
    schemes = ["uncoded", "exact", "comm-efficient",
               *(["drop-stragglers"] if any(r["scheme"] == "drop-stragglers"
                                            for r in d["table"]) else [])]

    def cell(r: dict) -> str:
        if r is None:
            return "-"
        time_to = "never" if r["time_to_target"] is None else f"{r['time_to_target']:.2f}"
        return f"{time_to} ({r['round_s']:.3f} s)"

    for upload, r in by.items():
        ce = r["comm-efficient"]
        rows.append([f"{upload:g}", *(cell(r.get(s)) for s in schemes),
                     f"{ce['speedup_vs_exact']:.2f}× (round {ce['round_speedup_vs_exact']:.2f}×)",
                     f"{ce['bytes_vs_uncoded']:.2f} / {r['exact']['bytes_vs_uncoded']:.2f}"])
    first = d["table"][0]
    setup = (f"n = {d['n']}, s = {d['s']}, m = {d['m']}, {d['latency']} stragglers, modelled "
             f"compute {d['partition_cost_s']:g} s per partition, "
             f"{first['rounds']} rounds, {len(d['seeds'])} seeds; time to "
             f"{first['target']:.0%} accuracy (virtual s) and, in brackets, the mean round "
             f"time:\n\n")
    names = {"exact": "exact (grouped-rs)",
             "drop-stragglers": "drop-stragglers (Flower FedAvg, deadline)"}
    note = ""
    drops = [r for r in d["table"] if r["scheme"] == "drop-stragglers"]
    if drops:
        finals = {r["scheme"]: r["final_accuracy"] for r in d["table"]
                  if r["upload_s"] == drops[0]["upload_s"]}
        note = (f"\n\ndrop-stragglers: Flower's own FedAvg averaging the replies in by a round "
                f"deadline (3 times the 75th percentile of an uncoded client's time, plus one "
                f"model's upload: `common.rival_deadline`), dropping "
                f"{'–'.join(sorted({format(r['late_dropped_per_round'], '.2f') for r in drops}))}"
                f" replies a round on average; final accuracy {finals['drop-stragglers']:.3f} "
                f"(uncoded {finals['uncoded']:.3f}).")
    return setup + table(["upload s (one full model)", *(names.get(s, s) for s in schemes),
                          "comm-eff. vs exact (speed-up)",
                          "bytes per round vs uncoded (comm-eff. / exact)"], rows) + note


@block("bench-aggregation")
def bench_aggregation() -> str:
    d = load("bench_aggregation.json")
    rows = []
    for r in d["rows"]:
        wire = r["wire"] if r.get("wire_requested", "auto") == "auto" else f"{r['wire']} (asked)"
        rows.append([f"{r['params']:.0e}".replace("e+0", "e"), r["n"], r["s"], r["code"], wire,
                     f"{r['replies']} / {r['replies_read']}", f"{r['fedavg_s']:.3f}",
                     f"{r['coded_s']:.3f}", f"{r['coded_s'] / r['fedavg_s']:.2f}",
                     f"{r['bytes_coded'] / r['bytes_fedavg']:.1f}",
                     f"{r['reaction_ms_p50']:.1f} / {r['result_ms_p50']:.0f}",
                     f"{r['peak_bytes'] / r['peak_bound_bytes']:.2f}",
                     f"{r['relative_error']:.1e}", f"{r['load_avg'][0]:.1f}"])
    out = table(["params", "n", "s", "code", "wire", "replies / read", "FedAvg s", "coded s",
                 "coded / FedAvg", "bytes / FedAvg", "reaction / result ms (p50)",
                 "peak / bound", "rel. error", "load"], rows)
    skipped = {(s["code"], s["n"], s["s"], s["reason"]): None for s in d.get("skipped", [])}
    if skipped:
        out += "\n\nNot measured (refused by the code or the memory guard): " + "; ".join(
            f"{code} n={n} s={s}: {reason}" for code, n, s, reason in skipped) + "."
    out += "\n\nRuns: " + "; ".join(f"`{command(c)}`" for c in d.get("runs", [])) + "."
    return out


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
    best, model = d["best"], d["model_args"]
    setup = (f"{d['n']} workers, {d['latency']} latency: {model['p']:.0%} stragglers slowed "
             f"{model['slowdown']:g}×, storage up to `s+1` partitions; expected round time per "
             f"code:\n\n")
    return (setup + table(list(d["rows"][0]), rows)
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



@block("first-hour")
def first_hour() -> str:
    """The first-hour regimes (experiments/first_hour.py): per regime and seed, how much
    sooner the coded run reaches the target than wait-for-all and drop-stragglers."""
    data = load("first_hour.json")
    rows = []
    for name, regime in data["regimes"].items():
        role = ("`--preset coding-wins`" if name == data["recommended"] else
                "`--preset coding-loses`" if name == data["losing_preset"] else "")
        config = " ".join(f"{k}={v}" for k, v in regime["run_config"].items()) or "(base)"
        per_seed = regime["per_seed"]
        rows.append([
            f"`{name}` {role}".strip(), f"`{config}`",
            " / ".join(num(s["speedup_vs_wait"]) for s in per_seed),
            " / ".join(num(s["speedup_vs_drop"]) for s in per_seed),
            " / ".join(f"{s['coded']['final']:.3f} vs {s['drop-stragglers']['final']:.3f}"
                       for s in per_seed),
            "yes" if regime["wins"] else "no"])
    seeds = ", ".join(str(s) for s in data["seeds"])
    base = " ".join(f"{k}={v}" for k, v in data.get("base", {}).items())
    changed = _defaults_changed_since(
        {**data.get("base", {}), **data["regimes"][data["recommended"]]["run_config"]})
    since = (" except " + ", ".join(f"`{k}={v}` (then {was})" for k, v, was in changed)
             + ", set since by later rules") if changed else ""
    return (f"{data['num_clients']} clients, seeds {seeds}; target: {data['target']}; goal: "
            f"{data['goal']}. Every regime overrides the base `{base}` (the run-config "
            f"defaults when it was measured); today's defaults are the base with "
            f"`{data['recommended']}`'s overrides{since}.\n\n" + table(
                ["regime", "run config (over the base)", "× sooner than wait-for-all, "
                 "per seed", "× sooner than drop-stragglers, per seed",
                 "final accuracy, coded vs drop-stragglers", "meets the goal"], rows))


def _defaults_changed_since(measured: dict) -> list[tuple[str, object, object]]:
    """The run-config keys whose default today (the key table, which pyproject.toml
    mirrors) differs from ``measured``: ``(key, today, then)``."""
    from fl_gradcode.config import merge_config

    today = merge_config({})
    return [(k, today[k], v) for k, v in measured.items()
            if k in today and today[k] != v]
