"""``GradientCoding(s="auto")``: what the wrapper tells the adaptive policy, end to end on the
vector app (``tests/apps/vector_app.py``) with fixed tables of arrival times.

Each reply's own latency fed to the estimator, fresh Monte Carlo samples every round, the
censoring time of replies still outstanding, a busy client priced by the work it was sent and
when (the latency book's pending work), and the adaptive keywords and ``config.json`` of an
auto run.
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg

import fl_gradcode.adaptive as adaptive
from fl_gradcode.flower import GradientCoding, gradient_coding_mod
from fl_gradcode.flower.testing import InProcessGrid
from fl_gradcode.latency import Pareto
from tests.apps.numpy_app import pytestmark  # noqa: F401 (the warning filter applies here)
from tests.apps.vector_app import DIM, train
from tests.flower.harness import FixedArrivals


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


def test_config_json_of_an_auto_run_names_the_nested_adaptive_code_and_s_auto(tmp_path):
    GradientCoding(FedAvg(), s="auto", s_max=3, results_dir=str(tmp_path))
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["code"] == "nested (adaptive)" and config["s"] == "auto"
    assert config["s_max"] == 3


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


def test_every_adaptive_keyword_reaches_the_options_and_the_code_policy():
    strategy = GradientCoding(FedAvg(), s="auto", s_max=3, exclude_slow=2.5)
    assert strategy.exclude_slow == 2.5 and strategy.code_policy.exclude_slow == 2.5
    # s="auto" starts at the safe s_max before any observation (not at 8 // 4 = 2)
    assert strategy.code_for(8).s == 3
    with pytest.raises(ValueError, match=r"exclude_slow=0\.5 must be a slowness factor > 1"):
        GradientCoding(FedAvg(), s="auto", exclude_slow=0.5)
