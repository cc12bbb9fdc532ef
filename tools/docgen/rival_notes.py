"""The notes under the results table on how the rivals ran in the finished cells: which
cells have the rivals' fixes (amendment 11 of ``experiments/grid.toml``), auto's stop at the
round's end (amendment 15) and the fixed codes' (amendment 19), FedBuff tuned (amendment 12),
and which searched deadlines the grid file now lists, or picked one at the edge of its
grid."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tools.docgen import rivals

__all__ = ["auto_stops", "codes_care", "codes_own", "codes_own_deadline", "codes_stop",
           "deadline_grids", "fedbuff_tuned", "rival_fixes", "split_codes"]


def grid_data() -> dict[str, Any]:
    """The grid file (looked up in :mod:`tools.docgen.rivals` at each call)."""
    return rivals.grid_data()


def rival_fixes(data: Mapping[str, Any], done: Sequence[str]) -> list[str]:
    """Which finished cells ran the rivals with the fixes of the grid file's amendment 11
    (``settings.rivals_stop_dropped_work`` true and, in a drift cell, FedBuff's
    ``regime_round`` the federation's), when some did not."""
    def has_fixes(settings: Mapping[str, Any]) -> bool:
        fedbuff = settings.get("fedbuff", {}).get("regime_round") == "federation"
        return settings.get("rivals_stop_dropped_work") is True and (
            settings.get("latency") != "drift" or fedbuff)

    fixed = [n for n in done if has_fixes(data["cells"][n]["settings"])]
    if len(fixed) == len(done):
        return []
    return [f"The rivals' fixes of `experiments/grid.toml` amendment 11 (deadline, "
            "deadline-best and first-k stop a client's work when its reply is dropped, as "
            "auto's clients stop theirs at its deadline; FedBuff meets a drifting regime at "
            f"the federation's round) are in {len(fixed)} of the {len(done)} finished cells; "
            "in the others those rivals' runs predate them: a dropped client finished its "
            "late work while its next message waited, which slowed them, so there the "
            "verdict may flatter auto."]


def auto_stops(data: Mapping[str, Any], done: Sequence[str]) -> list[str]:
    """Once the grid file's ``auto_stop_at_decode`` is on (amendment 15), the finished cells
    whose ``auto`` runs predate it (``settings.auto_stop_at_decode`` not true), when some do."""
    if not grid_data()["rules"].get("auto_stop_at_decode"):
        return []
    old = [n for n in done if data["cells"][n]["settings"].get("auto_stop_at_decode") is not True]
    if not old:
        return []
    new = [n for n in done if n not in old]
    which = (f"; in {', '.join(old)} auto's runs predate it" if len(old) <= len(new)
             else f" ({', '.join(new) or 'none'}); in the others auto's runs predate it")
    return [f"auto's late work stops when its round ends (`experiments/grid.toml` amendment "
            f"15) in {len(new)} of the {len(done)} finished cells{which} (its clients' work "
            "stopped at the round's deadline)."]


def codes_own_deadline(cell: Mapping[str, Any]) -> bool:
    """Every fixed code the cell ran stopped waiting at its own deadline (amendment 21:
    ``settings.code_deadlines_s`` names it)."""
    own = cell["settings"].get("code_deadlines_s") or {}
    codes = {r["method"] for r in cell["runs"] if rivals.is_code(r["method"])}
    return bool(codes) and codes <= set(own)


def codes_care(cell: Mapping[str, Any]) -> int:
    """How much of auto's care the cell's fixed codes had: 2, their late work stopped at the
    round's end (amendment 19) and each its own deadline (amendment 21); 1, the stop only;
    0, neither."""
    if cell["settings"].get("codes_stop_at_decode") is not True:
        return 0
    return 2 if codes_own_deadline(cell) else 1


def _codes_with(data: Mapping[str, Any], done: Sequence[str], rule: str,
                has: Callable[[Mapping[str, Any]], bool]) -> tuple[list[str], list[str]] | None:
    """``(cells, ran)``: the finished cells that ran a fixed code, and those of them that
    ``has`` the care of the grid file's ``rule``, once the rule is on and some lack it;
    else ``None`` (no note)."""
    if not grid_data()["rules"].get(rule):
        return None
    ran = [n for n in done if any(rivals.is_code(r["method"]) for r in data["cells"][n]["runs"])]
    new = [n for n in ran if has(data["cells"][n])]
    return None if len(new) == len(ran) else (new, ran)


def codes_own(data: Mapping[str, Any], done: Sequence[str]) -> list[str]:
    """Once the grid file's ``codes_own_deadline`` is on (amendment 21), in how many finished
    cells every fixed code stopped waiting at the stated rule read from its own client
    times, when some did not."""
    counted = _codes_with(data, done, "codes_own_deadline", codes_own_deadline)
    if counted is None:
        return []
    new, ran = counted
    which = f" ({', '.join(new)})" if new else ""
    return [f"Each fixed code stops waiting at the stated deadline rule read from its own "
            f"clients' times (`experiments/grid.toml` amendment 21) in {len(new)} of the "
            f"{len(ran)} finished cells that ran them{which}; in the others the codes stopped "
            "at wait-for-all's stated deadline, read from clients computing one partition "
            "where theirs compute s + 1."]


def codes_stop(data: Mapping[str, Any], done: Sequence[str]) -> list[str]:
    """Once the grid file's ``codes_stop_at_decode`` is on (amendment 19), in how many
    finished cells the fixed codes ran with their late work stopped at the round's end
    (``settings.codes_stop_at_decode`` true), when some did not."""
    counted = _codes_with(data, done, "codes_stop_at_decode",
                          lambda cell: cell["settings"].get("codes_stop_at_decode") is True)
    if counted is None:
        return []
    new, ran = counted
    which = f" ({', '.join(new)})" if new else ""
    return [f"The fixed codes' late work stops when their round ends, as auto's does "
            f"(`experiments/grid.toml` amendment 19), in {len(new)} of the {len(ran)} "
            f"finished cells that ran them{which}; in the others their clients computed on "
            "until the round's deadline and, still busy, got no work in the next round, so "
            "fewer of their rounds decoded exactly: there the best-code column, and the "
            "verdict where a code could be the best rival, may flatter auto."]


def fedbuff_tuned(data: Mapping[str, Any], done: Sequence[str]) -> list[str]:
    """Which finished cells ran FedBuff tuned on the development seeds (the grid file's
    amendment 12: ``settings.fedbuff.tuning``), naming those whose FedBuff predates it or
    the growth of its lists (amendment 16), and in how many the pick is at an edge of the
    settings tried (FedBuff may do better still beyond them)."""
    cells = data["cells"]
    ran = [n for n in done if any(r.get("method") == "fedbuff" for r in cells[n]["runs"])]
    tuned = [n for n in ran if "tuning" in cells[n]["settings"].get("fedbuff", {})]
    notes = []
    if len(tuned) < len(ran):
        rules = grid_data()["rules"]
        untuned = [n for n in ran if n not in tuned]
        notes.append(
            "FedBuff's server learning rate and K are tuned on the development seeds "
            f"(`experiments/grid.toml` amendment 12) in {len(tuned)} of the {len(ran)} "
            "finished cells that ran it; in " + ", ".join(untuned) + " it ran with the values "
            f"fixed a priori (server lr {float(rules['fedbuff_server_lr']):g}, K "
            f"{float(rules['fedbuff_buffer_fraction']):g} of the cohort), so there the verdict "
            "may flatter auto.")
    grew = [n for n in tuned if "extensions" in cells[n]["settings"]["fedbuff"]["tuning"]]
    edge = large_lr = small_k = 0
    for n in tuned:
        tuning = cells[n]["settings"]["fedbuff"]["tuning"]
        lrs = [g["server_lr"] for g in tuning["grid"]]
        fracs = [g["buffer_fraction"] for g in tuning["grid"]]
        chosen = tuning["chosen"]
        top = len(set(lrs)) > 1 and chosen["server_lr"] == max(lrs)
        least = len(set(fracs)) > 1 and chosen["buffer_fraction"] == min(fracs)
        if n in grew:
            # amendment 16's record says whether the pick could grow further (a pick at K = 1
            # has no smaller K; an edge may also be the smallest lr or the largest K)
            if not tuning["at_edge"]:
                continue
            least = least and min(g["buffer_size"] for g in tuning["grid"]) > 1
        elif not (top or least):
            continue
        edge += 1
        large_lr += top
        small_k += least
    if tuned and float(grid_data()["rules"].get("fedbuff_tune_extend") or 0) > 0 \
            and len(grew) < len(tuned):
        old = [n for n in tuned if n not in grew]
        which = (f"; in {', '.join(old)} FedBuff predates it" if len(old) <= len(grew)
                 else f" ({', '.join(grew) or 'none'}); in the others FedBuff predates it")
        notes.append(
            "FedBuff's tuning lists grow past an edge pick (`experiments/grid.toml` amendment "
            f"16) in {len(grew)} of the {len(tuned)} tuned cells{which} (the lists only).")
    if edge:
        notes.append(f"In {edge} of the {len(tuned)} tuned cells FedBuff's pick is at an edge "
                     "of the settings tried (`settings.fedbuff.tuning`"
                     + ("; where its lists grew, after their last growth" if grew else "")
                     + f"; the largest server lr in {large_lr}, the smallest K in {small_k}): "
                     "it may do better still beyond them"
                     + (" (a smaller K also reads FedBuff's accuracy more often, which by "
                        "itself can bring its first reading above the target sooner: "
                        "`docs/adaptive.md`, At a glance)" if small_k else "") + ".")
    return notes


def deadline_grids(data: Mapping[str, Any], done: Sequence[str]) -> list[str]:
    """Which grid of deadlines each finished cell's ``deadline-best`` searched, when some
    searched fewer multiples of the stated deadline than the grid file now lists."""
    multiples = [float(m) for m in grid_data()["rules"]["deadline_grid"]]
    short, edge, ran = [], [], 0
    for name in done:
        settings = data["cells"][name]["settings"]
        if "deadline_grid_s" not in settings:
            continue
        ran += 1
        tried = {round(d / settings["stated_deadline_s"], 6)
                 for d in settings["deadline_grid_s"]}
        if not {round(m, 6) for m in multiples} <= tried:
            short.append((name, min(tried)))
        if settings.get("deadline_best_s") in (min(settings["deadline_grid_s"]),
                                               max(settings["deadline_grid_s"])):
            edge.append(name)
    limit = int(grid_data()["rules"].get("deadline_grid_extend", 0))
    older = [n for n in edge
             if int(data["cells"][n]["settings"].get("deadline_grid_grown", -1)) < limit]
    why = [] if limit else ["not extended"]
    if older and limit:
        why.append(f"in {', '.join(older)} its grid predates its growth past an edge pick "
                   "(`experiments/grid.toml` amendment 20)")
    if len(older) < len(edge):
        why.append(f"in {', '.join(n for n in edge if n not in older)} it grew as many times "
                   "as the grid file allows")
    notes = [] if not edge else [
        f"In {len(edge)} of the {ran} finished cells that ran it `deadline-best`'s pick is the "
        "shortest or the longest deadline of its grid (" + ", ".join(edge) + "): a deadline "
        "beyond the grid may do better still, so there the best rival may be faster than shown ("
        + "; ".join(why) + ")."]
    if not short:
        return notes
    return [*notes, f"`deadline-best` searched the grid file's {len(multiples)} multiples of "
            f"the stated deadline ({multiples[0]:g}–{multiples[-1]:g}) in {ran - len(short)} of "
            f"the {ran} finished cells that ran it; in "
            + ", ".join(f"{n} (from {m:g})" for n, m in short)
            + " the shorter deadlines added by an amendment have not run yet, so its best "
            "deadline there may be better than shown."]


def split_codes(data: Mapping[str, Any], done: Sequence[str]) -> list[str]:
    """Which finished cells kept runs of a fixed code whose construction had fewer partitions
    than the cohort (the app's data split ``k`` ways: the same model only for one full-batch
    gradient, where the grid kept them): the ServerApp now builds every code with one
    partition per client, so a re-run of them would differ."""
    from experiments.registry import grid_code_k, parse_code
    from fl_gradcode.config import merge_config

    split: dict[str, dict[str, list[str]]] = {}
    for name in done:
        cell = data["cells"][name]
        settings = cell["settings"]
        m = int(merge_config(settings.get("run_config", {}))["m"])
        cohort = int(settings["cohort"])
        for method in sorted({r["method"] for r in cell["runs"] if ":" in r["method"]}):
            code, s = parse_code(method)
            ran = {r.get("code_partitions") for r in cell["runs"] if r["method"] == method}
            # runs from before the record named it: the construction the grid then ran
            k = max(ran) if None not in ran else grid_code_k(
                code, s, cohort, m if code == "comm-efficient" else None)
            if k != cohort:
                split.setdefault(method, {}).setdefault(
                    f"k = {k} at a cohort of {cohort}", []).append(name)
    def cells(count: int) -> str:
        return f"{count} finished cell" + ("" if count == 1 else "s")

    return [f"{method}'s runs in {cells(sum(map(len, sizes.values())))} "
            f"({'; '.join(f'{size}: ' + ', '.join(names) for size, names in sizes.items())}) "
            "used the construction the grid ran, with fewer partitions than the cohort: the "
            "app's data split k ways (there one full-batch gradient, so the same model). The "
            "ServerApp now gives every code one partition per client (the leftover clients "
            "join groups, whose members compute more), so a re-run would differ."
            for method, sizes in sorted(split.items())]


def first_k_care(data: Mapping[str, Any], done: Sequence[str]) -> list[str]:
    """In how many finished cells first-k ran with its over-commitment fixed a priori (no
    ``settings.first_k.tuning``: the grid file's amendment 18 tunes it on the development
    seeds, as the deadline rival and FedBuff are), where the verdict may flatter auto; and
    in how many tuned cells the pick is still at an edge of the values tried."""
    cells = data["cells"]
    ran = [n for n in done if any(r.get("method") == "first-k" for r in cells[n]["runs"])]
    untuned = [n for n in ran if "tuning" not in cells[n]["settings"].get("first_k", {})]
    edge = [n for n in ran if n not in untuned
            and cells[n]["settings"]["first_k"]["tuning"].get("at_edge")]
    notes = [] if not edge else [
        f"In {len(edge)} of the {len(ran) - len(untuned)} cells where first-k's over-commitment "
        "is tuned its pick is still at an edge of the values tried after their growths "
        "(`settings.first_k.tuning`: " + ", ".join(
            f"{n} c = {float(cells[n]['settings']['first_k']['overcommit']):g}" for n in edge)
        + "): it may do better still beyond them."]
    if not untuned:
        return notes
    c = sorted({float(cells[n]["settings"].get("first_k", {}).get("overcommit", 0.0))
                for n in untuned})
    return [f"first-k ran with its over-commitment c = {', '.join(f'{v:g}' for v in c)} fixed "
            f"a priori in {len(untuned)} of the {len(ran)} finished cells that ran it, not "
            "tuned on the development seeds as the deadline and FedBuff are "
            "(`experiments/grid.toml` amendment 18, not yet run in those cells): there its "
            "column, and the "
            "verdict where first-k could be the best rival, may flatter auto.", *notes]
