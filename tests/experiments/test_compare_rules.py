"""``--rule``: a rival's rule of the grid file replaced for one comparison, recorded, checked."""

from __future__ import annotations

import json

import pytest

from experiments import compare


def _fedbuff_runs(tmp_path, *rules: str) -> dict:
    out = tmp_path / f"c{len(rules)}.json"
    argv = ["--n", "8", "--rounds", "6", "--seeds", "3", "--dev-seeds", "0", "--target", "0.5",
            "--methods", "auto,fedbuff", "--set", "latency=persistent", "--out", str(out)]
    for rule in rules:
        argv += ["--rule", rule]
    assert compare.main(argv) == 0
    return json.loads(out.read_text())


def test_a_fedbuff_rule_reaches_fedbuff_and_is_recorded(tmp_path):
    plain = _fedbuff_runs(tmp_path)
    flat = _fedbuff_runs(tmp_path, "fedbuff_staleness_exponent=0", "fedbuff_server_lr=2",
                         "fedbuff_tune=0")
    assert plain["settings"]["fedbuff"]["staleness_exponent"] == 0.5  # the grid file's
    # FedBuff ran: its drift fix is recorded; no deadline rival or first-k ran: no stop flag
    assert plain["settings"]["fedbuff"]["regime_round"] == "federation"
    assert "rivals_stop_dropped_work" not in plain["settings"]
    assert plain["settings"]["rules_set"] == {}
    assert flat["settings"]["rules_set"] == {"fedbuff_staleness_exponent": 0.0,
                                             "fedbuff_server_lr": 2.0, "fedbuff_tune": 0.0}
    assert flat["settings"]["fedbuff"]["staleness_exponent"] == 0.0
    assert flat["settings"]["fedbuff"]["server_lr"] == 2.0

    def run(data, method):
        return next(r for r in data["runs"] if r["method"] == method)
    # auto is not a rival: the same run; FedBuff trained another model
    assert run(plain, "auto")["accuracy_curve"] == run(flat, "auto")["accuracy_curve"]
    assert run(plain, "fedbuff")["accuracy_curve"] != run(flat, "fedbuff")["accuracy_curve"]


def _bimodal_runs(out, methods: str, *rules: str) -> dict:
    """A small bimodal comparison of ``methods`` (seed 3) with ``rules`` set, written to
    ``out``."""
    argv = ["--n", "6", "--rounds", "6", "--seeds", "3", "--dev-seeds", "0",
            "--target", "0.9", "--methods", methods,
            "--set", "latency=bimodal", "--set", "latency-p=0.3", "--out", str(out)]
    for rule in rules:
        argv += ["--rule", rule]
    assert compare.main(argv) == 0
    return json.loads(out.read_text())


def test_the_rivals_stop_dropped_work_by_the_grid_file_unless_a_rule_says_not(tmp_path):
    methods = "auto,deadline,first-k"
    stop = _bimodal_runs(tmp_path / "s0.json", methods)
    keep = _bimodal_runs(tmp_path / "s1.json", methods, "rivals_stop_dropped_work=0")
    assert "regime_round" not in stop["settings"]["fedbuff"]  # FedBuff did not run
    assert stop["settings"]["rivals_stop_dropped_work"] is True  # the grid file's rule
    assert keep["settings"]["rivals_stop_dropped_work"] is False
    assert keep["settings"]["rules_set"] == {"rivals_stop_dropped_work": 0.0}

    def total(data, method):  # virtual seconds of the run
        return next(r for r in data["runs"] if r["method"] == method)["total_virtual_s"]
    assert total(stop, "auto") == total(keep, "auto")  # not a rival
    # late work stopped: no round waits behind it, so the rounds end no later
    for method in ("deadline", "first-k"):
        assert total(stop, method) <= total(keep, method)
    assert any(total(stop, m) < total(keep, m) for m in ("deadline", "first-k"))


def test_auto_stops_late_work_at_its_round_s_end_only_by_the_rule(tmp_path):
    on = _bimodal_runs(tmp_path / "d0.json", "auto,first-k")
    off = _bimodal_runs(tmp_path / "d1.json", "auto,first-k", "auto_stop_at_decode=0")
    assert on["settings"]["auto_stop_at_decode"] is True  # the grid file's rule
    assert off["settings"]["auto_stop_at_decode"] is False
    assert off["settings"]["rules_set"] == {"auto_stop_at_decode": 0.0}

    def run(data, method):
        return next(r for r in data["runs"] if r["method"] == method)
    assert run(on, "first-k")["accuracy_curve"] == run(off, "first-k")["accuracy_curve"]
    assert run(on, "auto")["accuracy_curve"] != run(off, "auto")["accuracy_curve"]


def test_fixed_codes_stop_late_work_at_their_round_s_end_by_the_rule(tmp_path):
    """The grid file's codes_stop_at_decode gives the fixed codes auto's stop: recorded; a
    code's late work stopped at its round's end, its clients are free (not skipped as busy)
    when the next round starts, so its run ends sooner in virtual time with no fewer exact
    rounds; auto is not touched by it."""
    methods = "auto,grouped-rs:2"
    on = _bimodal_runs(tmp_path / "c0.json", methods)
    off = _bimodal_runs(tmp_path / "c1.json", methods, "codes_stop_at_decode=0",
                        "codes_own_deadline=0")
    assert on["settings"]["codes_stop_at_decode"] is True  # the grid file's rule
    assert off["settings"]["codes_stop_at_decode"] is False
    assert off["settings"]["rules_set"] == {"codes_stop_at_decode": 0.0,
                                            "codes_own_deadline": 0.0}
    assert "codes_stop_at_decode" not in _bimodal_runs(tmp_path / "c2.json", "auto")["settings"]

    def run(data, method):
        return next(r for r in data["runs"] if r["method"] == method)
    assert run(on, "auto")["accuracy_curve"] == run(off, "auto")["accuracy_curve"]
    code_on, code_off = run(on, "grouped-rs:2"), run(off, "grouped-rs:2")
    assert code_on["total_virtual_s"] < code_off["total_virtual_s"]
    assert code_on["decodes"]["exact"] >= code_off["decodes"]["exact"]


def test_a_set_stop_mode_that_contradicts_auto_s_rule_is_refused_before_any_run(tmp_path):
    argv = ["--n", "6", "--rounds", "2", "--seeds", "3", "--dev-seeds", "0", "--methods",
            "auto", "--set", "stop-late-work=True", "--out", str(tmp_path / "x.json")]
    with pytest.raises(SystemExit, match=r"stop-late-work=True contradicts the rule "
                                         r"auto_stop_at_decode"):
        compare.main(argv)
    assert not (tmp_path / "x.json").exists()
    # with auto's rule off, a fixed code's rule still holds, and says so
    argv += ["--rule", "auto_stop_at_decode=0"]
    coded = [a if a != "auto" else "auto,grouped-rs:1" for a in argv]
    with pytest.raises(SystemExit, match=r"contradicts the rule codes_stop_at_decode .*"
                                         r"--rule codes_stop_at_decode=0"):
        compare.main(coded)
    assert not (tmp_path / "x.json").exists()
    # and binds only a comparison that runs a fixed code
    assert compare.main(argv) == 0


@pytest.mark.parametrize("rule,message", [
    ("fedbuff_k=3", "not a rival's rule"),
    ("overcommit=0.5", "c >= 1"),
    ("fedbuff_buffer_fraction=1.5", r"in \(0, 1\]"),
    ("fedbuff_server_lr=x", "expected a number"),
    ("fedbuff_staleness_exponent=-1", "e >= 0"),
    ("rivals_stop_dropped_work=0.5", "1, or 0"),
    ("auto_stop_at_decode=2", "1, or 0"),
    ("codes_stop_at_decode=-1", "1, or 0"),
    ("fedbuff_server_lr", "KEY=VALUE"),
])
def test_a_bad_rule_is_refused_before_any_run_naming_it(tmp_path, capsys, rule, message):
    with pytest.raises(SystemExit, match=message):
        compare.main(["--quick", "--rule", rule, "--out", str(tmp_path / "x.json")])
    assert not (tmp_path / "x.json").exists()


def test_the_grid_refuses_a_rule(tmp_path):
    with pytest.raises(SystemExit, match="--rule"):
        compare.main(["--grid", "--rule", "overcommit=2", "--out", str(tmp_path / "g.json")])


def test_one_comparison_cut_off_resumes_from_its_journal(tmp_path, capsys, monkeypatch):
    from experiments.journal import Journal

    argv = ["--n", "6", "--rounds", "3", "--seeds", "3,4", "--dev-seeds", "0", "--target",
            "0.4", "--methods", "auto,wait-for-all"]
    whole = tmp_path / "whole.json"
    assert compare.main([*argv, "--out", str(whole)]) == 0
    assert not (tmp_path / "whole.journal.jsonl").exists()  # gone once the file is written
    # a run cut off after some runs: its journal holds them; the same command resumes
    cut = tmp_path / "cut.json"
    journal = compare.single_journal(cut)
    add = Journal.add
    count = {"n": 0}

    def counted(self, key, record):
        add(self, key, record)
        count["n"] += 1
        if count["n"] == 3:
            raise KeyboardInterrupt
    with monkeypatch.context() as patch:
        patch.setattr(Journal, "add", counted)
        with pytest.raises(KeyboardInterrupt):
            compare.main([*argv, "--out", str(cut)])
    assert journal.exists() and not cut.exists()
    capsys.readouterr()
    assert compare.main([*argv, "--out", str(cut)]) == 0
    assert "3 runs already finished" in capsys.readouterr().out
    a, b = json.loads(whole.read_text()), json.loads(cut.read_text())
    strip = ("wall_s", "measured_compute_s")
    assert [{k: v for k, v in r.items() if k not in strip} for r in a["runs"]] == \
        [{k: v for k, v in r.items() if k not in strip} for r in b["runs"]]


def test_a_fedbuff_run_without_its_buffer_size_is_refused_not_given_one():
    """The benchmark's K is the grid file's rule; a direct call that gives none is refused
    rather than run with a K written somewhere else."""
    from experiments import rival_runs

    with pytest.raises(ValueError, match="fedbuff needs buffer_size"):
        rival_runs.start_rival("fedbuff", {"seed": 0, "num-rounds": 1}, 4)


def test_a_refused_partitioner_value_is_named_without_the_split_advice(tmp_path):
    """--set dirichlet-alpha=0 is a bad value, not data too small for n: the message names it
    and does not suggest a smaller --n."""
    with pytest.raises(SystemExit) as stop:
        compare.main(["--quick", "--set", "dirichlet-alpha=0", "--out",
                      str(tmp_path / "never.json")])
    message = str(stop.value.code)
    assert "dirichlet-alpha=0.0 must be > 0" in message and "smaller --n" not in message


def test_a_seed_range_too_large_is_refused_by_its_size():
    """A range of a billion seeds is refused before any list is built (it ran the machine
    out of memory); a repeated seed among many is found."""
    with pytest.raises(ValueError, match=r"1000000001 seeds; expected at most 10000"):
        compare.parse_seeds("0-1000000000")
    assert len(compare.parse_seeds("0-9999")) == 10000
    with pytest.raises(ValueError, match=r"seeds \[5\] given twice"):
        compare.parse_seeds("0-9998,5")
