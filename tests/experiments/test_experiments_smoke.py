"""The experiment scripts run end to end in --quick mode and write what they promise."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


def load(name: str):
    """The experiment module ``experiments.<name>``."""
    return importlib.import_module(f"experiments.{name}")


def test_bench_codes_quick_writes_json_with_accurate_stable_codes(tmp_path):
    out = tmp_path / "bench.json"
    result = load("bench_codes").main(["--quick", "--out", str(out)])
    saved = json.loads(out.read_text())
    assert saved["accuracy"] == result["accuracy"]
    stable = [r for r in saved["accuracy"] if r["code"] == "grouped-rs"]
    assert stable and all(r["worst_relative_error"] <= 1e-10 for r in stable)
    assert {t["code"] for t in saved["timing"]} == {"grouped-rs", "crc", "comm-efficient"}


def test_matmul_speedup_quick_reproduces_lee_et_al_best_k(tmp_path):
    out = tmp_path / "ms"
    result = load("matmul_speedup").main(["--quick", "--out", str(out)])
    assert (tmp_path / "ms.png").stat().st_size > 10_000
    curves = result["curves"]
    # n=100, shift 1: best k 69 (1.98x) at rate 1 and 34 (3.50x) at rate 0.1 (Lee et al. 2018)
    assert curves["1.0"]["best_k"] == 69
    assert curves["1.0"]["best_speedup"] == pytest.approx(1.98, abs=0.01)
    assert curves["0.1"]["best_k"] == 34
    assert curves["0.1"]["best_speedup"] == pytest.approx(3.50, abs=0.01)
    # gradient coding never beats uncoded under this load-scaled model unless rate is tiny
    assert curves["1.0"]["gc_best_s"] == 0
    assert max(result["regression"]["distance_to_uncoded"].values()) < 1e-10


def test_bench_dp_quick_measures_partition_dp_overhead(tmp_path):
    out = tmp_path / "dp.json"
    result = load("bench_dp").main(["--quick", "--out", str(out)])
    rows = {(r["update"], r["dp"]): r for r in json.loads(out.read_text())["rows"]}
    assert rows == {(r["update"], r["dp"]): r for r in result["rows"]}
    assert all(r["seconds"] > 0 for r in rows.values())
    assert rows[("local", "none")]["ratio_vs_none"] == 1.0


def test_demo_coded_runs_match_uncoded_and_ignoring_stragglers_does_not():
    from fl_gradcode.demo import run

    results = run(n=12, s=3, rounds=10, seed=0)
    assert results["grouped-rs"]["distance_to_uncoded"] < 1e-10
    assert results["frc"]["distance_to_uncoded"] < 1e-10
    assert results["ignore-stragglers"]["distance_to_uncoded"] > 1e-3


def test_speedup_vs_s_shows_both_sides(tmp_path):
    result = load("speedup_vs_s").main(["--quick", "--out", str(tmp_path / "sp")])
    for c in result["curves"].values():
        assert max(c["load_scaled"]) == pytest.approx(1.0)  # s = 0: coding never pays
        assert all(v > 1 for v in c["load_independent"][1:])  # load-independent times: always pays
        mc = dict(zip(c["mc"]["s"], c["mc"]["load_independent"], strict=True))
        closed = dict(zip(c["s"], c["load_independent"], strict=True))
        assert all(v == pytest.approx(closed[s], rel=0.1) for s, v in mc.items())


def test_approx_error_matches_closed_forms(tmp_path):
    result = load("approx_error").main(["--quick", "--out", str(tmp_path / "ae")])
    n = result["n"]
    for i, r in enumerate(result["r"]):
        assert result["mean_error"]["ignore (a=1)"][i] == pytest.approx(r / n)
        assert result["mean_error"]["ignore (rescaled)"][i] == pytest.approx(r / (n - r))
        assert result["expander_fixed"][i] <= result["expander_bound"][i] + 1e-12
    assert result["mean_error"]["FRC, optimal"][-1] == pytest.approx(
        result["frc_closed_form"][-1], abs=0.15)


def test_regime_map_has_a_losing_and_a_winning_corner(tmp_path):
    result = load("regime_map").main(["--quick", "--out", str(tmp_path / "rm")])
    best = result["best_s"]
    assert best[-1][0] == 0  # expensive compute, mild stragglers: stay uncoded
    assert best[0][-1] > 0  # cheap compute, severe stragglers: code
    assert result["speedup"][0][-1] > 2


def test_latency_vs_s_closed_form_matches_monte_carlo(tmp_path):
    result = load("latency_vs_s").main(["--quick", "--out", str(tmp_path / "lat")])
    for e in result["models"].values():
        for closed, mc in zip(e["closed_form"], e["monte_carlo"], strict=True):
            assert mc == pytest.approx(closed, rel=0.1)
        assert set(e["measured"]) == set(result["s_measured"])


def test_time_to_accuracy_exact_coding_tracks_uncoded(tmp_path):
    result = load("time_to_accuracy").main(["--quick", "--out", str(tmp_path / "tta")])
    rows = next(iter(result["table"].values()))
    assert rows["exact"]["max_accuracy_gap_to_uncoded"] == 0.0
    assert rows["ignore-stragglers"]["max_accuracy_gap_to_uncoded"] > 0.0
    # the goals' summary: auto's speed-up under Pareto delays as in its table row, and the
    # figure of the goals next to the main one
    goals = json.loads((tmp_path / "tta.json").read_text())["goals"]
    assert goals["auto"]["speedup_pareto"] == rows["auto"]["speedup_vs_uncoded"]
    assert (tmp_path / "tta_adaptive.png").stat().st_size > 10_000


def test_time_to_accuracy_worst_case_over_settings_names_fixed_choices_relative_to_s_max():
    """Two settings, times to target by hand: at n = 12 (s_max 3) uncoded 8, exact 2, s=1 4,
    auto 3 (best 2); at n = 100 (s_max 12) uncoded 10, exact 20, s=3 (s_max/4) 5, s=6
    (s_max/2) never on one seed, auto 6 (best 5). Worst ratios: s=0 max(4, 2) = 4, s=s_max
    max(1, 4) = 4, auto max(1.5, 1.2) = 1.5, s=s_max/4 1 (one setting)."""
    module = load("time_to_accuracy")

    def row(t, reached=2):
        return {"time_to_target_mean": t, "reached": reached}

    table = {"n=12 s=3 pareto": {"uncoded": row(8.0), "exact": row(2.0),
                                 "nested-fit s=1": row(4.0), "auto": row(3.0)},
             "n=100 s=12 bimodal": {"uncoded": row(10.0), "exact": row(20.0),
                                    "nested-fit s=3": row(5.0), "nested-fit s=6": row(4.0, 1),
                                    "auto": row(6.0)},
             "n=12 s=3 pareto +DP": {"uncoded": row(None, 0), "auto": row(None, 0)}}
    worst = module.worst_case(table)
    assert set(worst) == {"same_information"}  # no auto-deadline: no deadline group
    every = worst["same_information"]["all"]
    assert every["settings"] == ["n=12 s=3 pareto", "n=100 s=12 bimodal"]  # DP never reached
    assert every["worst"] == {"s=0": 4.0, "s=1": 2.0, "s=s_max": 4.0, "s=s_max/2": None,
                              "s=s_max/4": 1.0, "auto": 1.5}
    assert every["worst_setting"]["s=s_max"] == "n=100 s=12 bimodal"
    assert every["worst_setting"]["auto"] == "n=12 s=3 pareto"
    assert every["never"]["s=s_max/2"] == ["n=100 s=12 bimodal"]
    assert every["ran_in"] == {"s=0": 2, "s=1": 1, "s=s_max": 2, "s=s_max/2": 1,
                               "s=s_max/4": 1, "auto": 2}
    assert worst["same_information"]["n=100"]["worst"]["auto"] == pytest.approx(1.2)
    assert worst["same_information"]["n=12"]["settings"] == ["n=12 s=3 pareto"]
    table["n=12 s=3 pareto"]["auto-deadline"] = row(1.0)
    table["n=12 s=3 pareto"]["deadline-fit s=3"] = row(1.5)
    table["n=12 s=3 pareto"]["deadline-fit s=0"] = row(3.0)
    deadline = module.worst_case(table)["with_deadline"]["all"]
    assert deadline["worst"] == {"s=0": 3.0, "s=s_max": 1.5, "auto-deadline": 1.0}
    # s_max queued like auto (oracle s=s_max) replaces exact where it is faster: n = 100's
    # best is then 4 (auto 6 / 4 = 1.5, exact's 20 gone)
    table["n=100 s=12 bimodal"]["oracle s=12"] = row(4.0)
    every = module.worst_case(table)["same_information"]["all"]
    assert every["worst"]["s=s_max"] == pytest.approx(1.0)
    assert every["worst"]["auto"] == pytest.approx(1.5)
    # with three seeds run, a choice that reached the target on two is never there; nobody
    # reached it on three seeds: no setting counts
    assert module.worst_case(table, seeds=3) == {}
    table["n=12 s=3 pareto"]["uncoded"] = row(8.0, 3)
    three = module.worst_case(table, seeds=3)["same_information"]["all"]
    assert three["settings"] == ["n=12 s=3 pareto"]
    assert three["worst"]["s=0"] == 1.0 and three["never"]["auto"] == ["n=12 s=3 pareto"]
    # a setting with one fixed choice besides auto compares nothing
    lone = module.worst_case({"n=12 s=3 trace": {"uncoded": row(2.0), "auto": row(1.0)}})
    assert lone == {}


def test_time_to_accuracy_goals_read_every_comparison_from_the_table():
    """Made-up rows, 2 seeds: auto within 1.05 of the hindsight rivals in one setting of
    three and of the rivals with its information in two; under drift faster than every fixed
    choice to the target only; one setting whose rounds were not all exact, one that never
    reached the target where uncoded did, one where the rivals reached it on a seed auto did
    not (unbounded ratios)."""
    module = load("time_to_accuracy")

    def auto(reached=2, exact=30.0, **ratios):
        row = {"reached": reached, "exact_rounds": exact, "max_accuracy_gap_to_uncoded": 0.0}
        for suffix, value in ratios.items():
            key = "" if suffix == "hindsight" else f"_{suffix}"
            row[f"vs_best_fixed{key}"] = value
            row[f"best_fixed{key}"] = "exact"
            row[f"fixed_compared{key}"] = ["exact", "uncoded"]
        return row

    uncoded = {"reached": 2, "exact_rounds": 30.0}
    table = {
        "n=12 s=3 pareto": {"auto": {**auto(hindsight=1.04, same_information=1.0),
                                     "speedup_vs_uncoded": 3.5},
                            "uncoded": uncoded, "exact": {"reached": 2}},
        "n=12 s=3 drift": {"auto": auto(hindsight=0.9, final=1.0, same_information=1.05),
                           "uncoded": uncoded, "exact": {"reached": 2}},
        "n=12 s=3 drift-early": {"auto": {**auto(exact=29.0, hindsight=1.06),
                                          "max_accuracy_gap_to_uncoded": 0.1},
                                 "uncoded": uncoded, "exact": {"reached": 2}},
        "n=12 s=3 bimodal": {"auto": auto(reached=0), "uncoded": uncoded},
        "n=12 s=3 trace": {"auto": auto(reached=1, hindsight=0.5),
                           "uncoded": uncoded, "exact": {"reached": 2}},
        "n=12 s=3 pareto +DP": {"auto": auto(reached=0),
                                "uncoded": {"reached": 0, "exact_rounds": 30.0}},
        "n=12 s=3 persistent": {"auto": {"reached": 2}},  # no gap, no rounds: not classified
    }
    goals = module.goals(table)
    assert set(goals) == {"auto"}  # no other adaptive scheme in the table
    result = goals["auto"]
    hindsight = result["within"]["hindsight"]
    assert hindsight["met"] == ["n=12 s=3 drift", "n=12 s=3 pareto"]
    assert hindsight["missed"] == {"n=12 s=3 bimodal": None, "n=12 s=3 drift-early": 1.06,
                                   "n=12 s=3 trace": None}
    assert hindsight["best_fixed"]["n=12 s=3 pareto"] == "exact"
    same = result["within"]["same_information"]
    assert same["met"] == ["n=12 s=3 drift", "n=12 s=3 pareto"] and same["missed"] == {}
    assert "with_deadline" not in result["within"]  # auto-deadline's comparison only
    assert result["drift"]["n=12 s=3 drift"] == {
        "to_target": 0.9, "to_final_model": 1.0, "strictly_better_to_target": True,
        "strictly_better_to_final_model": False}  # 1.0 is not strictly better
    assert result["drift"]["n=12 s=3 drift-early"]["strictly_better_to_target"] is False
    assert result["drift"]["n=12 s=3 drift-early"]["strictly_better_to_final_model"] is None
    assert "n=12 s=3 pareto" not in result["drift"]
    assert result["exact"] == {
        "equal": ["n=12 s=3 pareto", "n=12 s=3 drift", "n=12 s=3 bimodal", "n=12 s=3 trace",
                  "n=12 s=3 pareto +DP"],
        "differ": [], "approximate": ["n=12 s=3 drift-early"]}
    table["n=12 s=3 pareto"]["auto"]["max_accuracy_gap_to_uncoded"] = 0.01
    assert module.goals(table)["auto"]["exact"]["differ"] == ["n=12 s=3 pareto"]
    assert result["speedup_pareto"] == 3.5 and result["speedup_n256_bimodal"] is None
    assert result["speedup_met"] == {"speedup_pareto": True}
    table["n=256 s=32 bimodal"] = {"auto": {**auto(), "speedup_vs_uncoded": 0.99}}
    assert module.goals(table)["auto"]["speedup_met"] == {"speedup_pareto": True,
                                                          "speedup_n256_bimodal": False}
    # a stricter factor moves a setting from met to missed
    assert module.goals(table, factor=1.03)["auto"]["within"]["hindsight"]["missed"][
        "n=12 s=3 pareto"] == 1.04
    # auto-deadline alone is compared with the rivals given its deadline rule
    table["n=12 s=3 pareto"]["auto-deadline"] = auto(with_deadline=1.2)
    deadline = module.goals(table)["auto-deadline"]["within"]["with_deadline"]
    assert deadline["missed"] == {"n=12 s=3 pareto": 1.2}


def test_time_to_accuracy_parallel_runs_equal_serial_runs(tmp_path):
    module = load("time_to_accuracy")
    args = ["--quick", "--only", "n=12 s=3 pareto", "--schemes", "auto", "--seeds", "2"]
    serial = module.main([*args, "--out", str(tmp_path / "serial")])
    parallel = module.main([*args, "--jobs", "2", "--out", str(tmp_path / "parallel")])
    assert serial["seeds"] == [0, 1]
    assert len(serial["runs"]["n=12 s=3 pareto"]["auto"]) == 2
    assert parallel["runs"] == serial["runs"]


def test_time_to_accuracy_ratio_interval_is_a_paired_bootstrap_over_seeds():
    """Times to target 1, 3 (auto) and 2, 2 (fixed): resampling two seeds gives the ratio of
    means 0.5 (seed 0 twice, probability 1/4), 1.5 (seed 1 twice, 1/4) or 1 (1/2)."""
    module = load("time_to_accuracy")

    def run(t):  # reaches the target at time t
        return {"virtual_s": [t / 2, t, 2 * t], "accuracy": [0.5, 0.95, 0.97]}

    low, high = module.ratio_ci([run(1.0), run(3.0)], [run(2.0), run(2.0)], 0.9)
    assert (low, high) == (0.5, 1.5)
    low, high = module.ratio_ci([run(1.0), run(3.0)], [run(2.0), run(6.0)], 0.9)
    assert low == high == pytest.approx(0.5)  # paired: every resample has ratio 1/2
    never = {"virtual_s": [1.0], "accuracy": [0.1]}
    # a seed where one of them never reached the target is left out of both
    low, high = module.ratio_ci([run(1.0), run(3.0), run(5.0)], [run(2.0), run(2.0), never],
                                 0.9)
    assert (low, high) == (0.5, 1.5)
    nan = module.ratio_ci([run(1.0), run(3.0)], [run(2.0), never], 0.9)
    assert all(x != x for x in nan)  # fewer than two seeds left: no interval


def test_bandwidth_limited_comm_efficient_replies_are_shorter_and_arrive_sooner(tmp_path):
    result = load("bandwidth_limited").main(["--quick", "--out", str(tmp_path / "bw")])
    rows = {r["scheme"]: r for r in result["table"]}
    assert set(rows) == {"uncoded", "exact", "comm-efficient", "drop-stragglers"}
    # m = 2: a reply is half the model (plus a header), so a round uploads under 0.6x uncoded
    assert rows["comm-efficient"]["bytes_vs_uncoded"] < 0.6
    # uploads dominate (a full model takes 2 s): the shorter replies make rounds faster
    assert rows["comm-efficient"]["round_s"] < rows["exact"]["round_s"]
    coded = [r for name, r in rows.items() if name != "drop-stragglers"]
    assert all(r["exact_rounds"] == r["rounds"] for r in coded)
    # Flower's FedAvg with a deadline: no round outlasts it
    drop = rows["drop-stragglers"]
    assert drop["round_s"] <= drop["deadline_s"] + 1e-9 and drop["late_dropped_per_round"] >= 0


def test_time_to_accuracy_compares_auto_with_fixed_codes_of_either_information():
    """Rivals whose busy clients are queued from the simulator's clock (nested s=v) and from
    the server's knowledge (nested-fit s=v, as auto): each comparison takes uncoded, exact and
    its own kind only. Times to target: auto 6, nested s=1 4, nested-fit s=1 7 and 5 (mean 6)."""
    module = load("time_to_accuracy")

    def run(t):
        return {"virtual_s": [t / 2, t, 2 * t], "accuracy": [0.5, 0.95, 0.97],
                "decode": ["exact"] * 3, "epsilon": None}

    runs = {"k": {"uncoded": [run(10.0)] * 2, "exact": [run(8.0)] * 2, "auto": [run(6.0)] * 2,
                  "nested s=1": [run(4.0)] * 2, "nested-fit s=1": [run(7.0), run(5.0)]}}
    auto = module.build_table(runs, 0.9)["k"]["auto"]
    assert (auto["best_fixed"], auto["vs_best_fixed"]) == ("nested s=1", 1.5)
    assert auto["fixed_compared"] == ["exact", "nested s=1", "uncoded"]
    assert auto["best_fixed_same_information"] == "nested-fit s=1"
    assert auto["vs_best_fixed_same_information"] == pytest.approx(1.0)
    assert auto["fixed_compared_same_information"] == ["exact", "nested-fit s=1", "uncoded"]
    del runs["k"]["nested-fit s=1"]  # no fixed code queued like auto: no such comparison
    assert "vs_best_fixed_same_information" not in module.build_table(runs, 0.9)["k"]["auto"]
    assert module.scheme_config("nested-fit s=6") == {"code": "nested", "s": 6, "busy": "fit"}
    assert module.scheme_config("nested s=6") == {"code": "nested", "s": 6, "busy": "queue"}
    assert "nested-fit s=3" in module.schemes_for(12)


def test_time_to_accuracy_compares_time_to_the_final_model_over_exact_runs_only():
    """Time to the final model = the last round's time, for runs whose every round decoded
    exactly. Last rounds: auto 12 and 8 (mean 10), exact 10 and 10, nested s=1 6 and 6 but
    with one approximate round (a different model: not compared), uncoded 20 and 20. By hand:
    best exact fixed = exact, auto / exact = 1.0; resampling the two seeds gives 1.2 (seed 0
    twice), 0.8 (seed 1 twice) or 1.0."""
    module = load("time_to_accuracy")

    def run(last, decode=("exact",) * 3):
        return {"virtual_s": [1.0, 2.0, last], "accuracy": [0.95, 0.96, 0.97],
                "decode": list(decode), "epsilon": None}

    runs = {"k": {"uncoded": [run(20.0)] * 2, "exact": [run(10.0)] * 2,
                  "auto": [run(12.0), run(8.0)],
                  "nested s=1": [run(6.0, ("exact", "approximate", "exact"))] * 2}}
    auto = module.build_table(runs, 0.9)["k"]["auto"]
    assert auto["best_fixed_final"] == "exact"
    assert auto["vs_best_fixed_final"] == pytest.approx(1.0)
    assert auto["fixed_compared_final"] == ["exact", "uncoded"]
    assert auto["vs_best_fixed_final_ci95"] == pytest.approx([0.8, 1.2])
    assert auto["time_to_final_model_mean"] == pytest.approx(10.0)
    # the target comparison still counts nested s=1 (reached 0.9 at 1 s like the others)
    assert auto["fixed_compared"] == ["exact", "nested s=1", "uncoded"]


def test_time_to_accuracy_oracle_splits_the_gap_into_first_round_and_choices():
    """Times to target: nested s=1 4 (best fixed), nested-fit s=1 4.5, oracle s=1 5 (s_max in
    round 1, then 1), oracle s=2 7, auto 6: auto / oracle = 6/5, oracle / best fixed = 5/4,
    the round at s_max costs 5/4.5 against the same v with the same information."""
    module = load("time_to_accuracy")

    def run(t, s=(3, 3, 3)):
        return {"virtual_s": [t / 2, t, 2 * t], "accuracy": [0.5, 0.95, 0.97],
                "decode": ["exact"] * 3, "epsilon": None, "s": list(s)}

    runs = {"k": {"uncoded": [run(10.0)] * 2, "auto": [run(6.0)] * 2,
                  "nested s=1": [run(4.0)] * 2, "nested-fit s=1": [run(4.5)] * 2,
                  "oracle s=1": [run(5.0, (3, 1, 1))] * 2,
                  "oracle s=2": [run(7.0, (3, 2, 2))] * 2}}
    auto = module.build_table(runs, 0.9)["k"]["auto"]
    assert auto["oracle"] == "oracle s=1"
    assert auto["oracle_compared"] == ["oracle s=1", "oracle s=2"]
    assert auto["vs_oracle"] == pytest.approx(6 / 5)
    assert auto["vs_oracle_ci95"] == pytest.approx([6 / 5, 6 / 5])
    assert auto["oracle_vs_best_fixed"] == pytest.approx(5 / 4)
    assert auto["oracle_start_cost"] == pytest.approx(5 / 4.5)
    assert auto["vs_oracle_final"] == pytest.approx(6 / 5)  # every round exact
    # oracles that change s are references, not fixed rivals
    assert auto["fixed_compared"] == ["nested s=1", "uncoded"]
    assert auto["fixed_compared_same_information"] == ["nested-fit s=1", "uncoded"]
    # an oracle that kept s_max in every round is the fixed s_max with auto's information
    runs["k"]["oracle s=3"] = [run(4.2)] * 2
    auto = module.build_table(runs, 0.9)["k"]["auto"]
    assert auto["fixed_compared_same_information"] == ["nested-fit s=1", "oracle s=3",
                                                       "uncoded"]
    assert auto["vs_best_fixed_same_information"] == pytest.approx(6 / 4.2)
    assert (auto["oracle"], auto["oracle_start_cost"]) == ("oracle s=3", 1.0)
    del runs["k"]["oracle s=3"]
    # an oracle run with a round that did not decode exactly computed other models: no bound
    runs["k"]["oracle s=1"] = [dict(run(5.0, (3, 1, 1)),
                                    decode=["exact", "approximate", "exact"])] * 2
    auto = module.build_table(runs, 0.9)["k"]["auto"]
    assert (auto["oracle"], auto["oracle_compared"]) == ("oracle s=2", ["oracle s=2"])
    assert auto["vs_oracle"] == pytest.approx(6 / 7)
    assert "oracle_start_cost" not in auto  # no nested-fit s=2 run
    assert module.oracle_schemes(12) == ["oracle s=0", "oracle s=1", "oracle s=2",
                                         "oracle s=3", "oracle s=6", "oracle s=12"]


def test_time_to_accuracy_oracle_is_compared_on_the_seeds_auto_reached_the_target():
    """auto reaches 0.9 on seed 0 only (at 6); oracle s=1 took 5 there and 100 on seed 1,
    oracle s=2 7 and 7: on seed 0 alone s=1 is the best (over both seeds it would be s=2);
    one seed: no interval. The final model is compared on both seeds (auto 12 and 40)."""
    module = load("time_to_accuracy")

    def run(t, s=(3, 3, 3), acc=0.95):
        return {"virtual_s": [t / 2, t, 2 * t], "accuracy": [0.5, acc, acc],
                "decode": ["exact"] * 3, "epsilon": None, "s": list(s)}

    runs = {"k": {"uncoded": [run(10.0), run(20.0)],
                  "auto": [run(6.0), run(20.0, acc=0.8)],
                  "oracle s=1": [run(5.0, (3, 1, 1)), run(100.0, (3, 1, 1))],
                  "oracle s=2": [run(7.0, (3, 2, 2)), run(7.0, (3, 2, 2))]}}
    auto = module.build_table(runs, 0.9)["k"]["auto"]
    assert (auto["oracle"], auto["oracle_time"]) == ("oracle s=1", 5.0)
    assert auto["vs_oracle"] == pytest.approx(6 / 5)
    assert all(x != x for x in auto["vs_oracle_ci95"])
    assert auto["oracle_final"] == "oracle s=2"  # 2 * 7 = 14 against (10 + 200) / 2
    assert auto["vs_oracle_final"] == pytest.approx(26 / 14)
    assert auto["vs_best_fixed_final"] == pytest.approx(26 / 30)  # uncoded: 20 and 40


def test_time_to_accuracy_oracle_run_starts_at_s_max_then_keeps_its_s():
    """The hindsight oracle through the real strategy: round 1 at s_max (nothing observed),
    then the fixed v; every round exact (the same models as uncoded); a policy passed in, the
    library's classes left as they were."""
    module = load("time_to_accuracy")
    from fl_gradcode.flower.policy import AdaptiveCodePolicy
    from fl_gradcode.flower.wrapper import GradientCoding

    before = (dict(vars(GradientCoding)), dict(vars(AdaptiveCodePolicy)))
    oracle = module.one_run(12, 3, "oracle s=2", "pareto", False, 0, 4, "dirichlet")
    assert (dict(vars(GradientCoding)), dict(vars(AdaptiveCodePolicy))) == before
    assert oracle["s"] == [3, 2, 2, 2]  # auto itself: 3, 1, 1, 3 on this seed
    assert oracle["decode"] == ["exact"] * 4
    uncoded = module.one_run(12, 3, "uncoded", "pareto", False, 0, 4, "dirichlet")
    assert oracle["accuracy"] == uncoded["accuracy"]
    # the oracle that keeps s_max is the fixed s_max queued like auto, round for round (so
    # it counts among the same-information rivals)
    kept = module.one_run(12, 3, "oracle s=3", "bimodal", False, 1, 6, "dirichlet")
    fixed = module.one_run(12, 3, "nested-fit s=3", "bimodal", False, 1, 6, "dirichlet")
    assert kept["s"] == fixed["s"] == [3] * 6
    assert kept["virtual_s"] == fixed["virtual_s"]


def test_time_to_accuracy_auto_warm_starts_from_an_earlier_runs_file():
    """auto-warm: an auto run with seed + 1000 (the same slow clients through latency-seed)
    writes the latency file, the measured run reads it. Under persistent stragglers (one slow
    client in 12 at 20x) the cold run starts at the safe s_max = 3 with nothing observed, the
    warm one below it from the file; every round is exact, the same models as uncoded."""
    module = load("time_to_accuracy")
    warm = module.one_run(12, 3, "auto-warm", "persistent", False, 0, 4, "dirichlet")
    cold = module.one_run(12, 3, "auto", "persistent", False, 0, 4, "dirichlet")
    uncoded = module.one_run(12, 3, "uncoded", "persistent", False, 0, 4, "dirichlet")
    assert cold["s"][0] == 3 and warm["s"][0] < 3
    assert warm["decode"] == ["exact"] * 4 and warm["accuracy"] == uncoded["accuracy"]
    assert "auto-warm" in module.ADAPTIVE and module.scheme_config("auto-warm") == {"s": "auto"}


def test_bench_adaptive_quick_times_the_decision_and_runs_the_closed_loop(tmp_path):
    out = tmp_path / "ba"
    result = load("bench_adaptive").main(["--quick", "--out", str(out)])
    saved = json.loads(out.with_suffix(".json").read_text())
    assert saved["closed_loop"] == result["closed_loop"]
    dec = saved["decision"]
    assert dec["choose_ms"] > 0 and dec["fedavg_ms"] > 0
    assert dec["choose_over_fedavg"] == pytest.approx(dec["choose_ms"] / dec["fedavg_ms"])
    assert dec["state_write_ms"] > 0 and dec["state_read_ms"] > 0 and dec["state_bytes"] > 0
    assert dec["state_write_over_fedavg"] == pytest.approx(
        dec["state_write_ms"] / dec["fedavg_ms"])
    assert {"0", str(dec["s_max"])} <= set(dec["expected_s"])
    # compute-bound shifted exponential, uncoded on the nested placement: every client one
    # unit, the round waits for the slowest of 12: E = 1 + H_12 (order statistics), 200 rounds
    shifted = saved["closed_loop"]["shifted-exp"]
    h12 = sum(1.0 / i for i in range(1, 13))
    assert shifted["fixed_mean_round_s"]["0"] == pytest.approx(1.0 + h12, abs=0.3)
    assert shifted["best_fixed"] == 0 and shifted["path"][-1] == 0  # coding cannot pay there


def test_sampled_cohorts_quick_keeps_estimates_across_cohorts(tmp_path):
    out = tmp_path / "sc"
    module = load("sampled_cohorts")
    result = module.main(["--quick", "--out", str(out), "--jobs", "1"])
    saved = json.loads(out.with_suffix(".json").read_text())
    assert saved["table"] == result["table"]
    runs = saved["runs"]["persistent"]
    # every round exact; the same seed samples the same cohorts: the same model every round
    for scheme in ("uncoded", "auto-reset", "auto"):
        assert all(d == "exact" for d in runs[scheme][0]["decode"])
    assert runs["auto"][0]["accuracy"] == runs["uncoded"][0]["accuracy"]
    assert runs["auto"][0]["nodes_seen"] > 12  # cohorts of 12 out of 24 nodes
    # a new estimator every round (the earlier behaviour) never leaves s_max; auto does
    assert set(runs["auto-reset"][0]["s"]) == {3}
    assert min(runs["auto"][0]["s"][1:]) < 3
    # the paired comparison of auto with auto-reset from the saved runs, by hand
    table = module.build_table({"persistent": {"auto": runs["auto"] * 2,
                                               "auto-reset": runs["auto-reset"] * 2}}, 0.0)
    mean_round = np.mean(runs["auto"][0]["round_s"]) / np.mean(runs["auto-reset"][0]["round_s"])
    assert table["persistent"]["auto"]["round_vs_auto_reset"] == pytest.approx(mean_round)


def test_time_to_accuracy_approx_deadline_stop_frees_clients_at_the_deadline():
    """approx-deadline-stop: approx-deadline whose clients stop at the deadline. No round lasts
    beyond the deadline (75th percentile of a coded client's time) in either; stopping changes
    who answers later rounds (clients stuck in stale work are free again), hence the models."""
    module = load("time_to_accuracy")
    assert module.scheme_config("approx-deadline-stop") == {
        **module.SCHEMES["approx-deadline"], "stop-late-work": True}
    assert "approx-deadline-stop" in module.ON_REQUEST
    limit = module.deadline(module.LATENCIES["bimodal"], 4, 0)
    runs = {scheme: module.one_run(12, 3, scheme, "bimodal", False, 0, 6, "dirichlet")
            for scheme in ("approx-deadline", "approx-deadline-stop")}
    for run in runs.values():
        assert np.all(np.diff(np.r_[0.0, run["virtual_s"]]) <= limit + 1e-9)
    assert runs["approx-deadline"]["accuracy"] != runs["approx-deadline-stop"]["accuracy"]


def test_time_to_accuracy_auto_deadline_sets_each_rounds_deadline_from_its_prediction():
    """auto-deadline: auto with auto-deadline = 3. Round 1 (nothing observed, the straggler
    timeout) is the same as auto's; afterwards the deadlines stop stale work, so the runs part."""
    module = load("time_to_accuracy")
    assert module.scheme_config("auto-deadline") == {"s": "auto", "auto-deadline": 3.0}
    assert "auto-deadline" in module.ADAPTIVE and "auto-deadline" in module.ON_REQUEST
    runs = {scheme: module.one_run(12, 3, scheme, "bimodal", False, 0, 6, "dirichlet")
            for scheme in ("auto", "auto-deadline")}
    assert runs["auto"]["virtual_s"][0] == runs["auto-deadline"]["virtual_s"][0]
    assert runs["auto"]["s"][:2] == runs["auto-deadline"]["s"][:2]
    assert runs["auto"]["virtual_s"] != runs["auto-deadline"]["virtual_s"]


def test_time_to_accuracy_compares_auto_deadline_with_fixed_codes_under_the_same_deadline():
    """deadline-fit s=v: fixed codes with auto-deadline's rule, compared only among
    themselves (``_with_deadline``; uncoded and exact without a deadline are not in it), and
    not in the other comparisons. Times to target: auto-deadline 6, deadline-fit s=1 4 and 6
    (mean 5), deadline-fit s=0 8, exact 3: 6 / 5 over the best with the deadline."""
    module = load("time_to_accuracy")

    def run(t, decode=("exact",) * 3):
        return {"virtual_s": [t / 2, t, 2 * t], "accuracy": [0.5, 0.95, 0.97],
                "decode": list(decode), "epsilon": None, "s": [3, 3, 3]}

    runs = {"k": {"uncoded": [run(10.0)] * 2, "exact": [run(3.0)] * 2,
                  "auto-deadline": [run(6.0)] * 2,
                  "deadline-fit s=1": [run(4.0, ("exact", "approx", "exact")), run(6.0)],
                  "deadline-fit s=0": [run(8.0)] * 2}}
    auto = module.build_table(runs, 0.9)["k"]["auto-deadline"]
    assert auto["best_fixed_with_deadline"] == "deadline-fit s=1"
    assert auto["vs_best_fixed_with_deadline"] == pytest.approx(6 / 5)
    assert auto["fixed_compared_with_deadline"] == ["deadline-fit s=0", "deadline-fit s=1"]
    assert (auto["best_fixed"], auto["fixed_compared"]) == ("exact", ["exact", "uncoded"])
    # to the final model only all-exact runs compete: deadline-fit s=0 (16)
    assert auto["best_fixed_with_deadline_final"] == "deadline-fit s=0"
    assert auto["vs_best_fixed_with_deadline_final"] == pytest.approx(12 / 16)
    assert module.deadline_schemes(12) == ["deadline-fit s=0", "deadline-fit s=1",
                                           "deadline-fit s=2", "deadline-fit s=3",
                                           "deadline-fit s=6", "deadline-fit s=12"]
    assert module.scheme_config("deadline-fit s=2") == {
        "code": "nested", "s": 2, "busy": "fit", "auto-deadline": 3.0}


def test_time_to_accuracy_deadline_fit_keeps_its_code_and_stops_at_its_prediction():
    """deadline-fit s=1 against nested-fit s=1: the same fixed code in every round and the same
    round 1 (nothing observed: no deadline but the timeout); afterwards the deadline stops
    stale work, so the runs part. Every exact round computes the uncoded model."""
    module = load("time_to_accuracy")
    runs = {scheme: module.one_run(12, 3, scheme, "bimodal", False, 0, 6, "dirichlet")
            for scheme in ("uncoded", "nested-fit s=1", "deadline-fit s=1")}
    fixed, timed = runs["nested-fit s=1"], runs["deadline-fit s=1"]
    assert set(timed["s"]) == {1} and timed["busy_mode"] == "fit"
    assert timed["virtual_s"][0] == fixed["virtual_s"][0]
    assert timed["virtual_s"] != fixed["virtual_s"]
    for r, (d, a) in enumerate(zip(timed["decode"], timed["accuracy"], strict=True)):
        if all(x == "exact" for x in timed["decode"][: r + 1]):
            assert a == runs["uncoded"]["accuracy"][r] and d == "exact"


def test_the_auto_approximate_tuning_runs_the_grids_regimes():
    """Its cells carry each regime's latency keys, as compare's do (it used to read the
    grid tables' own run_config, empty since the registry holds the keys: every regime ran
    with the key table's default latency)."""
    from experiments.compare import cell_run_config, load_grid, lookup, task_target
    from experiments.tune_auto_approximate import REGIMES, SIZES, tuning_cell

    grid = load_grid()
    task = lookup(grid, "tasks", "digits-logreg")
    for regime in REGIMES:
        cell = tuning_cell(grid, regime)
        assert cell.run_config == cell_run_config(grid, "digits-logreg", regime)
        assert cell.run_config["latency"] == regime
        for n in SIZES:  # every node sampled, the task's target at that size
            sized = tuning_cell(grid, regime, n)
            assert (sized.n, sized.cohort) == (n, n)
            assert sized.target == task_target(task, n, n)


def test_the_auto_approximate_tuning_rule_counts_every_seed_and_samples_its_cohorts():
    from experiments.compare import load_grid
    from experiments.tune_auto_approximate import GRID, OUT, SAMPLED, paired_ratio, tuning_cell
    from fl_gradcode.flower.approximate_rounds import ApproximateRounds

    # the rule's ratio of a seed, by its docstring: 2x, 0.5x, 1x where one or both miss
    assert (paired_ratio(3.0, 6.0), paired_ratio(None, 6.0)) == (0.5, 2.0)
    assert (paired_ratio(3.0, None), paired_ratio(None, None)) == (0.5, 1.0)
    # the library's defaults are the setting the rule chose on the development seeds
    latest = json.loads((ROOT / OUT).read_text())
    chosen = latest["chosen"]["knobs"]
    assert set(chosen) == set(GRID)  # the file is the current grid's
    assert all(getattr(ApproximateRounds, k) == v for k, v in chosen.items())
    # the latest tuning ran with the earlier one's choice of the knobs it did not tune
    earlier = json.loads((ROOT / "results" / "auto_approximate_tuning_power.json")
                         .read_text())["chosen"]["knobs"]
    assert all(latest["grid"][k] == [v] for k, v in earlier.items())
    grid = load_grid()
    assert {t for t, *_ in SAMPLED} == {"natural-noniid"}
    for task, regime, n, cohort in SAMPLED:
        cell = tuning_cell(grid, regime, n, task, cohort)
        assert (cell.n, cell.cohort, cell.run_config["latency"]) == (n, cohort, regime)
        assert cell.target == 0.23  # the grid file's natural-noniid target at 1000x100
        # compute charged as the grid file fixes it (0.0021 s per partition at n = 1000),
        # not measured under load by each run
        assert cell.run_config["virtual-compute"] == "none"
        assert cell.run_config["partition-cost-s"] == pytest.approx(0.0021, rel=1e-12)
