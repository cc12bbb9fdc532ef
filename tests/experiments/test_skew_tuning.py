"""The registered tuning of auto-approximate's starvation bound (``experiments/grid.toml``
amendment 14, ``python -m experiments.tune_auto_approximate --skew``): what it will run,
checked before it runs."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_skew_grid_tunes_max_skew_alone_with_the_bound_off_first():
    from experiments.tune_auto_approximate import OUT, SKEW_GRID
    from fl_gradcode.flower.approximate_rounds import ApproximateRounds

    # every other knob at the value the latest finished tuning chose (the library's default)
    chosen = json.loads((ROOT / OUT).read_text())["chosen"]["knobs"]
    assert {k: v for k, v in SKEW_GRID.items() if k != "max_skew"} == {
        k: [v] for k, v in chosen.items()}
    # the bound off is the default and listed first (a tie keeps it), then looser to tighter
    assert ApproximateRounds.max_skew is None
    assert SKEW_GRID["max_skew"][0] is None
    bounds = SKEW_GRID["max_skew"][1:]
    assert bounds == sorted(bounds, reverse=True) and all(0 < b < 1 for b in bounds)


def test_its_added_cells_give_two_classes_to_the_persistently_slow_clients_only():
    from experiments.compare import cell_run_config, load_grid, lookup, task_target
    from experiments.tune_auto_approximate import SLOW_CLASSES, tuning_cell

    grid = load_grid()
    task = lookup(grid, "tasks", "digits-logreg")
    assert {n for _, n, _ in SLOW_CLASSES} == {20, 100}
    for regime, n, k in SLOW_CLASSES:
        cell = tuning_cell(grid, regime, n, sets={"slow-classes": k})
        assert cell.run_config == cell_run_config(grid, "digits-logreg", regime,
                                                  {"slow-classes": k})
        assert (cell.run_config["slow-classes"], cell.run_config["latency"]) == (2, regime)
        assert (cell.n, cell.cohort, cell.target) == (n, n, task_target(task, n, n))
