"""One hostile or duplicated reply at the edges of the round: it is dropped and counted, the
round goes on, and the model is what the honest replies give (numpy FedAvg oracle)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from flwr.app import Array, MessageType, MetricRecord

from fl_gradcode.flower import gradient_coding_mod
from fl_gradcode.flower.protocol import OP_TRAIN, PROTOCOL_KEY, parse_instruction
from fl_gradcode.flower.testing import InProcessGrid
from tests.apps import numpy_app
from tests.apps.numpy_app import assert_model, fedavg_rounds, initial_arrays, make_app
from tests.flower.harness import as_dict, fault_mod, run

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _empty_worker_adds_metrics(hit: list[int]):
    """An outer mod: a worker sent no partition (partition-sizes [0]) adds one per-partition
    metric, as many entries as its partition-sizes."""

    def mod(msg, context, call_next):
        reply = call_next(msg, context)
        if msg.metadata.message_type != MessageType.TRAIN or reply.has_error():
            return reply
        instruction = parse_instruction(msg.content)
        if instruction is None or instruction.op != OP_TRAIN or instruction.partition_ids:
            return reply
        reply.content[PROTOCOL_KEY + "-meta"]["partition-metric.train_loss"] = [1.0]
        hit.append(instruction.worker)
        return reply

    return mod


def test_per_partition_metrics_from_a_worker_without_partitions_are_rejected_not_a_crash():
    """bgc at n = 4, s = 1 leaves a worker with no partition: its reply, with one metric
    entry beside its partition-sizes [0], used to end the run in the metric aggregation."""
    honest = run(4, code="bgc", s=1, rounds=2)
    hit: list[int] = []
    grid = InProcessGrid(make_app(_empty_worker_adds_metrics(hit), gradient_coding_mod), 4)
    hostile = run(4, code="bgc", s=1, rounds=2, grid=grid)
    assert hit, "the code left no worker without a partition: the test checks nothing"
    assert len(set(hit)) == 1 and len(hit) == 2  # one such worker, sent work in both rounds
    assert [r["rejected"] for r in hostile.rows] == [r["rejected"] + 1 for r in honest.rows]
    assert all(any("partition-metric.train_loss" in why for why in r["rejected_reasons"])
               for r in hostile.rows)
    assert [r["decode"] for r in hostile.rows] == [r["decode"] for r in honest.rows]
    if all(r["decode"] == "exact" for r in hostile.rows):
        expected = fedavg_rounds(as_dict(initial_arrays()), 2, 4)
        assert_model(hostile.models[2], expected)


def test_a_duplicated_error_reply_is_one_offence_not_two(caplog):
    """verify=True: a node's app fails once (round 1) and the error reply arrives twice. The
    rule is two offences within ten rounds, so no quarantine follows and rounds 2 and 3 are
    exact (FedAvg over every partition)."""
    grid = InProcessGrid(make_app(fault_mod({(0, 1): "error"}), gradient_coding_mod), 4,
                         duplicate=lambda i, r: i == 0 and r == 1)
    with caplog.at_level(logging.INFO, logger="flwr"):
        result = run(4, code="frc", s=1, rounds=3, grid=grid, verify=True)
    assert [r["quarantined"] for r in result.rows] == [[], [], []]
    assert [r["decode"] for r in result.rows[1:]] == ["exact", "exact"]
    assert_model(result.models[3], fedavg_rounds(result.models[1], 2, 4))


def _worker_0_reports_losses(value):
    """An outer mod: worker 0 reports ``value`` as each of its partitions' train loss (1e308;
    or 10**400, which a MetricRecord takes in process and no float holds)."""

    def mod(msg, context, call_next):
        reply = call_next(msg, context)
        if msg.metadata.message_type != MessageType.TRAIN or reply.has_error():
            return reply
        instruction = parse_instruction(msg.content)
        if instruction is None or instruction.op != OP_TRAIN or instruction.worker != 0:
            return reply
        meta = reply.content[PROTOCOL_KEY + "-meta"]
        meta["partition-metric.train_loss"] = [value] * len(instruction.partition_ids)
        return reply

    return mod


@pytest.mark.parametrize("verify", [False, True])
def test_one_replica_against_another_does_not_decide_a_partitions_train_metrics(caplog,
                                                                                verify):
    """frc n = 6, s = 1: worker 0 and its one replica report different losses for the same
    partitions. One against one is no majority: the liar's value (here the lower worker
    index) must not become the round's train_loss."""
    honest = run(6, code="frc", s=1, rounds=1, verify=verify)
    grid = InProcessGrid(make_app(_worker_0_reports_losses(1e308), gradient_coding_mod), 6)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        hostile = run(6, code="frc", s=1, rounds=1, grid=grid, verify=verify)
    reference = honest.result.train_metrics_clientapp[1]["train_loss"]
    got = hostile.result.train_metrics_clientapp[1]["train_loss"]
    assert 0 < reference < 1e6
    assert 0 < got < 10 * reference, got
    assert any("no majority" in r.getMessage() for r in caplog.records)


def test_a_metric_no_float_can_hold_is_a_rejected_reply_not_a_crash():
    grid = InProcessGrid(make_app(_worker_0_reports_losses(10**400), gradient_coding_mod), 6)
    hostile = run(6, code="frc", s=1, rounds=2, grid=grid)
    assert [r["rejected"] for r in hostile.rows] == [1, 1]
    assert all("partition-metric.train_loss" in r["rejected_reasons"][0] for r in hostile.rows)
    assert [r["decode"] for r in hostile.rows] == ["exact", "exact"]
    assert_model(hostile.models[2], fedavg_rounds(as_dict(initial_arrays()), 2, 6))


def test_a_late_replys_compute_time_no_float_can_hold_counts_as_none():
    from flwr.app import Message, MetricRecord, RecordDict

    from fl_gradcode.flower.collector import claimed_compute_s

    meta = MetricRecord({"compute-s": 10**400})
    reply = Message(RecordDict({PROTOCOL_KEY + "-meta": meta}), dst_node_id=1,
                    message_type=MessageType.TRAIN)
    assert claimed_compute_s(reply) == 0.0


def _claims_its_partitions_empty(worker: int):
    """An outer mod: ``worker`` replies zero arrays, partition-sizes 0 and num-examples 0 for
    the partitions it was sent, and adds one train metric per partition, where the app itself
    reports no train metric (only num-examples)."""

    def mod(msg, context, call_next):
        reply = call_next(msg, context)
        if msg.metadata.message_type != MessageType.TRAIN or reply.has_error():
            return reply
        instruction = parse_instruction(msg.content)
        if instruction is None or instruction.op != OP_TRAIN or instruction.worker != worker:
            return reply
        arrays = reply.content[PROTOCOL_KEY]
        for name in list(arrays.keys()):
            arrays[name] = Array(np.zeros_like(arrays[name].numpy()))
        meta = reply.content[PROTOCOL_KEY + "-meta"]
        parts = len(instruction.partition_ids)
        meta["partition-sizes"] = [0.0] * parts
        meta["num-examples"] = 0.0
        meta["partition-metric.loss"] = [5.0] * parts
        return reply

    return mod


def _train_without_metrics(msg, context):
    reply = numpy_app.train(msg, context)
    reply.content["metrics"] = MetricRecord(
        {"num-examples": reply.content["metrics"]["num-examples"]})
    return reply


@pytest.mark.parametrize("code", ["uncoded", "frc"])
@pytest.mark.parametrize("inner", ["FedAvg", "FedAdam"])
def test_a_reply_claiming_empty_partitions_with_a_train_metric_does_not_end_the_run(code,
                                                                                    inner):
    """s = 0: the only train metric of the round comes from worker 0, whose partitions it
    claims hold no example (weight 0). The metric aggregation used to divide by that total
    weight and end the run; the round goes on, the model is the one the other partitions give
    (numpy FedAvg over them: a claimed-empty partition weighs nothing), and the train metrics
    hold no value weighted by nothing."""
    from flwr.clientapp import ClientApp
    from flwr.serverapp.strategy import FedAdam, FedAvg

    app = ClientApp(mods=[_claims_its_partitions_empty(0), gradient_coding_mod])
    app.train()(_train_without_metrics)
    app.evaluate()(numpy_app.evaluate)
    strategy = (FedAvg(fraction_evaluate=0.0) if inner == "FedAvg"
                else FedAdam(fraction_evaluate=0.0))
    result = run(4, code=code, s=0, rounds=1, grid=InProcessGrid(app, 4), inner=strategy)
    assert result.rows and result.rows[0]["decode"] == "exact"
    assert "loss" not in (result.result.train_metrics_clientapp.get(1) or {})
    if inner == "FedAvg":  # FedAdam's step is not the average: the run going on is the point
        assert_model(result.models[1],
                     numpy_app.fedavg(as_dict(initial_arrays()), [1, 2, 3], 4))


@pytest.mark.parametrize("sender, charged", [(999_999, False), (1, True)])
def test_an_error_reply_speaks_for_another_node_only_when_the_superlink_wrote_it(sender,
                                                                                 charged):
    """verify=True, frc n = 4, s = 1, three rounds: each round an error reply answering
    worker 0's message arrives beside the honest replies. From a node outside the round it
    is that node's, not worker 0's: worker 0 is not quarantined and every round is exact
    (FedAvg over every partition). Written by the SuperLink (sender id 1) it is worker 0's
    failure: two within ten rounds quarantine its node."""
    from flwr.app import ConfigRecord, Error, Message
    from flwr.serverapp.strategy import FedAvg

    from fl_gradcode.flower import GradientCoding

    strategy = GradientCoding(FedAvg(fraction_evaluate=0.0), code="frc", s=1, seed=0,
                              measured_compute=False, verify=True)
    grid = InProcessGrid(make_app(gradient_coding_mod), 4)
    arrays = initial_arrays()
    for server_round in (1, 2, 3):
        messages = list(strategy.configure_train(server_round, arrays,
                                                 ConfigRecord({"lr": numpy_app.LR}), grid))
        replies = list(grid.send_and_receive(messages, timeout=60))
        to_0 = [m for m in messages if parse_instruction(m.content).worker == 0]
        for message in to_0:  # none once worker 0 is quarantined
            forged = Message(Error(code=0, reason="boom"), reply_to=message)
            forged.metadata.__dict__["_src_node_id"] = sender
            forged.metadata.__dict__["_message_id"] = f"forged-{server_round}"
            replies.insert(0, forged)
        arrays, _ = strategy.aggregate_train(server_round, replies)
    quarantined = [row["quarantined"] for row in strategy.history]
    if charged:
        assert quarantined == [[], [], [grid.node_ids[0]]]
    else:
        assert quarantined == [[], [], []]
        assert [row["decode"] for row in strategy.history] == ["exact"] * 3
        assert_model(as_dict(arrays), fedavg_rounds(as_dict(initial_arrays()), 3, 4))
