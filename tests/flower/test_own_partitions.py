"""Every code a round runs codes the cohort members' own partitions (k = cohort), whatever
the code's own construction would give for that size."""

from __future__ import annotations

import random

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord
from flwr.clientapp import ClientApp

from fl_gradcode.flower import GradientCoding, gradient_coding_mod
from fl_gradcode.flower.testing import InProcessGrid
from tests.flower.harness import SamplingRecorder
from tests.flower.test_plugin_comm_efficient import SHAPES, assert_sampled_fedavg, train


@pytest.mark.parametrize(("code", "s", "options"), [("grouped-rs", 3, {}),
                                                    ("comm-efficient", 1, {"m": 3})])
def test_a_sampled_cohort_is_fedavg_over_its_own_partitions(code, s, options):
    """12 nodes, FedAvg samples 6 a round. grouped-rs with s = 3 on 6 clients is, as built
    by itself, 5 partitions (a copied row); comm-efficient s = 1, m = 3 on 6 is one group
    of s + m = 4 partitions (k = 4). Each round must be FedAvg over the 6 sampled nodes'
    own partitions, exact."""
    random.seed(5)
    app = ClientApp(mods=[gradient_coding_mod])
    app.train()(train)
    inner = SamplingRecorder(fraction_train=0.5, fraction_evaluate=0.0,
                             min_available_nodes=12)
    strategy = GradientCoding(inner, code=code, s=s, seed=2, **options)
    grid = InProcessGrid(app, 12)
    initial = ArrayRecord({k: Array(np.zeros(v, np.float32)) for k, v in SHAPES.items()})
    result = strategy.start(grid=grid, initial_arrays=initial, num_rounds=3,
                            train_config=ConfigRecord({}))
    assert [r["decode"] for r in strategy.history] == ["exact"] * 3
    assert len(inner.sampled) == 3
    assert_sampled_fedavg(result, grid, inner.sampled)
