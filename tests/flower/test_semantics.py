"""What a user's strategy, mods and options mean is kept, or the user is told.

* Train metrics: the inner strategy's ``train_metrics_aggr_fn`` sees each partition's own
  metrics and weight (a max over partitions stays a max), references computed here from the
  numpy app's targets.
* Virtual timing: a node that hangs becomes a straggler after a bounded real wait, named in a
  WARNING.
* Rounds applied above the stated decode error are named in a WARNING.
* Failure reasons are readable text (``Type: message``), never a coloured repr.
"""

from __future__ import annotations

import logging
import math
import time

import numpy as np
import pytest
from flwr.app import MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg, FedAvgM

from fl_gradcode.flower import gradient_coding_mod
from fl_gradcode.flower.testing import InProcessGrid
from tests.apps.numpy_app import SHAPES, initial_arrays, make_app, target
from tests.flower.harness import DevicesOff, FixedArrivals, run

pytestmark = [
    pytest.mark.filterwarnings("ignore:gradient_coding_mod. no partition key:UserWarning"),
]


# =============================================================================== train metrics
def max_loss(records: list[RecordDict], weighting_key: str) -> MetricRecord:
    """Opacus' example style: the largest value over the replies (here: the largest loss), and
    how many replies the aggregator saw."""
    losses = [float(next(iter(r.metric_records.values()))["train_loss"]) for r in records]
    weights = [float(next(iter(r.metric_records.values()))[weighting_key]) for r in records]
    return MetricRecord({"max_loss": max(losses), "seen": len(records),
                         "weight": float(sum(weights))})


def partition_loss(partition: int) -> float:
    """The numpy app's train loss of ``partition`` from the initial model (computed here)."""
    theta = {name: np.asarray(arr.numpy()) for name, arr in initial_arrays().items()}
    return float(sum(np.sum((theta[name] - target(partition, name)) ** 2) for name in SHAPES))


@pytest.mark.parametrize("inner_cls", [FedAvg, FedAvgM], ids=["FedAvg", "FedAvgM"])
def test_a_max_metric_aggregator_sees_each_partition_once(inner_cls):
    n = 4
    inner = inner_cls(fraction_evaluate=0.0, train_metrics_aggr_fn=max_loss)
    # worker 3 straggles: the decodable set is workers 0..2 (FRC s=1: replicas of each group)
    times = {1: [1.0, 2.0, 3.0, 9.0]}
    out = run(n, code="frc", s=1, inner=inner, latency=FixedArrivals(times))
    metrics = out.result.train_metrics_clientapp[1]
    expected = max(partition_loss(j) for j in range(n))
    assert metrics["max_loss"] == pytest.approx(expected, rel=1e-12)
    assert metrics["seen"] == n  # one record per partition, not per reply
    assert metrics["weight"] == pytest.approx(sum(10 + j for j in range(n)))


def test_the_default_mean_aggregator_is_unchanged():
    n = 4
    out = run(n, code="crc", s=1)
    metrics = out.result.train_metrics_clientapp[1]
    weights = np.array([10 + j for j in range(n)], dtype=float)
    losses = np.array([partition_loss(j) for j in range(n)])
    assert metrics["train_loss"] == pytest.approx(float(weights @ losses / weights.sum()))


# =============================================================================== failure reasons
#: What Flower's simulation engine writes for a ClientApp that raised under Ray 2.55
#: (``str(type(ex)) + ":<'" + str(ex) + "'>"`` of a real ``RayTaskError``, built with
#: ``ray.exceptions.RayTaskError(...).as_instanceof_cause()``), colour escapes included.
RAY_REASON = (
    "<class 'ray.exceptions.RayTaskError(ClientAppException)'>:<'\x1b[36mray::ClientAppActor"
    ".run()\x1b[39m (pid=4242, ip=127.0.0.1, actor_id=None, repr=<flwr.simulation.ray_transport"
    ".ray_actor.ClientAppActor object at 0x7f>)\n  File \"task.py\", line 7, in train\n  File "
    "\"task.py\", line 4, in load\nValueError: bad batch: expected 32 rows, got 31\n\nThe above "
    "exception was the direct cause of the following exception:\n\n\x1b[36mray::ClientAppActor"
    ".run()\x1b[39m (pid=4242, ip=127.0.0.1, actor_id=None, repr=<flwr.simulation.ray_transport"
    ".ray_actor.ClientAppActor object at 0x7f>)\n  File \"ray_actor.py\", line 64, in run\n"
    "flwr.clientapp.client_app.ClientAppException: \nException ClientAppException occurred. "
    "Message: bad batch: expected 32 rows, got 31'>"
)


def ray_crash_mod(worker: int, reason: str = RAY_REASON):
    """An OUTER mod: worker ``worker``'s train message gets the simulation engine's error."""
    from flwr.app import Error, Message, MessageType

    from fl_gradcode.flower.protocol import OP_TRAIN, parse_instruction

    def mod(msg, context, call_next):
        if msg.metadata.message_type == MessageType.TRAIN:
            instruction = parse_instruction(msg.content)
            if (instruction is not None and instruction.op == OP_TRAIN
                    and instruction.worker == worker):
                return Message(Error(code=2, reason=reason), reply_to=msg)
        return call_next(msg, context)

    return mod


def test_a_crashed_nodes_reason_is_type_and_message_in_logs_and_rounds_jsonl(tmp_path, caplog):
    import json

    grid = InProcessGrid(make_app(ray_crash_mod(1), gradient_coding_mod), 4)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        run(4, code="frc", s=1, grid=grid, results_dir=str(tmp_path))
    (row,) = [json.loads(line) for line in (tmp_path / "rounds.jsonl").read_text().splitlines()]
    assert row["rejected_reasons"] == [
        "error reply (code 2: ValueError: bad batch: expected 32 rows, got 31)"]
    logged = [r.getMessage() for r in caplog.records if "rejected reply" in r.getMessage()]
    assert len(logged) == 1
    assert logged[0].endswith("error reply (code 2: ValueError: bad batch: expected 32 rows, "
                              "got 31)")
    for text in (*row["rejected_reasons"], *logged):
        assert "\x1b" not in text and "\\x1b" not in text and "<class" not in text
    debug = (tmp_path / "debug.log").read_text()  # the full text, escapes stripped
    assert "The above exception was the direct cause" in debug and "\\x1b" not in debug


# =============================================================================== decode error
def test_a_round_applied_above_the_stated_decode_error_is_named_in_a_warning(caplog):
    threshold = 0.1  # the documented threshold (docs/works_with.md)
    # FRC n=4, s=1: workers 0 and 1 (one group) miss the deadline: half the partitions lost
    with caplog.at_level(logging.WARNING, logger="flwr"):
        out = run(4, code="frc", s=1, latency=FixedArrivals({1: [20.0, 20.0, 1.0, 1.0]}),
                  straggler_timeout=10.0)
    assert out.rows[0]["decode"] == "approx"
    error = out.rows[0]["decode_error"]
    assert error > threshold
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
              and "decoding with relative error" in r.getMessage()]
    assert len(warned) == 1
    assert warned[0].startswith("round 1: ")
    assert f"{error:.3g}" in warned[0] and f"above {threshold:.3g}" in warned[0]
    assert "max_decode_error=0.5" in warned[0]


def test_an_exact_round_is_not_warned_about(caplog):
    with caplog.at_level(logging.WARNING, logger="flwr"):
        out = run(4, code="frc", s=1, latency=FixedArrivals({1: [20.0, 1.0, 1.0, 1.0]}),
                  straggler_timeout=10.0)
    assert out.rows[0]["decode"] == "exact"
    assert not any("decoding with relative error" in r.getMessage() for r in caplog.records)


# =============================================================================== devices off
def test_a_round_that_cannot_decode_ends_when_its_missing_devices_are_reported_off():
    """FRC n=4, s=1: workers 0 and 1 (one group) are off; the server hears so at 3 s and 4 s
    (Flower's NODE_UNAVAILABLE): nothing more can arrive, so the round decodes approximately
    then instead of waiting for its 10 s deadline."""
    off = DevicesOff({1: [math.inf, math.inf, 1.0, 1.0]}, {1: {0: 3.0, 1: 4.0}})
    out = run(4, code="frc", s=1, latency=off, straggler_timeout=10.0)
    assert out.rows[0]["decode"] == "approx"
    assert out.rows[0]["round_virtual_s"] == pytest.approx(4.0)
    # one of them reported only after the deadline: the round waits for the deadline
    late = DevicesOff({1: [math.inf, math.inf, 1.0, 1.0]}, {1: {0: 3.0, 1: 12.0}})
    out = run(4, code="frc", s=1, latency=late, straggler_timeout=10.0)
    assert out.rows[0]["round_virtual_s"] == pytest.approx(10.0)


def test_coded_rounds_read_the_devices_at_their_start_time():
    """FRC n=4, s=1 on FedScale devices, 1 s per unit of load (worker 3's device twice as
    fast, on 0-3 s of its cycle only): rounds end at group 0's first reply, 21/11.5 s (its
    partitions' examples over a client's share). Rounds 1 and 2 start at 0 and 1.83 s and
    worker 3 replies in both (its job of 25/11.5 x 0.5 s ends by 2.9 s); round 3 starts at
    3.65 s, its device off: worker 2 replies for the group. (Read at round x 60 s, as it used
    to be, worker 3 was off from round 1.)"""
    from fl_gradcode.devices import DeviceTrace

    capacity = {w + 1: {"computation": 1000.0 * sec / 3, "communication": 1.0}
                for w, sec in enumerate([1.0, 1.0, 1.0, 0.5])}
    behave = {4: {"active": [0.0], "inactive": [3.0], "finish_time": 1000.0}}
    out = run(4, code="frc", s=1, rounds=3, latency=DeviceTrace(capacity, behave, round_s=60.0),
              straggler_timeout=100.0)
    assert [3 in row["clients_used"] for row in out.rows] == [True, True, False]
    assert 2 in out.rows[2]["clients_used"] and 3 in out.rows[2]["stragglers"]
    assert [row["decode"] for row in out.rows] == ["exact"] * 3
    assert out.rows[1]["virtual_s"] == pytest.approx(2 * 21 / 11.5)


def test_a_worker_reported_off_is_busy_until_the_report():
    """FRC n=4, s=1: worker 0 is off in round 1, heard of at 3 s; every round decodes at
    1 s without it. Until the report its message is outstanding, as in Flower, so a fixed
    code (which skips busy workers) skips it in rounds 2 and 3 (starting at 1 s and 2 s) and
    has it back in round 4 (starting at 3 s); it used to be free at round 1's end, before the
    server could know."""
    times = {1: [math.inf, 1.0, 1.0, 1.0], **{r: [1.0] * 4 for r in (2, 3, 4)}}
    off = DevicesOff(times, {1: {0: 3.0}, 2: {}, 3: {}, 4: {}})
    out = run(4, code="frc", s=1, rounds=4, latency=off, straggler_timeout=10.0)
    assert [r["round_virtual_s"] for r in out.rows] == pytest.approx([1.0] * 4)
    assert [r["busy"] for r in out.rows] == [[], [0], [0], []]


# =============================================================================== hung nodes
def test_a_hung_node_is_a_straggler_after_a_bounded_real_wait_in_virtual_timing(caplog):
    hung = 3  # partition 3's node answers only after a minute of real time

    def sleeps(partition: int, server_round: int) -> float:
        return 60.0 if partition == hung and server_round >= 1 else 0.0

    grid = InProcessGrid(make_app(gradient_coding_mod), 4, delay=sleeps)
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="flwr"):
        out = run(4, code="frc", s=1, grid=grid, straggler_timeout=1.0, round_timeout=30.0)
    wall = time.monotonic() - t0
    assert wall < 10.0  # not round_timeout (30 s), nor the node's 60 s
    (row,) = out.rows
    assert row["decode"] == "exact"  # FRC s=1 tolerates the one hung node
    assert row["nodes"]["stragglers"] == [grid.node_ids[hung]]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
              and "taken for hung" in r.getMessage()]
    assert len(warned) == 1 and str(grid.node_ids[hung]) in warned[0]


def test_a_malformed_per_partition_metric_list_rejects_that_reply_only():
    from flwr.app import MessageType

    from fl_gradcode.flower.protocol import OP_TRAIN, PROTOCOL_KEY, parse_instruction

    def short_list_mod(msg, context, call_next):
        reply = call_next(msg, context)
        if msg.metadata.message_type == MessageType.TRAIN and not reply.has_error():
            instruction = parse_instruction(msg.content)
            if instruction is not None and instruction.op == OP_TRAIN and instruction.worker == 2:
                meta = reply.content[PROTOCOL_KEY + "-meta"]
                meta["partition-metric.train_loss"] = [1.0, 2.0, 3.0, 4.0, 5.0]
        return reply

    grid = InProcessGrid(make_app(short_list_mod, gradient_coding_mod), 4)
    out = run(4, code="frc", s=1, grid=grid, inner=FedAvg(fraction_evaluate=0.0,
                                                           train_metrics_aggr_fn=max_loss))
    (row,) = out.rows
    assert row["decode"] == "exact" and row["rejected"] == 1
    assert "partition-metric.train_loss" in row["rejected_reasons"][0]
    metrics = out.result.train_metrics_clientapp[1]
    assert metrics["max_loss"] == pytest.approx(max(partition_loss(j) for j in range(4)))


def per_class_mod(msg, context, call_next):
    """The app also reports a list-valued train metric (Flower's MetricRecord holds lists of
    numbers): one value per 'class', partition-dependent."""
    reply = call_next(msg, context)
    if msg.metadata.message_type == "train" and not reply.has_error():
        pid = int(context.node_config["partition-id"])
        reply.content["metrics"]["per-class"] = [1.0, float(pid), 0.5 * pid]
        reply.content["metrics"]["counts"] = [pid, 2]
    return reply


@pytest.mark.parametrize("code", ["frc", "crc"])
def test_list_valued_train_metrics_aggregate_as_flowers_fedavg_does(code):
    """A list-valued metric reaches the inner strategy's metric aggregation: the coded run's
    train metrics are those of Flower's FedAvg over the same uncoded app (element by element,
    example-weighted)."""
    from flwr.app import ConfigRecord

    from tests.apps.numpy_app import LR

    n = 4
    plain = FedAvg(fraction_evaluate=0.0).start(
        grid=InProcessGrid(make_app(per_class_mod), n), initial_arrays=initial_arrays(),
        num_rounds=1, train_config=ConfigRecord({"lr": LR}))
    expected = plain.train_metrics_clientapp[1]
    grid = InProcessGrid(make_app(gradient_coding_mod, per_class_mod), n)
    out = run(n, code=code, s=1, grid=grid)
    assert out.rows[0]["decode"] == "exact"
    got = out.result.train_metrics_clientapp[1]
    for key in ("per-class", "counts"):
        assert got[key] == pytest.approx(expected[key], rel=1e-12), key


@pytest.mark.parametrize("key, value", [
    ("partition-metric-list.9.per-class", [1.0]),      # no such partition in the reply
    ("partition-metric-list.0.per-class", [float("nan")]),
    ("partition-metric-list.x.per-class", [1.0]),
    ("partition-metric-list.0.per-class", []),
])
def test_a_malformed_list_metric_rejects_that_reply_only(key, value):
    from flwr.app import MessageType

    from fl_gradcode.flower.protocol import OP_TRAIN, PROTOCOL_KEY, parse_instruction

    def hostile_mod(msg, context, call_next):
        reply = call_next(msg, context)
        if msg.metadata.message_type == MessageType.TRAIN and not reply.has_error():
            instruction = parse_instruction(msg.content)
            if instruction is not None and instruction.op == OP_TRAIN and instruction.worker == 2:
                reply.content[PROTOCOL_KEY + "-meta"][key] = value
        return reply

    grid = InProcessGrid(make_app(hostile_mod, gradient_coding_mod, per_class_mod), 4)
    out = run(4, code="frc", s=1, grid=grid)
    (row,) = out.rows
    assert row["decode"] == "exact" and row["rejected"] == 1
    assert "partition-metric-list." in row["rejected_reasons"][0]
    assert len(out.result.train_metrics_clientapp[1]["per-class"]) == 3


def test_list_metrics_of_different_lengths_are_left_out_not_the_end_of_the_run(caplog):
    """Partitions whose list metric differ in length (an app whose classes differ per
    partition, or one hostile reply): Flower's metric average cannot take them; the metric is
    left out of the round's aggregation with a warning, the other metrics and the model go on
    (the run ended with a ValueError)."""
    def varying_mod(msg, context, call_next):
        reply = call_next(msg, context)
        if msg.metadata.message_type == "train" and not reply.has_error():
            pid = int(context.node_config["partition-id"])
            reply.content["metrics"]["per-class"] = [1.0] * (2 + pid % 2)
            reply.content["metrics"]["extra"] = float(pid)
        return reply

    grid = InProcessGrid(make_app(gradient_coding_mod, varying_mod), 4)
    out = run(4, code="frc", s=1, rounds=2, grid=grid)
    assert [row["decode"] for row in out.rows] == ["exact", "exact"]
    metrics = out.result.train_metrics_clientapp[2]
    assert "per-class" not in metrics
    assert metrics["extra"] == pytest.approx(sum(j * (10 + j) for j in range(4))
                                             / sum(10 + j for j in range(4)))
    assert "per-class" in caplog.text and "left out" in caplog.text
