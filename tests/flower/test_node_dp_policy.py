"""A node's privacy does not depend on the server's good will.

Through the public mod API (a coded train message built with ``protocol.instruction_message``,
``make_gradient_coding_mod``, ``InProcessGrid``), with a small numpy app and with the project's
own ClientApp (``clients/app.py``). Expected values are computed here in numpy from the apps'
formulas (the raw update, the clipped update), never by the mod.

* a node's DP policy (``dp-required``, ``dp-min-noise-multiplier``) holds over what the app
  actually receives: the server's train config cannot turn the app's DP-SGD off or lower its
  sigma; the reply is never the raw update;
* the keyed noise is bound to the received arrays: replicas given different models under one
  ``(nonce, round)`` draw independent noise (identical models: identical noise);
* ``dp-state-file`` keeps a per-node release ledger and ``dp-max-releases`` /
  ``dp-max-epsilon`` refuse releases once the budget is spent, across restarts.
"""

from __future__ import annotations

import json

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
from fl_gradcode.privacy import DPConfig

pytestmark = pytest.mark.filterwarnings("ignore:gradient_coding_mod:UserWarning")

DIM = 400
LR = 0.5


def _target(pid: int) -> np.ndarray:
    return np.random.default_rng([11, pid]).standard_normal(DIM) * 3.0


def _n(pid: int) -> int:
    return 10 + 3 * pid


class NoisyApp:
    """A numpy app that, like the project's ClientApp, reads ``dp`` / ``noise-multiplier`` /
    ``clip-norm`` from its run config updated with the received train config, and under
    ``dp='sample'`` adds its own Gaussian noise (from numpy's global RNG, which the mod seeds)
    to the update it trains: ``theta_j = theta + lr (target_j - theta) + sigma C z``."""

    def __init__(self) -> None:
        self.seen: list[dict] = []

    def __call__(self, msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        cfg = {**dict(context.run_config), **dict(msg.content["config"])}
        self.seen.append(cfg)
        theta = msg.content["arrays"]["w"].numpy()
        new = theta + float(cfg.get("lr", LR)) * (_target(pid) - theta)
        if str(cfg.get("dp", "none")) == "sample":
            sigma, c = float(cfg.get("noise-multiplier", 1.0)), float(cfg.get("clip-norm", 1.0))
            new = new + sigma * c * np.random.standard_normal(DIM)  # noqa: NPY002
        return Message(RecordDict({"arrays": ArrayRecord({"w": Array(new)}),
                                   "metrics": MetricRecord({"num-examples": _n(pid)})}),
                       reply_to=msg)


def _inst(**kw) -> Instruction:
    base = dict(op=protocol.OP_TRAIN, round=1, worker=0, seed=3, nonce="n",
                partition_ids=(1,), num_partitions=(3,), coefficients=(1.0,))
    return Instruction(**{**base, **kw})


def _message(instruction: Instruction, theta: np.ndarray | None = None,
             **config) -> Message:
    theta = np.zeros(DIM) if theta is None else theta
    content = RecordDict({"arrays": ArrayRecord({"w": Array(np.asarray(theta, float))}),
                          "config": ConfigRecord({"lr": LR, **config})})
    return protocol.instruction_message(content, instruction, 7, "1")


def _context(node_id: int = 7, run_config: dict | None = None, **node_config) -> Context:
    cfg = {"partition-id": 0, "num-partitions": 3, **node_config}
    return Context(run_id=1, node_id=node_id, node_config=cfg, state=RecordDict(),
                   run_config=dict(run_config or {}))


def _coded(reply: Message) -> np.ndarray:
    assert not reply.has_error(), reply.error.reason
    return reply.content[protocol.PROTOCOL_KEY]["w"].numpy()


def _raw(pid: int, theta: np.ndarray | None = None) -> np.ndarray:
    """The raw coded update of one partition with coefficient 1: n_j lr (target_j - theta)."""
    theta = np.zeros(DIM) if theta is None else theta
    return _n(pid) * LR * (_target(pid) - theta)


def _clip(u: np.ndarray, c: float) -> np.ndarray:
    return u * min(1.0, c / np.linalg.norm(u))


def _not_raw(reply: Message, raw: np.ndarray) -> str:
    """'refused: <reason>' or 'noised' -- and never the raw update."""
    if reply.has_error():
        assert reply.error.code == MOD_ERROR_CODE
        return "refused: " + reply.error.reason
    coded = _coded(reply)
    assert np.linalg.norm(coded - raw) > 0.1 * np.linalg.norm(raw), "the raw update was released"
    return "noised"


# ============================================================ 1. policy over what the app sees
@pytest.mark.parametrize("policy", [{"dp-required": "sample"},
                                    {"dp-min-noise-multiplier": 1.0}])
def test_a_server_config_saying_dp_none_never_gets_a_raw_release(key_file, policy):
    app = NoisyApp()
    reply = make_gradient_coding_mod()(
        _message(_inst(dp="sample", noise_multiplier=1.0), dp="none"),
        _context(**{"dp-key-file": key_file}, **policy), app)
    outcome = _not_raw(reply, _raw(1))
    assert outcome.startswith("refused: ")
    assert "train config dp='none'" in outcome
    assert next(iter(policy)) in outcome  # names the policy
    assert app.seen == []


def test_a_server_config_with_sigma_below_the_floor_is_refused(key_file):
    app = NoisyApp()
    reply = make_gradient_coding_mod()(
        _message(_inst(dp="sample", noise_multiplier=1.0), dp="sample",
                 **{"noise-multiplier": 0.0}),
        _context(**{"dp-key-file": key_file, "dp-min-noise-multiplier": 1.0}), app)
    outcome = _not_raw(reply, _raw(1))
    assert "train config noise-multiplier=0.0" in outcome
    assert "dp-min-noise-multiplier=1" in outcome
    assert app.seen == []


def test_a_server_config_without_dp_keys_gets_the_instructions_dp_raised_to_the_policy(
    key_file
):
    """The train config says nothing about DP (the app's default is no DP): the app sees the
    instruction's dp, sigma and clip (which the policy checked), so its DP-SGD runs."""
    app = NoisyApp()
    reply = make_gradient_coding_mod()(
        _message(_inst(dp="sample", noise_multiplier=1.5, clip_norm=2.0)),
        _context(**{"dp-key-file": key_file, "dp-required": "sample"}), app)
    assert _not_raw(reply, _raw(1)) == "noised"
    (seen,) = app.seen
    assert (seen["dp"], seen["noise-multiplier"], seen["clip-norm"]) == ("sample", 1.5, 2.0)
    noise = _coded(reply) / _n(1) - _raw(1) / _n(1)
    assert np.std(noise) == pytest.approx(1.5 * 2.0, rel=0.15)


def _plain_train(dp: str) -> Message:
    """A plain Flower train message (no gradient-coding record) whose config asks for ``dp``."""
    content = RecordDict({"arrays": ArrayRecord({"w": Array(np.zeros(DIM))}),
                          "config": ConfigRecord({"lr": LR, "dp": dp, "clip-norm": 0.01})})
    return Message(content, dst_node_id=7, message_type=MessageType.TRAIN, group_id="1")


@pytest.mark.parametrize("required", ["partition", "central"])
@pytest.mark.parametrize("asked", ["none", "partition", "central"])
def test_a_plain_train_message_never_gets_a_raw_release_from_a_partition_dp_node(
        key_file, required, asked):
    """Partition and central DP are the mod's, applied to coded work: a plain train message
    reaches the app as it is, and the app (like the project's) would answer with its raw
    update even when the message says dp='partition'. A node requiring them refuses it
    without calling the app."""
    app = NoisyApp()
    reply = make_gradient_coding_mod()(
        _plain_train(asked), _context(**{"dp-key-file": key_file, "dp-required": required}), app)
    assert reply.has_error() and reply.error.code == MOD_ERROR_CODE
    assert "plain train message" in reply.error.reason and required in reply.error.reason
    assert app.seen == []


@pytest.mark.parametrize("asked", ["none", "partition", "central"])
def test_a_noise_floor_alone_lets_only_dp_sgd_through_a_plain_message(key_file, asked):
    """``dp-min-noise-multiplier`` without ``dp-required``: the app's own DP-SGD
    (``dp='sample'``) can meet it; a plain message asking for another dp would reach an app
    that applies none."""
    app = NoisyApp()
    node = {"dp-key-file": key_file, "dp-min-noise-multiplier": 1.0}
    reply = make_gradient_coding_mod()(_plain_train(asked), _context(**node), app)
    assert reply.has_error() and f"dp={asked!r}" in reply.error.reason
    assert app.seen == []


@pytest.mark.parametrize("node_config", [{}, {"dp-required": "sample"},
                                         {"dp-min-noise-multiplier": 1.0}])
def test_a_plain_train_message_reaches_the_app_where_the_app_applies_the_policy(
        key_file, node_config):
    """No policy, or one the app itself applies (DP-SGD, ``dp='sample'``): the plain message
    is the app's (the app checks its config against the policy:
    ``NodePolicy.check_app_config``)."""
    app = NoisyApp()
    reply = make_gradient_coding_mod()(
        _plain_train("sample"), _context(**{"dp-key-file": key_file, **node_config}), app)
    assert not reply.has_error()
    assert [seen["dp"] for seen in app.seen] == ["sample"]


def test_in_a_shared_simulation_cache_a_policy_node_never_reuses_a_raw_computation(key_file):
    """Replicas in one process share computed updates (``cache``): a replica without a policy
    computes partition 1 raw (its app sees no dp); the replica with dp-required='sample'
    computes its own, noised."""
    mod = make_gradient_coding_mod(cache={})
    inst = _inst(dp="sample", noise_multiplier=1.0)
    plain = mod(_message(inst), _context(101, **{"dp-key-file": key_file}), NoisyApp())
    np.testing.assert_allclose(_coded(plain), _raw(1), rtol=1e-12)
    guarded = mod(_message(_inst(dp="sample", noise_multiplier=1.0, worker=1)),
                  _context(102, **{"dp-key-file": key_file, "dp-required": "sample",
                              "partition-id": 1}),
                  NoisyApp())
    assert _not_raw(guarded, _raw(1)) == "noised"


def test_a_node_without_a_policy_passes_the_train_config_unchanged(key_file):
    app = NoisyApp()
    reply = make_gradient_coding_mod()(
        _message(_inst(dp="sample", noise_multiplier=1.0), dp="none"),
        _context(**{"dp-key-file": key_file}), app)
    np.testing.assert_allclose(_coded(reply), _raw(1), rtol=1e-12)
    assert app.seen[0]["dp"] == "none" and "noise-multiplier" not in app.seen[0]


# -------------------------------------------------- the project's own ClientApp (clients/app.py)
def _logreg_oracle(pid: int, num: int, theta_w: np.ndarray, theta_b: np.ndarray):
    """The raw coded update of clients/app.py (update=gradient, model=logreg, digits) for one
    partition with coefficient 1: ``n_j (theta_j - theta) = -n_j lr g_j``, ``g_j`` the mean
    cross-entropy gradient of softmax regression, in numpy."""
    from fl_gradcode.config import merge_config
    from fl_gradcode.data import run_partitions

    data, index = run_partitions(merge_config({}), num)
    x = data.x_train[index[pid]].reshape(len(index[pid]), -1)
    y = data.y_train[index[pid]]
    logits = x @ theta_w.T + theta_b
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(len(y)), y] -= 1.0
    g_w, g_b = p.T @ x / len(y), p.mean(axis=0)
    n = len(y)
    return -n * LR * g_w, -n * LR * g_b


def _logreg_message(instruction: Instruction, **config) -> tuple[Message, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(4)
    w, b = rng.standard_normal((10, 64)) * 0.01, rng.standard_normal(10) * 0.01
    content = RecordDict({"arrays": ArrayRecord({"1.weight": Array(w), "1.bias": Array(b)}),
                          "config": ConfigRecord({"lr": LR, **config})})
    return protocol.instruction_message(content, instruction, 7, "1"), w, b


def _project_reply(key_file, policy, **config):
    from clients.app import train

    inst = _inst(dp="sample", noise_multiplier=1.0, clip_norm=1.0)
    msg, w, b = _logreg_message(inst, **config)
    reply = make_gradient_coding_mod()(msg, _context(**{"dp-key-file": key_file}, **policy),
                                       train)
    raw_w, raw_b = _logreg_oracle(1, 3, w, b)
    return reply, np.concatenate([raw_w.ravel(), raw_b])


def _project_coded(reply: Message) -> np.ndarray:
    rec = reply.content[protocol.PROTOCOL_KEY]
    return np.concatenate([rec["1.weight"].numpy().ravel(), rec["1.bias"].numpy()])


def test_the_numpy_oracle_is_the_project_apps_raw_update_without_a_policy(key_file):
    """The reference itself: without a node policy the server's dp='none' is obeyed and the
    reply is exactly the raw update computed in numpy."""
    reply, raw = _project_reply(key_file, {}, dp="none")
    assert not reply.has_error(), reply.error.reason
    np.testing.assert_allclose(_project_coded(reply), raw, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize(("policy", "config", "words"), [
    ({"dp-required": "sample"}, {"dp": "none"}, "dp-required='sample'"),
    ({"dp-min-noise-multiplier": 1.0}, {"dp": "none"}, "dp-min-noise-multiplier=1"),
    ({"dp-min-noise-multiplier": 1.0}, {"dp": "sample", "noise-multiplier": 0.0},
     "dp-min-noise-multiplier=1"),
])
def test_the_project_client_app_never_releases_its_raw_update_past_the_policy(
    key_file, policy, config, words
):
    reply, raw = _project_reply(key_file, policy, **config)
    if reply.has_error():
        assert words in reply.error.reason
    else:  # pragma: no cover - the mod refuses these; noised would be acceptable too
        assert np.linalg.norm(_project_coded(reply) - raw) > 0.1 * np.linalg.norm(raw)


def test_the_project_client_app_runs_dp_sgd_when_the_train_config_omits_dp(key_file):
    reply, raw = _project_reply(key_file, {"dp-required": "sample"})
    assert not reply.has_error(), reply.error.reason
    assert np.linalg.norm(_project_coded(reply) - raw) > 0.1 * np.linalg.norm(raw)


def test_the_project_client_app_itself_refuses_a_config_below_the_node_policy():
    """Called without the mod, clients/app.py's train reads the node's policy too."""
    from clients.app import train
    from fl_gradcode.flower.client_policy import PolicyError

    msg, _, _ = _logreg_message(_inst(dp="sample"), dp="none")
    ctx = _context(**{"partition-id": 1, "dp-required": "sample"})
    with pytest.raises(PolicyError, match="dp-required='sample'"):
        train(msg, ctx)
    ctx = _context(**{"partition-id": 1, "dp-min-noise-multiplier": 2.0})
    msg, _, _ = _logreg_message(_inst(dp="sample"), dp="sample", **{"noise-multiplier": 1.0})
    with pytest.raises(PolicyError, match="dp-min-noise-multiplier=2"):
        train(msg, ctx)


# ============================================================ 2. arrays bound into the seed
def _partition_release(key_file, node_id: int, theta: np.ndarray, worker: int,
                       sigma: float = 1.0, clip: float = 2.0) -> np.ndarray:
    inst = _inst(worker=worker, dp="partition", noise_multiplier=sigma, clip_norm=clip)
    return _coded(make_gradient_coding_mod()(_message(inst, theta), _context(
        node_id, **{"dp-key-file": key_file}), NoisyApp()))


def test_replicas_given_different_models_under_one_nonce_draw_independent_noise(key_file):
    """The server sends partition 1's replicas on two nodes one round with two models: with
    identical keyed noise, r1 - r2 = n (clip(d1) - clip(d2)) exactly (the noise cancels, and
    differencing many such pairs recovers the data's second moments). Bound to the arrays, the
    two noises are independent: the difference keeps noise of std sqrt(2) n sigma C."""
    sigma, clip = 1.0, 2.0
    theta1 = np.zeros(DIM)
    theta2 = np.full(DIM, 1e-6)
    r1 = _partition_release(key_file, 101, theta1, worker=0, sigma=sigma, clip=clip)
    r2 = _partition_release(key_file, 102, theta2, worker=1, sigma=sigma, clip=clip)
    n = _n(1)
    nu1 = r1 / n - _clip(LR * (_target(1) - theta1), clip)
    nu2 = r2 / n - _clip(LR * (_target(1) - theta2), clip)
    assert np.std(nu1) == pytest.approx(sigma * clip, rel=0.15)  # noise present
    assert np.std(nu2) == pytest.approx(sigma * clip, rel=0.15)
    assert abs(np.corrcoef(nu1, nu2)[0, 1]) < 0.2  # uncorrelated: 4 sigma at DIM=400
    assert np.std(nu1 - nu2) == pytest.approx(np.sqrt(2) * sigma * clip, rel=0.15)


def test_replicas_given_identical_models_still_draw_identical_noise(key_file):
    theta = np.linspace(-1, 1, DIM)
    r1 = _partition_release(key_file, 101, theta, worker=0)
    r2 = _partition_release(key_file, 102, theta.copy(), worker=2)
    np.testing.assert_array_equal(r1, r2)
    assert np.linalg.norm(r1 / _n(1) - _clip(LR * (_target(1) - theta), 2.0)) > 1.0


# ============================================================ 3. release ledger and budget
def _budget_reply(mod, key_file, state, rnd, nonce="n", pids=(1,), dp="partition",
                  sigma=1.0, **node_config):
    inst = _inst(round=rnd, nonce=nonce, dp=dp, noise_multiplier=sigma, clip_norm=2.0,
                 partition_ids=pids, num_partitions=(3,) * len(pids),
                 coefficients=(1.0,) * len(pids))
    cfg = {"dp-key-file": key_file, "dp-state-file": str(state), **node_config}
    return mod(_message(inst), _context(**cfg), NoisyApp())


def test_dp_max_releases_refuses_once_spent_even_with_fresh_nonces_and_after_a_restart(
    tmp_path, key_file
):
    state = tmp_path / "node.jsonl"
    budget = {"dp-max-releases": 3}
    mod = make_gradient_coding_mod()
    replies = [_budget_reply(mod, key_file, state, 1, nonce=f"fresh{i}", **budget)
               for i in range(5)]
    assert [r.has_error() for r in replies] == [False, False, False, True, True]
    reason = replies[3].error.reason
    assert replies[3].error.code == MOD_ERROR_CODE
    assert "dp-max-releases=3" in reason and "partition 1" in reason
    restarted = make_gradient_coding_mod()  # a fresh process, the same state file
    again = _budget_reply(restarted, key_file, state, 9, nonce="other", **budget)
    assert "dp-max-releases=3" in again.error.reason
    other = _budget_reply(restarted, key_file, state, 9, nonce="other", pids=(2,), **budget)
    assert not other.has_error(), other.error.reason  # the ledger is per partition
    both = _budget_reply(restarted, key_file, state, 10, nonce="other", pids=(1, 2), **budget)
    assert "partition 1" in both.error.reason  # one spent partition refuses the instruction


def test_without_a_state_file_the_budget_holds_for_the_process_and_its_pickled_copies():
    """No dp-state-file and no keys: the budget still holds, in the mod's memory (a warning
    says a restart forgets it); a copy shipped to a simulation actor keeps the ledger."""
    import pickle

    mod = make_gradient_coding_mod()
    cfg = {"dp-max-releases": 2}

    def ask(m, rnd):
        inst = _inst(round=rnd, nonce=f"n{rnd}", dp="central", noise_multiplier=1.0)
        return m(_message(inst), _context(**cfg), NoisyApp())

    with pytest.warns(UserWarning, match="its release ledger"):
        assert not ask(mod, 1).has_error()
    assert not ask(mod, 2).has_error()
    reason = ask(mod, 3).error.reason
    assert "dp-max-releases=2" in reason and "in this process only" in reason
    # the mod's guard, as Flower's simulation engine ships it to an actor (pickled)
    from fl_gradcode.flower.client_policy import NodePolicy, PolicyError, Release, ReplayGuard

    guard, budget = ReplayGuard(), NodePolicy(max_releases=1)
    guard.claim(7, {}, "a", 1, Release((1,), "central", 1.0, (3,)), budget)
    copy = pickle.loads(pickle.dumps(guard))
    with pytest.raises(PolicyError, match="dp-max-releases=1"):
        copy.claim(7, {}, "b", 1, Release((1,), "central", 1.0, (3,)), budget)
    copy.claim(8, {}, "b", 1, Release((1,), "central", 1.0, (3,)), budget)  # another node's own


def test_the_ledger_in_the_state_file_counts_releases_per_partition_with_epsilon(
    tmp_path, key_file
):
    from opacus.accountants import RDPAccountant

    state = tmp_path / "node.jsonl"
    mod = make_gradient_coding_mod()
    for rnd in (1, 2):
        assert not _budget_reply(mod, key_file, state, rnd, pids=(0, 2), sigma=2.0).has_error()
    entries = [json.loads(line) for line in state.read_text().splitlines()]
    assert [(e["round"], e["partitions"], e["noise-multiplier"]) for e in entries] == [
        (1, [0, 2], 2.0), (2, [0, 2], 2.0)]
    acc = RDPAccountant()
    acc.history = [(2.0, 1.0, 2)]
    expected = acc.get_epsilon(delta=1e-5)
    assert entries[-1]["epsilon"] == {"0": pytest.approx(expected), "2": pytest.approx(expected)}


def test_dp_max_epsilon_refuses_the_release_that_would_exceed_it(tmp_path, key_file):
    from opacus.accountants import RDPAccountant

    def eps(k: int, sigma: float) -> float:
        acc = RDPAccountant()
        acc.history = [(sigma, 1.0, k)]
        return acc.get_epsilon(delta=1e-5)

    sigma = 3.0
    limit = (eps(3, sigma) + eps(4, sigma)) / 2  # allows exactly 3 releases
    state = tmp_path / "node.jsonl"
    mod = make_gradient_coding_mod()
    budget = {"dp-max-epsilon": limit}
    out = [_budget_reply(mod, key_file, state, r, sigma=sigma, **budget) for r in range(1, 6)]
    assert [r.has_error() for r in out] == [False, False, False, True, True]
    assert f"dp-max-epsilon={limit:g}" in out[3].error.reason
    # a release the node adds no noise to has no finite epsilon: refused under the budget
    for dp, sigma in (("central", 1.0), ("none", 0.0), ("partition", 0.0)):
        fresh = tmp_path / f"{dp}{sigma}.jsonl"
        reply = _budget_reply(make_gradient_coding_mod(), key_file, fresh, 1, dp=dp,
                              sigma=sigma, **budget)
        assert "dp-max-epsilon" in reply.error.reason, dp


@pytest.mark.parametrize(("key", "value"), [("dp-max-releases", -1), ("dp-max-releases", 1.5),
                                            ("dp-max-epsilon", -0.1), ("dp-max-epsilon", "x"),
                                            ("dp-delta", 0.0), ("dp-cut-keys", 3)])
def test_a_bad_budget_is_an_error_naming_the_node_config_key(tmp_path, key_file, key, value):
    reply = _budget_reply(make_gradient_coding_mod(), key_file, tmp_path / "s.jsonl", 1,
                          **{key: value})
    assert reply.has_error() and f"node config {key}=" in reply.error.reason


def test_a_spent_budget_makes_the_node_a_straggler_for_the_server(tmp_path, key_file):
    """End to end: every node allows one release per partition; round 1 decodes, round 2 is
    refused by the nodes that released in round 1 (named), the round is skipped (no group
    left to decode from), and the run ends without a crash."""
    app = ClientApp(mods=[make_gradient_coding_mod()])
    app.train()(NoisyApp())
    grid = InProcessGrid(app, 4, node_config=lambda i: {
        "dp-key-file": key_file, "dp-state-file": str(tmp_path / f"node{i}.jsonl"),
        "dp-max-releases": 1})
    strategy = GradientCoding(FedAvg(fraction_evaluate=0.0, min_available_nodes=4), code="frc",
                              s=1, seed=0, dp=DPConfig(mode="partition", clip_norm=1e6,
                                                       noise_multiplier=0.0))
    strategy.start(grid=grid, initial_arrays=ArrayRecord({"w": Array(np.zeros(DIM))}),
                   num_rounds=2, train_config=ConfigRecord({"lr": LR}))
    first, second = strategy.history
    assert first["decode"] == "exact" and first["rejected"] == 0
    assert second["decode"] == "skipped" and second["rejected"] >= 2
    assert all("dp-max-releases=1" in r for r in second["rejected_reasons"])


@pytest.mark.parametrize("node_config", [{"dp-required": "sample"},
                                         {"dp-min-noise-multiplier": 1.0}])
def test_a_plain_dp_sgd_message_gets_noise_the_server_cannot_predict(key_file, node_config):
    """A plain dp='sample' message reaches the app, whose DP-SGD draws its noise from the
    global RNGs; an outer mod (or the app) may seed those from the server's seed and round.
    Under a node's DP policy the noise must not follow from them: the same message, with the
    RNGs seeded identically from public values before each call, gets different noise (and
    the caller's RNG state is given back)."""
    app = NoisyApp()
    mod = make_gradient_coding_mod()
    context = _context(**{"dp-key-file": key_file, **node_config})
    replies = []
    for _ in range(2):
        np.random.seed(123)  # noqa: NPY002 - what a mod seeding from public values does
        reply = mod(_plain_train("sample"), context, app)
        assert not reply.has_error()
        replies.append(reply.content["arrays"]["w"].numpy())
        assert np.random.random() == np.random.RandomState(123).random()  # noqa: NPY002
    assert not np.allclose(replies[0], replies[1])
    # no policy: the app's own seeding is left alone (reproducible runs)
    plain = []
    for _ in range(2):
        np.random.seed(123)  # noqa: NPY002
        plain.append(mod(_plain_train("sample"), _context(), app).content["arrays"]["w"].numpy())
    np.testing.assert_array_equal(plain[0], plain[1])
