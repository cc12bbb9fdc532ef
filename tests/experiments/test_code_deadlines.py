"""Each fixed code's deadline read from its own client times (the grid file's amendment 21):
a coded round records every reply's arrival, the ones after its end too, as Flower's
FedAvg-based wait-for-all records its own; the benchmark reads each code's deadline from
them by the stated rule and stops that code's rounds there, and only that code's."""

from __future__ import annotations

import json

import numpy as np
import pytest

from experiments import compare
from experiments.rival_runs import Cell, run_coded, run_rival, start_cell_coded

GRID = compare.load_grid()
OPEN = {"straggler-timeout": 1e6}


def _cell(run_config, **shape) -> Cell:
    return Cell(run_config=run_config, **shape, **compare.cell_rules(GRID))


def _bimodal(**keys) -> dict:
    return {**compare.cell_run_config(GRID, "digits-logreg", "bimodal"), **keys}


def test_an_uncoded_round_records_the_arrivals_flower_s_fedavg_rival_sees():
    """Independent reference: the wait-for-all rival (a subclass of Flower's FedAvg with its
    own clock) on the same seed and latency draws; a code of load 1 (uncoded, s = 0) must
    see each client arrive when it does."""
    cell = _cell(_bimodal(**OPEN), n=6, cohort=6, rounds=3, target=0.3)
    coded = run_coded("uncoded:0", 1, cell, client_times=True)["client_times_s"]
    rival = run_rival("wait-for-all", 1, cell)["client_times_s"]
    assert len(coded) == len(rival) == 6 * 3
    np.testing.assert_allclose(sorted(coded), sorted(rival), rtol=1e-12)


def test_a_coded_round_records_the_replies_after_its_decode_too():
    """A round of grouped-rs:2 ends at its first decodable set; the replies after it were
    computed (virtual timing) and their arrivals are in the row, later than the round."""
    cell = _cell(_bimodal(**OPEN), n=6, cohort=6, rounds=4, target=0.3)
    run, _ = start_cell_coded("grouped-rs:2", 2, cell)
    rows = run.history
    assert all(sorted(map(int, r["arrivals_s"])) == list(range(6)) for r in rows)
    assert all(min(r["arrivals_s"].values()) <= r["round_virtual_s"] + 1e-9 for r in rows)
    assert any(max(r["arrivals_s"].values()) > r["round_virtual_s"] + 1e-9 for r in rows)


def _compare(out, methods: str, *rules: str) -> dict:
    argv = ["--n", "6", "--rounds", "5", "--seeds", "3", "--dev-seeds", "0,1",
            "--target", "0.9", "--methods", methods, "--set", "latency=bimodal",
            "--set", "latency-p=0.3", "--out", str(out)]
    for rule in rules:
        argv += ["--rule", rule]
    assert compare.main(argv) == 0
    return json.loads(out.read_text())


def _run(data, method):
    return next(r for r in data["runs"] if r["method"] == method)


def test_each_code_stops_waiting_at_the_stated_rule_read_from_its_own_client_times(tmp_path):
    on = _compare(tmp_path / "on.json", "auto,grouped-rs:2,crc:1")
    off = _compare(tmp_path / "off.json", "auto,grouped-rs:2,crc:1", "codes_own_deadline=0")
    s_on, s_off = on["settings"], off["settings"]
    assert s_on["codes_own_deadline"] is True and s_off["codes_own_deadline"] is False
    assert "code_deadlines_s" not in s_off
    assert set(s_on["code_deadlines_s"]) == {"grouped-rs:2", "crc:1"}
    slack = float(GRID["rules"]["deadline_slack"])
    quantile = float(GRID["rules"]["deadline_quantile"])
    shape = {"n": 6, "cohort": 6, "rounds": 5, "target": 0.9}
    for code, deadline in s_on["code_deadlines_s"].items():
        # the rule by hand on the code's own runs on the development seeds, deadline open
        times = [t for seed in (0, 1) for t in run_coded(
            code, seed, _cell({**s_on["run_config"], **OPEN}, **shape),
            client_times=True)["client_times_s"]]
        assert deadline == pytest.approx(slack * np.quantile(times, quantile), rel=1e-12)
        # a code of load s + 1 >= 2 under a load-scaled regime: later than wait-for-all's
        assert deadline > s_on["stated_deadline_s"]
        # its evaluation run is the code's run with that deadline
        own = run_coded(code, 3, _cell({**s_on["run_config"], "straggler-timeout": deadline},
                                       **shape))
        assert _run(on, code)["accuracy_curve"] == own["accuracy_curve"]
    # without the rule the codes stop at wait-for-all's stated deadline, as before
    assert s_off["coded_straggler_timeout_s"] == s_off["stated_deadline_s"]
    plain = run_coded("crc:1", 3, _cell({**s_off["run_config"],
                                         "straggler-timeout": s_off["stated_deadline_s"]},
                                        **shape))
    assert _run(off, "crc:1")["accuracy_curve"] == plain["accuracy_curve"]
    # here crc:1's deadline binds: its own deadline gave it another run
    assert _run(on, "crc:1")["accuracy_curve"] != plain["accuracy_curve"]
    # auto is not touched by it
    assert _run(on, "auto")["accuracy_curve"] == _run(off, "auto")["accuracy_curve"]


def test_codes_own_deadlines_without_their_stop_at_decode_are_refused_before_any_run(
        tmp_path):
    """Without the stop, a client still computing after a round is sent nothing in the next
    (busy = skip): the slow clients' times would go missing from what the rule reads."""
    argv = ["--n", "4", "--rounds", "2", "--seeds", "0", "--dev-seeds", "0", "--methods",
            "auto,grouped-rs:1", "--rule", "codes_stop_at_decode=0",
            "--out", str(tmp_path / "x.json")]
    with pytest.raises(SystemExit, match=r"codes_own_deadline .*needs codes_stop_at_decode=1"
                                         r".*--rule codes_own_deadline=0"):
        compare.main(argv)
    assert not (tmp_path / "x.json").exists()
    # without a fixed code there is nothing to refuse
    assert compare.main([*argv[:9], "auto", *argv[10:]]) == 0


def test_a_cell_that_sets_its_deadline_gives_no_code_its_own(tmp_path):
    out = tmp_path / "set.json"
    assert compare.main(["--n", "4", "--rounds", "2", "--seeds", "0", "--dev-seeds", "0",
                         "--target", "0.3", "--methods", "grouped-rs:1",
                         "--set", "straggler-timeout=0.35", "--out", str(out)]) == 0
    settings = json.loads(out.read_text())["settings"]
    assert settings["codes_own_deadline"] is False and "code_deadlines_s" not in settings
    assert settings["coded_straggler_timeout_s"] == 0.35


def test_a_grid_cell_with_codes_own_deadlines_but_no_stop_is_refused_before_any_run():
    """The grid's path (run_cell on the grid file's rules, no --rule) refuses the same
    contradiction the single comparison does, before any run."""
    grid = compare.load_grid()
    grid = {**grid, "rules": {**grid["rules"], "codes_own_deadline": 1,
                              "codes_stop_at_decode": 0}}
    lines: list[str] = []
    with pytest.raises(ValueError, match=r"codes_own_deadline .*needs codes_stop_at_decode=1"):
        compare.run_cell(grid, "digits-logreg", "bimodal", 4, 4, 2, [10], [0],
                         ["auto", "grouped-rs:1"], 0.3, log=lines.append)
    assert not any(ln.startswith("  ") for ln in lines)  # no run was made
