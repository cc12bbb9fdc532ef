"""Amendment 25's reading (``python -m experiments.async_margin``): the margin runs through
the harness as the class's ``replicate_margin``, the pick is amendment 24's rule over the
margins, and the block counts the margin's runs against FedBuff, ``s = 1`` and the bar."""

from __future__ import annotations

import pytest

from experiments.async_bar import MARGIN, choose

pytestmark = [
    pytest.mark.filterwarnings("ignore:fraction_evaluate"),
    pytest.mark.filterwarnings("ignore:gradient_coding_mod. no partition key:UserWarning"),
]


def test_the_margin_reading_picks_by_the_worst_ratio_then_the_median_then_the_lower_z():
    assert choose({0.0: [1.2, 1.0], 1.0: [1.1, 1.0], 2.0: [1.1, 1.0]}, MARGIN.prefer) == 1.0
    assert choose({0.0: [1.1, 1.0], 1.0: [1.1, 1.0]}, MARGIN.prefer) == 0.0
    assert choose({0.0: [2.0, 1.0], 3.0: [1.5, 1.4], 1.0: [1.5, 1.3]}, MARGIN.prefer) == 1.0
    assert MARGIN.keywords(2) == {"replicate_below": 0.75, "replicate_margin": 2.0}


def test_a_margin_of_zero_runs_amendment_24s_bar_and_a_margin_changes_the_run(small_cell):
    from experiments.async_replication import cell_of
    from experiments.rival_runs import run_replicated

    grid, result = small_cell
    spec = cell_of(grid, result["settings"])
    bar = run_replicated(1, 10, spec, replicate_below=0.75)
    zero = run_replicated(1, 10, spec, **MARGIN.keywords(0.0))
    three = run_replicated(1, 10, spec, **MARGIN.keywords(3.0))
    assert zero["updates_per_partition"] == bar["updates_per_partition"]
    assert zero["accuracy_curve"] == bar["accuracy_curve"]
    assert three["method"] == "fedbuff-replicated:1@0.75~3"
    assert three["replicate_margin"] == 3.0
    assert three["replicated"] < bar["replicated"]


def _runs(method, times, final=0.9, **extra):
    return [{"method": method, "seed": s, "time_to_target": t, "final_accuracy": final, **extra}
            for s, t in enumerate(times, start=10)]


def test_the_block_counts_the_margin_and_says_whether_z_zero_reproduced():
    from tools.docgen.async_margin import render

    settings = {"latency": "persistent", "run_config": {}}
    cells = {"a": {"settings": settings,
                   "runs": _runs("auto", [10, 10]) + _runs("fedbuff", [5, 5])}}
    replication = {"cells": {"a": {"runs": _runs("fedbuff-replicated:1", [8, 8])}},
                   "settings": {"slow_classes": {}}}
    ratio = {"geomean": 1.0, "ci95": None, "paired": 2, "seeds": 2}
    parts = {"replicated": 1, "updates_per_partition": [1, 3]}
    seed_run = {"time_to_target": 1.0, "final_accuracy": 0.9}
    bar = {"dev": {"pick": 0.75, "cells": {"d": {"tried": {"0.75": {"per_seed": {
        "0": seed_run, "1": seed_run}}}}}},
        "cells": {"a": {"runs": _runs("fedbuff-bar", [6, 6])}}}
    dev = {"pick": 2.0, "worst": {"0.0": 2.0, "2.0": 1.5}, "median": {"0.0": 1.0, "2.0": 1.1},
           "cells": {"d": {"tried": {"0.0": {"per_seed": {
               "0": seed_run, "1": {**seed_run, "time_to_target": 1.5}}}}}}}
    assert render({"dev": dev}, bar, replication, cells, ["a"]).endswith(
        "Not read on the evaluation seeds yet.")
    data = {"dev": dev, "settings": {}, "cells": {"a": {
        "runs": _runs("fedbuff-margin", [5.2, 5.2], **parts), "over_fedbuff": ratio,
        "over_earlier": ratio}}}
    text = render(data, bar, replication, cells, ["a", "b"])
    assert "z = 2; the development runs of z = 0 equal amendment 24's in 1 of 2" in text
    assert "0: worst 2.00, median 1.00, 2: worst 1.50, median 1.10" in text
    assert "within 1.05× of the lower of FedBuff's and s = 1's in 1 of 1" in text
    assert "against amendment 24's bar θ = 0.75 (medians, the same seeds): faster in 1, " \
        "slower in 0, equal in 0 of 1" in text
    assert "(the bar in the same 1 cells: within 1.05× of the lower of FedBuff's and s = 1's " \
        "in 0, the goal met in 0, at worst 1.20×)" in text
    assert "Not read yet: b." in text
    assert "| a | 5.0 s (2/2) | 8.0 s (2/2) | 6.0 s (2/2) | 5.2 s (2/2) |" in text
    assert "| 1.04 | 25% |" in text


def test_the_need_reading_runs_the_low_bar_with_the_ratio_and_its_block_says_so():
    from experiments.async_bar import NEED
    from tools.docgen.async_margin import NEED_READING, render

    assert NEED.keywords(1.5) == {"replicate_below": 0.25, "need_ratio": 1.5}
    assert choose({1.25: [1.3, 1.0], 1.5: [1.3, 1.0], 2.0: [1.3, 1.0]}, NEED.prefer) == 1.5
    assert choose({1.25: [1.2, 1.1], 1.5: [1.3, 1.0], 2.0: [1.2, 1.0]}, NEED.prefer) == 2.0
    dev = {"pick": 2.0, "worst": {"1.25": 1.2, "1.5": 1.3, "2.0": 1.2},
           "median": {"1.25": 1.1, "1.5": 1.0, "2.0": 1.0}, "cells": {}}
    text = render({"dev": dev}, {}, {"cells": {}}, {}, [], NEED_READING)
    assert "ρ = 2). Not read on the evaluation seeds yet." in text
    assert "1.25: worst 1.20, median 1.10" in text
