"""A grid cell cut off part-way (a session's end, a kill) resumes from its journal: the runs it
finished are not run again, and the cell's result is the one an uninterrupted run gives."""

from __future__ import annotations

import json

import pytest

from experiments import compare, run_grid

METHODS = ["auto", "wait-for-all", "deadline", "grouped-rs:1"]
#: the runs of a cell: wait-for-all and the code (its own deadline's run) on the development
#: seed, then every method on the two evaluation seeds
TOTAL = 2 + len(METHODS) * 2
NAME = "digits-logreg/bimodal/5x5"


class Cut(Exception):
    """The process is cut off."""


def _grid():
    grid = compare.load_grid()
    return {**grid, "seeds": {"development": [0], "evaluation": [10, 11]},
            "scale": {**grid["scale"], "rounds": 2, "settings": [[5, 5]]},
            "tasks": {"digits-logreg": {**grid["tasks"]["digits-logreg"], "target": 0.3,
                                        "scales": [[5, 5]]}}}


def _cell(grid, journal=None, log=print, target=0.3, sets=None):
    return compare.run_cell(grid, "digits-logreg", "bimodal", 5, 5, 2, [10, 11], [0], METHODS,
                            target, sets, log=log, journal=journal)


def _cut_after(k):
    lines = []

    def log(line):
        lines.append(line)
        if sum(ln.startswith("  ") for ln in lines) >= k:
            raise Cut
    return log


def _rounded(value):
    if isinstance(value, float):
        return float(f"{value:.10g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_rounded(v) for v in value]
    return value


def _without_wall(runs):
    """Runs without what the wall clock measured (it differs from process to process), to
    10 significant digits (a loss may differ in its last bit from one run to the next)."""
    return [_rounded({k: v for k, v in r.items() if k not in ("wall_s", "measured_compute_s")})
            for r in runs]


def test_a_cut_cell_resumes_where_it_stopped_and_ends_as_an_uncut_one(tmp_path,
                                                                      one_torch_thread):
    grid = _grid()
    reference = _cell(grid)  # never cut, no journal
    out = tmp_path / "grid.json"
    journal = run_grid.journal_path(out, NAME)
    with pytest.raises(Cut):
        _cell(grid, journal, log=_cut_after(3))
    assert journal.exists()
    run_grid.run_grid(grid, NAME, out, METHODS)
    cell = json.loads(out.read_text())["cells"][NAME]
    assert cell["resumed_runs"] == 3
    assert _without_wall(cell["runs"]) == _without_wall(reference["runs"])
    assert cell["summary"]["wait-for-all"]["time_to_target_vs_auto"] == \
        reference["summary"]["wait-for-all"]["time_to_target_vs_auto"]
    assert cell["settings"]["stated_deadline_s"] == reference["settings"]["stated_deadline_s"]
    assert not journal.parent.exists()  # merged: the journal is gone


def test_a_resumed_cell_runs_only_what_was_not_finished(tmp_path, one_torch_thread):
    grid, journal = _grid(), tmp_path / "cell.jsonl"
    with pytest.raises(Cut):
        _cell(grid, journal, log=_cut_after(2))
    lines: list[str] = []
    result = _cell(grid, journal, log=lines.append)
    runs_logged = [ln for ln in lines if ln.startswith("  ")]
    # wait-for-all on dev seed 0 and one more run were finished: the other runs ran now
    assert result["resumed_runs"] == 2 and len(runs_logged) == TOTAL - 2
    assert any("resuming" in ln and "2 runs" in ln for ln in lines)


def test_a_journal_of_another_cell_is_set_aside_not_read(tmp_path, one_torch_thread):
    grid, journal = _grid(), tmp_path / "cell.jsonl"
    with pytest.raises(Cut):
        _cell(grid, journal, log=_cut_after(3))
    lines: list[str] = []
    result = _cell(grid, journal, log=lines.append, target=0.5)  # another target
    assert result["resumed_runs"] == 0
    assert any("set aside" in ln for ln in lines)
    assert journal.with_name(journal.name + ".stale").exists()
    assert sum(ln.startswith("  ") for ln in lines) == TOTAL


def test_a_resumed_cell_charges_the_compute_measured_the_first_time(tmp_path, monkeypatch,
                                                                     one_torch_thread):
    import fl_gradcode.tasks

    def charging(values):
        values = iter(values)
        monkeypatch.setattr(fl_gradcode.tasks, "charged_measured_cost",
                            lambda cfg, n: {"virtual-compute": "none",
                                            "partition-cost-s": next(values)})

    grid, journal = _grid(), tmp_path / "cell.jsonl"
    sets = {"virtual-compute": "measured-once"}
    charging([0.0123])
    reference = _cell(grid, sets=sets)  # one process, charged 0.0123 throughout
    charging([0.0123, 0.0456])  # a second process would measure another value
    with pytest.raises(Cut):
        _cell(grid, journal, log=_cut_after(2), sets=sets)
    result = _cell(grid, journal, log=lambda line: None, sets=sets)
    assert result["resumed_runs"] == 2
    assert result["settings"]["measured_partition_cost_s"] == 0.0123
    assert _without_wall(result["runs"]) == _without_wall(reference["runs"])


def test_a_journal_written_on_other_threads_is_set_aside(tmp_path, one_torch_thread):
    import torch

    grid, journal = _grid(), tmp_path / "cell.jsonl"
    with pytest.raises(Cut):
        _cell(grid, journal, log=_cut_after(2))
    torch.set_num_threads(2)  # a sum split over threads may end in another last bit
    lines: list[str] = []
    result = _cell(grid, journal, log=lines.append)
    assert result["resumed_runs"] == 0 and any("set aside" in ln for ln in lines)


def test_a_line_cut_off_mid_write_is_dropped_and_its_run_runs_again(tmp_path,
                                                                     one_torch_thread):
    grid, journal = _grid(), tmp_path / "cell.jsonl"
    reference = _cell(grid, log=lambda line: None)
    with pytest.raises(Cut):
        _cell(grid, journal, log=_cut_after(3))
    lines = journal.read_text().splitlines(keepends=True)
    journal.write_text("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])  # killed
    result = _cell(grid, journal, log=lambda line: None)
    assert result["resumed_runs"] == 2
    assert _without_wall(result["runs"]) == _without_wall(reference["runs"])
    assert all(json.loads(line) for line in journal.read_text().splitlines())


def test_the_code_digest_changes_with_the_harness_that_keys_the_runs(tmp_path):
    """A journal written by other harness code is not read: the digest covers the module
    that decides a cell's runs (compare.py: e.g. the deadline rule) and the one that keys
    them (runner.py: e.g. the deadline a code's own deadline is read at), not only the modules
    that run them; a document is not code."""
    import shutil

    from experiments.journal import CODE, ROOT, code_digest

    for entry in CODE:
        source = ROOT / entry
        target = tmp_path / entry
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, target)
    before = code_digest(tmp_path)
    (tmp_path / "README.md").write_text("not code\n")
    assert code_digest(tmp_path) == before
    for module, old, new in (("compare.py", "deadline_slack", "deadline_Slack"),
                             ("runner.py", "OPEN_DEADLINE_S = 1e6", "OPEN_DEADLINE_S = 1e5")):
        harness = tmp_path / "experiments" / module
        assert old in harness.read_text(), module
        harness.write_text(harness.read_text().replace(old, new))
        assert code_digest(tmp_path) != before, module
        before = code_digest(tmp_path)


def test_a_journal_written_under_other_rules_is_set_aside(tmp_path, one_torch_thread):
    """A run's numbers depend on the grid file's rules beyond the cell's fields (the stated
    deadline's quantile and slack, the tuning lists): a journal written under other rules is
    set aside, not read back (its auto and codes' runs are keyed by method and seed only)."""
    grid, journal = _grid(), tmp_path / "cell.jsonl"
    with pytest.raises(Cut):
        _cell(grid, journal, log=_cut_after(3))
    other = {**grid, "rules": {**grid["rules"], "deadline_slack": 2.0}}
    lines: list[str] = []
    result = _cell(other, journal, log=lines.append)
    assert result["resumed_runs"] == 0
    assert any("set aside" in ln for ln in lines)
