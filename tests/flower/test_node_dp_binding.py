"""The keyed noise binds what a replica computes from: a server that sends two replicas of one
partition, under one (nonce, round), inputs an app reads differently gets independent noise,
which does not cancel when it subtracts their releases (expected values from the app's formula
in numpy, never from the mod)."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from fl_gradcode.flower import protocol
from fl_gradcode.flower.mod import make_gradient_coding_mod
from tests.flower.test_node_dp_policy import DIM, LR, _context, _inst, _n, _target

pytestmark = pytest.mark.filterwarnings("ignore:gradient_coding_mod:UserWarning")


@pytest.mark.parametrize("dp", ["partition", "sample"])
def test_replicas_sent_the_arrays_in_another_order_share_no_noise_across_names(key_file, dp):
    """Replicas of one partition under one (nonce, round), sent the same model with its arrays
    in another order. The binding read the arrays by sorted name, so both drew one keyed noise
    vector, which the release laid out in the received order: the difference of array a in
    one release and array b in the other was noise-free (a - b of the private update), and an
    app reading arrays by position computed under the same noise from another model. Now the
    received order is bound: the replicas' noise is independent."""
    targets = {"a": _target(1), "b": 2.0 - _target(1)}

    def app(msg, ctx):  # reads the arrays by name
        out = {name: msg.content["arrays"][name].numpy() + LR * (
            targets[name] - msg.content["arrays"][name].numpy()) for name in targets}
        if dp == "sample":  # its own noise from numpy's global RNG, seeded by the mod
            out = {name: value + 5.0 * np.random.standard_normal(DIM)  # noqa: NPY002
                   for name, value in out.items()}
        return Message(RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in out.items()}),
                                   "metrics": MetricRecord({"num-examples": _n(1)})}),
                       reply_to=msg)

    node = {"dp-key-file": key_file, "dp-required": dp, "partition-id": 1}
    instruction = _inst(dp=dp, noise_multiplier=5.0, clip_norm=1e6)

    def release(order, node_id):
        content = RecordDict({"arrays": ArrayRecord({k: Array(np.zeros(DIM)) for k in order}),
                              "config": ConfigRecord({"lr": LR, "noise-multiplier": 5.0,
                                                      "clip-norm": 1e6})})
        message = protocol.instruction_message(content, instruction, 7, "1")
        reply = make_gradient_coding_mod()(message, _context(node_id, **node), app)
        assert not reply.has_error(), reply.error.reason
        return {k: v.numpy() for k, v in reply.content[protocol.PROTOCOL_KEY].items()}

    first, second = release(["a", "b"], 101), release(["b", "a"], 102)
    private = {name: LR * targets[name] * _n(1) for name in targets}
    for x in targets:
        for y in targets:
            residue = (first[x] - second[y]) - (private[x] - private[y])
            assert np.std(residue) > 1.0, (x, y)


def test_what_the_app_may_read_beside_the_array_values_is_bound():
    """Besides the arrays (values, precision, order), an app may read which record comes
    first, its config by position, an extra (even empty) record, and the message's group id
    (Flower's senders set it to the round; an app may schedule its step by it): two replicas
    sent one partition under one (nonce, round) with any of these changed computed otherwise
    under the same keyed noise. Each now binds another seed; the same inputs bind the same."""
    from fl_gradcode.flower.binding import bound_nonce as bind

    instruction = _inst(dp="partition", noise_multiplier=5.0)
    a, b = ArrayRecord({"w": Array(np.zeros(DIM))}), ArrayRecord({"w": Array(np.ones(DIM))})

    def cfg(*items):
        return ConfigRecord(dict(items))

    base = RecordDict({"arrays": a, "config": cfg(("lr", 0.1), ("mu", 0.0))})
    same = RecordDict({"arrays": a, "config": cfg(("lr", 0.1), ("mu", 0.0))})
    changed = {
        "record order": RecordDict({"config": cfg(("lr", 0.1), ("mu", 0.0)), "arrays": a}),
        "config order": RecordDict({"arrays": a, "config": cfg(("mu", 0.0), ("lr", 0.1))}),
        "an empty array record": RecordDict({"arrays": a, "config": cfg(("lr", 0.1),
                                                                        ("mu", 0.0)),
                                             "z": ArrayRecord()}),
        "another array record first": RecordDict({"prev": b, "arrays": a,
                                                  "config": cfg(("lr", 0.1), ("mu", 0.0))}),
    }
    nonce = bind(instruction, base)
    assert bind(instruction, same) == nonce
    assert bind(instruction, base, group_id=str(instruction.round)) == nonce
    for what, content in changed.items():
        assert bind(instruction, content) != nonce, what
    assert bind(instruction, base, group_id="2") != nonce
