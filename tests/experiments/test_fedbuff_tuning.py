"""FedBuff tuned on the development seeds (the grid file's ``fedbuff_tune``): the rule's pick,
what a cell records, the reported seeds run the pick, and a fixed value is refused."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from experiments import compare
from experiments.fedbuff_tuning import tuned_fedbuff
from experiments.rival_runs import Cell


def _cell(**rules) -> Cell:
    base = compare.cell_rules(compare.load_grid())
    return Cell(run_config={}, n=20, cohort=20, rounds=30, target=0.5, **{**base, **rules})


def _fake(table):
    """``run(cell, seed)`` reading ``table[(lr, fraction)][seed] = (time, final)``."""
    calls = []

    def run(cell, seed):
        calls.append((cell.fedbuff_server_lr, cell.fedbuff_buffer_fraction, seed))
        time, final = table[cell.fedbuff_server_lr, cell.fedbuff_buffer_fraction][seed]
        return {"seed": seed, "time_to_target": time, "final_accuracy": final}
    return run, calls


def test_the_pick_is_the_lowest_median_time_over_the_development_seeds():
    # medians by hand: (0.5, 0.1): 20 (10, 20, inf); (1.0, 0.25): inf (two seeds never);
    # (0.25, 0.1): 30; the others 40
    table = {(lr, f): {0: (40.0, 0.9), 1: (40.0, 0.9), 2: (40.0, 0.9)}
             for lr in (0.25, 0.5, 1.0) for f in (0.1, 0.25)}
    table[0.5, 0.1] = {0: (10.0, 0.8), 1: (20.0, 0.8), 2: (None, 0.3)}
    table[1.0, 0.25] = {0: (1.0, 0.9), 1: (None, 0.2), 2: (None, 0.2)}
    table[0.25, 0.1] = {0: (30.0, 0.95), 1: (30.0, 0.95), 2: (30.0, 0.95)}
    run, calls = _fake(table)
    chosen, record = tuned_fedbuff(_cell(), [0, 1, 2], [0.25, 0.5, 1.0], [0.1, 0.25], run)
    assert (chosen.fedbuff_server_lr, chosen.fedbuff_buffer_fraction) == (0.5, 0.1)
    assert chosen.fedbuff_buffer() == 2 and chosen.fedbuff_steps() == 300  # 30 * 20 / 2
    assert record["chosen"] == {"server_lr": 0.5, "buffer_fraction": 0.1}
    assert record["a_priori"] == {"server_lr": 1.0, "buffer_fraction": 0.25}
    assert len(calls) == 18 and {seed for *_, seed in calls} == {0, 1, 2}
    entry = next(r for r in record["grid"] if (r["server_lr"], r["buffer_fraction"])
                 == (1.0, 0.25))
    assert entry["median_time_to_target_all_seeds"] is None
    assert entry["per_seed"]["1"] == {"time_to_target": None, "final_accuracy": 0.2}


def test_ties_go_to_the_higher_accuracy_then_to_the_a_priori_setting():
    same = {0: (10.0, 0.9)}
    table = {(lr, f): same for lr in (0.25, 0.5, 1.0) for f in (0.1, 0.25)}
    run, _ = _fake(table)
    chosen, _ = tuned_fedbuff(_cell(), [0], [0.25, 0.5, 1.0], [0.1, 0.25], run)
    assert (chosen.fedbuff_server_lr, chosen.fedbuff_buffer_fraction) == (1.0, 0.25)
    table = {**table, (0.25, 0.25): {0: (10.0, 0.95)}}
    run, _ = _fake(table)
    chosen, _ = tuned_fedbuff(_cell(), [0], [0.25, 0.5, 1.0], [0.1, 0.25], run)
    assert (chosen.fedbuff_server_lr, chosen.fedbuff_buffer_fraction) == (0.25, 0.25)
    # no a-priori setting in the lists: the lists' order
    run, _ = _fake({(lr, 0.5): same for lr in (0.3, 0.2)})
    chosen, _ = tuned_fedbuff(_cell(), [0], [0.3, 0.2], [0.5], run)
    assert chosen.fedbuff_server_lr == 0.3


@pytest.mark.parametrize(("lrs", "fracs", "message"), [
    ([], [0.25], "fedbuff_tune_server_lr"), ([0.0], [0.25], "> 0"),
    ([1.0], [1.5], r"in \(0, 1\]"), ("0.5", [0.25], "list"), ([1.0], [True], "number"),
    ([math.inf], [0.25], "> 0"),
])
def test_a_bad_tuning_list_is_refused_naming_it(lrs, fracs, message):
    run, calls = _fake({})
    with pytest.raises(ValueError, match=message):
        tuned_fedbuff(_cell(), [0], lrs, fracs, run)
    assert not calls


def test_the_command_tunes_fedbuff_on_the_development_seeds_and_runs_the_pick(tmp_path):
    out = tmp_path / "c.json"
    argv = ["--n", "6", "--rounds", "4", "--seeds", "3", "--dev-seeds", "0,1", "--target",
            "0.5", "--methods", "auto,fedbuff", "--set", "latency=persistent"]
    assert compare.main([*argv, "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    fedbuff = data["settings"]["fedbuff"]
    grid = compare.load_grid()["rules"]
    tuning = fedbuff["tuning"]
    tried = [(r["server_lr"], r["buffer_fraction"]) for r in tuning["grid"]]
    lists = [(lr, f) for lr in grid["fedbuff_tune_server_lr"]
             for f in grid["fedbuff_tune_buffer_fraction"]]
    assert tried[:len(lists)] == lists
    # past the lists: the grid file's growth, each added value tried with every other one
    assert tuning["extend"] == grid["fedbuff_tune_extend"] >= len(tuning["extensions"])
    lrs = grid["fedbuff_tune_server_lr"] + [v for e in tuning["extensions"]
                                            for v in e["server_lr"]]
    fracs = grid["fedbuff_tune_buffer_fraction"] + [v for e in tuning["extensions"]
                                                    for v in e["buffer_fraction"]]
    assert sorted(tried) == sorted((lr, f) for lr in lrs for f in fracs)
    assert all(set(r["per_seed"]) == {"0", "1"} for r in tuning["grid"])
    pick = tuning["chosen"]
    assert (fedbuff["server_lr"], fedbuff["buffer_fraction"]) == (pick["server_lr"],
                                                                  pick["buffer_fraction"])
    assert fedbuff["buffer_size"] == math.ceil(pick["buffer_fraction"] * 6 - 1e-9)
    assert fedbuff["regime_round"] == "federation"
    # the reported seed ran the pick: the same run as FedBuff with the pick fixed by rules
    fixed = tmp_path / "f.json"
    assert compare.main([*argv, "--out", str(fixed), "--rule", "fedbuff_tune=0",
                         "--rule", f"fedbuff_server_lr={pick['server_lr']!r}",
                         "--rule", f"fedbuff_buffer_fraction={pick['buffer_fraction']!r}"]) == 0
    untuned = json.loads(fixed.read_text())
    assert "tuning" not in untuned["settings"]["fedbuff"]

    def curve(d):
        return next(r for r in d["runs"] if r["method"] == "fedbuff")["accuracy_curve"]
    assert curve(data) == curve(untuned)
    assert [r["method"] for r in data["runs"]].count("fedbuff") == 1  # dev runs not stored


def test_a_fixed_fedbuff_value_with_the_tuning_on_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="fedbuff_tune=0"):
        compare.main(["--quick", "--rule", "fedbuff_server_lr=2",
                      "--out", str(tmp_path / "x.json")])
    assert not (tmp_path / "x.json").exists()


def test_fixing_fedbuff_without_running_it_is_not_refused_and_bad_lists_are_caught_first(
        tmp_path, monkeypatch):
    from experiments import compare_cli
    args = compare_cli.build_parser("x").parse_args(
        ["--quick", "--methods", "auto,wait-for-all", "--rule", "fedbuff_server_lr=2"])
    grid = compare.load_grid()
    assert compare.parse_cell(grid, args)["rules"] == {"fedbuff_server_lr": 2.0}
    # a bad list of the grid file is refused before any run, where FedBuff runs
    bad = {**grid, "rules": {**grid["rules"], "fedbuff_tune_server_lr": [-1.0]}}
    with pytest.raises(ValueError, match="fedbuff_tune_server_lr"):
        compare.parse_cell(bad, compare_cli.build_parser("x").parse_args(["--quick"]))
    from experiments.run_grid import check_grid
    with pytest.raises(ValueError, match="fedbuff_tune_server_lr"):
        check_grid(bad, "digits-logreg/persistent/20x20", ["fedbuff"])
    assert check_grid(bad, "digits-logreg/persistent/20x20", ["auto"])


def test_tuning_on_the_reported_seeds_is_recorded(tmp_path):
    out = tmp_path / "c.json"
    assert compare.main(["--n", "5", "--rounds", "2", "--seeds", "0", "--dev-seeds", "0",
                         "--target", "0.3", "--methods", "fedbuff", "--out", str(out)]) == 0
    tuning = json.loads(out.read_text())["settings"]["fedbuff"]["tuning"]
    assert tuning["tuned_on_reported_seeds"] == [0]


def _table(best):
    """Every (lr, fraction) reaches the target at 50 s, ``best`` (a dict) faster."""
    class Table(dict):
        def __missing__(self, key):
            return {s: (50.0, 0.9) for s in range(3)}
    table = Table()
    for key, time in best.items():
        table[key] = {s: (time, 0.9) for s in range(3)}
    return table


def test_an_edge_pick_grows_the_lists_past_it_and_picks_again():
    # cohort 20: K = ceil(20 f); (1.0, 0.1) is the lists' pick (largest lr, smallest K = 2),
    # so lr 2.0 and fraction 0.05 (K = 1) are added; (2.0, 0.05) is faster still and at the
    # edge again: lr 4.0 is added (K = 1 has no smaller K); 4.0 is slower, so the pick stays
    table = _table({(1.0, 0.1): 20.0, (2.0, 0.05): 10.0, (2.0, 0.1): 15.0})
    run, calls = _fake(table)
    chosen, record = tuned_fedbuff(_cell(), [0, 1, 2], [0.25, 0.5, 1.0], [0.1, 0.25], run,
                                   extend=2)
    assert (chosen.fedbuff_server_lr, chosen.fedbuff_buffer_fraction) == (2.0, 0.05)
    assert chosen.fedbuff_buffer() == 1 and chosen.fedbuff_steps() == 600
    assert record["extensions"] == [{"server_lr": [2.0], "buffer_fraction": [0.05]},
                                    {"server_lr": [4.0], "buffer_fraction": []}]
    tried = [(r["server_lr"], r["buffer_fraction"]) for r in record["grid"]]
    # the lists' 6, then 2.0 x (0.1, 0.25, 0.05) and (0.25, 0.5, 1.0) x 0.05, then 4.0 x 3
    assert len(tried) == len(set(tried)) == 6 + 6 + 3
    assert {(lr, f) for lr in (0.25, 0.5, 1.0, 2.0, 4.0) for f in (0.1, 0.25, 0.05)} == set(tried)
    assert len(calls) == 3 * 15
    # (2.0, 0.05) is at no edge any more: 4.0 is the largest lr tried, K = 1 the smallest K
    assert record["extend"] == 2 and record["at_edge"] is False


def test_the_growth_stops_at_its_limit_and_says_the_pick_is_still_at_an_edge():
    table = _table({(1.0, 0.1): 20.0, (2.0, 0.1): 10.0})
    run, calls = _fake(table)
    chosen, record = tuned_fedbuff(_cell(), [0, 1, 2], [0.25, 0.5, 1.0], [0.1, 0.25], run,
                                   extend=1)
    assert (chosen.fedbuff_server_lr, chosen.fedbuff_buffer_fraction) == (2.0, 0.1)
    assert record["at_edge"] is True and len(record["extensions"]) == 1
    # extend 0 is amendment 12's tuning: the lists only, the edge named
    run, calls = _fake(table)
    chosen, record = tuned_fedbuff(_cell(), [0, 1, 2], [0.25, 0.5, 1.0], [0.1, 0.25], run)
    assert (chosen.fedbuff_server_lr, chosen.fedbuff_buffer_fraction) == (1.0, 0.1)
    assert len(calls) == 18 and record["extensions"] == [] and record["at_edge"] is True


def test_an_interior_pick_grows_nothing():
    table = _table({(0.5, 0.25): 10.0})
    run, calls = _fake(table)
    chosen, record = tuned_fedbuff(_cell(), [0], [0.25, 0.5, 1.0], [0.1, 0.25, 0.5], run,
                                   extend=2)
    assert (chosen.fedbuff_server_lr, chosen.fedbuff_buffer_fraction) == (0.5, 0.25)
    assert record["extensions"] == [] and record["at_edge"] is False and len(calls) == 9


def test_the_other_edges_grow_the_other_way_and_a_fraction_is_added_only_where_k_changes():
    # smallest lr and largest fraction: lr 0.125, fraction 0.5 (K 10 at cohort 20)
    table = _table({(0.25, 0.25): 10.0})
    run, _ = _fake(table)
    _, record = tuned_fedbuff(_cell(), [0], [0.25, 0.5, 1.0], [0.1, 0.25], run, extend=1)
    assert record["extensions"] == [{"server_lr": [0.125], "buffer_fraction": [0.5]}]
    # cohort 5: fraction 0.1 has K = 1, so half of it (K = 1 again) is not added
    table = _table({(1.0, 0.1): 10.0})
    run, _ = _fake(table)
    cell = dataclasses.replace(_cell(), n=5, cohort=5)
    _, record = tuned_fedbuff(cell, [0], [0.25, 0.5, 1.0], [0.1, 0.25], run, extend=1)
    assert record["extensions"] == [{"server_lr": [2.0], "buffer_fraction": []}]


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2", math.nan])
def test_a_bad_growth_limit_is_refused_naming_it(bad):
    run, calls = _fake({})
    with pytest.raises(ValueError, match="fedbuff_tune_extend"):
        tuned_fedbuff(_cell(), [0], [1.0], [0.25], run, extend=bad)
    assert not calls


def test_edges_are_by_k_a_lone_lr_grows_both_ways_and_a_doubled_fraction_stops_at_one():
    from experiments.fedbuff_tuning import grown
    cell = _cell()  # cohort 20: K = ceil(20 f)
    # 0.09 and 0.1 share K = 2, the smallest and the largest K tried: a pick of 0.1 halves
    # (K = 1) and doubles (0.2, K = 4)
    assert grown([1.0], [0.09, 0.1], (1.0, 0.1), cell) == ([2.0, 0.5], [0.05, 0.2])
    # the largest K (0.75: K = 15) doubles to 1 (K = 20), not 1.5; at 1 nothing is added
    assert grown([0.5, 1.0], [0.1, 0.75], (0.5, 0.75), cell) == ([0.25], [1.0])
    assert grown([0.5, 1.0], [0.1, 1.0], (0.5, 1.0), cell) == ([0.25], [])
    # a lone fraction of K = 1 (cohort 20, 0.05) grows up only (K = 2)
    assert grown([0.5, 1.0], [0.05], (0.5, 0.05), cell) == ([0.25], [0.1])


def test_the_command_grows_the_lists_by_the_grid_files_rule():
    # the recorded runs replayed through the rule with the grid file's limit give the
    # record: the command passed that limit and grew from the lists' own pick
    out_runs = {}

    def replay(data):
        tuning = data["settings"]["fedbuff"]["tuning"]
        for r in tuning["grid"]:
            out_runs[r["server_lr"], r["buffer_fraction"]] = {
                int(s): (v["time_to_target"], v["final_accuracy"])
                for s, v in r["per_seed"].items()}
        return tuning
    import tempfile
    from pathlib import Path
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "c.json"
        assert compare.main(["--n", "6", "--rounds", "3", "--seeds", "3", "--dev-seeds",
                             "0,1", "--target", "0.5", "--methods", "fedbuff", "--set",
                             "latency=persistent", "--out", str(out)]) == 0
        tuning = replay(json.loads(out.read_text()))
    rules = compare.load_grid()["rules"]
    run, _ = _fake(out_runs)
    cell = dataclasses.replace(_cell(), n=6, cohort=6, rounds=3)
    _, again = tuned_fedbuff(cell, [0, 1], rules["fedbuff_tune_server_lr"],
                             rules["fedbuff_tune_buffer_fraction"], run,
                             extend=rules["fedbuff_tune_extend"])
    assert again["extensions"] == tuning["extensions"] and again["chosen"] == tuning["chosen"]
    assert again["at_edge"] == tuning["at_edge"] and len(again["grid"]) == len(tuning["grid"])


def test_a_rule_of_no_growth_tunes_on_the_lists_only(tmp_path):
    """--rule fedbuff_tune_extend=0 (how an older file that predates the lists' growth is
    reproduced): FedBuff is tuned on the grid file's lists only, and its tuning says so."""
    out = tmp_path / "c.json"
    assert compare.main(["--n", "6", "--rounds", "2", "--seeds", "3", "--dev-seeds", "0",
                         "--target", "0.3", "--methods", "fedbuff", "--rule",
                         "fedbuff_tune_extend=0", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    tuning = data["settings"]["fedbuff"]["tuning"]
    rules = compare.load_grid()["rules"]
    tried = {(r["server_lr"], r["buffer_fraction"]) for r in tuning["grid"]}
    assert tried <= {(float(lr), float(f)) for lr in rules["fedbuff_tune_server_lr"]
                     for f in rules["fedbuff_tune_buffer_fraction"]}
    assert tuning["extend"] == 0 and not tuning.get("extensions")
    assert data["settings"]["rules_set"] == {"fedbuff_tune_extend": 0.0}


def test_fractions_with_the_same_k_run_once_and_keep_their_own_entries():
    """At a cohort of 4 the fractions 0.1 and 0.25 are both K = 1: the same FedBuff, whose
    development runs used to run twice."""
    import dataclasses

    cell = dataclasses.replace(_cell(), cohort=4)
    assert {dataclasses.replace(cell, fedbuff_buffer_fraction=f).fedbuff_buffer()
            for f in (0.1, 0.25)} == {1}
    table = {(lr, f): {0: (10.0 / lr, 0.9), 1: (12.0 / lr, 0.9)}
             for lr in (0.25, 0.5, 1.0) for f in (0.1, 0.25)}
    run, calls = _fake(table)
    chosen, record = tuned_fedbuff(cell, [0, 1], [0.25, 0.5, 1.0], [0.1, 0.25], run)
    assert len(calls) == 6  # 3 server lrs x 1 K x 2 seeds
    assert len(record["grid"]) == 6  # every setting of the lists still recorded
    for lr in (0.25, 0.5, 1.0):
        a, b = (next(r for r in record["grid"] if (r["server_lr"], r["buffer_fraction"])
                     == (lr, f)) for f in (0.1, 0.25))
        assert a["per_seed"] == b["per_seed"] and a["buffer_size"] == b["buffer_size"] == 1
    # a tie between the two: the a-priori fraction (0.25) as before
    assert (chosen.fedbuff_server_lr, chosen.fedbuff_buffer_fraction) == (1.0, 0.25)


def test_a_stated_deadline_read_from_reported_seeds_is_recorded(tmp_path, capsys):
    """The stated deadline (the deadline rival's, auto's, deadline-best's grid) is read from
    the development seeds: with one of them reported too, the result says so."""
    out = tmp_path / "c.json"
    assert compare.main(["--n", "5", "--rounds", "2", "--seeds", "0,4", "--dev-seeds", "0,1",
                         "--target", "0.3", "--methods", "deadline", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["settings"]["tuned_on_reported_seeds"] == [0]
    assert "not a pre-registered reading" in capsys.readouterr().out
    assert compare.main(["--n", "5", "--rounds", "2", "--seeds", "4", "--dev-seeds", "0,1",
                         "--target", "0.3", "--methods", "deadline", "--out", str(out)]) == 0
    assert "tuned_on_reported_seeds" not in json.loads(out.read_text())["settings"]
