"""The main job's fault injection: a slow node (node config ``extra-delay-s``) holds back a
plain train message too, so deploy_local's FedAvg baseline meets the slow node its coded run
meets (it used to pass plain messages untouched: the baseline never waited for it)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, RecordDict

from tests.flower.messages import node_context


def _plain_train() -> Message:
    content = RecordDict({"arrays": ArrayRecord({"w": Array(np.zeros(3))}),
                          "config": ConfigRecord({})})
    return Message(content, dst_node_id=7, message_type=MessageType.TRAIN)


def test_a_slow_node_holds_back_a_plain_train_message():
    from clients.app import fault_injection_mod

    def reply(msg, context):
        return Message(RecordDict(), reply_to=msg)

    context = node_context({"partition-id": 0, "num-partitions": 3, "extra-delay-s": 0.3})
    start = time.perf_counter()
    out = fault_injection_mod(_plain_train(), context, reply)
    assert time.perf_counter() - start >= 0.3  # a lower bound: slept at least the delay
    assert not out.has_error()


@pytest.mark.parametrize("run_config", ["num-rounds=2 s=1", "timing='virtual' s=1",
                                        "virtual-compute='none'"])
def test_deploy_local_refuses_a_slow_node_the_runs_clock_would_not_see(tmp_path, run_config):
    """Under virtual timing the slow node's sleep is charged only as measured compute: without
    virtual-compute='measured' it ran as fast as the others, the comparison without its
    straggler. Refused before any process starts."""
    from server.deploy_local import run

    with pytest.raises(ValueError, match=r"--slow-node 2 --slow-delay 30.*timing='wallclock'"):
        run(3, run_config, slow_node=2, slow_delay=30.0, workdir=tmp_path / "w")
    assert not (tmp_path / "w").exists()


def test_deploy_local_takes_a_slow_node_its_clock_charges():
    from server.deploy_local import check_slow_node

    check_slow_node("timing='wallclock' latency='none'", 2, 30.0)
    check_slow_node("virtual-compute='measured'", 2, 30.0)
    check_slow_node("num-rounds=2", None, 0.0)
    check_slow_node("num-rounds=2", 2, 0.0)
