"""The ``target-held`` block of docs/adaptive.md, from a small synthetic
``results/compare.json``: the time a run first reaches the target against the time it holds it
(the first evaluation after which none is below the target). Every expected value is worked
out by hand in the comments."""

from __future__ import annotations

import math

from tools.docgen import held

TARGET = 0.5


def _run(method, seed, curve):
    first = next((t for t, a in curve if a >= TARGET), None)
    return {"method": method, "seed": seed, "time_to_target": first,
            "final_accuracy": curve[-1][1], "accuracy_curve": [[t, a, 1.0] for t, a in curve]}


def test_held_time_is_the_start_of_the_last_stretch_at_or_above_the_target():
    # above at 1, below at 2, above from 3 on: held from 3
    assert held.held_time([[1, 0.6], [2, 0.4], [3, 0.5], [4, 0.7]], TARGET) == 3
    # never below: held from the first evaluation at or above it
    assert held.held_time([[1, 0.1], [2, 0.55], [3, 0.6]], TARGET) == 2
    # ends below: never held
    assert math.isinf(held.held_time([[1, 0.6], [2, 0.6], [3, 0.49]], TARGET))
    assert math.isinf(held.held_time([], TARGET))


def _data():
    # auto: steady, reaches 0.5 at 4 and stays (seeds 10, 11); a development-seed run (0)
    # that would change every median is left out.
    # FedBuff: crosses at 1, falls back, holds from 6 (seed 10); crosses at 2, ends below (11).
    runs = [
        _run("auto", 10, [(2, 0.3), (4, 0.5), (6, 0.6)]),
        _run("auto", 11, [(2, 0.3), (4, 0.55), (6, 0.6)]),
        _run("auto", 0, [(1, 0.9), (2, 0.9)]),
        _run("fedbuff", 10, [(1, 0.6), (3, 0.4), (6, 0.6)]),
        _run("fedbuff", 11, [(2, 0.5), (4, 0.45)]),
    ]
    cell = {"settings": {"seeds": [10, 11], "target": TARGET}, "runs": runs}
    return {"cells": {"t/persistent/2x2": cell}, "done": ["t/persistent/2x2"]}


def test_the_block_reads_first_and_held_times_and_counts_the_swap():
    text = held.render_held(_data(), ["t/persistent/2x2"])
    # auto: first 4, 4 -> 4.0 s; held 4, 4 -> 4.0 s
    # FedBuff: first 1, 2 -> median 1.5 s; held 6, inf -> median inf; one seed ends below
    # first-k: no runs -> "-"
    assert "| t/persistent/2x2 | 4.0 s / 4.0 s | 1.5 s / ∞ (1/2 end below) | - |" in text
    # FedBuff first (1.5 < 4.0), auto holds first (4.0 < inf): the order swaps
    assert "swap order between the two readings: 1 of 1 (t/persistent/2x2)" in text


def test_no_block_without_a_finished_cell():
    assert held.render_held({"cells": {}, "done": []}, []) is None
