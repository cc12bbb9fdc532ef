"""s="auto" through the plug-in: exact rounds stay exact while s changes between rounds."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg
from test_integrity import DIM, oracle, train

from fl_gradcode.flower import GradientCoding, gradient_coding_mod
from fl_gradcode.flower.testing import InProcessGrid
from fl_gradcode.latency import Bimodal, Drift, Pareto, ShiftedExponential

N = 12


def run(latency, rounds=8, s_max=3):
    app = ClientApp(mods=[gradient_coding_mod])
    app.train()(train)
    strategy = GradientCoding(
        FedAvg(fraction_evaluate=0.0, min_available_nodes=N), s="auto", s_max=s_max,
        latency=latency, seed=0, wire="float64", straggler_timeout=1e6, compute_cost_s=0.1,
        measured_compute=False,
    )
    result = strategy.start(grid=InProcessGrid(app, N),
                            initial_arrays=ArrayRecord({"w": Array(np.zeros(DIM))}),
                            num_rounds=rounds, train_config=ConfigRecord({}))
    return strategy, result.arrays["w"].numpy()


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
    assert all(r["expected_round_s"] is not None for r in strategy.history)


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
