"""Run-config keys reach the strategy: the ServerApp's ``build`` (server.app) turns the keys
(busy, auto-margin, exclude-slow, fraction-train, noise, latency-seed, latency-state, verify,
results-dir) into the strategy's construction and refuses a bad value naming it; the main job
refuses an empty results-dir."""

from __future__ import annotations

import re

import pytest

from fl_gradcode.config import merge_config


@pytest.mark.parametrize(
    ("run_config", "expected"),
    [({"s": 3}, "skip"), ({}, "queue"), ({"s": "auto"}, "queue"),
     ({"s": 3, "busy": "queue"}, "queue"),
     ({"s": "auto", "busy": "skip"}, "skip"), ({"timing": "wallclock"}, "skip")],
)
def test_busy_run_config_key_reaches_the_strategy(run_config, expected, tmp_path):
    from server.app import build

    cfg = merge_config({**run_config, "results-dir": str(tmp_path)})
    strategy = build(cfg, 4)[0]
    assert strategy.busy_mode == expected


@pytest.mark.parametrize("busy", ["queue", "fit"])
def test_queueing_asked_for_under_wallclock_is_refused_not_replaced(busy, tmp_path):
    """Wallclock rounds cannot queue work behind a busy member: asked for, it is refused
    (it used to run as ``skip`` without a word), by the run config and by the keyword."""
    from flwr.serverapp.strategy import FedAvg

    from fl_gradcode.flower import GradientCoding
    from server.app import build

    refusal = rf"busy='{busy}' with timing='wallclock'.*give busy='skip'"
    with pytest.raises(ValueError, match=refusal):
        build(merge_config({"busy": busy, "timing": "wallclock",
                            "results-dir": str(tmp_path)}), 4)
    for s in ("auto", 1):
        with pytest.raises(ValueError, match=refusal):
            GradientCoding(FedAvg(), s=s, busy=busy, timing="wallclock")
    assert GradientCoding(FedAvg(), s=1, busy="skip", timing="wallclock").busy_mode == "skip"


def test_bad_busy_value_is_refused_with_its_value(tmp_path):
    from server.app import build

    with pytest.raises(ValueError, match="busy='later'"):
        build(merge_config({"busy": "later", "results-dir": str(tmp_path)}), 4)


def test_auto_margin_run_config_key_reaches_the_strategy_and_is_validated(tmp_path):
    from server.app import build

    base = {"s": "auto", "results-dir": str(tmp_path)}
    assert build(merge_config(base), 4)[0].auto_margin == 0.2  # the documented default
    assert build(merge_config({**base, "auto-margin": 0.25}), 4)[0].auto_margin == 0.25
    with pytest.raises(ValueError, match=r"auto_margin=-0\.5"):
        build(merge_config({**base, "auto-margin": -0.5}), 4)


def test_exclude_slow_run_config_key_reaches_the_strategy_and_is_validated(tmp_path):
    from server.app import build

    base = {"s": "auto", "results-dir": str(tmp_path)}
    assert build(merge_config(base), 4)[0].exclude_slow is None  # 0: never (the default)
    assert build(merge_config({**base, "exclude-slow": 5.0}), 4)[0].exclude_slow == 5.0
    with pytest.raises(ValueError, match=r"exclude_slow=0\.5"):
        build(merge_config({**base, "exclude-slow": 0.5}), 4)
    with pytest.raises(ValueError, match="needs s='auto'"):
        build(merge_config({"exclude-slow": 5.0, "s": 3, "results-dir": str(tmp_path)}), 4)


def test_fraction_train_samples_a_cohort_every_round_and_is_validated(tmp_path):
    import random

    import numpy as np

    from server.app import build, run_in_process

    base = {"results-dir": str(tmp_path)}
    # Flower samples max(int(connected * fraction), min_train_nodes) nodes: all 12 connected,
    # everyone / 6 as before; asked for one node at least, a dead node never stalls the job
    inner = build(merge_config(base), 12)[0].inner
    assert (inner.fraction_train, inner.min_train_nodes, inner.min_available_nodes) == (1.0, 1, 1)
    inner = build(merge_config({**base, "fraction-train": 0.5}), 12)[0].inner
    assert (inner.fraction_train, inner.min_train_nodes, inner.min_available_nodes) == (0.5, 1, 1)
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match=f"fraction-train={bad}"):
            build(merge_config({**base, "fraction-train": bad}), 12)
    run = {**base, "fraction-train": 0.5, "num-rounds": 3, "s": 2, "latency": "pareto",
           "virtual-compute": "none"}
    random.seed(12345)  # the run seeds the cohort sampling itself
    strategy, theta = run_in_process(run, 12)
    assert len(strategy.history) == 3
    assert all(r["decode"] == "exact" and r["s"] == 2 for r in strategy.history)
    # 6 replies at most per round: the code is built over the 6-node cohort
    assert all(len(r["clients_used"]) <= 6 for r in strategy.history)
    assert len(strategy.identities) > 6  # different cohorts were sampled
    random.seed(999)
    again, theta_again = run_in_process(run, 12)  # same seed, same cohorts, same model
    np.testing.assert_array_equal(theta, theta_again)
    assert [r["virtual_s"] for r in again.history] == [r["virtual_s"] for r in strategy.history]


def test_independent_noise_is_accounted_with_the_sampled_cohorts_code(tmp_path):
    """Partition DP with independent noise: the accountant's starting multiplier (what the
    budget check judges a round at before its sizes are agreed) is the worst case of the code
    the rounds use, the one over the sampled cohort (6 of 12 nodes, s = 3: grouped-rs has a
    copied row there, k = 5, so the rounds run it without its float32 budget, one partition
    per client): a partition dominating each of its replies, 1/sqrt(r) for the most replicas
    r of a partition in that code (counted from its coefficients below)."""
    import numpy as np

    from fl_gradcode.codes import make_code
    from server.app import build

    cfg = merge_config({"results-dir": str(tmp_path), "dp": "partition",
                        "dp-noise": "independent", "noise-multiplier": 1.0, "s": 3,
                        "code": "grouped-rs", "fraction-train": 0.5})
    strategy = build(cfg, 12)[0]
    ((sigma, q, count),) = strategy.accountant.units[0]
    assert make_code("grouped-rs", n=6, s=3).k == 5  # the premise: a copied row
    ran = make_code("grouped-rs", n=6, s=3, max_relative_amplification=None)
    assert ran.k == 6
    replicas = int(np.max(np.count_nonzero(ran.B, axis=0)))
    assert sigma == pytest.approx(1 / np.sqrt(replicas), rel=1e-12)
    assert (q, count) == (1.0, 1)


def test_latency_seed_picks_the_slow_clients_and_the_run_seed_the_draws(tmp_path):
    from server.app import build

    def strategy(**keys):
        cfg = merge_config({"latency": "persistent", "latency-p": 0.3,
                            "results-dir": str(tmp_path), **keys})
        return build(cfg, 40)[0]

    def slow(st):
        return [w for w in range(40) if st.latency.is_slow(w)]

    shared = strategy(seed=5, **{"latency-seed": 1})
    seed1, seed5 = strategy(seed=1), strategy(seed=5)
    assert slow(shared) == slow(seed1) != slow(seed5)  # the federation's hardware of seed 1
    assert shared.seed == 5  # per-round draws follow the run seed


def test_latency_state_run_config_key_reaches_the_strategy(tmp_path):
    from server.app import build

    base = {"s": "auto", "results-dir": str(tmp_path)}
    assert build(merge_config(base), 4)[0].latency_state is None
    path = tmp_path / "sub" / "latency.json"
    st = build(merge_config({**base, "latency-state": str(path)}), 4)[0]
    assert st.latency_state == str(path.resolve())


def test_verify_keys_turn_on_the_integrity_check_of_the_strategy(tmp_path):
    from server.app import build

    out = str(tmp_path / "r")
    cfg = merge_config({"verify": True, "verify-tolerance": 1e-4, "code": "frc",
                        "results-dir": out})
    strategy = build(cfg, 6)[0]
    assert strategy.options.integrity.verify is True
    assert strategy.options.integrity.verify_tolerance == 1e-4
    plain = build(merge_config({"results-dir": out}), 6)[0]
    assert plain.options.integrity.verify is False
    # refused where it cannot check, with the reason, as GradientCoding(verify=True) is
    with pytest.raises(ValueError, match="verify"):
        build(merge_config({"verify": True, "code": "uncoded", "s": 0, "results-dir": out}), 4)
    # and for the default grouped-rs, whose Reed-Solomon blocks cannot be settled
    with pytest.raises(ValueError, match="repetition group"):
        build(merge_config({"verify": True, "results-dir": out}), 6)


def test_an_empty_results_dir_writes_no_results_files_not_the_working_directory(
        tmp_path, monkeypatch):
    """``results-dir=""`` means GradientCoding's ``results_dir=None`` (no files), as ``""``
    means ``None`` for the table's other path keys; it never resolves to the working
    directory."""
    from server.app import strategy_keywords

    monkeypatch.chdir(tmp_path)
    built = strategy_keywords(merge_config({"results-dir": ""}), 12)
    assert built["results_dir"] is None
    given = strategy_keywords(merge_config({"results-dir": "out"}), 12)
    assert given["results_dir"] == str(tmp_path / "out")


def test_the_main_job_refuses_an_empty_results_dir(tmp_path, monkeypatch, capsys):
    """The main job compares its runs' records: with ``results-dir=""`` there are none, so it
    refuses before any run, naming the value."""
    from server import launch

    monkeypatch.chdir(tmp_path)
    ran = []
    monkeypatch.setattr(launch, "flwr_run", lambda *a, **k: ran.append(a) or 0)
    code = launch.main(["--home", str(tmp_path / "home"), "--run-config", "results-dir=''"])
    assert code == 2 and not ran
    assert "results-dir=''" in capsys.readouterr().err


@pytest.mark.parametrize("code", ["comm-efficient", "bgc"])
def test_a_run_config_code_that_s_auto_would_not_run_is_refused(code, tmp_path):
    from server.app import build

    base = {"code": code, "m": 2, "results-dir": str(tmp_path)}
    with pytest.raises(ValueError, match=rf"code='{code}' with s='auto'"):
        build(merge_config(base), 12)  # s = "auto" is the run config's default
    assert build(merge_config({**base, "s": 2}), 12)[0].options.code.name == code


@pytest.mark.parametrize("compute", ["none", "measured-once"])
def test_a_fault_delay_that_would_slow_nobody_is_refused(tmp_path, compute):
    """Under virtual timing the delay is added to the reply's measured compute, which only
    virtual-compute='measured' charges."""
    from server.app import build

    base = {"results-dir": str(tmp_path / "r"), "slow-workers": "1", "slow-delay-s": 5.0,
            "s": 1}
    with pytest.raises(ValueError, match=rf"slow-delay-s=5.0.*virtual-compute='{compute}'"):
        build(merge_config({**base, "virtual-compute": compute}), 6)
    build(merge_config({**base, "virtual-compute": "measured"}), 6)
    build(merge_config({**base, "virtual-compute": compute, "slow-delay-s": 0.0}), 6)


@pytest.mark.parametrize(("key", "value", "missing"), [
    ("nan-workers", "9", "[9]"), ("slow-workers", "1,6", "[6]"), ("nan-workers", "-1", "[-1]"),
])
def test_a_fault_on_a_worker_no_round_has_is_refused(tmp_path, key, value, missing):
    """A round's workers are 0 .. cohort - 1: a fault on another index would inject nothing
    (it used to run fault-free without a word)."""
    from server.app import build

    base = {"results-dir": str(tmp_path / "r"), "s": 1, "virtual-compute": "measured",
            "slow-delay-s": 1.0}
    with pytest.raises(ValueError,
                       match=re.escape(f"{key}={value!r}: no worker {missing} in a cohort of 6")):
        build(merge_config({**base, key: value}), 6)
    build(merge_config({**base, key: "0,5"}), 6)
    half = {**base, "fraction-train": 0.5, key: "3"}  # cohorts of 3: workers 0..2
    with pytest.raises(ValueError, match=r"no worker \[3\] in a cohort of 3"):
        build(merge_config(half), 6)


def test_a_negative_num_clients_is_refused():
    from server.app import wait_for_nodes

    class Grid:
        def get_node_ids(self):
            return [11, 12, 13, 14]

    with pytest.raises(ValueError, match=r"num-clients=-3; expected 0"):
        wait_for_nodes(Grid(), -3, timeout=1.0, settle=0.1)
    assert wait_for_nodes(Grid(), 0, timeout=5.0, settle=0.1) == 4


# one non-default value per latency parameter key (the key table's defaults are the others)
_OTHER_LATENCY = {"latency-scale": 0.3, "latency-rate": 5.0, "latency-shape": 3.0,
                  "latency-p": 0.4, "latency-slowdown": 10.0, "latency-trace": "tokyo",
                  "latency-drift-round": 7, "latency-round-s": 30.0, "latency-seed": 3}


@pytest.mark.parametrize("model", ["none", "exponential", "shifted-exponential", "pareto",
                                   "bimodal", "persistent", "trace", "drift",
                                   "fedscale"])
def test_a_latency_parameter_the_model_ignores_is_refused_by_the_server_app(model, tmp_path):
    """A latency key set away from its default is either honoured (the round times of the
    built strategy change) or refused by the ServerApp, naming the key and the model; it is
    never accepted and ignored. The oracle is the arrivals themselves: the same run config
    with and without the key, sampled for the same rounds and workers."""
    from fl_gradcode.latency import client_delay
    from server.app import build, build_rival

    base = {"latency": model, "results-dir": str(tmp_path), "seed": 5}

    def draws(cfg):
        latency = build(merge_config(cfg), 20)[0].options.timing.latency
        return [client_delay(latency, worker=w, round_index=r, load=1.0, seed=5)
                for r in range(1, 21) for w in range(20)]

    reference = draws(base)
    for name, value in _OTHER_LATENCY.items():
        cfg = {**base, name: value}
        try:
            changed = draws(cfg)
        except ValueError as exc:
            assert re.search(rf"{name}={value!r}: latency '{model}' does not read it",
                             str(exc)), exc
            with pytest.raises(ValueError, match=f"{name}="):
                build_rival(merge_config({**cfg, "rival": "drop-stragglers"}), 20)
            continue
        assert changed != reference, (model, name)
