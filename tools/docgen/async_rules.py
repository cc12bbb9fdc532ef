"""The ``async-rules`` block: every online replication rule the grid file registered for the
asynchronous ``s='auto'`` (amendments 24 to 29), one row each, from their results files: the
value picked on the development seeds, its worst and median development ratio to the best
fixed ``s`` (and the cell of the worst), its ratio in the cell whose slow clients hold data
no one else does at 100 clients, whether ``s='auto'`` runs it, and its evaluation reading
where it has one (how many cells read are within the goal's time of the lower of FedBuff's
and ``s = 1``'s median, and its worst)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tools.docgen.async_bar import METHOD as BAR_METHOD
from tools.docgen.async_bar import near_count, read_cells, worst_cell, worst_text
from tools.docgen.async_replication import ASYNC, benchmark_cells
from tools.docgen.core import RESULTS, block, load, table
from tools.docgen.rivals import COMPARE, GOAL_TIME, reported_cells

#: the cell where the slow clients' data is needed most (no one else holds two classes)
NEEDED = "slow-classes-2/digits-logreg/persistent/100x100"

#: (amendment, results file, method of its evaluation runs, what the rule is, its knob)
RULES = (
    (24, "async_bar.json", BAR_METHOD, "a bar θ on a neighbour's service", "θ"),
    (25, "async_margin.json", "fedbuff-margin", "the bar 0.75 and a margin z beyond chance",
     "z"),
    (26, "async_need.json", "fedbuff-need", "the bar 0.25, 1 while the last update is over ρ× "
     "the own partition's", "ρ"),
    (27, "async_latch.json", "fedbuff-latch", "as 26, latched", "ρ"),
    (28, "async_era.json", "fedbuff-era", "as 27, the update against its era's median, over "
     "its last three", "ρ"),
    (29, "async_prior.json", "fedbuff-prior", "as 28 over a cohort's era, 1 until read twice",
     "ρ"),
)


def _on_file() -> list[tuple[int, Mapping[str, Any], str, str, str]]:
    """``(amendment, its results, method, what, knob)`` of each of :data:`RULES` with a
    development reading on file."""
    return [(amendment, load(file), method, what, knob)
            for amendment, file, method, what, knob in RULES
            if (RESULTS / file).exists() and load(file).get("dev")]


def registered() -> int:
    """How many of :data:`RULES` have a development reading on file."""
    return len(_on_file())


def dev_worst_min() -> float:
    """The lowest development worst ratio among the rules on file."""
    return min(float(data["dev"]["worst"][str(data["dev"]["pick"])])
               for _, data, *_ in _on_file())


def auto_amendment() -> int:
    """The amendment whose rule the main job's asynchronous ``s='auto'`` runs (read off the
    ``AUTO_*`` constants)."""
    from fl_gradcode.flower.asynchronous import (
        AUTO_NEED_LATCH,
        AUTO_NEED_PRIOR,
        AUTO_NEED_RATIO,
        AUTO_NEED_REFERENCE,
        AUTO_REPLICATE_MARGIN,
    )

    need = AUTO_NEED_RATIO != float("inf")
    return (29 if AUTO_NEED_REFERENCE == "cohort" and AUTO_NEED_PRIOR
            else 28 if AUTO_NEED_REFERENCE == "era" else 27 if AUTO_NEED_LATCH
            else 26 if need else 25 if AUTO_REPLICATE_MARGIN else 24)


def _runs_auto(amendment: int, pick: float) -> bool:
    """Whether the main job's asynchronous ``s='auto'`` runs this amendment's pick."""
    from fl_gradcode.flower.asynchronous import (
        AUTO_NEED_RATIO,
        AUTO_REPLICATE_BELOW,
        AUTO_REPLICATE_MARGIN,
    )

    which = auto_amendment()
    value = {24: AUTO_REPLICATE_BELOW, 25: AUTO_REPLICATE_MARGIN}.get(which, AUTO_NEED_RATIO)
    return which == amendment and value == pick


def _row(amendment: int, data: Mapping[str, Any], method: str, what: str, knob: str,
         replication: Mapping[str, Any], cells: Mapping[str, Mapping[str, Any]]) -> list[str]:
    dev = data["dev"]
    pick = str(dev["pick"])
    ratios = {name: cell["tried"][pick]["ratio_to_best_fixed"]
              for name, cell in dev["cells"].items() if pick in cell["tried"]}
    worst = max(ratios, key=lambda name: ratios[name])
    read = read_cells(data, replication, cells, reported_cells(), method)
    where, value = worst_cell(read)
    reading = (f"{near_count(read)} of {len(read)}, at worst {value:.2f}× ({where})" if read
               else "amendment 24's runs (the same rule)" if amendment == 25
               and float(dev["pick"]) == 0.0 else "not run")
    return [str(amendment), what, f"{knob} = {float(dev['pick']):g}",
            f"{worst_text(dev['worst'][pick])} ({worst})", worst_text(dev["median"][pick]),
            worst_text(ratios[NEEDED]) if NEEDED in ratios else "-",
            "yes" if _runs_auto(amendment, float(dev["pick"])) else "no", reading]


def _best_fixed(records: list[Mapping[str, Any]]) -> str | None:
    """The fixed s with the lowest development median in :data:`NEEDED` (``None``: not
    run)."""
    for record in records:
        fixed = record["dev"]["cells"].get(NEEDED, {}).get("fixed")
        if fixed:
            return min(fixed, key=lambda s: float(fixed[s]))
    return None


@block("async-rules")
def async_rules() -> str | None:
    if not all((RESULTS / f).exists() for f in (ASYNC, COMPARE)):
        return None
    replication = load(ASYNC)
    cells = benchmark_cells(replication, load(COMPARE))
    on_file = _on_file()
    rows = [_row(*rule, replication, cells) for rule in on_file]
    needed = [float(r[5]) for r in rows if r[5] not in ("-", "∞")]
    medians = {r[0]: float(r[4]) for r in rows if r[4] != "∞"}
    lowest = min(medians, key=lambda a: (medians[a], int(a)))
    best = _best_fixed([data for _, data, *_ in on_file])
    summary = (f" In {NEEDED}, the cell whose slow clients hold what no one else does, every "
               f"rule took at least {min(needed):.2f}× the time of the best fixed s "
               f"(s = {best} there, serving every partition from the first job); the rule "
               f"with the lowest development median (amendment {lowest}, "
               f"{medians[lowest]:.2f}) took {dict((r[0], r[5]) for r in rows)[lowest]}× there."
               if needed and medians and best is not None else "")
    return ("Every online rule registered for the asynchronous `s='auto'`, each picked on "
            "the development seeds 0-2 of the same fifteen cells (its ratio: its median time "
            "to target over the best fixed s's, s = 0 being FedBuff; ∞: never reached), and "
            "read on the evaluation seeds 10-19 where it ran (cells within "
            f"{GOAL_TIME:g}× of the lower of FedBuff's and s = 1's median time). `s='auto'` "
            "runs the rule whose development worst ratio ranked first when it was registered; "
            "the evaluation seeds were seen between the amendments, so they are not an "
            "independent test of the family." + summary + "\n\n"
            + table(["amendment", "rule (s = 1)", "picked", "development worst (cell)",
                     "development median", f"development ratio in {NEEDED}",
                     "s='auto' runs it", "evaluation: within the goal's time"], rows))
