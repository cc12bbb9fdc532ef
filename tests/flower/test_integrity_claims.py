"""What a round says of its replies. Under ``verify=True`` the model's coordinates are
judged against the model's own size: an honest app metric in the millions (a cumulative sample
count) used to widen the tolerance on the model by as much, so one colluder's forged model was
applied as ``exact`` and ``verified``. Without ``verify`` no row claims the proof. The expected
models are numpy FedAvg (``tests.apps.numpy_app.fedavg``)."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Message, MessageType, RecordDict
from flwr.clientapp import ClientApp

import tests.apps.numpy_app as numpy_app
from fl_gradcode.flower import gradient_coding_mod
from fl_gradcode.flower.protocol import OP_TRAIN, PROTOCOL_KEY, parse_instruction
from fl_gradcode.flower.testing import InProcessGrid
from tests.apps.numpy_app import META_KEY, fedavg, flat, theta0
from tests.flower.harness import run

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

N = 6


def _app(big: float, delta: float) -> ClientApp:
    """The numpy app with one large honest metric; worker 0 adds ``delta`` to every value of
    its coded reply's ``w`` (the model part only: its count and metrics are honest)."""

    def train(msg, context):
        reply = numpy_app.train(msg, context)
        reply.content["metrics"]["samples-seen"] = big
        return reply

    def forger(msg, context, call_next):
        reply = call_next(msg, context)
        if msg.metadata.message_type != MessageType.TRAIN or delta == 0:
            return reply
        instruction = parse_instruction(msg.content)
        if instruction is None or instruction.op != OP_TRAIN or instruction.worker != 0:
            return reply
        arrays = {k: v.numpy().copy() for k, v in reply.content.array_records[PROTOCOL_KEY].items()}
        arrays["w"] += delta
        return Message(RecordDict({
            PROTOCOL_KEY: ArrayRecord({k: Array(v) for k, v in arrays.items()}),
            META_KEY: reply.content.metric_records[META_KEY]}), reply_to=msg)

    app = ClientApp(mods=[forger, gradient_coding_mod])
    app.train()(train)
    app.evaluate()(numpy_app.evaluate)
    return app


@pytest.mark.parametrize("big, delta", [(1e6, 150.0), (1e6, 1.0), (1e4, 1.0)])
def test_a_forged_model_is_not_applied_beside_a_large_metric(big, delta):
    """The model applied is numpy FedAvg over the partitions the round says it covered (all
    of them for an exact round): the forger's reply is never read into it."""
    result = run(N, code="frc", s=1, rounds=1, verify=True,
                 grid=InProcessGrid(_app(big, delta), N))
    row = result.rows[0]
    covered = [j for j in range(N) if j not in row["missing_partitions"]]
    assert (row["decode"] == "exact") == (covered == list(range(N)))
    np.testing.assert_allclose(flat(result.models[1]), flat(fedavg(theta0(), covered, N)),
                               rtol=0, atol=1e-9)


def test_honest_replies_beside_a_large_metric_stay_exact_and_verified():
    result = run(N, code="frc", s=1, rounds=2, verify=True,
                 grid=InProcessGrid(_app(1e6, 0.0), N))
    assert [r["decode"] for r in result.rows] == ["exact", "exact"]
    assert [r["verified"] for r in result.rows] == ["verified", "verified"]
    np.testing.assert_allclose(flat(result.models[1]), flat(fedavg(theta0(), range(N), N)),
                               rtol=0, atol=1e-9)


def test_without_verify_a_row_claims_no_proof():
    """verify=False still cross-checks extra replies (sampled projections, a heuristic): its
    verdict was written to ``verified``, where docs/integrity.md promises the theorem's. It is
    ``cross_check`` now; ``verified`` is null."""
    result = run(N, code="frc", s=1, rounds=2, verify=False,
                 grid=InProcessGrid(_app(1.0, 0.0), N))
    assert [r["verified"] for r in result.rows] == [None, None]
    # the replies in hand agree (not all of them checked: the round ends at a decodable set)
    assert [r["cross_check"] for r in result.rows] == ["unverified", "unverified"]
