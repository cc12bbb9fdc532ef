"""first-k's over-commitment tuned on the development seeds (the grid file's
``first_k_tune``, amendment 18): the rule's pick, its growth past an edge, what a cell records,
the reported seeds run the pick, and a fixed value is refused."""

from __future__ import annotations

import json
import math

import pytest

from experiments import compare
from experiments.first_k_tuning import check_overcommit_list, grown, tuned_first_k
from experiments.rival_runs import Cell


def _cell(n=20, cohort=20, **rules) -> Cell:
    base = compare.cell_rules(compare.load_grid())
    return Cell(run_config={}, n=n, cohort=cohort, rounds=30, target=0.5,
                **{**base, **rules})


def _fake(table):
    """``run(cell, seed)`` reading ``table[overcommit][seed] = (time, final)``."""
    calls = []

    def run(cell, seed):
        calls.append((cell.overcommit, seed))
        time, final = table[cell.overcommit][seed]
        return {"seed": seed, "time_to_target": time, "final_accuracy": final}
    return run, calls


def test_the_pick_is_the_lowest_median_time_and_an_inner_pick_does_not_grow():
    # medians by hand: 1.1: 40; 1.3: inf (two seeds never); 1.6: 20 (10, 20, inf); 2.0: 30
    table = {1.1: {0: (40.0, 0.9), 1: (40.0, 0.9), 2: (40.0, 0.9)},
             1.3: {0: (1.0, 0.9), 1: (None, 0.2), 2: (None, 0.2)},
             1.6: {0: (10.0, 0.8), 1: (20.0, 0.8), 2: (None, 0.3)},
             2.0: {0: (30.0, 0.95), 1: (30.0, 0.95), 2: (30.0, 0.95)}}
    run, calls = _fake(table)
    chosen, record = tuned_first_k(_cell(), [0, 1, 2], [1.1, 1.3, 1.6, 2.0], run, extend=2)
    assert chosen.overcommit == 1.6 and chosen.first_k() == 12  # floor(20 / 1.6)
    assert record["chosen"] == 1.6 and record["a_priori"] == 1.3
    assert record["extensions"] == [] and record["at_edge"] is False
    assert len(calls) == 12 and {seed for _, seed in calls} == {0, 1, 2}
    entry = next(r for r in record["grid"] if r["overcommit"] == 1.3)
    assert entry["median_time_to_target_all_seeds"] is None and entry["k"] == 15
    assert entry["per_seed"]["1"] == {"time_to_target": None, "final_accuracy": 0.2}


def test_an_edge_pick_grows_the_list_and_the_rule_picks_again():
    """2.0 wins the list (K = 10): 3.0 (K = 6) is tried next and wins, then 4.5 (K = 4),
    which loses; 3.0 is inside the values tried: no more growth."""
    times = {1.1: 50.0, 1.3: 40.0, 1.6: 30.0, 2.0: 20.0, 3.0: 10.0, 4.5: 15.0}
    table = {c: {0: (t, 0.9)} for c, t in times.items()}
    run, calls = _fake(table)
    chosen, record = tuned_first_k(_cell(), [0], [1.1, 1.3, 1.6, 2.0], run, extend=2)
    assert chosen.overcommit == 3.0
    assert record["extensions"] == [[3.0], [4.5]] and record["at_edge"] is False
    assert [c for c, _ in calls] == [1.1, 1.3, 1.6, 2.0, 3.0, 4.5]
    # with no growth allowed the list's edge stays the pick, and the record says so
    chosen, record = tuned_first_k(_cell(), [0], [1.1, 1.3, 1.6, 2.0], _fake(table)[0])
    assert chosen.overcommit == 2.0 and record["at_edge"] is True


def test_growth_below_goes_halfway_to_one_and_skips_what_samples_the_same():
    cell = _cell()
    assert grown([1.1, 1.3, 1.6, 2.0], 1.1, cell) == [1.05]  # K 19, not 18
    assert grown([1.1, 1.3, 1.6, 2.0], 1.3, cell) == []  # inside
    # at 1000 nodes with cohorts of 100, c only sets how many are sampled (K = 100 while
    # ceil(c K) <= 1000): 1.05 samples 105, new; a value sampling what one tried is skipped
    big = _cell(n=1000, cohort=100)
    assert grown([1.1, 1.3], 1.1, big) == [1.05]
    assert grown([1.0, 1.3], 1.0, big) == []  # (1 + 1) / 2 = 1: tried


def test_ties_go_to_the_higher_accuracy_then_to_the_a_priori_value():
    table = {c: {0: (10.0, 0.9)} for c in (1.1, 1.3, 1.6, 2.0)}
    chosen, _ = tuned_first_k(_cell(), [0], [1.1, 1.3, 1.6, 2.0], _fake(table)[0])
    assert chosen.overcommit == 1.3
    table[2.0] = {0: (10.0, 0.95)}
    chosen, _ = tuned_first_k(_cell(), [0], [1.1, 1.3, 1.6, 2.0], _fake(table)[0])
    assert chosen.overcommit == 2.0


@pytest.mark.parametrize(("rules", "message"), [
    ({"first_k_tune_overcommit": []}, "first_k_tune_overcommit=\\[\\]"),
    ({"first_k_tune_overcommit": [1.3, 0.9]}, "0.9 is not a number >= 1"),
    ({"first_k_tune_overcommit": [1.3, math.nan]}, "nan is not a number >= 1"),
    ({"first_k_tune_overcommit": [1.3], "first_k_tune_extend": -1},
     "first_k_tune_extend=-1: expected an integer >= 0"),
])
def test_a_bad_list_is_refused_naming_it(rules, message):
    with pytest.raises(ValueError, match=message):
        check_overcommit_list(rules)


def test_a_fixed_overcommit_is_refused_while_it_is_tuned(tmp_path):
    with pytest.raises(SystemExit, match=r"--rule overcommit=1\.6: first-k's "
                                         r"over-commitment is tuned"):
        compare.main(["--methods", "first-k", "--rule", "overcommit=1.6", "--seeds", "10",
                      "--out", str(tmp_path / "x.json")])


def test_a_cell_records_the_tuning_and_its_reported_seeds_run_the_pick(tmp_path):
    """A tiny comparison (digits, 6 nodes, 2 rounds): settings.first_k holds the tuning (the
    list tried on the development seed) and the pick, whose K the reported runs kept."""
    out = tmp_path / "fk.json"
    compare.main(["--n", "6", "--rounds", "2", "--methods", "auto,first-k", "--seeds", "10",
                  "--dev-seeds", "0", "--set", "latency=bimodal", "--out", str(out)])
    data = json.loads(out.read_text())
    first_k = data["settings"]["first_k"]
    assert first_k["tuning"]["dev_seeds"] == [0]
    tried = [g["overcommit"] for g in first_k["tuning"]["grid"]]
    # the grid file's list first, a value that keeps and samples as many nodes as one
    # before it skipped (at n = 6: K = floor(6 / c), ceil(c K) sampled), then its growths
    rules = compare.load_grid()["rules"]
    base, shapes = [], set()
    for c in rules["first_k_tune_overcommit"]:
        shape = (math.floor(6 / c), math.ceil(c * math.floor(6 / c)))
        if shape not in shapes:
            shapes.add(shape)
            base.append(float(c))
    assert tried[:len(base)] == base
    assert len(tried) <= len(base) + int(rules["first_k_tune_extend"])
    assert first_k["overcommit"] == first_k["tuning"]["chosen"]
    assert first_k["k"] == _cell(n=6, cohort=6, overcommit=first_k["overcommit"]).first_k()


def test_tuning_on_the_reported_seeds_is_recorded_and_said(tmp_path, capsys):
    """first-k tuned on a seed it also reports (a development reading) records the overlap,
    as FedBuff's tuning does, and says it is not a pre-registered reading."""
    out = tmp_path / "fk.json"
    assert compare.main(["--n", "5", "--rounds", "2", "--seeds", "0", "--dev-seeds", "0",
                         "--target", "0.3", "--methods", "first-k", "--out", str(out)]) == 0
    tuning = json.loads(out.read_text())["settings"]["first_k"]["tuning"]
    assert tuning["tuned_on_reported_seeds"] == [0]
    assert "first-k is tuned on seeds it reports ([0])" in capsys.readouterr().out
