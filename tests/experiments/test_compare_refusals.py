"""The benchmark command refuses, before its first run, a flag or run-config value that a
run could not be built with (it ended a cell with a traceback when the run needing it
started) or would not honour (it ran something else than asked, or recorded it wrongly)."""

from __future__ import annotations

import pytest

from experiments import compare

#: a small cell, so that a mid-run failure (or a run not refused) comes quickly
SMALL = ["--n", "6", "--rounds", "1", "--seeds", "0", "--dev-seeds", "0"]


@pytest.mark.parametrize(("argv", "named"), [
    # a run-config value some run cannot be built with: refused before the first run (it
    # ended the cell with a traceback when the run that needs it started)
    ([*SMALL, "--methods", "auto,wait-for-all", "--set", "server-lr=0.5"],
     "wait-for-all cannot run with this cell's run config: server-optimizer='sgd', "
     "server-lr=0.5"),
    ([*SMALL, "--methods", "auto,deadline", "--set", "dp=partition"],
     "deadline cannot run with dp='partition': it is a plain Flower strategy"),
    ([*SMALL, "--set", "dp=central"], "deadline cannot run with dp='central'"),
    ([*SMALL, "--methods", "auto", "--set", "upload-bandwidth=-1000"],
     "run-config key 'upload-bandwidth'"),
    ([*SMALL, "--methods", "auto", "--set", "s-max=-1"], "run-config key 's-max'"),
    ([*SMALL, "--methods", "auto", "--set", "busy=bogus"], "busy='bogus'"),
    ([*SMALL, "--methods", "auto", "--set", "lr=nan"], "lr=nan: expected a finite step"),
    ([*SMALL, "--n", "1", "--methods", "first-k"], "first-k: sampling ceil(1.3 x 1) nodes"),
    # accepted and not honoured before: refused
    ([*SMALL, "--methods", "uncoded:1"], "uncoded is built with s = 0, not 1"),
    ([*SMALL, "--methods", "auto", "--set", "auto-approximate=true"],
     "use --methods auto-approximate"),
    ([*SMALL, "--task", "mnist1d-cnn", "--methods", "wait-for-all", "--set",
      "partition-cost-s=1.0"], "add --set virtual-compute=none"),
    ([*SMALL, "--latency", "bimodal", "--set", "latency=pareto"], "give one of them"),
    ([*SMALL, "--set", "latency-p=0.1", "--set", "latency-p=0.5"], "latency-p is already given"),
    ([*SMALL, "--methods", ","], "names no method"),
    ([*SMALL, "--set", "latency-shape=7"], "latency 'persistent' does not read it"),
    ([*SMALL, "--set", "latency=none", "--set", "latency-p=0.3"],
     "latency 'none' does not read it"),
    ([*SMALL, "--methods", "grouped-rs:1,grouped-rs:01"], "without leading zeros"),
    ([*SMALL, "--seeds", "\u00b2"], "expected non-negative integers"),
])
def test_a_value_no_run_could_take_or_honour_is_refused_before_any_run(tmp_path, argv, named):
    out = tmp_path / "never.json"
    with pytest.raises(SystemExit) as stop:
        compare.main([*argv, "--out", str(out)])
    assert named in str(stop.value.code) and not out.exists()


def test_an_out_that_is_a_directory_is_refused_before_any_run(tmp_path):
    with pytest.raises(SystemExit) as stop:
        compare.main([*SMALL, "--methods", "wait-for-all", "--out", str(tmp_path)])
    assert "is a directory" in str(stop.value.code)
    assert not list(tmp_path.iterdir())  # no journal left behind either


def test_a_coded_only_cell_with_its_own_deadline_is_not_refused_for_wait_for_all(tmp_path):
    """With its own straggler-timeout a coded-only cell never runs wait-for-all (no stated
    deadline to fix): a key plain FedAvg would refuse (server-lr) does not stop it."""
    out = tmp_path / "cell.json"
    compare.main([*SMALL, "--methods", "auto,grouped-rs:1", "--set", "straggler-timeout=1.0",
                  "--set", "server-lr=0.5", "--out", str(out)])
    assert out.exists()


@pytest.mark.parametrize("argv, match", [
    (["--seeds", "99999999999999999999"], r"--seeds '9+': seed 9+ is too large; expected "
                                          r"seeds below 2\*\*63"),
    (["--out", "{tmp}/a-file/x.json"], r"--out .*a-file/x.json: its directory cannot be made"),
])
def test_a_seed_too_large_or_an_out_that_cannot_be_written_is_refused_by_name(tmp_path, argv,
                                                                              match):
    (tmp_path / "a-file").write_text("")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    base = ["--n", "4", "--rounds", "2", "--methods", "wait-for-all", "--dev-seeds", "0"]
    if "--seeds" not in argv:
        base += ["--seeds", "0"]
    if "--out" not in argv:
        base += ["--out", str(tmp_path / "x.json")]
    with pytest.raises(SystemExit, match=match):
        compare.main([*base, *argv])


def test_under_dp_wait_for_all_is_the_wrapper_applying_the_same_dp(tmp_path):
    """A DP setting used to be refused outright (plain FedAvg, the stated deadline's
    wait-for-all, applies no DP): it now runs auto, the fixed codes and wait-for-all as the
    wrapper with the identity code, whose nodes get a key file, under the same DP."""
    import json

    common = ["--n", "5", "--rounds", "2", "--seeds", "3", "--dev-seeds", "0",
              "--target", "0.99", "--methods", "auto,wait-for-all,grouped-rs:1"]
    out = {}
    for name, sets in (("dp", ["--set", "dp=partition", "--set", "noise-multiplier=5"]),
                       ("plain", [])):
        path = tmp_path / f"{name}.json"
        assert compare.main([*common, *sets, "--out", str(path)]) == 0
        out[name] = {r["method"]: r for r in json.loads(path.read_text())["runs"]}
    assert set(out["dp"]) == {"auto", "wait-for-all", "grouped-rs:1"}
    # the wrapper's record (its rounds' decodes), not plain FedAvg's, under DP only
    assert "decodes" in out["dp"]["wait-for-all"]
    assert "decodes" not in out["plain"]["wait-for-all"]
    for method in ("auto", "wait-for-all", "grouped-rs:1"):  # noise 5: another model
        assert out["dp"][method]["final_accuracy"] != out["plain"][method]["final_accuracy"]
    # each run's ε: two releases of every partition at noise 5 (Opacus' RDP accountant)
    from opacus.accountants import RDPAccountant

    accountant = RDPAccountant()
    accountant.history = [(5.0, 1.0, 2)]
    expected = accountant.get_epsilon(delta=1e-5)
    for method in ("auto", "wait-for-all", "grouped-rs:1"):
        assert out["dp"][method]["epsilon"] == pytest.approx(expected)
        assert "epsilon" not in out["plain"][method]
