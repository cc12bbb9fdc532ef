"""The client mod (``mod.py``) and its wire protocol (``protocol.py``): record keys and their
defaults, partition seeds, the mod's error replies and partition-level DP inside the mod.

Expected values come from the documented contract (literal defaults and key names, the seed
formulas recomputed with hashlib / the privacy module) or from a plain numpy computation,
never from the function under test.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import re
import warnings

import numpy as np
import pytest
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)

from fl_gradcode.flower import mod as mod_module
from fl_gradcode.flower import protocol
from fl_gradcode.flower.mod import MOD_ERROR_CODE, make_gradient_coding_mod, partition_seed
from fl_gradcode.flower.protocol import Instruction
from fl_gradcode.privacy import NoiseKeys, noise_seed
from tests.flower.messages import DIM, node_context, train_instruction, train_message


def _target(pid: int) -> np.ndarray:
    return np.random.default_rng([5, pid]).standard_normal(DIM) * 3.0


def _train(msg: Message, context: Context) -> Message:
    """theta_j = theta - 0.5 (theta - target_j), n_j = 10 + 3 j; any int array is counted up."""
    pid = int(context.node_config["partition-id"])
    arrays = msg.content["arrays"]
    theta = arrays["w"].numpy()
    out = {"w": Array((theta - 0.5 * (theta - _target(pid))).astype(theta.dtype))}
    if "steps" in arrays:
        out["steps"] = Array(arrays["steps"].numpy() + 1)
    return Message(
        RecordDict({"arrays": ArrayRecord(out),
                    "metrics": MetricRecord({"num-examples": 10 + 3 * pid})}),
        reply_to=msg,
    )


# ------------------------------------------------------------------------------ protocol
def test_array_view_reads_what_numpy_reads_from_the_same_npy_bytes():
    """``array_view`` over an Array's ``.npy`` bytes: the shape, dtype, memory order and
    values numpy's own reader (``np.load``) gives for the same bytes."""
    rng = np.random.default_rng(0)
    for arr in (np.arange(3.0), rng.standard_normal((2, 5)).astype(np.float32),
                np.asfortranarray(rng.standard_normal((3, 4))), np.arange(24).reshape(2, 3, 4)):
        array = Array(arr)
        expected = np.load(io.BytesIO(array.data))
        view = protocol.array_view(array)
        assert view.shape == expected.shape and view.dtype == expected.dtype
        assert view.flags.f_contiguous == expected.flags.f_contiguous
        assert view.flags.c_contiguous == expected.flags.c_contiguous
        np.testing.assert_array_equal(view, expected)


def test_a_model_array_with_no_elements_is_read_back_empty_not_rejected_as_truncated():
    """A zero-size array (e.g. an empty layer) has a .npy header and no data bytes: the reader
    takes the header length from bytes 8-9 only, so the array reads back with its shape and
    dtype, and a coded reply holding one is accepted."""
    empty = np.zeros((3, 0), dtype=np.float32)
    view = protocol.array_view(Array(empty))
    assert view.shape == (3, 0) and view.dtype == np.float32
    request = Message(RecordDict(), dst_node_id=7, message_type=MessageType.TRAIN)
    reply = protocol.train_reply(request, train_instruction(worker=2, round=4),
                                 {"w": np.ones(2), "e": np.zeros(0)}, 8.0, [8.0], {}, 0.1)
    parsed = protocol.parse_reply(reply, worker=2, round=4, layout={"w": (2,), "e": (0,)})
    assert parsed.arrays["e"].shape == (0,)
    np.testing.assert_array_equal(parsed.arrays["w"], [1.0, 1.0])


def test_identity_with_partition_id_not_below_num_partitions_is_rejected():
    request = Message(RecordDict(), dst_node_id=7, message_type=MessageType.TRAIN)
    bad = protocol.identity_reply(request, 5, 3)
    with pytest.raises(protocol.RejectedReply, match="partition-id=5 num-partitions=3"):
        protocol.parse_identity(bad)
    assert protocol.parse_identity(protocol.identity_reply(request, 2, 3)).partition_id == 2


def test_instruction_fields_survive_the_record_round_trip():
    sent = Instruction(op="train", round=4, worker=2, seed=9, nonce="abc", partition_ids=(1, 2),
                       num_partitions=(5, 5), coefficients=(0.5, -1.0), dp="partition",
                       clip_norm=2.0, noise_multiplier=0.7, dp_noise="independent",
                       timing="wallclock", delay_s=1.5, weight_key="n", wire="model",
                       chunk_coefficients=(1.0, 2.0))
    rec = sent.to_record()
    assert rec["dp-noise"] == "independent"  # the documented key names
    assert rec["weight-key"] == "n" and rec["nonce"] == "abc" and rec["dp"] == "partition"
    assert protocol.parse_instruction(RecordDict({protocol.PROTOCOL_KEY: rec})) == sent


def test_a_record_with_only_an_op_gets_the_documented_defaults():
    got = protocol.parse_instruction(
        RecordDict({protocol.PROTOCOL_KEY: ConfigRecord({"op": "train"})}))
    assert got == Instruction(op="train")
    assert (got.dp, got.dp_noise, got.timing, got.weight_key, got.nonce, got.wire) == (
        "none", "identical", "virtual", "num-examples", "", "float64")
    assert got.num_partitions == () and got.chunk_coefficients == () and got.round == 0


def test_train_reply_carries_every_partition_size_and_a_placeholder_for_none():
    request = Message(RecordDict(), dst_node_id=7, message_type=MessageType.TRAIN)
    inst = train_instruction()
    reply = protocol.train_reply(request, inst, {"w": np.zeros(2)}, 8.0, [3.0, 5.0], {}, 0.1)
    assert reply.content[protocol.PROTOCOL_KEY + "-meta"]["partition-sizes"] == [3.0, 5.0]
    empty = protocol.train_reply(request, inst, {"w": np.zeros(2)}, 0.0, [], {}, 0.1)
    assert empty.content[protocol.PROTOCOL_KEY + "-meta"]["partition-sizes"] == [0.0]


def _parse_fields(**fields) -> Instruction:
    """parse_instruction of a train record holding ``fields`` (keys with '_' -> '-')."""
    rec = ConfigRecord({"op": "train", **{k.replace("_", "-"): v for k, v in fields.items()}})
    return protocol.parse_instruction(RecordDict({protocol.PROTOCOL_KEY: rec}))


def _refused(message: str, **fields) -> None:
    """parse_instruction refuses ``fields`` with exactly ``message``."""
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        _parse_fields(**fields)


def test_a_list_item_of_the_wrong_type_is_named_with_the_kind_the_field_needs():
    _refused("coefficients holds 'a', not a number", coefficients=["a"])
    _refused("partition-ids holds 0.5, not an int", partition_ids=[0.5])


def test_text_fields_take_up_to_256_characters_and_the_refusal_shows_the_first_40():
    text = "".join(chr(ord("a") + i % 26) for i in range(257))  # 'abc...z' repeated
    assert _parse_fields(nonce=text[:256]).nonce == text[:256]
    assert _parse_fields(weight_key=text[:256]).weight_key == text[:256]
    _refused(f"nonce='{text[:40]}' is not a string of at most 256 characters", nonce=text)


def test_an_empty_weight_key_is_refused_but_an_empty_nonce_is_the_default():
    _refused("weight-key='' is not a non-empty string of at most 256 characters",
             weight_key="")
    assert _parse_fields(nonce="").nonce == ""


def test_clip_norm_must_be_positive_and_noise_multiplier_may_be_zero():
    _refused("clip-norm=0.0; expected a finite number > 0", clip_norm=0.0)
    got = _parse_fields(clip_norm=1e-9, noise_multiplier=0.0)
    assert (got.clip_norm, got.noise_multiplier) == (1e-9, 0.0)


def test_num_partitions_up_to_100000_is_accepted_and_one_more_refused():
    got = _parse_fields(partition_ids=[99_999], num_partitions=[100_000], coefficients=[1.0])
    assert (got.partition_ids, got.num_partitions) == ((99_999,), (100_000,))
    _refused("num-partitions holds 100001; expected 1 <= num-partitions <= 100000",
             partition_ids=[0], num_partitions=[100_001], coefficients=[1.0])


def test_repeated_partition_ids_are_refused_naming_only_the_repeated_ones():
    _refused("partition-ids repeats [0, 3]; each partition at most once",
             partition_ids=[3, 1, 3, 0, 0, 2], num_partitions=[5] * 6, coefficients=[1.0] * 6)


def test_an_int_past_floats_range_is_refused_naming_its_field():
    """Flower's records hold any Python int in process: 10**400 in a float field or list is a
    ValueError naming the field (the mod's answer), not an OverflowError."""
    huge = 10**400
    _refused(f"clip-norm={huge!r}; expected a finite number > 0", clip_norm=huge)
    _refused(f"delay-s={huge!r}; expected a finite number >= 0 and <= "
             f"{protocol.MAX_DELAY_S:g}", delay_s=huge)
    _refused(f"coefficients holds {huge!r}; expected finite numbers", coefficients=[huge])
    assert _parse_fields(noise_multiplier=10**300).noise_multiplier == 1e300


def test_chunk_coefficients_take_up_to_1024_entries():
    values = [float(i) for i in range(1024)]
    assert _parse_fields(chunk_coefficients=values).chunk_coefficients == tuple(values)
    _refused("chunk-coefficients has 1025 entries; at most 1024",
             chunk_coefficients=[*values, 1.0])


def test_stop_after_s_is_read_from_its_key_and_survives_the_round_trip():
    assert _parse_fields(stop_after_s=2.5).stop_after_s == 2.5
    sent = Instruction(op="train", round=1, worker=0, stop_after_s=0.75)
    got = protocol.parse_instruction(RecordDict({protocol.PROTOCOL_KEY: sent.to_record()}))
    assert got == sent and got.stop_after_s == 0.75


def test_a_fortran_order_array_reads_back_with_its_values_in_place():
    """A .npy written from a column-major array says fortran_order True: its bytes are the
    values column by column, so the reader must reshape in Fortran order (numpy's np.load of
    the same bytes is the reference)."""
    values = np.asfortranarray(np.arange(12.0).reshape(3, 4))
    buf = io.BytesIO()
    np.save(buf, values)
    arr = Array(dtype="float64", shape=(3, 4), stype="numpy.ndarray", data=buf.getvalue())
    assert b"'fortran_order': True" in arr.data[:128]
    np.testing.assert_array_equal(protocol.array_view(arr), np.load(io.BytesIO(arr.data)))
    np.testing.assert_array_equal(protocol.array_view(arr), np.arange(12.0).reshape(3, 4))


def test_bytes_with_a_wrong_npy_magic_are_rejected_even_with_a_valid_header_after_it():
    buf = io.BytesIO()
    np.save(buf, np.arange(3.0))
    good = buf.getvalue()
    bad = b"\x93NUMPX" + good[6:]  # one byte of the magic string changed
    arr = Array(dtype="float64", shape=(3,), stype="numpy.ndarray", data=bad)
    with pytest.raises(protocol.RejectedReply, match=r"^array bytes are not \.npy \("):
        protocol.array_view(arr)



@pytest.mark.parametrize(("descr", "reason"), [
    (b"'<f9'", r"^array bytes are not \.npy \(ValueError: descr is not a valid dtype"),
    (b"'<q7'", r"^array bytes are not \.npy \(ValueError: descr is not a valid dtype"),
    (b"'|V0'", r"^array dtype \|V0 has values of zero bytes$"),
])
def test_a_well_formed_header_naming_no_usable_dtype_is_a_rejected_reply(descr, reason):
    """A header the fast path's pattern accepts but whose ``descr`` numpy does not understand
    (same length as ``'<f4'``, so the header stays well formed) is refused as any bad .npy
    is, with numpy's own parser's reason, instead of escaping as numpy's TypeError; a dtype of
    zero-byte values is refused by name instead of escaping as numpy's ValueError."""
    buf = io.BytesIO()
    np.save(buf, np.arange(3, dtype="<f4"))
    data = buf.getvalue().replace(b"'<f4'", descr, 1)
    arr = Array(dtype="float32", shape=(3,), stype="numpy.ndarray", data=data)
    with pytest.raises(protocol.RejectedReply, match=reason):
        protocol.array_view(arr)


def test_bytes_after_the_array_are_ignored_as_numpys_reader_ignores_them():
    """The reader takes exactly prod(shape) values after the header; trailing bytes (here one
    more float64) are not part of the array, as in numpy's own ``np.load`` of the bytes."""
    buf = io.BytesIO()
    np.save(buf, np.array([1.0, 2.0, 3.0]))
    data = buf.getvalue() + np.float64(9.0).tobytes()
    arr = Array(dtype="float64", shape=(3,), stype="numpy.ndarray", data=data)
    view = protocol.array_view(arr)
    np.testing.assert_array_equal(view, np.load(io.BytesIO(data)))
    np.testing.assert_array_equal(view, [1.0, 2.0, 3.0])


def test_a_header_as_numpy_writes_it_skips_numpys_literal_eval_parser(monkeypatch):
    """Headers as ``np.save`` writes them take the fast path: numpy's (literal_eval-based)
    header parser is only the fallback for unusual headers and is not called for them."""
    def refuse(*args, **kwargs):
        raise AssertionError("numpy's header parser was called")

    monkeypatch.setattr(np.lib.format, "read_array_header_1_0", refuse)
    monkeypatch.setattr(np.lib.format, "read_array_header_2_0", refuse)
    for values in (np.arange(4.0), np.ones((2, 3), dtype=np.float32)):
        np.testing.assert_array_equal(protocol.array_view(Array(values)), values)


def test_a_parsed_reply_names_the_node_that_sent_it():
    """``CodedReply.node`` is the reply's source node: the node the instruction went to."""
    request = Message(RecordDict(), dst_node_id=42, message_type=MessageType.TRAIN)
    reply = protocol.train_reply(request, train_instruction(worker=1, round=3),
                                 {"w": np.ones(2)}, 4.0, [4.0], {}, 0.1)
    assert protocol.parse_reply(reply, worker=1, round=3, layout={"w": (2,)}).node == 42


def test_an_identify_reply_without_the_record_names_the_lookup_error():
    request = Message(RecordDict(), dst_node_id=7, message_type=MessageType.TRAIN)
    with pytest.raises(protocol.RejectedReply,
                       match=r"^no identity in the reply \(KeyError: 'gradient-coding'\)$"):
        protocol.parse_identity(Message(RecordDict(), reply_to=request))
    partial = RecordDict({protocol.PROTOCOL_KEY: MetricRecord({"partition-id": 1})})
    with pytest.raises(protocol.RejectedReply,
                       match=r"^no identity in the reply \(KeyError: 'num-partitions'\)$"):
        protocol.parse_identity(Message(partial, reply_to=request))


def test_worker_minus_one_means_not_sent_and_below_it_is_refused():
    assert _parse_fields(worker=-1).worker == -1
    _refused("worker=-2; expected an integer >= -1", worker=-2)


def test_a_partition_id_not_below_its_num_partitions_is_refused_naming_both():
    _refused("partition-ids holds 5; expected 0 <= id < num-partitions=5",
             partition_ids=[1, 5], num_partitions=[5, 5], coefficients=[1.0, 1.0])
    _refused("partition-ids holds -2; expected 0 <= id < num-partitions=3",
             partition_ids=[-2], num_partitions=[3], coefficients=[1.0])

# ------------------------------------------------------------------------------ seeds
def test_public_partition_seed_is_the_documented_sha256_hash():
    tag = b"fl-gradcode;seed=3;round=2;partition=5"
    expected = int.from_bytes(hashlib.sha256(tag).digest()[:8], "little") >> 1
    assert partition_seed(3, 2, 5) == expected


def test_keyed_partition_seed_is_the_app_rng_hmac_seed_halved():
    """With a key: HMAC-SHA256(key, "nonce=N;round=r;partition=j;purpose=app-rng"), first 8
    bytes little-endian, halved to 63 bits (the privacy module's app-rng noise seed)."""
    key = bytes(range(32))
    for partition in range(8):
        seed = partition_seed(0, 4, partition, key, "nonce")
        tag = f"nonce=nonce;round=4;partition={partition};purpose=app-rng".encode()
        digest = hmac.new(key, tag, hashlib.sha256).digest()
        assert seed == int.from_bytes(digest[:8], "little") >> 1
        assert seed == noise_seed(key, 4, partition, purpose="app-rng", nonce="nonce") >> 1
        assert 0 <= seed < 2**63


# ------------------------------------------------------------------------------ the mod
def _error_reason(reply: Message, request: Message) -> str:
    assert reply.has_error()
    assert reply.error.code == MOD_ERROR_CODE
    # a reply to the request: addressed back to its sender, in its run and group
    assert reply.metadata.dst_node_id == request.metadata.src_node_id
    assert reply.metadata.group_id == request.metadata.group_id
    return reply.error.reason


def test_unknown_op_gets_a_named_error_reply_to_the_request():
    mod = make_gradient_coding_mod()
    msg = train_message(Instruction(op="explode"))
    reason = _error_reason(mod(msg, node_context(), _train), msg)
    assert "unknown gradient-coding op 'explode'" in reason


def test_identify_without_partition_in_the_node_config_names_the_missing_keys():
    mod = make_gradient_coding_mod()
    msg = train_message(Instruction(op=protocol.OP_IDENTIFY))
    reason = _error_reason(mod(msg, node_context({}), _train), msg)
    assert "lacks 'partition-id' / 'num-partitions'" in reason and "--node-config" in reason


def test_an_app_reply_with_two_unnamed_array_records_is_an_error_naming_them():
    def two_records(msg, context):
        return Message(RecordDict({"a": ArrayRecord({"w": Array(np.zeros(DIM))}),
                                   "b": ArrayRecord({"w": Array(np.zeros(DIM))})}),
                       reply_to=msg)

    mod = make_gradient_coding_mod()
    msg = train_message(train_instruction())
    reason = _error_reason(mod(msg, node_context(), two_records), msg)
    assert "2 ArrayRecords and none named 'arrays'" in reason


def test_the_shared_cache_computes_a_partition_once_per_round_for_all_its_replicas():
    calls = []

    def counting(msg, context):
        calls.append(int(context.node_config["partition-id"]))
        return _train(msg, context)

    mod = make_gradient_coding_mod(cache={})
    replies = [mod(train_message(train_instruction(worker=w)), node_context(), counting)
               for w in (0, 1)]
    assert calls == [1]
    a, b = (r.content[protocol.PROTOCOL_KEY]["w"].numpy() for r in replies)
    np.testing.assert_array_equal(a, b)


def test_public_seed_warning_is_given_without_a_key_and_not_with_one(tmp_path):
    message = ("no partition key on this node, so the seed of each partition's computation "
               "is a function of public values (run seed, round, partition)")
    with pytest.warns(UserWarning, match=re.escape(message)):
        make_gradient_coding_mod()(train_message(train_instruction()), node_context(), _train)
    mod = make_gradient_coding_mod()  # a fresh mod: it has given no warning yet
    key_file = tmp_path / "keys.json"
    key_file.write_text(json.dumps({"master": bytes(range(32)).hex()}))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        reply = mod(train_message(train_instruction()),
                    node_context({"partition-id": 0, "num-partitions": 3,
                              "dp-key-file": str(key_file)}), _train)
    assert not reply.has_error()
    assert not [w for w in seen if "public values" in str(w.message)]


def test_partition_dp_in_the_mod_clips_each_partitions_delta_to_the_clip_norm(tmp_path):
    """dp="partition", noise 0, clip C = 0.5: the reply is sum_j c_j n_j clip(delta_j) with
    delta_j = -0.5 (theta - target_j) computed here in numpy, clipped to norm C."""
    key_file = tmp_path / "keys.json"
    key_file.write_text(json.dumps({"master": bytes(range(32)).hex()}))
    NoiseKeys.from_file(str(key_file))  # a valid key file
    clip = 0.5
    inst = train_instruction(partition_ids=(1, 2), num_partitions=(3, 3),
                              coefficients=(1.0, -0.5), dp="partition", clip_norm=clip,
                              noise_multiplier=0.0)
    reply = make_gradient_coding_mod()(
        train_message(inst), node_context({"partition-id": 0, "num-partitions": 3,
                                  "dp-key-file": str(key_file)}), _train)
    assert not reply.has_error(), reply.error.reason if reply.has_error() else ""
    expected = np.zeros(DIM)
    for pid, coef in ((1, 1.0), (2, -0.5)):
        delta = -0.5 * (np.zeros(DIM) - _target(pid))
        assert np.linalg.norm(delta) > clip  # the clip binds
        expected += coef * (10 + 3 * pid) * delta * clip / np.linalg.norm(delta)
    got = reply.content[protocol.PROTOCOL_KEY]["w"].numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


def test_model_wire_casts_float_arrays_to_the_model_dtype_and_keeps_others_float64():
    """wire="model": float32 arrays travel as float32; an int64 array's coded value (here
    0.5 * 13 * 1 = 6.5, not an integer) stays float64 instead of being truncated."""
    inst = train_instruction(coefficients=(0.5,), wire="model")
    msg = train_message(inst, {"w": np.zeros(DIM, dtype=np.float32),
                          "steps": np.array([4], dtype=np.int64)})
    reply = make_gradient_coding_mod()(msg, node_context(), _train)
    arrays = reply.content[protocol.PROTOCOL_KEY]
    assert arrays["w"].numpy().dtype == np.float32
    steps = arrays["steps"].numpy()
    assert steps.dtype == np.float64
    assert steps[0] == pytest.approx(0.5 * 13 * 1)


def test_an_app_returning_other_array_names_gets_an_error_naming_both_sets():
    def renamed(msg, context):
        return Message(RecordDict({"arrays": ArrayRecord({"v": Array(np.zeros(DIM))}),
                                   "metrics": MetricRecord({"num-examples": 3})}), reply_to=msg)

    msg = train_message(train_instruction())
    reason = _error_reason(make_gradient_coding_mod()(msg, node_context(), renamed), msg)
    assert "the app returned arrays ['v'] for partition 1; the global model has ['w']" in reason


def test_a_malformed_protocol_record_gets_an_error_reply_not_a_crash():
    msg = train_message(train_instruction())
    msg.content.config_records[protocol.PROTOCOL_KEY]["round"] = "not a number"
    reply = make_gradient_coding_mod()(msg, node_context(), _train)
    assert _error_reason(reply, msg).startswith("bad gradient-coding record: ")


def test_messages_without_the_protocol_record_reach_the_app_with_its_own_context():
    seen = []

    def app(msg, context):
        seen.append(context)
        return Message(RecordDict(), reply_to=msg)

    ctx = node_context()
    plain = Message(RecordDict({"arrays": ArrayRecord({"w": Array(np.zeros(DIM))})}),
                    dst_node_id=7, message_type=MessageType.TRAIN)
    evaluate = Message(RecordDict(), dst_node_id=7, message_type=MessageType.EVALUATE)
    mod = make_gradient_coding_mod()
    for msg in (plain, evaluate):
        assert not mod(msg, ctx, app).has_error()
    assert seen == [ctx, ctx] and all(c is ctx for c in seen)


def test_keyed_partition_seed_without_a_nonce_uses_the_empty_nonce():
    """Documented message without a nonce: ``round=r;partition=j;app-rng`` (no nonce prefix)."""
    key = bytes(range(32))
    assert partition_seed(0, 4, 2, key) == noise_seed(key, 4, 2, purpose="app-rng") >> 1
    assert partition_seed(0, 4, 2, key) == partition_seed(0, 4, 2, key, "")
    assert partition_seed(0, 4, 2, key) != partition_seed(0, 4, 2, key, "XXXX")


class _TorchWithState:
    """An imported torch as far as the RNG helpers see it: one CPU RNG state."""

    def __init__(self, state: str) -> None:
        self.state = state

    def get_rng_state(self) -> str:
        return self.state

    def set_rng_state(self, state: str) -> None:
        self.state = state


def test_rng_states_saves_and_restores_torchs_state_once_torch_is_imported(monkeypatch):
    """Python's and numpy's states round-trip; torch's state is saved when torch is in
    sys.modules and put back by set_rng_states."""
    import random
    import sys

    fake = _TorchWithState("S0")
    monkeypatch.setitem(sys.modules, "torch", fake)
    states = mod_module.rng_states()
    assert states[0] == random.getstate()
    assert states[2] == "S0"
    fake.state = "changed by the app"
    mod_module.set_rng_states(states)
    assert fake.state == "S0"
    monkeypatch.delitem(sys.modules, "torch")
    assert mod_module.rng_states()[2] is None


def test_more_partitions_than_one_instruction_may_carry_are_refused_naming_the_limit():
    n = 1025  # one more than the documented limit of 1024 partitions per instruction
    assert protocol.MAX_ASSIGNED_PARTITIONS == n - 1
    _refused(f"partition-ids has {n} entries; at most {n - 1} partitions per instruction",
             partition_ids=list(range(n)), num_partitions=[n] * n, coefficients=[1.0] * n)


def test_a_reply_in_another_dtype_than_the_rounds_wire_dtype_is_rejected_naming_both():
    request = Message(RecordDict(), dst_node_id=7, message_type=MessageType.TRAIN)
    reply = protocol.train_reply(request, train_instruction(worker=2, round=4),
                                 {"w": np.ones(2, dtype=np.float32)}, 8.0, [8.0], {}, 0.1)
    with pytest.raises(protocol.RejectedReply,
                       match=r"^array 'w' has dtype float32; this round's wire is float64$"):
        protocol.parse_reply(reply, worker=2, round=4, layout={"w": (2,)},
                             dtypes={"w": np.dtype(np.float64)})
    ok = protocol.parse_reply(reply, worker=2, round=4, layout={"w": (2,)},
                              dtypes={"w": np.dtype(np.float32)})
    assert ok.arrays["w"].dtype == np.float32


def test_a_train_instruction_without_a_worker_is_refused_naming_the_worker():
    with pytest.raises(ValueError, match=r"^worker=-1; a train instruction needs worker >= 0$"):
        Instruction(op="train", round=1, worker=-1).check_train()
    Instruction(op="train", round=1, worker=0).check_train()  # worker 0 is a worker


def test_a_subnormal_clip_norm_is_refused_naming_it():
    """A clip norm below the smallest normal float clips to about twice itself (the noise is
    sized for it once): refused, as 0 is; the smallest normal float is accepted."""
    _refused("clip-norm=5e-323; expected a finite number >= 2.22507e-308 (the smallest "
             "normal float)", clip_norm=5e-323)
    assert _parse_fields(clip_norm=2.2250738585072014e-308).clip_norm > 0
