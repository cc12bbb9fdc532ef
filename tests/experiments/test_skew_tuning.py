"""The registered tuning of auto-approximate's starvation bound (``experiments/grid.toml``
amendment 14, ``python -m experiments.tune_auto_approximate --skew``): what it will run,
checked before it runs."""

from __future__ import annotations

import dataclasses
import json
import types
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


def test_the_library_runs_what_the_skew_tuning_chose():
    """Its results file is this grid's, and every knob of its chosen setting, the bound
    included, is the library's default."""
    from experiments.tune_auto_approximate import SKEW_GRID, SKEW_OUT, SLOW_CLASSES
    from fl_gradcode.flower.approximate_rounds import ApproximateRounds

    result = json.loads((ROOT / SKEW_OUT).read_text())
    assert result["grid"] == SKEW_GRID
    assert [tuple(c) for c in result["slow_classes"]] == list(SLOW_CLASSES)
    chosen = result["chosen"]["knobs"]
    assert set(chosen) == set(SKEW_GRID)
    assert all(getattr(ApproximateRounds, k) == v for k, v in chosen.items())
    # the rule: the lowest geometric mean, the first in the grid on a tie
    means = [row["geomean"] for row in result["settings"]]
    assert result["settings"][means.index(min(means))]["knobs"] == chosen


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


def test_a_tuning_cut_off_resumes_from_its_journal_and_runs_each_run_once(tmp_path,
                                                                          monkeypatch):
    """The runs are faked (time to target = seed + 1 for auto, and for auto-approximate
    the seed + 1 halved where the knob is set): the first tuning is killed after four
    runs (three of auto, one of auto-approximate), the second finishes without running
    those four again or finding the cell's stated deadline again (a second finding would
    differ), and its file is the one an uncut tuning writes; a tuning of another grid sets
    the journal aside and runs everything."""
    import experiments.tune_auto_approximate as tuner

    calls, timeouts, deadlines = [], [], []

    def fake_run(method, seed, cell):
        from fl_gradcode.flower.approximate_rounds import ApproximateRounds

        calls.append((method, seed, ApproximateRounds.max_skew))
        timeouts.append(cell.run_config["straggler-timeout"])
        if limit[0] is not None and len(calls) > limit[0]:
            raise KeyboardInterrupt
        halved = method == "auto-approximate" and ApproximateRounds.max_skew is not None
        return {"time_to_target": (seed + 1) / (2 if halved else 1)}

    @dataclasses.dataclass(frozen=True)
    class FakeCell:  # what the journal's identity holds of a cell
        name: str

    def fake_deadline(grid, cell, stated=None):
        if stated is None:  # found by running wait-for-all on the development seeds
            deadlines.append(cell.name)
            stated = 1.5 + len(deadlines)
        return types.SimpleNamespace(run_config={"straggler-timeout": stated})

    monkeypatch.setattr(tuner, "run_coded", fake_run)
    monkeypatch.setattr(tuner, "tuning_cell",
                        lambda grid, r, n, t, k, sets: FakeCell(f"{t}/{r}/{n}"))
    monkeypatch.setattr(tuner, "with_stated_deadline", fake_deadline)
    monkeypatch.setattr(tuner, "SIZES", (20,))
    monkeypatch.setattr(tuner, "REGIMES", ("persistent",))
    monkeypatch.setattr(tuner, "SAMPLED", ())
    grid = {"max_skew": [0.05, None]}
    out = tmp_path / "tuning.json"
    limit = [4]
    try:
        tuner.tune(str(out), grid)
    except KeyboardInterrupt:
        pass
    assert not out.exists() and len(calls) == 5  # the fifth run was killed
    first = calls[:4]
    assert first[3] == ("auto-approximate", 0, 0.05)
    limit[0] = None
    calls.clear()
    timeouts.clear()
    tuner.tune(str(out), grid)
    # three seeds of one cell: auto 3 runs, then 3 per knob setting; 4 done before the cut
    assert len(calls) == 3 * 3 - 4 and not set(first) & set(calls)
    assert deadlines == ["digits-logreg/persistent/20"]  # read back, not found again
    assert set(timeouts) == {2.5}  # the deadline found before the cut
    result = json.loads(out.read_text())
    assert result["chosen"]["knobs"] == {"max_skew": 0.05}
    assert result["chosen"]["geomean"] == 0.5
    assert not (tmp_path / "tuning.json.journal.jsonl").exists()
    uncut = tmp_path / "uncut.json"
    tuner.tune(str(uncut), grid)
    assert json.loads(uncut.read_text())["settings"] == result["settings"]
    # another grid: a journal left by a cut-off tuning is set aside, every run runs
    limit[0], calls[:] = 2, []
    try:
        tuner.tune(str(out), grid)
    except KeyboardInterrupt:
        pass
    limit[0], calls[:] = None, []
    tuner.tune(str(out), {"max_skew": [0.1, None]})
    assert len(calls) == 3 * 3
    assert (tmp_path / "tuning.json.journal.jsonl.stale").exists()
