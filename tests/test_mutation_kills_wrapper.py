"""Strategy-wrapper and grid behaviours pinned down after mutation testing
(``experiments/mutation.py``): documented defaults, the keys of ``config.json`` /
``rounds.jsonl`` / the round metrics (every key in every row, one spelling each), approximate
rounds labelled as such, non-finite replies rejected on arrival in virtual time, the disagreement
in the log of an unresolved contradiction, what ``s="auto"`` feeds its estimator and draws, and
``EarlyReturnGrid``'s deadline, poll interval and reply hand-off (on a fake clock).

Expected values are literals of the documented contract, latency-trace literals or an
independent numpy FedAvg, never the code path under test.
"""

from __future__ import annotations

import copy
import itertools
import json
import logging
from types import SimpleNamespace

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg
from test_integrity import DIM, scaling_mod, train
from test_wrapper import FixedArrivals, assert_model, fedavg, theta0
from test_wrapper import run as run_wrapper

import fl_gradcode.adaptive as adaptive
import fl_gradcode.flower.grid as grid_module
from fl_gradcode.flower import GradientCoding, gradient_coding_mod, protocol
from fl_gradcode.flower.grid import EarlyReturnGrid
from fl_gradcode.flower.protocol import Instruction
from fl_gradcode.flower.testing import InProcessGrid, set_task_identity
from fl_gradcode.latency import Pareto

N = 6


@pytest.fixture(autouse=True)
def _identity():
    set_task_identity()


def _run(rounds=2, grid_cls=InProcessGrid, n=N, **kw):
    app = ClientApp(mods=[gradient_coding_mod])
    app.train()(train)
    options = dict(code="frc", s=1, latency=Pareto(1.0, 1.5), seed=0, wire="float64",
                   straggler_timeout=1e6, measured_compute=False)
    strategy = GradientCoding(FedAvg(fraction_evaluate=0.0, min_available_nodes=n),
                              **{**options, **kw})
    grid = grid_cls(app, n)
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord({"w": Array(np.zeros(DIM))}),
                            num_rounds=rounds, train_config=ConfigRecord({}))
    return strategy, result, grid


def _rows(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "rounds.jsonl").read_text().splitlines()]


# ------------------------------------------------------------------------------ defaults
def test_documented_defaults_of_s():
    assert GradientCoding(FedAvg()).s == 1
    # s="auto" starts at the safe s_max before any observation
    assert GradientCoding(FedAvg(), s="auto", s_max=3).s == 3


def test_wallclock_deadline_before_any_round_is_the_straggler_timeout():
    strategy = GradientCoding(FedAvg(), timing="wallclock", straggler_timeout=7.0,
                              warmup_timeout=30.0)
    assert strategy.deadline_s(None) == 7.0
    assert strategy.deadline_s(2.0) == 2.0  # the caller's timeout, when shorter
    assert strategy.first_reply_deadline_s() is None


# ------------------------------------------------------------------------------ records
def test_config_json_names_the_latency_model_and_the_straggler_timeout(tmp_path):
    latency = Pareto(1.0, 1.5)
    GradientCoding(FedAvg(), latency=latency, straggler_timeout=7.0, results_dir=str(tmp_path))
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["latency"] == repr(latency)
    assert config["straggler_timeout"] == 7.0


def test_every_round_row_and_metric_record_has_the_documented_keys_spelled_once(tmp_path):
    _, result, _ = _run(results_dir=str(tmp_path))
    rows = _rows(tmp_path)
    assert len(rows) == 2
    for row in rows:
        assert {"late_dropped", "verified", "replies_read", "decode", "s"} <= set(row)
        assert len({key.lower() for key in row}) == len(row)  # one spelling per key
    for metrics in result.train_metrics_clientapp.values():
        assert "gc/late_dropped" in metrics and "gc/decoded" in metrics
        assert len({key.lower() for key in metrics}) == len(metrics)


def test_a_round_with_nothing_to_aggregate_records_every_key_with_its_default(tmp_path):
    """``aggregate_train`` of a round that was never configured (e.g. the privacy budget is
    spent): skipped, and its row has the same keys as a coded round's."""
    _run(rounds=1, results_dir=str(tmp_path / "coded"))
    strategy = GradientCoding(FedAvg(), results_dir=str(tmp_path / "idle"))
    arrays, metrics = strategy.aggregate_train(1, [])
    assert arrays is None
    (idle,) = _rows(tmp_path / "idle")
    (coded,) = _rows(tmp_path / "coded")
    assert set(idle) == set(coded)
    assert idle["decode"] == "skipped" and idle["verified"] is None
    assert idle["late_dropped"] == 0 and idle["clients_used"] == []
    assert metrics["gc/late_dropped"] == 0 and metrics["gc/decoded"] == 0


def test_ignore_stragglers_rounds_are_recorded_as_approx():
    strategy, _, _ = _run(code="ignore-stragglers", s=1, max_decode_error=1.0)
    assert [r["decode"] for r in strategy.history] == ["approx", "approx"]


def test_min_norm_decoding_reads_every_reply_it_uses_and_sparse_reads_one_per_group():
    sparse, _, _ = _run(rounds=1)
    dense, _, _ = _run(rounds=1, sparse_decoding=False)
    for strategy, expected in ((sparse, N // 2), (dense, None)):
        row = strategy.history[0]
        assert row["decode"] == "exact"
        used = len(row["clients_used"])
        assert row["replies_read"] == (used if expected is None else expected)
    assert len(dense.history[0]["clients_used"]) > N // 2  # more than one per FRC pair


class _RecordingGrid(InProcessGrid):
    def __init__(self, app, n):
        super().__init__(app, n)
        self.groups: list[str] = []

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        self.groups += [m.metadata.group_id for m in messages]
        return super().send_and_receive(messages, timeout=timeout)


def test_identify_messages_travel_in_the_identify_group():
    _, _, grid = _run(rounds=1, grid_cls=_RecordingGrid)
    assert grid.groups[:N] == ["identify"] * N


# ------------------------------------------------------------------------------ bad replies
def test_virtual_nan_reply_is_read_in_full_on_arrival_and_the_round_waits_for_its_replica():
    """FRC n=6, s=1, groups (0, 1) (2, 3) (4, 5); workers 0, 2, 4 reply at 1 s, the others at
    10 s, and worker 0's array ``w`` holds a NaN. In virtual time every value is read as the
    reply arrives (the reason names the array, not just the integrity probe's sampled
    coordinates); rejected at once, the round waits for worker 1 (10 s) and decodes exactly."""
    outcome = run_wrapper(6, faults={(0, 1): "nan"}, straggler_timeout=100.0,
                          latency=FixedArrivals({1: [1.0, 10.0, 1.0, 10.0, 1.0, 10.0]}))
    row = outcome.rows[0]
    assert row["rejected_reasons"] == ["array 'w' contains NaN or Inf"]
    assert row["decode"] == "exact" and row["round_virtual_s"] == 10.0
    assert 1 in row["clients_used"] and 0 not in row["clients_used"]
    assert_model(outcome.models[1], fedavg(theta0(), range(6), 6))


def test_wallclock_nan_reply_found_at_decoding_leaves_an_approximate_round_labelled_approx():
    """Uncoded n=6: worker 0's NaN is found in the decoding pass (wallclock reads values
    there); the round is decoded again from workers 1..5, an approximation: FedAvg of
    partitions 1..5."""
    outcome = run_wrapper(6, code="uncoded", s=0, timing="wallclock", faults={(0, 1): "nan"})
    row = outcome.rows[0]
    assert row["decode"] == "approx"
    assert row["clients_used"] == [1, 2, 3, 4, 5] and row["rejected"] == 1
    assert_model(outcome.models[1], fedavg(theta0(), range(1, 6), 6))


def test_an_unresolved_contradiction_logs_how_far_the_replicas_disagree(caplog):
    """FRC s=1: node 0 scales its reply by 1.5, its one replica disagrees and nobody breaks
    the tie: nothing is applied, and the warning gives the recorded disagreement."""
    apps = []
    for pid in range(N):
        app = ClientApp(mods=[scaling_mod(0, 1.5), gradient_coding_mod] if pid == 0
                        else [gradient_coding_mod])
        app.train()(train)
        apps.append(app)
    strategy = GradientCoding(FedAvg(fraction_evaluate=0.0, min_available_nodes=N), code="frc",
                              s=1, latency=Pareto(1.0, 1.5), seed=0, verify=True,
                              straggler_timeout=1e6, wire="float64")
    with caplog.at_level(logging.WARNING, logger="flwr"):
        strategy.start(grid=InProcessGrid(None, N, apps=apps),
                       initial_arrays=ArrayRecord({"w": Array(np.zeros(DIM))}),
                       num_rounds=1, train_config=ConfigRecord({}))
    row = strategy.history[0]
    assert row["decode"] == "skipped" and row["disagreement"] > 1e-3
    messages = [r.getMessage() for r in caplog.records if "no single reply" in r.msg]
    expected = (f"round 1: replies disagree (relative {row['disagreement']:.3g}) and no single "
                "reply explains it; nothing is applied")
    assert messages == [expected]


# ------------------------------------------------------------------------------ s="auto"
def _auto_run(latency, rounds, monkeypatch, n=4, s_max=1):
    app = ClientApp(mods=[gradient_coding_mod])
    app.train()(train)
    strategy = GradientCoding(
        FedAvg(fraction_evaluate=0.0, min_available_nodes=n), s="auto", s_max=s_max,
        latency=latency, seed=0, wire="float64", straggler_timeout=1e6, measured_compute=False,
    )
    strategy.start(grid=InProcessGrid(app, n),
                   initial_arrays=ArrayRecord({"w": Array(np.zeros(DIM))}),
                   num_rounds=rounds, train_config=ConfigRecord({}))
    return strategy


def test_auto_feeds_the_estimator_each_replys_own_latency_when_nothing_was_queued(monkeypatch):
    """Round 1 (nobody busy, no queued work): the observed elapsed time of every reply in time
    is its replayed latency (1, 2, 3, 4 s), nothing added."""
    observed = []
    real = adaptive.LatencyEstimator.update

    def spy(self, elapsed, loads, duration, **kwargs):
        observed.append(np.array(elapsed, dtype=float))
        return real(self, elapsed, loads, duration, **kwargs)

    monkeypatch.setattr(adaptive.LatencyEstimator, "update", spy)
    _auto_run(FixedArrivals({1: [1.0, 2.0, 3.0, 4.0]}), 1, monkeypatch)
    (elapsed,) = observed
    seen = np.isfinite(elapsed)
    assert seen.sum() >= 2  # at least the replies that decoded
    np.testing.assert_array_equal(elapsed[seen], np.array([1.0, 2.0, 3.0, 4.0])[seen])


def test_auto_draws_fresh_monte_carlo_samples_every_round(monkeypatch):
    """Each decision with data gets its own generator: rounds 2 and 3 do not reuse one
    stream of draws."""
    draws = []
    real = adaptive.choose_s

    def spy(*args, **kwargs):
        rng = kwargs.get("rng")
        draws.append(None if rng is None else copy.deepcopy(rng).random(4))
        return real(*args, **kwargs)

    monkeypatch.setattr(adaptive, "choose_s", spy)
    _auto_run(Pareto(1.0, 1.5), 3, monkeypatch)
    assert len(draws) == 3
    assert all(d is not None for d in draws)
    assert not np.array_equal(draws[1], draws[2])


# ------------------------------------------------------------------------------ grid
_ids = itertools.count()


def _coded_message(node: int) -> Message:
    msg = protocol.instruction_message(RecordDict(), Instruction(op=protocol.OP_TRAIN), node, "1")
    msg.metadata.__dict__["_message_id"] = f"m{next(_ids)}"
    return msg


class _Clock:
    """Stands in for the grid module's ``time``: ``sleep`` advances ``monotonic``."""

    def __init__(self, start: float = 100.0):
        self.now = start
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    fake = _Clock()
    monkeypatch.setattr(grid_module, "time", SimpleNamespace(monotonic=fake.monotonic,
                                                             sleep=fake.sleep))
    return fake


class _FakeGrid:
    """Accepts every message; ``schedule`` is a list of ``(time, reply)``: a reply can be
    pulled once the clock has reached its time."""

    def __init__(self, clock: _Clock, schedule=()):
        self.clock = clock
        self.schedule = list(schedule)
        self.pulls = 0

    def push_messages(self, messages):
        return [m.metadata.message_id for m in messages]

    def pull_messages(self, ids):
        self.pulls += 1
        out = [reply for t, reply in self.schedule if t <= self.clock.now]
        self.schedule = [(t, reply) for t, reply in self.schedule if t > self.clock.now]
        return out


class _Owner:
    """A round owner that records what the grid tells it."""

    def __init__(self, own_deadline: float = 600.0):
        self.timeouts: list[float | None] = []
        self.seen: list[Message] = []
        self.prioritized: list[int] = []
        self.own_deadline = own_deadline

    def deadline_s(self, timeout):
        self.timeouts.append(timeout)
        return min(self.own_deadline, timeout) if timeout else self.own_deadline

    def first_reply_deadline_s(self):
        return None

    def on_reply(self, reply):
        self.seen.append(reply)

    def ready(self):
        return False

    def on_late_reply(self, reply):
        pass

    def on_unsent(self, messages):
        pass

    def prioritize(self, replies):
        self.prioritized.append(len(replies))
        return replies


def test_the_callers_timeout_reaches_the_round_deadline(clock):
    owner = _Owner(own_deadline=600.0)
    grid = EarlyReturnGrid(_FakeGrid(clock), owner, poll_interval=0.5)
    msg = _coded_message(1)
    assert grid.send_and_receive([msg], timeout=2.0) == []
    assert owner.timeouts == [2.0]
    assert clock.now == 102.0  # gave up at the caller's 2 s, not the owner's 600 s
    assert set(grid.abandoned) == {msg.metadata.message_id}


def test_the_round_ends_when_the_clock_reaches_the_deadline(clock):
    """Deadline 1 s, polls every 0.5 s: pulls at 0, 0.5 and 1 s, then the round is over; a
    reply that turns up at 1.25 s is not read this round (its message is abandoned)."""
    msg = _coded_message(1)
    inner = _FakeGrid(clock, [(101.25, Message(RecordDict(), reply_to=msg))])
    grid = EarlyReturnGrid(inner, _Owner(own_deadline=1.0), poll_interval=0.5)
    assert grid.send_and_receive([msg]) == []
    assert inner.pulls == 3 and clock.now == 101.0
    assert set(grid.abandoned) == {msg.metadata.message_id}


def test_a_reply_is_picked_up_within_the_default_5_ms_poll_interval(clock):
    msg = _coded_message(1)
    reply = Message(RecordDict(), reply_to=msg)
    grid = EarlyReturnGrid(_FakeGrid(clock, [(100.001, reply)]), _Owner())
    assert grid.send_and_receive([msg]) == [reply]
    assert clock.sleeps == [pytest.approx(0.005)]
    assert clock.now - 100.0 == pytest.approx(0.005)


def test_a_second_reply_to_one_message_is_handed_to_the_strategy_to_reject(clock):
    owner = _Owner()
    msgs = [_coded_message(1), _coded_message(2)]
    first, again, other = (Message(RecordDict(), reply_to=m) for m in (msgs[0], msgs[0], msgs[1]))
    inner = _FakeGrid(clock, [(100.0, first), (100.5, again), (100.5, other)])
    grid = EarlyReturnGrid(inner, owner, poll_interval=0.5)
    replies = grid.send_and_receive(msgs, timeout=5.0)
    assert replies == [first, other]
    assert owner.seen == [first, again, other]  # the duplicate too, as itself
    assert owner.prioritized == [2]  # only pulls of several replies are reordered


def test_config_json_of_an_auto_run_names_the_nested_adaptive_code_and_s_auto(tmp_path):
    GradientCoding(FedAvg(), s="auto", s_max=3, results_dir=str(tmp_path))
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["code"] == "nested (adaptive)" and config["s"] == "auto"
    assert config["s_max"] == 3


def test_round_metrics_carry_the_decode_error():
    _, result, _ = _run(rounds=1, code="ignore-stragglers", s=1, max_decode_error=1.0)
    (metrics,) = result.train_metrics_clientapp.values()
    assert 0.0 < metrics["gc/decode_error"] <= 1.0  # an approximate round: a positive error


def test_keyed_central_noise_is_drawn_for_the_round_and_the_run_nonce():
    """Central DP with a server key: the noise is seeded by HMAC(key, nonce, round), so two
    runs with the same key and nonce release the same model and another nonce changes it."""
    from fl_gradcode.privacy import DPConfig, ServerNoise

    def released(nonce):
        strategy, result, _ = _run(rounds=1, dp=DPConfig(mode="central", clip_norm=1.0,
                                                         noise_multiplier=0.5),
                                   server_noise=ServerNoise(key=bytes(32)),
                                   dp_run_nonce=nonce)
        assert strategy.history[0]["decode"] == "exact"
        return result.arrays["w"].numpy()

    a, b, c = released("run-a"), released("run-a"), released("run-b")
    np.testing.assert_array_equal(a, b)
    assert np.all(np.isfinite(a)) and not np.allclose(a, c)


def test_messages_other_than_coded_train_pass_straight_to_the_inner_grid(clock):
    """Evaluate messages and plain train messages (no protocol record) are the inner grid's:
    one send_and_receive call with the caller's timeout, nothing pushed or pulled here."""
    from flwr.app import MessageType

    class Inner(_FakeGrid):
        def __init__(self):
            super().__init__(clock)
            self.passed: list[tuple[int, float | None]] = []

        def send_and_receive(self, messages, *, timeout=None):
            self.passed.append((len(list(messages)), timeout))
            return ["inner reply"]

    inner, owner = Inner(), _Owner()
    grid = EarlyReturnGrid(inner, owner)
    evaluate = Message(RecordDict(), dst_node_id=3, message_type=MessageType.EVALUATE)
    plain = Message(RecordDict({"arrays": ArrayRecord({"w": Array(np.zeros(2))})}),
                    dst_node_id=3, message_type=MessageType.TRAIN)
    assert grid.send_and_receive([evaluate], timeout=4.0) == ["inner reply"]
    assert grid.send_and_receive([plain], timeout=5.0) == ["inner reply"]
    assert grid.send_and_receive([], timeout=6.0) == ["inner reply"]
    assert inner.passed == [(1, 4.0), (1, 5.0), (0, 6.0)]
    assert inner.pulls == 0 and owner.seen == []


def test_auto_raises_the_censoring_time_of_replies_still_outstanding(monkeypatch):
    """A reply due at 100 s is late in round 1 (decoded at 3 s): at each later decision
    before 100 s the estimator learns it has still not arrived, ``now`` seconds after round 1
    started (at 0)."""
    calls = []
    real = adaptive.LatencyEstimator.observe_pending

    def spy(self, round_id, client, elapsed):
        calls.append((round_id, client, elapsed))
        return real(self, round_id, client, elapsed)

    monkeypatch.setattr(adaptive.LatencyEstimator, "observe_pending", spy)
    times = {1: [1.0, 2.0, 3.0, 100.0], 2: [1.0] * 4, 3: [1.0] * 4}
    strategy = _auto_run(FixedArrivals(times), 3, monkeypatch)
    ends = [row["virtual_s"] for row in strategy.history]  # = the next round's start
    expected = [end for end in ends[:2] if end < 100.0]
    assert ends[0] == 3.0 and expected
    assert [(r, c) for r, c, _ in calls] == [(0, 3)] * len(expected)
    assert [e for _, _, e in calls] == pytest.approx(expected)


def test_auto_prices_a_busy_client_by_the_work_it_was_sent_and_when(monkeypatch):
    """What the policy is told about a busy client is what a server knows: the work it sent
    (2 partitions at s = 1) and how long ago (since round 1 started at 0), nothing about when
    the reply will come (100 s)."""
    seen = []
    real = adaptive.choose_s

    def spy(*args, **kwargs):
        seen.append((kwargs["busy_until"], kwargs["pending"], kwargs["now"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(adaptive, "choose_s", spy)
    times = {1: [1.0, 2.0, 3.0, 100.0], 2: [1.0] * 4}
    strategy = _auto_run(FixedArrivals(times), 2, monkeypatch)
    assert strategy.history[0]["s"] == 1
    busy_until, (elapsed, units), now = seen[1]
    assert busy_until is None and now == strategy.history[0]["virtual_s"] == 3.0
    np.testing.assert_array_equal(elapsed, [np.nan, np.nan, np.nan, 3.0])
    np.testing.assert_array_equal(units, [0.0, 0.0, 0.0, 2.0])
    # round 2: work queued behind the unfinished job adds to it (sent at 0 all the same)
    row = strategy.history[1]
    assert 3 not in row["busy"]  # queued, not skipped
    policy = strategy.code_policy
    extra = float(adaptive.code_loads(policy.placement(4).code(row["s"]))[3])
    # round 1's job (sent at 0, 2 units, back at 100 s) and round 2's queued behind it (sent
    # at 3 s; 1 s of its own after the 100-s job), each with its deadline (the timeout, 1e6 s)
    node = next(nd for nd, i in policy.book.node_index.items() if i == 3)
    assert policy.outstanding[node] == [[0.0, 2.0, 100.0, 1e6], [3.0, extra, 101.0, 3.0 + 1e6]]


def test_a_busy_nodes_current_job_starts_when_the_reply_before_it_arrived():
    """Jobs not known to be done: round 1's (sent at 0, 2 units, back at 5 s) and round 2's
    (sent at 3 s, 4 units, still out). At 4 s neither is back: 6 units, started at 0. At 8 s
    the first is done: 4 units, computing since its predecessor's reply at 5 s."""
    book = GradientCoding(FedAvg(), s="auto", s_max=3, seed=0).code_policy.book
    book.outstanding[7] = [[0.0, 2.0, 5.0], [3.0, 4.0, None]]
    assert book.pending_work(7, 4.0, 9.0) == (4.0, 6.0)
    assert book.pending_work(7, 8.0, 9.0) == (3.0, 4.0)
    assert book.outstanding[7] == [[3.0, 4.0, None]]
    # no record (work sent before a restart): the given largest load, from now
    assert book.pending_work(8, 8.0, 9.0) == (0.0, 9.0)
