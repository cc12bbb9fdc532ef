"""Inner strategies that would compute something else from the one decoded reply coding hands
them are refused, with what to do, instead of training another model silently: a FedAvg
subclass filtering replies in a hook ``FedAvg.aggregate_train`` calls, an ``aggregate_train``
override selecting replies by a metric the app reports or summarising replies itself, and a
``configure_train`` that sends nodes different contents. Through the public API on
``InProcessGrid``; the plain strategy on the same app is the reference where one is run."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp.strategy import FedAdam, FedAvg

import tests.apps.numpy_app as numpy_app
from fl_gradcode.flower import GradientCoding, gradient_coding_mod
from fl_gradcode.flower.testing import InProcessGrid
from tests.apps.numpy_app import make_app

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

N = 6


def _loss_app():
    """The numpy app, also reporting a train loss that differs by partition."""

    def train(msg, context):
        reply = numpy_app.train(msg, context)
        reply.content["metrics"]["train-loss"] = 100.0 * (
            1 + int(context.node_config["partition-id"]))
        return reply

    from flwr.clientapp import ClientApp

    app = ClientApp(mods=[gradient_coding_mod])
    app.train()(train)
    app.evaluate()(numpy_app.evaluate)
    return app


def _run(inner, app=None, rounds: int = 1):
    strategy = GradientCoding(inner, code="frc", s=1, seed=0)
    return strategy.start(grid=InProcessGrid(app or _loss_app(), N),
                          initial_arrays=numpy_app.initial_arrays(),
                          num_rounds=rounds, train_config=ConfigRecord({"lr": numpy_app.LR}))


class DropInHook(FedAvg):
    """Drops, in a hook FedAvg.aggregate_train calls, the replies whose loss is high."""

    def _check_and_log_replies(self, replies, is_train, *args, **kwargs):
        valid, errors = super()._check_and_log_replies(replies, is_train, *args, **kwargs)
        return [m for m in valid if m.content["metrics"].get("train-loss", 0) < 350], errors


class DropInOverride(FedAvg):
    def aggregate_train(self, server_round, replies):
        kept = [m for m in replies if m.content["metrics"].get("train-loss", 0) < 350]
        return super().aggregate_train(server_round, kept)


class MaxLossMetric(FedAvg):
    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        arrays, metrics = super().aggregate_train(server_round, replies)
        metrics["max-loss"] = max(m.content["metrics"].get("train-loss", 0) for m in replies)
        return arrays, metrics


def test_a_hook_of_flowers_aggregation_overridden_is_refused_at_construction():
    with pytest.raises(ValueError, match="DropInHook overrides _check_and_log_replies"):
        GradientCoding(DropInHook(), code="frc", s=1)
    # FedAdam's aggregation calls hooks too; its plain class composes
    GradientCoding(FedAdam(), code="frc", s=1)


@pytest.mark.parametrize("inner, says", [
    (DropInOverride, "returns no model for one reply"),
    (MaxLossMetric, "returns other metrics for four replies"),
])
def test_an_aggregation_reading_the_apps_metrics_per_reply_is_refused(inner, says):
    """The plain strategy filters (or summarises) by the app's metric: run as is, coding
    would hand it the decoded average and train (or report) something else."""
    with pytest.raises(ValueError, match=says):
        _run(inner(fraction_evaluate=0.0))


def test_a_subclass_that_only_logs_still_composes_and_equals_plain_fedavg():
    class Logging(FedAvg):
        def aggregate_train(self, server_round, replies):
            return super().aggregate_train(server_round, list(replies))

    coded = _run(Logging(fraction_evaluate=0.0))
    plain = FedAvg(fraction_evaluate=0.0).start(
        grid=InProcessGrid(make_app(), N), initial_arrays=numpy_app.initial_arrays(),
        num_rounds=1, train_config=ConfigRecord({"lr": numpy_app.LR}))
    np.testing.assert_allclose(numpy_app.flat(numpy_app.as_dict(coded.arrays)),
                               numpy_app.flat(numpy_app.as_dict(plain.arrays)), atol=1e-12)


class PerNodeLR(FedAvg):
    def configure_train(self, server_round, arrays, config, grid):
        out = []
        for i, msg in enumerate(super().configure_train(server_round, arrays, config, grid)):
            content = RecordDict({"arrays": msg.content["arrays"],
                                  "config": ConfigRecord({"lr": 0.1 * (i + 1)})})
            out.append(Message(content, dst_node_id=msg.metadata.dst_node_id,
                               message_type=msg.metadata.message_type))
        return out


def test_per_node_train_contents_are_refused_naming_the_key():
    """Replicas of a partition would train it under different settings: every round was
    skipped as 'replies disagree', a faulty client's symptom."""
    with pytest.raises(ValueError, match=r"different train contents \('config' keys \['lr'\]"):
        _run(PerNodeLR(fraction_evaluate=0.0))


def test_server_optimizer_variants_and_timing_metrics_still_compose():
    """Not refused: a FedAdam variant overriding its step on the averaged arrays
    (``_compute_deltat_and_mt`` is handed the average, not the replies), and a FedAvg adding a
    metric that differs between any two calls (its aggregation's wall time)."""
    import time

    class AMSGradLike(FedAdam):
        def _compute_deltat_and_mt(self, aggregated_arrayrecord):
            return super()._compute_deltat_and_mt(aggregated_arrayrecord)

    class Timed(FedAvg):
        def aggregate_train(self, server_round, replies):
            start = time.perf_counter()
            arrays, metrics = super().aggregate_train(server_round, replies)
            metrics["aggregate-s"] = time.perf_counter() - start
            return arrays, metrics

    _run(AMSGradLike(fraction_evaluate=0.0))
    result = _run(Timed(fraction_evaluate=0.0))
    assert result.arrays is not None
