"""s="auto" with auto_approximate: approximate rounds with a deadline, priced by the expected
round time over one minus the update's relative error measured in exact rounds.

Expected values are computed by hand from the stated model (cost = E[T] / (1 - E[e])), never
read from the code under test."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg

from fl_gradcode.adaptive import (
    ApproxCandidate,
    DecodeErrors,
    LatencyEstimator,
    choose_progress,
    measure_errors,
    price_candidates,
    progress_cost,
)
from fl_gradcode.adaptive.approximate import (
    approximate_candidates,
    missing_weights,
    price_deadline,
    repetition_supports,
)
from fl_gradcode.codes import NestedPlacement, make_code
from fl_gradcode.codes.base import GradientCode
from fl_gradcode.flower import GradientCoding, gradient_coding_mod
from fl_gradcode.flower.protocol import Identity
from fl_gradcode.flower.testing import InProcessGrid
from fl_gradcode.latency import Bimodal, PersistentSlow, ShiftedExponential


# ------------------------------------------------------------------ the pure choice
def test_cost_per_unit_of_progress_is_time_over_one_minus_error():
    assert progress_cost(0.6, 0.1) == pytest.approx(0.6 / 0.9)
    assert progress_cost(2.0, 0.0) == 2.0
    assert progress_cost(1.0, 1.0) == math.inf  # no progress
    assert progress_cost(math.inf, 0.0) == math.inf


def _cand(s, d, t, e):
    return ApproxCandidate(s, d, t, e, progress_cost(t, e))


def test_choice_drops_when_dropping_is_cheap_and_codes_when_it_is_not():
    # by hand: exact s=2 costs 1.0 s per round; dropping with s=0 by d=0.6 (E[T]=0.6,
    # E[e]=0.1) costs 0.6/0.9 = 0.667; with s=1 by d=0.5 (E[e]=0.4): 0.5/0.6 = 0.833
    exact = _cand(2, math.inf, 1.0, 0.0)
    cheap = [_cand(0, 0.6, 0.6, 0.1), _cand(1, 0.5, 0.5, 0.4)]
    best = choose_progress(exact, cheap)
    assert (best.s, best.deadline) == (0, 0.6)
    # non-IID: the same deadlines with large measured errors, 0.6/0.5 = 1.2 and 0.5/0.3 =
    # 1.67, both above the exact round's 1.0: keep the code
    costly = [_cand(0, 0.6, 0.6, 0.5), _cand(1, 0.5, 0.5, 0.7)]
    assert choose_progress(exact, costly) is None
    assert choose_progress(1.0, []) is None


def test_a_deadline_is_priced_from_the_draws_by_hand():
    # two draws, four clients; the round decodes exactly at ``decode``
    finish = np.array([[0.1, 0.2, 0.3, 2.0],
                       [0.1, 0.2, 0.3, 0.4]])
    decode = np.array([2.0, 0.4])  # draw 0 needs client 3 (slow), draw 1 decodes at 0.4
    errors = {1: 0.2, 2: 0.5}
    c = price_deadline(0, 0.35, finish, decode, errors.get, error_power=1.0)
    # draw 0: stops at 0.35, 3 replies in hand, 4 at the exact decode: 1 short, e = 0.2
    # draw 1: stops at 0.35 (decode 0.4 later), 3 in hand of 4: 1 short, e = 0.2
    assert c.time == pytest.approx((0.35 + 0.35) / 2)
    assert c.error == pytest.approx(0.2)
    assert c.cost == pytest.approx(0.35 / 0.8)
    c = price_deadline(0, 0.25, finish, decode, errors.get, error_power=1.0)
    # both draws: 2 replies by 0.25, 4 at the exact decode: 2 short, e = 0.5
    assert (c.time, c.error) == (pytest.approx(0.25), pytest.approx(0.5))
    c = price_deadline(0, 1.0, finish, decode, errors.get, error_power=1.0)
    # draw 0: 3 of 4 by 1.0, e = 0.2; draw 1 decodes exactly at 0.4, e = 0
    assert c.time == pytest.approx((1.0 + 0.4) / 2) and c.error == pytest.approx(0.1)
    c = price_deadline(0, 0.05, finish, decode, errors.get,
                       error_power=1.0)  # nothing by then: skipped
    assert c.error == 1.0 and c.cost == math.inf
    c = price_deadline(0, 0.35, finish, decode, {}.get, error_power=1.0)  # never measured
    assert c.cost == math.inf


def test_the_quadratic_progress_model_prices_each_draw_by_one_minus_its_error_squared():
    finish = np.array([[0.1, 0.2, 0.3, 2.0],
                       [0.1, 0.2, 0.3, 0.4]])
    decode = np.array([2.0, 0.4])
    errors = {1: 0.2, 2: 0.5}
    # d = 1.0: draw 0 is one reply short (e = 0.2), draw 1 exact (e = 0): progress
    # ((1 - 0.04) + 1) / 2 = 0.98 per round; mean time (1.0 + 0.4) / 2; error the mean e
    c = price_deadline(0, 1.0, finish, decode, errors.get, error_power=2.0)
    assert c.time == pytest.approx(0.7) and c.error == pytest.approx(0.1)
    assert c.cost == pytest.approx(0.7 / 0.98)
    # the same through approximate_candidates' deadlines: p = 1 and p = 2 price the same
    # deadlines and times, p = 2 never dearer
    linear = approximate_candidates(0, finish, decode, errors.get, 2, error_power=1.0)
    quadratic = approximate_candidates(0, finish, decode, errors.get, 2, error_power=2.0)
    assert [(c.deadline, c.time, c.error) for c in linear] == \
        [(c.deadline, c.time, c.error) for c in quadratic]
    assert all(q.cost <= lin.cost for q, lin in zip(quadratic, linear, strict=True))
    # no reply by the deadline is still no progress
    assert price_deadline(0, 0.05, finish, decode, errors.get, error_power=2.0).cost == math.inf


def test_the_progress_model_decides_between_a_deadline_and_the_exact_round():
    # exact: 1.0 s a round; a deadline at 0.6 s with measured error 0.45 in every draw:
    # 0.6 / 0.55 = 1.09 under 1 - e (keep the exact round), 0.6 / (1 - 0.2025) = 0.75
    # under 1 - e^2 (take the deadline)
    finish = np.full((3, 4), 0.5)
    finish[:, 3] = 1.0
    decode = np.full(3, 1.0)
    exact = _cand(2, math.inf, 1.0, 0.0)
    linear = price_deadline(0, 0.6, finish, decode, {1: 0.45}.get, error_power=1.0)
    quadratic = price_deadline(0, 0.6, finish, decode, {1: 0.45}.get, error_power=2.0)
    assert linear.cost == pytest.approx(0.6 / 0.55)
    assert quadratic.cost == pytest.approx(0.6 / (1 - 0.45 ** 2))
    assert choose_progress(exact, [linear]) is None
    assert choose_progress(exact, [quadratic]) == quadratic


@pytest.mark.parametrize("power", [0.0, -1.0, math.inf, math.nan])
def test_a_progress_power_that_is_not_positive_and_finite_is_refused_by_name(power):
    finish, decode = np.array([[0.1, 0.2]]), np.array([0.2])
    with pytest.raises(ValueError, match="error_power"):
        price_deadline(0, 0.15, finish, decode, {1: 0.1}.get, error_power=power)


def test_measured_error_compares_the_partial_update_with_the_exact_one():
    placement = NestedPlacement(6, 1, seed=0)
    code = placement.code(0)  # uncoded: worker i holds partition i
    rng = np.random.default_rng(3)
    g = rng.standard_normal((6, 5))  # per-partition updates
    n = np.arange(1.0, 7.0)
    order = [4, 1, 0, 5, 3, 2]
    vectors = {i: np.concatenate([code.B[i] @ (n[:, None] * g), [code.B[i] @ n]])
               for i in range(6)}
    errors = measure_errors(code, order, vectors, 2)
    exact = n @ g / n.sum()
    for j in (1, 2):
        kept = order[: 6 - j]  # numpy oracle: the weighted mean of the partitions kept
        partial = n[kept] @ g[kept] / n[kept].sum()
        expected = np.linalg.norm(partial - exact) / np.linalg.norm(exact)
        assert errors[j] == pytest.approx(min(expected, 1.0), rel=1e-9)


def test_errors_are_an_exponentially_weighted_mean_per_tolerance_and_shortfall():
    book = DecodeErrors(alpha=0.5)
    book.update(1, {1: 0.4})
    book.update(1, {1: 0.2, 2: 0.6})
    assert book.get(1, 1) == pytest.approx(0.3) and book.get(1, 2) == pytest.approx(0.6)
    assert book.get(0, 1) is None and book.measured(1) and not book.measured(0)


def _estimator(n, slow, slowdown, rounds=12):
    """Synthetic observations: client times 0.1..0.2 per unit of load, ``slow`` clients
    ``slowdown`` times slower in every round."""
    est = LatencyEstimator(n, seed=0, load_exponent=1.0)
    rng = np.random.default_rng(0)
    for _ in range(rounds):
        t = 0.1 + 0.1 * rng.random(n)
        t[list(slow)] *= slowdown
        est.update(t, np.ones(n), float(t.max()) + 1e-9)
    return est


@pytest.mark.parametrize(("slow", "slowdown", "error", "approximate"), [
    ((3,), 1.5, 0.02, True),   # a mild straggler, IID-like partitions: drop it
    ((3, 7), 20.0, 0.6, False),  # persistent heavy stragglers, non-IID: code
])
def test_the_choice_with_a_fitted_estimator(slow, slowdown, error, approximate):
    n = 12
    placement = NestedPlacement(n, 3, seed=0)
    est = _estimator(n, slow, slowdown)
    book = DecodeErrors()
    for s in (0, 1, 2, 3):
        book.update(s, {1: error, 2: error, 3: error})
    X = est.sample(256, np.random.default_rng(1))
    exact, approx = price_candidates(placement, est, [0, 1, 2, 3], book, np.zeros(n), X,
                                     max_short=3, error_power=1.0)
    best_exact = min(exact.values(), key=lambda c: c.cost)
    best = choose_progress(best_exact, approx)
    assert (best is not None) == approximate
    if best is not None:  # its cost is its time over one minus its error, and below exact
        assert best.cost == pytest.approx(best.time / (1 - best.error))
        assert best.cost < best_exact.cost and math.isfinite(best.deadline)


# ------------------------------------------------------------------ the missing-weight model
def test_missing_weights_count_the_partitions_no_reply_in_hand_computed():
    # FRC(4, 1): workers 0, 1 compute partitions {0, 1}, workers 2, 3 partitions {2, 3}
    code = make_code("frc", 4, 1)
    assert [set(code.assignment(w)) for w in range(4)] == [{0, 1}, {0, 1}, {2, 3}, {2, 3}]
    # arrival order 0, 2, 1, 3: the first 3 and the first 2 cover all; the first 1 half
    assert missing_weights(code, [0, 2, 1, 3], 3) == {1: 0.0, 2: 0.0, 3: 0.5}
    assert missing_weights(code, [0, 1, 2, 3], 2) == {1: 0.0, 2: 0.5}


def test_heterogeneity_is_fitted_from_the_measurements_with_a_missing_partition():
    book = DecodeErrors(alpha=0.3)
    assert book.by_weight(np.array([0.2])) is None  # nothing measured
    # j = 1 misses no partition (w = 0): it informs the (s, j) table, not c
    book.update(2, {1: 0.2, 2: 0.5}, {1: 0.0, 2: 0.25})
    c = 0.5 / (0.25 / 0.75)  # 1.5, by hand
    assert book.heterogeneity == pytest.approx(c)
    got = book.by_weight(np.array([0.0, 0.1, 0.5, 1.0]))
    np.testing.assert_allclose(got, [0.0, c * 0.1 / 0.9, 1.0, 1.0])
    # a second round: this round's c' = (0.1 + 0.3) / (0.1/0.9 + 0.2/0.8), weighted 0.3
    book.update(0, {1: 0.1, 2: 0.3}, {1: 0.1, 2: 0.2})
    c2 = (0.1 + 0.3) / (0.1 / 0.9 + 0.2 / 0.8)
    assert book.heterogeneity == pytest.approx(0.7 * c + 0.3 * c2)
    # a decoding the wrapper skips (e = 1) says nothing of the partitions: left out of c
    book.update(0, {1: 0.1, 2: 1.0}, {1: 0.1, 2: 0.2})
    c3 = 0.1 / (0.1 / 0.9)
    assert book.heterogeneity == pytest.approx(0.7 * (0.7 * c + 0.3 * c2) + 0.3 * c3)
    before = book.heterogeneity
    book.update(0, {1: 1.0}, {1: 0.5})  # nothing usable: c unchanged
    assert book.heterogeneity == before


def test_only_repetition_codes_are_priced_by_their_missing_weight():
    frc = make_code("frc", 4, 1)
    np.testing.assert_array_equal(repetition_supports(frc), [[1, 1, 0, 0], [1, 1, 0, 0],
                                                             [0, 0, 1, 1], [0, 0, 1, 1]])
    np.testing.assert_array_equal(repetition_supports(make_code("uncoded", 3, 0)), np.eye(3))
    # overlapping supports (a cyclic placement): covering every partition is not decoding
    cyclic = GradientCode(np.array([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0], [1.0, 0.0, 1.0]]), 1,
                          is_exact=True)
    assert repetition_supports(cyclic) is None
    # disjoint supports, a coefficient other than 1
    scaled = GradientCode(np.array([[2.0, 0.0], [0.0, 1.0]]), 0, is_exact=True)
    assert repetition_supports(scaled) is None


def test_measured_errors_stop_at_the_replies_in_hand():
    # two replies: j = 1 decodes one of them, j = 2 none; never a j beyond the replies
    code = make_code("uncoded", 2, 0)
    vectors = {0: np.array([1.0, 0.0, 1.0]), 1: np.array([0.0, 1.0, 1.0])}
    got = measure_errors(code, [0, 1], vectors, max_short=5)
    assert set(got) == {1, 2}


def test_a_deadline_of_a_tolerance_never_run_exactly_is_priced_by_its_missing_weight():
    # uncoded, three clients, two draws; deadline 0.3. Draw 0: replies at 0.1, 0.2, 5.0,
    # decodes at 5.0 > d: late, one of three partitions missing, w = 1/3, modelled error
    # c w / (1 - w) = 0.5 with c = 1. Draw 1: decodes at 0.2 <= d, exact.
    finish = np.array([[0.1, 0.2, 5.0], [0.1, 0.15, 0.2]])
    decode = np.array([5.0, 0.2])
    book = DecodeErrors()
    book.heterogeneity = 1.0
    c = price_deadline(0, 0.3, finish, decode, lambda j: None, book.by_weight, np.eye(3),
                       error_power=1.0)
    assert c.time == pytest.approx((0.3 + 0.2) / 2)
    assert c.error == pytest.approx(0.5 / 2)
    assert c.cost == pytest.approx(0.25 / 0.75)
    # no reply by the deadline: no progress (error 1) whatever the model says
    c = price_deadline(0, 0.05, finish, decode, lambda j: None, book.by_weight, np.eye(3))
    assert c.error == pytest.approx(1.0)
    # w = 1/3 above max_decode_error = 0.3: the wrapper would skip the round (error 1)
    c = price_deadline(0, 0.3, finish, decode, lambda j: None, book.by_weight, np.eye(3),
                       max_decode_error=0.3, error_power=1.0)
    assert c.error == pytest.approx(1.0 / 2)


# ------------------------------------------------------------------ through the plug-in
N, DIM = 12, 20


def _train(spread):
    def train(msg: Message, context) -> Message:
        pid = int(context.node_config["partition-id"])
        target = 1.0 + spread * np.random.default_rng([5, pid]).standard_normal(DIM)
        theta = msg.content["arrays"]["w"].numpy()
        return Message(RecordDict({"arrays": ArrayRecord({"w": Array(theta + 0.5 * (target
                                                                                     - theta))}),
                                   "metrics": MetricRecord({"num-examples": 10})}),
                       reply_to=msg)
    return train


def _run(tmp_path, spread, auto_approximate=True, rounds=12, latency=None, s_max=3):
    """A run of N clients (bimodal latency unless ``latency``) with ``s="auto"``."""
    app = ClientApp(mods=[gradient_coding_mod])
    app.train()(_train(spread))
    strategy = GradientCoding(
        FedAvg(fraction_evaluate=0.0, min_available_nodes=N), s="auto", s_max=s_max, seed=0,
        latency=latency or Bimodal(base=ShiftedExponential(shift=0.1, rate=10.0), p=0.1,
                                   slowdown=20.0),
        wire="float64", straggler_timeout=1e6, compute_cost_s=0.1, measured_compute=False,
        auto_approximate=auto_approximate, results_dir=str(tmp_path))
    strategy.start(grid=InProcessGrid(app, N),
                   initial_arrays=ArrayRecord({"w": Array(np.zeros(DIM))}),
                   num_rounds=rounds, train_config=ConfigRecord({}))
    return strategy.history


def test_rounds_are_labelled_approx_when_it_drops_and_exact_otherwise(tmp_path):
    rows = _run(tmp_path, spread=0.01)
    planned = [r for r in rows if r["round_deadline_s"] < 1e6 and r["decode"] != "exact"]
    assert any(r["decode"] == "approx" for r in rows)
    for r in rows:
        if r["round_deadline_s"] >= 1e6:  # no planned deadline: an exact round
            assert r["decode"] == "exact"
    for r in planned:  # dropped: ended at its planned deadline, decoded from what arrived
        assert r["decode"] in ("approx", "skipped")
        assert r["round_virtual_s"] == pytest.approx(r["round_deadline_s"])
        assert r["stragglers"]
    approx = [r for r in rows if r["decode"] == "approx"]
    assert all(0 < r["decode_error"] <= 0.5 for r in approx)


def test_off_by_default_every_round_exact(tmp_path):
    rows = _run(tmp_path, spread=0.01, auto_approximate=False, rounds=6)
    assert all(r["decode"] == "exact" and r["round_deadline_s"] >= 1e6 for r in rows)


def test_auto_approximate_is_refused_without_s_auto_or_virtual_timing():
    with pytest.raises(ValueError, match="auto_approximate=True must be True \\(with "
                                         "s='auto'\\) or False"):
        GradientCoding(FedAvg(), code="frc", s=1, auto_approximate=True)
    with pytest.raises(ValueError, match="auto_approximate=True needs timing='virtual'"):
        GradientCoding(FedAvg(), s="auto", timing="wallclock", auto_approximate=True)
    with pytest.raises(ValueError, match="auto_approximate='yes'"):
        GradientCoding(FedAvg(), s="auto", auto_approximate="yes")


def test_it_drops_with_s0_before_any_exact_round_at_s0_when_slow_clients_are_persistent(
        tmp_path):
    """Three of 12 clients 20x slower in every round, IID-like partitions. The rule starts
    at s_max = 3 and never runs s = 0 exactly, yet the missing-weight model prices dropping
    the slow clients at s = 0, and it is taken: the round ends by its planned deadline,
    before the slow clients' earliest reply, without their partitions."""
    app = ClientApp(mods=[gradient_coding_mod])
    app.train()(_train(0.01))
    base = ShiftedExponential(shift=0.1, rate=10.0)
    strategy = GradientCoding(
        FedAvg(fraction_evaluate=0.0, min_available_nodes=N), s="auto", s_max=3, seed=0,
        latency=PersistentSlow(base=base, p=0.0, slow=(3, 7, 9), slowdown=20.0),
        wire="float64", straggler_timeout=1e6, compute_cost_s=0.1, measured_compute=False,
        auto_approximate=True, results_dir=str(tmp_path))
    strategy.start(grid=InProcessGrid(app, N),
                   initial_arrays=ArrayRecord({"w": Array(np.zeros(DIM))}),
                   num_rounds=12, train_config=ConfigRecord({}))
    rows = strategy.history
    first_exact_s0 = next((i for i, r in enumerate(rows)
                           if r["s"] == 0 and r["decode"] == "exact"), len(rows))
    dropped = [r for r in rows[:first_exact_s0] if r["s"] == 0 and r["decode"] == "approx"]
    assert dropped
    for r in dropped:
        assert r["round_virtual_s"] <= r["round_deadline_s"] + 1e-9
        assert r["round_deadline_s"] < 0.1 * 20.0  # before the slow clients' earliest reply
        assert {3, 7, 9} <= set(r["missing_partitions"])


def test_a_progress_power_knob_that_is_not_positive_is_refused_when_the_rounds_are_built(
        monkeypatch):
    from fl_gradcode.flower.approximate_rounds import ApproximateRounds

    monkeypatch.setattr(ApproximateRounds, "error_power", 0.0)
    with pytest.raises(ValueError, match=r"error_power=0\.0"):
        ApproximateRounds(seed=0)


@pytest.mark.parametrize("spread", [0.1, 3.0])
def test_the_progress_power_reaches_the_rounds_and_their_first_difference_is_a_deadline(
        tmp_path, monkeypatch, spread):
    """The same federation with p = 1 and p = 2. Every error is in [0, 1], so e**2 <= e:
    p = 2 prices every approximate candidate at most as high as p = 1 does, and the exact
    ones the same. The runs are the same until the first round they plan differently, and
    there p = 2 plans a deadline (p = 1 plans the exact round or another deadline)."""
    from fl_gradcode.flower.approximate_rounds import ApproximateRounds

    plans = {}
    for power in (1.0, 2.0):
        monkeypatch.setattr(ApproximateRounds, "error_power", power)
        rows = _run(tmp_path / str(power), spread)
        plans[power] = [(r["s"], r["round_deadline_s"]) for r in rows]
    first = next((i for i, (a, b) in enumerate(zip(plans[1.0], plans[2.0], strict=True))
                  if a != b), None)
    assert first is not None  # the knob changes the run
    assert plans[2.0][first][1] < 1e6  # a planned deadline (exact rounds: 1e6, the timeout)



def _persistent_run(tmp_path, rounds=16):
    """Three of 12 clients 20x slower in every round (s_max = 4), partitions spread 0.3."""
    return _run(tmp_path, 0.3, rounds=rounds, s_max=4,
                latency=PersistentSlow(base=ShiftedExponential(shift=0.1, rate=10.0), p=0.0,
                                       slow=(3, 7, 9), slowdown=20.0))


def test_with_every_tolerance_priced_it_drops_at_s0_after_an_exact_round_above_it(
        tmp_path, monkeypatch):
    """Three of 12 clients 20x slower in every round, IID-like partitions, s_max = 4. The
    exact choice's trust region after a round at s falls to s // 2 at most, so after an
    exact round at s >= 2 drop-stragglers (s = 0) is priced only with tolerances "all",
    and there it is taken: a planned s = 0 deadline right after an exact round at s >= 2
    happens with "all" and never with "trust-region", and the run is shorter in virtual
    time."""
    from fl_gradcode.flower.approximate_rounds import ApproximateRounds

    totals = {}
    for tol in ("trust-region", "all"):
        monkeypatch.setattr(ApproximateRounds, "tolerances", tol)
        rows = _persistent_run(tmp_path / tol)
        jumps = [b for a, b in itertools.pairwise(rows)
                 if a["decode"] == "exact" and a["s"] >= 2 and b["s"] == 0
                 and b["round_deadline_s"] < 1e6]
        assert bool(jumps) == (tol == "all")
        for r in jumps:  # dropped the slow clients by the planned deadline
            assert r["decode"] in ("approx", "skipped")
            assert {3, 7, 9} <= set(r["missing_partitions"])
        totals[tol] = sum(r["round_virtual_s"] for r in rows)
    assert totals["all"] < totals["trust-region"]


def test_a_tolerances_knob_outside_its_values_is_refused_by_name(monkeypatch):
    from fl_gradcode.flower.approximate_rounds import ApproximateRounds

    monkeypatch.setattr(ApproximateRounds, "tolerances", "every")
    with pytest.raises(ValueError, match=r"tolerances='every' must be one of"):
        ApproximateRounds(seed=0)


# ------------------------------------------------------------------ the skew bound
def _skew_by_hand(rows, n):
    """From the rounds' records alone: over the rounds with an applied update, each
    partition's mean share of the update (1/m for each of the m partitions the record does
    not list missing) against 1/n (every partition is in every cohort here), as a total
    variation distance."""
    applied = [r for r in rows if r["decode"] != "skipped"]
    if not applied:
        return 0.0
    shares = np.zeros(n)
    for r in applied:
        kept = [p for p in range(n) if p not in r["missing_partitions"]]
        shares[kept] += 1 / len(kept)
    return 0.5 * float(np.abs(shares / len(applied) - 1 / n).sum())


def test_a_skew_bound_plans_a_deadline_only_while_the_runs_weighting_is_within_it(
        tmp_path, monkeypatch):
    """Three of 12 clients persistently 20x slower: without a bound the run drops them
    round after round and its weighting of the partitions drifts past 0.05 (total
    variation from equal shares, computed here from the records); with max_skew = 0.05 a
    round plans a deadline only when the rounds before it are within 0.05, and the run
    ends closer to equal shares."""
    from fl_gradcode.flower.approximate_rounds import ApproximateRounds

    free = _persistent_run(tmp_path / "free")
    skews = [_skew_by_hand(free[:i], N) for i in range(len(free) + 1)]
    planned = [i for i, r in enumerate(free) if r["round_deadline_s"] < 1e6]
    assert any(skews[i] > 0.05 for i in planned)  # the bound below has work to do
    monkeypatch.setattr(ApproximateRounds, "max_skew", 0.05)
    bounded = _persistent_run(tmp_path / "bounded")
    planned = [i for i, r in enumerate(bounded) if r["round_deadline_s"] < 1e6]
    for i in planned:
        assert _skew_by_hand(bounded[:i], N) <= 0.05 + 1e-12
    # and it still drops when the weighting has moved, but not past the bound
    assert any(0 < _skew_by_hand(bounded[:i], N) <= 0.05 for i in planned)
    assert _skew_by_hand(bounded, N) < _skew_by_hand(free, N)


class _Round:
    """What the starvation bound reads of a round: its code and cohort."""

    def __init__(self, k, ids, groups):
        self.code = make_code("frc", k, 1) if groups else make_code("uncoded", k, 0)
        self.partitions = [Identity(p, 100) for p in ids]


def test_the_skew_is_the_distance_of_the_mean_shares_of_the_updates_from_fedavgs():
    """Sampled cohorts of different partitions: a round's exact shares are 1/k over its
    cohort; an approximate round's applied shares 1/m over the m partitions its used
    replies computed. Expected values by hand."""
    from fl_gradcode.flower.approximate_rounds import ApproximateRounds

    rounds = ApproximateRounds(seed=0)
    assert rounds.skew() == 0.0
    # round 1: cohort {0, 1, 2, 3}, exact
    rounds.after_round(None, _Round(4, [0, 1, 2, 3], False), "exact", [0, 1, 2, 3], [], 0.5)
    assert rounds.skew() == 0.0
    # round 2: cohort {2, 3, 4, 5}, uncoded, replies of workers 0 and 1 (partitions 2, 3)
    rounds.after_round(None, _Round(4, [2, 3, 4, 5], False), "approx", [0, 1], [], 0.5)
    # applied: 0, 1: 1/4; 2, 3: 1/4 + 1/2; 4, 5: 0 -- exact: 0, 1, 4, 5: 1/4; 2, 3: 1/2
    assert rounds.skew() == pytest.approx(0.5 * (4 * 0.25) / 2)
    # a skipped round applies nothing: unchanged
    rounds.after_round(None, _Round(4, [0, 1, 2, 3], False), "skipped", [], [], 0.5)
    assert rounds.skew() == pytest.approx(0.25)
    # an FRC round (pairs {0, 1}, {2, 3} of partitions 6..9) with worker 0 only: 6, 7
    rounds.after_round(None, _Round(4, [6, 7, 8, 9], True), "approx", [0], [], 0.5)
    # applied adds 6, 7: 1/2; exact adds 6..9: 1/4 -- over 3 rounds:
    # |diffs| = 0, 0, 1/4, 1/4, 1/4, 1/4 (rounds 1-2) + 1/4, 1/4, 1/4, 1/4 (round 4)
    assert rounds.skew() == pytest.approx(0.5 * (8 * 0.25) / 3)


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan")])
def test_a_skew_bound_outside_zero_to_one_is_refused_by_name(monkeypatch, bad):
    from fl_gradcode.flower.approximate_rounds import ApproximateRounds

    monkeypatch.setattr(ApproximateRounds, "max_skew", bad)
    with pytest.raises(ValueError, match=r"max_skew=.* must be None or in \[0, 1\]"):
        ApproximateRounds(seed=0)


def test_a_skew_at_the_bound_allows_the_next_deadline_and_one_above_it_does_not(monkeypatch):
    """100 partitions, the same 20 dropped in one round of four: a skew of f q = 0.2 / 4 =
    0.05 exactly, up to rounding; the bound 0.05 allows it, 0.049 does not."""
    from fl_gradcode.flower.approximate_rounds import ApproximateRounds

    rounds = ApproximateRounds(seed=0)
    cohort = _Round(100, list(range(100)), False)
    rounds.after_round(None, cohort, "approx", list(range(20, 100)), [], 0.5)
    for _ in range(3):
        rounds.after_round(None, cohort, "exact", list(range(100)), [], 0.5)
    assert rounds.skew() == pytest.approx(0.05, abs=1e-12)
    for bound, over in ((0.05, False), (0.049, True), (None, False)):
        monkeypatch.setattr(ApproximateRounds, "max_skew", bound)
        assert rounds.over_skew() is over
