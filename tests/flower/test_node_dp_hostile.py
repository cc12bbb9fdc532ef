"""A hostile server against a node with a DP policy, beyond the policy's own fields: what it
names as the weight, who adds the noise under a floor, plain messages past the budget, and
replicas given other partitions or another run config under one ``(nonce, round)``.

Through the public mod API, with the numpy app of ``test_node_dp_policy`` (expected values
from its formulas in numpy, never from the mod)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict

from fl_gradcode.flower.mod import MOD_ERROR_CODE, make_gradient_coding_mod
from tests.flower.test_node_dp_policy import (
    DIM,
    LR,
    NoisyApp,
    _clip,
    _coded,
    _context,
    _inst,
    _message,
    _n,
    _plain_train,
    _raw,
    _target,
)

pytestmark = pytest.mark.filterwarnings("ignore:gradient_coding_mod:UserWarning")


class NormReportingApp(NoisyApp):
    """The numpy app, also reporting its raw update's norm (as the project's app does)."""

    def __call__(self, msg: Message, context: Context) -> Message:
        reply = super().__call__(msg, context)
        pid = int(context.node_config["partition-id"])
        norm = float(np.linalg.norm(LR * (_target(pid) - msg.content["arrays"]["w"].numpy())))
        metrics = MetricRecord({"num-examples": _n(pid), "update-norm": norm})
        return Message(RecordDict({"arrays": reply.content["arrays"], "metrics": metrics}),
                       reply_to=msg)


def _refused(reply: Message) -> str:
    assert reply.has_error() and reply.error.code == MOD_ERROR_CODE, "answered"
    return reply.error.reason


def test_a_server_naming_another_metric_as_the_weight_is_refused(key_file):
    """The weight travels un-noised (partition-sizes, num-examples): a server naming the
    app's update norm as the weight read it in clear under dp='partition'."""
    instruction = dataclasses.replace(_inst(dp="partition", noise_multiplier=5.0),
                                      weight_key="update-norm")
    node = {"dp-key-file": key_file, "dp-required": "partition"}
    app = NormReportingApp()
    reason = _refused(make_gradient_coding_mod()(_message(instruction), _context(**node), app))
    assert "weight-key='update-norm'" in reason and "num-examples" in reason
    assert app.seen == []
    # the node's own weight key (its app's count) is accepted
    node["dp-weight-key"] = "update-norm"
    reply = make_gradient_coding_mod()(_message(instruction), _context(**node), app)
    assert not reply.has_error(), reply.error.reason


def test_a_noise_floor_alone_refuses_central_dp_whose_noise_the_server_adds(key_file):
    """dp='central': the node releases its clipped update and the server adds the noise. A
    floor on the noise is then a promise of the server's; the node released the exact
    n * update (clip-norm 100)."""
    instruction = _inst(dp="central", noise_multiplier=2.0, clip_norm=100.0)
    node = {"dp-key-file": key_file, "dp-min-noise-multiplier": 2.0}
    reason = _refused(make_gradient_coding_mod()(_message(instruction), _context(**node),
                                                 NoisyApp()))
    assert "dp='central'" in reason and "dp-required='central'" in reason
    # consent given: dp-required='central' accepts it
    node["dp-required"] = "central"
    reply = make_gradient_coding_mod()(_message(instruction), _context(**node), NoisyApp())
    np.testing.assert_allclose(_coded(reply), _clip(_raw(1), 100.0 * _n(1)), rtol=1e-9)


def test_plain_messages_cannot_pass_a_release_budget(tmp_path, key_file):
    """A plain train message is not coded, so it is never counted: 200 plain dp='sample'
    messages were answered by a node with dp-max-releases=1 (its DP-SGD noise averaged down
    by sqrt(200)). A budgeted node refuses them."""
    node = {"dp-key-file": key_file, "dp-required": "sample", "dp-min-noise-multiplier": 1.0,
            "dp-max-releases": 1, "dp-state-file": str(tmp_path / "state.jsonl")}
    app = NoisyApp()
    reason = _refused(make_gradient_coding_mod()(_plain_train("sample"), _context(**node), app))
    assert "dp-max-releases=1" in reason and "plain train message" in reason
    assert app.seen == []




class PartitionedApp(NoisyApp):
    """The numpy app whose partition ``j`` of ``N`` holds other data for another ``N`` and
    another run-config ``seed`` (as a partitioner's does)."""

    def __call__(self, msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        num = int(context.node_config["num-partitions"])
        seed = int(context.run_config.get("seed", 0))
        theta = msg.content["arrays"]["w"].numpy()
        target = np.random.default_rng([11, pid, num, seed]).standard_normal(DIM) * 3.0
        new = theta + LR * (target - theta)
        return Message(RecordDict({"arrays": ArrayRecord({"w": Array(new)}),
                                   "metrics": MetricRecord({"num-examples": _n(pid)})}),
                       reply_to=msg)


@pytest.mark.parametrize("change", ["num-partitions", "run-config"])
def test_replicas_given_another_partitioning_draw_independent_noise(key_file, change):
    """Two nodes with one key, one (nonce, round), one model, partition 1 -- but of 3 and of
    4 partitions, or under another run-config seed: other data. With the same keyed noise
    the difference of the releases was the data's difference, noise-free."""
    def release(node_id: int, num: int, seed: int) -> np.ndarray:
        instruction = _inst(dp="partition", noise_multiplier=5.0, clip_norm=1e9,
                            num_partitions=(num,))
        node = {"dp-key-file": key_file, "dp-required": "partition"}
        reply = make_gradient_coding_mod()(
            _message(instruction), _context(node_id, {"seed": seed}, **node), PartitionedApp())
        return _coded(reply) / _n(1)

    other = (4, 0) if change == "num-partitions" else (3, 1)
    a, b = release(101, 3, 0), release(102, *other)
    theta = np.zeros(DIM)
    data_a = LR * (np.random.default_rng([11, 1, 3, 0]).standard_normal(DIM) * 3.0 - theta)
    data_b = LR * (np.random.default_rng([11, 1, *other]).standard_normal(DIM) * 3.0 - theta)
    noise_a, noise_b = a - data_a, b - data_b
    assert np.std(noise_a) == pytest.approx(5.0 * 1e9, rel=0.15)  # noised
    assert abs(np.corrcoef(noise_a, noise_b)[0, 1]) < 0.2  # independent: no cancelling
    # the same partitioning still draws identical noise (exact decoding needs it)
    np.testing.assert_array_equal(release(103, 3, 0), a)


def test_a_budgeted_node_keeps_one_cut_of_its_data(tmp_path, key_file):
    """dp-max-releases counts releases per partition id; the server decides what an id holds
    (num-partitions): partition 0 of 1 and partition 1 of 3 share records. Once a budgeted
    node has released under one cut, another is refused (the ledger records the cut)."""
    node = {"dp-key-file": key_file, "dp-required": "partition", "dp-max-releases": 1,
            "dp-state-file": str(tmp_path / "state.jsonl")}
    mod = make_gradient_coding_mod()

    def ask(rnd: int, pid: int, num: int) -> Message:
        instruction = _inst(round=rnd, dp="partition", noise_multiplier=1.0,
                            partition_ids=(pid,), num_partitions=(num,))
        return mod(_message(instruction), _context(**node), NoisyApp())

    assert not ask(1, 0, 1).has_error()
    reason = _refused(ask(2, 1, 3))
    assert "num-partitions=[3] refused" in reason and "[1] partitions" in reason
    assert '"num-partitions": [1]' in (tmp_path / "state.jsonl").read_text()
