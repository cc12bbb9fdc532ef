"""``python -m experiments.compare``: the quick slice runs, writes the documented JSON, and its
numbers hold together; wait-for-all's curve is the numpy FedAvg oracle's (full-batch gradient
descent on the union of the partitions: FedAvg of one gradient step per partition, weighted
by examples, is exactly that)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from experiments import compare
from experiments.rival_runs import Cell, run_rival


def _cell(run_config, **shape) -> Cell:
    """A cell with the grid file's rival rules."""
    return Cell(run_config=run_config, **shape, **compare.cell_rules(compare.load_grid()))


RUN_KEYS = {"method", "seed", "time_to_target", "final_accuracy", "rounds", "bytes_up",
            "client_compute_s"}


@pytest.fixture(scope="module")
def quick_file(tmp_path_factory):
    out = tmp_path_factory.mktemp("compare") / "quick.json"
    assert compare.main(["--quick", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def quick(quick_file):
    return json.loads(quick_file.read_text())


def test_the_json_keeps_a_curve_on_one_line_and_no_client_times(quick_file, quick):
    text = quick_file.read_text()
    # a line holding a lone number is an array spread one number per line
    assert not [line for line in text.splitlines()
                if line.strip().rstrip(",").replace(".", "").replace("-", "").isdigit()]
    curve = quick["runs"][0]["accuracy_curve"]
    assert json.dumps(curve[0]).replace(" ", "") in text.replace(" ", "")
    # wait-for-all's client times feed the stated rule from development seeds only
    assert all("client_times_s" not in run for run in quick["runs"])
    assert quick["settings"]["stated_deadline_s"] > 0


def test_the_quick_slice_writes_every_method_with_the_documented_keys(quick):
    settings = quick["settings"]
    assert {"task", "n", "cohort", "rounds", "target", "methods", "seeds"} <= set(settings)
    assert settings["task"] == "digits-logreg" and settings["cohort"] == settings["n"]
    methods = settings["methods"]
    assert set(methods) >= {"auto", "wait-for-all", "deadline", "deadline-best", "first-k",
                            "fedbuff", "grouped-rs:1"}
    runs = {(r["method"], r["seed"]): r for r in quick["runs"]}
    assert set(runs) == {(m, s) for m in methods for s in settings["seeds"]}
    for run in quick["runs"]:
        assert RUN_KEYS <= set(run), run["method"]
        assert run["rounds"] >= settings["rounds"]
        assert run["bytes_up"] > 0 and run["client_compute_s"] > 0
    assert set(quick["summary"]) == set(methods)
    assert "time_to_target_vs_auto" in quick["summary"]["wait-for-all"]


def test_the_quick_slice_numbers_are_consistent(quick):
    settings, runs = quick["settings"], quick["runs"]
    by = {r["method"]: r for r in runs}
    for run in runs:
        curve = run["accuracy_curve"]
        times = [t for t, _, _ in curve]
        assert times == sorted(times) and run["total_virtual_s"] == times[-1]
        assert run["final_accuracy"] == curve[-1][1]
        if run["time_to_target"] is None:
            assert all(a < settings["target"] for _, a, _ in curve)
        else:
            assert run["time_to_target"] <= run["total_virtual_s"]
            first = next(t for t, a, _ in curve if a >= settings["target"])
            assert run["time_to_target"] == first
    # every partition computed is charged, late and wasted work included
    n, rounds = settings["n"], settings["rounds"]
    assert by["wait-for-all"]["partitions_computed"] == n * rounds
    assert by["first-k"]["partitions_computed"] == n * rounds  # ceil(1.3 K) = n sampled
    assert by["grouped-rs:1"]["partitions_computed"] > n * rounds  # s + 1 per client
    # a deadline run's rounds last at most its deadline
    for method in ("deadline", "deadline-best"):
        ends = [0.0] + [t for t, _, _ in by[method]["accuracy_curve"]]
        assert max(np.diff(ends)) <= by[method]["deadline_s"] + 1e-9
    best = settings["deadline_best_s"]
    assert best in settings["deadline_grid_s"]
    assert by["deadline-best"]["deadline_s"] == best
    # every grid deadline keeps its seeds' numbers: the pick's are the stored runs'
    picked = next(g for g in settings["deadline_grid_results"] if g["deadline_s"] == best)
    kept = {str(r["seed"]): {"time_to_target": r["time_to_target"],
                             "final_accuracy": r["final_accuracy"]}
            for r in runs if r["method"] == "deadline-best"}
    assert picked["per_seed"] == kept
    assert all(len(g["per_seed"]) == len(kept) for g in settings["deadline_grid_results"])
    unit = compare.load_grid()["rules"]["deadline_grid"].index(1.0)  # the stated deadline
    assert math.isclose(settings["deadline_grid_s"][unit], settings["stated_deadline_s"])
    # coded methods stop waiting at the deadline rival's stated deadline (not the key table's
    # straggler-timeout): no coded round lasts longer
    assert settings["coded_straggler_timeout_s"] == settings["stated_deadline_s"]
    for method in ("auto", "grouped-rs:1"):
        ends = [0.0] + [t for t, _, _ in by[method]["accuracy_curve"]]
        assert max(np.diff(ends)) <= settings["coded_straggler_timeout_s"] + 1e-9
    # the summary's ratios are the runs' own
    ratio = quick["summary"]["wait-for-all"]["client_compute_s_vs_auto"]["per_seed"]["0"]
    assert ratio == pytest.approx(by["wait-for-all"]["client_compute_s"]
                                  / by["auto"]["client_compute_s"])


def _softmax_gd_oracle(cell, seed):
    """Full-batch gradient descent of softmax regression in numpy, the test accuracy and
    mean cross-entropy after each step."""
    from fl_gradcode.data import run_partitions
    from fl_gradcode.learning import make_model

    cfg = cell.config(seed)
    data, index = run_partitions(cfg, cell.n)
    model = make_model("logreg", data.input_shape, data.num_classes, seed)
    weight = model[1].weight.detach().numpy().copy()
    bias = model[1].bias.detach().numpy().copy()
    idx = np.concatenate(index)
    x = data.x_train[idx].reshape(len(idx), -1)
    y = np.eye(data.num_classes)[data.y_train[idx]]
    xt, yt = data.x_test.reshape(len(data.y_test), -1), data.y_test
    lr, out = float(cfg["lr"]), []

    def softmax(z):
        z = z - z.max(axis=1, keepdims=True)
        e = np.exp(z)
        return e / e.sum(axis=1, keepdims=True)

    for _ in range(cell.rounds):
        p = softmax(x @ weight.T + bias)
        weight = weight - lr * (p - y).T @ x / len(x)
        bias = bias - lr * (p - y).mean(axis=0)
        q = softmax(xt @ weight.T + bias)
        out.append((float((q.argmax(axis=1) == yt).mean()),
                    float(-np.log(q[np.arange(len(yt)), yt]).mean())))
    return out


def test_wait_for_all_follows_the_numpy_fedavg_oracle(one_torch_thread):
    grid = compare.load_grid()
    cell = _cell(compare.cell_run_config(grid, "digits-logreg", "bimodal"),
                        n=5, cohort=5, rounds=3, target=0.5)
    run = compare.run_rival("wait-for-all", 4, cell)
    expected = _softmax_gd_oracle(cell, 4)
    got = [(a, loss) for _, a, loss in run["accuracy_curve"]]
    assert [a for a, _ in got] == [a for a, _ in expected]
    np.testing.assert_allclose([loss for _, loss in got], [loss for _, loss in expected],
                               rtol=1e-9)


def test_a_setting_outside_the_grid_and_bad_values_are_handled():
    assert compare.parse_sets(["latency=bimodal", "latency-p=0.3", "stop-late-work=true"]) \
        == {"latency": "bimodal", "latency-p": 0.3, "stop-late-work": True}
    assert compare.parse_seeds("0,3,10-12") == [0, 3, 10, 11, 12]
    with pytest.raises(ValueError, match="unknown run-config key 'latency-q'"):
        compare.parse_sets(["latency-q=1"])
    with pytest.raises(ValueError, match="latency-p takes a float"):
        compare.parse_sets(["latency-p=high"])
    with pytest.raises(ValueError, match=r"is a placeholder in experiments/grid.toml"):
        compare.lookup({"tasks": {"later": {"placeholder": True}}}, "tasks", "later")
    with pytest.raises(ValueError, match="a fixed code is written CODE:s"):
        compare.check_methods(["auto", "grouped-rs"])


@pytest.mark.parametrize(("argv", "named"), [
    (["--latency", "nope"], "unknown latency 'nope'"),
    (["--task", "imagenet"], "unknown task 'imagenet'"),
    (["--set", "latency-q=1"], "unknown run-config key 'latency-q'"),
    (["--methods", "auto,grouped-rs"], "a fixed code is written CODE:s"),
    (["--seeds", "ten"], "ten"),
    # checked before the first run too, not when the run that needs them starts
    (["--set", "latency=bogus"], "latency='bogus'; expected one of"),
    (["--set", "latency-p=2"], "p=2.0 must be a probability"),
    (["--n", "8", "--methods", "auto,grouped-rs:99"],
     "s=99 stragglers cannot be tolerated with a cohort of 8"),
    (["--seeds=-1"], "expected non-negative integers"),
    (["--seeds", "5-3"], "expected non-negative integers"),
    (["--seeds", ""], "expected at least one seed"),
    (["--seeds", "3,3"], "seeds [3] given twice"),
    (["--methods", "auto,auto"], "['auto'] named twice"),
    (["--rounds", "0"], "--rounds 0: expected at least 1 round"),
    (["--rounds", "-1"], "--rounds -1"),
    (["--cohort", "0"], "--cohort 0: expected 1..n"),
    (["--n", "0"], "--n 0: expected at least 1 node"),
    (["--target", "1.5"], "--target 1.5"),
    # keys the harness sets for every run would be overwritten: refused, naming the flag
    (["--set", "num-rounds=5"], "use --rounds"),
    (["--set", "seed=3"], "use --seeds"),
    (["--set", "num-clients=4"], "use --n"),
    (["--set", "fraction-train=0.5"], "use --cohort"),
    (["--set", "s=1"], "use --methods"),
])
def test_a_bad_argument_is_a_message_before_any_run(tmp_path, argv, named):
    out = tmp_path / "never.json"
    with pytest.raises(SystemExit) as stop:
        compare.main([*argv, "--out", str(out)])
    assert named in str(stop.value.code) and not out.exists()


def test_the_interval_is_students_t_on_the_log_ratios():
    """Reference: the t interval by hand (mean and standard error of the logs, the 0.975
    quantile of t with n - 1 degrees of freedom from scipy), exponentiated."""
    from scipy import stats

    ratios = [1.5, 2.0, 3.0, 2.5]
    logs = np.log(ratios)
    half = stats.t.ppf(0.975, 3) * np.std(logs, ddof=1) / 2.0
    got = compare.ratio_interval(ratios)
    assert got["geomean"] == pytest.approx(float(np.exp(logs.mean())))
    assert got["ci95"] == pytest.approx([np.exp(logs.mean() - half), np.exp(logs.mean() + half)])
    assert compare.ratio_interval([2.0]) == {"geomean": pytest.approx(2.0), "ci95": None}
    assert compare.ratio_interval([]) == {"geomean": None, "ci95": None}


def test_a_task_that_cannot_be_split_n_ways_is_refused_before_any_run(tmp_path):
    """1,437 training digits cannot be split into 1,000 Dirichlet partitions."""
    with pytest.raises(SystemExit, match=r"task 'digits-logreg' cannot be split into n=1000 "
                                         r"partitions \(partitioner 'dirichlet', seed 10\)"):
        compare.main(["--n", "1000", "--cohort", "100", "--seeds", "10",
                      "--out", str(tmp_path / "x.json")])
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize(("n", "update"), [(40, "gradient"), (20, "local")])
def test_a_fixed_code_is_judged_as_the_serverapp_builds_it_and_the_grid_as_it_ran(n, update):
    """comm-efficient s = 2 with m = 1 (load 3) for a cohort of 20, sampled from 40 or with
    local epochs: its own construction has k = 18 partitions, the data split 18 ways. The
    ServerApp now builds it with one partition per client, so one cell takes it (no other
    model); the grid's finished runs used the old construction and keep the grid's reason."""
    from fl_gradcode.config import merge_config

    cfg = merge_config({"update": update, "m": 1})
    assert compare.code_fit("comm-efficient:2", n, 20, cfg) == (None, None)
    _, why = compare.code_fit("comm-efficient:2", n, 20, cfg, grid=True)
    assert why is not None and why.startswith("comm-efficient:2 has k = 18 partitions for a "
                                              "cohort of 20 (m = 1): ")
    assert ("the cohort is sampled (of n = 40)" in why) == (n == 40)
    assert ("update = 'local'" in why) == (update == "local")


def test_a_code_that_cannot_take_the_cohort_or_an_unknown_code_is_refused_before_any_run(
        tmp_path):
    """FRC needs (s + 1) | n: frc:2 for 20 clients would run grouped-rs:2 under frc's name.
    Both are refused before the first run (not when their turn comes, after the others)."""
    out = tmp_path / "x.json"
    with pytest.raises(SystemExit, match=r"frc:2: code='frc' with s=2 cannot take a cohort "
                                         r"of 20.*the ServerApp would run grouped-rs with "
                                         r"s=2 in its place.*runs a code only as named"):
        compare.main(["--n", "20", "--seeds", "10", "--methods", "wait-for-all,frc:2",
                      "--out", str(out)])
    with pytest.raises(SystemExit, match=r"unknown code 'bogus'"):
        compare.main(["--n", "20", "--seeds", "10", "--methods", "wait-for-all,bogus:2",
                      "--out", str(out)])
    assert not out.exists()


def test_one_cell_is_never_written_over_a_grid_file(tmp_path, monkeypatch):
    """A grid file holds every cell: one cell written there would replace them all."""
    grid_file = tmp_path / "grid.json"
    grid_file.write_text(json.dumps({"cells": {"a/b/1x1": {"runs": []}}}))
    with pytest.raises(SystemExit) as stop:
        compare.main(["--quick", "--methods", "wait-for-all", "--out", str(grid_file)])
    assert "holds a grid (1 cells)" in str(stop.value.code)
    assert json.loads(grid_file.read_text()) == {"cells": {"a/b/1x1": {"runs": []}}}
    # without --out, one cell goes to its own file, not to the grid's results/compare.json
    monkeypatch.chdir(tmp_path)
    assert compare.main(["--quick", "--methods", "wait-for-all"]) == 0
    written = sorted(p for p in tmp_path.rglob("*.json") if p != grid_file)
    assert [p.relative_to(tmp_path).as_posix() for p in written] \
        == ["results/compare_cell.json"]
    assert json.loads(written[0].read_text())["settings"]["methods"] == ["wait-for-all"]


def test_flags_given_with_quick_replace_its_entries(tmp_path):
    out = tmp_path / "q.json"
    assert compare.main(["--quick", "--methods", "wait-for-all,grouped-rs:1", "--n", "4",
                         "--rounds", "2", "--seeds", "3", "--target", "0.3",
                         "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    settings = data["settings"]
    assert (settings["methods"], settings["n"], settings["rounds"], settings["seeds"],
            settings["target"]) == (["wait-for-all", "grouped-rs:1"], 4, 2, [3], 0.3)
    assert {(r["method"], r["seed"]) for r in data["runs"]} \
        == {("wait-for-all", 3), ("grouped-rs:1", 3)}
    assert all(r["rounds"] == 2 for r in data["runs"])


@pytest.mark.parametrize(("sets", "latency", "table", "expect"), [
    # the issue's own example: the bimodal regime with p = 0.1, recorded as bimodal
    (["latency=bimodal", "latency-p=0.1"], "bimodal", "bimodal",
     {"latency-p": 0.1, "latency-slowdown": 20.0}),
    # a regime the grid has no table for: the key table's defaults, not persistent's keys
    (["latency=shifted-exponential"], "shifted-exponential", "", {}),
])
def test_set_latency_names_the_regime_that_runs(tmp_path, sets, latency, table, expect):
    out = tmp_path / "s.json"
    argv = ["--quick", "--methods", "wait-for-all", "--out", str(out)]
    assert compare.main([*argv, *(x for s in sets for x in ("--set", s))]) == 0
    settings = json.loads(out.read_text())["settings"]
    assert (settings["latency"], settings["latency_table"]) == (latency, table)
    run_config = settings["run_config"]
    assert run_config["latency"] == latency
    for name, value in expect.items():
        assert run_config[name] == value
    grid = compare.load_grid()
    if not table:  # none of the persistent table's own keys rides along
        persistent = grid["latency"]["persistent"]["run_config"]
        assert not set(persistent) & set(run_config)


# ----------------------------------------------------------------------------- the registry
def test_every_grid_table_names_its_registry_entry_and_adds_keys_only():
    """A task or regime is declared once, in fl_gradcode.tasks: each table of grid.toml names
    an entry of it (the table's own name), and the cell's run config is that entry plus the
    table's own keys, none of which restates the entry's."""
    from fl_gradcode.tasks import REGIMES, TASKS

    grid = compare.load_grid()
    assert set(grid["tasks"]) == set(TASKS)  # every task of the registry is in the grid
    for name, table in grid["tasks"].items():
        assert not table.get("placeholder") and table["task"] == name
        assert not set(table["run_config"]) & set(TASKS[name].config)
    for name, table in grid["latency"].items():
        assert not table.get("placeholder") and table["regime"] == name in REGIMES
        assert not set(table["run_config"]) & set(REGIMES[name])
        for task in grid["tasks"]:
            cfg = compare.cell_run_config(grid, task, name)
            assert cfg == {**REGIMES[name], **TASKS[task].config,
                           **grid["latency"][name]["run_config"],
                           **grid["tasks"][task]["run_config"]}


def test_a_table_that_restates_or_misnames_its_registry_entry_is_refused():
    grid = compare.load_grid()
    restating = {**grid, "latency": {"persistent": {"regime": "persistent", "run_config": {
        "latency": "bimodal", "latency-p": 0.3}}}}
    with pytest.raises(ValueError, match=r"\[latency.persistent\] in experiments/grid.toml "
                                         r"restates \['latency'\]"):
        compare.cell_run_config(restating, "digits-logreg", "persistent")
    unknown = {**grid, "tasks": {"cifar": {"task": "cifar-resnet", "run_config": {}}}}
    with pytest.raises(ValueError, match=r"task='cifar-resnet'; expected one of"):
        compare.cell_run_config(unknown, "cifar", "persistent")
    unnamed = {**grid, "tasks": {"digits": {"run_config": {"dataset": "digits"}}}}
    with pytest.raises(ValueError, match=r"\[tasks.digits\] .* names no entry of "
                                         r"fl_gradcode.tasks: add task"):
        compare.cell_run_config(unnamed, "digits", "persistent")


def test_a_measured_once_cell_charges_every_method_one_measured_cost():
    grid = compare.load_grid()
    cfg = compare.cell_run_config(grid, "digits-logreg", "persistent",
                                  {"virtual-compute": "measured-once"})
    cell = _cell(cfg, n=4, cohort=4, rounds=2, target=0.5)
    charged, facts = compare.charge_once(cell, 10)
    cost = facts["measured_partition_cost_s"]
    assert cost > 0 and facts["measured_on_seed"] == 10
    for seed, extra in ((10, {}), (11, {"s": "auto"}), (12, {"rival": "fedavg"})):
        run = charged.config(seed, **extra)
        assert run["virtual-compute"] == "none" and run["partition-cost-s"] == cost
    plain = _cell(compare.cell_run_config(grid, "digits-logreg",
                                                            "persistent"),
                         n=4, cohort=4, rounds=2, target=0.5)
    assert compare.charge_once(plain, 10) == (plain, {})


def test_a_cell_that_sets_straggler_timeout_gives_it_to_the_coded_methods_only(tmp_path):
    out = tmp_path / "own.json"
    assert compare.main(["--n", "4", "--rounds", "2", "--seeds", "0", "--dev-seeds", "0",
                         "--target", "0.3", "--methods", "auto,wait-for-all",
                         "--set", "straggler-timeout=0.35", "--out", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert saved["settings"]["coded_straggler_timeout_s"] == 0.35
    assert "stated_deadline_s" not in saved["settings"]  # no deadline method, none needed
    auto = next(r for r in saved["runs"] if r["method"] == "auto")
    ends = [0.0] + [t for t, _, _ in auto["accuracy_curve"]]
    assert max(np.diff(ends)) <= 0.35 + 1e-9


def test_sharing_updates_between_replicas_changes_no_number():
    """Replicas of a partition share its update within a round (less wall time); every
    replica is still charged its computation, so every recorded number is the same."""
    from experiments.rival_runs import run_coded

    grid = compare.load_grid()
    cell = _cell(compare.cell_run_config(grid, "digits-logreg", "bimodal"), n=6,
                cohort=6, rounds=3, target=0.3)
    for method in ("auto", "grouped-rs:2"):
        alone = run_coded(method, 0, cell, share=False)
        shared = run_coded(method, 0, cell, share=True)
        for key in ("accuracy_curve", "client_compute_s", "partitions_computed", "bytes_up",
                    "time_to_target", "decodes"):
            assert shared[key] == alone[key], (method, key)
        assert alone["partitions_computed"] > 6 * 3  # s + 1 partitions per client


def test_rivals_run_under_fedscale_device_traces():
    """latency=fedscale sizes its tasks by the number of clients: the rivals' latency model
    gets it too (a wait-for-all run used to stop with 'needs the number of clients')."""
    from experiments.rival_runs import run_rival

    grid = compare.load_grid()
    cell = _cell(compare.cell_run_config(grid, "digits-logreg", "fedscale"), n=4,
                cohort=4, rounds=1, target=0.3)
    record = run_rival("wait-for-all", 0, cell)
    assert record["rounds"] == 1 and record["total_virtual_s"] > 0


def test_under_fedscale_devices_gone_off_hold_no_rival_up_for_ever():
    """About a fifth of the generated devices are off at any moment; a rival that waits for
    them is told they are gone a minute after they went (Flower's NODE_UNAVAILABLE), as the
    coded runs are: every run's virtual time stays finite (they used to wait 1e12 s)."""
    from experiments.rival_runs import run_rival

    grid = compare.load_grid()
    cell = _cell(compare.cell_run_config(grid, "digits-logreg", "fedscale"), n=20,
                cohort=20, rounds=10, target=0.3)
    for method in ("wait-for-all", "first-k", "fedbuff"):
        record = run_rival(method, 10, cell)
        assert 0 < record["total_virtual_s"] < 10 * 600, (method, record["total_virtual_s"])


def test_a_regime_default_deadline_is_not_the_cells_own(tmp_path):
    """The fedscale regime's straggler-timeout is the main job's; in the benchmark the coded
    methods stop waiting at the stated deadline, as the deadline rival (only --set or the
    grid's own tables give a cell its own)."""
    out = tmp_path / "fedscale.json"
    assert compare.main(["--latency", "fedscale", "--n", "4", "--rounds", "2", "--seeds", "0",
                         "--dev-seeds", "0", "--target", "0.3", "--methods", "auto,deadline",
                         "--out", str(out)]) == 0
    settings = json.loads(out.read_text())["settings"]
    assert settings["coded_straggler_timeout_s"] == settings["stated_deadline_s"]
    assert settings["coded_straggler_timeout_rule"].startswith("the stated deadline")


def test_a_charge_fixed_in_the_grid_is_charged_not_measured_again(monkeypatch,
                                                                   one_torch_thread):
    import fl_gradcode.tasks

    def measuring(cfg, n):
        raise AssertionError("measured although the grid fixes the charge")

    monkeypatch.setattr(fl_gradcode.tasks, "charged_measured_cost", measuring)
    grid = compare.load_grid()
    grid = {**grid, "tasks": {**grid["tasks"], "digits-logreg": {
        **grid["tasks"]["digits-logreg"], "charge_s": {"5": 0.0321}}}}
    result = compare.run_cell(grid, "digits-logreg", "bimodal", 5, 5, 1, [10], [0],
                              ["wait-for-all"], 0.3, {"virtual-compute": "measured-once"},
                              log=lambda line: None)
    assert result["settings"]["measured_partition_cost_s"] == 0.0321
    assert result["settings"]["run_config"]["partition-cost-s"] == 0.0321
    assert result["settings"]["run_config"]["virtual-compute"] == "none"
    assert "grid.toml" in result["settings"]["compute_charge"]


def _one_cnn_round(tmp_path, methods):
    """One all-exact round of mnist1d-cnn (minibatch SGD, so each partition's update depends
    on its seeded shuffle) for ``methods``, on one seed: ``{method: (accuracy, loss)}``."""
    out = tmp_path / "round.json"
    assert compare.main(["--task", "mnist1d-cnn", "--latency", "persistent", "--n", "20",
                         "--methods", ",".join(methods), "--seeds", "11", "--rounds", "1",
                         "--set", "straggler-timeout=10000", "--set", "partition-cost-s=0.026",
                         "--set", "virtual-compute=none", "--out", str(out)]) == 0
    runs = json.loads(out.read_text())["runs"]
    assert all(r["decodes"]["exact"] == 1 for r in runs if "decodes" in r)  # no fallback
    return {r["method"]: tuple(r["accuracy_curve"][0][1:]) for r in runs}


def test_an_exact_round_of_a_code_trains_fedavgs_model(tmp_path):
    # every partition computed with the same seeded update on the cohort's own partitions:
    # the exact average is FedAvg's (comm-efficient:1 at n = 20 has k = n = 20 partitions)
    got = _one_cnn_round(tmp_path, ["wait-for-all", "grouped-rs:2", "comm-efficient:1"])
    for method in ("grouped-rs:2", "comm-efficient:1"):
        assert got[method] == pytest.approx(got["wait-for-all"], rel=1e-9, abs=1e-12), method


def test_a_cnn_cell_off_the_grids_scales_charges_a_stated_value_not_a_measurement(
        monkeypatch, one_torch_thread):
    """charge_s is fixed at n = 20 and 100: at n = 4 (or 50) the charge comes from the log-log
    line through them (checked here against numpy's interpolation in log space), never from
    a wall-clock measurement that would differ from run to run."""
    import fl_gradcode.tasks

    def measuring(cfg, n):
        raise AssertionError("measured although the grid fixes charges")

    monkeypatch.setattr(fl_gradcode.tasks, "charged_measured_cost", measuring)
    grid = compare.load_grid()
    table = grid["tasks"]["mnist1d-cnn"]["charge_s"]
    (n0, c0), (n1, c1) = sorted((int(k), v) for k, v in table.items())[:2]
    slope = (np.log(c1) - np.log(c0)) / (np.log(n1) - np.log(n0))
    for n in (4, 50):
        expected = float(np.exp(np.log(c0) + slope * (np.log(n) - np.log(n0))))
        assert compare.charge_at(table, n)[0] == pytest.approx(expected, rel=1e-12)
    assert compare.charge_at(table, n0) == (c0, None)
    assert compare.charge_at({}, 7) == (None, None)
    result = compare.run_cell(grid, "mnist1d-cnn", "persistent", 4, 4, 1, [10], [0],
                              ["wait-for-all"], 0.1, log=lambda line: None)
    assert result["settings"]["measured_partition_cost_s"] == pytest.approx(
        compare.charge_at(table, 4)[0])
    assert "log-log line" in result["settings"]["compute_charge"]


@pytest.mark.parametrize(("cohort", "rounds"), [(20, 30), (100, 30), (5, 3), (7, 10), (6, 1)])
def test_fedbuff_takes_as_many_client_updates_as_the_synchronous_rounds(cohort, rounds):
    """K = ceil(fraction * cohort) updates a server step (the grid's rule): the steps take the
    synchronous rounds' rounds * cohort updates, with fewer than K extra in all (not up to
    K - 1 every round)."""
    cell = _cell({}, n=cohort, cohort=cohort, rounds=rounds, target=0.5)
    k = math.ceil(cell.fedbuff_buffer_fraction * cohort - 1e-9)
    updates = cell.fedbuff_steps() * k
    assert rounds * cohort <= updates < rounds * cohort + k


def test_the_same_run_gives_the_same_numbers_to_the_last_bit(one_torch_thread):
    """Same seed, same numbers: every point of the accuracy curve (virtual time, accuracy,
    loss) of four identical runs is equal, not merely close (the replies are aggregated in
    the same order every time)."""
    grid = compare.load_grid()
    cell = compare.grid_cell(grid, "digits-logreg", "bimodal", 8, 8, 3, 0.5)
    curves = [run_rival("wait-for-all", 3, cell)["accuracy_curve"] for _ in range(4)]
    assert all(curve == curves[0] for curve in curves[1:])


def test_grid_mode_refuses_one_cells_flags_and_one_cell_refuses_grid_flags(tmp_path):
    """--grid runs the grid file's cells as stated: --n, --seeds, --set ... would be ignored;
    --cells, --rerun, --merge mean nothing without --grid (a full default cell would start);
    --rerun without --methods and a pattern matching no cell are refused before any run."""
    out = str(tmp_path / "g.json")
    for argv, named in (
            (["--grid", "--n", "8"], "--n: one cell's flags"),
            (["--grid", "--set", "latency-p=0.1"], "--set: one cell's flags"),
            (["--cells", "digits-logreg/*"], "--cells needs --grid"),
            (["--rerun"], "--rerun needs --grid"),
            (["--grid", "--rerun"], "--rerun needs --methods"),
            (["--grid", "--cells", "nomatch/*"], "matches no cell"),
            (["--grid", "--cells", "digits-logreg/persistent/20x20", "--methods", "bogus:2"],
             "unknown code 'bogus'"),
            (["--set", "code=crc", "--methods", "auto,grouped-rs:1"],
             "--set code applies to auto")):
        with pytest.raises(SystemExit) as stop:
            compare.main([*argv, "--out", out])
        assert named in str(stop.value.code), (argv, stop.value.code)
    assert not (tmp_path / "g.json").exists()


def test_a_set_that_changes_the_compute_is_measured_not_charged_the_grids_value(
        monkeypatch, one_torch_thread):
    """charge_s was measured with the task's own compute (one local epoch): a cell with
    --set local-epochs=2 is measured once instead."""
    import fl_gradcode.tasks

    measured = []

    def measuring(cfg, n):
        measured.append(cfg["local-epochs"])
        return {"virtual-compute": "none", "partition-cost-s": 0.5}

    monkeypatch.setattr(fl_gradcode.tasks, "charged_measured_cost", measuring)
    grid = compare.load_grid()
    result = compare.run_cell(grid, "mnist1d-cnn", "persistent", 20, 20, 1, [10], [0],
                              ["wait-for-all"], 0.1, {"local-epochs": 2}, log=lambda line: None)
    assert measured == [2]
    assert result["settings"]["measured_partition_cost_s"] == 0.5


def test_the_keys_the_harness_overwrites_are_the_ones_set_refuses():
    """Every run-config key given another valid value than its default: the keys a run's
    config (``Cell.config``) does not keep are among those ``--set`` refuses, so no --set
    value is recorded as applied while the harness runs another."""
    from experiments.compare_cli import HARNESS_KEYS
    from fl_gradcode.config import DEFAULTS, KEYS

    other: dict = {}
    for entry in KEYS:
        value, choices = DEFAULTS[entry.name], getattr(entry, "choices", None)
        if isinstance(value, bool):
            other[entry.name] = not value
        elif choices:
            other[entry.name] = next((c for c in choices if c != value), value)
        elif isinstance(value, int):
            other[entry.name] = value + 1
        elif isinstance(value, float):
            other[entry.name] = value + 0.5
        elif entry.name == "results-dir":
            other[entry.name] = value + "-elsewhere"
    config = _cell(other, n=7, cohort=7, rounds=3, target=0.5).config(5)
    overwritten = {k for k, v in other.items() if config[k] != v}
    assert overwritten and overwritten <= set(HARNESS_KEYS), overwritten - set(HARNESS_KEYS)

