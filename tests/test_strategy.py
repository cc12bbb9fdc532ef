"""Round logic of the GradientCoding strategy, without Ray (an in-process LocalGrid)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import Strategy

from fl_gradcode.codes import make_code
from fl_gradcode.local_grid import LocalGrid, coded_reply, set_task_identity
from fl_gradcode.strategy import GradientCoding, ServerOptimizer, flatten, to_array_record

DIM = 5


@pytest.fixture(autouse=True)
def _identity():
    set_task_identity()


def problem(k: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    updates = {j: rng.standard_normal(DIM) for j in range(k)}
    theta0 = rng.standard_normal(DIM)
    return updates, theta0


def run_rounds(strategy, grid, theta0, rounds, pause=0.0):
    arrays = to_array_record({"w": theta0})
    wrapped = strategy.wrap_grid(grid)
    for r in range(1, rounds + 1):
        replies = wrapped.send_and_receive(
            strategy.configure_train(r, arrays, ConfigRecord(), wrapped), timeout=60
        )
        arrays, _ = strategy.aggregate_train(r, replies)
        time.sleep(pause)
    return flatten(arrays)[0]


def expected_step(code, updates, theta, lr):
    return theta - lr * sum(code.weights[j] * updates[j] for j in range(code.k))


def test_wallclock_round_ends_at_first_decodable_set():
    code = make_code("frc", n=6, s=1)  # groups (0,1) (2,3) (4,5)
    updates, theta0 = problem(code.k)
    grid = LocalGrid(
        6, lambda m, w: coded_reply(m, updates), lambda w, r: 0.02 if w % 2 == 0 else 5
    )
    strategy = GradientCoding(code, timing="wallclock", lr=0.1, straggler_timeout=4.0)
    theta = run_rounds(strategy, grid, theta0, 1)
    row = strategy.history[0]
    assert row["wall_s"] < 1.0  # not 5 s (all replies), not 4 s (the deadline)
    assert row["decode"] == "exact"
    assert row["clients_used"] == [0, 2, 4]
    assert row["stragglers"] == [1, 3, 5]
    np.testing.assert_allclose(theta, expected_step(code, updates, theta0, 0.1), rtol=1e-12)


def test_deadline_falls_back_to_least_squares_and_records_the_error():
    code = make_code("frc", n=6, s=1)
    updates, theta0 = problem(code.k)
    slow = {4, 5}  # a whole group straggles: not decodable
    grid = LocalGrid(6, lambda m, w: coded_reply(m, updates), lambda w, r: 3 if w in slow else 0.01)
    strategy = GradientCoding(code, timing="wallclock", lr=0.1, straggler_timeout=0.3)
    theta = run_rounds(strategy, grid, theta0, 1)
    row = strategy.history[0]
    assert row["decode"] == "approx"
    assert row["decode_error"] == pytest.approx(code.decoding_error([0, 1, 2, 3]))
    assert 0.3 <= row["wall_s"] < 2.0
    partial = sum(code.weights[j] * updates[j] for j in range(4))
    np.testing.assert_allclose(theta, theta0 - 0.1 * partial, rtol=1e-12)


def test_approximation_below_the_quality_bar_keeps_the_model():
    code = make_code("frc", n=6, s=1)
    updates, theta0 = problem(code.k)
    grid = LocalGrid(6, lambda m, w: coded_reply(m, updates), lambda w, r: 3 if w >= 2 else 0.01)
    strategy = GradientCoding(
        code, timing="wallclock", straggler_timeout=0.2, max_decode_error=0.1
    )
    theta = run_rounds(strategy, grid, theta0, 1)
    assert strategy.history[0]["decode"] == "skipped"
    np.testing.assert_array_equal(theta, theta0)


def test_nothing_received_skips_the_round_and_keeps_a_finite_model():
    code = make_code("frc", n=4, s=1)
    updates, theta0 = problem(code.k)
    grid = LocalGrid(4, lambda m, w: coded_reply(m, updates), lambda w, r: 5)
    strategy = GradientCoding(code, timing="wallclock", straggler_timeout=0.1, warmup_timeout=0.2)
    theta = run_rounds(strategy, grid, theta0, 1)
    assert strategy.history[0]["decode"] == "skipped"
    assert strategy.history[0]["clients_used"] == []
    np.testing.assert_array_equal(theta, theta0)


def test_busy_client_is_skipped_and_its_late_reply_is_dropped():
    code = make_code("frc", n=4, s=1)
    updates, theta0 = problem(code.k)

    def delay(w, r):
        return 0.6 if (w == 3 and r == 1) else 0.01

    grid = LocalGrid(4, lambda m, w: coded_reply(m, updates), delay)
    strategy = GradientCoding(code, timing="wallclock", lr=0.1, straggler_timeout=5.0)
    arrays = to_array_record({"w": theta0})
    wrapped = strategy.wrap_grid(grid)
    history = []
    for r in (1, 2, 3):
        msgs = list(strategy.configure_train(r, arrays, ConfigRecord(), wrapped))
        history.append({grid.worker[m.metadata.dst_node_id] for m in msgs})
        replies = wrapped.send_and_receive(msgs, timeout=60)
        arrays, _ = strategy.aggregate_train(r, replies)
        if r == 2:
            time.sleep(0.8)  # worker 3's round-1 reply is ready before round 3 pulls
    assert history[0] == {0, 1, 2, 3}
    assert history[1] == {0, 1, 2}  # worker 3 still busy with round 1: not sent new work
    assert strategy.history[1]["busy"] == [3]
    assert history[2] == {0, 1, 2, 3}
    assert sum(row["late_dropped"] for row in strategy.history) == 1
    assert all(row["decode"] == "exact" for row in strategy.history)
    theta = flatten(arrays)[0]
    step = sum(code.weights[j] * updates[j] for j in range(code.k))
    np.testing.assert_allclose(theta, theta0 - 0.3 * step, rtol=1e-12)


def bad_reply(kind: str):
    def respond(msg: Message, worker: int) -> Message:
        good = coded_reply(msg, UPDATES)
        if worker != 0:
            return good
        vec = good.content.array_records["coded"]["update"].numpy()
        meta = good.content.metric_records["meta"]
        if kind == "error":
            return Message(Error(code=0, reason="client crashed"), reply_to=msg)
        if kind == "nan":
            vec = vec.copy()
            vec[1] = np.nan
        elif kind == "inf":
            vec = vec.copy()
            vec[0] = np.inf
        elif kind == "shape":
            vec = vec[:-1]
        elif kind == "dtype":
            vec = np.array(["x"] * DIM)
        elif kind == "round":
            meta = MetricRecord({**dict(meta), "server-round": 99})
        elif kind == "claims-other-worker":
            meta = MetricRecord({**dict(meta), "worker": 1})
        elif kind == "missing":
            return Message(RecordDict({"meta": meta}), reply_to=msg)
        return Message(
            RecordDict({"coded": ArrayRecord({"update": Array(vec)}), "meta": meta}), reply_to=msg
        )

    return respond


UPDATES, THETA0 = problem(6)


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("error", "error reply"),
        ("nan", "NaN or Inf"),
        ("inf", "NaN or Inf"),
        ("shape", "shape"),
        ("dtype", "dtype"),
        ("round", "computed for round 99"),
        ("claims-other-worker", "claims worker 1"),
        ("missing", "lacks"),
    ],
)
def test_bad_reply_is_rejected_counted_and_never_decoded(kind, reason, caplog):
    code = make_code("frc", n=6, s=1)
    grid = LocalGrid(6, bad_reply(kind), lambda w, r: 0.01)
    strategy = GradientCoding(code, timing="wallclock", lr=0.1)
    theta = run_rounds(strategy, grid, THETA0, 1)
    row = strategy.history[0]
    assert row["rejected"] == 1
    assert reason in row["rejected_reasons"][0]
    assert 0 not in row["clients_used"]
    assert row["decode"] == "exact"
    assert np.all(np.isfinite(theta))
    np.testing.assert_allclose(theta, expected_step(code, UPDATES, THETA0, 0.1), rtol=1e-12)


def test_unknown_duplicate_and_wrong_round_senders_are_rejected():
    code = make_code("frc", n=4, s=1)
    updates, theta0 = problem(code.k)
    grid = LocalGrid(4, lambda m, w: coded_reply(m, updates), lambda w, r: 0.01)
    strategy = GradientCoding(code, timing="virtual", lr=0.1)
    arrays = to_array_record({"w": theta0})
    msgs = list(strategy.configure_train(1, arrays, ConfigRecord(), grid))
    replies = grid.send_and_receive(msgs, timeout=10)
    # a copy of worker 0's reply (duplicate), one from an unknown node, one for round 7
    dup = replies[0]
    stranger = coded_reply(msgs[1], updates)
    stranger.metadata.__dict__["_src_node_id"] = 424242
    old = coded_reply(msgs[2], updates)
    old.metadata.__dict__["_group_id"] = "7"
    arrays, _ = strategy.aggregate_train(1, [*replies, dup, stranger, old])
    reasons = strategy.history[0]["rejected_reasons"]
    assert any("duplicate sender" in r for r in reasons)
    assert any("unknown sender" in r for r in reasons)
    assert any("round '7'" in r for r in reasons)
    assert strategy.history[0]["decode"] == "exact"


def test_virtual_timing_decodes_from_earliest_decodable_prefix_and_tracks_busy():
    code = make_code("frc", n=6, s=1)
    updates, theta0 = problem(code.k)
    arrival = {0: 0.5, 1: 9.0, 2: 0.7, 3: 0.2, 4: 3.0, 5: 8.0}  # virtual seconds
    grid = LocalGrid(6, lambda m, w: coded_reply(m, updates, arrival[w]))
    strategy = GradientCoding(code, timing="virtual", lr=0.1, straggler_timeout=20)
    run_rounds(strategy, grid, theta0, 1)
    row = strategy.history[0]
    # arrivals in order 3, 0, 2, 4: groups covered after worker 4 (t = 3.0)
    assert row["clients_used"] == [0, 2, 3, 4]
    assert row["virtual_s"] == pytest.approx(3.0)
    assert row["late_dropped"] == 2  # workers 5 and 1 arrived after the round closed
    # workers 1 and 5 are still (virtually) busy at t = 3.0: not sent round-2 work
    msgs = strategy.configure_train(2, to_array_record({"w": theta0}), ConfigRecord(), grid)
    assert {grid.worker[m.metadata.dst_node_id] for m in msgs} == {0, 2, 3, 4}


def test_virtual_deadline_uses_replies_that_arrived_in_time():
    code = make_code("frc", n=4, s=1)
    updates, theta0 = problem(code.k)
    arrival = {0: 0.1, 1: 0.2, 2: 50.0, 3: 60.0}
    grid = LocalGrid(4, lambda m, w: coded_reply(m, updates, arrival[w]))
    strategy = GradientCoding(code, timing="virtual", straggler_timeout=10, max_decode_error=0.9)
    run_rounds(strategy, grid, theta0, 1)
    row = strategy.history[0]
    assert row["decode"] == "approx"
    assert row["clients_used"] == [0, 1]
    assert row["virtual_s"] == pytest.approx(10.0)


class PassThrough(Strategy):
    """A wrapper in the style of Flower's DP wrappers: composition, no ``start`` override."""

    def __init__(self, inner):
        self.inner = inner

    def configure_train(self, *a):
        return self.inner.configure_train(*a)

    def aggregate_train(self, *a):
        return self.inner.aggregate_train(*a)

    def configure_evaluate(self, *a):
        return self.inner.configure_evaluate(*a)

    def aggregate_evaluate(self, *a):
        return self.inner.aggregate_evaluate(*a)

    def summary(self):
        self.inner.summary()


def test_early_return_survives_a_wrapping_strategy():
    code = make_code("frc", n=6, s=1)
    updates, theta0 = problem(code.k)
    grid = LocalGrid(
        6, lambda m, w: coded_reply(m, updates), lambda w, r: 0.01 if w % 2 == 0 else 30
    )
    inner = GradientCoding(code, timing="wallclock", lr=0.1, straggler_timeout=20)
    result = PassThrough(inner).start(
        grid=inner.wrap_grid(grid), initial_arrays=to_array_record({"w": theta0}), num_rounds=1
    )
    assert inner.history[0]["wall_s"] < 2.0  # not the 30-s stragglers
    assert inner.history[0]["clients_used"] == [0, 2, 4]
    np.testing.assert_allclose(
        flatten(result.arrays)[0], expected_step(code, updates, theta0, 0.1), rtol=1e-12
    )


def test_own_start_wraps_the_grid_and_result_holds_metrics():
    code = make_code("grouped-rs", n=5, s=2)
    updates, theta0 = problem(code.k)
    grid = LocalGrid(5, lambda m, w: coded_reply(m, updates), lambda w, r: 0.01 if w != 1 else 30)
    strategy = GradientCoding(code, timing="wallclock", lr=0.1)
    result = strategy.start(grid=grid, initial_arrays=to_array_record({"w": theta0}), num_rounds=2)
    assert set(result.train_metrics_clientapp) == {1, 2}
    assert result.train_metrics_clientapp[1]["exact"] == 1
    assert result.train_metrics_clientapp[2]["stragglers"] >= 1


def test_server_optimizers_match_their_update_rules():
    theta, g1, g2 = np.ones(3), np.array([1.0, -2.0, 0.5]), np.array([0.5, 0.5, -1.0])
    sgd = ServerOptimizer("sgd", lr=0.1)
    np.testing.assert_allclose(sgd.step(theta, g1), theta - 0.1 * g1)
    mom = ServerOptimizer("momentum", lr=0.1, momentum=0.9)
    t1 = mom.step(theta, g1)
    t2 = mom.step(t1, g2)
    np.testing.assert_allclose(t2, t1 - 0.1 * (0.9 * g1 + g2))
    adam = ServerOptimizer("adam", lr=0.01)
    step = adam.step(theta, g1)
    np.testing.assert_allclose(step, theta - 0.01 * np.sign(g1), rtol=1e-6)  # first Adam step
    with pytest.raises(ValueError, match="server-optimizer='rmsprop'"):
        ServerOptimizer("rmsprop")


def test_strategy_rejects_bad_parameters():
    code = make_code("frc", n=4, s=1)
    with pytest.raises(ValueError, match="update='sparse'"):
        GradientCoding(code, update="sparse")
    with pytest.raises(ValueError, match="timing='sometimes'"):
        GradientCoding(code, timing="sometimes")
    with pytest.raises(ValueError, match="straggler-timeout=0"):
        GradientCoding(code, straggler_timeout=0)
    with pytest.raises(ValueError, match="comm-efficient"):
        GradientCoding(make_code("comm-efficient", n=4, s=1))


def test_min_replies_closes_the_round_with_the_fastest_n_minus_s():
    code = make_code("ignore-stragglers", n=6, s=2, rescale=True)
    updates, theta0 = problem(code.k)
    arrival = {0: 0.3, 1: 5.0, 2: 0.1, 3: 0.2, 4: 9.0, 5: 0.4}
    grid = LocalGrid(6, lambda m, w: coded_reply(m, updates, arrival[w]))
    strategy = GradientCoding(code, timing="virtual", lr=0.1, min_replies=4)
    theta = run_rounds(strategy, grid, theta0, 1)
    row = strategy.history[0]
    assert row["clients_used"] == [0, 2, 3, 5]
    assert row["decode"] == "approx"
    assert row["virtual_s"] == pytest.approx(0.4)
    rescaled = 6 / 4 * sum(updates[j] for j in (0, 2, 3, 5))
    np.testing.assert_allclose(theta, theta0 - 0.1 * rescaled, rtol=1e-12)
    with pytest.raises(ValueError, match="min-replies=7"):
        GradientCoding(code, min_replies=7)
