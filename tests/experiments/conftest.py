"""Fixtures shared by the readings' tests."""

from __future__ import annotations

import pytest

from experiments import compare


@pytest.fixture(scope="module")
def small_cell():
    """A small finished cell as the benchmark stores one (auto and a tuned FedBuff)."""
    grid = compare.load_grid()
    grid = {**grid, "rules": {**grid["rules"], "fedbuff_tune_server_lr": [1.0],
                              "fedbuff_tune_buffer_fraction": [0.5],
                              "fedbuff_tune_extend": 0}}
    with compare.harness_environment():
        result = compare.run_cell(grid, "digits-logreg", "persistent", 6, 6, 4, [10, 11],
                                  [0], ["auto", "fedbuff"], 0.5)
    return grid, result
