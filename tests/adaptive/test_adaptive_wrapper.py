"""s="auto" through the plug-in: exact rounds stay exact while s changes between rounds.

The latency state file (``latency_state``) is tested in test_adaptive_latency_state.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg

from fl_gradcode.adaptive import LatencyEstimator
from fl_gradcode.codes import NestedPlacement
from fl_gradcode.flower import GradientCoding, gradient_coding_mod
from fl_gradcode.flower.clock import VirtualClock, WallClock
from fl_gradcode.flower.testing import InProcessGrid
from fl_gradcode.latency import Bimodal, Drift, Pareto, ShiftedExponential, TraceReplay
from tests.adaptive.support import N, run
from tests.apps.vector_app import DIM, oracle, train
from tests.apps.vector_app import target as oracle_target

BIMODAL = Bimodal(base=ShiftedExponential(shift=0.1, rate=10.0), p=0.1, slowdown=20.0)


@pytest.mark.parametrize(
    "latency", [Pareto(1.0, 1.5), BIMODAL, Drift(Pareto(0.5, 1.5), BIMODAL, 4)]
)
def test_auto_rounds_are_exact_and_equal_fedavg_over_all_partitions(latency):
    strategy, theta = run(latency)
    expected = oracle(8, N)
    assert all(r["decode"] == "exact" for r in strategy.history)
    assert np.linalg.norm(theta - expected) <= 1e-9 * np.linalg.norm(expected)
    assert all(0 <= r["s"] <= 3 for r in strategy.history)
    assert strategy.history[0]["s"] == 3  # no observation yet: the safe s_max
    # no observation before round 1: no estimate (null); every later round has one
    assert strategy.history[0]["expected_round_s"] is None
    assert all(np.isfinite(r["expected_round_s"]) for r in strategy.history[1:])


def _strict(text: str) -> list[dict]:
    """JSON lines as a strict parser reads them: NaN and Infinity are not JSON."""

    def refuse(token):
        raise ValueError(f"{token} is not JSON")

    return [json.loads(line, parse_constant=refuse) for line in text.splitlines()]


def test_rounds_jsonl_of_an_auto_run_is_strict_json_with_null_before_any_estimate(tmp_path):
    strategy, _ = run(Pareto(1.0, 1.5), rounds=3, results_dir=str(tmp_path))
    rows = _strict((tmp_path / "rounds.jsonl").read_text())
    assert [r["s"] for r in rows] == [r["s"] for r in strategy.history]
    assert rows[0]["expected_round_s"] is None
    assert all(r["expected_round_s"] > 0 for r in rows[1:])


def test_auto_is_reproducible():
    a, theta_a = run(Pareto(1.0, 1.5), rounds=5)
    b, theta_b = run(Pareto(1.0, 1.5), rounds=5)
    assert [r["s"] for r in a.history] == [r["s"] for r in b.history]
    assert [r["virtual_s"] for r in a.history] == [r["virtual_s"] for r in b.history]
    np.testing.assert_array_equal(theta_a, theta_b)


def test_auto_picks_little_coding_when_latency_is_deterministic_and_load_scaled():
    """T = load * 0.1 exactly: every extra partition costs time and no one straggles."""
    strategy, _ = run(ShiftedExponential(shift=0.1, rate=1e9), rounds=10)
    assert np.mean([r["s"] for r in strategy.history[3:]]) < 1.0


# ------------------------------------------------------------------ busy clients: queue or skip
def trace(tmp_path, rows):
    """A deterministic latency trace: ``rows[r][w]`` seconds for worker ``w`` in trace round
    ``r`` (round ``k`` of a run replays row ``k mod len(rows)``)."""
    path = tmp_path / "trace.csv"
    lines = ["round,worker,arrival_s"]
    lines += [f"{r},{w},{t}" for r, row in enumerate(rows) for w, t in enumerate(row)]
    path.write_text("\n".join(lines) + "\n")
    return TraceReplay(str(path))


def run_fixed(latency, busy, n=4, rounds=3):
    app = ClientApp(mods=[gradient_coding_mod])
    app.train()(train)
    strategy = GradientCoding(
        FedAvg(fraction_evaluate=0.0, min_available_nodes=n), code="frc", s=1, latency=latency,
        seed=0, wire="float64", straggler_timeout=1e6, measured_compute=False, busy=busy,
    )
    result = strategy.start(grid=InProcessGrid(app, n),
                            initial_arrays=ArrayRecord({"w": Array(np.zeros(DIM))}),
                            num_rounds=rounds, train_config=ConfigRecord({}))
    return strategy, result.arrays["w"].numpy()


def test_virtual_clock_starts_queued_work_when_the_current_job_ends():
    clock = VirtualClock(straggler_timeout=100.0)
    clock.busy_until = {10: 5.0, 11: 0.5}
    clock.now = 2.0
    clock.start_round({0: 10})  # worker 0 (node 10) is busy until 5.0: 3 s of backlog
    assert clock.backlog == {0: 3.0}
    window = clock.window({0: 1.5, 1: 4.0}, lambda used: len(used) == 2, num_sent=2)
    assert window.used == [1, 0] and window.end == 2.0 + 3.0 + 1.5  # 4.0 < 3.0 + 1.5
    clock.finish_round([10, 11], {10: 1.5, 11: 4.0}, window.end)
    assert clock.busy_until == {10: 6.5, 11: 6.0} and clock.now == 6.5
    assert clock.last_duration == 4.5
    clock.start_round()  # nothing queued: no backlog left over from the last round
    assert clock.backlog == {}
    with pytest.raises(ValueError, match="wallclock"):
        WallClock(1.0).start_round({0: 10})


def test_busy_clients_get_queued_work_and_reply_after_their_current_job(tmp_path):
    """FRC n=4, s=1: groups (0, 1), (2, 3), one reply each; latency replayed from a trace.

    Round 1 (times 6, 10, 6, 10): decodes at 6 from workers 0 and 2; 1 and 3 busy until 10.
    Round 2 (1, 20, 1, 20 -> workers 0..3: 20, 1, 20, 1): queue: 1 and 3 (4 s of backlog, less
    than the last round's 6 s) reply at 6 + 4 + 1 = 11, so the round ends at 11 and 0, 2 stay
    busy until 26; skip: 1 and 3 get no work, the round waits for 0 and 2 until 26.
    Round 3 (1, 2, 1, 3): queue: 0 and 2 have 15 s of backlog (more than the last round's 5 s):
    skipped; 1 and 3 are free and decode at 11 + 3 = 14. Skip: everyone free at 26, ends 27.
    """
    latency = trace(tmp_path, [[1, 2, 1, 3], [6, 10, 6, 10], [20, 1, 20, 1]])
    queued, theta_q = run_fixed(latency, "queue")
    skipped, theta_s = run_fixed(latency, "skip")
    assert [r["virtual_s"] for r in queued.history] == [6.0, 11.0, 14.0]
    assert [r["busy"] for r in queued.history] == [[], [], [0, 2]]
    assert [r["virtual_s"] for r in skipped.history] == [6.0, 26.0, 27.0]
    assert [r["busy"] for r in skipped.history] == [[], [1, 3], []]
    expected = oracle(3, 4)
    for strategy, theta in ((queued, theta_q), (skipped, theta_s)):
        assert all(r["decode"] == "exact" for r in strategy.history)
        assert np.linalg.norm(theta - expected) <= 1e-9 * np.linalg.norm(expected)


def test_busy_default_is_queue_for_auto_and_skip_for_fixed_codes_and_wallclock_skips():
    assert GradientCoding(FedAvg(), s="auto").busy_mode == "queue"
    assert GradientCoding(FedAvg(), s=1).busy_mode == "skip"
    assert GradientCoding(FedAvg(), s=1, busy="queue").busy_mode == "queue"
    assert GradientCoding(FedAvg(), s="auto", timing="wallclock").busy_mode == "skip"
    fit = GradientCoding(FedAvg(), s=1, busy="fit")
    assert fit.busy_mode == "fit" and fit.code_policy.estimating
    assert not GradientCoding(FedAvg(), s=1, busy="queue").code_policy.estimating
    wall = GradientCoding(FedAvg(), s=1, busy="skip", timing="wallclock")
    assert wall.busy_mode == "skip" and not wall.code_policy.estimating
    with pytest.raises(ValueError, match=r"busy='later'.*'fit'"):
        GradientCoding(FedAvg(), s=1, busy="later")


@pytest.mark.parametrize(
    ("busy_mode", "busy_workers", "expected_s"),
    [
        # queue: s=0 ends at max(0.5 + 1, 1) = 1.5 < s=1's 2 (load 2): uncoded, busy queued
        ("queue", range(6), 0),
        ("queue", range(1, 12, 2), 0),
        # skip: busy clients never reply; with one free client per pair s=1 (load 2) decodes
        # at 2, s=2 (groups of 4 needing 2, load 3) at 3, s=3 (load 4) at 4
        ("skip", range(1, 12, 2), 1),
        # skip, workers 0..5 busy: pairs (0,1)..(4,5) and group (0..3) cannot decode: s=3
        # is the tie-break among codes that never finish
        ("skip", range(6), 3),
    ],
)
def test_auto_is_not_trapped_at_s_max_when_half_the_cohort_is_busy(
    busy_mode, busy_workers, expected_s
):
    """Deterministic latency, 1 s per partition (beta = 1), 6 of 12 clients busy for 0.5 s.
    Earlier versions only considered s >= #busy = 6 > s_max and fell back to s_max = 3."""
    # (work runs to its end here: the outstanding jobs below carry no stop time)
    strategy = GradientCoding(FedAvg(), s="auto", s_max=3, busy=busy_mode, seed=0,
                              stop_late_work=False)
    policy = strategy.code_policy
    cohort = list(range(100, 112))
    estimator = LatencyEstimator(N, load_exponent=1.0)
    estimator.update(np.ones(N), np.ones(N), 1.0)
    policy.placements[N] = NestedPlacement(N, 3, seed=0)
    policy.book.estimator = estimator
    policy.book.node_index = {node: i for i, node in enumerate(cohort)}
    strategy.clock.now = 10.0
    busy_nodes = {cohort[w] for w in busy_workers}
    strategy.clock.busy_until = {node: 10.5 for node in busy_nodes}
    # the server's knowledge: one partition sent 0.5 s ago, not returned; at 1 s per
    # partition (every observation so far) it needs 0.5 s more
    policy.outstanding.update({node: [[9.5, 1.0, None]] for node in busy_nodes})
    code = policy.plan(cohort, busy_nodes)
    assert code.s == expected_s
    decision = policy.decision
    if busy_mode == "queue":
        assert decision.skip == ()
        # uncoded: 0.5 s busy + 1 s this round, then 1 s next round with no backlog left;
        # the wrapper compares two-round means (lookahead): (1.5 + 1) / 2
        assert decision.expected_times[0] == pytest.approx(1.25)
        assert policy.queued(busy_nodes, cohort) == busy_nodes
    else:
        assert decision.skip == tuple(sorted(busy_workers))
        assert policy.queued(busy_nodes, cohort) == set()


def test_fixed_code_with_busy_fit_queues_from_the_servers_knowledge_not_the_clock():
    """Fixed s = 1 (pairs, load 2 at 1 s per partition: 2-s rounds). Worker 1 was sent one
    partition 0.5 s ago and has not replied: 0.5 s left, it starts its new work in time:
    queued. Worker 4 was sent 100 partitions 0.1 s ago: 99.9 s left: skipped. The virtual
    clock says the opposite (worker 1's reply arrives in 50 s, worker 4's in 0.1 s), which
    busy="queue" follows (queued if its job ends within the last round's 3 s) and busy="fit"
    must not read."""
    cohort = list(range(100, 112))
    busy_nodes = {cohort[1], cohort[4]}

    def strategy_for(busy):
        strategy = GradientCoding(FedAvg(), code="nested", s=1, s_max=3, busy=busy, seed=0)
        policy = strategy.code_policy
        estimator = LatencyEstimator(N, load_exponent=1.0)
        estimator.update(np.ones(N), np.ones(N), 1.0)
        policy.book.estimator = estimator
        policy.book.node_index = {node: i for i, node in enumerate(cohort)}
        strategy.clock.now, strategy.clock.last_duration = 10.0, 3.0
        strategy.clock.busy_until = {cohort[1]: 60.0, cohort[4]: 10.1}
        policy.outstanding.update({cohort[1]: [[9.5, 1.0, None]],
                                   cohort[4]: [[9.9, 100.0, None]]})
        return policy

    fit = strategy_for("fit")
    assert fit.plan(cohort, busy_nodes).s == 1
    assert (fit.decision.s, fit.decision.skip) == (1, (4,))
    assert fit.decision.expected_times == {1: pytest.approx(2.0)}
    assert fit.queued(busy_nodes, cohort) == {cohort[1]}
    queue = strategy_for("queue")
    assert queue.plan(cohort, busy_nodes).s == 1 and queue.decision is None
    assert queue.queued(busy_nodes, cohort) == {cohort[4]}


def test_fixed_code_with_busy_fit_runs_exact_rounds_and_feeds_its_estimator():
    app = ClientApp(mods=[gradient_coding_mod])
    app.train()(train)
    strategy = GradientCoding(
        FedAvg(fraction_evaluate=0.0, min_available_nodes=N), code="nested", s=1, s_max=3,
        busy="fit", latency=BIMODAL, seed=0, wire="float64", straggler_timeout=1e6,
        compute_cost_s=0.1, measured_compute=False,
    )
    result = strategy.start(grid=InProcessGrid(app, N),
                            initial_arrays=ArrayRecord({"w": Array(np.zeros(DIM))}),
                            num_rounds=8, train_config=ConfigRecord({}))
    expected = oracle(8, N)
    theta = result.arrays["w"].numpy()
    assert all(r["decode"] == "exact" and r["s"] == 1 for r in strategy.history)
    assert np.linalg.norm(theta - expected) <= 1e-9 * np.linalg.norm(expected)
    assert strategy.code_policy.book.estimator.n_rounds == 8
    # the work each node was sent is tracked: the last round's jobs, one per node sent work
    assert sum(len(jobs) for jobs in strategy.code_policy.outstanding.values()) >= N - 1


def test_fixed_nested_code_uses_the_placement_auto_would_use():
    """code="nested" with a fixed s and s_max: the code for s of NestedPlacement(n, s_max),
    i.e. the fixed-s counterpart of s="auto" (same data placement, same groups)."""
    code = GradientCoding(FedAvg(), code="nested", s=2, s_max=3).code_for(N)
    expected = NestedPlacement(N, 3, seed=0).code(2)
    np.testing.assert_array_equal(code.B, expected.B)
    assert code.decode_groups == expected.decode_groups
    alone = GradientCoding(FedAvg(), code="nested", s=2).code_for(N)  # s_max = s: another code
    assert alone.decode_groups != expected.decode_groups


def test_auto_falls_at_most_to_half_the_last_rounds_s():
    """Trust region: the same deterministic state as above prefers uncoded (1.5 s), but after a
    round at s = 3 the next round may only go down to s = 1 (the best of s >= 1: 2 s)."""
    policy = GradientCoding(FedAvg(), s="auto", s_max=3, seed=0).code_policy
    cohort = list(range(100, 112))
    estimator = LatencyEstimator(N, load_exponent=1.0)
    estimator.update(np.ones(N), np.ones(N), 1.0)
    policy.placements[N] = NestedPlacement(N, 3, seed=0)
    policy.book.estimator = estimator
    policy.book.node_index = {node: i for i, node in enumerate(cohort)}
    assert policy.plan(cohort, set()).s == 0  # no previous round: no limit
    policy.last_s[N] = 3  # the last round (this cohort size) was at s = 3
    code = policy.plan(cohort, set())
    assert code.s == 1 and set(policy.decision.expected_times) == {1, 2, 3}
    assert policy.decision.expected_times[1] == pytest.approx(2.0)


@pytest.mark.parametrize(("margin", "last_s"), [(0.0, 1), (0.75, 2), (1.5, 3)])
def test_auto_margin_picks_the_most_tolerant_s_within_its_factor_of_the_fastest(margin, last_s):
    """Reply times proportional to the load (1 s per partition, no spread): s costs s + 1
    partitions. Round 1 has no observation (s_max = 3); the trust region lets the last of 4
    rounds fall at most to half of 3 (s = 1, load 2). ``auto_margin`` m takes the most tolerant
    s predicted within (1 + m) of the fastest: m = 0 the fastest (s = 1), m = 0.75 also s = 2
    (3 partitions: 1.5x), m = 1.5 also s = 3 (4 partitions: 2x). A negative margin is refused
    with its value."""
    strategy, _ = run(ShiftedExponential(shift=1.0, rate=1e12), rounds=4, auto_margin=margin)
    assert strategy.history[0]["s"] == 3
    assert strategy.history[-1]["s"] == last_s
    with pytest.raises(ValueError, match="auto_margin=-1"):
        GradientCoding(FedAvg(), s="auto", auto_margin=-1)


def test_the_estimator_splits_a_queued_reply_at_the_arrival_of_the_reply_before_it():
    """FRC n=4, s=1 (loads 2), a round from 6 s to 11 s; every reply arrives at 11 s. Worker
    1's earlier reply arrived at 10 s: its new work waited 4 s and took 1 s. Worker 3's
    earlier job never answered: when its new work started is unknown, so the round tells
    nothing about it. Workers 0 and 2 had nothing queued: 5 s of their own. The clock holds
    no backlog: the split must come from the server's records of what it sent and got."""
    from types import SimpleNamespace

    from fl_gradcode.flower.clock import RoundWindow

    cohort = [10, 11, 12, 13]
    strategy = GradientCoding(FedAvg(), code="frc", s=1, busy="fit", seed=0)
    policy = strategy.code_policy
    policy.book.estimator = LatencyEstimator(4)
    policy.book.node_index = {node: i for i, node in enumerate(cohort)}
    strategy.clock.now = strategy.clock.round_start = 6.0
    policy.outstanding.update({10: [[6.0, 2.0, None]], 11: [[0.0, 2.0, 10.0], [6.0, 2.0, None]],
                               12: [[6.0, 2.0, None]], 13: [[0.0, 2.0, None], [6.0, 2.0, None]]})
    state = SimpleNamespace(code=strategy.code_for(4), cohort=cohort, busy=[1, 3],
                            sent=dict.fromkeys(range(4)))
    policy.observe(state, dict.fromkeys(range(4), 5.0), RoundWindow([0, 1, 2, 3], 11.0))
    rec = policy.book.estimator.rounds[-1]
    np.testing.assert_allclose(rec.busy, [0.0, 4.0, 0.0, 5.0])
    np.testing.assert_allclose(rec.y[:3], [5.0, 1.0, 5.0])
    np.testing.assert_array_equal(rec.load, [2.0, 2.0, 2.0, 0.0])
    # each job is recorded as back when its reply arrived
    assert [jobs[-1][2] for jobs in policy.outstanding.values()] == [11.0] * 4


# ------------------------------------------------------------------ sampled cohorts
def test_auto_keeps_what_it_learnt_about_nodes_across_sampled_cohorts(monkeypatch):
    """FedAvg(fraction_train=0.5): a different 6 of 12 nodes every round. Deterministic,
    load-scaled latency (every extra partition costs time): the estimator must carry what
    it learnt about each node from round to round, so auto leaves s_max. (Earlier versions
    started a new estimator whenever the cohort changed: s = s_max = 2 in every round.) Every
    round is exact: the model equals numpy FedAvg over each round's sampled partitions."""
    import random

    from fl_gradcode.adaptive import CohortView
    from fl_gradcode.flower.policy import AdaptiveCodePolicy

    cohorts, views = [], []
    real = AdaptiveCodePolicy.estimator

    def spy(self, n, cohort):
        cohorts.append([int(self.partition_key(node).split("/")[0]) for node in cohort])
        views.append(real(self, n, cohort))
        return views[-1]

    monkeypatch.setattr(AdaptiveCodePolicy, "estimator", spy)
    random.seed(3)  # Flower's FedAvg samples its cohort with the random module
    app = ClientApp(mods=[gradient_coding_mod])
    app.train()(train)
    strategy = GradientCoding(
        FedAvg(fraction_train=0.5, fraction_evaluate=0.0, min_available_nodes=N), s="auto",
        s_max=2, latency=ShiftedExponential(shift=0.1, rate=1e9), seed=0, wire="float64",
        straggler_timeout=1e6, compute_cost_s=0.1, measured_compute=False,
    )
    rounds = 10
    result = strategy.start(grid=InProcessGrid(app, N),
                            initial_arrays=ArrayRecord({"w": Array(np.zeros(DIM))}),
                            num_rounds=rounds, train_config=ConfigRecord({}))
    assert len({tuple(c) for c in cohorts}) > 1 and all(len(c) == 6 for c in cohorts)
    assert all(r["decode"] == "exact" for r in strategy.history)
    # reference: numpy FedAvg over each round's sampled partitions (n_j = 10 + 3j)
    theta = np.zeros(DIM)
    for pids in cohorts:
        sizes = np.array([10.0 + 3 * j for j in pids])
        models = np.array([theta - 0.5 * (theta - oracle_target(j)) for j in pids])
        theta = sizes @ models / sizes.sum()
    got = result.arrays["w"].numpy()
    assert np.linalg.norm(got - theta) <= 1e-9 * np.linalg.norm(theta)
    # one estimator for every node sampled so far, seen through each cohort
    book = strategy.code_policy.book
    assert book.estimator.n_rounds == rounds
    assert book.estimator.n == len(book.node_index) == len({p for c in cohorts for p in c})
    assert any(isinstance(v, CohortView) for v in views)
    assert np.mean([r["s"] for r in strategy.history[3:]]) < 1.0


def test_cohort_view_selects_its_members_columns_and_validates():
    from fl_gradcode.adaptive import CohortView

    est = LatencyEstimator(5, seed=1, load_exponent=1.0)
    est.update([1.0, 2.0, 3.0, 4.0, 5.0], np.ones(5), 5.0)
    view = est.view([4, 0])
    assert view.n == 2 and view.has_data and view.load_exponent == 1.0
    full = est.sample(16, np.random.default_rng(0))
    np.testing.assert_array_equal(view.sample(16, np.random.default_rng(0)), full[:, [4, 0]])
    np.testing.assert_array_equal(view.slowness(), est.slowness()[[4, 0]])
    rem = view.sample_remaining([0.5, np.nan], [1.0, 0.0], 8, np.random.default_rng(2))
    assert rem.shape == (8, 2) and np.all(rem[:, 1] == 0) and np.all(rem[:, 0] >= 0)
    for bad, message in (([5], "member 5"), ([1, 1], "distinct"), ([], "non-empty")):
        with pytest.raises(ValueError, match=message):
            CohortView(est, bad)
    est.grow(7)  # new nodes join with no record
    assert est.n == 7 and est.slowness().shape == (7,) and est.slowness()[6] == 1.0
    with pytest.raises(ValueError, match="n=3"):
        est.grow(3)


def test_simulated_latency_follows_the_node_not_its_position_in_a_sampled_cohort():
    """The node holding partition 3 is 20x slower (persistent); FedAvg samples 6 of 12 nodes a
    round and the uncoded code waits for all of them: a round is slow exactly when that node
    was sampled, wherever it sits in the cohort. (Earlier versions keyed simulated latency by
    the position in the cohort: every 6-node cohort has a position 3, so every round was
    slow.)"""
    import random

    from fl_gradcode.latency import PersistentSlow

    cohorts = []

    random.seed(1)
    app = ClientApp(mods=[gradient_coding_mod])
    app.train()(train)
    strategy = GradientCoding(
        FedAvg(fraction_train=0.5, fraction_evaluate=0.0, min_available_nodes=N),
        code="uncoded", s=0, seed=0, wire="float64", straggler_timeout=1e6,
        latency=PersistentSlow(base=ShiftedExponential(shift=0.1, rate=1e9), p=0.0,
                               slowdown=20.0, slow=(3,)),
        measured_compute=False,
    )
    real = strategy.code_policy.plan

    def spy(cohort, busy_nodes):
        cohorts.append({strategy.identities[node].partition_id for node in cohort})
        return real(cohort, busy_nodes)

    strategy.code_policy.plan = spy
    strategy.start(grid=InProcessGrid(app, N),
                   initial_arrays=ArrayRecord({"w": Array(np.zeros(DIM))}),
                   num_rounds=8, train_config=ConfigRecord({}))
    sampled = [3 in c for c in cohorts]
    assert any(sampled) and not all(sampled)
    # 0.1 s per unit of load (a partition's examples over the mean share: 0.4 to 1.9 here),
    # 20x for the slow node: slow rounds take at least 0.8 s, the others at most 0.2 s
    slow = [row["round_virtual_s"] > 0.5 for row in strategy.history]
    assert slow == sampled
