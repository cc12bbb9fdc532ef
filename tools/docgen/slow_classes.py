"""The ``slow-classes`` blocks: the extension of the benchmark in which only the persistently
slow clients hold some classes (run-config ``slow-classes``; ``experiments/grid.toml``,
amendment 8; ``results/compare_slow_classes_C_NxN.json``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tools.docgen.core import RESULTS, block, load, table
from tools.docgen.rivals import (
    GOAL_SPEEDUP,
    GOAL_TIME,
    SHOWN,
    Stats,
    best_method,
    is_code,
    median,
    method_label,
    method_stats,
    ratio_text,
    seconds,
    times_text,
    verdict,
)

#: The runs amendment 8 registers, in its order: (slow classes, n).
RUNS: tuple[tuple[int, int], ...] = ((2, 20), (1, 20), (2, 100))
#: A reading added after the runs: FedBuff (and auto) given four times the client updates.
LONGER = "compare_slow_classes_2_20x20_fedbuff120.json"
#: A sensitivity reading added after an audit: FedBuff unweighted (staleness exponent 0), with
#: the client updates of 30 and of 120 rounds.
UNWEIGHTED = ("compare_slow_classes_2_20x20_fedbuff_e0.json",
              "compare_slow_classes_2_20x20_fedbuff120_e0.json")
#: The rivals that do not code, as the grid's readings name them.
UNCODED = ("wait-for-all", "deadline", "deadline-best", "first-k", "fedbuff")


def _predated(settings: Mapping[str, Any]) -> list[str]:
    """The rules added to the grid file since a comparison's runs that they lacked (absent
    from its settings: FedBuff untuned, dropped work not stopped), unless its own
    ``rules_set`` chose them."""
    own = settings.get("rules_set", {})
    ran = set(settings.get("methods", []))
    out = []
    if "fedbuff" in ran and "tuning" not in settings.get("fedbuff", {}):
        out.append("fedbuff_tune")
    if ran & {"deadline", "deadline-best", "first-k"} \
            and "rivals_stop_dropped_work" not in settings:
        out.append("rivals_stop_dropped_work")
    if ran & {"auto", "auto-approximate"} and "auto_stop_at_decode" not in settings:
        out.append("auto_stop_at_decode")
    if any(":" in m for m in ran) and "codes_stop_at_decode" not in settings:
        out.append("codes_stop_at_decode")
    if "deadline-best" in ran and "deadline_grid_grown" not in settings:
        out.append("deadline_grid_extend")
    if any(":" in m for m in ran) and "codes_own_deadline" not in settings:
        out.append("codes_own_deadline")
    if "first-k" in ran and "tuning" not in settings.get("first_k", {}):
        out.append("first_k_tune")
    tuning = settings.get("fedbuff", {}).get("tuning")
    if "fedbuff" in ran and tuning and "extend" not in tuning:
        out.append("fedbuff_tune_extend")
    return [k for k in out if k not in own]


def rule_flags(settings: Mapping[str, Any]) -> str:
    """The ``--rule`` flags that run a comparison's rivals as its file ran them: its own
    ``rules_set``, and the rules it predates (:func:`_predated`) turned off."""
    rules = {**settings.get("rules_set", {}), **dict.fromkeys(_predated(settings), 0)}
    return "".join(f" --rule {k}={float(v):g}" for k, v in rules.items())


def predates(settings: Mapping[str, Any]) -> str:
    """``""``, or what a comparison's rivals lacked because its runs predate the grid file's
    rules added since (:func:`_predated`), as a parenthesis."""
    words = {"fedbuff_tune": "FedBuff untuned (amendment 12)",
             "rivals_stop_dropped_work": "the rivals' dropped work not stopped (amendment 11)",
             "auto_stop_at_decode": "auto's late work stopped at the deadline, not at the "
                                    "round's end (amendment 15)",
             "codes_stop_at_decode": "the fixed codes' late work stopped at the deadline, not "
                                     "at the round's end (amendment 19)",
             "codes_own_deadline": "each fixed code stopped at wait-for-all's stated deadline, "
                                   "not at the rule read from its own client times "
                                   "(amendment 21)",
             "deadline_grid_extend": "deadline-best's grid not grown past an edge pick "
                                     "(amendment 20)",
             "first_k_tune": "first-k's over-commitment c fixed a priori, not tuned on the "
                             "development seeds (amendment 18)",
             "fedbuff_tune_extend": "FedBuff's lists not grown past an edge pick "
                                    "(amendment 16)"}
    off = "; ".join(words[k] for k in _predated(settings))
    return f" (runs from before the rules: {off})" if off else ""


def file_name(classes: int, n: int) -> str:
    """The result file of the run with ``classes`` slow classes at ``n`` clients."""
    return f"compare_slow_classes_{classes}_{n}x{n}.json"


def _runs() -> list[tuple[int, int, dict[str, Any] | None]]:
    return [(c, n, load(file_name(c, n)) if (RESULTS / file_name(c, n)).exists() else None)
            for c, n in RUNS]


def _classes(classes: int) -> str:
    return f"{classes} class{'es' if classes > 1 else ''}"


def _row(label: str, method: str, cell: Mapping[str, Any],
         every: Mapping[str, Stats]) -> list[str]:
    stats, auto = every.get(method), every.get("auto")
    entry = cell.get("summary", {}).get(method)
    if stats is None:
        return [label, "not run", "-", "-"]
    return [label, f"{seconds(stats.median_time)} ({stats.reached}/{stats.seeds})",
            f"{100 * stats.median_final:.1f} %",
            "—" if method == "auto" else ratio_text(entry, auto)]


def _same_runs(cell: Mapping[str, Any], a: str, b: str) -> bool:
    def runs(m: str) -> list[tuple[Any, Any]]:
        return sorted((r["seed"], r["time_to_target"], r["final_accuracy"])
                      for r in cell["runs"] if r["method"] == m)
    return runs(a) == runs(b)


def best_code(cell: Mapping[str, Any]) -> tuple[str, list[str]] | None:
    """The fixed code with the lowest median time (then highest final accuracy, then name)
    and the other codes whose runs were the same to the last digit."""
    stats = method_stats(cell)
    codes = [m for m in stats if is_code(m)]
    code = best_method(stats, codes)
    if code is None:
        return None
    return code, [m for m in codes if m != code and _same_runs(cell, code, m)]


def fedbuff_span(cell: Mapping[str, Any]) -> tuple[float, int, int] | None:
    """``(median length of FedBuff's runs in virtual seconds, seeds whose FedBuff run ended
    before auto first reached the target (or auto never did), seeds paired)``: FedBuff stops
    when it has applied the cell's number of client updates, not after a time."""
    ends = {r["seed"]: r.get("total_virtual_s") for r in cell.get("runs", [])
            if r["method"] == "fedbuff"}
    autos = {r["seed"]: r["time_to_target"] for r in cell.get("runs", [])
             if r["method"] == "auto"}
    paired = [seed for seed in ends if seed in autos and ends[seed] is not None]
    if not paired:
        return None
    lengths = [float(ends[seed]) for seed in paired]
    before = sum(autos[seed] is None or float(ends[seed]) < float(autos[seed]) for seed in paired)
    return median(lengths), before, len(paired)


def _readings(cell: Mapping[str, Any]) -> list[str]:
    """The grid's two readings on one run (not part of the grid's verdict)."""
    v = verdict("", cell)
    out = []
    if v.auto is not None and v.best is not None:
        out.append(f"auto's median time is {times_text(v.time_ratio)} the best rival's "
                   f"({method_label(v.best)}): the grid's goal (at most {GOAL_TIME}×, final "
                   f"accuracy within half a point) is {'met' if v.met else 'not met'}")
    if v.uncoded is not None and v.speedup is not None:
        fast = v.fast
        entry = cell.get("summary", {}).get(v.uncoded, {})
        interval = (f" (per seed where both reached it: {ratio_text(entry, v.auto)})"
                    if entry.get("time_to_target_vs_auto", {}).get("geomean") is not None
                    else "")
        out.append(f"the best rival that does not code ({method_label(v.uncoded)}) took "
                   f"{times_text(v.speedup)} auto's median time{interval}: by the medians auto "
                   f"{'is' if fast else 'is not'} at least {GOAL_SPEEDUP:g}× faster")
    return out


def render_cell(classes: int, n: int, cell: Mapping[str, Any]) -> str:
    """One run of the extension: every rival of the grid's table, auto-approximate and the
    fixed code with the lowest median time, then the grid's two readings on it."""
    stats = method_stats(cell)
    code = best_code(cell)
    methods = ["auto", "auto-approximate", *SHOWN] + ([code[0]] if code else [])
    s = cell["settings"]
    labels = {"deadline-best": f"deadline-best ({s.get('deadline_best_s', 0):.2f} s)",
              "deadline": f"deadline, stated rule ({s.get('stated_deadline_s', 0):.2f} s)"}
    if code and code[1]:
        labels[code[0]] = f"{code[0]} (= {', '.join(code[1])})"
    rows = [_row(labels.get(m, method_label(m)), m, cell, stats) for m in methods if m in stats]
    seeds = s.get("seeds", [])
    head = (f"**{_classes(classes)} only with the slow clients, n = {n}** "
            f"(`python -m experiments.compare --n {n} --set slow-classes={classes} "
            f"--methods {','.join(s.get('methods', []))}{rule_flags(s)}`, "
            f"seeds {seeds[0]}–{seeds[-1]}, "
            f"target {100 * float(s['target']):.0f} %):")
    notes = ["Median time over the seeds, a seed that never reached the target counting as ∞; "
             "time / auto: the geometric mean of the per-seed ratios over the seeds where both "
             "reached the target [95 % Student-t interval on their logarithms], `(k/N)` when only "
             "k of the N seeds "
             "are, as in the grid's table; the last row is the fixed exact code with the "
             "lowest median time."]
    span = fedbuff_span(cell)
    if span is not None:
        notes.append(f"FedBuff's runs ended when their updates were spent, after a median "
                     f"{seconds(span[0])} of virtual time: before auto first reached the target "
                     f"on {span[1]} of {span[2]} seeds.")
    for method, why in cell.get("methods_set_aside", {}).items():
        notes.append(f"Set aside: {method} ({why}).")
    readings = _readings(cell)
    if readings:
        notes.append("On the grid's two readings: " + "; ".join(readings) + ".")
    return (head + "\n\n" + table(["method", "median time to target (reached)",
                                   "median final accuracy", "time / auto [95 %]"], rows)
            + "\n\n" + " ".join(notes))


def render_longer(longer: Mapping[str, Any], registered: Mapping[str, Any] | None) -> str:
    """FedBuff given more client updates than the registered runs."""
    stats = method_stats(longer)
    fed, auto = stats.get("fedbuff"), stats.get("auto")
    s = longer["settings"]
    base_rounds = registered["settings"]["rounds"] if registered else None
    text = (f"A reading added after these runs (`--methods auto,fedbuff --rounds {s['rounds']}"
            f"{rule_flags(s)}`, "
            f"the same seeds, 2 classes at n = 20): given the client updates of {s['rounds']} "
            "rounds" + (f" instead of {base_rounds}" if base_rounds else ""))
    if fed is not None:
        text += f", FedBuff reached the target on {fed.reached} of {fed.seeds} seeds"
        if fed.reached:
            text += f" (median time {seconds(fed.median_time)})"
    span = fedbuff_span(longer)
    if span is not None:
        text += (f"; its runs lasted a median {seconds(span[0])}, past auto's time to target "
                 f"on {span[2] - span[1]} of {span[2]} seeds")
    if auto is not None:
        text += (f"; auto in the same runs: {seconds(auto.median_time)} "
                 f"({auto.reached}/{auto.seeds})")
        if registered is not None:
            base = method_stats(registered).get("auto")
            text += (f", in the registered runs {seconds(base.median_time)} (its deadline comes "
                     f"from the development seeds' wait-for-all runs, of {s['rounds']} rounds "
                     f"here: {s.get('coded_straggler_timeout_s', 0):.2f} s against "
                     f"{registered['settings'].get('coded_straggler_timeout_s', 0):.2f} s)"
                     if base is not None else "")
    return text + "."


def _fedbuff_text(data: Mapping[str, Any]) -> str:
    fed = method_stats(data).get("fedbuff")
    if fed is None:
        return "FedBuff not run"
    text = f"{fed.reached}/{fed.seeds} reached the target"
    entry = data.get("summary", {}).get("fedbuff", {}).get("time_to_target_vs_auto", {})
    pairs = sum(v is not None for v in entry.get("per_seed", {}).values())
    if entry.get("geomean") is not None:
        text += (f", in {entry['geomean']:.2f}× auto's time "
                 + ("on the one seed both did" if pairs == 1 else
                    f"where both did (geometric mean over {pairs} seeds)"))
    if fed is not None and "tuning" not in data["settings"].get("fedbuff", {}):
        text += " (FedBuff untuned)"
    return text


def render_unweighted(files: Sequence[Mapping[str, Any]]) -> str | None:
    """FedBuff with another staleness exponent than the paper's (``--rule``)."""
    if not files:
        return None
    parts = []
    for data in files:
        s = data["settings"]
        exponent = s.get("fedbuff", {}).get("staleness_exponent")
        parts.append(f"with the client updates of {s['rounds']} rounds and staleness exponent "
                     f"{exponent:g}: {_fedbuff_text(data)}")
    return ("A sensitivity reading added after an audit of these runs (it found no fault; the "
            "paper's staleness weight left the slow clients' few late updates little weight): "
            "FedBuff with every update weighted alike (`--rule fedbuff_staleness_exponent=0`), "
            "2 classes at n = 20, the same seeds: " + "; ".join(parts) + ".")


def _unweighted() -> list[dict[str, Any]]:
    return [load(f) for f in UNWEIGHTED if (RESULTS / f).exists()]


def render(runs: Sequence[tuple[int, int, Mapping[str, Any] | None]],
           longer: Mapping[str, Any] | None = None,
           unweighted: Sequence[Mapping[str, Any]] = ()) -> str | None:
    """The ``slow-classes`` block: each registered run (or that it has not run yet), then the
    readings with more client updates and with FedBuff unweighted."""
    if not any(cell for _, _, cell in runs):
        return None
    parts = [render_cell(c, n, cell) if cell is not None else
             f"**{_classes(c)} only with the slow clients, n = {n}**: registered in amendment "
             "8, not run yet." for c, n, cell in runs]
    if longer is not None:
        registered = next((cell for c, n, cell in runs if (c, n) == (2, 20)), None)
        parts.append(render_longer(longer, registered))
    sensitivity = render_unweighted(unweighted)
    if sensitivity:
        parts.append(sensitivity)
    return "\n\n".join(parts)


def render_headline(runs: Sequence[tuple[int, int, Mapping[str, Any] | None]],
                    longer: Mapping[str, Any] | None = None,
                    unweighted: Sequence[Mapping[str, Any]] = ()) -> str | None:
    """One README line over the runs of the extension (``longer``: the reading of FedBuff
    given more client updates, at 2 classes and n = 20)."""
    longer_fedbuff = None
    if longer is not None and "fedbuff" in method_stats(longer):
        fed = method_stats(longer)["fedbuff"]
        longer_fedbuff = (longer["settings"]["rounds"], fed.reached, fed.seeds)
    parts, missing = [], []
    # what the runs predate, said once when every run predates the same rules
    caveats = {predates(cell["settings"]) for _, _, cell in runs if cell is not None}
    shared = caveats.pop() if len(caveats) == 1 else None
    for classes, n, cell in runs:
        if cell is None:
            missing.append(f"{_classes(classes)} at n = {n}")
            continue
        v = verdict("", cell)
        stats = method_stats(cell)
        if v.auto is None or v.uncoded is None or v.best is None:
            continue
        reached = []
        for m in UNCODED:
            if m not in stats or stats[m].reached == stats[m].seeds:
                continue
            label = f"{method_label(m)} {stats[m].reached}/{stats[m].seeds}"
            if m == "fedbuff" and stats[m].reached == 0:
                more = longer_fedbuff if (classes, n) == (2, 20) else None
                flat = [d for d in unweighted if d["settings"]["rounds"] == more[0]] \
                    if more else []
                label += (" (its runs end when its updates are spent"
                          + (f"; {more[1]}/{more[2]} with {more[0]} rounds' updates"
                             + (" untuned" if longer is not None
                                and "tuning" not in longer["settings"].get("fedbuff", {})
                                else "")
                             if more else "")
                          + (f"; with as many unweighted by staleness: {_fedbuff_text(flat[0])}"
                             if flat else "")
                          + ")")
            elif stats[m].reached:
                ratio = cell.get("summary", {}).get(m, {}).get(
                    "time_to_target_vs_auto", {}).get("geomean")
                if ratio is not None:
                    label += f", {ratio:.2f}× auto's time where both reached it"
            reached.append(label)
        parts.append(
            f"{_classes(classes)} at n = {n}"
            f"{'' if shared is not None else predates(cell['settings'])}: auto "
            f"{seconds(v.auto.median_time)} "
            f"({v.auto.reached}/{v.auto.seeds}); by the medians (an unreached seed as ∞) the "
            f"best rival that does not code, {method_label(v.uncoded)}, took "
            f"{times_text(v.speedup)} auto's time, the best rival "
            f"({method_label(v.best)}) {times_text(1 / v.time_ratio)}"
            + (f"; seeds that reached the target: {'; '.join(reached)}" if reached else ""))
    if not parts:
        return None
    return ("- **Where only the slow clients hold some classes** (an extension chosen after the "
            "grid's results and registered before its runs, `experiments/grid.toml` amendment "
            "8; not in the verdict above"
            + (f"; all its runs predate the rules:{shared.split(':', 1)[1][:-1]}" if shared
               else "")
            + "): " + ". ".join(parts)
            + (f". Registered, not run yet: {', '.join(missing)}" if missing else "")
            + " ([tables](docs/adaptive.md#where-only-the-slow-clients-hold-some-classes)).")


def _longer() -> dict[str, Any] | None:
    return load(LONGER) if (RESULTS / LONGER).exists() else None


@block("slow-classes")
def slow_classes() -> str | None:
    """The extension's tables (docs/adaptive.md)."""
    return render(_runs(), _longer(), _unweighted())


@block("slow-classes-headline")
def slow_classes_headline() -> str | None:
    """The extension's README line."""
    return render_headline(_runs(), _longer(), _unweighted())


__all__ = [
    "LONGER",
    "RUNS",
    "UNWEIGHTED",
    "best_code",
    "fedbuff_span",
    "file_name",
    "render",
    "render_cell",
    "render_headline",
    "render_longer",
    "render_unweighted",
]
