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


@pytest.mark.parametrize("code,s", [("grouped-rs", 2), ("crc", 2)])
def test_verify_is_refused_for_codes_whose_blocks_are_not_repetition_groups(code, s):
    """Before, a blind forger was located inside Reed-Solomon / cyclic blocks by single
    exclusion; ``s`` colluders could make that exclusion name an honest node, so such
    placements are refused (test_integrity_coalitions has the attack)."""
    with pytest.raises(ValueError, match="repetition group"):
        GradientCoding(FedAvg(fraction_evaluate=0.0), code=code, s=s, verify=True)


@pytest.mark.parametrize("target", [0, 1])
def test_blind_sparse_forger_is_never_applied_as_verified(tmp_path, target):
    """FRC s = 1: the forger's group and the down node's group are left out; the third
    group settles, but its weight alone (1/3) is below max_decode_error: nothing applied,
    never the forgery."""
    result, rows = _run(tmp_path, lambda i: [_forger(target)], "frc", 1)
    assert all(r["decode"] == "skipped" for r in rows), rows
    np.testing.assert_array_equal(result.arrays.to_numpy_ndarrays()[0], np.zeros(SHAPE))
    assert all(r["quarantined"] == [] for r in rows)  # nobody can be blamed


def test_size_forger_under_verify_with_s1_is_the_only_node_quarantined(tmp_path):
    """A node whose every reply is rejected for partition sizes that contradict its
    num-examples is quarantined after two offences (provable from its own replies). With node
    4 down the cohort of 5 falls back to grouped-rs, whose Reed-Solomon block is never
    settled, and the forger's twin alone cannot be cross-checked: nothing is applied, and no
    honest node is blamed (test_integrity_coalitions: s = 1 liveness on a cohort FRC takes)."""
    _, rows = _run(tmp_path, lambda i: [_sizes(1, 0.0)], "frc", 1, rounds=4)
    assert all(r["rejected"] >= 1 for r in rows[:2]), rows
    forger = {rows[0]["nodes"]["rejected"][0]}
    assert {n for r in rows for n in r["quarantined"]} == forger
    assert all(r["decode"] == "skipped" for r in rows)


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


def test_one_forger_with_s1_quarantines_nobody(tmp_path):
    """FRC, s = 1, verify=True: a forger and its honest twin cannot be told apart, so neither
    is blamed (before, crc quarantined every node involved, honest ones included, and FRC
    quarantined both twins)."""
    _, rows = _run(tmp_path, lambda i: [_forger(1)], "frc", 1, rounds=4)
    assert all(r["decode"] in ("skipped", "exact", "approx") for r in rows)
    assert all(r["quarantined"] == [] for r in rows), [r["quarantined"] for r in rows]
