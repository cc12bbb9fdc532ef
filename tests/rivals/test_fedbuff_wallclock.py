"""FedBuff and ReplicatedFedBuff in real time (``timing="wallclock"``): messages in flight at
once on the grid, replies taken in as they come, the model each job was sent kept until its
reply. Checked against a numpy reference of FedBuff's step rebuilt from what the run records
(which partition arrived at each step, and how stale), and on what a user sees: a client that
never answers does not hold the run back, its partition enters through a neighbour, a bad
reply or a lost job is dropped, the drawn latency is what the client is told to sleep."""

from __future__ import annotations

import time

import numpy as np
import pytest
from flwr.app import ConfigRecord

from fl_gradcode.flower import gradient_coding_mod
from fl_gradcode.flower.asynchronous import ReplicatedFedBuff
from fl_gradcode.flower.protocol import parse_instruction
from fl_gradcode.flower.testing import InProcessGrid
from fl_gradcode.latency import DeviceTrace, Drift, Exponential, client_delay
from fl_gradcode.rivals import FedBuff, train_timing_mod
from tests.apps.numpy_app import LR, as_dict, assert_model, call_app, initial_arrays, make_app
from tests.apps.numpy_app import theta0 as initial_model
from tests.flower.harness import FixedArrivals

pytestmark = [
    pytest.mark.filterwarnings("ignore:fraction_evaluate"),
    pytest.mark.filterwarnings("ignore:gradient_coding_mod. no partition key:UserWarning"),
]

SILENT = 60.0  # a reply held this long never comes within a test


def _start(strategy, grid, steps, timeout=3600.0):
    models = {}

    def evaluate_fn(step, arrays):
        models[step] = as_dict(arrays)

    began = time.monotonic()
    result = strategy.start(grid=grid, initial_arrays=initial_arrays(), num_rounds=steps,
                            timeout=timeout, train_config=ConfigRecord({"lr": LR}),
                            evaluate_fn=evaluate_fn)
    return result, models, time.monotonic() - began


def _rebuild(history, n, k, server_lr):
    """FedBuff's step (Nguyen et al. 2022, Algorithm 1) from the recorded arrivals: the j-th
    update of a step is partition ``clients_used[j]``'s update of the model of ``staleness[j]``
    steps before, weighted ``(1 + tau)^-1/2``; the model moves by ``server_lr`` times the
    buffer's mean."""
    models = {0: initial_model()}
    for row in history:
        step = row["round"]
        buffer = {m: np.zeros_like(v) for m, v in models[0].items()}
        for part, tau in zip(row["clients_used"], row["staleness"], strict=True):
            sent = models[step - 1 - tau]
            new, _, _ = call_app(sent, part, n)
            for m in buffer:
                buffer[m] += (1.0 + tau) ** -0.5 * (new[m] - sent[m])
        models[step] = {m: models[step - 1][m] + server_lr * buffer[m] / k for m in buffer}
    return models


def test_a_client_that_never_answers_does_not_hold_the_run_back():
    grid = InProcessGrid(make_app(train_timing_mod), 2,
                         delay=lambda p, r: SILENT if p == 1 else 0.01)
    strategy = FedBuff(buffer_size=1, concurrency=2, server_lr=0.8, timing="wallclock")
    result, models, took = _start(strategy, grid, 6)
    assert took < 10.0  # the silent client's reply would come after a minute
    assert [row["clients_used"] for row in strategy.history] == [[0]] * 6
    assert [row["staleness"] for row in strategy.history] == [[0]] * 6
    expected = _rebuild(strategy.history, 2, 1, 0.8)
    for step in range(1, 7):
        assert_model(models[step], expected[step])
    assert_model(as_dict(result.arrays), expected[6])
    times = [row["virtual_s"] for row in strategy.history]
    assert times == sorted(times) and times[0] >= 0.01  # real seconds since the start


def test_a_slow_reply_is_weighted_by_its_real_staleness_against_the_model_it_was_sent():
    # partition 1's first job is slow: it comes back after several of partition 0's steps
    grid = InProcessGrid(make_app(train_timing_mod), 2,
                         delay=lambda p, r: 0.6 if (p == 1 and r == 1) else 0.04)
    strategy = FedBuff(buffer_size=2, concurrency=2, server_lr=0.7, timing="wallclock")
    _, models, _ = _start(strategy, grid, 10)
    late = [tau for row in strategy.history
            for part, tau in zip(row["clients_used"], row["staleness"], strict=True)
            if part == 1]
    assert late and late[0] >= 1  # it was stale when it came in
    expected = _rebuild(strategy.history, 2, 2, 0.7)
    for step in range(1, 11):
        assert_model(models[step], expected[step])


def test_a_silent_clients_partition_enters_through_its_neighbour():
    # client 2 answers the handshake (round 0), then never again
    grid = InProcessGrid(make_app(train_timing_mod, gradient_coding_mod), 3,
                         delay=lambda p, r: SILENT if p == 2 and r >= 1 else 0.01)
    strategy = ReplicatedFedBuff(s=1, buffer_size=2, concurrency=3, timing="wallclock")
    _, models, took = _start(strategy, grid, 6)
    assert took < 10.0
    pairs = [(part, by) for row in strategy.history
             for part, by in zip(row["clients_used"], row["computed_by"], strict=True)]
    assert (2, 1) in pairs  # partition 2, computed by client 1 (it holds 1 and 2)
    assert all(by != 2 for _, by in pairs)
    expected = _rebuild(strategy.history, 3, 2, 1.0)
    for step in range(1, 7):
        assert_model(models[step], expected[step])


def test_a_node_silent_at_the_handshake_delays_the_start_by_identify_timeout_only(caplog):
    grid = InProcessGrid(make_app(train_timing_mod, gradient_coding_mod), 3,
                         delay=lambda p, r: SILENT if p == 2 else 0.01)
    strategy = ReplicatedFedBuff(s=1, buffer_size=2, concurrency=3, timing="wallclock",
                                 identify_timeout=0.3)
    with caplog.at_level("WARNING", logger="flwr"):
        _, _, took = _start(strategy, grid, 4)
    assert 0.3 <= took < 10.0
    assert "1 of 3 nodes did not identify" in caplog.text
    pairs = [(part, by) for row in strategy.history
             for part, by in zip(row["clients_used"], row["computed_by"], strict=True)]
    assert (2, 1) in pairs and all(by != 2 for _, by in pairs)


class _Recording(InProcessGrid):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.instructions = []

    def push_messages(self, messages):
        messages = list(messages)
        for msg in messages:
            instruction = parse_instruction(msg.content)
            if instruction is not None and instruction.op == "train":
                self.instructions.append(instruction)
        return super().push_messages(messages)


def test_each_client_is_told_to_sleep_the_latency_drawn_for_its_job():
    latency = Exponential(50.0)  # mean 0.02 s
    grid = _Recording(make_app(train_timing_mod, gradient_coding_mod), 3)
    strategy = ReplicatedFedBuff(s=1, buffer_size=1, concurrency=3, latency=latency, seed=4,
                                 timing="wallclock")
    _start(strategy, grid, 5)
    assert len(grid.instructions) >= 5
    for ins in grid.instructions:
        assert ins.timing == "wallclock"
        # every partition has 1 example in the numpy app's node config: load 1
        assert ins.delay_s == pytest.approx(client_delay(
            latency, worker=ins.worker, round_index=ins.round, load=1.0, seed=4))
        assert ins.delay_s > 0


def test_an_error_reply_and_a_lost_job_are_dropped_and_the_run_goes_on(caplog):
    def app(msg, context):
        if int(context.node_config["partition-id"]) == 1:
            raise RuntimeError("boom")
        return make_app(train_timing_mod)(msg, context)

    grid = InProcessGrid(app, 3, delay=lambda p, r: SILENT if p == 2 else 0.02)
    strategy = FedBuff(buffer_size=1, concurrency=3, timing="wallclock")
    _, models, took = _start(strategy, grid, 12, timeout=0.1)
    assert took < 10.0
    assert all(row["clients_used"] == [0] for row in strategy.history)
    assert sum(row["rejected"] for row in strategy.history) >= 2  # errors and given-up jobs
    expected = _rebuild(strategy.history, 3, 1, 1.0)
    assert_model(models[12], expected[12])


def test_a_drifting_regime_changes_when_the_federation_reaches_its_round():
    """As in virtual timing: the k-th job sent (from 0) is in round k // concurrency + 1 (2
    in flight over 3 clients: not a client's own job number),
    whatever the client's own job number (no delay before the drift, 0.02 s from it)."""
    table = {j: [0.0, 0.0, 0.0] for j in range(1, 20)}
    latency = Drift(before=FixedArrivals(table),
                    after=FixedArrivals({j: [0.02] * 3 for j in table}), at_round=3)
    grid = _Recording(make_app(train_timing_mod, gradient_coding_mod), 3)
    strategy = ReplicatedFedBuff(s=1, buffer_size=1, concurrency=2, latency=latency, seed=2,
                                 timing="wallclock")
    _start(strategy, grid, 9)
    delays = [ins.delay_s for ins in grid.instructions]
    assert len(delays) >= 9
    for k, delay in enumerate(delays):
        assert delay == (0.02 if k // 2 + 1 >= 3 else 0.0), (k, delay)


def _failing_app(failing):
    def app(msg, context):
        if int(context.node_config["partition-id"]) in failing:
            raise RuntimeError("boom")
        return make_app(train_timing_mod)(msg, context)

    return app


def test_a_client_that_fails_at_once_is_backed_off_not_resent_work_at_once():
    # client 1's error comes back at once; client 0 takes 0.2 s a job
    grid = InProcessGrid(_failing_app({1}), 2, delay=lambda p, r: 0.0 if p == 1 else 0.2)
    strategy = FedBuff(buffer_size=1, concurrency=2, timing="wallclock")
    _, models, _ = _start(strategy, grid, 3)
    assert len(strategy.history) == 3  # the run went on
    # 3 good jobs and one in flight at the end; the failing client's back-off doubles from
    # 0.05 s, so it fails about log2(T / 0.05) + 1 times in T seconds (a constant 0.05 s
    # back-off: T / 0.05, at least 12 in the 0.6 s the good jobs take)
    assert grid.pushed <= 4 + 8
    expected = _rebuild(strategy.history, 2, 1, 1.0)
    assert_model(models[3], expected[3])


def test_a_run_where_no_update_is_usable_stops_after_the_timeout(caplog):
    grid = InProcessGrid(_failing_app({0, 1}), 2)
    strategy = FedBuff(buffer_size=1, concurrency=2, timing="wallclock")
    with caplog.at_level("WARNING", logger="flwr"):
        _, _, took = _start(strategy, grid, 3, timeout=0.5)
    assert strategy.history == []
    assert 0.5 <= took < 5.0
    assert "no usable update for 0.5 s" in caplog.text and "boom" in caplog.text


def test_the_late_reply_of_a_job_given_up_is_never_taken_in():
    # client 1's first job answers after 0.3 s; the run gives it up after 0.15 s
    grid = InProcessGrid(make_app(train_timing_mod), 2,
                         delay=lambda p, r: 0.3 if (p == 1 and r == 1) else 0.02)
    strategy = FedBuff(buffer_size=1, concurrency=2, timing="wallclock")
    _, models, _ = _start(strategy, grid, 30, timeout=0.15)
    assert sum(row["rejected"] for row in strategy.history) == 1
    assert strategy.history[-1]["virtual_s"] > 0.3  # its reply could have been pulled
    expected = _rebuild(strategy.history, 2, 1, 1.0)
    assert_model(models[30], expected[30])


def test_a_duplicated_reply_is_taken_in_once():
    # one client in flight at a time, K = 2: a duplicate taken in would fill a step by itself
    grid = InProcessGrid(make_app(train_timing_mod), 1, delay=lambda p, r: 0.01,
                         duplicate=lambda p, r: True)
    strategy = FedBuff(buffer_size=2, concurrency=1, timing="wallclock")
    _, models, _ = _start(strategy, grid, 4)
    assert grid.pushed == 9  # two jobs a step, and the one sent after the last step
    assert [row["staleness"] for row in strategy.history] == [[0, 0]] * 4
    expected = _rebuild(strategy.history, 1, 2, 1.0)
    assert_model(models[4], expected[4])


@pytest.mark.parametrize("kwargs, named", [
    ({"timing": "real"}, "timing='real'"),
    ({"timing": "wallclock", "poll_interval": 0.0}, "poll_interval=0.0"),
    ({"timing": "wallclock", "latency": Exponential(10.0)}, "latency="),
    ({"timing": "wallclock", "compute_cost_s": 0.5}, "compute_cost_s=0.5"),
    ({"timing": "wallclock", "upload_bandwidth": 1e6}, "upload_bandwidth=1000000.0"),
])
def test_fedbuff_refuses_what_wallclock_timing_cannot_honour(kwargs, named):
    with pytest.raises(ValueError, match=named.replace("(", r"\(")):
        FedBuff(buffer_size=1, **kwargs)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan")])
def test_replicated_fedbuff_refuses_an_identify_timeout_that_is_no_time(bad):
    with pytest.raises(ValueError, match="identify_timeout="):
        ReplicatedFedBuff(s=1, buffer_size=1, identify_timeout=bad)


def test_replicated_fedbuff_refuses_simulated_devices_in_real_time():
    trace = DeviceTrace({1: {"computation": 10.0, "communication": 1000.0}},
                        {1: {"active": [0.0], "inactive": [900.0], "finish_time": 1000.0}})
    with pytest.raises(ValueError, match="DeviceTrace"):
        ReplicatedFedBuff(s=1, buffer_size=1, latency=trace, timing="wallclock")
