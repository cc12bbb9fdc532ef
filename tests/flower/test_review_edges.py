"""Reviewer's edge checks: an outer client mod forging the coded reply or its partition sizes,
with one node down from round 1 (its app raises), under ``verify=True``.

The expected model is the example-weighted average of every partition's update (the down
node's partition is computed by its replicas), computed here with numpy.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg

from fl_gradcode.flower import GradientCoding, gradient_coding_mod
from fl_gradcode.flower.testing import InProcessGrid

N, DOWN, SHAPE = 6, 4, (20, 50)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _app(mods):
    app = ClientApp(mods=mods)

    @app.train()
    def train(msg, context):
        pid = context.node_config["partition-id"]
        nd = msg.content["arrays"].to_numpy_ndarrays()
        model = [m + (pid + 1.0) for m in nd]  # deterministic: partition j adds j + 1
        return Message(RecordDict({
            "arrays": ArrayRecord(model),
            "metrics": MetricRecord({"num-examples": 10 + 3 * pid}),
        }), reply_to=msg)

    return app


def _down(msg, context):
    raise RuntimeError("node down")


def _forger(target, coords=5, factor=1e3):
    def mod(msg, context, call_next):
        reply = call_next(msg, context)
        rec = reply.content.array_records.get("gradient-coding") if reply.has_content() else None
        if context.node_config["partition-id"] != target or rec is None:
            return reply
        new = {}
        for key in rec.keys():
            a = rec[key].numpy().copy()
            a.reshape(-1)[np.arange(coords) * 97 % a.size] *= factor
            new[key] = Array(a)
        reply.content["gradient-coding"] = ArrayRecord(new)
        return reply
    return mod


def _sizes(target, value):
    def mod(msg, context, call_next):
        reply = call_next(msg, context)
        records = reply.content.metric_records if reply.has_content() else {}
        meta = records.get("gradient-coding-meta")
        if context.node_config["partition-id"] == target and meta is not None:
            meta["partition-sizes"] = [float(value)] * len(list(meta["partition-sizes"]))
        return reply
    return mod


def _run(tmp_path, outer, code, s, rounds=3):
    apps = [_down if i == DOWN else _app([*outer(i), gradient_coding_mod]) for i in range(N)]
    grid = InProcessGrid(None, N, apps=apps)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = GradientCoding(
            FedAvg(fraction_evaluate=0.0), code=code, s=s, seed=0, timing="virtual",
            verify=True, warmup_timeout=2, results_dir=str(tmp_path),
        ).start(grid=grid, initial_arrays=ArrayRecord([np.zeros(SHAPE)]), num_rounds=rounds,
                timeout=5)
    rows = [json.loads(x) for x in (tmp_path / "rounds.jsonl").read_text().splitlines()]
    return result, rows


def _oracle(rounds):
    # every partition, the down node's included: its replicas compute it
    parts = list(range(N))
    w = np.array([10 + 3 * j for j in parts], float)
    step = float(np.dot(w, [j + 1.0 for j in parts]) / w.sum())
    return np.full(SHAPE, rounds * step)


# crc: s=3, since the down node's partition stays in the code (a placeholder worker, one of
# the s stragglers): with s=2 the five replies detect the forger but cannot tell it apart, and
# every round is skipped (never applied)
@pytest.mark.parametrize("code,s", [("grouped-rs", 2), ("crc", 3)])
@pytest.mark.parametrize("target", [0, 1])
def test_blind_sparse_forger_is_never_applied_as_verified(tmp_path, code, s, target):
    result, rows = _run(tmp_path, lambda i: [_forger(target)], code, s)
    model = result.arrays.to_numpy_ndarrays()[0] if len(result.arrays) else None
    applied = [r for r in rows if r["decode"] != "skipped"]
    expected = _oracle(len(applied))
    assert applied, rows  # s=2 locates one forger: rounds go on
    assert model is not None
    np.testing.assert_allclose(model, expected, rtol=1e-12)


@pytest.mark.xfail(strict=True, reason="the size forger is quarantined (an offence) but its "
                   "FRC twin's reply alone cannot be cross-checked, so verify=True still "
                   "skips the rounds; dropping unverifiable replies and decoding "
                   "approximately from the checked ones is not built")
def test_size_forger_under_verify_with_s1_does_not_stall_the_run(tmp_path):
    """A node whose every reply is rejected for partition sizes that contradict its
    num-examples is quarantined after two offences; the round is then coded without it (its
    FRC twin no longer needs a second replica), so rounds decode again instead of being
    skipped for ever (verify=True, s=1)."""
    _, rows = _run(tmp_path, lambda i: [_sizes(1, 0.0)], "frc", 1, rounds=4)
    assert all(r["rejected"] >= 1 for r in rows[:2]), rows
    assert any(r["decode"] != "skipped" for r in rows), [r["decode"] for r in rows]


def test_a_run_in_which_no_round_applies_an_update_returns_the_initial_model(tmp_path, caplog):
    """Every node's app fails: every round is skipped. Flower's Result would hold an empty
    model (a caller flattening it fails); the wrapper returns the initial model, with a
    warning."""
    import logging

    apps = [_down] * N
    grid = InProcessGrid(None, N, apps=apps)
    initial = ArrayRecord([np.full(SHAPE, 3.0)])
    with warnings.catch_warnings(), caplog.at_level(logging.WARNING, logger="flwr"):
        warnings.simplefilter("ignore")
        result = GradientCoding(
            FedAvg(fraction_evaluate=0.0), code="grouped-rs", s=1, seed=0, timing="virtual",
            warmup_timeout=2, results_dir=str(tmp_path),
        ).start(grid=grid, initial_arrays=initial, num_rounds=2, timeout=5)
    rows = [json.loads(x) for x in (tmp_path / "rounds.jsonl").read_text().splitlines()]
    assert [r["decode"] for r in rows] == ["skipped", "skipped"]
    np.testing.assert_array_equal(result.arrays.to_numpy_ndarrays()[0], np.full(SHAPE, 3.0))
    assert any("the returned model is the initial one" in r.getMessage() for r in caplog.records)


def test_one_forger_in_a_cyclic_code_with_s1_does_not_quarantine_the_cohort(tmp_path):
    """crc, s = 1, verify=True: one forger makes a contradiction over the code's whole block
    that no single exclusion explains. That locates nobody: before, every node involved (the
    whole cohort, honest ones included) was quarantined and nothing was sent for rounds."""
    _, rows = _run(tmp_path, lambda i: [_forger(1)], "crc", 1, rounds=4)
    assert all(r["decode"] in ("skipped", "exact", "approx") for r in rows)
    assert all(len(r["quarantined"]) <= 2 for r in rows), [r["quarantined"] for r in rows]
