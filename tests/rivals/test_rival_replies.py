"""The synchronous rivals and FedBuff against replies a deployment can send them: the
SuperLink's own error for a node that is gone (its sender is the SuperLink, not the node),
arrays of another dtype, metrics laid out otherwise, a node without a partition id, and a bad
evaluate reply. None of them crashes a round, changes the model's dtype or keeps a node busy
that answered. Models against numpy FedAvg (tests/apps/numpy_app.py)."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode

from fl_gradcode.flower.deadline import TIMING_KEY
from fl_gradcode.flower.testing import InProcessGrid
from fl_gradcode.latency import ShiftedExponential
from fl_gradcode.rivals import DeadlineFedAvg, FedBuff, FirstK, WaitForAll, train_timing_mod
from tests.apps import numpy_app
from tests.apps.numpy_app import LR, as_dict, fedavg, initial_arrays, make_app
from tests.flower.harness import FixedArrivals

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
TABLE = {r: [0.5, 1.0, 0.7, 0.9] for r in range(1, 12)}


def _deadline(**kw):
    return DeadlineFedAvg(deadline=30.0, latency=kw.pop("latency", FixedArrivals(TABLE)),
                          measured_compute=False, fraction_evaluate=kw.pop("fraction_evaluate",
                                                                           0.0),
                          min_available_nodes=1, min_train_nodes=kw.pop("nodes", 3), **kw)


def _wait_for_all(nodes=3):
    return WaitForAll(latency=FixedArrivals(TABLE), measured_compute=False,
                      fraction_evaluate=0.0, min_available_nodes=1, min_train_nodes=nodes)


def _start(strategy, app, rounds, n=3, grid=None, initial=None):
    models = {}
    result = strategy.start(grid=grid or InProcessGrid(app, n),
                            initial_arrays=initial or initial_arrays(), num_rounds=rounds,
                            train_config=ConfigRecord({"lr": LR}),
                            evaluate_fn=lambda r, a: models.__setitem__(r, as_dict(a)))
    return models, result


def _tamper(change, partition):
    inner = make_app(train_timing_mod)

    def app(msg, context):
        reply = inner(msg, context)
        if int(context.node_config["partition-id"]) == partition and not reply.has_error():
            change(reply)
        return reply

    return app


def _assert_fedavg(models, kept, n, round_=1):
    expected = fedavg(as_dict(initial_arrays()), kept, n)
    for name, value in expected.items():
        np.testing.assert_allclose(models[round_][name], value, rtol=1e-6, atol=1e-9)


# ------------------------------------------------------------ the SuperLink's own error
class _GoneNodes(InProcessGrid):
    """The SuperLink answers the messages of the nodes of partitions ``gone[r]`` in round
    ``r`` with NODE_UNAVAILABLE, sent from the SuperLink's id (as Flower's LinkState does)."""

    def __init__(self, app, n, gone):
        super().__init__(app, n)
        self.gone = gone

    def _run(self, msg):
        partition = self.index[msg.metadata.dst_node_id]
        if partition in self.gone.get(int(msg.content["config"]["server-round"]), ()):
            reply = Message(Error(ErrorCode.NODE_UNAVAILABLE, "node unavailable"), reply_to=msg)
            reply.metadata.__dict__["_src_node_id"] = SUPERLINK_NODE_ID
            return reply
        return super()._run(msg)


@pytest.mark.parametrize("make", [_wait_for_all, _deadline])
def test_the_superlinks_unavailable_error_answers_the_node_it_is_about(make):
    """Round 1: the nodes of partitions 1 and 2 are gone. Both errors count (two rejected),
    the round ends at the last live reply (0.9 s), not at the deadline, and in round 2 the
    nodes are back and not busy with a job that does not exist."""
    app = make_app(train_timing_mod)
    strategy = make(nodes=4)
    models, _ = _start(strategy, app, 2, n=4, grid=_GoneNodes(app, 4, {1: (1, 2)}))
    first, second = strategy.history
    assert first["rejected"] == 2
    assert first["clients_used"] == [0, 3]
    assert first["round_virtual_s"] == pytest.approx(0.9)
    assert second["busy"] == [] and second["clients_used"] == [0, 1, 2, 3]
    assert second["round_virtual_s"] == pytest.approx(1.0)
    _assert_fedavg(models, [0, 3], 4)


# ------------------------------------------------------------------ dtypes
def _dtype(kind):
    def change(reply):
        arrays = {k: v.numpy() for k, v in reply.content["arrays"].items()}
        if kind == "str":
            arrays = {k: v.astype(str) for k, v in arrays.items()}
        elif kind == "complex":
            arrays = {k: v.astype(np.complex128) for k, v in arrays.items()}
        elif kind == "timedelta":
            arrays = {k: v.astype("m8[ns]") for k, v in arrays.items()}
        else:
            arrays = {k: v.astype(kind) for k, v in arrays.items()}
        reply.content["arrays"] = ArrayRecord({k: Array(v) for k, v in arrays.items()})

    return change


@pytest.mark.parametrize("kind", ["str", "complex", "timedelta", "float16", "int64", "bool"])
@pytest.mark.parametrize("partition", [0, 2])
def test_a_reply_whose_arrays_cannot_hold_the_model_is_rejected(kind, partition):
    """The model is float32; a reply of another kind, or a float too narrow for it, is
    rejected with the dtype named; the others are averaged and the model stays float32."""
    initial = ArrayRecord({k: Array(v.numpy().astype(np.float32))
                           for k, v in initial_arrays().items()})
    for make in (_deadline, lambda: FedBuff(buffer_size=2, concurrency=3,
                                            latency=FixedArrivals(TABLE),
                                            measured_compute=False)):
        strategy = make()
        _, result = _start(strategy, _tamper(_dtype(kind), partition), 2, initial=initial)
        assert {v.numpy().dtype for v in result.arrays.values()} == {np.dtype(np.float32)}
        assert sum(row["rejected"] for row in strategy.history) >= 1
        if isinstance(strategy, DeadlineFedAvg):
            kept = [p for p in range(3) if p != partition]
            assert strategy.history[0]["clients_used"] == kept


def test_a_wider_float_reply_is_averaged_and_the_model_keeps_its_dtype():
    initial = ArrayRecord({k: Array(v.numpy().astype(np.float32))
                           for k, v in initial_arrays().items()})
    strategy = _deadline()
    models, result = _start(strategy, _tamper(_dtype("float64"), 0), 1, initial=initial)
    assert strategy.history[0]["rejected"] == 0
    assert {v.numpy().dtype for v in result.arrays.values()} == {np.dtype(np.float32)}
    _assert_fedavg(models, [0, 1, 2], 3)


# ------------------------------------------------------------------ metric layouts
def _list_loss(reply):
    reply.content["metrics"]["train_loss"] = [1.0, 2.0]


@pytest.mark.parametrize("partition", [0, 2])
@pytest.mark.parametrize("make", [
    _deadline, _wait_for_all,
    lambda: FirstK(k=2, overcommit=1.5, latency=FixedArrivals(TABLE), measured_compute=False,
                   fraction_evaluate=0.0, min_available_nodes=1),
])
def test_a_metric_laid_out_otherwise_than_most_replies_is_rejected_not_a_crash(make,
                                                                               partition):
    """One reply's train_loss is a list where the others' is a number (Flower's metric
    average raises on the mix): that reply is rejected, the round goes on."""
    strategy = make()
    _start(strategy, _tamper(_list_loss, partition), 2)
    assert len(strategy.history) == 2
    assert strategy.history[0]["rejected"] == 1 or partition not in \
        strategy.history[0]["clients_used"] + strategy.history[0]["stragglers"]
    assert all(partition not in row["clients_used"] for row in strategy.history)


# ------------------------------------------------------------------ no partition id
def _no_partition(reply):
    reply.content.config_records[TIMING_KEY]["partition-id"] = -1


def test_a_node_without_a_partition_id_is_timed_by_its_rank_not_a_crash():
    """train_timing_mod reports -1 for a node config without partition-id: DeadlineFedAvg
    times such a node by its rank among the node ids (as FedBuff does); an id below -1 is a
    rejected reply."""
    strategy = _deadline(latency=ShiftedExponential())
    models, _ = _start(strategy, _tamper(_no_partition, 1), 1)
    assert strategy.history[0]["rejected"] == 0
    assert strategy.history[0]["clients_used"] == [0, 1, 2]
    _assert_fedavg(models, [0, 1, 2], 3)

    def below(reply):
        reply.content.config_records[TIMING_KEY]["partition-id"] = -3

    strategy = _deadline(latency=ShiftedExponential())
    models, _ = _start(strategy, _tamper(below, 1), 1)
    assert strategy.history[0]["rejected"] == 1
    _assert_fedavg(models, [0, 2], 3)


# ------------------------------------------------------------------ evaluate replies
def _evaluate(msg, context):
    if int(context.node_config["partition-id"]) == 0:
        metrics = {"eval_loss": [1.0, 2.0], "num-examples": 10}
    else:
        metrics = {"eval_loss": float(context.node_config["partition-id"]), "num-examples": 10}
    return Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)


def test_a_malformed_evaluate_reply_is_left_out_not_a_crash():
    """Client-side evaluation: partition 0's eval_loss is a list, the others' a number. The
    run goes on and the round's evaluate metrics average the well-formed replies."""
    app = ClientApp(mods=[train_timing_mod])
    app.train()(numpy_app.train)
    app.evaluate()(_evaluate)
    strategy = _deadline(fraction_evaluate=1.0)
    _, result = _start(strategy, app, 2)
    assert len(strategy.history) == 2
    assert result.evaluate_metrics_clientapp[2]["eval_loss"] == pytest.approx(1.5)


# ------------------------------------------------------------------ FedBuff's arguments
@pytest.mark.parametrize("keyword", [{"fraction_train": 0.34}, {"min_train_nodes": 2},
                                     {"fraction_evaluate": 1.0}, {"min_available_nodes": 50},
                                     {"min_evaluate_nodes": 2}])
def test_fedbuff_refuses_fedavgs_sampling_arguments_it_would_not_honour(keyword):
    """FedBuff keeps ``concurrency`` jobs in flight and evaluates on the server only: a
    sampling or client-evaluation argument of FedAvg would be accepted and ignored."""
    name = next(iter(keyword))
    with pytest.raises(ValueError, match=name):
        FedBuff(buffer_size=2, latency=FixedArrivals(TABLE), measured_compute=False,
                **keyword)
