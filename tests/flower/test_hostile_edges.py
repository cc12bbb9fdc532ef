"""One hostile or duplicated reply at the edges of the round: it is dropped and counted, the
round goes on, and the model is what the honest replies give (numpy FedAvg oracle)."""

from __future__ import annotations

import logging

import pytest
from flwr.app import MessageType

from fl_gradcode.flower import gradient_coding_mod
from fl_gradcode.flower.protocol import OP_TRAIN, PROTOCOL_KEY, parse_instruction
from fl_gradcode.flower.testing import InProcessGrid
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
