"""The overview's paired reading of each online rule against the lower of FedBuff and s = 1:
slower or faster beyond chance only where the per-seed ratios' 95 % interval leaves 1."""

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


def test_a_rule_clearly_slower_than_the_lower_one_is_counted_slower():
    factors = [1.3, 1.25, 1.35, 1.3, 1.28, 1.32, 1.3, 1.27, 1.3, 1.31]
    mine = [t * f for t, f in zip(FEDBUFF, factors, strict=True)]
    # the reference agrees
    assert _interval([m / f for m, f in zip(mine, FEDBUFF, strict=True)])[0] > 1
    assert beyond_chance(_runs("r", mine), _runs("fedbuff", FEDBUFF), _runs("s1", S1)) == 1


def test_the_lower_one_is_picked_by_median_so_s1_can_be_the_reference():
    # slower than s = 1's times would be faster than FedBuff's: the lower (s = 1) decides
    mine = [t * 0.7 for t in FEDBUFF]
    assert beyond_chance(_runs("r", mine), _runs("fedbuff", [3 * t for t in FEDBUFF]),
                         _runs("s1", FEDBUFF)) == -1
    assert beyond_chance(_runs("r", mine), _runs("fedbuff", FEDBUFF),
                         _runs("s1", [3 * t for t in FEDBUFF])) == -1


def test_noise_around_the_lower_one_is_not_beyond_chance():
    jitter = [1.4, 0.7, 1.2, 0.8, 1.3, 0.75, 1.1, 0.9, 1.25, 0.85]
    mine = [t * j for t, j in zip(FEDBUFF, jitter, strict=True)]
    low, high = _interval(jitter)
    assert low < 1 < high
    assert beyond_chance(_runs("r", mine), _runs("fedbuff", FEDBUFF), _runs("s1", S1)) == 0


def test_a_seed_never_reached_counts_as_twice_the_time():
    # never reaching the target on every seed where the reference did: ratio 2 on each seed
    mine = [None] * 10
    assert beyond_chance(_runs("r", mine), _runs("fedbuff", FEDBUFF), _runs("s1", S1)) == 1
    # both never: ratio 1 on each seed, no interval width: not beyond chance
    never = [None] * 10
    assert beyond_chance(_runs("r", never), _runs("fedbuff", never), _runs("s1", never)) == 0


def test_unpaired_seeds_read_nothing():
    mine = [3 * t for t in FEDBUFF]
    assert beyond_chance(_runs("r", mine, first=0), _runs("fedbuff", FEDBUFF),
                         _runs("s1", S1)) == 0


def test_the_counts_name_the_cells_each_way():
    slow = [2 * t for t in FEDBUFF]
    fast = [0.5 * t for t in FEDBUFF]
    data = {"cells": {"a": {"runs": _runs("m", slow)}, "b": {"runs": _runs("m", fast)},
                      "c": {"runs": _runs("m", FEDBUFF)}, "d": {"runs": _runs("m", slow)}}}
    cells = {name: {"runs": _runs("fedbuff", FEDBUFF)} for name in "abc"}  # d: not a cell
    replication = {"cells": {name: {"runs": _runs("fedbuff-replicated:1", S1)}
                             for name in "abc"}}
    assert chance_counts(data, "m", replication, cells) == (["a"], ["b"], 3)
