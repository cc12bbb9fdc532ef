"""The code policy collaborator of GradientCoding (fl_gradcode.flower.policy): built from the
strategy's keywords, or passed in (an instance, or a class built with the same keywords)."""

from __future__ import annotations

import functools
import json
import logging
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from flwr.serverapp.strategy import FedAvg

from fl_gradcode import adaptive
from fl_gradcode.adaptive import Decision, LatencyEstimator
from fl_gradcode.codes import NestedPlacement
from fl_gradcode.flower import GradientCoding
from fl_gradcode.flower.policy import (
    AdaptiveCodePolicy,
    CodePolicy,
    FixedCodePolicy,
    LatencyBook,
    is_policy_factory,
    make_code_policy,
    read_latency_state,
)
from tests.flower.harness import ScriptedClock

ROOT = Path(__file__).resolve().parents[2]
N = 12


def _with_data(policy: AdaptiveCodePolicy, cohort: list[int]) -> None:
    """Deterministic latency, 1 s per partition: uncoded (s = 0) is fastest."""
    estimator = LatencyEstimator(len(cohort), load_exponent=1.0)
    estimator.update(np.ones(len(cohort)), np.ones(len(cohort)), 1.0)
    policy.book.estimator = estimator
    policy.book.node_index = {node: i for i, node in enumerate(cohort)}


def test_the_strategy_builds_the_policy_its_keywords_describe():
    auto = GradientCoding(FedAvg(), s="auto", s_max=3, auto_margin=0.3, exclude_slow=5.0,
                          seed=4)
    policy = auto.code_policy
    assert type(policy) is AdaptiveCodePolicy and isinstance(policy, CodePolicy)
    assert (policy.s_max, policy.margin, policy.exclude_slow, policy.seed) == (3, 0.3, 5.0, 4)
    assert policy.busy == "queue" and policy.estimating and policy.adaptive
    fixed = GradientCoding(FedAvg(), code="frc", s=1).code_policy
    assert type(fixed) is FixedCodePolicy and fixed.busy == "skip" and not fixed.estimating
    assert fixed.decision is None and not fixed.adaptive
    wall = GradientCoding(FedAvg(), s=1, timing="wallclock").code_policy
    assert wall.busy == "skip" and not wall.estimating
    assert GradientCoding(FedAvg(), s="auto", auto_deadline=2.0).code_policy.stop_late_work


def test_code_for_is_the_policys_code_once_per_cohort_size():
    strategy = GradientCoding(FedAvg(), code="nested", s=2, s_max=3)
    code = strategy.code_for(N)
    assert code is strategy.code_policy.code_for(N) is strategy.code_for(N)
    np.testing.assert_array_equal(code.B, NestedPlacement(N, 3, seed=0).code(2).B)
    assert strategy.deadlines.stopping_replies(code) is None  # exact: when it decodes
    approx = GradientCoding(FedAvg(), code="ignore-stragglers", s=2)
    assert approx.deadlines.stopping_replies(approx.code_for(N)) == N - 2
    floor = GradientCoding(FedAvg(), code="frc", s=1, min_replies=50)
    assert floor.deadlines.stopping_replies(floor.code_for(N)) == N


def test_a_policy_instance_is_used_as_given_and_bound_to_the_strategy():
    policy = AdaptiveCodePolicy(s_max=2, seed=1)
    strategy = GradientCoding(FedAvg(), s="auto", code_policy=policy)
    assert strategy.code_policy is policy and policy.clock is strategy.clock
    cohort = list(range(100, 100 + N))
    assert policy.plan(cohort, set()).s == 2  # nothing observed yet: s_max
    assert strategy.code_policy.decision is policy.decision and not policy.decision.observed


def test_a_policy_class_is_built_with_the_strategys_keywords():
    class Narrow(AdaptiveCodePolicy):
        def candidates(self, placement, estimator):
            return [1] if estimator.has_data else super().candidates(placement, estimator)

    strategy = GradientCoding(FedAvg(), s="auto", s_max=3, auto_margin=0.0, seed=2,
                              code_policy=Narrow)
    policy = strategy.code_policy
    assert type(policy) is Narrow and (policy.s_max, policy.margin, policy.seed) == (3, 0.0, 2)
    cohort = list(range(100, 100 + N))
    _with_data(policy, cohort)
    assert policy.plan(cohort, set()).s == 1  # the override, not the fastest (s = 0)
    assert set(policy.decision.expected_times) == {1}
    plain = GradientCoding(FedAvg(), s="auto", s_max=3, auto_margin=0.0, seed=2).code_policy
    _with_data(plain, cohort)
    assert plain.plan(cohort, set()).s == 0
    class Keyed(AdaptiveCodePolicy):
        def __init__(self, *, v, **keywords):
            super().__init__(**keywords)
            self.v = v

    # a keyword of its own through functools.partial; the strategy's keywords come with it
    keyed = GradientCoding(FedAvg(), s="auto", s_max=3, exclude_slow=9.0,
                           code_policy=functools.partial(Keyed, v=1))
    assert type(keyed.code_policy) is Keyed and keyed.code_policy.v == 1
    assert keyed.code_policy.exclude_slow == 9.0


def test_policy_factories_are_told_apart_from_instances():
    assert is_policy_factory(AdaptiveCodePolicy)
    assert is_policy_factory(functools.partial(AdaptiveCodePolicy, s_max=2))
    assert not is_policy_factory(AdaptiveCodePolicy())
    assert not is_policy_factory(None)
    assert type(make_code_policy(s="auto")) is AdaptiveCodePolicy
    assert type(make_code_policy(s=2, code="frc")) is FixedCodePolicy


def test_the_trust_region_halves_within_one_cohort_size():
    policy = GradientCoding(FedAvg(), s="auto", s_max=3, seed=0).code_policy
    cohort = list(range(100, 100 + N))
    placement = policy.placement(N)
    assert placement is policy.placement(N) and placement.s_max == 3
    _with_data(policy, cohort)
    assert policy.candidates(placement, policy.book.estimator) == [0, 1, 2, 3]
    policy.last_s[N] = 3
    assert policy.candidates(placement, policy.book.estimator) == [1, 2, 3]
    assert policy.plan(cohort, set()).s == 1 and policy.last_s[N] == 1


def test_an_unbound_policy_says_so_and_the_keywords_are_validated():
    with pytest.raises(RuntimeError, match="bind"):
        AdaptiveCodePolicy().plan([1, 2, 3, 4], set())
    for kwargs, message in (({"s_max": 0}, "s_max=0"), ({"auto_margin": -1}, "auto_margin=-1"),
                            ({"exclude_slow": 1.0}, "exclude_slow=1.0")):
        with pytest.raises(ValueError, match=message):
            AdaptiveCodePolicy(**kwargs)
    with pytest.raises(ValueError, match="busy='later'"):
        FixedCodePolicy(busy="later")


def test_the_latency_book_tracks_unfinished_work_and_round_trips_its_file(tmp_path):
    path = tmp_path / "state.json"
    book = LatencyBook(seed=0, latency_state=str(path), meta={"timing": "virtual"})
    book.outstanding[7] = [[0.0, 2.0, 5.0], [3.0, 4.0, None]]
    assert book.pending_work(7, 4.0, 9.0) == (4.0, 6.0)
    assert book.pending_work(7, 8.0, 9.0) == (3.0, 4.0)
    assert book.pending_work(8, 8.0, 9.0) == (0.0, 9.0)
    assert book.view([10, 11], 0.0, lambda node: f"{node - 10}/2").n == 2
    book.estimator.update([1.0, np.nan], [1.0, 1.0], 2.0)
    book.save()
    saved = json.loads(path.read_text())
    assert saved["clients"] == ["0/2", "1/2"] and saved["meta"] == {"timing": "virtual"}
    assert read_latency_state(str(path)) == saved
    warm = LatencyBook(seed=0, latency_state=str(path), meta={"timing": "virtual"})
    view = warm.view([21, 20], 0.0, lambda node: f"{node - 20}/2")
    assert warm.estimator.n_rounds == 1 and warm.node_index == {21: 1, 20: 0}
    assert view.n == 2
    path.write_text("{}")
    with pytest.raises(ValueError, match="latency_state="):
        LatencyBook(seed=0, latency_state=str(path), meta={})


def test_no_adaptive_or_policy_module_reads_another_objects_private_attributes():
    files = [*sorted((ROOT / "fl_gradcode" / "adaptive").glob("*.py")),
             ROOT / "fl_gradcode" / "flower" / "policy.py",
             ROOT / "fl_gradcode" / "flower" / "latency_book.py",
             ROOT / "experiments" / "policies.py"]
    reach = re.compile(r"\b(?!self\b|cls\b)[A-Za-z_][A-Za-z0-9_]*\._[A-Za-z]")
    found = [f"{f.name}:{i}: {line.strip()}" for f in files
             for i, line in enumerate(f.read_text().splitlines(), 1) if reach.search(line)]
    assert found == []


# ------------------------------------------------------------------------------------------- edges
def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def _host(**clock: Any) -> SimpleNamespace:
    """A host whose clock answers only what a policy asks of a clock (no identities:
    ``node:<id>``)."""
    return SimpleNamespace(clock=ScriptedClock(**clock), identities={})


def _spy_choose_s(monkeypatch) -> list[dict]:
    """Record the keywords the policy passes to choose_s (then run the real one)."""
    seen: list[dict] = []
    real = adaptive.choose_s

    def spy(placement, estimator, **kwargs):
        seen.append(kwargs)
        return real(placement, estimator, **kwargs)

    monkeypatch.setattr(adaptive, "choose_s", spy)
    return seen


def _one_client_state(path: Path) -> None:
    """A ``latency_state`` file of one client, partition ``"0/1"``, one round observed."""
    book = LatencyBook(seed=0, latency_state=str(path), meta={})
    book.view([10], 0.0, lambda node: "0/1")
    book.estimator.update([1.0], [1.0], 2.0)
    book.save()


def test_a_state_file_none_of_whose_clients_is_seen_is_warned_about_once(tmp_path, caplog):
    path = tmp_path / "state.json"
    _one_client_state(path)
    warm = LatencyBook(seed=0, latency_state=str(path), meta={})
    foreign = lambda node: f"{node}/99"  # noqa: E731  (no partition of the file)
    with caplog.at_level(logging.DEBUG, logger="flwr"):
        warm.view([30], 0.0, foreign)
        warm.view([30, 31], 1.0, foreign)
        warm.view([31], 2.0, foreign)
    assert _warnings(caplog) == [
        f"none of the 1 clients in {path} is a data partition of this cohort "
        "(named 'id/num-partitions'): the file informs nothing yet"]


def test_no_file_or_a_claimed_file_warns_nothing_when_viewed(tmp_path, caplog):
    path = tmp_path / "state.json"
    _one_client_state(path)
    with caplog.at_level(logging.DEBUG, logger="flwr"):
        fresh = LatencyBook(seed=0, latency_state=None, meta={})
        fresh.view([1, 2], 0.0, lambda node: f"{node}/3")
        fresh.view([1, 2, 3], 1.0, lambda node: f"{node}/3")
        warm = LatencyBook(seed=0, latency_state=str(path), meta={})
        warm.view([40], 0.0, lambda node: "0/1")  # claims the file's client
        warm.view([40, 41], 1.0, lambda node: "0/1" if node == 40 else "1/2")
    assert _warnings(caplog) == []
    assert warm.node_index == {40: 0, 41: 1}


def test_the_policies_default_keywords():
    fixed = FixedCodePolicy()
    assert (fixed.s, fixed.stop_late_work, fixed.code_spec) == (1, False, "grouped-rs")
    assert fixed.code_for(N).s == 1
    auto = AdaptiveCodePolicy()
    # s_max default max(1, n // 4), at most n - 1 (hand-computed)
    assert [auto.placement(n).s_max for n in (2, 3, 4, 12, 20)] == [1, 1, 1, 3, 5]
    assert AdaptiveCodePolicy(s_max=5).placement(4).s_max == 3


def test_the_trust_region_applies_only_once_the_estimator_has_data():
    policy = AdaptiveCodePolicy(s_max=3)
    placement = policy.placement(N)
    policy.last_s[N] = 3
    assert policy.candidates(placement, LatencyEstimator(N)) == [0, 1, 2, 3]


def test_a_cohort_size_the_code_cannot_take_is_warned_with_the_fallback(caplog):
    policy = FixedCodePolicy(code="frc", s=1)
    with caplog.at_level(logging.DEBUG, logger="flwr"):
        code = policy.code_for(13)
        assert policy.code_for(13) is code  # warned once per size
    assert (code.name, code.s, code.n) == ("grouped-rs", 1, 13)
    messages = _warnings(caplog)
    assert len(messages) == 1
    assert re.fullmatch(r"code='frc' with s=1 cannot take a cohort of 13 \(FRC needs .+\); "
                        r"using grouped-rs with s=1 for cohorts of 13", messages[0])


def test_a_busy_node_without_records_is_priced_as_a_full_share_started_now(monkeypatch):
    seen = _spy_choose_s(monkeypatch)
    policy = AdaptiveCodePolicy(s_max=3, seed=0)
    policy.bind(_host(now=2.0, queues=True))
    cohort = list(range(100, 100 + N))
    policy.plan(cohort, {103})
    elapsed, units = seen[-1]["pending"]
    expected_elapsed = np.full(N, np.nan)
    expected_elapsed[3] = 0.0
    expected_units = np.zeros(N)
    expected_units[3] = 4.0  # s_max + 1 partitions
    np.testing.assert_array_equal(elapsed, expected_elapsed)
    np.testing.assert_array_equal(units, expected_units)
    assert seen[-1]["busy_until"] is None


def test_a_clock_that_cannot_queue_prices_busy_nodes_busy_until_the_timeout(monkeypatch):
    seen = _spy_choose_s(monkeypatch)
    policy = AdaptiveCodePolicy(s_max=3, exclude_slow=5.0, straggler_timeout=7.0, seed=0)
    policy.bind(_host(now=2.0, queues=False))
    cohort = list(range(100, 100 + N))
    policy.plan(cohort, {103, 110})
    expected = np.zeros(N)
    expected[[3, 10]] = 2.0 + 7.0
    np.testing.assert_array_equal(seen[-1]["busy_until"], expected)
    assert seen[-1]["pending"] is None
    assert seen[-1]["exclude_slower_than"] == 5.0
    fixed = FixedCodePolicy(busy="fit")
    fixed.bind(_host(now=0.0, queues=True))
    fixed.plan(cohort, set())
    assert seen[-1]["exclude_slower_than"] is None


def test_only_an_adaptive_policy_reports_excluded_workers():
    decision = Decision(s=1, expected_times={1: 1.0}, excluded=(2,))
    fixed, auto = FixedCodePolicy(), AdaptiveCodePolicy()
    fixed.decision = auto.decision = decision
    assert fixed.excluded_workers() == () and auto.excluded_workers() == (2,)
    auto.decision = None
    assert auto.excluded_workers() == ()


def test_queue_mode_queues_busy_nodes_expected_free_within_the_limit():
    policy = FixedCodePolicy(busy="queue", straggler_timeout=10.0)
    # node 1 free in 15 s (> 10: not queued); node 2 has no record (free now: queued)
    policy.bind(_host(now=5.0, queues=True, last_duration=None, free_at={1: 20.0}))
    assert policy.queued({1, 2}, [1, 2, 3]) == {2}
    # the last round's duration (3 s) is a tighter limit: node 1 free in 2 s, node 3 in 4 s
    policy.bind(_host(now=5.0, queues=True, last_duration=3.0,
                      free_at={1: 7.0, 3: 9.0}))
    assert policy.queued({1, 2, 3}, [1, 2, 3]) == {1, 2}
