"""The rivals at the edges of a round: a duplicated reply counts once, a malformed one is
rejected (not a crash), and a round whose every reply is an error ends when the last error
arrives, not at the deadline. Models against numpy FedAvg (tests/apps/numpy_app.py)."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MetricRecord

from fl_gradcode.flower.testing import InProcessGrid
from fl_gradcode.rivals import DeadlineFedAvg, FedBuff, FirstK, WaitForAll, train_timing_mod
from tests.apps.numpy_app import LR, as_dict, fedavg, initial_arrays, make_app
from tests.flower.harness import FixedArrivals

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
TABLE = {r: [0.5, 1.0, 0.7] for r in range(1, 12)}


def _start(strategy, app, rounds, duplicate=None):
    models = {}
    strategy.start(grid=InProcessGrid(app, 3, duplicate=duplicate),
                   initial_arrays=initial_arrays(), num_rounds=rounds,
                   train_config=ConfigRecord({"lr": LR}),
                   evaluate_fn=lambda r, a: models.__setitem__(r, as_dict(a)))
    return models


def _wait_for_all(**kw):
    return WaitForAll(latency=FixedArrivals(TABLE), measured_compute=False,
                      fraction_evaluate=0.0, min_available_nodes=1, min_train_nodes=3, **kw)


def test_a_duplicated_reply_is_averaged_once():
    strategy = _wait_for_all()
    models = _start(strategy, make_app(train_timing_mod), 1, duplicate=lambda p, r: p == 0)
    expected = fedavg(as_dict(initial_arrays()), range(3), 3)
    for name, value in expected.items():
        np.testing.assert_allclose(models[1][name], value, rtol=1e-9, atol=1e-12)
    assert strategy.history[0]["clients_used"] == [0, 1, 2]


def _bad_weight_from(partition):
    inner = make_app(train_timing_mod)

    def app(msg, context):
        reply = inner(msg, context)
        if int(context.node_config["partition-id"]) == partition and not reply.has_error():
            next(iter(reply.content.metric_records.values()))["num-examples"] = [5, 6]
        return reply

    return app


def test_a_malformed_weight_is_a_rejected_reply_for_the_synchronous_rivals():
    strategy = DeadlineFedAvg(deadline=30.0, latency=FixedArrivals(TABLE),
                              measured_compute=False, fraction_evaluate=0.0,
                              min_available_nodes=1, min_train_nodes=3)
    models = _start(strategy, _bad_weight_from(1), 1)
    assert strategy.history[0]["rejected"] == 1
    assert strategy.history[0]["clients_used"] == [0, 2]
    expected = fedavg(as_dict(initial_arrays()), [0, 2], 3)
    for name, value in expected.items():
        np.testing.assert_allclose(models[1][name], value, rtol=1e-9, atol=1e-12)


def _bad_arrays_from(partition, kind):
    """Partition ``partition``'s train replies carry arrays FedAvg cannot average."""
    inner = make_app(train_timing_mod)

    def app(msg, context):
        reply = inner(msg, context)
        if int(context.node_config["partition-id"]) != partition or reply.has_error():
            return reply
        content = reply.content
        arrays = {k: v.numpy().copy() for k, v in content["arrays"].items()}
        if kind == "no-arrays":
            del content.array_records["arrays"]
            return reply
        if kind == "zero-examples":
            content["metrics"]["num-examples"] = 0
            return reply
        name = sorted(arrays)[0]
        if kind == "nan":
            arrays[name].reshape(-1)[0] = np.nan
        elif kind == "broadcast":  # shape (1,): numpy would broadcast it over the model
            arrays[name] = arrays[name].reshape(-1)[:1].copy()
        elif kind == "renamed":
            arrays[name + "-other"] = arrays.pop(name)
        elif kind in ("arrays-elsewhere", "metrics-elsewhere", "two-metrics", "extra-metric"):
            metrics = content["metrics"]
            if kind == "arrays-elsewhere":
                content["model"] = content.array_records.pop("arrays")
            elif kind == "metrics-elsewhere":
                content["scores"] = content.metric_records.pop("metrics")
            elif kind == "two-metrics":
                content["more"] = MetricRecord({"extra": 1.0})
            else:
                metrics["extra"] = 1.0
            return reply
        content["arrays"] = ArrayRecord({k: Array(v) for k, v in arrays.items()})
        return reply

    return app


@pytest.mark.parametrize("kind", ["no-arrays", "renamed", "broadcast", "nan", "zero-examples",
                                  "arrays-elsewhere", "metrics-elsewhere", "two-metrics",
                                  "extra-metric"])
@pytest.mark.parametrize("make", [
    _wait_for_all,
    lambda: DeadlineFedAvg(deadline=30.0, latency=FixedArrivals(TABLE), measured_compute=False,
                           fraction_evaluate=0.0, min_available_nodes=1, min_train_nodes=3),
    lambda: FirstK(k=2, overcommit=1.5, latency=FixedArrivals(TABLE), measured_compute=False,
                   fraction_evaluate=0.0, min_available_nodes=1),
], ids=["wait-for-all", "deadline", "first-k"])
def test_a_reply_fedavg_cannot_average_is_rejected_not_a_crash_or_a_corrupt_model(make, kind):
    """Flower's FedAvg ends the run on a reply without its arrays (or with other names),
    broadcasts a (1,)-shaped array into the model, spreads a NaN, and divides by zero when
    the kept replies weigh 0 examples: the synchronous rivals reject such a reply and average
    the others (partition 0 arrives first: first-k's K = 2 would keep it)."""
    strategy = make()
    models = _start(strategy, _bad_arrays_from(0, kind), 2)
    for row in strategy.history:
        assert row["rejected"] == 1, row
        assert 0 not in row["clients_used"], row
    used = strategy.history[0]["clients_used"]
    expected = fedavg(as_dict(initial_arrays()), used, 3)
    for name, value in expected.items():
        np.testing.assert_allclose(models[1][name], value, rtol=1e-9, atol=1e-12)
    assert all(np.all(np.isfinite(v)) for m in models.values() for v in m.values())


def test_a_reply_weighing_no_examples_takes_no_place_among_first_ks_k():
    """Partition 0 arrives first weighing 0 examples: first-k (K = 2) averages the next two
    arrivals (partitions 2 and 1), not one."""
    strategy = FirstK(k=2, overcommit=1.5, latency=FixedArrivals(TABLE), measured_compute=False,
                      fraction_evaluate=0.0, min_available_nodes=1)
    models = _start(strategy, _bad_arrays_from(0, "zero-examples"), 1)
    (row,) = strategy.history
    assert (row["clients_used"], row["rejected"], row["late_dropped"]) == ([1, 2], 1, 0)
    expected = fedavg(as_dict(initial_arrays()), [1, 2], 3)
    for name, value in expected.items():
        np.testing.assert_allclose(models[1][name], value, rtol=1e-9, atol=1e-12)


def test_a_fractional_weight_is_averaged_as_flowers_fedavg_averages_it():
    inner = make_app(train_timing_mod)

    def app(msg, context):
        reply = inner(msg, context)
        if int(context.node_config["partition-id"]) == 0:
            reply.content["metrics"]["num-examples"] = 0.5
        return reply

    strategy = _wait_for_all()
    _start(strategy, app, 1)
    assert strategy.history[0]["rejected"] == 0
    assert strategy.history[0]["clients_used"] == [0, 1, 2]


def test_a_malformed_weight_is_a_rejected_update_for_fedbuff():
    strategy = FedBuff(buffer_size=2, concurrency=3, latency=FixedArrivals(TABLE),
                       measured_compute=False)
    _start(strategy, _bad_weight_from(1), 2)
    assert sum(row["rejected"] for row in strategy.history) >= 1
    assert len(strategy.history) == 2


@pytest.mark.parametrize("make", [
    _wait_for_all,
    lambda: DeadlineFedAvg(deadline=30.0, latency=FixedArrivals(TABLE), measured_compute=False,
                           fraction_evaluate=0.0, min_available_nodes=1, min_train_nodes=3),
])
def test_a_round_whose_every_reply_is_an_error_ends_at_once(make):
    """Round 2: every client's app fails. The server has every answer at the round's start
    (errors take no virtual time here), so the round lasts 0 s, not the deadline (WaitForAll's
    is 1e12 s)."""
    inner = make_app(train_timing_mod)

    def app(msg, context):
        if int(msg.content["config"]["server-round"]) == 2:
            return Message(Error(0, "client crashed"), reply_to=msg)
        return inner(msg, context)

    strategy = make()
    _start(strategy, app, 3)
    rows = strategy.history
    assert [r["decode"] for r in rows] == ["all", "skipped", "all"]
    assert rows[1]["rejected"] == 3
    assert rows[1]["round_virtual_s"] == 0.0
    assert rows[0]["round_virtual_s"] == rows[2]["round_virtual_s"] == 1.0  # the slowest


def test_fedbuff_times_an_error_reply_with_that_nodes_own_latency():
    """Node ids in the reverse order of the partitions (partition 1 is the third smallest id,
    the rank partition 2 has): partition 1 fails from its second job on, and its failed jobs
    must take its own 5 s, not partition 2's 100 s. One slot, one update per step: the virtual
    clock is the sum of the jobs' latencies, taken here from the partitions the app ran."""
    inner = make_app(train_timing_mod)
    calls: list[tuple[int, bool]] = []
    jobs = {p: 0 for p in range(4)}

    def app(msg, context):
        pid = int(context.node_config["partition-id"])
        jobs[pid] += 1
        failed = pid == 1 and jobs[pid] > 1
        calls.append((pid, failed))
        if failed:
            return Message(Error(0, "client crashed"), reply_to=msg)
        return inner(msg, context)

    latency = [1.0, 5.0, 100.0, 1.0]
    strategy = FedBuff(buffer_size=1, concurrency=1, measured_compute=False,
                       latency=FixedArrivals({r: latency for r in range(1, 60)}))
    strategy.start(grid=InProcessGrid(app, 4, node_ids=[40, 30, 20, 10]),
                   initial_arrays=initial_arrays(), num_rounds=12,
                   train_config=ConfigRecord({"lr": LR}), evaluate_fn=lambda r, a: None)
    steps = [row["virtual_s"] for row in strategy.history]
    # the jobs up to the one that made the last step (a valid reply), in dispatch order
    valid = [i for i, (_, failed) in enumerate(calls) if not failed]
    done = calls[: valid[len(steps) - 1] + 1]
    assert any(failed for _, failed in done), "no failed job before the end: nothing checked"
    assert steps[-1] == pytest.approx(sum(latency[p] for p, _ in done), rel=1e-12)


def test_fedbuff_uses_the_update_of_a_node_without_a_partition_id():
    """train_timing_mod reports partition-id -1 for a node config without one: the update is
    used (timed by the node's rank), not rejected as malformed."""
    from fl_gradcode.flower.deadline import TIMING_KEY

    inner = make_app(train_timing_mod)

    def app(msg, context):
        reply = inner(msg, context)
        if not reply.has_error():
            reply.content.config_records[TIMING_KEY]["partition-id"] = -1
        return reply

    strategy = FedBuff(buffer_size=2, concurrency=3, latency=FixedArrivals(TABLE),
                       measured_compute=False)
    _start(strategy, app, 2)
    assert len(strategy.history) == 2
    assert all(row["rejected"] == 0 for row in strategy.history)


@pytest.mark.parametrize("kind", ["error", "malformed"])
def test_a_duplicated_error_or_malformed_reply_counts_once(kind):
    """Partition 0 fails in round 1 and its reply arrives twice: one rejected reply, and the
    round ends with the slowest valid reply (1.0 s), not at the deadline."""
    inner = _bad_weight_from(0) if kind == "malformed" else make_app(train_timing_mod)

    def app(msg, context):
        if kind == "error" and int(context.node_config["partition-id"]) == 0:
            return Message(Error(0, "client crashed"), reply_to=msg)
        return inner(msg, context)

    strategy = _wait_for_all()
    _start(strategy, app, 1, duplicate=lambda p, r: p == 0)
    row = strategy.history[0]
    assert (row["rejected"], row["clients_used"]) == (1, [1, 2])
    assert row["round_virtual_s"] == 1.0


def _huge_int_from(partition, where):
    """Partition ``partition``'s train replies carry an int no float holds (possible in
    process: Flower's records take any Python int) as their weight or their compute time."""
    inner = make_app(train_timing_mod)

    def app(msg, context):
        reply = inner(msg, context)
        if int(context.node_config["partition-id"]) == partition and not reply.has_error():
            if where == "weight":
                next(iter(reply.content.metric_records.values()))["num-examples"] = 10**400
            else:
                next(iter(reply.content.config_records.values()))["compute-s"] = 10**400
        return reply

    return app


@pytest.mark.parametrize("where", ["weight", "compute-s"])
def test_an_int_past_floats_range_is_a_rejected_reply_not_a_crash(where):
    """The synchronous rival averages the other two replies (numpy FedAvg over them), and
    FedBuff goes on to its later updates; neither raises OverflowError."""
    strategy = DeadlineFedAvg(deadline=30.0, latency=FixedArrivals(TABLE),
                              measured_compute=False, fraction_evaluate=0.0,
                              min_available_nodes=1, min_train_nodes=3)
    models = _start(strategy, _huge_int_from(1, where), 1)
    assert strategy.history[0]["rejected"] == 1
    assert strategy.history[0]["clients_used"] == [0, 2]
    expected = fedavg(as_dict(initial_arrays()), [0, 2], 3)
    for name, value in expected.items():
        np.testing.assert_allclose(models[1][name], value, rtol=1e-9, atol=1e-12)
    buffered = FedBuff(buffer_size=2, concurrency=3, latency=FixedArrivals(TABLE),
                       measured_compute=False)
    _start(buffered, _huge_int_from(1, where), 2)
    assert sum(row["rejected"] for row in buffered.history) >= 1
    assert len(buffered.history) == 2


@pytest.mark.parametrize("make", [
    lambda latency: WaitForAll(latency=latency),
    lambda latency: FirstK(k=2, latency=latency),
    lambda latency: FedBuff(buffer_size=2, latency=latency),
], ids=["wait-for-all", "first-k", "fedbuff"])
def test_a_rival_refuses_a_latency_that_is_not_a_model_when_built(make):
    with pytest.raises(TypeError, match=r"latency='pareto' is not a latency model.*"
                                        r"make_latency\('pareto'"):
        make("pareto")


def _weight_from(partitions, weight):
    inner = make_app(train_timing_mod)

    def app(msg, context):
        reply = inner(msg, context)
        if int(context.node_config["partition-id"]) in partitions and not reply.has_error():
            next(iter(reply.content.metric_records.values()))["num-examples"] = weight
        return reply

    return app


@pytest.mark.parametrize("sizes", [None, [10, 11, 12]])
def test_weights_whose_total_overflows_skip_the_round_and_keep_the_model(sizes):
    """Two replies of num-examples 1.5e308 each (finite, their sum is not): no OverflowError,
    no model divided by an infinite total (it read all zeros, the round 'all'); the round
    is skipped, as a coded round whose total overflows is, and the run goes on."""
    strategy = DeadlineFedAvg(deadline=30.0, latency=FixedArrivals(TABLE),
                              measured_compute=False, fraction_evaluate=0.0,
                              min_available_nodes=1, min_train_nodes=3, partition_sizes=sizes)
    models = _start(strategy, _weight_from({0, 1}, 1.5e308), 2)
    assert [row["decode"] for row in strategy.history] == ["skipped", "skipped"]
    for name, value in as_dict(initial_arrays()).items():
        np.testing.assert_array_equal(models[2][name], value)


def test_weights_below_one_example_keep_every_clients_load_at_one():
    """Every reply weighs 0.5 (a fraction: FedAvg takes it; the timing reads it as 0
    examples): each client's load is the cohort's mean, 1, as when every reply weighs 10,
    so a load-scaled latency model's draws arrive at the same times (they arrived at 0)."""
    from fl_gradcode.latency import ShiftedExponential

    def times(weight):
        strategy = WaitForAll(latency=ShiftedExponential(1.0, 1.0), measured_compute=False,
                              fraction_evaluate=0.0, min_available_nodes=1, min_train_nodes=3)
        _start(strategy, _weight_from({0, 1, 2}, weight), 2)
        return [row["virtual_s"] for row in strategy.history]

    assert times(0.5) == pytest.approx(times(10)) and times(10)[0] > 0
