"""The real-time benchmark of asynchronous rounds (``experiments.bench_async_wallclock``):
every method's clients sleep the same stated delay, the methods run on one grid, and the
summary's ratios are the per-seed ones."""

from __future__ import annotations

import math
from typing import ClassVar

import pytest
from flwr.app import ConfigRecord, Message, MessageType, RecordDict

from experiments import bench_async_wallclock as bench

pytestmark = [
    pytest.mark.filterwarnings("ignore:gradient_coding_mod. no partition key:UserWarning"),
]


class _Context:
    node_config: ClassVar[dict[str, int]] = {"partition-id": 3}


def _slept(monkeypatch, msg):
    slept = []
    monkeypatch.setattr(bench.time, "sleep", slept.append)
    reply = bench.sleep_mod(msg, _Context(), lambda m, c: "reply")
    assert reply == "reply"
    return slept


def _train(config, group=""):
    from fl_gradcode.flower.testing import set_task_identity

    set_task_identity()
    return Message(RecordDict({"config": ConfigRecord(config)}),
                   message_type=MessageType.TRAIN, dst_node_id=1, group_id=group)


CONFIG = {"seed": 5, "bench-slow": "3", "bench-slow-s": 1.25}


def test_a_slow_partition_sleeps_its_stated_delay_whatever_sends_the_message(monkeypatch):
    # Flower's FedAvg: the round in the config; FedBuff and the coded rounds: the group id
    assert _slept(monkeypatch, _train({**CONFIG, "server-round": 4})) == [1.25]
    assert _slept(monkeypatch, _train(CONFIG, group="7")) == [1.25]


def test_a_fast_partition_sleeps_its_draw_of_the_round(monkeypatch):
    msg = _train({**CONFIG, "bench-slow": "0", "server-round": 4})
    expected = bench.client_delay_s(3, 4, 5, (0,), 1.25)
    assert _slept(monkeypatch, msg) == [pytest.approx(expected)]
    assert 0.05 < expected < 5.0
    assert expected != bench.client_delay_s(3, 5, 5, (0,), 1.25)  # another round, another draw


def test_messages_outside_the_benchmark_are_not_slept(monkeypatch):
    assert _slept(monkeypatch, _train({"seed": 5, "server-round": 4})) == []  # no bench keys
    assert _slept(monkeypatch, _train(CONFIG, group="identify")) == []  # no number


def test_the_summary_pairs_each_seed_with_flower_fedavgs():
    runs = [{"method": m, "seed": s, "time_to_target_s": t, "final_accuracy": 0.9}
            for m, s, t in [("flower-fedavg", 1, 10.0), ("flower-fedavg", 2, 20.0),
                            ("flower-fedavg", 3, None), ("coded", 1, 5.0), ("coded", 2, 5.0),
                            ("coded", 3, 4.0)]]
    out = bench.summarize(runs, ("flower-fedavg", "coded"))
    coded = out["coded"]
    assert coded["ratio_to_flower_fedavg"]["paired_seeds"] == 2  # seed 3: FedAvg never
    assert coded["ratio_to_flower_fedavg"]["geomean"] == pytest.approx(math.sqrt(0.5 * 0.25))
    assert coded["median_time_to_target_s"] == 5.0 and coded["reached"] == 3
    assert out["flower-fedavg"]["median_time_to_target_s"] == 20.0  # 10, 20, inf


def test_every_method_runs_on_one_grid_read_once_per_round_and_its_slow_client_sleeps(
        monkeypatch):
    from fl_gradcode.config import merge_config
    from fl_gradcode.flower.testing import InProcessGrid

    current, slept = [""], []
    strategy = bench.method_strategy

    def tracking(method, cfg, n):
        current[0] = method
        return strategy(method, cfg, n)

    def delay(partition, number, seed, slow, slow_s):
        slept.append((current[0], partition))
        return 0.0

    monkeypatch.setattr(bench, "method_strategy", tracking)
    monkeypatch.setattr(bench, "client_delay_s", delay)
    cfg = merge_config({"seed": 10, "num-rounds": 2, "num-clients": 4, "timing": "wallclock",
                        "latency": "none", "results-dir": ""})
    grid = InProcessGrid(bench.client_app(), 4, run_config=cfg)
    runs = bench.run_methods(grid, cfg, 4, bench.METHODS, target=0.0, slow=(1,),
                             slow_s=0.01, drain_s=0.0)
    assert [r["method"] for r in runs] == list(bench.METHODS)
    # 2 rounds, or 8 server steps of K = 1 read every 4th: two readings after the start
    assert {r["method"]: len(r["curve"]) for r in runs} == dict.fromkeys(bench.METHODS, 3)
    assert {r["method"]: r["rounds_or_steps"] for r in runs} == {
        "flower-fedavg": 2, "coded": 2, "fedbuff": 8, "fedbuff-replicated": 8}
    for r in runs:
        # the first reading after the start (the curve keeps 4 decimals)
        assert r["time_to_target_s"] == pytest.approx(r["curve"][1][0], abs=1e-4)
    # every method's clients sleep, the slow one among them; the warm-up rounds do not
    for method in bench.METHODS:
        assert (method, 1) in slept, method
    # 2 rounds of 4 clients each: 8 sleeps (the warm-up rounds of both would make 12)
    assert [m for m, _ in slept].count("flower-fedavg") == 8
    assert [m for m, _ in slept].count("coded") == 8
