"""The FedBuff readings beside the rivals' table: ``fedbuff-no-stragglers`` (FedBuff against
wait-for-all with no straggler at all: the part of its lead that is its step count),
``fedbuff-schedule`` (synchronous rounds given FedBuff's step count) and
``fedbuff-evaluation`` (FedBuff's time to target read as often as a round's)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from tools.docgen.core import RESULTS, block, load, table
from tools.docgen.rivals import (
    COMPARE,
    compare_data,
    finished_cells,
    grid_data,
    median,
    method_stats,
    reported_cells,
    seconds,
    stats_cell,
    time_over,
    times_text,
)

#: FedBuff against synchronous rounds with no stragglers at all (development seeds):
#: ``python -m experiments.compare --latency persistent --set latency=none --n 20
#: --methods wait-for-all,fedbuff,auto,grouped-rs:1 --seeds 0,1,2 --dev-seeds 0
#: --rule fedbuff_tune=0 --rule auto_stop_at_decode=0 --rule codes_stop_at_decode=0
#: --rule codes_own_deadline=0 --out
#: results/compare_no_stragglers_dev.json`` (FedBuff untuned, auto's and the code's work
#: stopped at the deadline: the file predates these rules, and these seeds are development
#: seeds).
NO_STRAGGLERS = "compare_no_stragglers_dev.json"


def render_no_stragglers(data: Mapping[str, Any]) -> str:
    """How much sooner FedBuff reaches the target than wait-for-all with no stragglers: the
    part of its lead that is its step count, not straggler tolerance."""
    summary, settings = data["summary"], data["settings"]
    fedbuff, wfa = (summary[m]["median_time_to_target"] for m in ("fedbuff", "wait-for-all"))
    auto = summary.get("auto", {}).get("median_time_to_target")
    steps = settings["fedbuff"]
    seeds = ", ".join(str(x) for x in settings["seeds"])
    reading = per_round_reading(data)
    return (
        f"Part of FedBuff's lead is not straggler tolerance: it applies a server step every "
        f"K = {steps['buffer_size']} updates"
        + ("" if "tuning" in steps else " (untuned: the values fixed a priori)")
        + f" of the cohort's "
        f"{settings['cohort']}, so {steps['server_steps']} steps for the client work of "
        f"{settings['rounds']} synchronous rounds. With no stragglers at all (`--set "
        f"latency=none`, {settings['task']} at n = {settings['n']}, development seeds {seeds}, "
        f"`results/{NO_STRAGGLERS}`) FedBuff reached the target in a median "
        f"{seconds(fedbuff)} against wait-for-all's {seconds(wfa)} "
        f"({wfa / fedbuff:.2f}× sooner"
        + (f"; read as often as a round, below, {seconds(reading['per_round'])}, "
           f"{wfa / reading['per_round']:.2f}× sooner" if reading else "") + ")"
        + (f", and `auto` took {seconds(auto)}: coding costs when no client straggles."
           if auto is not None else "."))


@block("fedbuff-no-stragglers")
def fedbuff_no_stragglers() -> str | None:
    if not (RESULTS / NO_STRAGGLERS).exists():
        return None
    return render_no_stragglers(load(NO_STRAGGLERS))



#: Synchronous rounds given FedBuff's step count (evaluation seeds): a cohort of K (FedBuff's
#: buffer) per round for ``rounds * cohort / K`` rounds, the client work of the grid's cell:
#: ``python -m experiments.compare --latency persistent --n 20 --cohort 5 --rounds 120
#: --methods wait-for-all,auto --seeds 10,11,12,13,14,15,16,17,18,19
#: --out results/compare_schedule_persistent.json`` (and so on for each regime).
SCHEDULE = "compare_schedule_{}.json"


def _span(shares: Sequence[float]) -> str:
    low, high = (f"{100 * x:.0f}" for x in (min(shares), max(shares)))
    return low if low == high else f"{low}–{high}"


def render_schedule(data: Mapping[str, Any], schedules: Mapping[str, Mapping[str, Any]]
                    ) -> str | None:
    """FedBuff against synchronous rounds with its step count: per regime, the median time to
    target of FedBuff, wait-for-all and auto in the grid's cell (``data``: compare.json) and
    of wait-for-all and auto with a cohort of K and proportionally more rounds
    (``schedules``: regime -> a ``compare --out`` file), on the same seeds; ``None`` when no
    regime has both."""
    rows, shape, shares, slower, tuned = [], None, [], 0, {}
    for regime, small in schedules.items():
        s = small["settings"]
        cell = data.get("cells", {}).get(f"{s['task']}/{regime}/{s['n']}x{s['n']}")
        if cell is None or sorted(cell["settings"]["seeds"]) != sorted(s["seeds"]):
            continue
        k_cell = cell["settings"].get("fedbuff", {}).get("buffer_size", s["cohort"])
        if k_cell != s["cohort"]:  # the cell's FedBuff (tuned) steps at another K
            tuned[regime] = (k_cell, s["cohort"])
            continue
        big, few = method_stats(cell), method_stats(small)
        c = cell["settings"]
        shape = (c["cohort"], c["rounds"], s["cohort"], s["rounds"], s["task"], s["n"],
                 s["seeds"])
        wfa, wfa_small, fedbuff = (x.median_time if x else math.inf for x in (
            big.get("wait-for-all"), few.get("wait-for-all"), big.get("fedbuff")))
        step, lead = time_over(wfa, wfa_small), time_over(wfa, fedbuff)
        if math.isfinite(step) and math.isfinite(lead) and step > 0 and lead > 1:
            shares.append(math.log(step) / math.log(lead))
        autos = [x.median_time if x else math.inf for x in (big.get("auto"), few.get("auto"))]
        slower += autos[1] > autos[0]
        rows.append([regime, stats_cell(big.get("fedbuff")),
                     stats_cell(big.get("wait-for-all")), stats_cell(few.get("wait-for-all")),
                     stats_cell(big.get("auto")), stats_cell(few.get("auto")),
                     times_text(time_over(wfa, wfa_small)), times_text(time_over(wfa, fedbuff))])
    if shape is None:
        if not tuned:
            return None
        return ("Synchronous rounds given FedBuff's step count: withdrawn. The schedule runs "
                f"(`results/{SCHEDULE.format('*')}`) gave synchronous rounds the step count of "
                "FedBuff with K = " + ", ".join(sorted({str(k) for _, k in tuned.values()}))
                + "; the benchmark's FedBuff is now tuned on the development seeds "
                "(`experiments/grid.toml` amendment 12) and steps at K = "
                + ", ".join(sorted({str(k) for k, _ in tuned.values()}))
                + f" in those cells ({', '.join(tuned)}), so the reading compares nothing "
                "that ran; it returns when the schedule runs at the tuned K.")
    cohort, rounds, k, more, task, n, seeds = shape
    header = ["latency", f"FedBuff (K = {k})", f"wait-for-all, {cohort} × {rounds}",
              f"wait-for-all, {k} × {more}", f"auto, {cohort} × {rounds}",
              f"auto, {k} × {more}", "step count alone", "FedBuff"]
    return (
        f"Synchronous rounds given FedBuff's step count ({task} at n = {n}, evaluation seeds "
        f"{seeds[0]}–{seeds[-1]}; a cohort of {k} per round for {more} rounds, the client "
        f"work of {rounds} rounds of {cohort}; `results/{SCHEDULE.format('*')}`). Median "
        "time to target over the seeds (one that never reached it counts as ∞) and how many "
        "reached it; the last two columns: how much sooner than "
        f"wait-for-all at {cohort} × {rounds} the step count alone (wait-for-all at "
        f"{k} × {more}) and FedBuff are.\n\n" + table(header, rows) + "\n\n"
        + (f"On a log scale the step count alone is {_span(shares)} % of FedBuff's lead "
           "over wait-for-all here; the rest is its asynchrony (no round barrier). "
           if shares else "")
        + f"`auto` at {k} × {more} was slower than at {cohort} × {rounds} in {slower} of "
        f"{len(rows)} regimes.")


@block("fedbuff-schedule")
def fedbuff_schedule() -> str | None:
    latencies = grid_data().get("latency", {})
    schedules = {r: load(SCHEDULE.format(r)) for r in latencies
                 if (RESULTS / SCHEDULE.format(r)).exists()}
    if not schedules or not (RESULTS / COMPARE).exists():
        return None
    return render_schedule(compare_data(), schedules)



# ----------------------------------------------------------- FedBuff read as often as a round
def time_at_rounds(curve: Sequence[Sequence[Any]], target: float, buffer: int,
                   cohort: int) -> float:
    """The time to target of a FedBuff run (``curve``: ``[virtual s, accuracy, loss]`` after
    each server step of ``buffer`` updates) read only where a synchronous round would be
    evaluated: after the first step at which its updates reach each multiple of ``cohort``
    (step ``ceil(r * cohort / buffer)``, r = 1, 2, ...); ``inf`` when no such reading is at or
    above ``target``."""
    if buffer < 1 or cohort < 1:
        raise ValueError(f"buffer={buffer!r}, cohort={cohort!r}: expected positive counts")
    r = 1
    while (step := -(-r * cohort // buffer)) <= len(curve):
        t, accuracy = curve[step - 1][0], curve[step - 1][1]
        if accuracy is not None and accuracy >= target:
            return float(t)
        r += 1
    return math.inf


def per_round_reading(cell: Mapping[str, Any]) -> dict[str, Any] | None:
    """FedBuff's runs of a finished cell read as often as a round (:func:`time_at_rounds`):
    ``{"buffer", "steps_per_round", "every_step", "per_round", "ratio_vs_auto",
    "ratio_vs_auto_every_step", "cell"}`` (median times, one that never reached the target
    counting as ``inf``; the geometric means over the seeds where both reached it of
    FedBuff's time over auto's; ``cell``: the cell with FedBuff's times so read). ``None``
    when FedBuff has no stored curve there, its runs differ in K, or a curve's first reading
    at or above the target is not the run's recorded time to target (a curve that is not the
    one the benchmark read)."""
    s = cell["settings"]
    runs = [r for r in cell.get("runs", []) if r["method"] == "fedbuff"]
    if not runs or any(not r.get("accuracy_curve") or "buffer_size" not in r for r in runs) \
            or len({int(r["buffer_size"]) for r in runs}) > 1:
        return None
    target, cohort = float(s["target"]), int(s["cohort"])
    every = [math.inf if r["time_to_target"] is None else float(r["time_to_target"])
             for r in runs]
    # read after every step (a "round" of one update in K = 1), as the benchmark read it
    if any(time_at_rounds(r["accuracy_curve"], target, 1, 1) != t
           for r, t in zip(runs, every, strict=True)):
        return None
    per_round = [time_at_rounds(r["accuracy_curve"], target, int(r["buffer_size"]), cohort)
                 for r in runs]
    auto = {r["seed"]: r["time_to_target"] for r in cell["runs"] if r["method"] == "auto"}

    def paired(times: Sequence[float]) -> float | None:
        logs = [math.log(t / auto[r["seed"]]) for r, t in zip(runs, times, strict=True)
                if math.isfinite(t) and auto.get(r["seed"]) is not None]
        return math.exp(sum(logs) / len(logs)) if logs else None

    read = iter(per_round)  # FedBuff's runs in the cell's order
    buffer = int(runs[0]["buffer_size"])
    return {"buffer": buffer, "steps_per_round": cohort / buffer,
            "every_step": median(every), "per_round": median(per_round),
            "ratio_vs_auto": paired(per_round), "ratio_vs_auto_every_step": paired(every),
            "cell": {**cell, "runs": [
                {**r, "time_to_target": None if math.isinf(t := next(read)) else t}
                if r["method"] == "fedbuff" else r for r in cell["runs"]]}}


def render_evaluation(data: Mapping[str, Any], report: Sequence[str]) -> str | None:
    """Per finished cell: FedBuff's median time to target as the benchmark reads it (after
    every server step) and read as often as a round, auto's median over each, and what the
    goal's verdict would be with FedBuff so read (not the verdict: it keeps the grid's
    rule)."""
    from tools.docgen.rivals import MAIN_CELL, verdict

    done = finished_cells(data, report)
    rows, slower, met, main = [], [], [], None
    for name in done:
        cell = data["cells"][name]
        reading = per_round_reading(cell)
        auto = method_stats(cell).get("auto")
        if reading is None or auto is None:
            continue
        slower.append(time_over(reading["per_round"], reading["every_step"]))
        if verdict(name, reading["cell"]).met and not verdict(name, cell).met:
            met.append(name)
        if name == MAIN_CELL:
            main = reading
        rows.append([name, f"{reading['buffer']} ({reading['steps_per_round']:.3g})",
                     seconds(reading["every_step"]), seconds(reading["per_round"]),
                     times_text(slower[-1]),
                     times_text(time_over(auto.median_time, reading["every_step"])),
                     times_text(time_over(auto.median_time, reading["per_round"]))])
    if not rows:
        return None
    finite = sorted(x for x in slower if math.isfinite(x))
    span = ("" if not finite else f"{finite[0]:.2f}×"
            if f"{finite[0]:.2f}" == f"{finite[-1]:.2f}"
            else f"{finite[0]:.2f}–{finite[-1]:.2f}× (median {median(finite):.2f}×)")
    never = len(slower) - len(finite)
    return (
        "FedBuff's time to target is read after each of its server steps (K updates taken "
        "in; an update a device off-line could not send is not one), a synchronous method's "
        "after each round (a cohort's updates): FedBuff's accuracy is read cohort / K times as "
        "often, and the first reading at or above the target comes sooner for that alone (the "
        "wait until the next reading, and more draws of a noisy curve to cross the target "
        "with). Read from the same runs (their stored accuracy curves, checked against each "
        "run's recorded time to target) only where a round would be, after the step at which "
        "its updates reach each multiple of the cohort, FedBuff's median time to target is "
        + (f"{span} the benchmark's" if span else "never reached")
        + f" in {len(rows)} of the {len(done)} finished cells"
        + (f" (in {never} of them the median reading per round never reached it)"
           if never and finite else "")
        + ". "
        + (f"In `{MAIN_CELL}` FedBuff's time over auto's, the geometric mean of the per-seed "
           f"ratios as the README gives it, is {main['ratio_vs_auto_every_step']:.2f}× read "
           f"every step and {main['ratio_vs_auto']:.2f}× per round. "
           if main and main["ratio_vs_auto"] and main["ratio_vs_auto_every_step"] else "")
        + "With FedBuff read per round, auto would meet the goal in "
        + (f"{len(met)} more cell{'s' if len(met) > 1 else ''} ({', '.join(met)})"
           if met else "no more cell")
        + ". A reading computed after the results, not pre-registered: the verdict above "
        "keeps the grid file's rule (every evaluation counts). Medians over the seeds (one "
        "that never reached the target counts as ∞).\n\n"
        + table(["cell", "K (steps per round)", "FedBuff, every step",
                 "FedBuff, per round", "per round / every step", "auto / FedBuff",
                 "auto / FedBuff per round"], rows))


@block("fedbuff-evaluation")
def fedbuff_evaluation() -> str | None:
    if not (RESULTS / COMPARE).exists():
        return None
    return render_evaluation(compare_data(), reported_cells())
