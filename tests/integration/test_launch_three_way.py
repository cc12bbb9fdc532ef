"""The main job's runs: coded, wait-for-all FedAvg, drop-stragglers (Flower's FedAvg with a
round deadline in virtual time) and FedBuff; the launcher's run configs and its table."""

from __future__ import annotations

import json

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.config import parse_config_args

from fl_gradcode.config import merge_config
from fl_gradcode.flower.deadline import TIMING_KEY, DeadlineFedAvg, train_timing_mod
from fl_gradcode.flower.testing import InProcessGrid
from fl_gradcode.results import ROUND_FIELDS, RoundRecorder
from server.launch import MAIN_JOB_FEDBUFF
from tests.integration.launching import first_hour_regime, launch_main

# =============================================================================== run configs
S_AUTO = ("s='auto' s-max=4 auto-deadline=1.5 exclude-slow=5.0 latency-state='x.json' "
          "num-rounds=3 straggler-timeout=5.0")


def test_s_auto_reaches_every_run_once_and_the_rivals_drop_the_coded_only_keys(
        tmp_path, monkeypatch):
    code, configs = launch_main(tmp_path, monkeypatch, ["--run-config", S_AUTO])
    assert code == 0
    # Flower's own parser (what `flwr run` does with the string) refuses a key given twice
    parsed = [parse_config_args([c]) for c in configs]
    assert len(parsed) == 4
    coded, uncoded, drop, fedbuff = parsed
    assert coded == {"results-dir": str(tmp_path / "run"), "s": "auto", "s-max": 4,
                     "auto-deadline": 1.5, "exclude-slow": 5.0, "latency-state": "x.json",
                     "num-rounds": 3, "straggler-timeout": 5.0}
    assert uncoded == {"results-dir": str(tmp_path / "run-uncoded"), "num-rounds": 3,
                       "code": "uncoded", "s": 0, "straggler-timeout": 1000000.0}
    assert drop == {"results-dir": str(tmp_path / "run-drop-stragglers"), "num-rounds": 3,
                    "straggler-timeout": 5.0, "rival": "drop-stragglers"}
    # FedBuff: what only coded or synchronous rounds read is left out
    # (its server lr and buffer: the committed pick of its tuning, at the 12 nodes tuned at)
    pick = json.loads(MAIN_JOB_FEDBUFF.read_text())
    assert fedbuff == {"results-dir": str(tmp_path / "run-fedbuff"), "num-rounds": 3,
                       "asynchronous": True, "s": 0, "server-lr": pick["server_lr"],
                       "buffer-size": pick["buffer_size"]}
    for cfg in (coded, uncoded, drop, fedbuff):
        merge_config(cfg)  # the ServerApp accepts each


def test_an_asynchronous_run_is_read_against_fedbuff_itself_too(tmp_path, monkeypatch):
    # FedBuff keeps the buffer, drops the replication rule; none when the coded run is FedBuff
    code, configs = launch_main(tmp_path, monkeypatch, [
        "--run-config", "asynchronous=true s=1 replicate-below=0.5 buffer-size=4 num-rounds=3"])
    parsed = [parse_config_args([c]) for c in configs]
    runs = ("", "-uncoded", "-drop-stragglers", "-fedbuff")
    assert code == 0 and [p["results-dir"] for p in parsed] == [f"{tmp_path}/run{x}" for x in runs]
    assert merge_config(parsed[3]) and parsed[3] == {
        "results-dir": str(tmp_path / "run-fedbuff"), "buffer-size": 4, "num-rounds": 3,
        "asynchronous": True, "s": 0}
    assert launch_main.compared[0][3] == tmp_path / "run-fedbuff"
    code, configs = launch_main(tmp_path, monkeypatch, ["--run-config", "asynchronous=true s=0"])
    assert code == 0 and not any("run-fedbuff" in c for c in configs) and len(configs) == 3


def test_no_compare_runs_the_coded_run_only(tmp_path, monkeypatch):
    code, configs = launch_main(tmp_path, monkeypatch, ["--no-compare", "--run-config", "s=2"])
    assert code == 0
    assert [parse_config_args([c]) for c in configs] == [
        {"results-dir": str(tmp_path / "run"), "s": 2}]


def test_a_run_config_key_given_twice_keeps_its_last_value(tmp_path, monkeypatch):
    code, configs = launch_main(tmp_path, monkeypatch,
                            ["--no-compare", "--run-config", "s=2 num-rounds=4 s=1"])
    assert code == 0
    assert parse_config_args(configs) == {"results-dir": str(tmp_path / "run"),
                                          "num-rounds": 4, "s": 1}


def test_results_dir_in_the_run_config_is_the_coded_runs_directory(tmp_path, monkeypatch):
    code, configs = launch_main(tmp_path, monkeypatch,
                            ["--run-config", f"results-dir='{tmp_path / 'mine'}'"])
    assert code == 0
    dirs = [parse_config_args([c])["results-dir"] for c in configs]
    assert dirs == [str(tmp_path / n) for n in ("mine", "mine-uncoded", "mine-drop-stragglers",
                                                "mine-fedbuff")]


@pytest.mark.parametrize(("overrides", "named"), [
    ("s=auto", "s=auto"),  # an unquoted string is not TOML
    ("stragglers=3", "'stragglers'"),
    ("num-rounds='5'", "num-rounds='5'"),
    ("hello s=2", "'hello'"),
])
def test_bad_overrides_are_refused_before_any_run(tmp_path, monkeypatch, capsys, overrides,
                                                   named):
    code, configs = launch_main(tmp_path, monkeypatch, ["--run-config", overrides])
    assert code == 2 and configs == []
    assert named in capsys.readouterr().err


def test_dp_skips_the_drop_stragglers_run_and_says_why(tmp_path, monkeypatch, capsys):
    code, configs = launch_main(tmp_path, monkeypatch, ["--run-config", "dp='partition'"])
    assert code == 0 and len(configs) == 2
    out = capsys.readouterr().out  # neither plain FedAvg nor FedBuff applies DP
    assert all(f"{r} run is skipped: dp='partition'" in out for r in ("drop-stragglers", "fedbuff"))
    assert launch_main.compared == [(tmp_path / "run", tmp_path / "run-uncoded", None, None)]


# =============================================================================== the deadline
WEIGHTS = {0: 10, 1: 30, 2: 20, 3: 40}  # partition -> num-examples


def _fixed_app(compute):
    """A ClientApp-like callable that replies ``w = 100 * round + partition`` with
    ``compute[(partition, round)]`` seconds of reported compute (what train_timing_mod adds)."""

    def app(msg, context):
        pid = int(context.node_config["partition-id"])
        rnd = int(msg.content["config"]["server-round"])
        content = RecordDict({
            "arrays": ArrayRecord({"w": Array(np.array([100.0 * rnd + pid]))}),
            "metrics": MetricRecord({"num-examples": WEIGHTS[pid]}),
            TIMING_KEY: ConfigRecord({"partition-id": pid, "compute-s": compute[(pid, rnd)]}),
        })
        return Message(content, reply_to=msg)

    return app


def _run_deadline(app, n, rounds, tmp_path=None, **kwargs):
    strategy = DeadlineFedAvg(fraction_evaluate=0.0, min_available_nodes=1, min_train_nodes=1,
                              results_dir=None if tmp_path is None else str(tmp_path),
                              **kwargs)
    models = {}

    def evaluate_fn(rnd, arrays):
        models[rnd] = float(arrays["w"].numpy()[0])
        return MetricRecord({"accuracy": rnd / 10, "loss": 1.0})

    strategy.start(grid=InProcessGrid(app, n), initial_arrays=ArrayRecord(
        {"w": Array(np.array([0.0]))}), num_rounds=rounds, train_config=ConfigRecord(),
        evaluate_fn=evaluate_fn)
    return strategy, models


def test_replies_after_the_deadline_are_dropped_and_a_late_client_stays_busy(tmp_path):
    # round 1: arrivals 0.5, 1.0, 3.0, 0.2 with a 2 s deadline: partition 2 is dropped and
    # the round lasts the deadline (2 s); partition 2 works until 3 s, so in round 2 (from
    # 2 s) its 0.4 s of work arrives at 1.0 + 0.4 = 1.4 s; every reply is in by 1.4 s, which
    # ends round 2 at 2 + 1.4 = 3.4 s
    compute = {(0, 1): 0.5, (1, 1): 1.0, (2, 1): 3.0, (3, 1): 0.2,
               (0, 2): 0.1, (1, 2): 0.3, (2, 2): 0.4, (3, 2): 0.2}
    strategy, models = _run_deadline(_fixed_app(compute), 4, 2, tmp_path, deadline=2.0,
                                     latency=None)
    first, second = strategy.history
    assert (first["clients_used"], first["stragglers"], first["decode"]) == ([0, 1, 3], [2],
                                                                            "partial")
    assert first["virtual_s"] == pytest.approx(2.0)
    assert first["late_dropped"] == 1
    assert models[1] == pytest.approx((10 * 100 + 30 * 101 + 40 * 103) / 80)
    assert (second["clients_used"], second["stragglers"], second["decode"]) == (
        [0, 1, 2, 3], [], "all")
    assert second["busy"] == [2]
    assert second["virtual_s"] == pytest.approx(3.4)
    assert models[2] == pytest.approx((10 * 200 + 30 * 201 + 20 * 202 + 40 * 203) / 100)
    assert first["compute_s"] == pytest.approx(4.7)
    assert first["bytes_up"] == 4 * 8  # four float64 scalars
    from fl_gradcode.results import read_rounds

    rows = read_rounds(tmp_path)
    assert [r["accuracy"] for r in rows] == [0.1, 0.2]
    assert all(k in rows[0] for k in ROUND_FIELDS)
    assert (tmp_path / "final_model.npz").exists()


def test_no_reply_in_time_keeps_the_model_and_the_round_lasts_the_deadline():
    compute = {(p, 1): 5.0 for p in range(2)} | {(p, 2): 0.1 for p in range(2)}
    strategy, models = _run_deadline(_fixed_app(compute), 2, 2, deadline=1.0, latency=None)
    first, second = strategy.history
    assert first["decode"] == "skipped" and first["virtual_s"] == pytest.approx(1.0)
    assert models[1] == 0.0  # Flower keeps the previous model
    # both still busy until 5 s: round 2 (from 1 s) would get their replies at 4 + 0.1 s
    assert (second["decode"], second["stragglers"], second["busy"]) == ("skipped", [0, 1],
                                                                       [0, 1])
    assert second["virtual_s"] == pytest.approx(2.0)


def test_arrivals_add_the_latency_draw_of_the_partition_and_its_load():
    """compute + client_delay(partition id, round, load = size / the cohort's mean size)."""
    from fl_gradcode.latency import client_delay, make_latency

    latency = make_latency("bimodal", scale=0.1, rate=10.0, p=0.5, slowdown=20.0)
    strategy = DeadlineFedAvg(deadline=1.0, latency=latency, seed=7,
                              partition_sizes=[10, 30, 20], compute_cost_s=0.5)
    # nodes 11 and 12 answered (partitions 0 and 1: mean size 20, loads 0.5 and 1.5)
    got = strategy.arrivals(3, {11: (0, 0.25, 10, 0), 12: (1, 0.0, 30, 0)})
    expected = {11: 0.25 + 0.5 * 0.5 + client_delay(latency, worker=0, round_index=3,
                                                     load=0.5, seed=7),
                12: 0.5 * 1.5 + client_delay(latency, worker=1, round_index=3, load=1.5,
                                             seed=7)}
    assert got == pytest.approx(expected)


def test_a_reply_without_the_timing_record_is_refused_with_what_to_do():
    def bare(msg, context):
        return Message(RecordDict({"arrays": ArrayRecord({"w": Array(np.array([1.0]))}),
                                   "metrics": MetricRecord({"num-examples": 1})}),
                       reply_to=msg)

    with pytest.raises(ValueError, match="needs train_timing_mod"):
        _run_deadline(bare, 2, 1, deadline=1.0)


@pytest.mark.parametrize("deadline", [0.0, -1.0, float("nan"), float("inf")])
def test_a_deadline_that_is_not_a_positive_time_is_refused(deadline):
    with pytest.raises(ValueError, match="deadline="):
        DeadlineFedAvg(deadline=deadline)


# ===================================================================== the real ServerApp's
def _rival(run_config, n, tmp_path):
    from clients.app import make_client_app
    from server.app import build_rival

    cfg = merge_config({"results-dir": str(tmp_path), "rival": "drop-stragglers",
                        "num-clients": n, **run_config})
    strategy, initial, evaluate_fn, train_config = build_rival(cfg, n)
    result = strategy.start(grid=InProcessGrid(make_client_app(), n, run_config=cfg),
                            initial_arrays=initial, num_rounds=int(cfg["num-rounds"]),
                            train_config=train_config, evaluate_fn=evaluate_fn)
    return strategy, np.concatenate([result.arrays[k].numpy().reshape(-1) for k in initial])


def test_with_a_deadline_nobody_misses_it_is_the_wait_for_all_run(tmp_path):
    """Same model and same virtual times as the uncoded run through the wrapper: the same
    data, seeds and latency draws (compute left out: it is measured, so it differs)."""
    from server.app import run_in_process

    common = {"num-rounds": 3, "virtual-compute": "none", "straggler-timeout": 1e6}
    rival, theta = _rival(common, 6, tmp_path / "rival")
    uncoded, theta_u = run_in_process({**common, "code": "uncoded", "s": 0,
                                       "results-dir": str(tmp_path / "u")}, 6)
    np.testing.assert_allclose(theta, theta_u, rtol=1e-9, atol=1e-12)
    assert [r["virtual_s"] for r in rival.history] == pytest.approx(
        [r["virtual_s"] for r in uncoded.history], rel=1e-12)
    assert [r["accuracy"] for r in rival.history] == pytest.approx(
        [r["accuracy"] for r in uncoded.history])
    assert all(r["decode"] == "all" and r["compute_s"] > 0 for r in rival.history)


def test_in_process_the_rival_samples_the_cohorts_of_the_uncoded_run(tmp_path):
    """fraction-train < 1 in one process: the clients' seeding must not move the random module
    the server's Flower samples from, so the rival (run_rival_in_process) gets the uncoded
    run's cohort in every round, and with no deadline reached, its model."""
    from server.app import run_in_process, run_rival_in_process

    common = {"num-rounds": 4, "virtual-compute": "none", "straggler-timeout": 1e6,
              "fraction-train": 0.5}
    rival, theta = run_rival_in_process({**common, "results-dir": str(tmp_path / "r")}, 8)
    uncoded, theta_u = run_in_process({**common, "code": "uncoded", "s": 0,
                                       "results-dir": str(tmp_path / "u")}, 8)
    cohorts = [sorted(r["clients_used"] + r["stragglers"]) for r in rival.history]
    assert cohorts == [r["partitions"]["used"] for r in uncoded.history]
    assert len({tuple(c) for c in cohorts}) > 1  # the premise: the cohorts change
    np.testing.assert_allclose(theta, theta_u, rtol=1e-9, atol=1e-12)


def test_the_first_round_drops_exactly_the_partitions_whose_draw_is_past_the_deadline(
        tmp_path):
    from fl_gradcode.latency import client_delay
    from server.app import run_latency

    n, deadline = 8, 0.3
    # bimodal draws and no compute cost, set here (not the defaults): the draws alone decide
    regime = {"latency": "bimodal", "partition-cost-s": 0.0, "virtual-compute": "none",
              "straggler-timeout": deadline, "latency-p": 0.3}
    cfg = merge_config(regime)
    rival, _ = _rival({"num-rounds": 1, **regime}, n, tmp_path)
    sizes = rival.partition_sizes
    latency = run_latency(cfg)
    late = sorted(p for p in range(n) if client_delay(
        latency, worker=p, round_index=1, load=sizes[p] / np.mean(sizes), seed=0) > deadline)
    assert 0 < len(late) < n  # the premise: some are late, some not
    (row,) = rival.history
    assert row["stragglers"] == late
    assert row["clients_used"] == sorted(set(range(n)) - set(late))
    assert row["virtual_s"] == pytest.approx(deadline)


@pytest.mark.parametrize(("keys", "named"), [
    ({"dp": "partition"}, "dp='partition'"),
    ({"server-optimizer": "adam"}, "server-optimizer='sgd'"),
    ({"rival": "ignore-stragglers"}, "rival='ignore-stragglers'"),
    ({"timing": "wallclock"}, "timing='virtual'"),
])
def test_the_rival_refuses_what_plain_fedavg_cannot_do(tmp_path, keys, named):
    from server.app import build_rival

    cfg = merge_config({"results-dir": str(tmp_path), "rival": "drop-stragglers", **keys})
    with pytest.raises(ValueError, match=named.replace("(", r"\(")):
        build_rival(cfg, 4)


def test_train_timing_mod_leaves_coded_messages_alone_and_times_plain_ones():
    from flwr.app import Context

    from fl_gradcode.flower import protocol
    from fl_gradcode.flower.testing import set_task_identity

    set_task_identity()
    ctx = Context(run_id=1, node_id=5, node_config={"partition-id": 3}, state=RecordDict(),
                  run_config={})
    seen = []

    def handler(msg, context):
        seen.append(float(np.random.random()))  # noqa: NPY002 - the app's global RNG
        return Message(RecordDict({"metrics": MetricRecord({"num-examples": 1})}),
                       reply_to=msg)

    coded = Message(RecordDict({protocol.PROTOCOL_KEY: ConfigRecord({"op": "train"})}),
                    message_type="train", dst_node_id=5)
    reply = train_timing_mod(coded, ctx, handler)
    assert TIMING_KEY not in reply.content.config_records
    plain = [Message(RecordDict({"config": ConfigRecord({"seed": 4, "server-round": 2})}),
                     message_type="train", dst_node_id=5) for _ in range(2)]
    replies = [train_timing_mod(m, ctx, handler) for m in plain]
    timing = replies[0].content.config_records[TIMING_KEY]
    assert timing["partition-id"] == 3 and timing["compute-s"] >= 0.0
    assert seen[1] == seen[2]  # seeded from (seed, round, partition): the same draw


def test_train_timing_mod_leaves_the_callers_random_state_as_it_was():
    """The handler's draws are seeded, and the caller's RNGs (Python's, numpy's global) are
    restored after: in one process (the in-process grid) the server's Flower samples its
    cohorts from Python's random module, which a client's seeding must not move."""
    import random

    from flwr.app import Context

    ctx = Context(run_id=1, node_id=5, node_config={"partition-id": 3}, state=RecordDict(),
                  run_config={})

    def handler(msg, context):
        random.random()
        np.random.random()  # noqa: NPY002 - the app's global RNG
        return Message(RecordDict({"metrics": MetricRecord({"num-examples": 1})}),
                       reply_to=msg)

    random.seed(123)
    np.random.seed(7)  # noqa: NPY002
    expected = (random.random(), float(np.random.random()))  # noqa: NPY002
    random.seed(123)
    np.random.seed(7)  # noqa: NPY002
    msg = Message(RecordDict({"config": ConfigRecord({"seed": 4, "server-round": 2})}),
                  message_type="train", dst_node_id=5)
    train_timing_mod(msg, ctx, handler)
    assert (random.random(), float(np.random.random())) == expected  # noqa: NPY002


# =============================================================================== the table
def _summary(name, final, time_to, exact=None, dropped=0, rounds_dropping=0):
    return {"name": name, "final": final, "time_to": time_to, "total_s": 30.0, "exact": exact,
            "mb_up": 1.5, "compute_s": 2.25, "dropped": dropped,
            "rounds_dropping": rounds_dropping, "rounds": 30}


def test_the_table_shows_the_three_runs_and_the_speedups():
    from server.launch import render_table

    text = render_table([_summary("coded", 0.9, 5.0, exact=(27, 30)),
                         _summary("uncoded", 0.8, 10.0),
                         _summary("drop-stragglers", 0.85, 4.0, dropped=7,
                                  rounds_dropping=3)], 0.8)
    lines = text.splitlines()
    assert "time to accuracy 0.800" in text
    rows = {}
    for line in lines:  # each run's first line is its row
        if line.split() and line.split()[0] in ("coded", "uncoded", "drop-stragglers"):
            rows.setdefault(line.split()[0], line.split())
    assert rows["coded"] == ["coded", "0.900", "5.00", "s", "30.00", "s", "27/30", "1.50",
                             "2.25", "s"]
    assert rows["uncoded"][6] == "n/a" and rows["drop-stragglers"][6] == "n/a"
    assert "coding reached 0.800 2.00x sooner than uncoded" in text
    assert "coding was 1.25x slower to 0.800 than drop-stragglers" in text
    assert "dropped 7 late replies in 3 of 30 rounds" in text
    assert len(lines) <= 14 and max(map(len, lines)) <= 100  # one screen


def test_compare_reads_three_runs_and_draws_three_curves(tmp_path):
    from server.launch import compare

    finals = {"coded": [0.5, 0.9], "uncoded": [0.4, 0.8], "drop-stragglers": [0.6, 0.7]}
    for name, accuracy in finals.items():
        rec = RoundRecorder(tmp_path / name, {"code": "grouped-rs", "s": 3,
                                              "straggler-timeout": 2.0})
        for r, acc in enumerate(accuracy, start=1):
            rec.record({**{k: 0 for k in ROUND_FIELDS}, "round": r, "decode": "exact",
                        "accuracy": acc, "virtual_s": 2.0 * r, "bytes_up": 10**6,
                        "compute_s": 0.5, "late_dropped": int(name == "drop-stragglers")})
    text = compare(*(tmp_path / n for n in finals))
    assert "time to accuracy 0.700" in text  # the lowest final accuracy
    assert "coded: gradient coding, code=grouped-rs s=3" in text
    assert "replies in by 2.0 s" in text
    assert "dropped 2 late replies in 2 of 2 rounds" in text
    assert (tmp_path / "coded" / "comparison.png").stat().st_size > 1000


def test_the_client_app_can_be_pickled_for_ray_actors():
    """Flower's simulation sends the loaded ClientApp to its Ray actors with cloudpickle; a
    lock in a mod's closure (the replay guard's) made every message fail."""
    import cloudpickle

    from clients.app import app

    copy = cloudpickle.loads(cloudpickle.dumps(app))
    assert len(copy._mods) == len(app._mods)


def test_a_failed_run_is_left_out_of_the_comparison_and_the_exit_code_says_so(
        tmp_path, monkeypatch):
    from server import launch

    codes = iter([0, 1, 0, 0])  # the wait-for-all run fails
    monkeypatch.setattr(launch, "run_flwr", lambda cmd, **kw: next(codes))
    monkeypatch.setattr(launch, "stop_local_superlink", lambda home: None)
    compared = []
    monkeypatch.setattr(launch, "compare",
                        lambda *dirs, **_: compared.append(dirs) or "")
    monkeypatch.setenv("FL_GRADCODE_DP_KEY_FILE", str(tmp_path / "unused-keys.json"))
    code = launch.main(["--home", str(tmp_path / "home"), "--results-dir",
                        str(tmp_path / "run")])
    assert code == 1
    assert compared == [(tmp_path / "run", None, tmp_path / "run-drop-stragglers",
                         tmp_path / "run-fedbuff")]


# =============================================================================== presets
def test_the_default_main_job_is_the_recommendedfirst_hour_regime():
    """No options: every key of the regime the first-hour experiment recommends is a default
    but its deadline (straggler-timeout follows the grid file's rule), and the losing preset's
    regime differs from the defaults."""
    from fl_gradcode.config import DEFAULTS

    recommended = first_hour_regime("recommended")
    assert DEFAULTS["straggler-timeout"] != recommended.pop("straggler-timeout")
    assert {k: DEFAULTS[k] for k in recommended} == recommended
    losing = first_hour_regime("losing_preset")
    assert {k: DEFAULTS[k] for k in losing} != losing


@pytest.mark.parametrize("preset, says", [("coding-wins", "coding is recommended here"),
                                          ("coding-loses", "coding is NOT recommended here")])
def test_a_preset_says_whether_coding_is_recommended_in_itsfirst_hour_regime(preset, says, tmp_path,
                                                                    monkeypatch, capsys):
    code, _ = launch_main(tmp_path, monkeypatch, ["--no-compare", "--preset", preset])
    assert code == 0
    out = capsys.readouterr().out
    assert f"preset {preset} = regime " in out and says in out


@pytest.mark.parametrize("preset, role", [("coding-wins", "recommended"),
                                          ("coding-loses", "losing_preset")])
def test_a_preset_runs_the_first_hour_experiments_regime_in_every_run(
        preset, role, tmp_path, monkeypatch):
    from fl_gradcode.config import coded_only_keys

    regime = first_hour_regime(role)
    code, configs = launch_main(tmp_path, monkeypatch, ["--preset", preset])
    assert code == 0
    coded, uncoded, drop, fedbuff = [parse_config_args([c]) for c in configs]
    from server.asynchronous import SYNCHRONOUS_KEYS

    # FedBuff runs the same regime, without what only coded or synchronous rounds read
    assert {k: fedbuff[k] for k in regime if k not in set(coded_only_keys())
            | set(SYNCHRONOUS_KEYS)} == {k: v for k, v in regime.items()
                                         if k not in set(coded_only_keys())
                                         | set(SYNCHRONOUS_KEYS)}
    assert {k: coded[k] for k in regime} == regime
    shared = {k: v for k, v in regime.items() if k not in coded_only_keys()}
    # the rivals run the same regime without the coded-only keys (the uncoded run keeps its
    # own "wait for every client": no deadline)
    assert {k: drop[k] for k in shared} == shared
    assert not set(regime) - set(shared) & set(drop)
    assert {k: uncoded[k] for k in shared if k != "straggler-timeout"} == {
        k: v for k, v in shared.items() if k != "straggler-timeout"}
    assert uncoded["code"] == "uncoded" and uncoded["straggler-timeout"] == 1e6


def test_run_config_keys_override_the_presets(tmp_path, monkeypatch):
    code, configs = launch_main(tmp_path, monkeypatch,
                            ["--no-compare", "--preset", "coding-wins", "--run-config",
                             "s=2 num-rounds=3"])
    assert code == 0
    coded = parse_config_args(configs)
    assert coded["s"] == 2 and coded["num-rounds"] == 3
    assert coded["latency"] == first_hour_regime("recommended")["latency"]


def test_an_unknown_preset_is_refused_naming_the_presets():
    from server.launch import preset_overrides

    with pytest.raises(ValueError, match=r"coding-loses.*coding-wins"):
        preset_overrides("fast")


# ========================================================== deploy_local's FedAvg baseline
def test_the_fedavg_rival_waits_for_every_reply_and_refuses_a_latency_it_cannot_sleep(
        tmp_path):
    from server.app import build_rival, run_in_process

    common = {"num-rounds": 2, "virtual-compute": "none", "latency": "bimodal",
              "latency-p": 0.5, "straggler-timeout": 0.01}  # a deadline every reply misses
    rival, theta = _rival({**common, "rival": "fedavg"}, 4, tmp_path / "f")
    assert all(r["decode"] == "all" and r["late_dropped"] == 0 for r in rival.history)
    _, theta_u = run_in_process({**common, "code": "uncoded", "s": 0,
                                 "straggler-timeout": 1e6, "results-dir": str(tmp_path / "u")},
                                4)
    np.testing.assert_allclose(theta, theta_u, rtol=1e-9, atol=1e-12)
    wallclock = merge_config({"rival": "fedavg", "timing": "wallclock",
                              "results-dir": str(tmp_path / "w")})
    with pytest.raises(ValueError, match=r"latency='persistent'.*latency='none'"):
        build_rival(wallclock, 4)
    build_rival({**wallclock, "latency": "none"}, 4)  # plain FedAvg in real time


def test_deploy_local_builds_the_fedavg_run_config_and_the_overhead_report(tmp_path):
    from server.deploy_local import (
        fedavg_run_config,
        overhead,
        render_overhead,
        with_results_dir,
    )

    config, results = with_results_dir("num-rounds=3 s=1 timing='wallclock'", tmp_path / "r")
    assert results == (tmp_path / "r").resolve()
    assert parse_config_args([config])["results-dir"] == str(results)
    given, where = with_results_dir(f"results-dir='{tmp_path}/mine' s=1", tmp_path / "r")
    assert where == tmp_path / "mine" and parse_config_args([given])["s"] == 1
    fedavg = parse_config_args([fedavg_run_config(config, tmp_path / "f")])
    assert fedavg == {"num-rounds": 3, "s": 1, "timing": "wallclock",
                      "results-dir": str(tmp_path / "f"), "rival": "fedavg"}
    with pytest.raises(ValueError, match="rival='drop-stragglers' in --run-config"):
        fedavg_run_config(f"{config} rival='drop-stragglers'", tmp_path / "f")
    coded = [{"wall_s": w, "decode": "exact"} for w in (9.0, 3.0, 5.0)]
    plain = [{"wall_s": w, "decode": "all"} for w in (8.0, 2.0, 2.0)]
    report = overhead(coded, plain)
    # medians over rounds 2..: coded (3, 5) -> 4, FedAvg (2, 2) -> 2
    assert (report["median_coded_s"], report["median_fedavg_s"]) == (4.0, 2.0)
    assert report["overhead_ratio"] == 2.0 and report["median_over"] == "rounds 2.."
    assert overhead(coded[:1], plain[:1])["overhead_ratio"] == 9.0 / 8.0
    text = render_overhead({**report, "slow_node": 2})
    assert "overhead ratio 2.00x" in text and "what coding saves" in text
    with pytest.raises(ValueError, match="no rounds to compare"):
        overhead([], plain)


def test_the_main_jobs_cohorts_do_not_move_with_other_draws_from_random(tmp_path, monkeypatch):
    """The ServerApp draws each round's cohort from (seed, round): a server-side evaluation
    that also draws from the random module (as a user's code may) leaves the cohorts and
    the model as they were."""
    import random

    import server.app as app
    from server.app import run_in_process

    common = {"num-rounds": 4, "virtual-compute": "none", "straggler-timeout": 1e6,
              "fraction-train": 0.5, "code": "uncoded", "s": 0}
    quiet, theta = run_in_process({**common, "results-dir": str(tmp_path / "a")}, 8)
    original = app.evaluate_classes

    def drawing(*args, **kwargs):
        random.random()
        return original(*args, **kwargs)

    monkeypatch.setattr(app, "evaluate_classes", drawing)
    noisy, theta_noisy = run_in_process({**common, "results-dir": str(tmp_path / "b")}, 8)
    cohorts = [r["partitions"]["used"] for r in quiet.history]
    assert len({tuple(c) for c in cohorts}) > 1  # the premise: the cohorts change
    assert [r["partitions"]["used"] for r in noisy.history] == cohorts
    np.testing.assert_allclose(theta_noisy, theta, rtol=0, atol=0)
