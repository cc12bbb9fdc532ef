"""The composition contract of ``GradientCoding`` with Flower: every strategy, DP wrapper, mod
and workflow is exact or refused with an error that says what to do.

Runs real ClientApps in-process (``InProcessGrid``) with the tiny numpy app of
``test_wrapper``. References are independent of the code path under test: Flower's own strategy
run uncoded on the same app (no mod, no code), or the app's train handler called per partition
and averaged here (``test_wrapper.fedavg``), or clipping computed here with numpy.
"""

from __future__ import annotations

import logging
from typing import ClassVar

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message
from flwr.client.mod import secaggplus_mod
from flwr.clientapp.mod import (
    LocalDpMod,
    adaptiveclipping_mod,
    arrays_size_mod,
    fixedclipping_mod,
    message_size_mod,
)
from flwr.serverapp.strategy import (
    Bulyan,
    DifferentialPrivacyClientSideAdaptiveClipping,
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideAdaptiveClipping,
    DifferentialPrivacyServerSideFixedClipping,
    FedAdagrad,
    FedAdam,
    FedAvg,
    FedAvgM,
    FedMedian,
    FedProx,
    FedTrimmedAvg,
    FedXgbBagging,
    FedXgbCyclic,
    FedYogi,
    Krum,
    MultiKrum,
    QFedAvg,
    Strategy,
)

from fl_gradcode.flower import GradientCoding, compat, gradient_coding_mod
from fl_gradcode.flower import protocol as proto
from fl_gradcode.flower.compat import CompositionError, explain_error_reply
from fl_gradcode.flower.testing import InProcessGrid
from fl_gradcode.privacy import DPConfig
from tests.apps.numpy_app import (
    LR,
    as_dict,
    assert_model,
    call_app,
    fedavg,
    flat,
    initial_arrays,
    make_app,
    num_examples,
    pytestmark,  # noqa: F401 (the warning filter applies here)
    theta0,
)
from tests.doubles import CheckpointingFedAvg, MedianFedAvg, MomentumInPlace, PassThrough
from tests.flower.harness import fault_mod

N = 6
FAULTS = {(1, 1): "error", (1, 2): "error"}  # worker 1 fails in both rounds (FRC s=1: exact)


def coded_run(inner: Strategy, *, rounds: int = 2, mods=None, train_config=None, **options):
    mods = mods if mods is not None else [fault_mod(FAULTS), gradient_coding_mod]
    grid = InProcessGrid(make_app(*mods), N)
    strategy = GradientCoding(inner, code="frc", s=1, seed=0, measured_compute=False, **options)
    result = strategy.start(
        grid=grid, initial_arrays=initial_arrays(), num_rounds=rounds,
        train_config=train_config or ConfigRecord({"lr": LR}),
    )
    return strategy, as_dict(result.arrays)


def uncoded_run(inner: Strategy, *, rounds: int = 2) -> dict[str, np.ndarray]:
    """Flower's own strategy on the plain app (no mod, no code, every node answers)."""
    grid = InProcessGrid(make_app(), N)
    result = inner.start(grid=grid, initial_arrays=initial_arrays(), num_rounds=rounds,
                         train_config=ConfigRecord({"lr": LR}))
    return as_dict(result.arrays)


# ================================================================ strategies that compose
AVERAGING = {
    "FedAvg": lambda: FedAvg(fraction_evaluate=0.0),
    "FedProx": lambda: FedProx(fraction_evaluate=0.0, proximal_mu=0.1),
    "FedAvgM": lambda: FedAvgM(fraction_evaluate=0.0, server_learning_rate=0.7,
                               server_momentum=0.5),
    "FedAdam": lambda: FedAdam(fraction_evaluate=0.0, eta=0.05),
    "FedYogi": lambda: FedYogi(fraction_evaluate=0.0, eta=0.05),
    "FedAdagrad": lambda: FedAdagrad(fraction_evaluate=0.0, eta=0.05),
}


@pytest.mark.parametrize("name", list(AVERAGING))
def test_averaging_and_server_optimizer_strategies_coded_equal_uncoded(name):
    """Two rounds with a failing worker each round: coded == Flower's uncoded run."""
    expected = uncoded_run(AVERAGING[name]())
    strategy, got = coded_run(AVERAGING[name]())
    assert [row["decode"] for row in strategy.history] == ["exact", "exact"]
    assert np.linalg.norm(flat(got) - flat(theta0())) > 1e-2  # the model moved
    np.testing.assert_allclose(flat(got), flat(expected), rtol=1e-7, atol=1e-9)


class LoggingFedAvg(FedAvg):
    """A user subclass overriding aggregate_train without changing what it computes;
    ``rounds`` lists the round of every call on any instance (copies included)."""

    rounds: ClassVar[list[int]] = []

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.calls = 0

    def aggregate_train(self, server_round, replies):
        self.calls += 1
        LoggingFedAvg.rounds.append(server_round)
        return super().aggregate_train(server_round, replies)


def test_unknown_averaging_subclass_passes_the_one_time_check_and_is_exact(monkeypatch):
    monkeypatch.setattr(LoggingFedAvg, "rounds", [])
    inner = LoggingFedAvg(fraction_evaluate=0.0)
    _, got = coded_run(inner)
    assert_model(got, fedavg(fedavg(theta0(), range(N), N), range(N), N))
    # the check ran on copies: the user's strategy saw one call per round
    assert inner.calls == 2
    # ... and only in round 1: round 2 called the class once (the user's strategy only)
    assert LoggingFedAvg.rounds.count(1) > 1 and LoggingFedAvg.rounds.count(2) == 1


def test_inner_state_changed_in_place_sees_only_the_real_rounds():
    """The one-time check runs on copies: a strategy's in-place state (a momentum buffer, a
    list of rounds) holds the two real aggregations only, of the decoded FedAvg models."""
    inner = MomentumInPlace(theta0(), fraction_evaluate=0.0)
    strategy, got = coded_run(inner)
    first = fedavg(theta0(), range(N), N)
    second = fedavg(first, range(N), N)
    assert [row["decode"] for row in strategy.history] == ["exact", "exact"]
    assert_model(got, second)
    assert inner.rounds == [1, 2]
    assert_model(inner.velocity, {k: 0.5 * first[k] + second[k] for k in first})


# ================================================================ per-client aggregators
PER_CLIENT = {
    "Krum": lambda: Krum(),
    "MultiKrum": lambda: MultiKrum(),
    "Bulyan": lambda: Bulyan(),
    "FedMedian": lambda: FedMedian(),
    "FedTrimmedAvg": lambda: FedTrimmedAvg(),
    "FedXgbBagging": lambda: FedXgbBagging(),
    "FedXgbCyclic": lambda: FedXgbCyclic(),
    "QFedAvg": lambda: QFedAvg(client_learning_rate=0.1),
}


class MyKrum(Krum):
    """A subclass of a refused strategy is refused too."""


@pytest.mark.parametrize("name", [*PER_CLIENT, "Krum subclass", "wrapped FedMedian"])
def test_per_client_aggregators_are_refused_at_construction_naming_verify(name):
    if name == "Krum subclass":
        inner, named = MyKrum(), "MyKrum"
    elif name == "wrapped FedMedian":  # inside a user's pass-through wrapper
        inner, named = PassThrough(FedMedian()), "FedMedian"
    else:
        inner, named = PER_CLIENT[name](), name
    with pytest.raises(ValueError, match="ONE reply") as info:
        GradientCoding(inner, code="frc", s=1)
    assert "verify=True" in str(info.value)
    assert named in str(info.value)


def test_unknown_per_client_aggregator_is_refused_at_the_first_aggregation():
    with pytest.raises(ValueError, match="does not depend on the replies only through"):
        coded_run(MedianFedAvg(fraction_evaluate=0.0), rounds=1)


class NothingForOne(FedAvg):
    """Needs more than one reply (as Bulyan does): nothing for a single one."""

    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        return (None, None) if len(replies) < 3 else super().aggregate_train(server_round,
                                                                             replies)


def test_unknown_strategy_returning_nothing_for_one_reply_is_refused():
    with pytest.raises(ValueError, match="no model for one reply"):
        coded_run(NothingForOne(fraction_evaluate=0.0), rounds=1)


def test_gradient_coding_inside_gradient_coding_is_refused():
    with pytest.raises(TypeError, match="code it again"):
        GradientCoding(GradientCoding(FedAvg()), code="frc", s=1)


# ================================================================ DP strategy wrappers
DP_WRAPPERS = {
    "ServerSideFixed": DifferentialPrivacyServerSideFixedClipping,
    "ClientSideFixed": DifferentialPrivacyClientSideFixedClipping,
    "ServerSideAdaptive": DifferentialPrivacyServerSideAdaptiveClipping,
    "ClientSideAdaptive": DifferentialPrivacyClientSideAdaptiveClipping,
}


def _dp(name: str, inner: Strategy) -> Strategy:
    cls = DP_WRAPPERS[name]
    if "Adaptive" in name:
        return cls(inner, noise_multiplier=1.0, num_sampled_clients=N, initial_clipping_norm=1.0,
                   clipped_count_stddev=1.0)
    return cls(inner, noise_multiplier=1.0, clipping_norm=1.0, num_sampled_clients=N)


#: Why each refused wrapper is refused inside (ClientSideFixed is exact inside: its test is in
#: test_mod_order.py)
DP_INSIDE_REASONS = {
    "ServerSideFixed": "would clip the decoded average once",
    "ServerSideAdaptive": "would clip the decoded average once",
    "ClientSideAdaptive": "would adapt its clipping norm from the fraction of replies",
}


@pytest.mark.parametrize("name", list(DP_INSIDE_REASONS))
def test_flower_dp_wrapper_inside_gradient_coding_is_refused_with_the_recipes(name):
    with pytest.raises(TypeError, match=DP_INSIDE_REASONS[name]) as info:
        GradientCoding(_dp(name, FedAvg()), code="frc", s=1)
    text = str(info.value)
    assert "ClientApp(mods=[gradient_coding_mod, fixedclipping_mod])" in text
    assert "DPConfig(mode='central'" in text


@pytest.mark.parametrize("name", [n for n in DP_WRAPPERS if n != "ClientSideFixed"])
def test_flower_dp_wrapper_outside_gradient_coding_is_refused_before_any_round(name):
    grid = InProcessGrid(make_app(gradient_coding_mod), N)
    coded = GradientCoding(FedAvg(fraction_evaluate=0.0), code="frc", s=1,
                           measured_compute=False)
    outer = _dp(name, coded)
    with pytest.raises(CompositionError, match="no DP guarantee") as info:
        outer.start(grid=coded.wrap_grid(grid), initial_arrays=initial_arrays(), num_rounds=1,
                    train_config=ConfigRecord({"lr": LR}))
    assert type(outer).__name__ in str(info.value)
    assert "fixedclipping_mod" in str(info.value)
    assert coded.history == []  # refused before a round was decoded


def test_outer_server_side_clipping_is_caught_by_the_reply_check_too(monkeypatch):
    """Even when the caller is not recognised, the clipped replies (which the decoder would
    ignore: it decodes what it cached on arrival) are detected."""
    monkeypatch.setattr(compat, "check_caller", lambda *args, **kwargs: None)
    grid = InProcessGrid(make_app(gradient_coding_mod), N)
    coded = GradientCoding(FedAvg(fraction_evaluate=0.0), code="frc", s=1,
                           measured_compute=False)
    outer = _dp("ServerSideFixed", coded)
    with pytest.raises(CompositionError, match="modified after GradientCoding cached it") as info:
        outer.start(grid=coded.wrap_grid(grid), initial_arrays=initial_arrays(), num_rounds=1,
                    train_config=ConfigRecord({"lr": LR}))
    assert "DifferentialPrivacyServerSideFixedClipping" in str(info.value)


class ClippingOuter(PassThrough):
    """An outer wrapper that rewrites replies in aggregate_train (as a server-side clipper),
    in one of three ways."""

    def __init__(self, inner: Strategy, how: str):
        super().__init__(inner)
        self.how = how

    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        for reply in replies:
            for key, record in list(reply.content.array_records.items()):
                halved = {k: Array(0.5 * v.numpy()) for k, v in record.items()}
                if self.how == "record":  # a new ArrayRecord under the same key
                    reply.content[key] = ArrayRecord(halved)
                elif self.how == "array":  # new Arrays inside the same ArrayRecord
                    for k, v in halved.items():
                        record[k] = v
                else:  # the same Array objects, their bytes replaced
                    for k, v in halved.items():
                        record[k].data = v.data
        return self.inner.aggregate_train(server_round, replies)


@pytest.mark.parametrize("how", ["record", "array", "bytes"])
def test_reply_modified_after_caching_by_an_outer_wrapper_is_detected_and_named(how):
    grid = InProcessGrid(make_app(gradient_coding_mod), N)
    coded = GradientCoding(FedAvg(fraction_evaluate=0.0), code="frc", s=1,
                           measured_compute=False)
    with pytest.raises(CompositionError, match="modified after GradientCoding cached it") as info:
        ClippingOuter(coded, how).start(grid=coded.wrap_grid(grid),
                                        initial_arrays=initial_arrays(), num_rounds=1,
                                        train_config=ConfigRecord({"lr": LR}))
    assert "ClippingOuter" in str(info.value)


class FilteringOuter(PassThrough):
    """An outer wrapper that drops a reply before the inner aggregation (a client filter)."""

    def aggregate_train(self, server_round, replies):
        return self.inner.aggregate_train(server_round, list(replies)[1:])


def test_reply_removed_by_an_outer_wrapper_after_caching_is_detected():
    grid = InProcessGrid(make_app(gradient_coding_mod), N)
    coded = GradientCoding(FedAvg(fraction_evaluate=0.0), code="frc", s=1,
                           measured_compute=False)
    with pytest.raises(CompositionError, match="removed before its aggregate_train") as info:
        FilteringOuter(coded).start(grid=coded.wrap_grid(grid), initial_arrays=initial_arrays(),
                                    num_rounds=1, train_config=ConfigRecord({"lr": LR}))
    assert "FilteringOuter" in str(info.value)


def test_metrics_modified_in_place_after_caching_are_detected():
    grid = InProcessGrid(make_app(gradient_coding_mod), N)
    coded = GradientCoding(FedAvg(fraction_evaluate=0.0), code="frc", s=1,
                           measured_compute=False)
    wrapped = coded.wrap_grid(grid)
    msgs = list(coded.configure_train(1, initial_arrays(), ConfigRecord({"lr": LR}), wrapped))
    replies = wrapped.send_and_receive(msgs, timeout=60)
    meta = replies[2].content.metric_records[proto.PROTOCOL_KEY + "-meta"]
    meta["num-examples"] = 0.0  # in place: the record object is the same
    with pytest.raises(CompositionError, match="modified after"):
        coded.aggregate_train(1, replies)


def test_a_pass_through_outer_wrapper_still_composes_exactly():
    grid = InProcessGrid(make_app(gradient_coding_mod), N)
    coded = GradientCoding(FedAvg(fraction_evaluate=0.0), code="frc", s=1,
                           measured_compute=False)
    result = PassThrough(coded).start(grid=coded.wrap_grid(grid), initial_arrays=initial_arrays(),
                                      num_rounds=1, train_config=ConfigRecord({"lr": LR}))
    assert_model(as_dict(result.arrays), fedavg(theta0(), range(N), N))


# ================================================================ client mods
CLIP = 0.5


def clipped_fedavg(theta, partitions, num_parts, clip):
    """``theta + sum_j n_j clip(theta_j - theta) / sum_j n_j``, clipping by the global L2 norm
    of the update (Flower's ``compute_clip_model_update``), computed here."""
    total, count = {k: np.zeros_like(v) for k, v in theta.items()}, 0.0
    for j in partitions:
        theta_j, n_j, _ = call_app(theta, j, num_parts)
        delta = {k: theta_j[k] - theta[k] for k in theta}
        norm = np.sqrt(sum(float(np.sum(d**2)) for d in delta.values()))
        factor = min(1.0, clip / norm)
        for k in theta:
            total[k] += n_j * factor * delta[k]
        count += n_j
    return {k: theta[k] + total[k] / count for k in theta}


@pytest.mark.parametrize("mod", [fixedclipping_mod, adaptiveclipping_mod],
                         ids=["fixedclipping_mod", "adaptiveclipping_mod"])
def test_clipping_mod_inside_gradient_coding_mod_clips_each_partition_before_coding(mod):
    config = ConfigRecord({"lr": LR, "clipping_norm": CLIP})
    expected = clipped_fedavg(theta0(), range(N), N, CLIP)
    unclipped = fedavg(theta0(), range(N), N)
    assert np.linalg.norm(flat(expected) - flat(unclipped)) > 1e-2  # clipping is active
    strategy, got = coded_run(FedAvg(fraction_evaluate=0.0), rounds=1, train_config=config,
                              mods=[fault_mod(FAULTS), gradient_coding_mod, mod])
    assert strategy.history[0]["decode"] == "exact"
    assert_model(got, expected)


def test_fixedclipping_inside_with_central_noise_is_calibrated_to_the_decoded_average():
    """The recipe: fixedclipping_mod inside, noise from dp=DPConfig(mode='central'): the
    noise std on the decoded average is sigma * C * max_j n_j / sum_j n_j."""
    sigma = 0.8
    config = ConfigRecord({"lr": LR, "clipping_norm": CLIP})
    strategy, _ = coded_run(
        FedAvg(fraction_evaluate=0.0), rounds=1, train_config=config,
        mods=[gradient_coding_mod, fixedclipping_mod],
        dp=DPConfig(mode="central", clip_norm=CLIP, noise_multiplier=sigma),
    )
    sizes = [num_examples(j) for j in range(N)]
    assert strategy.history[0]["central_noise_std"] == pytest.approx(
        sigma * CLIP * max(sizes) / sum(sizes), rel=1e-12)


def _handshake_reply(app) -> Message:
    grid = InProcessGrid(app, 1)
    msg = proto.instruction_message(
        proto.RecordDict(), proto.Instruction(op=proto.OP_IDENTIFY), grid.node_ids[0], "identify")
    (reply,) = grid.send_and_receive([msg], timeout=30)
    return reply


@pytest.mark.parametrize("mod", [fixedclipping_mod, adaptiveclipping_mod],
                         ids=["fixedclipping_mod", "adaptiveclipping_mod"])
def test_clipping_mod_outside_gradient_coding_mod_is_named_as_a_mod_order_problem(mod):
    reply = _handshake_reply(make_app(mod, gradient_coding_mod))
    assert reply.has_error()  # Flower's mod refuses the protocol message
    text = explain_error_reply(reply)
    name = mod.__name__
    assert f"{name} rejected the coded message before gradient_coding_mod" in text
    assert f"ClientApp(mods=[gradient_coding_mod, {name}])" in text


@pytest.mark.parametrize("order", ["outside", "inside"])
@pytest.mark.parametrize("mod", [arrays_size_mod, message_size_mod],
                         ids=["arrays_size_mod", "message_size_mod"])
def test_logging_mods_compose_in_either_order(mod, order):
    mods = [mod, gradient_coding_mod] if order == "outside" else [gradient_coding_mod, mod]
    strategy, got = coded_run(FedAvg(fraction_evaluate=0.0), rounds=1,
                              mods=[fault_mod(FAULTS), *mods])
    assert strategy.history[0]["decode"] == "exact"
    assert_model(got, fedavg(theta0(), range(N), N))


def test_app_without_the_mod_is_not_blamed_on_mod_order():
    reply = _handshake_reply(make_app())
    text = explain_error_reply(reply)
    assert "does not run gradient_coding_mod" in text
    assert "rejected the coded message" not in text


def test_the_mods_own_error_is_reported_as_it_is():
    grid = InProcessGrid(make_app(gradient_coding_mod), 1)
    msg = proto.instruction_message(
        proto.RecordDict(), proto.Instruction(op="no-such-op"), grid.node_ids[0], "identify")
    (reply,) = grid.send_and_receive([msg], timeout=30)
    assert reply.has_error() and reply.error.code == 5400
    assert explain_error_reply(reply) == f"error reply (code 5400: {reply.error.reason})"


def _coded_replies(mods):
    grid = InProcessGrid(make_app(*mods), N)
    coded = GradientCoding(FedAvg(fraction_evaluate=0.0), code="frc", s=1,
                           measured_compute=False)
    wrapped = coded.wrap_grid(grid)
    msgs = list(coded.configure_train(1, initial_arrays(), ConfigRecord({"lr": LR}), wrapped))
    return coded, wrapped.send_and_receive(msgs, timeout=60)


def test_secaggplus_mod_is_refused_in_either_order_with_the_reason():
    outside = explain_error_reply(_handshake_reply(make_app(secaggplus_mod,
                                                             gradient_coding_mod)))
    coded, replies = _coded_replies([gradient_coding_mod, secaggplus_mod])
    assert all(reply.has_error() for reply in replies)
    inside = explain_error_reply(replies[0])
    for text in (outside, inside):
        assert "SecAggPlusWorkflow, which cannot run coded rounds" in text
        assert "remove it" in text
    arrays, _ = coded.aggregate_train(1, replies)
    assert arrays is None
    assert coded.history[0]["decode"] == "skipped" and coded.history[0]["rejected"] == N


LDP = {"clipping_norm": CLIP, "sensitivity": CLIP, "epsilon": 5.0, "delta": 1e-5}


def test_local_dp_mod_outside_gradient_coding_mod_is_named_as_a_mod_order_problem():
    text = explain_error_reply(_handshake_reply(make_app(LocalDpMod(**LDP),
                                                         gradient_coding_mod)))
    assert "LocalDpMod rejected the coded message before gradient_coding_mod" in text


def test_local_dp_mod_inside_gradient_coding_mod_noises_partitions_identically_across_replicas():
    """Each partition's update is clipped and noised once per replica from the partition's
    seed: replicas agree (verify=True settles the complete group), the group with a missing
    replica is left out whichever replica it is (two replicas cannot settle a group against
    s = 2 colluders), and the model differs from the noiseless clipped FedAvg by the
    noise."""
    models = []
    for failing in (0, 1):  # FRC s=2: worker 0 or its replica 1 fails
        grid = InProcessGrid(make_app(fault_mod({(failing, 1): "error"}), gradient_coding_mod,
                                      LocalDpMod(**LDP)), N)
        strategy = GradientCoding(FedAvg(fraction_evaluate=0.0), code="frc", s=2, seed=0,
                                  measured_compute=False, verify=True, dp_run_nonce="pinned")
        result = strategy.start(grid=grid, initial_arrays=initial_arrays(), num_rounds=1,
                                train_config=ConfigRecord({"lr": LR}))
        row = strategy.history[0]
        assert row["decode"] == "approx" and row["verified"] == "verified"
        assert sorted(row["unsettled"]) == [w for w in (0, 1, 2) if w != failing]
        models.append(flat(as_dict(result.arrays)))
    np.testing.assert_allclose(models[0], models[1], rtol=1e-12, atol=1e-12)
    noiseless = flat(clipped_fedavg(theta0(), range(N), N, CLIP))
    assert np.linalg.norm(models[0] - noiseless) > 1e-3


# ================================================================ legacy API
def test_legacy_strategy_is_refused_naming_the_message_api_strategy():
    from flwr.server.strategy import FedAvg as LegacyFedAvg

    with pytest.raises(TypeError, match=r"use flwr\.serverapp\.strategy\.FedAvg") as info:
        GradientCoding(LegacyFedAvg())
    assert "SecAgg+ reveals only the sum" in str(info.value)


def test_secaggplus_workflow_with_gradient_coding_fails_with_the_reason():
    """The fl-dp-sa example's server: LegacyContext + DefaultWorkflow(SecAggPlusWorkflow)."""
    from flwr.app import Context, RecordDict
    from flwr.server import LegacyContext, ServerConfig
    from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow

    coded = GradientCoding(FedAvg(fraction_evaluate=0.0), code="frc", s=1)
    context = LegacyContext(
        context=Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                        run_config={}),
        config=ServerConfig(num_rounds=1), strategy=coded,
    )
    workflow = DefaultWorkflow(fit_workflow=SecAggPlusWorkflow(num_shares=3,
                                                               reconstruction_threshold=2))
    with pytest.raises(AttributeError, match="not a decodable set"):
        workflow(InProcessGrid(make_app(gradient_coding_mod), N), context)
    assert not hasattr(coded, "configure_fit")  # (hasattr still works: AttributeError)


def test_legacy_server_loop_with_gradient_coding_fails_with_the_reason():
    """ServerApp(server_fn=...) returning ServerAppComponents(strategy=GradientCoding(...))
    runs Flower's legacy Server, whose first call is strategy.initialize_parameters."""
    from flwr.server import Server, SimpleClientManager

    server = Server(client_manager=SimpleClientManager(),
                    strategy=GradientCoding(FedAvg(), code="frc", s=1))
    with pytest.raises(AttributeError, match="Message-API strategy"):
        server.fit(num_rounds=1, timeout=None)


# ================================================================ the inner strategy's start
def test_inner_strategy_overriding_start_gets_a_warning_at_construction(caplog):
    with caplog.at_level(logging.WARNING, logger="flwr"):
        GradientCoding(CheckpointingFedAvg(), code="frc", s=1)
    assert any("CheckpointingFedAvg overrides start()" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="flwr"):
        GradientCoding(FedAvg(), code="frc", s=1)
    assert not any("overrides start()" in r.getMessage() for r in caplog.records)
