"""The drop-stragglers rival on its own (``fl_gradcode/flower/deadline.py``): its argument
checks, its client mod ``train_timing_mod``, the arrivals it computes, and what each round
records. Expected values are hand-computed from the definitions in the module's docstring."""

from __future__ import annotations

import random
import re

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from fl_gradcode.flower.deadline import TIMING_KEY, DeadlineFedAvg, train_timing_mod
from fl_gradcode.flower.testing import InProcessGrid, set_task_identity
from fl_gradcode.results import read_rounds

WEIGHTS = {0: 10, 1: 30, 2: 20, 3: 40}  # partition -> examples the reply reports


def _app(compute, weight_key="num-examples", unweighted=()):
    """Replies ``w = 100 * round + partition`` with ``compute[(partition, round)]`` seconds of
    reported compute; partitions in ``unweighted`` report no ``weight_key``."""

    def app(msg, context):
        pid = int(context.node_config["partition-id"])
        rnd = int(msg.content["config"]["server-round"])
        metrics = {"other": 1} if pid in unweighted else {weight_key: WEIGHTS[pid]}
        content = RecordDict({
            "arrays": ArrayRecord({"w": Array(np.array([100.0 * rnd + pid]))}),
            "metrics": MetricRecord(metrics),
            TIMING_KEY: ConfigRecord({"partition-id": pid, "compute-s": compute[(pid, rnd)]}),
        })
        return Message(content, reply_to=msg)

    return app


def _run(app, n, rounds, *, evaluate_fn=None, grid=None, **kwargs):
    strategy = DeadlineFedAvg(fraction_evaluate=0.0, min_available_nodes=1, min_train_nodes=1,
                              **kwargs)
    strategy.start(grid=grid or InProcessGrid(app, n), initial_arrays=ArrayRecord(
        {"w": Array(np.array([0.0]))}), num_rounds=rounds, train_config=ConfigRecord(),
        evaluate_fn=evaluate_fn)
    return strategy


def _context(node_config):
    set_task_identity()
    return Context(run_id=1, node_id=5, node_config=node_config, state=RecordDict(),
                   run_config={})


def _plain_train(content):
    return Message(RecordDict(content), message_type="train", dst_node_id=5)


def _reply(msg, context):
    return Message(RecordDict({"metrics": MetricRecord({"num-examples": 1})}), reply_to=msg)


# =============================================================================== arguments
@pytest.mark.parametrize("cost", [-0.5, float("nan"), float("inf"), "1"])
def test_a_compute_cost_that_is_not_finite_and_non_negative_is_refused_naming_it(cost):
    with pytest.raises(ValueError, match=rf"^compute_cost_s={cost!r} must be a finite number "
                                         r">= 0$"):
        DeadlineFedAvg(deadline=1.0, compute_cost_s=cost)


@pytest.mark.parametrize("bandwidth", [0, 0.0, -2.0])
def test_an_upload_bandwidth_that_is_not_positive_is_refused(bandwidth):
    expected = f"upload_bandwidth={bandwidth!r} must be > 0 bytes/s or None"
    with pytest.raises(ValueError, match="^" + re.escape(expected) + "$"):
        DeadlineFedAvg(deadline=1.0, upload_bandwidth=bandwidth)


@pytest.mark.parametrize("bandwidth", [0.5, 1.0, 4.0])
def test_the_upload_time_is_the_replys_bytes_over_the_bandwidth(bandwidth):
    """Bandwidths in (0, 1] bytes/s are valid too; 8 and 24 bytes take 8 / b and 24 / b s."""
    strategy = DeadlineFedAvg(deadline=1.0, upload_bandwidth=bandwidth,
                              measured_compute=False)
    assert strategy.upload_bandwidth == bandwidth
    got = strategy.arrivals(1, {11: (0, 0.7, 1, 8), 12: (1, 0.0, 1, 24)})
    assert got == pytest.approx({11: 8 / bandwidth, 12: 24 / bandwidth})


# =============================================================================== arrivals
def test_the_load_comes_from_the_partition_sizes_partition_0_included():
    """sizes 30 (pid 0) and 10 (pid 1), not the replies' 1 and 5 examples: mean 20, loads
    1.5 and 0.5; pid 7 is outside the list: its reply's 40 examples, load 2.0 (mean of
    30, 10, 40 = 80 / 3 in the three-node cohort)."""
    strategy = DeadlineFedAvg(deadline=1.0, partition_sizes=[30, 10], compute_cost_s=2.0,
                              measured_compute=False)
    got = strategy.arrivals(1, {11: (0, 0.0, 1, 0), 12: (1, 0.0, 5, 0)})
    assert got == pytest.approx({11: 2.0 * 1.5, 12: 2.0 * 0.5})
    got = strategy.arrivals(1, {11: (0, 0.0, 1, 0), 12: (1, 0.0, 5, 0), 13: (7, 0.0, 40, 0)})
    mean = 80 / 3
    assert got == pytest.approx({11: 2.0 * 30 / mean, 12: 2.0 * 10 / mean,
                                 13: 2.0 * 40 / mean})


# =============================================================================== the client mod
def test_train_timing_mod_without_a_partition_id_reports_minus_one():
    reply = train_timing_mod(_plain_train({"config": ConfigRecord()}), _context({}), _reply)
    timing = reply.content.config_records[TIMING_KEY]
    assert timing["partition-id"] == -1 and timing["compute-s"] >= 0.0


def test_train_timing_mod_times_a_train_message_without_a_config_record():
    reply = train_timing_mod(_plain_train({}), _context({"partition-id": 2}), _reply)
    assert reply.content.config_records[TIMING_KEY]["partition-id"] == 2


def test_train_timing_mod_seeds_the_handler_from_seed_round_and_partition():
    """The same (seed, round, partition) draws the same whatever the caller's RNG states;
    another round draws otherwise."""
    drawn = []

    def handler(msg, context):
        drawn.append((random.random(), float(np.random.random())))  # noqa: NPY002
        return _reply(msg, context)

    ctx = _context({"partition-id": 3})
    for caller_seed, rnd in ((1, 2), (2, 2), (1, 3)):
        random.seed(caller_seed)
        np.random.seed(caller_seed)  # noqa: NPY002
        train_timing_mod(_plain_train({"config": ConfigRecord({"seed": 4, "server-round": rnd})}),
                         ctx, handler)
    assert drawn[0] == drawn[1]
    assert drawn[0][0] != drawn[2][0] and drawn[0][1] != drawn[2][1]


# =============================================================================== rounds
def test_a_reply_without_the_timing_record_is_refused_with_the_exact_remedy():
    def bare(msg, context):
        return Message(RecordDict({"arrays": ArrayRecord({"w": Array(np.array([1.0]))}),
                                   "metrics": MetricRecord({"num-examples": 1})}),
                       reply_to=msg)

    with pytest.raises(ValueError) as caught:
        _run(bare, 2, 1, deadline=1.0)
    assert re.fullmatch(
        r"the train reply of node \d+ has no 'fl-gradcode-timing' record: DeadlineFedAvg "
        r"needs train_timing_mod in the ClientApp's mods "
        r"\(ClientApp\(mods=\[train_timing_mod, \.\.\.\]\)\)", str(caught.value))


# round 1: arrivals 0.5, 1.0, 3.0, 0.2 with a 2 s deadline: partition 2 dropped, the round
# lasts 2 s; partition 2 is busy until 3 s, so in round 2 (from 2 s) its 0.4 s arrive at
# 1.4 s, the last arrival: round 2 lasts 1.4 s and ends at 3.4 s
COMPUTE = {(0, 1): 0.5, (1, 1): 1.0, (2, 1): 3.0, (3, 1): 0.2,
           (0, 2): 0.1, (1, 2): 0.3, (2, 2): 0.4, (3, 2): 0.2}


def test_each_row_has_the_rounds_own_length_and_the_evaluations_accuracy_and_loss(tmp_path):
    def evaluate_fn(rnd, arrays):
        return MetricRecord({"accuracy": 0.25 * rnd, "loss": 2.0 / max(rnd, 1)})

    strategy = _run(_app(COMPUTE), 4, 2, evaluate_fn=evaluate_fn, deadline=2.0,
                    results_dir=str(tmp_path))
    for rows in (strategy.history, read_rounds(tmp_path)):
        assert [r["round_virtual_s"] for r in rows] == pytest.approx([2.0, 1.4])
        assert [r["virtual_s"] for r in rows] == pytest.approx([2.0, 3.4])
        assert [r["accuracy"] for r in rows] == [0.25, 0.5]
        assert [r["loss"] for r in rows] == [2.0, 1.0]
        assert [r["busy"] for r in rows] == [[], [2]]
        assert [r["num_examples"] for r in rows] == [10 + 30 + 40, 100]


@pytest.mark.parametrize("evaluation", ["none", "returns None", "accuracy only"])
def test_a_missing_evaluation_leaves_accuracy_and_loss_empty(evaluation):
    evaluate_fn = {"none": None, "returns None": lambda rnd, arrays: None,
                   "accuracy only": lambda rnd, arrays: MetricRecord({"accuracy": 0.5})}
    strategy = _run(_app(COMPUTE), 4, 2, evaluate_fn=evaluate_fn[evaluation], deadline=2.0)
    accuracy = 0.5 if evaluation == "accuracy only" else None
    assert [(r["accuracy"], r["loss"]) for r in strategy.history] == [(accuracy, None)] * 2


def test_the_examples_are_read_from_the_strategys_weighted_by_key():
    """weighted_by_key='n': the used replies' n (10 + 30 + 40) and n-weighted model."""
    strategy = _run(_app(COMPUTE, weight_key="n"), 4, 1, deadline=2.0, weighted_by_key="n")
    (row,) = strategy.history
    assert row["clients_used"] == [0, 1, 3] and row["num_examples"] == 80


def test_a_dropped_reply_without_the_weight_key_does_not_stop_the_round():
    """Partition 2 arrives late (3 s > 2 s) with no num-examples: it is dropped before
    FedAvg checks the replies; its examples count as 0."""
    strategy = _run(_app(COMPUTE, unweighted=(2,)), 4, 1, deadline=2.0)
    (row,) = strategy.history
    assert (row["clients_used"], row["stragglers"]) == ([0, 1, 3], [2])
    assert row["num_examples"] == 80


def test_a_reply_from_a_node_not_sent_work_is_not_busy():
    """A reply whose sender id is no node of the round (partition 1's, rewritten to 999)
    has no backlog: it is not busy."""
    grid = InProcessGrid(_app(COMPUTE), 4, src_node_id=lambda i, rnd: 999 if i == 1 else None)
    strategy = _run(None, 4, 1, grid=grid, deadline=2.0)
    (row,) = strategy.history
    assert row["busy"] == [] and row["clients_used"] == [0, 1, 3]


def test_a_rival_built_without_the_shared_keywords_takes_gradient_codings_defaults():
    """No latency model, seed 0, measured compute, no charge per unit of load, no upload
    time: what ``GradientCoding(FedAvg())`` runs with."""
    from flwr.serverapp.strategy import FedAvg

    from fl_gradcode.flower import GradientCoding

    rival = DeadlineFedAvg(deadline=1.0)
    got = (rival.latency, rival.seed, rival.measured_compute, rival.compute_cost_s,
           rival.upload_bandwidth)
    assert got == (None, 0, True, 0.0, None)
    timing = GradientCoding(FedAvg()).options.timing
    assert got == (timing.latency, GradientCoding(FedAvg()).seed, timing.measured_compute,
                   timing.compute_cost_s, timing.upload_bandwidth)
