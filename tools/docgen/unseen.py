"""The ``unseen-check`` block: the asynchronous ``s='auto'`` (``fedbuff-auto``) in the five
settings outside the grid that amendment 33 registered (``results/unseen_check.json``,
``python -m experiments.unseen_check``), read with the verdict's own rule
(:func:`tools.docgen.rivals.verdict`, ``fedbuff-auto`` in ``auto``'s place), the synchronous
``auto``'s verdict beside it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tools.docgen.core import RESULTS, block, load, table
from tools.docgen.rivals import Verdict, method_label, stats_cell, times_text, verdict

FILE = "unseen_check.json"
ASYNC = "fedbuff-auto"


def in_autos_place(cell: Mapping[str, Any]) -> dict[str, Any]:
    """``cell`` with ``fedbuff-auto``'s runs as ``auto``'s (the synchronous ``auto``'s left
    out: it is no rival)."""
    runs = [{**r, "method": "auto"} if r["method"] == ASYNC else r
            for r in cell.get("runs", []) if r["method"] != "auto"]
    return {**cell, "runs": runs}


def _reading(v: Verdict) -> str:
    if v.auto is None or v.best is None:
        return "not run"
    accuracy = "" if v.accuracy_ok else ", final accuracy more than 0.5 point below"
    return (f"{times_text(v.time_ratio)} {method_label(v.best)}'s"
            f"{accuracy}: {'met' if v.met else 'not met'}")


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
    switched = sum(any(r.get("lagged_at") is not None for r in cell["runs"]
                       if r["method"] == ASYNC) for _, cell, _, _ in read)
    return (f" Outside the grid, in the {len(read)} settings amendment 33 registered before "
            f"any run (seeds {data['seeds']}, used nowhere before), it met the goal in "
            f"{sum(v.met for _, _, v, _ in read)} of {len(read)} (its runs switched to "
            f"replication in {switched} of them; where none did it ran as FedBuff), the "
            "synchronous "
            f"`auto` in {sum(s.met for _, _, _, s in read)} ([the settings](docs/adaptive.md"
            "#coded-asynchrony-that-reacts)).")


def _speedup(v: Verdict) -> str:
    """The best non-coding rival's median time over the asynchronous s='auto''s."""
    if v.speedup is None or v.uncoded is None:
        return "no rival that does not code ran"
    return f"{times_text(v.speedup)} ({method_label(v.uncoded)})"


@block("unseen-check")
def unseen_check() -> str | None:
    if not (RESULTS / FILE).exists():
        return None
    data = load(FILE)
    cells = data["cells"]
    rows, met, sync_met = [], 0, 0
    for name, cell, mine, sync in _verdicts():
        met += mine.met
        sync_met += sync.met
        switched = [r for r in cell["runs"] if r["method"] == ASYNC]
        rows.append([name, stats_cell(mine.auto), _reading(mine),
                     stats_cell(sync.auto), _reading(sync),
                     f"{sum(r.get('lagged_at') is not None for r in switched)} of "
                     f"{len(switched)}"])
    quick = " (the harness's quick slice, not a reading)" if data.get("quick") else ""
    never = sum(row[-1].startswith("0 of") for row in rows)
    head = (f"In the {len(cells)} settings outside the grid that amendment 33 registered before "
            f"any run (evaluation seeds {data['seeds']}, used nowhere before; "
            f"`python -m experiments.unseen_check`, `results/{FILE}`){quick}, the asynchronous "
            f"`s='auto'` met the goal (median time within 1.05× of the best rival's, median "
            f"final accuracy within 0.5 point) in {met} of {len(cells)}; the synchronous "
            f"`auto` in {sync_met}. Median time to target (seeds that reached it), the ratio to "
            "the best rival of wait-for-all, deadline-best, first-k, FedBuff and the fixed "
            "codes, and how many of the asynchronous runs switched to replication (in "
            f"{never} of the {len(cells)} settings none did: there it ran as FedBuff itself, "
            "and met or missed the goal as FedBuff did):")
    hard = [(name, mine) for name, _, mine, _ in _verdicts() if mine.hard]
    if hard:
        head += (f" Where stragglers are persistent or heavy-tailed on non-IID partitions "
                 f"({len(hard)} of the settings), it was at least 2× faster than the best "
                 f"rival that does not code in {sum(v.fast for _, v in hard)} of {len(hard)}: "
                 + "; ".join(f"{name} {_speedup(v)}" for name, v in hard) + ".")
    return head + "\n\n" + table(
        ["setting", "s='auto' asynchronous", "against the best rival",
         "auto (rounds)", "against the best rival", "switched"], rows)
