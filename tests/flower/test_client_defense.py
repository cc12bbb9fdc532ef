"""The client defends its own privacy and its own resources against what the server sends.

Through the public mod API: a coded train message built with ``protocol.instruction_message``
and a small numpy app (``theta_j = theta - 0.5 (theta - target_j)``, ``n_j = 10 + 3 j``, metric
``loss = j + 0.25``), and one end-to-end run on ``InProcessGrid``. Expected values are computed
here in numpy from the app's formula, never by the mod.

* every instruction field validated: a bad one gets an error reply (``MOD_ERROR_CODE``) that
  names it, and the app is never called;
* node-config policy ``dp-required`` / ``dp-min-noise-multiplier`` over what the server asks;
* an answered ``(nonce, round)`` is refused (in memory, and across restarts with
  ``dp-state-file``);
* ``dp='sample'`` / ``'partition'`` refuse a partition the key file has no key for;
* metrics withheld under ``dp='partition'`` and ``'central'``;
* a warning once when the app writes ``context.state``.
"""

from __future__ import annotations

import json
import math
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
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg

from fl_gradcode.flower import GradientCoding, protocol
from fl_gradcode.flower.mod import MOD_ERROR_CODE, make_gradient_coding_mod
from fl_gradcode.flower.protocol import Instruction
from fl_gradcode.flower.testing import InProcessGrid
from fl_gradcode.privacy import DPConfig, write_key_file

DIM = 6
MASTER = bytes(range(32))

pytestmark = pytest.mark.filterwarnings("ignore:gradient_coding_mod:UserWarning")


def _target(pid: int) -> np.ndarray:
    return np.random.default_rng([5, pid]).standard_normal(DIM) * 3.0


class App:
    """The numpy app; records the partitions it was called for."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def __call__(self, msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        self.calls.append(pid)
        theta = msg.content["arrays"]["w"].numpy()
        lr = float(msg.content["config"].get("lr", 0.5))
        new = theta - lr * (theta - _target(pid))
        return Message(
            RecordDict({"arrays": ArrayRecord({"w": Array(new)}),
                        "metrics": MetricRecord({"num-examples": 10 + 3 * pid,
                                                 "loss": pid + 0.25})}),
            reply_to=msg,
        )


def _train_instruction(**kw) -> Instruction:
    base = dict(op=protocol.OP_TRAIN, round=1, worker=0, seed=3, nonce="n",
                partition_ids=(1,), num_partitions=(3,), coefficients=(1.0,))
    return Instruction(**{**base, **kw})


def _message(instruction: Instruction, lr: float = 0.5) -> Message:
    content = RecordDict({"arrays": ArrayRecord({"w": Array(np.zeros(DIM))}),
                          "config": ConfigRecord({"lr": lr})})
    return protocol.instruction_message(content, instruction, 7, "1")


def _context(node_id: int = 7, run_config: dict | None = None, **node_config) -> Context:
    cfg = {"partition-id": 0, "num-partitions": 3, **node_config}
    return Context(run_id=1, node_id=node_id, node_config=cfg, state=RecordDict(),
                   run_config=dict(run_config or {}))


def _other_node(index: int, **node_config) -> Context:
    """Another node of the federation: its own node_id and partition-id (as Flower's
    simulation gives each node), in this process."""
    return _context(100 + index, **{**node_config, "partition-id": index})


def _refusal(reply: Message) -> str:
    assert reply.has_error(), "expected an error reply"
    assert reply.error.code == MOD_ERROR_CODE
    return reply.error.reason


def _coded(reply: Message) -> np.ndarray:
    assert not reply.has_error(), reply.error.reason if reply.has_error() else ""
    return reply.content[protocol.PROTOCOL_KEY]["w"].numpy()


def _meta(reply: Message) -> MetricRecord:
    return reply.content[protocol.PROTOCOL_KEY + "-meta"]


# ------------------------------------------------------------------ every field validated
BAD_FIELDS = [
    # (field, value written into the record, words the reason must hold)
    # a negative id acted as an extra weight
    ("partition-ids", ([-1, 1], [3, 3], [1.0, 1.0]), "partition-ids holds -1"),
    ("partition-ids", [5], "partition-ids holds 5"),
    ("partition-ids", ([1, 1], [3, 3], [1.0, 1.0]), "partition-ids repeats [1]"),
    ("coefficients", [1.0, 2.0], "must have the same length"),  # was truncated
    ("num-partitions", [0], "num-partitions holds 0"),
    ("num-partitions", [100_001], "num-partitions holds 100001"),
    ("coefficients", [math.nan], "coefficients holds nan"),
    ("coefficients", [math.inf], "coefficients holds inf"),
    ("delay-s", 1e9, "delay-s=1000000000.0"),
    ("delay-s", -1.0, "delay-s=-1.0"),
    ("delay-s", math.nan, "delay-s=nan"),
    ("stop-after-s", -2.0, "stop-after-s=-2.0"),
    ("stop-after-s", math.inf, "stop-after-s=inf"),
    ("wire", "float16", "wire='float16'"),
    ("timing", "realtime", "timing='realtime'"),
    ("dp", "local", "dp='local'"),
    ("dp-noise", "shared", "dp-noise='shared'"),
    ("clip-norm", math.inf, "clip-norm=inf"),
    ("clip-norm", 0.0, "clip-norm=0.0"),
    ("noise-multiplier", -1.0, "noise-multiplier=-1.0"),
    ("noise-multiplier", math.nan, "noise-multiplier=nan"),
    ("round", 0, "round=0"),
    ("round", "3", "round='3'"),  # a string was converted with int()
    ("worker", -1, "worker=-1"),
    ("worker", 1.5, "worker=1.5"),
    ("weight-key", "", "weight-key=''"),
    ("nonce", "x" * 1000, "nonce="),
]


@pytest.mark.parametrize(("field", "value", "words"), BAD_FIELDS,
                         ids=[f"{f}={str(v)[:12]}" for f, v, _ in BAD_FIELDS])
def test_a_bad_instruction_field_gets_an_error_reply_naming_it_and_nothing_runs(
    field, value, words
):
    msg = _message(_train_instruction(timing="virtual"))
    rec = msg.content.config_records[protocol.PROTOCOL_KEY]
    if isinstance(value, tuple):  # the three per-partition lists together
        rec["partition-ids"], rec["num-partitions"], rec["coefficients"] = value
    else:
        rec[field] = value
    app = App()
    reason = _refusal(make_gradient_coding_mod()(msg, _context(), app))
    assert words in reason, reason
    assert field in reason
    assert app.calls == []


def test_more_partitions_than_the_per_instruction_bound_are_refused():
    k = protocol.MAX_ASSIGNED_PARTITIONS + 1
    inst = _train_instruction(partition_ids=tuple(range(k)), num_partitions=(k,) * k,
                              coefficients=(1.0,) * k)
    app = App()
    reason = _refusal(make_gradient_coding_mod()(_message(inst), _context(), app))
    assert f"partition-ids has {k} entries; at most 1024" in reason
    assert app.calls == []


def test_an_instruction_without_partitions_is_legal_and_sends_a_zero_combination():
    """The wire form of "no partitions" ([-1], [-1], [0.0]) still works: zero arrays, zero
    examples, size placeholder, and the app is not called."""
    app = App()
    reply = make_gradient_coding_mod()(
        _message(_train_instruction(partition_ids=(), num_partitions=(), coefficients=())),
        _context(), app)
    np.testing.assert_array_equal(_coded(reply), np.zeros(DIM))
    assert _meta(reply)["num-examples"] == 0.0
    assert app.calls == []


def test_the_no_partition_placeholder_with_real_counts_is_refused():
    msg = _message(_train_instruction())
    rec = msg.content.config_records[protocol.PROTOCOL_KEY]
    rec["partition-ids"], rec["num-partitions"], rec["coefficients"] = [-1], [3], [1.0]
    reason = _refusal(make_gradient_coding_mod()(msg, _context(), App()))
    assert "partition-ids=[-1] (no partitions) needs num-partitions=[-1]" in reason


def test_valid_fields_at_their_bounds_are_accepted():
    inst = _train_instruction(partition_ids=(0, 2), num_partitions=(3, 3),
                              coefficients=(1.0, -0.5), delay_s=protocol.MAX_DELAY_S,
                              timing="virtual", stop_after_s=0.0)
    reply = make_gradient_coding_mod()(_message(inst), _context(), App())
    expected = sum(c * (10 + 3 * j) * 0.5 * _target(j) for j, c in ((0, 1.0), (2, -0.5)))
    np.testing.assert_allclose(_coded(reply), expected, rtol=1e-12)


# ------------------------------------------------------------------ the node's DP policy
@pytest.mark.parametrize(("required", "asked"), [
    ("partition", "none"), ("partition", "central"), ("partition", "sample"),
    ("central", "none"), ("central", "sample"), ("sample", "partition"),
])
def test_dp_required_refuses_a_weaker_or_other_mode_naming_field_and_policy(
    required, asked, key_file
):
    app = App()
    reply = make_gradient_coding_mod()(
        _message(_train_instruction(dp=asked, noise_multiplier=1.0)),
        _context(**{"dp-required": required, "dp-key-file": key_file}), app)
    reason = _refusal(reply)
    assert f"dp={asked!r} refused" in reason
    assert f"dp-required={required!r}" in reason
    assert app.calls == []


@pytest.mark.parametrize(("required", "asked"), [
    ("partition", "partition"), ("central", "central"), ("central", "partition"),
])
def test_dp_required_accepts_the_mode_or_a_stronger_one(required, asked, key_file):
    """Accepted: the node trains its partitions and replies (refused, it would not call its
    app: the test below)."""
    app = App()
    reply = make_gradient_coding_mod()(
        _message(_train_instruction(dp=asked, noise_multiplier=1.0)),
        _context(**{"dp-required": required, "dp-key-file": key_file}), app)
    assert not reply.has_error(), reply.error.reason
    assert app.calls and reply.content.array_records


def test_dp_min_noise_multiplier_refuses_a_smaller_sigma_and_dp_none(key_file):
    cfg = {"dp-min-noise-multiplier": 0.8, "dp-key-file": key_file}
    mod, app = make_gradient_coding_mod(), App()
    low = mod(_message(_train_instruction(dp="partition", noise_multiplier=0.0)),
              _context(**cfg), app)
    reason = _refusal(low)
    assert "noise-multiplier=0 refused" in reason and "dp-min-noise-multiplier=0.8" in reason
    none = mod(_message(_train_instruction(dp="none", round=2)), _context(**cfg), app)
    assert "dp='none' refused" in _refusal(none)
    assert app.calls == []
    ok = mod(_message(_train_instruction(dp="partition", noise_multiplier=0.8, round=3)),
             _context(**cfg), app)
    assert not ok.has_error(), ok.error.reason
    assert app.calls == [1]
    # central: the server would add the noise; a floor alone is on the node's own noise
    central = mod(_message(_train_instruction(dp="central", noise_multiplier=0.8, round=4)),
                  _context(**cfg), app)
    assert "dp='central' refused" in _refusal(central)
    assert app.calls == [1]


def test_dp_sample_checks_the_run_config_sigma_the_app_reads_too(key_file):
    cfg = {"dp-min-noise-multiplier": 1.0, "dp-key-file": key_file}
    app = App()
    reply = make_gradient_coding_mod()(
        _message(_train_instruction(dp="sample", noise_multiplier=1.0)),
        _context(run_config={"noise-multiplier": 0.1}, **cfg), app)
    reason = _refusal(reply)
    assert "run config noise-multiplier=0.1" in reason and "dp-min-noise-multiplier=1" in reason
    assert app.calls == []


@pytest.mark.parametrize(("key", "value", "words"), [
    ("dp-required", "strong", "node config dp-required='strong'"),
    ("dp-min-noise-multiplier", -1.0, "node config dp-min-noise-multiplier=-1.0"),
    ("dp-min-noise-multiplier", "lots", "node config dp-min-noise-multiplier='lots'"),
])
def test_a_bad_node_policy_is_an_error_naming_the_node_config_key(key, value, words):
    app = App()
    reason = _refusal(make_gradient_coding_mod()(
        _message(_train_instruction()), _context(**{key: value}), app))
    assert words in reason
    assert app.calls == []


# ------------------------------------------------------------------ replays
def _replay_attack(mod, cfg, node_id=7):
    """The same (nonce, round) twice, the second with another sigma: differencing the two
    releases would cancel the identical keyed noise."""
    app = App()
    first = mod(_message(_train_instruction(dp="partition", noise_multiplier=1.0)),
                _context(node_id, **cfg), app)
    second = mod(_message(_train_instruction(dp="partition", noise_multiplier=0.5)),
                 _context(node_id, **cfg), app)
    return app, first, second


def test_a_replayed_nonce_and_round_with_another_sigma_is_refused(key_file):
    app, first, second = _replay_attack(make_gradient_coding_mod(), {"dp-key-file": key_file})
    assert not first.has_error(), first.error.reason
    reason = _refusal(second)
    assert "round=1 with nonce='n' was already answered by this node" in reason
    assert app.calls == [1]  # computed once


def test_a_replay_after_a_restart_is_refused_with_a_state_file(tmp_path, key_file):
    state = tmp_path / "node" / "state.jsonl"
    cfg = {"dp-key-file": key_file, "dp-state-file": str(state)}
    app = App()
    first = make_gradient_coding_mod()(
        _message(_train_instruction(dp="partition", noise_multiplier=1.0)), _context(**cfg), app)
    assert not first.has_error()
    restarted = make_gradient_coding_mod()  # a fresh process: nothing in memory
    again = restarted(_message(_train_instruction(dp="partition", noise_multiplier=0.1), lr=1e-9),
                      _context(node_id=99, **cfg), app)  # even under another node id
    reason = _refusal(again)
    assert "already answered" in reason and str(state) in reason
    assert app.calls == [1]
    lines = [json.loads(x) for x in state.read_text().splitlines()]
    # one line per answered round (its release ledger entry: partitions, dp, sigma, epsilon)
    assert [{k: e[k] for k in ("node", "nonce", "round")} for e in lines] == [
        {"node": "partition=0/3", "nonce": "n", "round": 1}]
    assert lines[0]["partitions"] == [1] and lines[0]["dp"] == "partition"
    # the next round and another nonce are answered
    for inst in (_train_instruction(round=2), _train_instruction(nonce="m")):
        assert not restarted(_message(inst), _context(**cfg), app).has_error()


def test_a_torn_last_line_in_the_state_file_does_not_hide_later_entries(tmp_path, key_file):
    state = tmp_path / "state.jsonl"
    state.write_text('{"node": "partition=0/3", "nonce"')  # a crash mid-write
    cfg = {"dp-key-file": key_file, "dp-state-file": str(state)}
    assert not make_gradient_coding_mod()(_message(_train_instruction()), _context(**cfg),
                                          App()).has_error()
    assert _refusal(make_gradient_coding_mod()(_message(_train_instruction()), _context(**cfg),
                                               App()))


def test_identical_retries_are_refused_and_failed_rounds_can_be_asked_again(key_file):
    mod = make_gradient_coding_mod()
    cfg = {"dp-key-file": key_file}

    def failing(msg, context):
        raise RuntimeError("disk full")

    failed = mod(_message(_train_instruction()), _context(**cfg), failing)
    assert "disk full" in _refusal(failed)
    app = App()
    assert not mod(_message(_train_instruction()), _context(**cfg), app).has_error()
    assert "already answered" in _refusal(mod(_message(_train_instruction()), _context(**cfg),
                                              app))
    assert app.calls == [1]


def test_replicas_on_other_nodes_answer_the_same_round(key_file):
    """Replicas of a partition run on different nodes (one process in simulation, shared
    cache): each node answers its own instruction once."""
    mod = make_gradient_coding_mod(cache={})
    cfg = {"dp-key-file": key_file}
    replies = [mod(_message(_train_instruction(worker=w, dp="partition", noise_multiplier=1.0)),
                   _other_node(w, **cfg), App()) for w in range(3)]
    coded = [_coded(r) for r in replies]
    assert all(np.array_equal(coded[0], c) for c in coded)


def test_without_keys_or_state_file_a_repeat_is_computed_as_before():
    """Without keys every seed is public: a repeat reveals nothing the server cannot compute,
    so it is answered (and gives the identical reply)."""
    mod = make_gradient_coding_mod()
    a = mod(_message(_train_instruction()), _context(), App())
    b = mod(_message(_train_instruction()), _context(), App())
    np.testing.assert_array_equal(_coded(a), _coded(b))


# ------------------------------------------------------------------ keys per partition
@pytest.mark.parametrize("dp", ["sample", "partition"])
def test_a_keyed_mode_refuses_a_partition_the_key_file_lacks(tmp_path, dp):
    keys = write_key_file(tmp_path / "k.json", partitions=[0])
    app = App()
    reply = make_gradient_coding_mod()(
        _message(_train_instruction(dp=dp, noise_multiplier=1.0, partition_ids=(0, 1),
                                    num_partitions=(3, 3), coefficients=(1.0, 1.0))),
        _context(**{"dp-key-file": str(keys)}), app)
    reason = _refusal(reply)
    assert f"dp={dp!r}: partition-ids holds 1 but this node's key file has no key" in reason
    assert app.calls == []  # never seeded from public values


def test_dp_none_with_a_partial_key_file_still_computes(tmp_path):
    keys = write_key_file(tmp_path / "k.json", partitions=[0])
    reply = make_gradient_coding_mod()(_message(_train_instruction()),
                                       _context(**{"dp-key-file": str(keys)}), App())
    np.testing.assert_allclose(_coded(reply), 13 * 0.5 * _target(1), rtol=1e-12)


# ------------------------------------------------------------------ metrics under DP
@pytest.mark.parametrize("dp", ["partition", "central"])
def test_metrics_are_withheld_under_partition_and_central_dp(dp, key_file):
    inst = _train_instruction(dp=dp, noise_multiplier=0.0, clip_norm=1e6,
                              partition_ids=(1, 2), num_partitions=(3, 3),
                              coefficients=(1.0, -0.5))
    reply = make_gradient_coding_mod()(_message(inst), _context(**{"dp-key-file": key_file}),
                                       App())
    meta = _meta(reply)
    assert not [k for k in meta.keys() if k.startswith(protocol.METRIC_PREFIX)]
    # what decoding needs is still sent: sum_j B n_j and the sizes n_j
    assert meta["num-examples"] == pytest.approx(13 - 0.5 * 16)
    assert meta["partition-sizes"] == [13.0, 16.0]
    expected = 13 * 0.5 * _target(1) - 0.5 * 16 * 0.5 * _target(2)  # clip does not bind
    np.testing.assert_allclose(_coded(reply), expected, rtol=1e-12)


def test_metrics_are_sent_without_dp():
    reply = make_gradient_coding_mod()(_message(_train_instruction()), _context(), App())
    assert _meta(reply)[protocol.METRIC_PREFIX + "loss"] == pytest.approx(13 * 1.25)


def test_a_partition_dp_run_decodes_exactly_without_client_metrics(key_file):
    app = ClientApp(mods=[make_gradient_coding_mod(cache={})])
    app.train()(App())
    grid = InProcessGrid(app, 4, node_config=lambda i: {"dp-key-file": key_file})
    strategy = GradientCoding(FedAvg(fraction_evaluate=0.0, min_available_nodes=4), code="frc",
                              s=1, seed=0, dp=DPConfig(mode="partition", clip_norm=1e6,
                                                       noise_multiplier=0.0))
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord({"w": Array(np.zeros(DIM))}),
                            num_rounds=1, train_config=ConfigRecord({"lr": 0.5}))
    assert strategy.history[0]["decode"] == "exact"
    sizes = np.array([10 + 3 * j for j in range(4)], dtype=float)
    expected = sum(n * 0.5 * _target(j) for j, n in enumerate(sizes)) / sizes.sum()
    np.testing.assert_allclose(result.arrays["w"].numpy(), expected, rtol=1e-10)
    (metrics,) = result.train_metrics_clientapp.values()
    assert "loss" not in metrics


# ------------------------------------------------------------------ context.state
def test_an_app_writing_context_state_gets_one_warning():

    def stateful(msg, context):
        context.state["seen"] = ConfigRecord({"rounds": 1})
        return App()(msg, context)

    mod = make_gradient_coding_mod()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for r in (1, 2):
            assert not mod(_message(_train_instruction(round=r)), _context(), stateful).has_error()
    about_state = [w for w in seen if "context.state" in str(w.message)]
    assert len(about_state) == 1
    text = str(about_state[0].message)
    assert "discarded" in text and "replica" in text and "Keep state" in text


def test_an_app_that_leaves_context_state_alone_gets_no_warning():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        make_gradient_coding_mod()(_message(_train_instruction()), _context(), App())
    assert not [w for w in seen if "context.state" in str(w.message)]


def test_messages_other_than_train_are_untouched_by_validation():
    evaluate = Message(RecordDict(), dst_node_id=7, message_type=MessageType.EVALUATE)
    seen = []
    make_gradient_coding_mod()(evaluate, _context(), lambda m, c: seen.append(m) or
                               Message(RecordDict(), reply_to=m))
    assert seen == [evaluate]


# ------------------------------------------------------------------ replicas on other nodes
def _clipped_update(pid: int, lr: float, clip: float) -> np.ndarray:
    """n_j clip(delta_j) for theta = 0: delta_j = lr * target_j (numpy, from the app's rule)."""
    delta = lr * _target(pid)
    return (10 + 3 * pid) * delta * min(1.0, clip / np.linalg.norm(delta))


@pytest.mark.parametrize("what", ["sigma", "lr"])
def test_replicas_asked_with_another_sigma_or_lr_do_not_share_noise(key_file, what):
    """The server sends partition 1's replicas on two nodes one round with different sigma (or
    lr ~ 0): with identical keyed noise, (s2 r1 - s1 r2) / (s2 - s1) (or r1 - r2) would be the
    raw clipped update. The mod binds the noise to the DP parameters and config, so the
    estimate is off by about the noise."""
    clip = 0.5
    mod = make_gradient_coding_mod()
    cfg = {"dp-key-file": key_file}
    if what == "sigma":
        sig = (1.0, 0.5)
        r1, r2 = (_coded(mod(_message(_train_instruction(worker=w, dp="partition", clip_norm=clip,
                                                         noise_multiplier=sig[w])),
                             _other_node(w, **cfg), App()))
                  for w in (0, 1))
        estimate = (sig[1] * r1 - sig[0] * r2) / (sig[1] - sig[0])
    else:
        r1, r2 = (_coded(mod(_message(_train_instruction(worker=w, dp="partition", clip_norm=clip,
                                                         noise_multiplier=1.0), lr=lr),
                             _other_node(w, **cfg), App()))
                  for w, lr in ((0, 0.5), (1, 1e-12)))
        estimate = r1 - r2
    truth = _clipped_update(1, 0.5, clip)
    noise_scale = 13 * 1.0 * clip  # n_j sigma C per coordinate
    assert np.linalg.norm(estimate - truth) > 0.3 * noise_scale * np.sqrt(DIM)


def test_honest_replicas_on_other_nodes_draw_identical_noise(key_file):
    """Same instruction content on two nodes (other workers): identical releases, and the
    release minus the clipped update has the stated std sigma C n_j (noise present)."""
    mod = make_gradient_coding_mod()
    cfg = {"dp-key-file": key_file}
    releases = [_coded(mod(_message(_train_instruction(worker=w, dp="partition", clip_norm=0.5,
                                                       noise_multiplier=1.0)),
                           _other_node(w, **cfg), App())) for w in (0, 1)]
    np.testing.assert_array_equal(releases[0], releases[1])
    assert np.linalg.norm(releases[0] - _clipped_update(1, 0.5, 0.5)) > 0.1


def test_a_server_that_pins_the_nonce_to_rerun_a_round_gets_refusals_not_updates(tmp_path,
                                                                                   key_file):
    """Through the server API: a second run on the same nodes with the same pinned nonce and
    another sigma (the differencing attack across runs). With a dp-state-file every node
    refuses round 1 again, even after a restart (fresh mods); the round is skipped, and each
    rejection names the replay."""

    def grid():
        app = ClientApp(mods=[make_gradient_coding_mod()])  # a fresh process each time
        app.train()(App())
        return InProcessGrid(app, 4, node_config=lambda i: {
            "dp-key-file": key_file, "dp-state-file": str(tmp_path / f"node{i}.jsonl")})

    def run(sigma):
        strategy = GradientCoding(FedAvg(fraction_evaluate=0.0, min_available_nodes=4),
                                  code="frc", s=1, seed=0, dp_run_nonce="pinned",
                                  dp=DPConfig(mode="partition", clip_norm=0.5,
                                              noise_multiplier=sigma))
        strategy.start(grid=grid(), initial_arrays=ArrayRecord({"w": Array(np.zeros(DIM))}),
                       num_rounds=1, train_config=ConfigRecord({"lr": 0.5}))
        return strategy.history[0]

    first = run(1.0)
    assert first["decode"] == "exact" and first["rejected"] == 0
    second = run(0.5)
    assert second["decode"] == "skipped"
    assert second["rejected"] == 4
    assert all("already answered by this node" in r for r in second["rejected_reasons"])


def test_the_mod_can_be_shipped_to_simulation_actors():
    """Flower's simulation engine pickles the ClientApp (mods included) for its Ray actors:
    the mod's replay memory must survive pickling (a copy per actor) and keep working."""
    import pickle

    from flwr.clientapp import ClientApp

    from fl_gradcode.flower.client_policy import PolicyError, ReplayGuard
    from fl_gradcode.flower.mod import make_gradient_coding_mod

    guard = ReplayGuard()
    guard.claim(7, {"dp-state-file": ""}, "n", 1)
    copy = pickle.loads(pickle.dumps(guard))
    with pytest.raises(PolicyError):
        copy.claim(7, {}, "n", 1)
    copy.claim(7, {}, "n", 2)  # its own lock works
    try:
        from ray import cloudpickle
    except ImportError:  # pragma: no cover - flwr[simulation] brings ray
        pytest.skip("ray is not installed")
    app = ClientApp(mods=[make_gradient_coding_mod()])
    cloudpickle.loads(cloudpickle.dumps(app))
