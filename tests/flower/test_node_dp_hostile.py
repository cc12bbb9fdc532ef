"""A hostile server against a node with a DP policy, beyond the policy's own fields: what it
names as the weight, who adds the noise under a floor, plain messages past the budget, and
replicas given other partitions or another run config under one ``(nonce, round)``.

Through the public mod API, with the numpy app of ``test_node_dp_policy`` (expected values
from its formulas in numpy, never from the mod)."""

from __future__ import annotations

import dataclasses
import random
import re

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from fl_gradcode.flower import protocol
from fl_gradcode.flower.mod import (
    MOD_ERROR_CODE,
    bound_nonce,
    make_gradient_coding_mod,
    seed_everything,
)
from tests.flower.test_node_dp_policy import (
    DIM,
    LR,
    NoisyApp,
    _clip,
    _coded,
    _context,
    _inst,
    _message,
    _n,
    _plain_train,
    _raw,
    _target,
)

pytestmark = pytest.mark.filterwarnings("ignore:gradient_coding_mod:UserWarning")


class NormReportingApp(NoisyApp):
    """The numpy app, also reporting its raw update's norm (as the project's app does)."""

    def __call__(self, msg: Message, context: Context) -> Message:
        reply = super().__call__(msg, context)
        pid = int(context.node_config["partition-id"])
        norm = float(np.linalg.norm(LR * (_target(pid) - msg.content["arrays"]["w"].numpy())))
        metrics = MetricRecord({"num-examples": _n(pid), "update-norm": norm})
        return Message(RecordDict({"arrays": reply.content["arrays"], "metrics": metrics}),
                       reply_to=msg)


def _refused(reply: Message) -> str:
    assert reply.has_error() and reply.error.code == MOD_ERROR_CODE, "answered"
    return reply.error.reason


def test_a_server_naming_another_metric_as_the_weight_is_refused(key_file):
    """The weight travels un-noised (partition-sizes, num-examples): a server naming the
    app's update norm as the weight read it in clear under dp='partition'."""
    instruction = dataclasses.replace(_inst(dp="partition", noise_multiplier=5.0),
                                      weight_key="update-norm")
    node = {"dp-key-file": key_file, "dp-required": "partition"}
    app = NormReportingApp()
    reason = _refused(make_gradient_coding_mod()(_message(instruction), _context(**node), app))
    assert "weight-key='update-norm'" in reason and "num-examples" in reason
    assert app.seen == []
    # the node's own weight key (its app's count) is accepted
    node["dp-weight-key"] = "update-norm"
    reply = make_gradient_coding_mod()(_message(instruction), _context(**node), app)
    assert not reply.has_error(), reply.error.reason


def test_a_noise_floor_alone_refuses_central_dp_whose_noise_the_server_adds(key_file):
    """dp='central': the node releases its clipped update and the server adds the noise. A
    floor on the noise is then a promise of the server's; the node released the exact
    n * update (clip-norm 100)."""
    instruction = _inst(dp="central", noise_multiplier=2.0, clip_norm=100.0)
    node = {"dp-key-file": key_file, "dp-min-noise-multiplier": 2.0}
    reason = _refused(make_gradient_coding_mod()(_message(instruction), _context(**node),
                                                 NoisyApp()))
    assert "dp='central'" in reason and "dp-required='central'" in reason
    # consent given: dp-required='central' accepts it
    node["dp-required"] = "central"
    reply = make_gradient_coding_mod()(_message(instruction), _context(**node), NoisyApp())
    np.testing.assert_allclose(_coded(reply), _clip(_raw(1), 100.0 * _n(1)), rtol=1e-9)


def test_plain_messages_cannot_pass_a_release_budget(tmp_path, key_file):
    """A plain train message is not coded, so it is never counted: 200 plain dp='sample'
    messages were answered by a node with dp-max-releases=1 (its DP-SGD noise averaged down
    by sqrt(200)). A budgeted node refuses them."""
    node = {"dp-key-file": key_file, "dp-required": "sample", "dp-min-noise-multiplier": 1.0,
            "dp-max-releases": 1, "dp-state-file": str(tmp_path / "state.jsonl")}
    app = NoisyApp()
    reason = _refused(make_gradient_coding_mod()(_plain_train("sample"), _context(**node), app))
    assert "dp-max-releases=1" in reason and "plain train message" in reason
    assert app.seen == []




class PartitionedApp(NoisyApp):
    """The numpy app whose partition ``j`` of ``N`` holds other data for another ``N`` and
    another run-config ``seed`` (as a partitioner's does)."""

    def __call__(self, msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        num = int(context.node_config["num-partitions"])
        seed = int(context.run_config.get("seed", 0))
        theta = msg.content["arrays"]["w"].numpy()
        target = np.random.default_rng([11, pid, num, seed]).standard_normal(DIM) * 3.0
        new = theta + LR * (target - theta)
        return Message(RecordDict({"arrays": ArrayRecord({"w": Array(new)}),
                                   "metrics": MetricRecord({"num-examples": _n(pid)})}),
                       reply_to=msg)


@pytest.mark.parametrize("change", ["num-partitions", "run-config"])
def test_replicas_given_another_partitioning_draw_independent_noise(key_file, change):
    """Two nodes with one key, one (nonce, round), one model, partition 1 -- but of 3 and of
    4 partitions, or under another run-config seed: other data. With the same keyed noise
    the difference of the releases was the data's difference, noise-free."""
    def release(node_id: int, num: int, seed: int) -> np.ndarray:
        instruction = _inst(dp="partition", noise_multiplier=5.0, clip_norm=1e9,
                            num_partitions=(num,))
        node = {"dp-key-file": key_file, "dp-required": "partition"}
        reply = make_gradient_coding_mod()(
            _message(instruction), _context(node_id, {"seed": seed}, **node), PartitionedApp())
        return _coded(reply) / _n(1)

    other = (4, 0) if change == "num-partitions" else (3, 1)
    a, b = release(101, 3, 0), release(102, *other)
    theta = np.zeros(DIM)
    data_a = LR * (np.random.default_rng([11, 1, 3, 0]).standard_normal(DIM) * 3.0 - theta)
    data_b = LR * (np.random.default_rng([11, 1, *other]).standard_normal(DIM) * 3.0 - theta)
    noise_a, noise_b = a - data_a, b - data_b
    assert np.std(noise_a) == pytest.approx(5.0 * 1e9, rel=0.15)  # noised
    assert abs(np.corrcoef(noise_a, noise_b)[0, 1]) < 0.2  # independent: no cancelling
    # the same partitioning still draws identical noise (exact decoding needs it)
    np.testing.assert_array_equal(release(103, 3, 0), a)


def test_a_budgeted_node_keeps_one_cut_of_its_data(tmp_path, key_file):
    """dp-max-releases counts releases per partition id; the server decides what an id holds
    (num-partitions): partition 0 of 1 and partition 1 of 3 share records. Once a budgeted
    node has released under one cut, another is refused (the ledger records the cut)."""
    node = {"dp-key-file": key_file, "dp-required": "partition", "dp-max-releases": 1,
            "dp-state-file": str(tmp_path / "state.jsonl")}
    mod = make_gradient_coding_mod()

    def ask(rnd: int, pid: int, num: int) -> Message:
        instruction = _inst(round=rnd, dp="partition", noise_multiplier=1.0,
                            partition_ids=(pid,), num_partitions=(num,))
        return mod(_message(instruction), _context(**node), NoisyApp())

    assert not ask(1, 0, 1).has_error()
    reason = _refused(ask(2, 1, 3))
    assert "num-partitions=[3] refused" in reason and "[1] partitions" in reason
    assert '"num-partitions": [1]' in (tmp_path / "state.jsonl").read_text()


@pytest.mark.parametrize(("node_extra", "changed", "refused"), [
    ({}, {"dirichlet-alpha": 5.0}, "dirichlet-alpha"),  # the project app's split
    ({}, {"seed": 4}, "seed"),
    ({}, {"lr": 0.5}, None),  # not a key the split reads
    ({"dp-cut-keys": "shard-seed"}, {"shard-seed": 2}, "shard-seed"),  # the app's own key
    ({"dp-cut-keys": "shard-seed"}, {"seed": 4}, None),
])
def test_a_budgeted_node_keeps_one_run_config_cut_of_its_data(tmp_path, key_file, node_extra,
                                                              changed, refused):
    """The run config decides which records partition j holds (the project's app splits by
    its seed, partitioner, dirichlet-alpha, ...): a server re-cutting the data between runs
    had each record released again under a fresh per-partition budget. Once a budgeted node
    has released under one cut, a release under another is refused; node config dp-cut-keys
    names the keys an app splits by."""
    node = {"dp-key-file": key_file, "dp-required": "partition", "dp-max-releases": 2,
            "dp-state-file": str(tmp_path / "state.jsonl"), **node_extra}
    mod = make_gradient_coding_mod()
    base = {"seed": 3, "dirichlet-alpha": 0.5, "lr": 0.1, "shard-seed": 1}

    def ask(nonce: str, run_config: dict) -> Message:
        instruction = _inst(nonce=nonce, dp="partition", noise_multiplier=1.0)
        return mod(_message(instruction), _context(7, run_config, **node), NoisyApp())

    _recut(ask, base, changed, refused)


def _recut(ask, base: dict, changed: dict, refused: str | None) -> None:
    """A first release under ``base``, then one with ``changed`` over it: refused naming the
    key ``refused`` (the first cut still served after), or accepted (``None``)."""
    assert not ask("run-a", base).has_error()
    reply = ask("run-b", {**base, **changed})
    if refused is None:
        assert not reply.has_error(), reply.error.reason
    else:
        reason = _refused(reply)
        assert f"run config {refused}=" in reason and "one cut" in reason, reason
        assert "train config" in reason
        # the first cut is still served (another run of the same data)
        assert not ask("run-c", base).has_error()


@pytest.mark.parametrize(("changed", "refused"), [
    ({"seed": 4}, "seed"), ({"dirichlet-alpha": 5.0}, "dirichlet-alpha"), ({"lr": 0.5}, None)])
def test_a_train_config_recut_of_a_budgeted_nodes_data_is_refused(tmp_path, key_file, changed,
                                                                  refused):
    """An app may read the cut keys from the server's train config over its run config (the
    project's does; under run_simulation its run config is empty): the cut check read the run
    config only, so a server sending another seed in the train config re-cut the data and each
    record was released again under a fresh per-partition budget."""
    node = {"dp-key-file": key_file, "dp-required": "partition", "dp-max-releases": 2,
            "dp-state-file": str(tmp_path / "state.jsonl")}
    mod = make_gradient_coding_mod()
    base = {"seed": 3, "dirichlet-alpha": 0.5, "lr": 0.1}

    def ask(nonce: str, train_config: dict) -> Message:
        instruction = _inst(nonce=nonce, dp="partition", noise_multiplier=1.0)
        return mod(_message(instruction, **train_config), _context(7, {}, **node), NoisyApp())

    _recut(ask, base, changed, refused)


# ------------------------------------------------ moves found by a second review
def _typed(message: Message, message_type: str) -> Message:
    """``message`` sent as ``message_type`` (Flower routes ``train.<action>`` to a train
    handler: ``train.default`` to ``@app.train()``)."""
    return Message(message.content, dst_node_id=7, message_type=message_type, group_id="1")


@pytest.mark.parametrize("message_type", ["train.default", "train.custom"])
def test_a_train_action_is_governed_as_a_train_message(key_file, message_type):
    """The mod compared the whole message type with "train": a plain message sent as
    "train.default" reached the app with no policy check, and the app released its raw
    update to a node with a floor and a release budget."""
    node = {"dp-key-file": key_file, "dp-required": "partition",
            "dp-min-noise-multiplier": 1.0}
    reply = make_gradient_coding_mod()(_typed(_plain_train("partition"), message_type),
                                       _context(**{"partition-id": 1}, **node), NoisyApp())
    assert "plain train message" in _refused(reply)
    # a coded instruction sent as a train action is coded work like any other
    instruction = _inst(dp="partition", noise_multiplier=5.0)
    coded = make_gradient_coding_mod()(_typed(_message(instruction), message_type),
                                       _context(**node), NoisyApp())
    assert not coded.has_error(), coded.error.reason
    assert not np.allclose(_coded(coded), _raw(1), atol=1e-6)


@pytest.mark.parametrize(("other", "same"), [("train.custom", False),
                                             ("train.default", True)])
def test_replicas_sent_another_train_action_draw_independent_noise(key_file, other, same):
    """Two replicas of a partition (one key), one (nonce, round), model and config, but one
    sent as "train" and one as "train.custom": Flower routes them to different handlers of
    the app, so the two releases may be two functions of the data; with the same keyed noise
    their difference was noise-free. "train.default" reaches the handler "train" does, so it
    still draws identical noise (replicas must, for exact decoding)."""
    node = {"dp-key-file": key_file, "dp-required": "partition"}
    instruction = _inst(dp="partition", noise_multiplier=5.0, clip_norm=1e6)

    def release(message_type: str, node_id: int) -> np.ndarray:
        reply = make_gradient_coding_mod()(_typed(_message(instruction), message_type),
                                           _context(node_id, **node), NoisyApp())
        return _coded(reply)

    a, b = release("train", 101), release(other, 102)
    if same:
        np.testing.assert_array_equal(a, b)
    else:  # the app computed the same here: any difference is the noise's
        # independent keyed noise: sigma * C * sqrt(2) = 7.1e6 per coordinate (400 of them)
        assert np.std(a - b) > 5e6


@pytest.mark.parametrize("node", [{"dp-required": "sample"},
                                  {"dp-min-noise-multiplier": 2.0},
                                  {"dp-required": "sample", "dp-min-noise-multiplier": 2.0}])
@pytest.mark.parametrize("where", ["train", "run"])
def test_a_plain_sample_message_is_held_to_the_noise_a_coded_one_is(key_file, node, where):
    """A plain dp='sample' message reaches the app, whose DP-SGD reads its configs: a noise
    multiplier of 0 (or below the floor) in the train or run config is refused, as for a
    coded dp='sample' instruction; the app's raw update was released."""
    config = {"dp": "sample", "noise-multiplier": 0.0}
    content = RecordDict({"arrays": ArrayRecord({"w": Array(np.zeros(DIM))}),
                          "config": ConfigRecord({"lr": LR, **(config if where == "train"
                                                               else {"dp": "sample"})})})
    message = Message(content, dst_node_id=7, message_type="train", group_id="1")
    context = _context(run_config=config if where == "run" else None,
                       **{"partition-id": 1, "dp-key-file": key_file, **node})
    reason = _refused(make_gradient_coding_mod()(message, context, NoisyApp()))
    assert "noise-multiplier=0.0" in reason


def test_a_release_budget_alone_pins_the_weight_key_and_identical_noise(key_file, tmp_path):
    """A node with only an epsilon budget (no dp-required, no floor): the weight travels
    un-noised, so naming the update norm as the weight read it in clear while the ledger
    counted the release; independent noise per replica would let the server average it."""
    node = {"dp-key-file": key_file, "dp-max-epsilon": 1.0,
            "dp-state-file": str(tmp_path / "state.jsonl")}
    named = dataclasses.replace(_inst(dp="partition", noise_multiplier=20.0),
                                weight_key="update-norm")
    reason = _refused(make_gradient_coding_mod()(_message(named), _context(**node),
                                                 NormReportingApp()))
    assert "weight-key='update-norm'" in reason
    independent = dataclasses.replace(_inst(dp="partition", noise_multiplier=20.0),
                                      dp_noise="independent")
    reason = _refused(make_gradient_coding_mod()(_message(independent), _context(**node),
                                                 NoisyApp()))
    assert "dp-noise='independent'" in reason


def test_a_replica_sent_the_model_in_another_float_precision_draws_other_noise(key_file):
    """Replicas of one partition under one (nonce, round), one sent the model in float64 and
    one in float16: an app computing in the dtype it is sent releases other updates, so the
    same keyed noise left their difference noise-free (the float16 rounding of the private
    update). Now the precision is bound: the difference carries noise."""
    def app(msg, ctx):  # computes in the dtype it receives
        pid = int(ctx.node_config["partition-id"])
        theta = msg.content["arrays"]["w"].numpy()
        new = theta + (LR * (_target(pid) - theta)).astype(theta.dtype)
        return Message(RecordDict({"arrays": ArrayRecord({"w": Array(new)}),
                                   "metrics": MetricRecord({"num-examples": _n(pid)})}),
                       reply_to=msg)

    node = {"dp-key-file": key_file, "dp-required": "partition"}
    instruction = _inst(dp="partition", noise_multiplier=5.0, clip_norm=1e6)

    def release(dtype, node_id):
        content = RecordDict({"arrays": ArrayRecord({"w": Array(np.zeros(DIM, dtype))}),
                              "config": ConfigRecord({"lr": LR})})
        message = protocol.instruction_message(content, instruction, 7, "1")
        return _coded(make_gradient_coding_mod()(message, _context(node_id, **node), app))

    a, b = release(np.float64, 101), release(np.float16, 102)
    private = LR * _target(0) * _n(0)
    residue = private - (LR * _target(0)).astype(np.float16).astype(np.float64) * _n(0)
    assert not np.allclose(a - b, residue, atol=1e-3 * _n(0))
    assert np.std(a - b) > 1.0  # independent keyed noise, sigma * clip per release


@pytest.mark.parametrize(("extra", "warned"), [({}, True),
                                              ({"dp-min-noise-multiplier": 0.5}, False),
                                              ({"dp-max-epsilon": 8.0}, False)])
def test_dp_required_without_an_amount_of_noise_is_warned_once(key_file, tmp_path, extra,
                                                               warned):
    """dp-required refuses sigma = 0 only, so any positive sigma passes: a node that sets no
    floor and no epsilon cap is told so, once."""
    import warnings

    from fl_gradcode.flower.mod import NO_FLOOR_WARNING

    node = {"dp-key-file": key_file, "dp-required": "partition",
            "dp-state-file": str(tmp_path / "state.jsonl"), **extra}
    mod = make_gradient_coding_mod()
    instruction = _inst(dp="partition", noise_multiplier=5.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for round_ in (1, 2):
            reply = mod(_message(dataclasses.replace(instruction, round=round_)),
                        _context(**node), NoisyApp())
            assert not reply.has_error(), reply.error.reason
    told = [w for w in caught if str(w.message) == NO_FLOOR_WARNING]
    assert len(told) == (1 if warned else 0)


def test_numpys_global_rng_gets_every_bit_of_a_partition_seed():
    """A secret partition seed has 63 bits; numpy's global RNG was seeded with the low 32, so
    seeds equal modulo 2**32 (a collision a server can find in ~1e5 releases) drew the same
    noise in an app using np.random. Two such seeds now draw differently, and one seed
    draws the same twice."""
    state = random.getstate(), np.random.get_state()  # noqa: NPY002
    low = 0x1234_5678
    try:
        draws = []
        for seed in (low, low + (7 << 32), low + (7 << 32)):
            seed_everything(seed)
            draws.append(np.random.standard_normal(4))  # noqa: NPY002
    finally:
        random.setstate(state[0])
        np.random.set_state(state[1])  # noqa: NPY002
    assert not np.allclose(draws[0], draws[1])
    np.testing.assert_array_equal(draws[1], draws[2])


def test_bound_nonce_is_the_documented_sha256_of_the_dp_parameters_records_and_arrays():
    """The binding against its documented definition (tests/flower/test_mod_edges.py)."""
    from tests.flower.messages import DIM as MSG_DIM
    from tests.flower.messages import train_instruction
    from tests.flower.test_mod_edges import _expected_bound_nonce

    inst = train_instruction(nonce="run7", dp="sample", clip_norm=2, noise_multiplier=0.75,
                             dp_noise="independent")
    content = RecordDict({"arrays": ArrayRecord({"w": Array(np.zeros(MSG_DIM))}),
                          "config": ConfigRecord({"lr": 0.1, "epochs": 2}),
                          "extra": MetricRecord({"b": 1.5})})
    params = {"dp": "sample", "clip-norm": "2.0", "noise-multiplier": "0.75",
              "dp-noise": "independent"}
    expected = _expected_bound_nonce(
        "run7", params, [("config", "ConfigRecord", {"lr": 0.1, "epochs": 2}),
                         ("extra", "MetricRecord", {"b": 1.5})])
    assert bound_nonce(inst, content) == expected
    assert re.fullmatch(r"run7;bind=[0-9a-f]{32}", expected)
    # the run config the app may read is bound; a key only the server reads (code) is not
    with_config = _expected_bound_nonce(
        "run7", params, [("config", "ConfigRecord", {"lr": 0.1, "epochs": 2}),
                         ("extra", "MetricRecord", {"b": 1.5})], run_config={"seed": 3})
    assert bound_nonce(inst, content, {"seed": 3, "code": "frc"}) == with_config != expected
    # a train action other than the default one is bound (another handler of the app)
    records = [("config", "ConfigRecord", {"lr": 0.1, "epochs": 2}),
               ("extra", "MetricRecord", {"b": 1.5})]
    assert bound_nonce(inst, content, None, "train.eval") == _expected_bound_nonce(
        "run7", params, records, action="eval") != expected
    assert bound_nonce(inst, content, None, "train.default") == expected
    # the same values with -0.0, or big-endian, bind alike; in float32 they bind by their
    # precision (an app computing in the dtype it is sent releases another update)
    same = RecordDict({**content, "arrays": ArrayRecord({"w": Array(-np.zeros(MSG_DIM, ">f8"))})})
    assert bound_nonce(inst, same) == expected
    single = RecordDict({**content, "arrays": ArrayRecord({"w": Array(np.zeros(MSG_DIM, "f4"))})})
    assert bound_nonce(inst, single) == _expected_bound_nonce(
        "run7", params, [("config", "ConfigRecord", {"lr": 0.1, "epochs": 2}),
                         ("extra", "MetricRecord", {"b": 1.5})],
        arrays={"w": np.zeros(MSG_DIM, "f4")}) != expected
    other = np.zeros(MSG_DIM)
    other[3] = 1e-300
    moved = RecordDict({**content, "arrays": ArrayRecord({"w": Array(other)})})
    assert bound_nonce(inst, moved) != expected


def _evaluate_message(message_type: str = "evaluate") -> Message:
    content = RecordDict({"arrays": ArrayRecord({"w": Array(np.zeros(DIM))}),
                          "config": ConfigRecord({})})
    return Message(content, dst_node_id=7, message_type=message_type, group_id="1")


def _evaluating_app(msg: Message, context: Context) -> Message:
    """Evaluates the received model on its partition's data: an un-noised function of it."""
    pid = int(context.node_config["partition-id"])
    loss = float(np.sum((_target(pid) - msg.content["arrays"]["w"].numpy()) ** 2))
    return Message(RecordDict({"metrics": MetricRecord({"loss": loss})}), reply_to=msg)


@pytest.mark.parametrize("message_type", ["evaluate", "evaluate.custom", "query"])
def test_a_node_can_refuse_the_un_noised_replies_of_evaluate_and_query(key_file,
                                                                       message_type):
    """Evaluate and query messages reach the app as they are: its reply (a loss on the
    node's data, for any model the server sends) carries no noise. A node with a DP policy
    can refuse them (node config dp-evaluate='refuse'); by default they pass, and the node
    is told once that they are un-noised."""
    strict = {"dp-key-file": key_file, "dp-required": "partition", "dp-evaluate": "refuse"}
    reason = _refused(make_gradient_coding_mod()(_evaluate_message(message_type),
                                                 _context(**strict), _evaluating_app))
    assert "dp-evaluate='refuse'" in reason and message_type in reason
    lenient = {"dp-key-file": key_file, "dp-required": "partition"}
    mod = make_gradient_coding_mod()
    with pytest.warns(UserWarning, match="dp-evaluate"):
        reply = mod(_evaluate_message(message_type), _context(**lenient), _evaluating_app)
    assert reply.content["metrics"]["loss"] == pytest.approx(float(np.sum(_target(0) ** 2)))
    # dp-evaluate alone refuses too; a node without a DP policy passes them, unwarned
    _refused(make_gradient_coding_mod()(_evaluate_message(message_type),
                                        _context(**{"dp-evaluate": "refuse"}), _evaluating_app))
    import warnings as _warnings
    with _warnings.catch_warnings():
        _warnings.simplefilter("error")
        plain = make_gradient_coding_mod()(_evaluate_message(message_type), _context(),
                                           _evaluating_app)
    assert not plain.has_error()


def test_a_bad_dp_evaluate_is_named():
    reply = make_gradient_coding_mod()(_evaluate_message(),
                                       _context(**{"dp-required": "partition",
                                                   "dp-evaluate": "maybe"}), _evaluating_app)
    assert "node config dp-evaluate='maybe'" in _refused(reply)


class ThresholdApp(NoisyApp):
    """The numpy app with a sanity check that raises when its update is large: whether it
    fails depends on the data (its partition's target) and on the model the server sent."""

    def __call__(self, msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        theta = msg.content["arrays"]["w"].numpy()
        if np.abs(_target(pid) - theta).max() > 0.5:
            raise FloatingPointError(f"update too large: record value {_target(pid)[0]!r}")
        return super().__call__(msg, context)


@pytest.mark.parametrize("state", [False, True])
def test_an_app_failing_on_the_data_spends_the_round_and_withholds_its_message(
        key_file, tmp_path, state):
    """An app that fails on a data-dependent condition answers a yes/no question no noise
    covers. The failed round was freed, so a server asked again and again under one
    (nonce, round) at no cost; the app's message went to the server too. The round now stays
    answered and the reply names only that the app failed."""
    node = {"dp-key-file": key_file, "dp-required": "partition"}
    if state:
        node["dp-state-file"] = str(tmp_path / "state.jsonl")
    mod = make_gradient_coding_mod()
    inst = _inst(dp="partition", noise_multiplier=2.0, clip_norm=1.0)
    reason = _refused(mod(_message(inst), _context(**node), ThresholdApp()))
    assert "the app failed after it ran on this node's data" in reason
    assert "record value" not in reason and "update too large" not in reason
    again = _refused(mod(_message(inst, theta=_target(1)), _context(**node), ThresholdApp()))
    assert "already answered" in again
    if state:  # the ledger holds the round
        assert len((tmp_path / "state.jsonl").read_text().splitlines()) == 1


def test_a_round_stopped_by_its_deadline_may_be_asked_again(key_file):
    """A deadline, not the data, stopping the work (before the first partition) keeps the
    round open: the same (nonce, round) is answered once asked in time."""
    node = {"dp-key-file": key_file, "dp-required": "partition"}
    now = [1e12]  # long after the message was created
    mod = make_gradient_coding_mod(wall_clock=lambda: now[0])
    inst = _inst(dp="partition", noise_multiplier=2.0, clip_norm=1.0, stop_after_s=1.0)
    app = ThresholdApp()
    stopped = mod(_message(inst, theta=_target(1)), _context(**node), app)
    assert stopped.has_error() and "stopped after 0 of 1 partitions" in stopped.error.reason
    now[0] = 0.0
    answered = mod(_message(inst, theta=_target(1)), _context(**node), app)
    assert not answered.has_error(), answered.error.reason


def test_a_round_stopped_after_the_app_ran_stays_answered(key_file):
    """Whether the work finishes before a deadline the server sets may depend on the data
    (its running time): a round stopped after the app ran was freed, so a server could ask
    again under one (nonce, round) with another model until one finished in time."""
    node = {"dp-key-file": key_file, "dp-required": "partition"}
    now = [0.0]

    class SlowApp(NoisyApp):
        def __call__(self, msg, context):
            now[0] = 1e12  # the app ran past the deadline
            return super().__call__(msg, context)

    mod = make_gradient_coding_mod(wall_clock=lambda: now[0])
    inst = _inst(dp="partition", noise_multiplier=2.0, clip_norm=1.0, stop_after_s=1.0)
    stopped = mod(_message(inst), _context(**node), SlowApp())
    assert stopped.has_error() and "after the app ran" in stopped.error.reason
    now[0] = 0.0
    assert "already answered" in _refused(mod(_message(inst, theta=_target(1)),
                                              _context(**node), NoisyApp()))

