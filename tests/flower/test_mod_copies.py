"""The mod's reply at model scale: the same values as the plain numpy formula, the same bytes as
Flower's own serialization, no full-size temporaries, and a clear error for a wrongly shaped
app array."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fl_gradcode.flower import protocol
from fl_gradcode.flower.mod import MOD_ERROR_CODE, make_gradient_coding_mod
from tests.flower.messages import node_context, train_instruction, train_message


def _app(step: float, sizes: dict[int, int], shape_of=None):
    """An app whose partition ``j`` model is ``theta + step * (j + 1) * ramp`` on ``sizes[j]``
    examples (float32 in, float32 out, as a torch app replies)."""

    def app(msg: Message, ctx) -> Message:
        pid = int(ctx.node_config["partition-id"])
        out = {}
        for name, arr in msg.content["arrays"].items():
            theta = arr.numpy()
            ramp = np.linspace(-1, 1, theta.size, dtype=theta.dtype).reshape(theta.shape)
            new = np.asarray(theta + theta.dtype.type(step * (pid + 1)) * ramp)
            out[name] = Array(new if shape_of is None else new.reshape(-1)[: shape_of])
        return Message(RecordDict({"arrays": ArrayRecord(out),
                                   "metrics": MetricRecord({"num-examples": sizes[pid]})}),
                       reply_to=msg)

    return app


def _call(arrays, pids, coefs, wire="float64", app=None):
    inst = train_instruction(partition_ids=tuple(pids), num_partitions=(9,) * len(pids),
                             coefficients=tuple(coefs), wire=wire)
    sizes = {j: 10 + 7 * j for j in range(9)}
    reply = make_gradient_coding_mod()(train_message(inst, arrays), node_context(),
                                       app or _app(1e-3, sizes))
    return reply, sizes


@pytest.mark.parametrize("wire", ["float64", "model"])
def test_reply_of_a_multi_block_model_equals_the_numpy_formula_bit_for_bit(wire):
    rng = np.random.default_rng(1)
    # 200k values: several of the mod's blocks, plus a fortran-ordered and a 0-d array
    arrays = {"a": rng.standard_normal(200_003).astype(np.float32),
              "b": np.asfortranarray(rng.standard_normal((31, 17)).astype(np.float32)),
              "c": np.array(0.5, dtype=np.float32)}
    pids, coefs = (1, 4, 6), (0.5, -1.25, 2.0)
    reply, sizes = _call(arrays, pids, coefs, wire)
    assert not reply.has_error(), reply.error.reason
    record = reply.content[protocol.PROTOCOL_KEY]
    for name, theta in arrays.items():
        expected = np.zeros(theta.shape)
        for j, c in zip(pids, coefs, strict=True):
            ramp = np.linspace(-1, 1, theta.size, dtype=np.float32).reshape(theta.shape)
            new = np.asarray(theta + np.float32(1e-3 * (j + 1)) * ramp)
            expected += c * sizes[j] * (new.astype(np.float64) - theta.astype(np.float64))
        if wire == "model":
            expected = expected.astype(np.float32)
        got = record[name].numpy()
        assert got.dtype == expected.dtype and got.shape == expected.shape
        assert np.array_equal(got, expected), name


@settings(max_examples=40, deadline=None)
@given(hnp.arrays(dtype=st.sampled_from([np.float64, np.float32, np.int64, np.float16]),
                  shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5)),
       st.booleans())
def test_npy_array_writes_the_bytes_of_flowers_array(values, fortran):
    values = np.asfortranarray(values) if fortran else values
    # (np.ascontiguousarray would turn a 0-d array into shape (1,): np.asarray keeps it)
    assert protocol.npy_array(values).data == Array(np.asarray(values, order="C")).data
    if values.dtype.kind == "f":  # the wire cast: the bytes of Array(values.astype(float32))
        cast = protocol.npy_array(values, np.float32)
        assert cast.data == Array(np.asarray(values.astype(np.float32), order="C")).data
        assert (cast.dtype, tuple(cast.shape)) == ("float32", values.shape)


def test_npy_array_refuses_a_cast_that_is_not_same_kind():
    with pytest.raises(TypeError):
        protocol.npy_array(np.ones(3), np.int32)


def test_an_app_array_of_another_shape_is_an_error_naming_it_not_a_broadcast():
    # a (1,)-shaped reply used to broadcast silently against the (6,) model
    reply, _ = _call({"w": np.zeros(6, np.float32)}, (1,), (1.0,),
                     app=_app(1e-3, {j: 5 for j in range(9)}, shape_of=1))
    assert reply.has_error() and reply.error.code == MOD_ERROR_CODE
    assert "'w'" in reply.error.reason and "(1,)" in reply.error.reason
    assert "(6,)" in reply.error.reason


def _peak(fn) -> tuple[int, object]:
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        out = fn()
        return tracemalloc.get_traced_memory()[1] - base, out
    finally:
        tracemalloc.stop()


def test_peak_memory_of_a_coded_call_is_the_apps_own_plus_the_partitions_replies():
    """Three partitions of a 1M-value float32 model: beyond the app's own peak, the mod keeps
    the earlier partitions' replies (read-only views, float32) until it sums them block by
    block, straight into the float32 reply: 2.0 models measured. Adding one partition at a
    time into a float64 sum kept that sum (2 models) and the previous partition's reply until
    Python's cycle collector freed it (4.1 models); before that the mod also held a float64
    copy of the global model, a float64 difference and a float64 product (8.0 models)."""
    from flwr.app import MessageType

    arrays = {"w": np.random.default_rng(0).standard_normal(1_000_000).astype(np.float32)}
    model = arrays["w"].nbytes
    content = protocol.app_content(train_message(train_instruction(), arrays).content)
    inst = train_instruction(partition_ids=(1, 4, 6), num_partitions=(9,) * 3,
                             coefficients=(1.0, 1.0, 1.0), wire="model")
    msg = protocol.instruction_message(content, inst, 7, "1")
    mod, app = make_gradient_coding_mod(), _app(1e-3, {j: 10 for j in range(9)})
    plain = Message(content, dst_node_id=7, message_type=MessageType.TRAIN)
    app_peak, _ = _peak(lambda: app(plain, node_context({"partition-id": 1,
                                                         "num-partitions": 9})))
    peak, reply = _peak(lambda: mod(msg, node_context(), app))
    assert not reply.has_error(), reply.error.reason
    assert peak - app_peak <= 2.5 * model, f"{(peak - app_peak) / model:.2f} models"


def test_seeding_torch_draws_what_torch_manual_seed_draws():
    torch = pytest.importorskip("torch")

    from fl_gradcode.flower.mod import seed_everything

    torch.manual_seed(1234)
    expected = torch.rand(5)
    for _ in range(3):
        seed_everything(1234)
        assert torch.equal(torch.rand(5), expected)
