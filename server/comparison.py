"""The main job's one-screen comparison: each run's line (final accuracy, virtual time to a
common target, exact rounds, MB uploaded, client compute), what each run is, and where coding
does or does not pay, with ``comparison.png`` (accuracy vs virtual time). It reads the runs'
``rounds.jsonl`` and ``config.json`` (:mod:`server.launch` runs them)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["ASYNC_HINT", "LEGEND", "compare", "render_table", "summarize"]

#: the run-config keys that run the asynchronous mode, as the table suggests them
ASYNC_HINT = "asynchronous=true s='auto'"


def _time_to(rows: list[dict], target: float) -> float | None:
    for row in rows:
        if row["accuracy"] is not None and row["accuracy"] >= target - 1e-12:
            return float(row["virtual_s"])
    return None


#: What each run of the main job is, for the table's legend.
LEGEND = {
    "coded": "gradient coding",
    "uncoded": "FedAvg waiting for every client (code='uncoded', no deadline)",
    "drop-stragglers": "Flower FedAvg averaging the replies in by the deadline, dropping the rest",
    "fedbuff": "FedBuff (buffered asynchronous aggregation, s = 0: each client its own "
               "partition)",
}


def summarize(name: str, rows: list[dict], target: float) -> dict[str, object]:
    """One run's line of the table: final accuracy, virtual time to ``target`` and in all,
    exact rounds (coded runs only), MB uploaded, client compute seconds, dropped replies."""
    final = rows[-1]["accuracy"] if rows else None
    return {
        "name": name,
        "final": final,
        "time_to": _time_to(rows, target),
        "total_s": float(rows[-1]["virtual_s"]) if rows else 0.0,
        # asynchronous runs have server steps, not rounds: none is exact or approximate
        "exact": (sum(r["decode"] == "exact" for r in rows), len(rows))
        if name == "coded" and not any(r["decode"] == "buffered" for r in rows) else None,
        "mb_up": sum(r.get("bytes_up") or 0 for r in rows) / 1e6,
        # rows of runs from before compute was recorded have none: shown as missing
        "compute_s": sum(r["compute_s"] for r in rows)
        if rows and all(r.get("compute_s") is not None for r in rows) else None,
        "dropped": sum(int(r.get("late_dropped") or 0) for r in rows),
        "rounds_dropping": sum(int(r.get("late_dropped") or 0) > 0 for r in rows),
        "rounds": len(rows),
    }


def render_table(summaries: list[Mapping[str, object]], target: float,
                 labels: Mapping[str, str] | None = None, clock: str = "virtual time",
                 async_hint: str | None = None, async_tuned: str | None = None,
                 async_without: str | None = None) -> str:
    """The one-screen comparison of :func:`summarize`'s lines (the first is the coded run);
    ``labels``: what each run is (default :data:`LEGEND`); ``clock``: what the times are;
    ``async_hint`` (and ``async_tuned``, the keys that give it FedBuff's tuned settings;
    ``async_without``, the user's keys it must leave out): how to run the asynchronous mode,
    said where rounds lose to FedBuff."""
    def opt(value: object, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    buff = len(summaries) > 2 and any(row["name"] == "fedbuff" for row in summaries)
    lines = [
        "",
        f"{len(summaries)} runs, same seeds and latency draws "
        f"(time to accuracy {target:.3f}, the lowest final one; {clock}):",
        *(["(but FedBuff's, whose run ends when its updates are spent, at another time)"]
          if buff else []),
        f"{'run':17}{'final acc':>10}{'time to ' + format(target, '.3f'):>15}"
        f"{'total time':>12}{'exact rounds':>14}{'MB up':>9}{'client compute':>16}",
    ]
    for row in summaries:
        exact = row["exact"]
        exact_txt = "n/a" if exact is None else f"{exact[0]}/{exact[1]}"
        time_txt = "-" if row["time_to"] is None else f"{row['time_to']:.2f} s"
        compute_txt = "-" if row["compute_s"] is None else f"{row['compute_s']:.2f} s"
        lines.append(
            f"{row['name']:17}{opt(row['final'], '.3f'):>10}{time_txt:>15}"
            f"{row['total_s']:>10.2f} s{exact_txt:>14}{row['mb_up']:>9.2f}{compute_txt:>16}"
        )
    for row in summaries:
        label = {**LEGEND, **(labels or {})}.get(str(row["name"]), "")
        lines.append(f"  {row['name']}: {label}")
    coded = summaries[0]
    for row in summaries[1:]:
        if row["name"] == "drop-stragglers" and row["dropped"]:
            lines.append(
                f"drop-stragglers dropped {row['dropped']} late replies in "
                f"{row['rounds_dropping']} of {row['rounds']} rounds "
                "(non-IID: biased to the fast clients)")
        # times the table shows alike (to 0.01 s) are a tie, not "1.00x" either way
        if coded["time_to"] and row["time_to"] and \
                f"{row['time_to']:.2f}" == f"{coded['time_to']:.2f}":
            lines.append(f"coding reached {target:.3f} at the same time as {row['name']}")
        elif coded["time_to"] and row["time_to"]:
            ratio = row["time_to"] / coded["time_to"]
            gap = abs(round(row["time_to"], 2) - round(coded["time_to"], 2))  # as shown
            how = (f"{max(ratio, 1 / ratio):.2f}x" if f"{max(ratio, 1 / ratio):.2f}" != "1.00"
                   else f"{gap:.2f} s")
            lines.append(
                f"coding reached {target:.3f} {how} sooner than {row['name']}"
                if coded["time_to"] < row["time_to"] else
                f"coding was {how} slower to {target:.3f} than {row['name']} "
                f"(finals {opt(coded['final'], '.3f')}, {opt(row['final'], '.3f')}): "
                "here it does not pay")
            if row["name"] == "fedbuff" and coded["exact"] is not None and async_hint \
                    and row["time_to"] < coded["time_to"]:  # rounds lost to asynchrony
                hint = [f"  (FedBuff over partitions held by s + 1 clients: add {async_hint} "
                        "to --run-config"]
                if async_tuned:
                    hint.append(f"   with {async_tuned}, the fedbuff run's tuned settings")
                if async_without:
                    hint.append(f"   and leave out {async_without} (rounds' deadline)")
                lines.append(hint[0] + "".join(
                    f"\n{h}" + ("," if i < len(hint) - 2 else "")
                    for i, h in enumerate(hint[1:])) + ", against FedBuff)")
        elif row["name"] == "fedbuff" and row["time_to"] is None:
            lines += [f"fedbuff did not reach {target:.3f}: its run ends when its updates are "
                      "spent (num-rounds times", f"  the cohort), here at {row['total_s']:.2f} s "
                      f"of virtual time, final accuracy {opt(row['final'], '.3f')}"]
    return "\n".join(lines)


def _bar(cfg: dict, rows: Sequence[Mapping[str, Any]] = ()) -> str:
    """How an asynchronous run's clients served their neighbours' partitions (its label;
    ``rows``: its server steps, which say when a class reading switched)."""
    bar = float(cfg.get("replicate-below", 1.0))
    lag = float(cfg.get("lag-level", 0.0))
    switched = next((r["lagged_at"] for r in reversed(rows) if "lagged_at" in r), None)
    fact = (f" (it did at {switched:.2f} s)" if switched is not None
            else " (it never did)" if rows else "")
    z = float(cfg.get("replicate-margin", 0.0))
    need = float(cfg.get("need-ratio", 0.0))
    asked = " (s='auto')" if cfg.get("s-asked") == "auto" else ""
    if int(cfg["s"]) == 0:
        return ""
    if lag and bar == 0.0 and not need:  # the margin (if any) acts after the switch
        then = (f"a neighbour's partition served while below 1x a client's own by more than "
                f"{z:g} sd" if z else "the held partition served least so far")
        return (", each client its own partition (FedBuff) until the median class recall "
                f"reached {lag:g} with a class never learnt, then {then}{fact}{asked}")
    if bar >= 1.0 and z == 0.0:  # the least-served rule: the label says so only when asked
        return f", the held partition served least so far{asked}" if asked else ""
    margin = f" by more than {z:g} sd" if z else ""
    once = " once" if cfg.get("need-latch") else ""
    against = {"era": "its recent updates were over {:g}x their era's",
               "cohort": "its recent updates were over {:g}x their cohort's era's"}.get(
        str(cfg.get("need-reference")), "its last update was over {:g}x the own's")
    prior = ", and until read twice" if cfg.get("need-prior") else ""
    lifted = f" (1x{once} when {against.format(need)}{prior})" if need else ""
    switch = (f"; every partition served as much once the median class recall reached "
              f"{lag:g} with a class never learnt{fact}" if lag else "")
    return (f", a neighbour's partition served while below {bar:g}x a client's own"
            f"{lifted}{margin}{switch}{asked}")


def compare(coded_dir: Path, uncoded_dir: Path | None, drop_dir: Path | None = None,
            fedbuff_dir: Path | None = None, fedbuff_care: str = "untuned",
            async_hint: str | None = ASYNC_HINT,
            async_tuned: str | None = None, async_without: str | None = None) -> str:
    """The one-screen comparison of the main job's runs (coded, and FedBuff, uncoded and
    drop-stragglers when given), and ``comparison.png`` (accuracy vs virtual time) in
    ``coded_dir``. ``fedbuff_care``: how FedBuff's settings were chosen (its label);
    ``async_hint``: the run-config keys that would run the asynchronous mode instead of rounds
    (said where rounds lose to FedBuff; ``None``: not said, e.g. where it would be refused),
    ``async_tuned`` the keys that would give it FedBuff's tuned server lr and buffer,
    ``async_without`` the user's keys it would leave out (a round's deadline)."""
    from fl_gradcode.results import read_rounds

    dirs = {name: d for name, d in (("coded", coded_dir), ("uncoded", uncoded_dir),
                                    ("drop-stragglers", drop_dir), ("fedbuff", fedbuff_dir))
            if d is not None}
    rows = {name: read_rounds(d) for name, d in dirs.items()}
    # a value that is not a finite number is null in rounds.jsonl (an accuracy of NaN); the
    # target is the runs' lowest final but FedBuff's, whose run ends when its updates are
    # spent, at another virtual time (it would set the bar of every other row)
    finals = [r[-1]["accuracy"] for name, r in rows.items() if r
              and (name != "fedbuff" or len(rows) == 2)]
    target = min((a for a in finals if a is not None), default=0.0)
    labels, clock, asynchronous = {}, "virtual time", False
    try:
        cfg = json.loads((Path(coded_dir) / "config.json").read_text())
        asynchronous = bool(cfg.get("asynchronous"))
        if cfg.get("timing") == "wallclock":
            clock = "wall-clock time"
        labels["coded"] = (
            f"asynchronous: FedBuff over partitions held by s + 1 = {int(cfg['s']) + 1} "
            f"clients{_bar(cfg, rows['coded'])}, a server step every {cfg['buffer-size']} updates, "
            f"{cfg['server-steps']} steps" if cfg.get("asynchronous")
            else f"gradient coding, code={cfg['code']} s={cfg['s']}")
        labels["drop-stragglers"] = (
            f"Flower FedAvg averaging the replies in by {cfg['straggler-timeout']} s "
            "(virtual), dropping the rest")
        if fedbuff_dir is not None and asynchronous:
            labels["fedbuff"] = ("FedBuff itself (asynchronous, s = 0: each client its own "
                                 "partition), the same buffer, server lr, steps and seeds: "
                                 f"{fedbuff_care}")
        elif fedbuff_dir is not None:
            buff = json.loads((Path(fedbuff_dir) / "config.json").read_text())
            labels["fedbuff"] = (
                "FedBuff (buffered asynchronous aggregation, Nguyen et al. 2022), a server "
                f"step every {buff['buffer-size']} updates at server lr "
                f"{buff['server-lr']}, {buff['server-steps']} steps, {fedbuff_care}")
    except (OSError, ValueError, KeyError):
        pass
    lines = [render_table([summarize(n, r, target) for n, r in rows.items()], target,
                          labels, clock, async_hint, async_tuned, async_without)]
    if "fedbuff" in rows and len(rows) > 2 and asynchronous:
        lines.append("(against uncoded and drop-stragglers the gain is asynchrony's and "
                     "replication's together; against fedbuff, replication's alone)")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for name, run_rows in rows.items():
            ax.plot([0.0] + [r["virtual_s"] for r in run_rows],
                    [None] + [r["accuracy"] for r in run_rows], marker=".", label=name)
        ax.axhline(target, color="grey", lw=0.8, ls=":")
        ax.set_xlabel(f"{clock} (s)")
        ax.set_ylabel("test accuracy")
        ax.set_title("Gradient coding vs Flower FedAvg, same seeds and latency draws",
                     fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        png = Path(coded_dir) / "comparison.png"
        fig.savefig(png, dpi=120)
        plt.close(fig)
        lines.append(f"figure: {png}")
    except ImportError:
        pass
    return "\n".join(lines)

