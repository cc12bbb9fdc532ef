"""The grid's rules a reader checks its numbers by: which deadline is ``deadline-best`` and
which fixed codes a cell runs (a code that would train another model is set aside)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from experiments import compare, run_grid
from fl_gradcode.codes import make_code
from tools.docgen.rivals import method_stats


def _runs(times, finals):
    return [{"seed": 10 + i, "time_to_target": t, "final_accuracy": f}
            for i, (t, f) in enumerate(zip(times, finals, strict=True))]


def test_the_best_deadline_is_the_one_the_verdict_would_rank_first():
    # 9 of 10 seeds reach fast (10..18 s), the 10th never; every seed reaches at 30 s
    fast = _runs([10.0 + i for i in range(9)] + [None], [0.9] * 10)
    slow = _runs([30.0] * 10, [0.95] * 10)
    # by hand: the median of {10..18, inf} is (14 + 15) / 2 = 14.5 < 30
    assert compare.best_deadline({1.0: fast, 2.0: slow}) == 1.0
    # with 5 of 10 reaching, the median seed never reached: infinitely slow
    half = _runs([1.0] * 5 + [None] * 5, [0.9] * 10)
    assert compare.best_deadline({1.0: half, 2.0: slow}) == 2.0
    # equal medians: the higher median final accuracy, then the shorter deadline
    better = _runs([30.0] * 10, [0.96] * 10)
    assert compare.best_deadline({1.0: slow, 2.0: better}) == 2.0
    assert compare.best_deadline({3.0: slow, 2.0: slow}) == 2.0
    # the same order as the verdict's statistics (tools.docgen.rivals.method_stats)
    tried = {0.5: half, 1.0: fast, 2.0: slow, 3.0: better}
    cell = {"runs": [{**r, "method": str(d)} for d, rs in tried.items() for r in rs]}
    stats = method_stats(cell)
    first = min(tried, key=lambda d: (stats[str(d)].median_time,
                                      -stats[str(d)].median_final, d))
    assert compare.best_deadline(tried) == first == 1.0


# ----------------------------------------------------------------------------- extending
SEEDS, STATED = [10, 11, 12, 13], 2.0
MULTIPLES = [0.1, 0.25, 0.5, 1.0, 2.0]


def _fake_cell(table, old, per_seed=True):
    """A finished cell whose deadline-best ran the multiples ``old`` of ``STATED``, each
    deadline's runs drawn from ``table``; ``per_seed=False``: stored as the cells run before
    per-seed numbers were kept (aggregates only, but for the pick's runs)."""
    from experiments.deadline_best import deadline_best

    runs, facts = deadline_best([STATED * m for m in old], SEEDS, table, STATED, log=str)
    if not per_seed:
        for entry in facts["deadline_grid_results"]:
            entry.pop("per_seed")
    settings = {"stated_deadline_s": STATED, "seeds": SEEDS, "target": 0.9, **facts}
    return {"settings": settings, "runs": runs}


def _table(draws):
    def table(d, seed):
        t, f = draws[MULTIPLES.index(round(d / STATED, 6)) * len(SEEDS) + SEEDS.index(seed)]
        return {"method": "deadline-best", "seed": seed, "deadline_s": d,
                "time_to_target": t, "final_accuracy": f, "bytes_up": 1}
    return table


@given(st.lists(st.tuples(st.one_of(st.none(), st.floats(1, 100)), st.floats(0, 1)),
                min_size=5 * 4, max_size=5 * 4),
       st.booleans())
@settings(max_examples=80, deadline=None)
def test_an_extended_deadline_grid_runs_only_its_new_deadlines_and_picks_as_a_full_run(
        draws, per_seed):
    """Reading a finished cell's deadlines back and running only the added ones (and, where
    only aggregates were kept, those that might rank above the pick) gives the pick, its
    runs and every deadline's entry that a run of the whole extended grid gives (the
    reference: every deadline run)."""
    from experiments.deadline_best import deadline_best, prior_deadlines

    table, calls = _table(draws), []

    def counted(d, seed):
        calls.append(round(d / STATED, 6))
        return table(d, seed)

    cell = _fake_cell(table, MULTIPLES[1:], per_seed)
    grid = [STATED * m for m in MULTIPLES]
    prior = prior_deadlines(cell, {"seeds": SEEDS, "target": 0.9}, str)
    got_runs, got = deadline_best(grid, SEEDS, counted, STATED, prior, str)
    assert 0.1 in calls and set(calls) <= set(MULTIPLES)
    if per_seed:
        assert set(calls) == {0.1} and len(calls) == len(SEEDS)
    full_runs, full = deadline_best(grid, SEEDS, table, STATED, None, str)
    assert got["deadline_best_s"] == full["deadline_best_s"] and got_runs == full_runs
    by_d = {e["deadline_s"]: e for e in full["deadline_grid_results"]}
    assert [e["deadline_s"] for e in got["deadline_grid_results"]] == sorted(by_d)
    for entry in got["deadline_grid_results"]:
        expected = by_d[entry["deadline_s"]]
        assert {k: entry[k] for k in ("reached", "median_time_to_target")} \
            == {k: expected[k] for k in ("reached", "median_time_to_target")}


def test_a_read_back_needs_the_same_cell_and_new_deadlines():
    """Nothing is read back when the cell about to run differs from the stored one, when
    the stored pick's runs are another deadline's, or when the grid adds no deadline (a
    re-run after a change runs every deadline); else only the added deadline runs."""
    from experiments.deadline_best import deadline_best, prior_deadlines

    draws = [(10.0 + i, 0.9) for i in range(len(MULTIPLES) * len(SEEDS))]
    table, calls = _table(draws), []

    def counted(d, seed):
        calls.append(round(d / STATED, 6))
        return table(d, seed)

    cell = _fake_cell(table, MULTIPLES[1:])
    same = {"seeds": SEEDS, "target": 0.9}
    assert prior_deadlines(cell, {**same, "target": 0.8}, str) is None
    moved = {**cell, "runs": [{**r, "deadline_s": 7.0} for r in cell["runs"]]}
    assert prior_deadlines(moved, same, str) is None
    old_grid = [STATED * m for m in MULTIPLES[1:]]
    deadline_best(old_grid, SEEDS, counted, STATED, prior_deadlines(cell, same, str), str)
    assert len(calls) == len(old_grid) * len(SEEDS)
    calls.clear()
    _, facts = deadline_best([STATED * m for m in MULTIPLES], SEEDS, counted, STATED,
                             prior_deadlines(cell, same, str), str)
    assert set(calls) == {0.1} and facts["deadline_grid_read_back"] == len(old_grid)


def _monotone(calls, faster):
    """Every seed reaches the target in ``faster(d)`` seconds at deadline ``d``."""
    def run(d, seed):
        calls.append(d)
        return {"method": "deadline-best", "seed": seed, "deadline_s": d,
                "time_to_target": faster(d), "final_accuracy": 0.9, "bytes_up": 1}
    return run


@pytest.mark.parametrize("faster,extend,tried,pick", [
    # shorter is always faster: 0.5 is the edge, then 0.25, then 0.125 (two growths)
    (lambda d: 10.0 * d, 2, [0.125, 0.25, 0.5, 1.0, 2.0], 0.125),
    # longer is always faster: 2 -> 4 -> 8
    (lambda d: 10.0 / d, 2, [0.5, 1.0, 2.0, 4.0, 8.0], 8.0),
    # fastest at 0.3: 0.5 is the edge, 0.25 is tried and is the new edge, 0.125 loses
    (lambda d: 1.0 + abs(d - 0.3), 2, [0.125, 0.25, 0.5, 1.0, 2.0], 0.25),
    # fastest at 0.45: 0.25 is tried, loses, and the pick 0.5 stays: one growth
    (lambda d: 1.0 + abs(d - 0.45), 2, [0.25, 0.5, 1.0, 2.0], 0.5),
    (lambda d: 10.0 * d, 0, [0.5, 1.0, 2.0], 0.5),
    (lambda d: 10.0 * d, 1, [0.25, 0.5, 1.0, 2.0], 0.25),
])
def test_an_edge_pick_grows_the_grid_past_it_at_most_extend_times(faster, extend, tried, pick):
    from experiments.deadline_best import deadline_best

    calls = []
    runs, facts = deadline_best([0.5, 1.0, 2.0], SEEDS, _monotone(calls, faster), 1.0,
                                log=str, extend=extend)
    assert facts["deadline_grid_s"] == tried and facts["deadline_best_s"] == pick
    assert sorted(set(calls)) == tried and len(calls) == len(tried) * len(SEEDS)
    assert {r["deadline_s"] for r in runs} == {pick} and len(runs) == len(SEEDS)
    assert [e["deadline_s"] for e in facts["deadline_grid_results"]] == tried
    assert facts.get("deadline_grid_grown") == (len(tried) - 3 if extend else None)


def test_a_finished_cell_at_an_edge_grows_by_running_only_the_added_deadlines():
    """A cell whose stored pick is at the grid's edge, run again with the same grid and a
    growth, runs only the deadlines the growth adds; once grown, a re-run (nothing to add)
    runs every deadline again, as a re-run after a change must."""
    from experiments.deadline_best import deadline_best, prior_deadlines

    calls = []
    run = _monotone(calls, lambda d: 10.0 * d)
    grid = [STATED * m for m in (0.5, 1.0, 2.0)]
    _, facts = deadline_best(grid, SEEDS, run, STATED, log=str)
    assert facts["deadline_best_s"] == STATED * 0.5
    cell = {"settings": {"stated_deadline_s": STATED, "seeds": SEEDS, "target": 0.9, **facts},
            "runs": [r for r in map(dict, [run(STATED * 0.5, s) for s in SEEDS])]}
    same = {"seeds": SEEDS, "target": 0.9}
    calls.clear()
    runs, grown = deadline_best(grid, SEEDS, run, STATED, prior_deadlines(cell, same, str),
                                str, extend=2)
    assert sorted(set(calls)) == [STATED * 0.125, STATED * 0.25]
    assert len(calls) == 2 * len(SEEDS) and grown["deadline_grid_read_back"] == 3
    assert grown["deadline_best_s"] == STATED * 0.125 and grown["deadline_grid_grown"] == 2
    again = {"settings": {**cell["settings"], **grown}, "runs": runs}
    calls.clear()
    deadline_best(grid, SEEDS, run, STATED, prior_deadlines(again, same, str), str, extend=2)
    assert len(calls) == 5 * len(SEEDS)


@pytest.mark.parametrize("faster,grew,pick", [
    # (multiples of STATED = 2 s) fastest at 0.45: the pick 0.5 is the grid's shortest, a
    # growth tries 0.25, which loses: the pick stays at the grid's edge
    (lambda d: 1.0 + abs(d - 0.9), [0.25], 0.5),
    # longer always faster: the pick 2 is the grid's longest, a growth tries 4, which wins
    (lambda d: 10.0 / d, [4.0], 4.0),
])
def test_a_grown_cell_runs_again_in_full_and_an_edge_pick_grows_at_either_end(
        faster, grew, pick):
    """A cell whose pick is at the grid's edge grows by running only the added deadline, at
    either end; once grown (its growth's deadline stored), a re-run runs every deadline,
    even where the pick is still the grid's edge, never reading stale runs back."""
    from experiments.deadline_best import deadline_best, prior_deadlines

    calls = []
    run = _monotone(calls, faster)
    grid = [STATED * m for m in (0.5, 1.0, 2.0)]
    runs, facts = deadline_best(grid, SEEDS, run, STATED, log=str)
    cell = {"settings": {"stated_deadline_s": STATED, "seeds": SEEDS, "target": 0.9, **facts},
            "runs": runs}
    assert facts["deadline_best_s"] in (min(grid), max(grid))
    same = {"seeds": SEEDS, "target": 0.9}
    calls.clear()
    runs, grown = deadline_best(grid, SEEDS, run, STATED, prior_deadlines(cell, same, str),
                                str, extend=1)
    assert sorted(set(calls)) == [STATED * m for m in grew]
    assert grown["deadline_best_s"] == STATED * pick and grown["deadline_grid_grown"] == 1
    again = {"settings": {**cell["settings"], **grown}, "runs": runs}
    calls.clear()
    deadline_best(grid, SEEDS, run, STATED, prior_deadlines(again, same, str), str, extend=1)
    assert len(calls) == 4 * len(SEEDS)  # the grid's three and the growth, all run again


@pytest.fixture(scope="module")
def grid():
    return compare.load_grid()


def test_every_fixed_code_a_cell_runs_codes_what_the_cells_rivals_train(grid):
    for cell in run_grid.grid_cells(grid):
        cohort, n = cell["cohort"], cell["n"]
        task = compare.cell_run_config(grid, cell["task"], cell["latency"])
        for method in run_grid.grid_methods(grid, cohort, cell):
            if ":" not in method:
                continue
            name, s = method.split(":")
            m = {"m": 1} if name == "comm-efficient" else {}  # the key table's default
            code = make_code(name, cohort, int(s), **m)  # the construction the grid ran
            # its partitions were the cohort's own (k = cohort), or (only where the update
            # is one full-batch gradient of every node) the data re-split k ways
            gradient = task.get("update", "gradient") == "gradient"
            assert code.k == cohort or (n == cohort and gradient), (cell["name"], method, code.k)


def test_comm_efficient_at_load_three_is_set_aside_where_it_re_splits_local_training(grid):
    cells = {c["name"]: c for c in run_grid.grid_cells(grid)}
    # load s + m = 3 groups of 3 clients: floor(20 / 3) * 3 = 18, floor(100 / 3) * 3 = 99
    cnn = run_grid.off_problem(grid, cells["mnist1d-cnn/persistent/20x20"], "comm-efficient:2")
    assert cnn is not None and "k = 18" in cnn and "cohort of 20" in cnn
    sampled = run_grid.off_problem(grid, cells["natural-noniid/persistent/1000x100"],
                                   "comm-efficient:2")
    assert sampled is not None and "k = 99" in sampled and "cohort's" in sampled
    # one full-batch gradient of every node: the round's sum is the full gradient either way
    assert run_grid.off_problem(grid, cells["digits-logreg/persistent/20x20"],
                                "comm-efficient:2") is None
    assert "comm-efficient:2" in run_grid.grid_methods(grid, 20, cells[
        "digits-logreg/persistent/20x20"])
    assert "comm-efficient:2" not in run_grid.grid_methods(grid, 20, cells[
        "mnist1d-cnn/persistent/20x20"])
    for method in ("auto", "grouped-rs:2", "comm-efficient:1", "comm-efficient:4"):
        assert run_grid.off_problem(grid, cells["mnist1d-cnn/persistent/20x20"], method) is None


def test_a_merged_cell_sets_aside_the_runs_of_a_code_that_trains_another_model(tmp_path, grid):
    name = "mnist1d-cnn/persistent/20x20"
    runs = [{"method": m, "seed": s, "wall_s": 1.0, "time_to_target": t,
             "final_accuracy": 0.4, "client_compute_s": 1.0, "bytes_up": 8}
            for m, t in (("auto", 2.0), ("comm-efficient:2", 1.0), ("grouped-rs:2", 3.0))
            for s in (10, 11)]
    entry = {"settings": {"task": "mnist1d-cnn", "latency": "persistent", "n": 20,
                          "cohort": 20, "methods": ["auto", "comm-efficient:2",
                                                    "grouped-rs:2"]},
             "runs": runs, "summary": {"auto": {}}, "runtime_s": 6.0}
    out = tmp_path / "grid.json"
    run_grid.merge(out, grid, name, entry)
    run_grid.merge(out, grid)  # merging again moves nothing twice
    cell = json.loads(out.read_text())["cells"][name]
    assert {r["method"] for r in cell["runs"]} == {"auto", "grouped-rs:2"}
    assert [r["method"] for r in cell["set_aside_runs"]] == ["comm-efficient:2"] * 2
    assert "k = 18" in cell["methods_set_aside"]["comm-efficient:2"]
    assert cell["settings"]["methods"] == ["auto", "grouped-rs:2"]
    assert set(cell["summary"]) == {"auto", "grouped-rs:2"}
    # a cell that never ran the code names it too: the grid's list minus the set-aside codes
    other = "mnist1d-cnn/bimodal/20x20"
    run_grid.merge(out, grid, other, {**entry, "runs": [r for r in runs if r["method"] == "auto"],
                                      "settings": {**entry["settings"], "latency": "bimodal",
                                                   "methods": ["auto"]}})
    cell = json.loads(out.read_text())["cells"][other]
    assert "k = 18" in cell["methods_set_aside"]["comm-efficient:2"]
    assert cell["set_aside_runs"] == []


def test_a_code_the_server_would_replace_is_judged_as_the_server_builds_it(grid):
    cell = {"name": "mnist1d-cnn/persistent/20x20", "task": "mnist1d-cnn",
            "latency": "persistent", "n": 20, "cohort": 20}
    # frc needs (s + 1) | 20: the ServerApp falls back to grouped-rs (k = 20), nothing raises
    assert run_grid.off_problem(grid, cell, "frc:2") is None
    # a finished cell is judged by the run config it ran with, not today's grid file
    own = {**compare.cell_run_config(grid, "mnist1d-cnn", "persistent"), "update": "gradient"}
    assert run_grid.off_problem(grid, cell, "comm-efficient:2", own) is None
    assert "(m = 1)" in run_grid.off_problem(grid, cell, "comm-efficient:2")


def test_a_set_aside_code_is_refused_on_the_command_line_and_never_stored_twice(tmp_path,
                                                                                grid):
    out = tmp_path / "grid.json"
    name = "mnist1d-cnn/persistent/20x20"
    with pytest.raises(ValueError, match=r"'comm-efficient:2' in mnist1d-cnn/persistent/20x20"
                                         r".*k = 18"):
        run_grid.run_grid(grid, name, out, ["comm-efficient:2"], rerun=True)
    runs = [{"method": "comm-efficient:2", "seed": 10, "wall_s": 1.0, "time_to_target": 1.0,
             "final_accuracy": 0.4, "client_compute_s": 1.0, "bytes_up": 8}]
    entry = {"settings": {"task": "mnist1d-cnn", "latency": "persistent", "n": 20,
                          "cohort": 20}, "runs": runs, "summary": {}, "runtime_s": 1.0}
    run_grid.merge(out, grid, name, entry)
    stored = json.loads(out.read_text())["cells"][name]
    # the same (method, seed) coming back (a re-run): the newer run replaces the older
    again = {**stored, "runs": [{**runs[0], "time_to_target": 2.0}]}
    run_grid.merge(out, grid, name, again)
    cell = json.loads(out.read_text())["cells"][name]
    assert [r["time_to_target"] for r in cell["set_aside_runs"]] == [2.0]
