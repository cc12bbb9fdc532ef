"""The unseen-settings check (the grid file's amendment 33): its settings are ones the harness
takes, its fixed codes are the grid's that run as named for the setting's cohort, and it
writes the harness's cell per setting, resuming where it stopped."""

from __future__ import annotations

import json

import pytest

from experiments import unseen_check as uc
from experiments.compare import load_grid


@pytest.mark.parametrize("name", sorted(uc.SETTINGS))
def test_every_setting_is_one_the_harness_takes(name):
    from experiments.compare import parse_cell
    from experiments.compare_cli import build_parser

    methods, _ = uc.methods(name)
    args = build_parser("x").parse_args([*uc.flags(name), "--methods", ",".join(methods),
                                         "--seeds", uc.SEEDS])
    cell = parse_cell(load_grid(), args)
    latency, n, cohort, sets = uc.SETTINGS[name]
    assert (cell["n"], cell["cohort"], cell["latency"]) == (n, cohort, latency)
    assert all(cell["sets"][k] == v for k, v in sets.items())
    # the registered seeds are neither the grid's evaluation nor its development seeds
    grid = load_grid()
    used = {int(s) for s in [*grid["seeds"]["evaluation"], *grid["seeds"]["development"]]}
    assert cell["seeds"] == [20, 21, 22, 23, 24] and not set(cell["seeds"]) & used


@pytest.mark.parametrize("name", sorted(uc.SETTINGS))
def test_the_fixed_codes_are_the_grids_that_run_as_named(name):
    # FRC splits the cohort into groups of s + 1 (Tandon et al. 2017): it needs (s + 1) | cohort
    grid = load_grid()["methods"]
    _, _, cohort, _ = uc.SETTINGS[name]
    methods, aside = uc.methods(name)
    expected = [f"{c}:{s}" for c in grid["fixed_codes"] for s in grid["fixed_s"]
                if s < cohort and (c != "frc" or cohort % (s + 1) == 0)]
    assert methods == [*uc.METHODS, *expected]
    assert sorted(aside) == sorted({f"{c}:{s}" for c in grid["fixed_codes"]
                                    for s in grid["fixed_s"]} - set(expected))
    assert all(aside.values())


def test_the_check_writes_each_settings_cell_and_resumes(tmp_path, capsys):
    out = tmp_path / "unseen.json"
    argv = ["--only", "bimodal-20-cohort10", "--quick", "--seeds", "0",
            "--methods", "fedbuff,fedbuff-auto", "--out", str(out)]
    assert uc.main(argv) == 0
    data = json.loads(out.read_text())
    cell = data["cells"]["bimodal-20-cohort10"]
    assert (cell["settings"]["n"], cell["settings"]["cohort"]) == (20, 10)
    assert {r["method"] for r in cell["runs"]} == {"fedbuff", "fedbuff-auto"}
    assert uc.main(argv) == 0
    assert "bimodal-20-cohort10: kept from" in capsys.readouterr().out
    assert json.loads(out.read_text()) == data
