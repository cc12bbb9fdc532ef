"""``python -m experiments.compare --grid``: cells are named and chosen as documented, each
finished cell is merged into the JSON at once and a later run keeps the earlier cells."""

from __future__ import annotations

import json
import re

import pytest

from experiments import compare, run_grid


def test_cells_methods_and_the_cell_filter_follow_the_grid():
    grid = compare.load_grid()
    names = [c["name"] for c in run_grid.grid_cells(grid)]
    assert "digits-logreg/persistent/20x20" in names
    assert "digits-logreg/persistent/1000x100" not in names  # the task's own scales
    assert "natural-noniid/fedscale/1000x100" in names
    assert "mnist1d-cnn/fedscale/1000x100" not in names  # 3,200 signals: not 1,000 Dirichlet
    assert len(names) == len(set(names)) == 6 * (2 + 2 + 3)
    chosen = run_grid.cell_names(grid, "digits-logreg/bimodal/20x20,digits-logreg/*/20x20")
    assert chosen[0] == "digits-logreg/bimodal/20x20" and len(chosen) == 6
    with pytest.raises(ValueError, match=r"--cells 'digits/\*' matches no cell"):
        run_grid.cell_names(grid, "digits/*")
    methods = run_grid.grid_methods(grid, 20)
    default = list(grid["methods"]["default"])
    assert methods[:len(default)] == default and "auto-approximate" in default
    assert "frc:1" in methods and "frc:4" in methods and "frc:2" not in methods  # 3 ∤ 20
    assert "grouped-rs:4" in methods and "comm-efficient:2" in methods


def _tiny(grid):
    return {**grid, "seeds": {"development": [0], "evaluation": [10]},
            "scale": {**grid["scale"], "rounds": 2, "settings": [[5, 5]]},
            "tasks": {"digits-logreg": {**grid["tasks"]["digits-logreg"], "target": 0.3,
                                        "scales": [[5, 5]]},
                      "mnist1d-cnn": {**{k: v for k, v in grid["tasks"]["mnist1d-cnn"].items()
                                         if k != "target"}, "scales": [[5, 5]]}},
            "latency": {k: grid["latency"][k] for k in ("persistent", "bimodal")}}


def test_each_cell_is_merged_and_a_later_run_keeps_the_others(tmp_path, one_torch_thread):
    grid = _tiny(compare.load_grid())
    out = tmp_path / "grid.json"
    run_grid.run_grid(grid, "digits-logreg/*", out, ["auto", "wait-for-all"])
    first = json.loads(out.read_text())
    run_grid.run_grid(grid, "digits-logreg/bimodal/*,mnist1d-cnn/persistent/*", out,
                      ["auto", "wait-for-all"])
    data = json.loads(out.read_text())
    assert first["done"] == ["digits-logreg/persistent/5x5", "digits-logreg/bimodal/5x5"]
    assert data["done"] == first["done"]
    assert data["cells"]["digits-logreg/persistent/5x5"] == \
        first["cells"]["digits-logreg/persistent/5x5"]  # kept as it was
    assert "mnist1d-cnn/persistent/5x5" in data["not_done"]
    assert "no target" in data["skipped"]["mnist1d-cnn/persistent/5x5"]
    cell = data["cells"]["digits-logreg/bimodal/5x5"]
    assert cell["settings"]["seeds"] == [10] and cell["settings"]["dev_seeds"] == [0]
    assert cell["settings"]["latency"] == "bimodal" and cell["runtime_s"] > 0
    assert {(r["method"], r["seed"]) for r in cell["runs"]} == {("auto", 10),
                                                                ("wait-for-all", 10)}
    assert "grouped-rs:2" in cell["methods_not_run"] and "fedbuff" in cell["methods_not_run"]
    assert cell["finished_utc"] >= cell["started_utc"]
    est = data["estimate"]
    assert est["whole_grid_s"] >= est["remaining_s"] > 0
    assert set(est["per_cell_s"]) == set(data["done"]) | set(data["not_done"])


def test_the_reported_set_covers_every_task_regime_and_scale():
    from experiments import compare
    from experiments.run_grid import cell_names, grid_cells

    grid = compare.load_grid()
    report = cell_names(grid, "report")
    assert report == list(grid["report"]["cells"]) and len(set(report)) >= 24
    assert set(report) <= {c["name"] for c in grid_cells(grid)}
    tasks, regimes, scales = zip(*(name.split("/") for name in report), strict=True)
    assert set(tasks) == set(grid["tasks"]) and len(set(tasks)) >= 3
    assert set(regimes) == set(grid["latency"]) and len(set(regimes)) >= 6
    assert {"20x20", "100x100", "1000x100"} <= set(scales)
    # "report" may be combined with patterns, in order, without repeats
    assert cell_names(grid, "digits-logreg/trace/20x20,report")[:2] == [
        "digits-logreg/trace/20x20", "digits-logreg/persistent/20x20"]


def test_a_rerun_replaces_only_the_named_methods_of_finished_cells(tmp_path, one_torch_thread):
    grid = _tiny(compare.load_grid())
    out = tmp_path / "grid.json"
    run_grid.run_grid(grid, "digits-logreg/persistent/*", out, ["auto", "wait-for-all"])
    first = json.loads(out.read_text())["cells"]["digits-logreg/persistent/5x5"]
    # the change: auto with another margin (a --set key of the cell would do the same)
    grid["tasks"]["digits-logreg"]["run_config"] = {"auto-margin": 3.0}
    with pytest.raises(ValueError, match="--rerun needs --methods"):
        run_grid.run_grid(grid, "digits-logreg/persistent/*", out, None, rerun=True)
    run_grid.run_grid(grid, "digits-logreg/persistent/*", out, ["auto"], rerun=True)
    cell = json.loads(out.read_text())["cells"]["digits-logreg/persistent/5x5"]
    old = {r["method"]: r for r in first["runs"]}
    new = {r["method"]: r for r in cell["runs"]}
    assert set(new) == {"auto", "wait-for-all"}
    assert new["wait-for-all"] == old["wait-for-all"]  # kept as it was
    assert cell["settings"]["run_config"]["auto-margin"] == 3.0
    assert cell["reruns"][0]["methods"] == ["auto"]
    # what the re-run changed is kept as it was
    assert cell["reruns"][0]["replaced_settings"]["run_config"] == first["settings"]["run_config"]
    assert first["settings"]["run_config"].get("auto-margin") != 3.0
    ratio = cell["summary"]["wait-for-all"]["client_compute_s_vs_auto"]["per_seed"]["10"]
    assert ratio == pytest.approx(new["wait-for-all"]["client_compute_s"]
                                  / new["auto"]["client_compute_s"])


def _fake_cell(latency):
    return {"settings": {"task": "digits-logreg", "latency": latency, "n": 20, "cohort": 20},
            "runs": [{"method": "auto", "seed": 10, "wall_s": 2.0, "time_to_target": 1.0}],
            "summary": {}, "runtime_s": 2.0}


def test_cells_run_in_parallel_merge_into_one_grid_file(tmp_path):
    grid = compare.load_grid()
    a, b, out = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "out.json"
    run_grid.merge(a, grid, "digits-logreg/persistent/20x20", _fake_cell("persistent"))
    run_grid.merge(b, grid, "digits-logreg/bimodal/20x20", _fake_cell("bimodal"))
    run_grid.merge(out, grid, "digits-logreg/pareto/20x20", _fake_cell("pareto"))
    assert compare.main(["--grid", "--merge", f"{a},{b}", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert set(data["cells"]) == {"digits-logreg/persistent/20x20",
                                  "digits-logreg/bimodal/20x20", "digits-logreg/pareto/20x20"}
    assert data["cells"]["digits-logreg/bimodal/20x20"] == _fake_cell("bimodal")
    assert "digits-logreg/bimodal/20x20" in data["done"]
    assert "digits-logreg/bimodal/20x20" not in data["not_done"]
    # one cell in two files: refused, naming both
    with pytest.raises(ValueError, match=r"in both .*a\.json and .*a\.json"):
        run_grid.merge_files(out, grid, [a, a])


def test_the_estimate_uses_a_tasks_own_finished_cells_before_a_factor():
    grid = compare.load_grid()
    methods = run_grid.grid_methods(grid, 20)

    def cell(task, wall):
        return {"settings": {"task": task, "cohort": 20},
                "runs": [{"method": m, "wall_s": wall} for m in methods]}

    data = {"cells": {"digits-logreg/persistent/20x20": cell("digits-logreg", 1.0),
                      "mnist1d-cnn/persistent/20x20": cell("mnist1d-cnn", 7.0)}}
    est = run_grid.estimate(grid, data, task_factor={"mnist1d-cnn": 100.0,
                                                     "natural-noniid": 3.0})
    seeds, dev = len(grid["seeds"]["evaluation"]), len(grid["seeds"]["development"])
    extra = len(grid["rules"]["deadline_grid"]) - 1
    # comm-efficient:2 is set aside on the CNN tasks (k = 18 partitions for 20 clients)
    cnn_methods = len(methods) - 1
    rules = grid["rules"]
    tuning = dev * len(rules["fedbuff_tune_server_lr"]) * len(rules["fedbuff_tune_buffer_fraction"])
    # first-k's over-commitment list, tried on the development seeds (amendment 18)
    first_k = dev * len(rules["first_k_tune_overcommit"])
    runs_per_cell = dev + seeds * len(methods) + seeds * extra + tuning + first_k
    cnn_runs = dev + seeds * cnn_methods + seeds * extra + tuning + first_k
    # the CNN's own runs (7 s), not digits' times the factor 100
    assert est["per_cell_s"]["mnist1d-cnn/bimodal/20x20"] == pytest.approx(7.0 * cnn_runs)
    # no natural-noniid cell finished: digits' runs (1 s) times its factor
    assert est["per_cell_s"]["natural-noniid/bimodal/20x20"] == pytest.approx(3.0 * cnn_runs)
    assert est["per_cell_s"]["digits-logreg/bimodal/20x20"] == pytest.approx(runs_per_cell)
    # finished cells whose FedBuff tuning grew past an edge pick (12 and 18 settings tried):
    # the tuning costs their mean, 15 settings, in every cell
    for name, tried in (("digits-logreg/persistent/20x20", 12),
                        ("mnist1d-cnn/persistent/20x20", 18)):
        data["cells"][name]["settings"]["fedbuff"] = {"tuning": {
            "grid": [{}] * tried, "extensions": [{"server_lr": [2.0]}]}}
    est = run_grid.estimate(grid, data, task_factor={"mnist1d-cnn": 100.0,
                                                     "natural-noniid": 3.0})
    assert est["per_cell_s"]["digits-logreg/bimodal/20x20"] == pytest.approx(
        runs_per_cell - tuning + dev * 15)


def test_a_scale_with_its_own_target_runs_to_it(tmp_path, one_torch_thread):
    grid = _tiny(compare.load_grid())
    grid["tasks"]["digits-logreg"]["targets"] = {"5x5": 0.45}
    out = tmp_path / "grid.json"
    run_grid.run_grid(grid, "digits-logreg/persistent/*", out, ["auto", "wait-for-all"])
    cell = json.loads(out.read_text())["cells"]["digits-logreg/persistent/5x5"]
    assert cell["settings"]["target"] == 0.45
    for run in cell["runs"]:  # time to target: the first evaluation at or above 0.45
        reached = [t for t, acc, *_ in run["accuracy_curve"] if acc >= 0.45]
        assert run["time_to_target"] == (reached[0] if reached else None)


def test_a_cell_names_the_knobs_auto_approximate_ran_with_and_a_rerun_keeps_the_old(
        tmp_path, one_torch_thread, monkeypatch):
    from fl_gradcode.flower.approximate_rounds import ApproximateRounds

    grid = _tiny(compare.load_grid())
    out = tmp_path / "grid.json"
    default_run = ApproximateRounds.run
    monkeypatch.setattr(ApproximateRounds, "error_power", 1.0)
    run_grid.run_grid(grid, "digits-logreg/persistent/*", out, ["auto", "auto-approximate"])
    first = json.loads(out.read_text())["cells"]["digits-logreg/persistent/5x5"]
    assert first["settings"]["auto_approximate"]["error_power"] == 1.0
    monkeypatch.setattr(ApproximateRounds, "error_power", 2.0)
    monkeypatch.setattr(ApproximateRounds, "run", 4)
    run_grid.run_grid(grid, "digits-logreg/persistent/*", out, ["auto-approximate"],
                      rerun=True)
    cell = json.loads(out.read_text())["cells"]["digits-logreg/persistent/5x5"]
    knobs = cell["settings"]["auto_approximate"]
    assert (knobs["error_power"], knobs["run"]) == (2.0, 4)
    assert knobs["short_fraction"] == ApproximateRounds.short_fraction
    old = cell["reruns"][0]["replaced_settings"]["auto_approximate"]
    assert old == first["settings"]["auto_approximate"]
    assert (old["error_power"], old["run"]) == (1.0, default_run)
    # a cell whose methods leave auto-approximate out names no knobs
    run_grid.run_grid(grid, "digits-logreg/bimodal/*", out, ["auto", "wait-for-all"])
    other = json.loads(out.read_text())["cells"]["digits-logreg/bimodal/5x5"]
    assert "auto_approximate" not in other["settings"]


def test_fedbuffs_tuned_pick_stays_when_another_method_runs_again(tmp_path, one_torch_thread):
    grid = _tiny(compare.load_grid())
    grid["rules"]["fedbuff_tune_server_lr"] = [0.5, 1.0]
    grid["rules"]["fedbuff_tune_buffer_fraction"] = [0.25]
    grid["rules"]["fedbuff_tune_extend"] = 0  # the lists only (their growth: its own tests)
    out = tmp_path / "grid.json"
    run_grid.run_grid(grid, "digits-logreg/persistent/*", out, ["auto", "fedbuff"])
    first = json.loads(out.read_text())["cells"]["digits-logreg/persistent/5x5"]
    tuned = first["settings"]["fedbuff"]
    assert [r["server_lr"] for r in tuned["tuning"]["grid"]] == [0.5, 1.0]
    # a re-run of auto alone leaves FedBuff's settings and runs as they were
    run_grid.run_grid(grid, "digits-logreg/persistent/*", out, ["auto"], rerun=True)
    cell = json.loads(out.read_text())["cells"]["digits-logreg/persistent/5x5"]
    assert cell["settings"]["fedbuff"] == tuned
    assert "fedbuff" not in cell["reruns"][0]["replaced_settings"]
    assert ([r for r in cell["runs"] if r["method"] == "fedbuff"]
            == [r for r in first["runs"] if r["method"] == "fedbuff"])
    # FedBuff run again (other lists): its runs and settings replaced, the old kept aside
    grid["rules"]["fedbuff_tune_server_lr"] = [0.25]
    run_grid.run_grid(grid, "digits-logreg/persistent/*", out, ["fedbuff"], rerun=True)
    again = json.loads(out.read_text())["cells"]["digits-logreg/persistent/5x5"]
    assert again["settings"]["fedbuff"]["server_lr"] == 0.25
    assert again["reruns"][-1]["replaced_settings"]["fedbuff"] == tuned
    assert [r["method"] for r in again["runs"]].count("fedbuff") == 1


def _run(method, seed, t):
    return {"method": method, "seed": seed, "time_to_target": t, "final_accuracy": 0.9,
            "rounds": 3, "bytes_up": 10, "client_compute_s": 1.0, "wall_s": 1.0}


def test_a_merge_of_named_methods_keeps_every_other_method_as_the_file_has_it(tmp_path):
    grid = compare.load_grid()
    name = "digits-logreg/persistent/20x20"
    base = {"settings": {"task": "digits-logreg", "latency": "persistent", "n": 20,
                         "cohort": 20, "run_config": {"auto-margin": 0.1},
                         "fedbuff": {"server_lr": 0.5}},
            "runs": [_run("auto", 10, 4.0), _run("wait-for-all", 10, 8.0),
                     _run("fedbuff", 10, 6.0)], "summary": {}, "runtime_s": 3.0}
    # the file as it is now: FedBuff was run again (tuned) after the copy below was taken
    out, copy = tmp_path / "out.json", tmp_path / "copy.json"
    now = {**base, "settings": {**base["settings"], "fedbuff": {"server_lr": 1.0}},
           "runs": [_run("auto", 10, 4.0), _run("wait-for-all", 10, 8.0),
                    _run("fedbuff", 10, 2.0)]}
    run_grid.merge(out, grid, name, now)
    # the copy: auto run again with another margin (wait-for-all's run differs there too)
    again = {**base, "settings": {**base["settings"], "run_config": {"auto-margin": 3.0}},
             "runs": [_run("auto", 10, 5.0), _run("wait-for-all", 10, 9.0),
                      _run("fedbuff", 10, 6.0)],
             "reruns": [{"methods": ["auto"], "runtime_s": 1.5, "finished_utc": "t",
                         "replaced_settings": {"run_config": {"auto-margin": 0.1}}}]}
    run_grid.merge(copy, grid, name, again)
    # a method the copy's last re-run did not run is refused, naming it
    with pytest.raises(SystemExit, match="not \\['wait-for-all'\\]"):
        compare.main(["--grid", "--merge", str(copy), "--methods", "auto,wait-for-all",
                      "--out", str(out)])
    assert compare.main(["--grid", "--merge", str(copy), "--methods", "auto",
                         "--out", str(out)]) == 0
    cell = json.loads(out.read_text())["cells"][name]
    times = {r["method"]: r["time_to_target"] for r in cell["runs"]}
    assert times == {"auto": 5.0, "wait-for-all": 8.0, "fedbuff": 2.0}
    assert cell["settings"]["fedbuff"] == {"server_lr": 1.0}
    assert cell["settings"]["run_config"] == {"auto-margin": 3.0}
    assert cell["reruns"][-1]["methods"] == ["auto"]
    assert cell["reruns"][-1]["replaced_settings"] == {"run_config": {"auto-margin": 0.1}}
    # the summary is redone with the merged runs: wait-for-all's 8 s over auto's new 5 s
    assert cell["summary"]["wait-for-all"]["time_to_target_vs_auto"]["per_seed"]["10"] == 1.6
    # a cell the file lacks is refused (it merges whole); --cells picks the cells merged
    run_grid.merge(copy, grid, "digits-logreg/bimodal/20x20", _fake_cell("bimodal"))
    with pytest.raises(SystemExit, match=r"not in .*out\.json"):
        compare.main(["--grid", "--merge", str(copy), "--methods", "auto", "--cells",
                      "*/bimodal/*", "--out", str(out)])
    assert set(json.loads(out.read_text())["cells"]) == {name}


def test_a_merge_of_some_methods_takes_only_the_settings_they_give(tmp_path):
    grid = compare.load_grid()
    name = "digits-logreg/bimodal/20x20"
    methods = ["auto", "auto-approximate", "deadline", "deadline-best", "first-k"]
    old = {"task": "digits-logreg", "latency": "bimodal", "n": 20, "cohort": 20,
           "methods": methods, "deadline_best_s": 1.0, "coded_straggler_timeout_s": 1.0,
           "auto_approximate": {"tolerances": "trust-region"}}
    now = {"settings": old, "runs": [_run(m, 10, 4.0) for m in methods], "summary": {},
           "runtime_s": 3.0}
    out, copy = tmp_path / "out.json", tmp_path / "copy.json"
    run_grid.merge(out, grid, name, now)
    new = {"deadline_best_s": 2.0, "coded_straggler_timeout_s": 2.0,
           "rivals_stop_dropped_work": True, "auto_approximate": {"tolerances": "all"}}
    ran = ["deadline", "deadline-best", "first-k", "auto-approximate"]
    run_grid.merge(copy, grid, name, {
        "settings": {**old, **new}, "summary": {}, "runtime_s": 9.0,
        "runs": [_run(m, 10, 5.0 if m in ran else 4.0) for m in methods],
        "reruns": [{"methods": ran, "runtime_s": 6.0, "finished_utc": "2026-12-01T03:00:00",
                    "replaced_settings": {k: old.get(k) for k in new}}]})
    assert compare.main(["--grid", "--merge", str(copy), "--methods", "auto-approximate",
                         "--out", str(out)]) == 0
    cell = json.loads(out.read_text())["cells"][name]
    # the coded method's settings come along; deadline-best's and the rivals' stay
    assert {k: cell["settings"].get(k) for k in new} == {
        "deadline_best_s": 1.0, "coded_straggler_timeout_s": 2.0,
        "rivals_stop_dropped_work": None, "auto_approximate": {"tolerances": "all"}}
    assert {r["method"]: r["time_to_target"] for r in cell["runs"]}["deadline"] == 4.0
    record = cell["reruns"][-1]
    assert (record["methods"], record["ran"], record["merged_from"]) == (
        ["auto-approximate"], ran, str(copy))
    # the same re-run again: refused, nothing changes
    with pytest.raises(SystemExit, match="already merged, or newer"):
        compare.main(["--grid", "--merge", str(copy), "--methods", "auto-approximate",
                      "--out", str(out)])
    # the rivals from the same re-run: their settings, not the coded methods'
    assert compare.main(["--grid", "--merge", str(copy), "--methods",
                         "deadline,deadline-best,first-k", "--out", str(out)]) == 0
    cell = json.loads(out.read_text())["cells"][name]
    assert {k: cell["settings"].get(k) for k in new} == new
    assert all(r["time_to_target"] == (5.0 if r["method"] in ran else 4.0)
               for r in cell["runs"])
    with pytest.raises(SystemExit, match="no such file"):
        compare.main(["--grid", "--merge", str(tmp_path / "none.json"), "--out", str(out)])
    with pytest.raises(SystemExit, match="in none of"):
        compare.main(["--grid", "--merge", str(copy), "--cells", "*/pareto/*",
                      "--out", str(out)])


def _settings(**extra):
    return {"task": "digits-logreg", "latency": "persistent", "n": 20, "cohort": 20,
            "rounds": 30, "target": 0.85, "seeds": [10, 11], "methods": ["auto", "fedbuff"],
            "run_config": {"latency": "persistent", "auto-margin": 0.1}, **extra}


@pytest.mark.parametrize("change, named", [
    ({"target": 0.9}, "target (0.85 there, 0.9 here)"),
    ({"seeds": [10, 12]}, "seeds ([10, 11] there, [10, 12] here)"),
    ({"run_config": {"latency": "bimodal", "auto-margin": 0.1}},
     "run_config['latency'] ('persistent' there, 'bimodal' here)"),
])
def test_a_rerun_under_other_shared_settings_is_refused(change, named):
    existing = {"settings": _settings(), "runs": [_run("auto", 10, 4.0),
                                                  _run("fedbuff", 10, 2.0)]}
    result = {"settings": _settings(methods=["auto"], **change), "runs": [_run("auto", 10, 3.0)],
              "runtime_s": 1.0}
    with pytest.raises(ValueError, match=re.escape(named)):
        run_grid.rerun_cell(existing, result, ["auto"], compare.load_grid()["rules"])


def test_a_rerun_may_change_a_key_only_coded_runs_read_and_adds_its_method():
    existing = {"settings": _settings(), "runs": [_run("auto", 10, 4.0),
                                                  _run("fedbuff", 10, 2.0)]}
    result = {"settings": _settings(methods=["auto-approximate"], run_config={
        "latency": "persistent", "auto-margin": 0.3}),
        "runs": [_run("auto-approximate", 10, 3.0)], "runtime_s": 1.0}
    cell = run_grid.rerun_cell(existing, result, ["auto-approximate"],
                               compare.load_grid()["rules"])
    assert cell["settings"]["methods"] == ["auto", "fedbuff", "auto-approximate"]
    assert cell["reruns"][-1]["replaced_settings"]["run_config"]["auto-margin"] == 0.1


def test_a_rerun_merged_from_a_copy_passes_only_the_settings_it_changed():
    existing = {"settings": _settings(), "runs": [_run("auto", 10, 4.0),
                                                  _run("fedbuff", 10, 2.0)]}
    result = {"settings": {"auto_stop_at_decode": True}, "runs": [_run("auto", 10, 3.0)],
              "runtime_s": 1.0}
    cell = run_grid.rerun_cell(existing, result, ["auto"], compare.load_grid()["rules"])
    assert cell["settings"]["run_config"] == _settings()["run_config"]
    assert cell["settings"]["auto_stop_at_decode"] is True


def test_a_merge_from_a_copy_made_under_other_shared_settings_is_refused(tmp_path):
    grid = compare.load_grid()
    name = "digits-logreg/persistent/20x20"
    run_config = {"latency": "persistent", "dataset": "digits", "auto-margin": 0.1}
    base = {"settings": _settings(run_config=run_config), "summary": {}, "runtime_s": 3.0,
            "runs": [_run("auto", 10, 4.0), _run("fedbuff", 10, 2.0)]}
    out, copy = tmp_path / "out.json", tmp_path / "copy.json"
    run_grid.merge(out, grid, name, base)
    rerun = [{"methods": ["auto"], "runtime_s": 1.0, "finished_utc": "2026-12-01T03:00:00",
              "replaced_settings": {"auto_stop_at_decode": None}}]
    for changed, named in (({"seeds": [11, 12]}, "seeds"),
                           ({"run_config": {**run_config, "dataset": "mnist1d"}}, "dataset")):
        run_grid.merge(copy, grid, name, {**base, "reruns": rerun, "settings": {
            **_settings(run_config=run_config), "auto_stop_at_decode": True, **changed}})
        with pytest.raises(SystemExit, match=named):
            compare.main(["--grid", "--merge", str(copy), "--methods", "auto",
                          "--out", str(out)])
    run_grid.merge(copy, grid, name, {**base, "reruns": rerun, "settings": {
        **_settings(run_config=run_config), "auto_stop_at_decode": True}})
    assert compare.main(["--grid", "--merge", str(copy), "--methods", "auto",
                         "--out", str(out)]) == 0
    assert json.loads(out.read_text())["cells"][name]["settings"]["auto_stop_at_decode"]


def test_a_rerun_of_some_codes_keeps_the_other_codes_own_deadlines():
    """settings.code_deadlines_s is per code: codes run again get theirs (none when they ran
    without one), codes not run again keep theirs."""
    runs = [_run("auto", 10, 4.0), _run("crc:1", 10, 3.0), _run("frc:1", 10, 5.0)]
    existing = {"settings": _settings(methods=["auto", "crc:1", "frc:1"],
                                      code_deadlines_s={"crc:1": 2.0, "frc:1": 3.0}),
                "runs": runs}
    rules = compare.load_grid()["rules"]
    again = {"settings": _settings(methods=["crc:1"], code_deadlines_s={"crc:1": 2.5}),
             "runs": [_run("crc:1", 10, 2.0)], "runtime_s": 1.0}
    cell = run_grid.rerun_cell(existing, again, ["crc:1"], rules)
    assert cell["settings"]["code_deadlines_s"] == {"crc:1": 2.5, "frc:1": 3.0}
    assert cell["reruns"][-1]["replaced_settings"]["code_deadlines_s"] == {
        "crc:1": 2.0, "frc:1": 3.0}
    without = {"settings": _settings(methods=["frc:1"], codes_own_deadline=False),
               "runs": [_run("frc:1", 10, 6.0)], "runtime_s": 1.0}
    cell = run_grid.rerun_cell(cell, without, ["frc:1"], rules)
    assert cell["settings"]["code_deadlines_s"] == {"crc:1": 2.5}
    assert cell["settings"]["codes_own_deadline"] is False
    assert cell["reruns"][-1]["replaced_settings"]["code_deadlines_s"] == {
        "crc:1": 2.5, "frc:1": 3.0}


def test_a_merge_of_some_codes_takes_only_their_own_deadlines():
    """A copy whose re-run gave every code its deadline, merged for crc:1 only: frc:1's runs
    stay the cell's, so does its (absent) deadline."""
    existing = {"settings": _settings(methods=["auto", "crc:1", "frc:1"]),
                "runs": [_run("auto", 10, 4.0), _run("crc:1", 10, 3.0), _run("frc:1", 10, 5.0)]}
    copy = {"settings": _settings(methods=["crc:1", "frc:1"],
                                  code_deadlines_s={"crc:1": 2.0, "frc:1": 3.0}),
            "runs": [_run("crc:1", 10, 2.0)], "runtime_s": 1.0}
    cell = run_grid.rerun_cell(existing, copy, ["crc:1"], compare.load_grid()["rules"])
    assert cell["settings"]["code_deadlines_s"] == {"crc:1": 2.0}
