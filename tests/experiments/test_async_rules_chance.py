"""The overview's paired reading of each candidate against a fixed reference (FedBuff, or
s = 1): slower or faster beyond chance only where the per-seed ratios' 95 % interval leaves
1; a candidate is never read against itself."""

from __future__ import annotations

import math

from scipy import stats

from tools.docgen.async_rules import beyond_chance, chance_counts


def _runs(method: str, times: list[float | None], first: int = 10) -> list[dict]:
    return [{"method": method, "seed": first + i, "time_to_target": t}
            for i, t in enumerate(times)]


def _interval(ratios: list[float]) -> tuple[float, float]:
    """A reference apart from the code under test: the Student-t interval of the mean log."""
    logs = [math.log(r) for r in ratios]
    n = len(logs)
    mean = sum(logs) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1))
    half = stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
    return math.exp(mean - half), math.exp(mean + half)


FEDBUFF = [1.0, 1.2, 0.9, 1.1, 1.3, 1.0, 0.8, 1.2, 1.1, 1.0]
S1 = [2.0, 2.2, 1.9, 2.4, 2.1, 2.0, 1.8, 2.2, 2.5, 2.0]
FACTORS = [1.3, 1.25, 1.35, 1.3, 1.28, 1.32, 1.3, 1.27, 1.3, 1.31]


def test_clearly_slower_is_slower_and_clearly_faster_is_faster():
    mine = [t * f for t, f in zip(FEDBUFF, FACTORS, strict=True)]
    # the reference agrees
    assert _interval([m / f for m, f in zip(mine, FEDBUFF, strict=True)])[0] > 1
    assert beyond_chance(_runs("r", mine), _runs("fedbuff", FEDBUFF)) == 1
    assert beyond_chance(_runs("r", FEDBUFF), _runs("fedbuff", mine)) == -1


def test_noise_around_the_reference_is_not_beyond_chance():
    jitter = [1.4, 0.7, 1.2, 0.8, 1.3, 0.75, 1.1, 0.9, 1.25, 0.85]
    mine = [t * j for t, j in zip(FEDBUFF, jitter, strict=True)]
    low, high = _interval(jitter)
    assert low < 1 < high
    assert beyond_chance(_runs("r", mine), _runs("fedbuff", FEDBUFF)) == 0


def test_a_seed_never_reached_counts_as_twice_the_time():
    assert beyond_chance(_runs("r", [None] * 10), _runs("fedbuff", FEDBUFF)) == 1
    assert beyond_chance(_runs("r", FEDBUFF), _runs("fedbuff", [None] * 10)) == -1
    # both never: ratio 1 on each seed, no width: not beyond chance
    assert beyond_chance(_runs("r", [None] * 10), _runs("fedbuff", [None] * 10)) == 0


def test_a_reading_whose_seeds_do_not_all_pair_reads_nothing():
    slow = [3 * t for t in FEDBUFF]
    assert beyond_chance(_runs("r", slow, first=0), _runs("fedbuff", FEDBUFF)) == 0
    # nine of ten seeds paired: still nothing (a partial pairing would read 1)
    partial = _runs("fedbuff", FEDBUFF[:9])
    assert beyond_chance(_runs("r", slow), partial) == 0
    assert beyond_chance(_runs("r", slow[:9]), partial) == 1


def test_the_counts_name_the_cells_each_way_against_either_reference():
    slow, fast = [2 * t for t in FEDBUFF], [0.5 * t for t in FEDBUFF]
    data = {"cells": {"a": {"runs": _runs("m", slow)}, "b": {"runs": _runs("m", fast)},
                      "c": {"runs": _runs("m", FEDBUFF)}, "d": {"runs": _runs("m", slow)}}}
    cells = {name: {"runs": _runs("fedbuff", FEDBUFF)} for name in "abc"}  # d: not a cell
    # s = 1 twice as slow as FedBuff: against it, a is level, b and c faster
    replication = {"cells": {name: {"runs": _runs("fedbuff-replicated:1", slow)}
                             for name in "abc"}}
    assert chance_counts(data, "m", replication, cells) == (["a"], ["b"], 3)
    assert chance_counts(data, "m", replication, cells, "fedbuff-replicated:1") == (
        [], ["b", "c"], 3)
    # s = 1 is never read against itself
    assert chance_counts(data, "fedbuff-replicated:1", replication, cells,
                         "fedbuff-replicated:1") is None


def test_the_fedbuff_auto_check_says_so_when_no_evaluation_run_is_on_record(monkeypatch):
    """Before the evaluation runs of the rule s='auto' runs are on record there is nothing
    to compare the check's runs with: the block says so, not '0 of 10'."""
    from tools.docgen import async_rules

    real = async_rules.load
    with_runs = async_rules.fedbuff_auto_check()
    assert with_runs is not None and " of 10 seeds" in with_runs

    def no_cells(name):
        data = real(name)
        return {k: v for k, v in data.items() if k != "cells"} if "lag" in name else data

    monkeypatch.setattr(async_rules, "load", no_cells)
    text = async_rules.fedbuff_auto_check()
    assert "not on record yet" in text and " of 10 seeds" not in text
