"""The performance blocks: the client's cost (``bench_client.json``) and the end-to-end and
scale runs in Flower's simulation engine (``bench_end_to_end.json``)."""

from __future__ import annotations

from tools.docgen.core import block, ci, command, load, num, table

CLIENT = "bench_client.json"
E2E = "bench_end_to_end.json"
AGGREGATION = "bench_aggregation.json"


def _mb(value: float) -> str:
    return f"{value / 1e6:,.0f} MB"


def _load(x: list[float] | None) -> str:
    return "-" if not x else f"{x[0]:.1f}"


def _median_load(blocks: list[dict]) -> str:
    """The median 1-minute load average over the rounds of ``blocks``."""
    loads = sorted(r["loadavg"][0] for b in blocks for r in b["rows"] if r.get("loadavg"))
    return "-" if not loads else f"{loads[len(loads) // 2]:.1f}"


@block("perf-client")
def perf_client() -> str:
    d = load(CLIENT)
    rows = []
    for r in d["rows"]:
        c = r["components_s"]
        rows.append([
            f"{r['params'] / 1e6:.1f}M", r["s"], r["wire"], r.get("local_epochs", 1),
            num(r["app_partition_s"], ".3f"),
            num(r["mod_overhead_s"], ".3f"), f"{r['mod_overhead_vs_partition']:.0%}",
            f"{c['deserialize']:.3f} / {c['encode']:.3f} / {c['serialize']:.3f}",
            num(r["peak_extra_models"], ".1f"),
            f"{r['reply_bytes'] / r['plain_reply_bytes']:.2f}×", f"{r['max_rel_error']:.0e}",
            _load(r.get("loadavg"))])
    goal = d["goal"]["mod_overhead_vs_partition"]
    return (f"`{command(d['command'])}` (code `{d['code']}`, {d['rows'][0]['k']} partitions, "
            f"medians of {d['rows'][0]['reps']} interleaved repetitions; goal: mod overhead ≤ "
            f"{goal:.0%} of one partition's training)\n\n" + table(
                ["params", "s", "wire", "local epochs", "app s / partition", "mod overhead s",
                 "overhead / partition", "deserialize / encode / serialize s",
                 "peak beyond app (models)", "reply / FedAvg reply", "rel. error",
                 "load (1 min)"], rows))


@block("perf-end-to-end")
def perf_end_to_end() -> str:
    d = load(E2E)
    ns, st = d["no_stragglers"], d["stragglers"]
    head = table(
        ["n", "s", "params", "actors", "FedAvg round s", "coded round s", "coded / FedAvg",
         "FedAvg compute s / actor", "overhead beyond s+1× compute", "coded vs FedAvg model",
         "load (1 min)"],
        [[ns["n"], ns["s"], f"{ns['params'] / 1e6:.1f}M", ns["actors"],
          num(ns["fedavg_round_s"]), num(ns["coded_round_s"]), f"{ns['coded_vs_fedavg']:.2f}×",
          num(ns["fedavg_compute_s"]), f"{ns['overhead_beyond_compute']:+.0%}",
          f"{ns['max_rel_diff_vs_fedavg']:.0e}", _median_load(ns["blocks"])]])
    times = st["time_to_target_s"]

    def ratio(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}×"

    tail = table(
        ["n", "s", "latency", "target", "coded (virtual s)", "wait-for-all (virtual s)",
         "drop-stragglers (virtual s)", "speed-up vs wait-for-all", "vs drop-stragglers",
         "final accuracy (coded / drop-stragglers)"],
        [[st["n"], st["s"], st["latency"], f"{st['target']:.0%}", num(times["coded"], ".1f"),
          num(times["wait_for_all"], ".1f"), num(times["drop_stragglers"], ".1f"),
          ratio(st["speedup_vs_wait_for_all"]), ratio(st["speedup_vs_drop_stragglers"]),
          f"{st['final_accuracy']['coded']:.3f} / "
          f"{st['final_accuracy']['drop_stragglers']:.3f}"]])
    return (f"`{command(ns['command'])}`, Flower's simulation engine ({d['engine']}); without "
            f"stragglers (wall clock, medians over {ns['reps']} interleaved blocks of "
            f"{ns['rounds_per_block']} rounds, first round of each block excluded):\n\n"
            f"{head}\n\nWith stragglers ({st['clock']} clock, compute "
            f"{st['compute_cost_s']:g} s per partition, {st['rounds']} rounds):\n\n{tail}")


@block("perf-scale")
def perf_scale() -> str:
    sc = load(E2E)["scale"]
    return (f"{sc['nodes']:,} SuperNodes on {sc['actors']} actors, cohorts of {sc['cohort']}, "
            f"{sc['params']:,} parameters, medians over {sc['reps']} interleaved blocks of "
            f"{sc['rounds_per_block']} rounds (first round of each block excluded):\n\n"
            + table(["strategy", "round s", "app compute s / actor", "handshake s",
                     "peak RSS (process tree)", "load (1 min)"],
                    [["FedAvg", num(sc["fedavg_round_s"]), num(sc["app_compute_s"]["fedavg"]),
                      "-", _mb(sc["peak_rss_bytes"]["fedavg"]),
                      _median_load([b for b in sc["blocks"] if b["strategy"] == "fedavg"])],
                     [f"coded (`{sc['code']}`, s={sc['s']})", num(sc["coded_round_s"]),
                      num(sc["app_compute_s"]["coded"]), num(sc["coded_handshake_s"]),
                      _mb(sc["peak_rss_bytes"]["coded"]),
                      _median_load([b for b in sc["blocks"] if b["strategy"] == "coded"])]]))


@block("perf-summary")
def perf_summary() -> str:
    client, d = load(CLIENT), load(E2E)
    r = min(client["rows"], key=lambda row: (row["s"], row["wire"] != "model",
                                             row.get("local_epochs", 1)))
    longer = [row for row in client["rows"] if row.get("local_epochs", 1) > 1]
    more = "" if not longer else (
        f"; {longer[0]['mod_overhead_vs_partition']:.0%} with {longer[0]['local_epochs']} "
        "local epochs")
    ns, st, sc = d["no_stragglers"], d["stragglers"], d["scale"]
    speed = st["speedup_vs_wait_for_all"]
    return "\n".join([
        _aggregation_line(load(AGGREGATION)),
        f"- **Client**: for s+1={r['s'] + 1} partitions of a {r['params'] / 1e6:.0f}M-parameter "
        "CNN "
        f"the mod adds {r['mod_overhead_s']:.2f} s ({r['mod_overhead_vs_partition']:.0%} of "
        f"one partition's training, one local epoch{more}) and "
        f"{r['peak_extra_models']:.1f} models of memory beyond "
        f"the app's own; its reply is {r['reply_bytes'] / r['plain_reply_bytes']:.2f}× a "
        "FedAvg reply.",
        f"- **Round, no stragglers** (n={ns['n']}, {ns['params'] / 1e6:.1f}M-parameter CNN): "
        f"{ns['coded_vs_fedavg']:.2f}× FedAvg's wall time, "
        f"{ns['overhead_beyond_compute']:+.0%} beyond the s+1× compute (s={ns['s']}).",
        f"- **Stragglers** (virtual clock): {st['target']:.0%} test accuracy "
        + ("not reached by both runs." if speed is None else
           f"{speed:.2f}× sooner than wait-for-all FedAvg."),
        f"- **Scale**: {sc['nodes']:,} SuperNodes on {sc['actors']} Ray actors, cohorts of "
        f"{sc['cohort']}, s={sc['s']}: {sc['coded_vs_fedavg']:.2f}× FedAvg's round time, "
        "peak RSS "
        f"{_mb(sc['peak_rss_bytes']['coded'])} vs {_mb(sc['peak_rss_bytes']['fedavg'])}.",
    ])


def _aggregation_line(d: dict) -> str:
    """Worst row of each measure over every code and setting of ``bench_aggregation.json``;
    the default code's bytes, and where ``wire="auto"`` chose float64 (the model's dtype not
    accurate enough) its bytes and the error of the model's dtype asked for instead."""
    from fl_gradcode.config.keys import KEYS

    rows = d["rows"]
    default = next(k.default for k in KEYS if k.name == "code")
    own = [r for r in rows if r["code"] == default]
    wide = [r for r in rows if r["wire_requested"] == "auto" and r["wire"] == "float64"]
    places = []
    for code in sorted({r["code"] for r in wide}):
        auto = [r for r in rows if r["code"] == code and r["wire_requested"] == "auto"]
        chosen = [r for r in auto if r["wire"] == "float64"]
        places.append(code if len(chosen) == len(auto) else code + " at " + ", ".join(
            f"n={r['n']} s={r['s']}" for r in sorted(chosen, key=lambda r: (r["n"], r["s"]))
            if r["params"] == chosen[0]["params"]))
    asked = [r for r in rows if r["wire_requested"] == "model"]
    fallback = "" if not wide else (
        f"; float64 replies ({max(r['bytes_ratio'] for r in wide):.1f}× the bytes) where the "
        f"model's dtype is not accurate enough ({'; '.join(places)})"
        + ("" if not asked else ", the model's dtype on request at a relative error up to "
           f"{max(r['relative_error'] for r in asked):.0e}"))

    def values(key: str) -> str:
        return ", ".join(f"{v:.0e}".replace("e+0", "e") if v >= 1e5 else f"{v:g}"
                         for v in sorted({r[key] for r in rows}))

    return (
        f"- **Aggregation** ({', '.join(sorted({r['code'] for r in rows}))}; params "
        f"{values('params')}, n {values('n')}, s {values('s')}: {len(rows)} rows): the "
        f"server's decode takes at most {max(r['coded_over_fedavg'] for r in rows):.2f}× "
        f"Flower's FedAvg time on the same reply count, reaction at most "
        f"{max(r['reaction_ms_p50'] for r in rows):.1f} ms (p50); {default} (the default) "
        f"replies {max(r['bytes_ratio'] for r in own):.2f}× a FedAvg reply{fallback}."
    )


ASYNC_WALL = "bench_async_wallclock.json"
ASYNC_LABELS = {
    "flower-fedavg": "Flower's FedAvg (waits for every reply)",
    "coded": "coded rounds (`grouped-rs`, s = 1)",
    "fedbuff": "FedBuff (`asynchronous=true`, s = 0)",
    "fedbuff-replicated": "FedBuff over replicated partitions (`asynchronous=true`, s = 1)",
}


def _ratio(entry: dict, seeds: int) -> str:
    if entry["geomean"] is None:
        return "-"
    text = f"{entry['geomean']:.2f}×{ci(entry['ci95'])}"
    return text + ("" if entry["paired_seeds"] == seeds else f" ({entry['paired_seeds']}/{seeds})")


@block("perf-async-wallclock")
def perf_async_wallclock() -> str:
    d = load(ASYNC_WALL)
    st, summary = d["settings"], d["summary"]
    rows = []
    for method in st["methods"]:
        row = summary[method]
        median = row["median_time_to_target_s"]
        rows.append([ASYNC_LABELS.get(method, method),
                     f"{'never' if median is None else f'{median:.1f} s'} "
                     f"({row['reached']}/{row['seeds']})",
                     _ratio(row["ratio_to_flower_fedavg"], row["seeds"]),
                     _ratio(row["ratio_to_coded"], row["seeds"]),
                     _ratio(row["ratio_to_fedbuff"], row["seeds"]),
                     f"{row['median_final_accuracy']:.3f}"])
    head = table(["method", "median time to target (reached)", "÷ Flower's FedAvg",
                  "÷ coded rounds", "÷ FedBuff", "median final accuracy"], rows)
    seeds = st["seeds"]
    return (f"`python -m experiments.bench_async_wallclock`, Flower's simulation engine, wall "
            f"clock: n = {st['n']} SuperNodes, {st['rounds']} rounds (the asynchronous "
            f"methods: as many client updates, K = {st['buffer_size']}), target "
            f"{st['target']:.0%}, every method read once per {st['n']} client updates; "
            f"partition {', '.join(map(str, st['slow']))} sleeps "
            f"{st['slow_s']:g} s after every job, the others 0.05 s plus an exponential draw "
            f"of mean 0.15 s; seeds {seeds[0]}–{seeds[-1]} ({len(seeds)}), nothing tuned; "
            f"{d['wall_s'] / 60:.0f} min in all at {st['commit']}. Ratios: geometric mean of "
            f"the per-seed ratios of times to target [95 % interval], over the seeds both "
            f"reached it.\n\n"
            f"{head}")
