"""FedBuff given the care the deadline rival has: its server learning rate and its buffer ``K``
chosen on the development seeds of the same cell (the grid file's ``fedbuff_tune`` rule).

For every setting of ``fedbuff_tune_server_lr`` x ``fedbuff_tune_buffer_fraction`` (``K`` a
fraction of the cohort, the server steps as many client updates in all as ``rounds``
synchronous rounds), FedBuff runs on the development seeds; the pick is the setting the
verdict's own rule ranks first over those seeds: the lowest median time to target (a seed
that never reached it counting as infinitely slow), then the highest median final accuracy,
then the grid file's a-priori setting (``fedbuff_server_lr``, ``fedbuff_buffer_fraction``),
then the grid's order. While the pick sits at an edge of what was tried, the lists grow past
it and the rule picks again over everything tried, at most ``fedbuff_tune_extend`` times
(:func:`grown`). The reported seeds then run the pick only. FedBuff: Nguyen, Malik,
Zhan, Yousefpour, Rabbat, Malek, Huba, "Federated learning with buffered asynchronous
aggregation", AISTATS 2022, https://arxiv.org/abs/2106.06639 (its server learning rate and
``K`` are set per task there too).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from experiments.deadline_best import tried_record
from experiments.rival_runs import Cell

__all__ = ["FEDBUFF_RULE", "REPLICATION_A_PRIORI", "REPLICATION_CHOICES", "REPLICATION_RULE",
           "check_extend", "check_tuning_lists", "choose_replication", "fedbuff_runs",
           "fedbuff_settings", "grown", "note_overlap", "number_list", "tuned_fedbuff",
           "tuned_replication"]

#: What a cell's ``settings.fedbuff.tuning.rule`` says.
FEDBUFF_RULE = ("the (server_lr, buffer_fraction) of the grid with the lowest median time to "
                "target over the development seeds (never reached: infinite), then the "
                "highest median final accuracy, then the a-priori setting, then the grid's "
                "order (the order tried); while the pick has the largest or smallest server "
                "lr tried, or the smallest or largest K, the lists grow past it (lr x2 or /2, "
                "fraction /2 or x2 where K changes) and the pick is made again over every "
                "setting tried, at most extend times")


def number_list(values: Any, name: str, ok: Callable[[float], bool], what: str
                ) -> list[float]:
    """The grid file's list ``name`` as floats each ``ok`` (``what`` says how), or a
    ``ValueError`` naming the list or its bad value."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
        raise ValueError(f"{name}={values!r}: expected a non-empty list of numbers {what}")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                or not ok(float(v)):
            raise ValueError(f"{name}: {v!r} is not a number {what}")
        out.append(float(v))
    return out


def check_tuning_lists(rules: Mapping[str, Any]) -> tuple[list[float], list[float]]:
    """The grid file's ``(fedbuff_tune_server_lr, fedbuff_tune_buffer_fraction)`` as numbers,
    or a ``ValueError`` naming the bad list or a bad ``fedbuff_tune_extend``
    (:func:`check_extend`; checked before any run where FedBuff is tuned)."""
    check_extend(rules.get("fedbuff_tune_extend"))
    return (number_list(rules.get("fedbuff_tune_server_lr"), "fedbuff_tune_server_lr",
                  lambda v: v > 0, "> 0"),
            number_list(rules.get("fedbuff_tune_buffer_fraction"), "fedbuff_tune_buffer_fraction",
                  lambda v: 0 < v <= 1, "in (0, 1]"))


def check_extend(value: Any, name: str = "fedbuff_tune_extend") -> int:
    """The grid file's ``name`` (``fedbuff_tune_extend`` or ``first_k_tune_extend``; absent:
    0) as an integer >= 0, or a ``ValueError`` naming the bad value."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value < 0 or value != int(value):
        raise ValueError(f"{name}={value!r}: expected an integer >= 0 (how many times a "
                         "rival's tuning list may grow past an edge pick)")
    return int(value)


def note_overlap(tuning: dict[str, Any], rival: str, seeds: Sequence[int],
                 dev_seeds: Sequence[int], log: Callable[[str], None]) -> None:
    """Where a rival was tuned on seeds it also reports (``seeds`` and ``dev_seeds``
    overlap, as in a development reading), record them in its ``tuning``
    (``tuned_on_reported_seeds``) and say so: not a pre-registered reading."""
    overlap = sorted(set(seeds) & set(dev_seeds))
    if overlap:
        tuning["tuned_on_reported_seeds"] = overlap
        log(f"compare: {rival} is tuned on seeds it reports ({overlap}): not a "
            "pre-registered reading")


def grown(lrs: Sequence[float], fractions: Sequence[float], pick: tuple[float, float],
          cell: Cell) -> tuple[list[float], list[float]]:
    """``(server lrs, fractions)`` to add where ``pick = (server lr, fraction)`` is at an edge
    of the lists tried (empty lists: it is not): the largest lr tried, twice it; the smallest,
    half it; the smallest ``K`` tried (above 1), half the fraction; the largest ``K`` (below
    the cohort), twice the fraction (at most 1). A fraction is added only where its ``K``
    (:meth:`Cell.fedbuff_buffer` of ``cell``) is not one tried already."""
    def buffer_size(f: float) -> int:
        return dataclasses.replace(cell, fedbuff_buffer_fraction=f).fedbuff_buffer()

    lr, fraction = pick
    new_lrs = [v for v, edge in ((2 * lr, lr == max(lrs)), (lr / 2, lr == min(lrs))) if edge]
    ks = {buffer_size(f) for f in fractions}
    k = buffer_size(fraction)
    new_fracs: list[float] = []
    for v, edge in ((fraction / 2, k == min(ks)), (min(1.0, 2 * fraction), k == max(ks))):
        if edge and buffer_size(v) not in ks:
            ks.add(buffer_size(v))
            new_fracs.append(v)
    return new_lrs, new_fracs


def tuned_fedbuff(cell: Cell, dev_seeds: Sequence[int], server_lrs: Sequence[float],
                  fractions: Sequence[float],
                  run: Callable[[Cell, int], Mapping[str, Any]],
                  extend: int = 0) -> tuple[Cell, dict[str, Any]]:
    """``(cell with the pick, the tuning's record)``: ``run(cell, seed)`` is one FedBuff run
    (its record: ``time_to_target``, ``final_accuracy``) of ``cell``'s settings. ``extend``:
    how many times the lists may grow past an edge pick (:func:`grown`); the record's
    ``extensions`` lists each growth, ``at_edge`` says whether the final pick could grow
    further."""
    lrs, fracs = check_tuning_lists({"fedbuff_tune_server_lr": server_lrs,
                                     "fedbuff_tune_buffer_fraction": fractions})
    extend = check_extend(extend)
    if not dev_seeds:
        raise ValueError("FedBuff's tuning needs development seeds (--dev-seeds)")
    a_priori = (float(cell.fedbuff_server_lr), float(cell.fedbuff_buffer_fraction))
    results: list[dict[str, Any]] = []
    done: set[tuple[float, float]] = set()

    def score(i: int) -> tuple:
        r = results[i]
        time = r["median_time_to_target_all_seeds"]
        return (math.inf if time is None else time, -r["median_final_accuracy"],
                (r["server_lr"], r["buffer_fraction"]) != a_priori, i)

    extensions: list[dict[str, list[float]]] = []
    # fractions whose K is the same (a small cohort) run the same FedBuff: its runs once
    same: dict[tuple[float, int], list[Mapping[str, Any]]] = {}
    while True:
        for lr in lrs:
            for fraction in fracs:
                if (lr, fraction) in done:
                    continue
                done.add((lr, fraction))
                results.append(_tried(cell, lr, fraction, dev_seeds, run, same))
        best = results[min(range(len(results)), key=score)]
        more = grown(lrs, fracs, (best["server_lr"], best["buffer_fraction"]), cell)
        if len(extensions) == extend or not any(more):
            break
        extensions.append({"server_lr": more[0], "buffer_fraction": more[1]})
        lrs, fracs = lrs + more[0], fracs + more[1]
    chosen = dataclasses.replace(cell, fedbuff_server_lr=best["server_lr"],
                                 fedbuff_buffer_fraction=best["buffer_fraction"])
    return chosen, {"rule": FEDBUFF_RULE, "dev_seeds": [int(s) for s in dev_seeds],
                    "a_priori": {"server_lr": a_priori[0], "buffer_fraction": a_priori[1]},
                    "grid": results, "extend": extend, "extensions": extensions,
                    "at_edge": any(more),
                    "chosen": {"server_lr": best["server_lr"],
                               "buffer_fraction": best["buffer_fraction"]}}


def _tried(cell: Cell, lr: float, fraction: float, dev_seeds: Sequence[int],
           run: Callable[[Cell, int], Mapping[str, Any]],
           same: dict[tuple[float, int], list[Mapping[str, Any]]]) -> dict[str, Any]:
    """One setting's runs on the development seeds, as the tuning's record has them (those of
    a setting tried with the same server lr and ``K``, ``same``, when there is one)."""
    tried = dataclasses.replace(cell, fedbuff_server_lr=lr, fedbuff_buffer_fraction=fraction)
    key = (lr, tried.fedbuff_buffer())
    if key not in same:
        same[key] = [run(tried, int(seed)) for seed in dev_seeds]
    runs = same[key]
    return {"server_lr": lr, "buffer_fraction": fraction,
            "buffer_size": tried.fedbuff_buffer(), "server_steps": tried.fedbuff_steps(),
            **tried_record(runs)}


def fedbuff_settings(cell: Cell) -> dict[str, Any]:
    """What a cell records of FedBuff's settings (``settings.fedbuff``; its ``tuning`` and
    ``regime_round`` are added where FedBuff ran)."""
    return {"buffer_size": cell.fedbuff_buffer(), "concurrency": cell.cohort,
            "server_lr": cell.fedbuff_server_lr,
            "buffer_fraction": cell.fedbuff_buffer_fraction,
            "staleness_exponent": cell.fedbuff_staleness_exponent,
            "server_steps": cell.fedbuff_steps()}


#: ``fedbuff-replicated``: the extra copies of a partition tried, the a-priori one, the rule
REPLICATION_CHOICES = (0, 1, 2)
REPLICATION_A_PRIORI = 1
REPLICATION_RULE = (
    "s among 0, 1, 2 with the lowest median time to target over the development seeds "
    "(never reached: infinite), then the highest median final accuracy, then the a-priori "
    "s = 1, then the order 0, 1, 2 (FedBuff's ranking); s = 0 is FedBuff, read from the "
    "cell's tuning")


def choose_replication(tried: Mapping[int, Mapping[str, Any]]) -> int:
    """:data:`REPLICATION_RULE`'s pick among ``tried`` (``s`` -> its development record:
    ``median_time_to_target_all_seeds``, ``None`` when never reached, and
    ``median_final_accuracy``)."""
    def score(s: int) -> tuple:
        t = tried[s]["median_time_to_target_all_seeds"]
        return (math.inf if t is None else t, -tried[s]["median_final_accuracy"],
                s != REPLICATION_A_PRIORI, s)
    return min(tried, key=score)


def tuned_replication(cell: Cell, dev_seeds: Sequence[int],
                      fedbuff: Callable[[Cell, int], Mapping[str, Any]],
                      replicated: Callable[[Cell, int, int], Mapping[str, Any]]
                      ) -> tuple[int, dict[str, Any]]:
    """``(s, the record)`` of ``fedbuff-replicated`` in ``cell`` (FedBuff's settings as
    tuned): ``fedbuff(cell, seed)`` is FedBuff's run (``s = 0``), ``replicated(cell, s,
    seed)`` the replicated one's; picked by :data:`REPLICATION_RULE`."""
    if not dev_seeds:
        raise ValueError("fedbuff-replicated's s is picked on development seeds (--dev-seeds)")
    tried = {s: tried_record([fedbuff(cell, int(seed)) if s == 0 else
                              replicated(cell, s, int(seed)) for seed in dev_seeds])
             for s in REPLICATION_CHOICES}
    pick = choose_replication(tried)
    return pick, {"rule": REPLICATION_RULE, "dev_seeds": [int(x) for x in dev_seeds],
                  "tried": {str(s): rec for s, rec in tried.items()}, "chosen": pick}


def fedbuff_runs(method: str, cell: Cell, seeds: Sequence[int], dev_seeds: Sequence[int],
                 rules: Mapping[str, Any], runner: Any, log: Callable[[str], None]
                 ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``(runs, facts)`` of ``fedbuff`` tuned on ``dev_seeds`` (``cell.fedbuff_tune``) or of
    ``fedbuff-replicated`` (FedBuff's settings as tuned, or as given without the tuning;
    ``s`` by :func:`tuned_replication`) or of ``fedbuff-auto`` (the main job's
    asynchronous ``s='auto'``, FedBuff's settings as for ``fedbuff-replicated``).
    ``runner``: the benchmark's (:class:`experiments.runner.Runner`: its ``fedbuff``,
    ``rival``, ``replicated`` and ``auto_replicated`` runs,
    cached, so both methods share FedBuff's runs)."""
    def given(_: Cell, seed: int) -> Mapping[str, Any]:  # FedBuff as the cell sets it
        return runner.rival("fedbuff", seed)

    tuned, facts = cell, {}
    fedbuff: Callable[[Cell, int], Mapping[str, Any]] = given
    if cell.fedbuff_tune:
        tuned, tuning = tuned_fedbuff(cell, dev_seeds, rules["fedbuff_tune_server_lr"],
                                      rules["fedbuff_tune_buffer_fraction"], runner.fedbuff,
                                      rules.get("fedbuff_tune_extend"))
        note_overlap(tuning, "FedBuff", seeds, dev_seeds, log)
        facts["fedbuff"] = {**fedbuff_settings(tuned), "tuning": tuning}
        fedbuff = runner.fedbuff
    if method == "fedbuff":
        return [{**fedbuff(tuned, seed), "method": method} for seed in seeds], facts
    if method == "fedbuff-auto":  # the main job's s='auto': no s tuned, FedBuff's K and lr
        return [runner.auto_replicated(tuned, seed) for seed in seeds], facts
    s, replication = tuned_replication(tuned, dev_seeds, fedbuff, runner.replicated)
    note_overlap(replication, method, seeds, dev_seeds, log)
    facts["fedbuff_replicated"] = replication
    runs = [{**(fedbuff(tuned, seed) if s == 0 else runner.replicated(tuned, s, seed)),
             "method": method, "s": s} for seed in seeds]
    return runs, facts
