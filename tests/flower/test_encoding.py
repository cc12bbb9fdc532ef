"""A worker's coded update ``sum_j w_j (theta_j - theta)``: against numpy in float64, the
same bits as adding the partitions one at a time, written in the wire dtype."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fl_gradcode.flower import encoding
from fl_gradcode.flower.encoding import accumulate_delta, coded_update


def _models(rng, shapes, count, dtype=np.float32):
    theta = {k: rng.standard_normal(v).astype(dtype) for k, v in shapes.items()}
    models = [{k: (v + 0.01 * rng.standard_normal(v.shape)).astype(dtype)
               for k, v in theta.items()} for _ in range(count)]
    return theta, models


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), count=st.integers(1, 5), block=st.integers(1, 9),
       size=st.integers(0, 40))
def test_the_sum_is_numpys_float64_sum_and_the_bits_of_adding_one_at_a_time(seed, count, block,
                                                                             size):
    rng = np.random.default_rng(seed)
    theta, models = _models(rng, {"w": (size,), "b": (3, 2)}, count)
    weights = rng.uniform(-40, 40, size=count).tolist()
    old_block = encoding.BLOCK
    encoding.BLOCK = block  # blocks of 1-9 values: every straddle
    try:
        got = coded_update(weights, models, theta)
        for name, old in theta.items():
            # numpy reference, in float64, in the partitions' order
            expected = np.zeros(old.shape)
            for w, model in zip(weights, models, strict=True):
                expected = expected + w * (model[name].astype(np.float64)
                                           - old.astype(np.float64))
            assert got[name].dtype == np.float64 and got[name].shape == old.shape
            np.testing.assert_array_equal(got[name], expected)
            one_at_a_time = np.zeros(old.shape)
            scratch = np.empty(block)
            for w, model in zip(weights, models, strict=True):
                accumulate_delta(one_at_a_time, w, model[name], old, scratch)
            np.testing.assert_array_equal(got[name], one_at_a_time)
    finally:
        encoding.BLOCK = old_block


def test_arrays_are_written_in_their_wire_dtype_rounded_once():
    rng = np.random.default_rng(3)
    theta, models = _models(rng, {"w": (70_000,), "b": (5,)}, 3)
    weights = [7.0, -2.5, 11.0]
    got = coded_update(weights, models, theta, {"w": np.dtype(np.float32)})
    exact = sum(w * (m["w"].astype(np.float64) - theta["w"].astype(np.float64))
                for w, m in zip(weights, models, strict=True))
    assert got["w"].dtype == np.float32 and got["b"].dtype == np.float64
    np.testing.assert_array_equal(got["w"], exact.astype(np.float32))  # one rounding


def test_integer_model_arrays_are_differenced_in_float64():
    theta = {"steps": np.array([5, 9], dtype=np.int64)}
    models = [{"steps": np.array([6, 9], dtype=np.int64)},
              {"steps": np.array([8, 7], dtype=np.int64)}]
    got = coded_update([2.0, 0.5], models, theta)
    np.testing.assert_array_equal(got["steps"], [2.0 * 1 + 0.5 * 3, 2.0 * 0 + 0.5 * -2])


def test_no_partitions_give_zeros_and_mismatches_are_named():
    theta = {"w": np.ones((2, 2), np.float32)}
    got = coded_update([], [], theta, {"w": np.dtype(np.float32)})
    assert got["w"].dtype == np.float32
    np.testing.assert_array_equal(got["w"], np.zeros((2, 2)))
    with pytest.raises(ValueError, match=r"^2 weights for 1 models; expected one each$"):
        coded_update([1.0, 2.0], [theta], theta)
    with pytest.raises(ValueError, match=r"^array 'w' has 3 values in a partition's model; "
                                         r"expected 4 \(the global model's\)$"):
        coded_update([1.0], [{"w": np.ones(3)}], theta)
    with pytest.raises(TypeError):  # float -> int is not a same_kind cast
        coded_update([1.0], [theta], theta, {"w": np.dtype(np.int32)})
