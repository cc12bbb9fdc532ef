"""The client mod's edges: the nonce binding and keyed app seeds recomputed from their
definition with hashlib, the identify reply, the stop reply, the node config the app sees,
torch seeding with and without an accelerator, the context.state and public-seed warnings
(their full text), and the float64 partition delta.

Expected values come from the documented definitions (hashlib, numpy, literal messages),
never from the function under test.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Error,
    Message,
    MetricRecord,
    RecordDict,
)

from fl_gradcode.flower import protocol
from fl_gradcode.flower.mod import (
    MOD_ERROR_CODE,
    MOD_STOPPED_CODE,
    PartitionResult,
    make_gradient_coding_mod,
    seed_everything,
)
from fl_gradcode.flower.records import TRACEBACK_MARKER
from fl_gradcode.privacy import NoiseKeys, noise_seed
from tests.flower.messages import DIM, node_context, train_instruction, train_message

MASTER = bytes(range(32))


def _key_file(tmp_path) -> str:
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"master": MASTER.hex()}))
    return str(path)


def _expected_bound_nonce(nonce: str, params: dict, records: list[tuple[str, str, dict]],
                          arrays: dict | None = None, run_config: dict | None = None,
                          action: str | None = None) -> str:
    """The documented binding: sha256 over the DP parameters (JSON, sorted keys), then over
    each non-array record ``[key, type name, sorted (name, repr(value)) pairs]`` in key order,
    then ``["run-config", sorted (name, repr(value)) pairs]`` of the run config the app may
    read (``run_config`` here: the server-only keys already left out), then
    ``";arrays=<hex sha256 of the arrays>"``: for each array (record ``arrays``, names
    sorted) ``[record, name, kind, shape]`` (kind ``"float"`` for float64, ``"float32"``,
    ``"float16"`` for those) then its float64 values' bytes (after ``["train-action",
    action]`` for a message type ``train.<action>`` other than ``train.default``);
    ``"<nonce>;bind=<first 32 hex digits>"``. A record whose items are not in sorted order
    also binds ``[key, "order", its names as received]`` after its pairs."""
    digest = hashlib.sha256(json.dumps(params, sort_keys=True).encode())
    for key, kind, items in sorted(records):
        pairs = sorted((str(k), repr(v)) for k, v in items.items())
        digest.update(json.dumps([key, kind, pairs]).encode())
        if list(items) != sorted(items):
            digest.update(json.dumps([key, "order", list(items)]).encode())
    pairs = sorted((str(k), repr(v)) for k, v in (run_config or {}).items())
    digest.update(json.dumps(["run-config", pairs]).encode())
    if action is not None:
        digest.update(json.dumps(["train-action", action]).encode())
    values = hashlib.sha256()
    for name, arr in sorted((arrays if arrays is not None else {"w": np.zeros(DIM)}).items()):
        bits = 8 * np.asarray(arr).dtype.itemsize
        kind = "float" if bits == 64 else f"float{bits}"
        arr = np.asarray(arr, dtype=np.float64)
        values.update(json.dumps(["arrays", name, kind, list(arr.shape)]).encode())
        values.update(arr.tobytes())
    digest.update(f";arrays={values.hexdigest()}".encode())
    return f"{nonce};bind={digest.hexdigest()[:32]}"


def _app(seen: list | None = None):
    """theta_j = theta + (j + 1); n_j = 4; records the node config and Python's first draw."""

    def app(msg: Message, context: Context) -> Message:
        if seen is not None:
            seen.append((dict(context.node_config), random.random()))
        pid = int(context.node_config["partition-id"])
        theta = msg.content["arrays"]["w"].numpy()
        return Message(RecordDict({"arrays": ArrayRecord({"w": Array(theta + pid + 1.0)}),
                                   "metrics": MetricRecord({"num-examples": 4})}), reply_to=msg)

    return app


# ------------------------------------------------------------------------------ nonce binding
def test_a_keyed_node_seeds_the_app_from_the_hmac_of_the_bound_nonce(tmp_path):
    """With a key file the app's RNG seed is HMAC(key_j, bound nonce, round, j) >> 1: Python's
    first draw equals random.Random(that seed)'s, and another run nonce gives another draw."""
    key_file = _key_file(tmp_path)
    params = {"dp": "none", "clip-norm": "1.0", "noise-multiplier": "0.0",
              "dp-noise": "identical"}
    defaults = protocol.Instruction(op="train")
    assert (defaults.clip_norm, defaults.noise_multiplier) == (1.0, 0.0)  # as in params
    draws = {}
    for nonce in ("a", "b"):
        inst = train_instruction(nonce=nonce, round=3, partition_ids=(2,), num_partitions=(3,))
        seen: list = []
        reply = make_gradient_coding_mod()(
            train_message(inst), node_context({"partition-id": 0, "num-partitions": 3,
                                               "dp-key-file": key_file}), _app(seen))
        assert not reply.has_error(), reply.error.reason if reply.has_error() else ""
        bound = _expected_bound_nonce(nonce, params, [("config", "ConfigRecord", {})])
        key = _partition_key(2)
        assert key == NoiseKeys.from_file(key_file).key(2)
        # each partition's seeds also bind its num-partitions (3): "<bound>;of=3"
        seed = noise_seed(key, 3, 2, purpose="app-rng", nonce=f"{bound};of=3") >> 1
        assert seen[0][1] == random.Random(seed).random()
        draws[nonce] = seen[0][1]
    assert draws["a"] != draws["b"]


def _partition_key(partition: int) -> bytes:
    """The key of ``partition`` derived from the master key (the key file's documented
    derivation: HMAC-SHA256(master, "partition=j"))."""
    import hmac

    return hmac.new(MASTER, f"partition={partition}".encode(), hashlib.sha256).digest()


# ------------------------------------------------------------------------------ the app's context
def test_the_app_sees_the_instructed_partition_and_partition_count_in_its_node_config():
    seen: list = []
    inst = train_instruction(partition_ids=(4,), num_partitions=(5,))
    reply = make_gradient_coding_mod()(
        train_message(inst), node_context({"partition-id": 0, "num-partitions": 3, "x": 1}),
        _app(seen))
    assert not reply.has_error()
    assert seen[0][0] == {"partition-id": 4, "num-partitions": 5, "x": 1}


# ------------------------------------------------------------------------------ identify
def test_identify_replies_the_node_configs_partition():
    msg = train_message(protocol.Instruction(op=protocol.OP_IDENTIFY))
    reply = make_gradient_coding_mod()(msg, node_context({"partition-id": 2,
                                                          "num-partitions": 5}), _app())
    assert protocol.parse_identity(reply) == protocol.Identity(2, 5)


def test_identify_with_only_a_partition_id_is_refused():
    msg = train_message(protocol.Instruction(op=protocol.OP_IDENTIFY))
    reply = make_gradient_coding_mod()(msg, node_context({"partition-id": 2}), _app())
    assert reply.has_error() and reply.error.code == MOD_ERROR_CODE
    assert reply.error.reason.startswith(
        "ValueError: node config {'partition-id': 2} lacks 'partition-id' / 'num-partitions'")


# ------------------------------------------------------------------------------ error replies
def test_an_error_reply_names_the_exception_type_and_message_first():
    def failing(msg: Message, context: Context) -> Message:
        return Message(Error(7, "boom"), reply_to=msg)

    msg = train_message(train_instruction())
    reply = make_gradient_coding_mod()(msg, node_context(), failing)
    assert reply.has_error() and reply.error.code == MOD_ERROR_CODE
    assert reply.error.reason.startswith(
        "RuntimeError: the app failed on partition 1: code 7: boom")


def test_work_past_the_rounds_deadline_gets_the_stopped_error_reply():
    calls: list = []
    msg = train_message(train_instruction(stop_after_s=1.0))
    msg.metadata.created_at = time.time() - 100.0  # the round closed long ago
    reply = make_gradient_coding_mod()(msg, node_context(), _app(calls))
    assert calls == []
    assert reply.has_error() and reply.error.code == MOD_STOPPED_CODE == 5401
    assert reply.error.reason == (
        "stopped after 0 of 1 partitions: the round's deadline (stop-after-s=1 s after the "
        "message was created) has passed")
    assert reply.metadata.dst_node_id == msg.metadata.src_node_id


# ------------------------------------------------------------------------------ torch seeding
class _FakeTorch:
    """Records which seeding call the mod made."""

    def __init__(self, accelerator) -> None:
        self.calls: list = []
        if accelerator is not None:
            self.accelerator = accelerator
        self.default_generator = SimpleNamespace(
            manual_seed=lambda s: self.calls.append(("generator", s)))

    def manual_seed(self, seed) -> None:
        self.calls.append(("torch", seed))


@pytest.mark.parametrize(("accelerator", "expected"), [
    (None, "torch"),  # an old torch without torch.accelerator
    (SimpleNamespace(is_available=lambda: True), "torch"),
    (SimpleNamespace(is_available=lambda: False), "generator"),
])
def test_torch_is_seeded_on_every_device_unless_only_the_cpu_exists(
        monkeypatch, accelerator, expected):
    fake = _FakeTorch(accelerator)
    monkeypatch.setitem(sys.modules, "torch", fake)
    state = random.getstate(), np.random.get_state()  # noqa: NPY002
    try:
        seed_everything(12345)
    finally:
        random.setstate(state[0])
        np.random.set_state(state[1])  # noqa: NPY002
    assert fake.calls == [(expected, 12345)]


# ------------------------------------------------------------------------------ warnings
STATE_WARNING = (
    "gradient_coding_mod: the app wrote context.state during a coded train call; "
    "those writes are discarded (each partition call gets a fresh, empty state, "
    "because every replica of a partition must compute identically, whichever node "
    "it runs on and whatever that node computed before). Keep state the app needs "
    "across rounds in the messages (the model / config records) or in the run "
    "config, or derive it from the round and partition.")


def _state_writer(replace: bool):
    inner = _app()

    def app(msg: Message, context: Context) -> Message:
        if replace:
            context.state = object()  # not a RecordDict: no len()
        else:
            context.state["mine"] = ConfigRecord({"step": 1})
        return inner(msg, context)

    return app


@pytest.mark.parametrize("replace", [False, True])
def test_an_app_writing_context_state_is_warned_once_with_the_full_reason(replace):
    mod = make_gradient_coding_mod()
    with pytest.warns(UserWarning, match="^" + re.escape(STATE_WARNING) + "$"):
        reply = mod(train_message(train_instruction()), node_context(), _state_writer(replace))
    assert not reply.has_error(), reply.error.reason if reply.has_error() else ""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        again = mod(train_message(train_instruction()), node_context(), _state_writer(replace))
    assert not again.has_error()
    assert not [w for w in seen if "context.state" in str(w.message)]


def test_an_app_leaving_context_state_alone_is_not_warned():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        make_gradient_coding_mod()(train_message(train_instruction()), node_context(), _app())
    assert not [w for w in seen if "context.state" in str(w.message)]


PUBLIC_SEED_WARNING = (
    "gradient_coding_mod: no partition key on this node, so the seed of each "
    "partition's computation is a function of public values (run seed, round, "
    "partition); noise drawn inside the app (e.g. Opacus DP-SGD) is reproducible "
    "by the server. Give nodes a key file (python -m fl_gradcode.privacy keygen) "
    "for secret, per-run randomness.")


def test_the_public_seed_warning_has_its_full_text():
    with pytest.warns(UserWarning, match="^" + re.escape(PUBLIC_SEED_WARNING) + "$"):
        make_gradient_coding_mod()(train_message(train_instruction()), node_context(), _app())


# ------------------------------------------------------------------------------ deltas
def test_a_partition_delta_is_formed_in_float64_not_in_the_apps_dtype():
    """float32 1 - float32 1e-8 is 1.0 in float32 but 1 - 1e-8 (to float64 rounding) in
    float64."""
    new = np.array([1.0, 3.0], dtype=np.float32)
    old = np.array([1e-8, 0.5], dtype=np.float32)
    result = PartitionResult({"w": new}, 4.0, {}, 0.0)
    delta = result.delta({"w": old})["w"]
    assert delta.dtype == np.float64
    expected = np.array([float(np.float32(1.0)) - float(np.float32(1e-8)), 2.5])
    np.testing.assert_array_equal(delta, expected)
    assert delta[0] != 1.0


# ------------------------------------------------------------------------------ record choice
def test_an_app_reply_with_two_unnamed_metric_records_is_an_error_naming_them():
    def two_metrics(msg: Message, context: Context) -> Message:
        theta = msg.content["arrays"]["w"].numpy()
        return Message(RecordDict({"arrays": ArrayRecord({"w": Array(theta)}),
                                   "m1": MetricRecord({"num-examples": 4}),
                                   "m2": MetricRecord({"num-examples": 4})}), reply_to=msg)

    reply = make_gradient_coding_mod()(train_message(train_instruction()), node_context(),
                                       two_metrics)
    assert reply.has_error() and reply.error.code == MOD_ERROR_CODE
    assert reply.error.reason.startswith(
        "ValueError: the app's reply has 2 MetricRecords and none named 'metrics'")


def _with_array_records(records: dict[str, dict[str, np.ndarray]]) -> Message:
    """A train message whose content holds ``records`` as ArrayRecords (and the instruction)."""
    msg = train_message(train_instruction())
    for name in list(msg.content.array_records):
        del msg.content[name]
    for name, arrays in records.items():
        msg.content[name] = ArrayRecord({k: Array(v) for k, v in arrays.items()})
    return msg


def test_a_model_in_two_unnamed_array_records_is_an_error_naming_them():
    msg = _with_array_records({"a": {"w": np.zeros(DIM)}, "b": {"w": np.zeros(DIM)}})
    reply = make_gradient_coding_mod()(msg, node_context(), _app())
    assert reply.has_error() and reply.error.code == MOD_ERROR_CODE
    assert reply.error.reason.startswith(
        "ValueError: the app's reply has 2 ArrayRecords and none named 'arrays'")


def test_the_model_is_the_array_record_named_arrays_when_there_are_several():
    """theta = 1 in "arrays" (an "extra" record beside it): partition 1's delta is 1 + 1 = 2
    per entry, n = 4, coefficient 1: the reply is 8 per entry, over "arrays"' names only."""
    msg = _with_array_records({"arrays": {"w": np.ones(DIM)}, "extra": {"v": np.zeros(3)}})
    reply = make_gradient_coding_mod()(msg, node_context(), _app())
    assert not reply.has_error(), reply.error.reason
    coded = reply.content[protocol.PROTOCOL_KEY]
    assert list(coded.keys()) == ["w"]
    np.testing.assert_array_equal(coded["w"].numpy(), np.full(DIM, 8.0))


# ------------------------------------------------------------------------------ replay guard
def test_a_node_with_a_dp_state_file_and_no_keys_refuses_an_answered_round(tmp_path):
    """The state file alone guards the node: a second mod (a restarted process) reading the
    same file refuses the (nonce, round) the first one answered."""
    cfg = {"partition-id": 0, "num-partitions": 3, "dp-state-file": str(tmp_path / "s.jsonl")}
    first = make_gradient_coding_mod()(train_message(train_instruction()), node_context(cfg),
                                       _app())
    assert not first.has_error(), first.error.reason
    again = make_gradient_coding_mod()(train_message(train_instruction()), node_context(cfg),
                                       _app())
    assert again.has_error() and again.error.code == MOD_ERROR_CODE
    assert "round=1 with nonce='n' was already answered by this node" in again.error.reason
    assert f"recorded in dp-state-file {cfg['dp-state-file']}" in again.error.reason


def test_the_in_memory_replay_warning_points_at_the_mods_caller(tmp_path):
    """The warning is attributed to the code that called the mod (where the node is set up),
    not to the mod's own lines."""
    cfg = {"partition-id": 0, "num-partitions": 3, "dp-key-file": _key_file(tmp_path)}
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        reply = make_gradient_coding_mod()(train_message(train_instruction(dp="partition")),
                                           node_context(cfg), _app())
    assert not reply.has_error(), reply.error.reason
    replay = [w for w in seen if "'dp-state-file'" in str(w.message)]
    assert len(replay) == 1
    assert Path(replay[0].filename).resolve() == Path(__file__).resolve()


# ------------------------------------------------------------------------------ central DP
def test_central_dp_sends_the_sum_of_clipped_partition_deltas():
    """dp="central": the client clips each partition's delta to C (the server adds the noise):
    deltas (j + 1) * ones(6) of norm (j + 1) sqrt(6), clipped to C = 0.5, n_j = 4."""
    clip = 0.5
    inst = train_instruction(partition_ids=(1, 2), num_partitions=(3, 3),
                             coefficients=(1.0, -0.5), dp="central", clip_norm=clip)
    reply = make_gradient_coding_mod()(train_message(inst), node_context(), _app())
    assert not reply.has_error(), reply.error.reason
    expected = np.zeros(DIM)
    for pid, coef in ((1, 1.0), (2, -0.5)):
        delta = np.full(DIM, pid + 1.0)
        expected += coef * 4 * delta * clip / np.linalg.norm(delta)
    got = reply.content[protocol.PROTOCOL_KEY]["w"].numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------------ latency
def test_wallclock_timing_sleeps_the_instructed_delay_before_replying(monkeypatch):
    slept: list = []
    monkeypatch.setattr(time, "sleep", slept.append)
    inst = train_instruction(timing="wallclock", delay_s=0.25)
    reply = make_gradient_coding_mod()(train_message(inst), node_context(), _app())
    assert not reply.has_error(), reply.error.reason
    assert slept == [0.25]


def test_a_latency_outlasting_the_round_sleeps_until_the_deadline_then_stops(monkeypatch):
    """Created 5 s ago with stop-after-s = 10: the deadline is ~5 s away (a margin for a
    loaded machine), the 100 s latency outlasts it, so the mod sleeps at most the 5 s left
    (not the latency) and replies stopped."""
    slept: list = []
    monkeypatch.setattr(time, "sleep", slept.append)
    msg = train_message(train_instruction(timing="wallclock", delay_s=100.0, stop_after_s=10.0))
    msg.metadata.created_at = time.time() - 5.0
    reply = make_gradient_coding_mod()(msg, node_context(), _app())
    assert reply.has_error() and reply.error.code == MOD_STOPPED_CODE
    assert reply.error.reason == (
        "stopped after 1 of 1 partitions, before replying: the round's deadline "
        "(stop-after-s=10 s) passed during the simulated latency")
    assert len(slept) == 1 and 0.0 <= slept[0] <= 5.0


# ------------------------------------------------------------------------------ comm-efficient
@pytest.mark.parametrize(("wire", "dtype"), [("model", np.float32), ("float64", np.float64)])
def test_a_chunk_travels_in_the_models_float32_under_the_model_wire(wire, dtype):
    """Partition 1 of a zero float32 model: coded = 4 * 2 = 8 per entry, count 4;
    [8]*6 + [4] padded to 2 x 4 = [[8, 8, 8, 8], [8, 8, 4, 0]]; Gamma column (1, 2) gives
    [24, 24, 16, 8]."""
    inst = train_instruction(chunk_coefficients=(1.0, 2.0), wire=wire)
    msg = train_message(inst, {"w": np.zeros(DIM, dtype=np.float32)})
    reply = make_gradient_coding_mod()(msg, node_context(), _app())
    assert not reply.has_error(), reply.error.reason
    chunk = reply.content[protocol.PROTOCOL_KEY][protocol.CHUNK_KEY].numpy()
    assert chunk.dtype == dtype
    np.testing.assert_array_equal(chunk, [24.0, 24.0, 16.0, 8.0])


def test_the_reply_sums_the_coded_count_over_every_partition():
    """Partitions 1 and 2 (deltas 2 and 3 per entry, n = 4 each), coefficients (1, 0.5):
    coded = 1 * 4 * 2 + 0.5 * 4 * 3 = 14 per entry, count 1 * 4 + 0.5 * 4 = 6."""
    inst = train_instruction(partition_ids=(1, 2), num_partitions=(3, 3),
                             coefficients=(1.0, 0.5))
    reply = make_gradient_coding_mod()(train_message(inst), node_context(), _app())
    assert not reply.has_error(), reply.error.reason
    meta = reply.content[protocol.PROTOCOL_KEY + "-meta"]
    assert meta["num-examples"] == 6.0 and meta["partition-sizes"] == [4.0, 4.0]
    np.testing.assert_array_equal(reply.content[protocol.PROTOCOL_KEY]["w"].numpy(),
                                  np.full(DIM, 14.0))


def test_the_reply_charges_the_compute_time_of_every_partition():
    """Cached results (their measured times 1.5 s and 2.25 s): the replica is charged their
    sum, 3.75 s, and the app is not called."""
    cache: dict = {"round": ("n", 1),
                   (1, 3): PartitionResult({"w": np.full(DIM, 2.0)}, 4.0, {}, 1.5),
                   (2, 3): PartitionResult({"w": np.full(DIM, 3.0)}, 4.0, {}, 2.25)}
    calls: list = []
    inst = train_instruction(partition_ids=(1, 2), num_partitions=(3, 3),
                             coefficients=(1.0, 0.5))
    reply = make_gradient_coding_mod(cache=cache)(train_message(inst), node_context(),
                                                  _app(calls))
    assert not reply.has_error(), reply.error.reason
    assert calls == []
    assert reply.content[protocol.PROTOCOL_KEY + "-meta"]["compute-s"] == 3.75
    np.testing.assert_array_equal(reply.content[protocol.PROTOCOL_KEY]["w"].numpy(),
                                  np.full(DIM, 14.0))


# ------------------------------------------------------------------------------ deadline edges
def _clocked(now: float, stop_after_s: float, **kw) -> tuple[Message, Any]:
    """A message created at ``now - 5`` (whole seconds: exact floats) and a mod whose wall
    clock is frozen at ``now``: the round's deadline is ``now - 5 + stop_after_s``."""
    msg = train_message(train_instruction(stop_after_s=stop_after_s, **kw))
    msg.metadata.created_at = now - 5.0
    return msg, make_gradient_coding_mod(wall_clock=lambda: now)


def test_work_reaching_the_deadline_exactly_is_stopped_before_the_first_partition():
    """The deadline is the last instant the server could use the reply: a clock reading it
    exactly (created 5 s ago, stop-after-s = 5) stops before the app is called."""
    calls: list = []
    msg, mod = _clocked(float(int(time.time())), 5.0)
    reply = mod(msg, node_context(), _app(calls))
    assert calls == []
    assert reply.has_error() and reply.error.code == MOD_STOPPED_CODE
    assert reply.error.reason == (
        "stopped after 0 of 1 partitions: the round's deadline (stop-after-s=5 s after the "
        "message was created) has passed")


def test_a_latency_ending_exactly_at_the_deadline_is_slept_and_the_reply_sent(monkeypatch):
    """now + delay = deadline (now = created + 5, stop-after-s = 10, delay 5 s): the reply
    arrives at the deadline, not after it, so the mod sleeps the whole 5 s and replies."""
    slept: list = []
    monkeypatch.setattr(time, "sleep", slept.append)
    msg, mod = _clocked(float(int(time.time())), 10.0, timing="wallclock", delay_s=5.0)
    reply = mod(msg, node_context(), _app())
    assert not reply.has_error(), reply.error.reason
    assert slept == [5.0]


def test_wallclock_timing_with_no_delay_does_not_sleep(monkeypatch):
    slept: list = []
    monkeypatch.setattr(time, "sleep", slept.append)
    inst = train_instruction(timing="wallclock", delay_s=0.0)
    reply = make_gradient_coding_mod()(train_message(inst), node_context(), _app())
    assert not reply.has_error(), reply.error.reason
    assert slept == []


# ------------------------------------------------------------------------------ wire dtype
def test_the_float64_wire_sends_a_float32_models_update_in_float64():
    """A float32 model (zeros) and wire='float64': partition 1's update 4 * 2 = 8 per entry
    arrives as float64 (only wire='model' sends the model's dtype)."""
    msg = train_message(train_instruction(wire="float64"),
                        {"w": np.zeros(DIM, dtype=np.float32)})
    reply = make_gradient_coding_mod()(msg, node_context(), _app())
    assert not reply.has_error(), reply.error.reason
    got = reply.content[protocol.PROTOCOL_KEY]["w"].numpy()
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, np.full(DIM, 8.0))


# ------------------------------------------------------------------------------ released deltas
def test_central_dp_splits_a_multi_array_delta_back_into_every_array():
    """Three arrays of sizes 2, 3, 4 (theta = 0); partition 1's k-th array moves by 2 k, with
    clip norm 100 (no clipping: |delta| = sqrt(2 * 4 + 3 * 16 + 4 * 36) = sqrt(200)): the
    updates are 4 * 2 k = 8, 16, 24, each array's own values from the flattened delta."""
    shapes = {"a": (2,), "b": (3,), "c": (2, 2)}
    arrays = {k: np.zeros(v) for k, v in shapes.items()}

    def app(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        new = {k: Array(msg.content["arrays"][k].numpy() + (pid + 1.0) * (i + 1))
               for i, k in enumerate(shapes)}
        return Message(RecordDict({"arrays": ArrayRecord(new),
                                   "metrics": MetricRecord({"num-examples": 4})}), reply_to=msg)

    inst = train_instruction(dp="central", clip_norm=100.0)
    reply = make_gradient_coding_mod()(train_message(inst, arrays), node_context(), app)
    assert not reply.has_error(), reply.error.reason
    coded = reply.content[protocol.PROTOCOL_KEY]
    for name, shape, value in zip(shapes, shapes.values(), (8.0, 16.0, 24.0), strict=True):
        np.testing.assert_array_equal(coded[name].numpy(), np.full(shape, value))


# ------------------------------------------------------------------------------ the app's context
def test_the_app_sees_the_nodes_id_in_its_context():
    seen: list = []
    inner = _app()

    def app(msg: Message, context: Context) -> Message:
        seen.append((context.node_id, context.run_id, dict(context.run_config)))
        return inner(msg, context)

    ctx = Context(run_id=1, node_id=7, node_config={"partition-id": 0, "num-partitions": 3},
                  state=RecordDict(), run_config={"lr": 0.5})
    reply = make_gradient_coding_mod()(train_message(train_instruction()), ctx, app)
    assert not reply.has_error(), reply.error.reason
    assert seen == [(7, 1, {"lr": 0.5})]


def test_the_node_policy_checks_the_apps_noise_multiplier_in_the_run_config():
    """dp-min-noise-multiplier = 1 and dp='sample' at sigma 1: the app's own DP-SGD sigma in
    the run config (0.5) is below the node's floor, so the round is refused naming it."""
    inst = train_instruction(dp="sample", noise_multiplier=1.0)
    ctx = Context(run_id=1, node_id=7,
                  node_config={"partition-id": 0, "num-partitions": 3,
                               "dp-min-noise-multiplier": 1.0},
                  state=RecordDict(), run_config={"noise-multiplier": 0.5})
    calls: list = []
    reply = make_gradient_coding_mod()(train_message(inst), ctx, _app(calls))
    assert calls == []
    assert reply.has_error() and reply.error.code == MOD_ERROR_CODE
    assert reply.error.reason.split(TRACEBACK_MARKER)[0] == (
        "PolicyError: run config noise-multiplier=0.5 (the app's DP-SGD noise) refused: this "
        "node's policy is dp-min-noise-multiplier=1")


def test_the_mods_warnings_name_the_line_that_called_the_mod():
    """Wherever in the mod a warning is given (the seed of a partition's run, the app's
    writes to ``context.state`` after it), it names the line that called the mod: the code a
    user reads, not the mod's internals."""
    mod = make_gradient_coding_mod()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1
        reply = mod(train_message(train_instruction()), node_context(), _state_writer(False))
    assert not reply.has_error(), reply.error.reason
    ours = [w for w in seen if str(w.message).startswith("gradient_coding_mod:")]
    kinds = sorted("state" if "context.state" in str(w.message) else "seed" for w in ours)
    assert kinds == ["seed", "state"]
    assert {(Path(w.filename).resolve(), w.lineno) for w in ours} == {
        (Path(__file__).resolve(), line)}
