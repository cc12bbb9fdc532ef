"""Helpers shared by the tests of adaptive tolerance (tests/adaptive): one simulated round
with early return fed to a ``LatencyEstimator``, and ``run``: rounds of ``GradientCoding(s="auto")``
on the vector app's ``N`` in-process nodes."""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg

from fl_gradcode.adaptive import code_loads, decode_rule
from fl_gradcode.flower import GradientCoding, gradient_coding_mod
from fl_gradcode.flower.testing import InProcessGrid
from tests.apps.vector_app import DIM, train

N = 12


def run(latency, rounds=8, s_max=3, **options):
    app = ClientApp(mods=[gradient_coding_mod])
    app.train()(train)
    strategy = GradientCoding(
        FedAvg(fraction_evaluate=0.0, min_available_nodes=N), s="auto", s_max=s_max,
        latency=latency, seed=0, wire="float64", straggler_timeout=1e6, compute_cost_s=0.1,
        measured_compute=False, **options,
    )
    result = strategy.start(grid=InProcessGrid(app, N),
                            initial_arrays=ArrayRecord({"w": Array(np.zeros(DIM))}),
                            num_rounds=rounds, train_config=ConfigRecord({}))
    return strategy, result.arrays["w"].numpy()


def simulate_round(est, code, times, *, late=False):
    """One round with early return: decode at the rule's time, censor the rest."""
    end = float(decode_rule(code).times(times[None, :])[0])
    rid = est.update(np.where(times <= end, times, np.nan), code_loads(code), end)
    if late:  # late replies arrive after the round and are reported then
        for i in np.flatnonzero(times > end):
            est.observe_late(rid, int(i), float(times[i]))
    return end
