"""The ``unseen-check`` block: the asynchronous ``s='auto'`` (``fedbuff-auto``) in the five
settings outside the grid that amendment 33 registered (``results/unseen_check.json``,
``python -m experiments.unseen_check``), read with the verdict's own rule
(:func:`tools.docgen.rivals.verdict`, ``fedbuff-auto`` in ``auto``'s place), the synchronous
``auto``'s verdict beside it; and, a reading added after the results (it picks nothing),
the goal's second test where stragglers are persistent or heavy-tailed."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from tools.docgen.core import RESULTS, block, load, table
from tools.docgen.rivals import (
    CRITERION_RIVALS,
    Verdict,
    method_label,
    stats_cell,
    times_text,
    verdict,
)

FILE = "unseen_check.json"
ASYNC = "fedbuff-auto"


def in_autos_place(cell: Mapping[str, Any]) -> dict[str, Any]:
    """``cell`` with ``fedbuff-auto``'s runs as ``auto``'s (the synchronous ``auto``'s left
    out: it is no rival)."""
    runs = [{**r, "method": "auto"} if r["method"] == ASYNC else r
            for r in cell.get("runs", []) if r["method"] != "auto"]
    return {**cell, "runs": runs}


def as_fedbuff(cell: Mapping[str, Any]) -> bool:
    """Whether ``fedbuff-auto`` never switched and ran as FedBuff itself: on every seed no
    switch, and FedBuff's time to target and final accuracy."""
    mine = {r["seed"]: r for r in cell.get("runs", []) if r["method"] == ASYNC}
    theirs = {r["seed"]: r for r in cell.get("runs", []) if r["method"] == "fedbuff"}
    return bool(mine) and mine.keys() == theirs.keys() and all(
        r.get("lagged_at") is None
        and (r["time_to_target"], r["final_accuracy"]) == (theirs[seed]["time_to_target"],
                                                            theirs[seed]["final_accuracy"])
        for seed, r in mine.items())


def _reading(v: Verdict) -> str:
    if v.auto is None or v.best is None:
        return "not run"
    never_mine, never_best = math.isinf(v.auto.median_time), math.isinf(v.best_stats.median_time)
    ratio = ("neither reached the target, " if never_mine and never_best
             else "only it reached the target, never " if never_best
             else f"{times_text(v.time_ratio)} ")
    accuracy = "" if v.accuracy_ok else ", final accuracy more than 0.5 point below"
    return (f"{ratio}{method_label(v.best)}'s{accuracy}: {'met' if v.met else 'not met'}")


def _speedup(v: Verdict) -> str:
    """The best non-coding rival's median time over the asynchronous s='auto''s."""
    if v.speedup is None or v.uncoded is None or v.auto is None:
        return "no rival that does not code ran"
    if math.isinf(v.auto.median_time):
        return f"never reached the target ({method_label(v.uncoded)})"
    if math.isinf(v.speedup):
        return f"∞ (only it reached the target; {method_label(v.uncoded)})"
    return f"{times_text(v.speedup)} ({method_label(v.uncoded)})"


def _verdicts() -> list[tuple[str, Mapping[str, Any], Verdict, Verdict]]:
    """``(setting, cell, the asynchronous s='auto''s verdict, the synchronous auto's)``."""
    return [(name, cell, verdict(name, in_autos_place(cell)), verdict(name, cell))
            for name, cell in load(FILE)["cells"].items()]


def headline_sentence() -> str:
    """One sentence for the README's coded-asynchrony headline (empty without the file)."""
    if not (RESULTS / FILE).exists():
        return ""
    data = load(FILE)
    read = _verdicts()
    if data.get("quick") or not read:
        return ""
    itself = sum(as_fedbuff(cell) for _, cell, _, _ in read)
    return (f" Outside the grid, in the {len(read)} settings amendment 33 registered before "
            f"any run (seeds {data['seeds']}, used nowhere before), it met the goal in "
            f"{sum(v.met for _, _, v, _ in read)} of {len(read)} (in {itself} of them it "
            "never switched and ran as FedBuff itself), the synchronous "
            f"`auto` in {sum(s.met for _, _, _, s in read)} ([the settings](docs/adaptive.md"
            "#coded-asynchrony-that-reacts)).")


@block("unseen-check")
def unseen_check() -> str | None:
    if not (RESULTS / FILE).exists():
        return None
    data = load(FILE)
    read = _verdicts()
    rows, itself = [], 0
    for name, cell, mine, sync in read:
        switched = [r for r in cell["runs"] if r["method"] == ASYNC]
        fedbuffs = as_fedbuff(cell)
        itself += fedbuffs
        rows.append([name, stats_cell(mine.auto), _reading(mine),
                     stats_cell(sync.auto), _reading(sync),
                     f"{sum(r.get('lagged_at') is not None for r in switched)} of "
                     f"{len(switched)}" + (" (FedBuff's runs)" if fedbuffs else "")])
    quick = " (the harness's quick slice, not a reading)" if data.get("quick") else ""
    uncoded = ", ".join(method_label(m) for m in CRITERION_RIVALS)
    text = (f"In the {len(read)} settings outside the grid that amendment 33 registered before "
            f"any run (evaluation seeds {data['seeds']}, used nowhere before; "
            f"`python -m experiments.unseen_check`, `results/{FILE}`){quick}, the asynchronous "
            f"`s='auto'` met the goal (median time within 1.05× of the best rival's, median "
            f"final accuracy within 0.5 point) in {sum(v.met for _, _, v, _ in read)} of "
            f"{len(read)}; the synchronous `auto` in {sum(s.met for _, _, _, s in read)}. In "
            f"{itself} of the {len(read)} it never switched and its runs were FedBuff's (the "
            "same time and final accuracy on every seed): there it met or missed the goal as "
            "FedBuff did.")
    hard = [(name, mine) for name, _, mine, _ in read if mine.hard]
    if hard:
        text += (f" A reading added after the results, the goal's second test: where "
                 f"stragglers are persistent or heavy-tailed on non-IID partitions ({len(hard)} "
                 f"of the settings), it was at least 2× faster than the best rival that does "
                 f"not code ({uncoded}) in {sum(v.fast for _, v in hard)} of {len(hard)}: "
                 + "; ".join(f"{name} {_speedup(v)}" for name, v in hard) + ".")
    text += (" Per setting, the median time to target (a seed that did not reach it counting "
             "as never; in brackets, the seeds that reached it), the ratio to the best rival "
             f"of {uncoded} and the fixed codes, and how many of the asynchronous runs "
             "switched to replication:")
    return text + "\n\n" + table(
        ["setting", "s='auto' asynchronous", "against the best rival",
         "auto (rounds)", "against the best rival", "switched"], rows)
