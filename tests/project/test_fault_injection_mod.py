"""The main job's fault injection: a slow node (node config ``extra-delay-s``) holds back a
plain train message too, so deploy_local's FedAvg baseline meets the slow node its coded run
meets (it used to pass plain messages untouched: the baseline never waited for it)."""

from __future__ import annotations

import time

import numpy as np
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
