"""The gradient noise scale diagnostic (experiments.noise_scale) against a hand reference."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from experiments import noise_scale


def test_identical_updates_have_no_noise_and_opposite_ones_no_signal():
    u = np.array([[1.0, 2.0], [1.0, 2.0], [1.0, 2.0]])
    assert noise_scale.noise_scale(u, [1, 2, 3]) == 0.0
    assert noise_scale.noise_scale(np.array([[1.0, 0.0], [-1.0, 0.0]]), [1, 1]) == float("inf")


def test_two_clients_by_hand():
    # G = (3 * [2, 0] + 1 * [-2, 0]) / 4 = [1, 0]; spread = (3 * 1 + 1 * 9) / 4 = 3
    u = np.array([[2.0, 0.0], [-2.0, 0.0]])
    assert noise_scale.noise_scale(u, [3, 1]) == pytest.approx(3.0)


@settings(max_examples=50, deadline=None)
@given(st.integers(2, 6), st.integers(1, 4), st.integers(0, 2**31 - 1))
def test_equal_weights_match_the_plain_mean_formula(k, d, seed):
    rng = np.random.default_rng(seed)
    u = rng.normal(size=(k, d)) + 3.0
    mean = u.mean(axis=0)
    expected = np.mean([np.sum((row - mean) ** 2) for row in u]) / np.sum(mean ** 2)
    assert noise_scale.noise_scale(u, [1.0] * k) == pytest.approx(expected)


@pytest.mark.parametrize("weights", [[1, -1], [0, 0], [1]])
def test_bad_weights_are_refused_naming_them(weights):
    with pytest.raises(ValueError, match="weights"):
        noise_scale.noise_scale(np.ones((2, 3)), weights)


def test_the_quick_run_writes_one_row_per_seed(tmp_path):
    out = tmp_path / "ns.json"
    assert noise_scale.main(["--quick", "--seeds", "0,1", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["task"], r["seed"]) for r in rows] == [("digits-logreg", 0), ("digits-logreg", 1)]
    assert all(r["noise_scale_clients"] > 0 and 0 < r["progress_of_full_cohort"] < 1
               for r in rows)


def test_evaluation_seeds_are_refused():
    with pytest.raises(SystemExit, match="development seeds only"):
        noise_scale.main(["--quick", "--seeds", "0,12"])


def test_the_docs_block_shows_the_progress_shares_of_the_noise_model():
    from tools.docgen.approximate import render_noise

    rows = [{"task": "t", "n": 100, "cohort": 10, "seed": s, "clients": 10,
             "mean_examples": 4.0, "noise_scale_clients": b} for s, b in ((0, 5.0), (1, 10.0),
                                                                          (2, 40.0))]
    text = render_noise({"seeds": [0, 1, 2], "rows": rows})
    # median B = 10: all 10 replies 1 / (1 + 10 / 10) = 50 %; a tenth (1 reply) 1 / 11 = 9 %;
    # the second over the first: 2 / 11 = 18 %
    assert "| t/100x10 | 10.0 | 4.0 | 50 % | 9 % | 18 % |" in text
