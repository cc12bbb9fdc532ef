"""Heterogeneity-aware assignment: persistently slow clients excluded, the round still exact.

The codes (``NestedPlacement.code_excluding``) against a direct weighted sum on every straggler
pattern; the policy (``choose_s(exclude_slower_than=...)``) against round times derived by hand;
the plug-in against FedAvg.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fl_gradcode.adaptive import LatencyEstimator, choose_s, code_loads
from fl_gradcode.codes import NestedPlacement
from fl_gradcode.codes.nested import spread_misses


def rel_err(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.linalg.norm(x - y) / np.linalg.norm(y))


# ------------------------------------------------------------------------------ the codes
@settings(max_examples=60, deadline=None)
@given(m=st.integers(1, 30), k=st.integers(1, 40), data=st.data())
def test_spread_misses_has_t_minus_1_per_partition_and_balanced_loads(m, k, data):
    t = data.draw(st.integers(1, m))
    miss = spread_misses(m, k, t)
    assert miss.shape == (m, k)
    assert np.all(miss.sum(axis=0) == t - 1)
    per_client = miss.sum(axis=1)
    assert per_client.max() - per_client.min() <= 1
    assert per_client.sum() == k * (t - 1)


@pytest.mark.parametrize("t", [0, 5])
def test_spread_misses_rejects_a_threshold_outside_1_to_m(t):
    with pytest.raises(ValueError, match=f"t={t}"):
        spread_misses(4, 6, t)


@pytest.mark.parametrize(
    ("n", "s_max", "excluded"),
    [(12, 3, (1, 7)), (12, 3, (0,)), (12, 3, (4, 5)), (10, 4, (2,)), (15, 4, (3, 4, 13))],
)
def test_code_excluding_is_exact_on_every_straggler_pattern_of_the_active_clients(
    n, s_max, excluded
):
    rng = np.random.default_rng(n + 7 * s_max)
    w = rng.uniform(0.3, 3.0, n)  # partition weights != 1
    p = NestedPlacement(n, s_max, weights=w)
    U = {j: rng.standard_normal(4) for j in range(n)}
    target = sum(w[j] * U[j] for j in range(n))  # the reference: the weighted sum itself
    active = [i for i in range(n) if i not in excluded]
    built = 0
    for s in range(s_max + 1):
        per_block = [sum(c not in excluded for c in sb) for sb in p.superblocks]
        if min(per_block) < s + 1:
            with pytest.raises(ValueError, match=f"s={s} needs at least {s + 1}"):
                p.code_excluding(s, excluded)
            continue
        code = p.code_excluding(s, excluded)
        built += 1
        assert code.s == s
        for i in excluded:  # computes nothing
            assert code.assignment(i) == ()
        assert not np.any((code.B != 0) & ~p.holding_matrix)  # inside the placement
        # every partition is computed by at least s + 1 active clients
        assert np.all((code.B[active] != 0).sum(axis=0) >= s + 1)
        replies = {i: code.encode(i, U) for i in active}
        for stragglers in itertools.combinations(active, s):
            got = {i: r for i, r in replies.items() if i not in stragglers}
            assert code.is_decodable(got)
            assert rel_err(code.decode(got), target) <= 1e-10, (s, stragglers)
        # any n - s rows decode, the excluded clients' zero rows among them
        for rows in itertools.combinations(range(n), n - s):
            assert code.is_decodable(list(rows))
    assert built >= 1


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(8, 48), data=st.data())
def test_code_excluding_decodes_random_patterns_and_matches_least_squares(n, data):
    s_max = data.draw(st.integers(1, max(1, n // 4)))
    p = NestedPlacement(n, s_max)
    excluded = data.draw(st.sets(st.integers(0, n - 1), max_size=max(1, n // 6)))
    s = data.draw(st.integers(0, s_max))
    if min(sum(c not in excluded for c in sb) for sb in p.superblocks) < s + 1:
        with pytest.raises(ValueError, match="active clients"):
            p.code_excluding(s, excluded)
        return
    code = p.code_excluding(s, excluded)
    active = [i for i in range(n) if i not in excluded]
    stragglers = set(data.draw(st.permutations(active))[:s])
    got = [i for i in active if i not in stragglers]
    # independent check: the all-ones vector lies in the row span of the received rows
    B = code.B[got]
    a, *_ = np.linalg.lstsq(B.T, np.ones(n), rcond=None)
    assert np.linalg.norm(B.T @ a - 1.0) <= 1e-8 * np.sqrt(n)
    assert code.is_decodable(got) and code.decoding(got).exact
    # a super-block's active clients carry its partitions s + 1 times over in total
    loads = (code.B != 0).sum(axis=1)
    for sb in p.superblocks:
        assert loads[list(sb)].sum() >= (s + 1) * len(sb)


@pytest.mark.parametrize("s", [8, 40, 64])
def test_code_excluding_at_n256_is_stable_with_small_groups(s):
    """n = 256, s_max = 64, four clients excluded: as many groups per super-block as fit
    (s + 1 <= m <= 2s + 1), every group within the amplification budget (the threshold is
    lowered, the load raised, where m - s would exceed it: s = 64 has 84-member groups)."""
    p = NestedPlacement(256, 64)
    excluded = {0, 1, 100, 200}
    code = p.code_excluding(s, excluded)
    assert code.amplification <= p.max_amplification
    for sb in p.superblocks:
        active = [c for c in sb if c not in excluded]
        groups = [g for g in code.groups if g.clients[0] in sb]
        assert len(groups) == len(active) // (s + 1)
        assert sorted(c for g in groups for c in g.clients) == active
        assert all(s + 1 <= len(g.clients) <= 2 * s + 1 for g in groups)
        assert all(len(g.clients) - g.threshold >= s for g in groups)  # tolerance >= s
    rng = np.random.default_rng(s)
    active = [i for i in range(256) if i not in excluded]
    for _ in range(3):
        got = sorted(rng.choice(active, size=len(active) - s, replace=False).tolist())
        B = code.B[got]
        a, *_ = np.linalg.lstsq(B.T, np.ones(256), rcond=None)
        assert np.linalg.norm(B.T @ a - 1.0) <= 1e-8 * 16


def test_code_excluding_validates_its_input():
    p = NestedPlacement(12, 3)
    with pytest.raises(ValueError, match="excluded client 12"):
        p.code_excluding(1, [12])
    with pytest.raises(ValueError, match="excluded client True"):
        p.code_excluding(1, [True])
    with pytest.raises(ValueError, match="s=4"):
        p.code_excluding(4, [0])
    with pytest.raises(ValueError, match=r"super-block 0\.\.3 has 1 active clients"):
        p.code_excluding(1, [0, 1, 2])
    with pytest.raises(ValueError, match="layout='hybrid'"):
        NestedPlacement(12, 3, layout="window").code_excluding(1, [0])
    assert p.code_excluding(1, [5]) is p.code_excluding(1, (5,))  # cached
    # nothing excluded: every super-block's block code (load s + 1)
    assert np.all(code_loads(p.code_excluding(1, []), 1.0) == 2)


# ------------------------------------------------------------------------------ the policy
def _fed(slowness: np.ndarray, rounds: int = 8, jitter: float = 0.1) -> LatencyEstimator:
    """An estimator that saw ``rounds`` rounds of every client replying after about
    ``slowness[i]`` seconds per unit at load 4 (log-normal ``jitter``: the estimator's
    density tables need some spread; nothing censored)."""
    n = slowness.size
    est = LatencyEstimator(n, seed=0, load_exponent=1.0)
    loads = np.full(n, 4.0)
    rng = np.random.default_rng(5)
    for _ in range(rounds):
        t = loads * slowness * np.exp(jitter * rng.standard_normal(n))
        est.update(t, loads, float(t.max()))
    return est


def test_choose_s_excludes_a_persistently_slow_client_when_that_is_faster():
    slowness = np.ones(12)
    slowness[3] = 50.0
    est = _fed(slowness)
    assert est.slowness()[3] >= 4 and np.all(est.slowness()[np.arange(12) != 3] < 4)
    p = NestedPlacement(12, 3)
    d = choose_s(p, est, candidates=[0], exclude_slower_than=4.0, samples=64)
    # by hand (up to the jitter): uncoded waits for client 3 (50 s per unit, one unit);
    # without it, client 0 carries partitions 0 and 1 of super-block 0..3 (client 1
    # partition 2, client 2 partition 3): 2 s
    assert d.expected_times[0] == pytest.approx(50.0, rel=0.1)
    assert d.excluded_times[0] == pytest.approx(2.0, rel=0.1)
    assert d.s == 0 and d.excluded == (3,)
    assert d.expected_time == pytest.approx(2.0, rel=0.1)


def test_choose_s_excludes_from_the_factor_on_and_only_when_predicted_faster():
    """A client 5x slower (estimated 4.7x: just above the factor 4) is a candidate: uncoded
    waits about 5 s for it, 2 s without it. And whatever the slowness and candidates, the
    decision excludes exactly when the excluded code is predicted faster for the chosen s."""
    p = NestedPlacement(12, 3)
    slowness = np.ones(12)
    slowness[3] = 5.0
    est = _fed(slowness, jitter=0.2)
    assert 4.0 <= est.slowness()[3] < 5.0
    d = choose_s(p, est, candidates=[0], exclude_slower_than=4.0, samples=64)
    assert d.excluded == (3,)
    assert d.expected_times[0] == pytest.approx(5.0, rel=0.15)
    for factor in (5.0, 12.0, 30.0):
        slowness[[3, 8]] = factor
        est = _fed(slowness, jitter=0.2)
        for cand in ([0], [1], [2], [3], [0, 1, 2, 3]):
            d = choose_s(p, est, candidates=cand, exclude_slower_than=4.0, samples=64,
                         lookahead=True)
            if d.excluded:
                assert d.excluded_times[d.s] < d.expected_times[d.s]
            else:
                assert d.excluded_times.get(d.s, np.inf) >= d.expected_times[d.s]


def test_choose_s_keeps_everyone_when_no_client_is_slow_enough_or_exclusion_is_slower():
    est = _fed(np.ones(12))
    p = NestedPlacement(12, 3)
    d = choose_s(p, est, exclude_slower_than=4.0, samples=64)
    assert d.excluded == () and d.excluded_times == {}
    # a client 3x slower is below the factor: never excluded
    slowness = np.ones(12)
    slowness[3] = 3.0
    d = choose_s(p, _fed(slowness), exclude_slower_than=4.0, samples=64)
    assert d.excluded == ()
    # excluded-but-slower: at s = 1 client 3's partner covers for it (2 s), while without
    # it the super-block's group of 3 needs 2 replies from loads 2, 3, 3: 3 s
    slowness[3] = 50.0
    d = choose_s(p, _fed(slowness), candidates=[1], exclude_slower_than=4.0, samples=64)
    assert d.expected_times[1] == pytest.approx(2.0, rel=0.1)
    assert d.excluded_times[1] == pytest.approx(3.0, rel=0.1)
    assert d.s == 1 and d.excluded == ()


def test_choose_s_without_the_option_is_unchanged_and_validates_the_factor():
    slowness = np.ones(12)
    slowness[3] = 50.0
    est = _fed(slowness)
    p = NestedPlacement(12, 3)
    plain = choose_s(p, est, samples=64)
    assert plain.excluded == () and plain.excluded_times == {}
    for bad in (1.0, 0.5, True, "4"):
        with pytest.raises(ValueError, match="exclude_slower_than"):
            choose_s(p, est, exclude_slower_than=bad)
        # validated before any observation too (the safe s_max is returned then)
        with pytest.raises(ValueError, match="exclude_slower_than"):
            choose_s(p, LatencyEstimator(12), exclude_slower_than=bad)
    from fl_gradcode.adaptive import SingleCode

    with pytest.raises(ValueError, match="needs a NestedPlacement"):
        choose_s(SingleCode(p.code(1)), est, exclude_slower_than=4.0)


# ------------------------------------------------------------------------------ the plug-in
def _persistent():
    from fl_gradcode.latency import PersistentSlow, ShiftedExponential

    return PersistentSlow(base=ShiftedExponential(shift=0.1, rate=10.0), p=0.0, slowdown=20.0,
                          slow=(1, 6))


def test_plugin_excludes_persistently_slow_clients_and_stays_equal_to_fedavg(tmp_path):
    import json

    from tests.adaptive.support import N, run
    from tests.apps.vector_app import oracle

    strategy, theta = run(_persistent(), rounds=12, exclude_slow=4.0,
                          results_dir=str(tmp_path))
    expected = oracle(12, N)
    assert all(r["decode"] == "exact" for r in strategy.history)
    assert np.linalg.norm(theta - expected) <= 1e-9 * np.linalg.norm(expected)
    rows = [json.loads(line) for line in (tmp_path / "rounds.jsonl").read_text().splitlines()]
    assert [r["excluded"] for r in rows] == [r["excluded"] for r in strategy.history]
    excluding = [r for r in rows if r["excluded"]]
    assert excluding, "the two 20x slower clients were never excluded"
    for r in excluding:
        assert set(r["excluded"]) <= {1, 6}
        assert not set(r["excluded"]) & set(r["clients_used"])  # sent nothing, used nothing
    assert json.loads((tmp_path / "config.json").read_text())["exclude_slow"] == 4.0
    # the same run without the option never excludes anyone and is slower once it would
    plain, _ = run(_persistent(), rounds=12)
    assert all(r["excluded"] == [] for r in plain.history)
    assert strategy.history[-1]["virtual_s"] < plain.history[-1]["virtual_s"]


@pytest.mark.parametrize("bad", [1.0, 0.0, -2.0, float("inf"), True, "4"])
def test_exclude_slow_is_validated(bad):
    from flwr.serverapp.strategy import FedAvg

    from fl_gradcode.flower import GradientCoding

    with pytest.raises(ValueError, match="exclude_slow"):
        GradientCoding(FedAvg(), s="auto", exclude_slow=bad)


def test_exclude_slow_needs_s_auto():
    from flwr.serverapp.strategy import FedAvg

    from fl_gradcode.flower import GradientCoding

    with pytest.raises(ValueError, match=r"exclude_slow=4\.0 needs s='auto'"):
        GradientCoding(FedAvg(), s=2, exclude_slow=4.0)


# ------------------------------------------------------------------------------ review fixes
def test_a_fixed_codes_empty_rows_are_still_sent_and_never_called_excluded():
    """bgc (approximate) gives worker 6 of 12 no partition; that worker is still sent its
    (empty) instruction and its reply counts towards the n - s replies, as before exclusion
    existed: only auto's decision excludes anyone."""
    from flwr.app import Array, ArrayRecord, ConfigRecord
    from flwr.clientapp import ClientApp
    from flwr.serverapp.strategy import FedAvg

    from fl_gradcode.codes import make_code
    from fl_gradcode.flower import GradientCoding, gradient_coding_mod
    from fl_gradcode.flower.testing import InProcessGrid
    from tests.apps.vector_app import DIM, train

    n = 12
    assert make_code("bgc", n=n, s=3, seed=0).assignment(6) == ()  # the premise
    app = ClientApp(mods=[gradient_coding_mod])
    app.train()(train)
    grid = InProcessGrid(app, n)
    pushed = []
    push = grid.push_messages

    def counting(messages):
        messages = list(messages)
        pushed.append(len(messages))
        return push(messages)

    grid.push_messages = counting
    strategy = GradientCoding(FedAvg(fraction_evaluate=0.0, min_available_nodes=n), code="bgc",
                              s=3, seed=0, wire="float64", measured_compute=False)
    strategy.start(grid=grid, initial_arrays=ArrayRecord({"w": Array(np.zeros(DIM))}),
                   num_rounds=2, train_config=ConfigRecord({}))
    assert all(r["excluded"] == [] for r in strategy.history)
    assert pushed.count(n) >= 2  # every round's train messages went to all 12 (6 included)


def test_wire_choice_is_per_code_object_even_when_codes_come_and_go():
    """Codes built per round (exclusions) are freed and their id() reused: the wire chosen for
    a code must be its own (float64 for an ill-conditioned code, the model's dtype for FRC)."""
    import gc

    from flwr.serverapp.strategy import FedAvg

    from fl_gradcode.codes import make_code
    from fl_gradcode.flower import GradientCoding
    from fl_gradcode.flower.decoder import Decoder
    from fl_gradcode.flower.wrapper import error_amplification

    strategy = GradientCoding(FedAvg(), s=1, seed=0)
    decoder = Decoder(FedAvg(), wire="auto", seed=0)  # what the strategy's wire_for asks
    seen = []
    for i in range(12):
        code = make_code("frc", n=12, s=2) if i % 2 else make_code("crc", n=12, s=5, seed=i)
        expected = "model" if error_amplification(code, seed=0) <= 8.0 else "float64"
        assert strategy.wire_for(code) == expected, (i, code.name)
        assert decoder.wire_for(code) == expected, (i, code.name)
        seen.append(expected)
        del code
        gc.collect()
    assert set(seen) == {"model", "float64"}  # both kinds were asked for
    # nothing is kept for codes that are gone: no growth, and no stale entry that a reused
    # id() could hit (CPython did not reuse one in this loop, so this is what fails on the
    # id()-keyed cache)
    assert decoder.cached_codes == 0


def test_auto_trust_region_does_not_carry_over_to_another_cohort_size():
    """A round at s = 10 with 40 clients, then a cohort of 8 (s_max = 2): the halving rule
    (s >= 10 // 2) would leave no candidate; it applies within one cohort size only."""
    from flwr.serverapp.strategy import FedAvg

    from fl_gradcode.flower import GradientCoding

    policy = GradientCoding(FedAvg(), s="auto", seed=0).code_policy
    big, small = list(range(100, 140)), list(range(200, 208))
    assert policy.plan(big, set()).s == 10  # no data yet: s_max = 40 // 4
    est = policy.book.estimator
    est.update(np.ones(est.n), np.ones(est.n), 1.0)
    code = policy.plan(small, set())
    assert 0 <= code.s <= 2 and code.n == 8
