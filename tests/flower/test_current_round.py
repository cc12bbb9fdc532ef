"""``GradientCoding.current_round``: a read-only view of the coded round (number, cohort, code,
reply dtype) for diagnostics and benchmarks, read without touching the strategy's internals."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from flwr.serverapp.strategy import FedAvg

from fl_gradcode.flower import GradientCoding
from tests.flower.harness import run


def test_no_round_before_the_first_one_is_configured():
    assert GradientCoding(FedAvg(), code="frc", s=1, seed=0).current_round is None


def test_the_view_names_the_last_round_its_cohort_code_and_wire():
    out = run(4, code="frc", s=1, rounds=2)
    view = out.strategy.current_round
    assert view.number == 2 == out.rows[-1]["round"]
    assert view.wire == out.rows[-1]["wire"]
    assert sorted(view.cohort) == sorted(out.grid.node_ids)
    # FRC, n = 4, s = 1: two groups of two workers, each worker holding its group's partitions
    block = np.ones((2, 2))
    np.testing.assert_array_equal(view.code.B, np.block([[block, 0 * block], [0 * block, block]]))


def test_the_view_cannot_change_the_round():
    out = run(4, code="frc", s=1, rounds=1)
    view = out.strategy.current_round
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.number = 7
    assert isinstance(view.cohort, tuple)
    assert out.strategy.current_round == view  # a fresh view of the same round
