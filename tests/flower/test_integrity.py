"""Integrity from redundancy: a reply the other replicas contradict never reaches the model.

End to end on the vector app (a scaled reply is left out, honest replies are verified, what
``verify=False`` can and cannot see), and what ``verify=True`` refuses (codes without
redundancy, approximate, chunked or non-repetition codes) with the fix its message names. The
verdicts on a round's replies are tested in ``test_integrity_verdicts.py``, the probe in
``test_integrity_probe.py``, its float64 arithmetic in ``test_integrity_float64.py``."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg

from fl_gradcode.codes import make_code
from fl_gradcode.flower import GradientCoding, gradient_coding_mod
from fl_gradcode.flower.integrity import round_probe, verify_refusal
from fl_gradcode.flower.testing import InProcessGrid
from fl_gradcode.latency import Pareto
from tests.apps.vector_app import DIM, oracle, scaling_mod, train


def run(n=6, s=2, code="frc", rounds=4, verify=True, bad=None, factor=1.5, seed=0,
        timing="virtual"):
    apps = []
    for pid in range(n):
        mods = [scaling_mod(bad, factor), gradient_coding_mod] if pid == bad else [
            gradient_coding_mod]
        app = ClientApp(mods=mods)
        app.train()(train)
        apps.append(app)
    grid = InProcessGrid(None, n, apps=apps)
    strategy = GradientCoding(FedAvg(fraction_evaluate=0.0, min_available_nodes=n), code=code,
                              s=s, latency=None if timing == "wallclock" else Pareto(1.0, 1.5),
                              seed=seed, timing=timing,
                              verify=verify, straggler_timeout=1e6, wire="float64")
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord({"w": Array(np.zeros(DIM))}),
                            num_rounds=rounds, train_config=ConfigRecord({}))
    return strategy, result.arrays["w"].numpy()


def partial_oracle(rows) -> np.ndarray:
    """Plain numpy FedAvg, each round over the data partitions the row says it used."""
    from tests.apps.vector_app import target

    theta = np.zeros(DIM)
    for row in rows:
        parts = sorted(set(row["partitions"]["used"]))
        sizes = np.array([10 + 3 * j for j in parts], dtype=float)
        theta = sizes @ np.array([theta - 0.5 * (theta - target(j)) for j in parts]) / sizes.sum()
    return theta


@pytest.mark.parametrize("bad", [0, 3, 5])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_client_scaling_its_reply_never_reaches_the_model(bad, seed):
    """FRC s = 2: one wrong reply and two agreeing ones could as well be two colluders and an
    honest node, so the group is left out (nobody blamed) and the other group decodes."""
    strategy, theta = run(bad=bad, seed=seed)
    rows = strategy.history
    assert all(r["decode"] == "approx" and r["verified"] == "verified" for r in rows)
    assert all(bad not in r["clients_used"] and bad in r["unsettled"] for r in rows)
    assert all(r["inconsistent"] == [] and r["quarantined"] == [] for r in rows)
    assert all(r["disagreement"] > 1e-3 for r in rows)
    assert all(len(set(r["partitions"]["used"])) == 3 for r in rows)
    expected = partial_oracle(rows)
    assert np.linalg.norm(theta - expected) <= 1e-9 * np.linalg.norm(expected)


def test_without_verify_extra_replies_in_hand_still_exclude_the_bad_one():
    """Wallclock, every reply in hand at once (more than a decodable set): checked anyway."""
    strategy, theta = run(bad=1, verify=False, rounds=3, timing="wallclock")
    rows = strategy.history
    assert all(1 not in r["clients_used"] for r in rows)
    # excluded twice, then quarantined (sent no work) for the rounds that follow
    assert [r["inconsistent"] for r in rows] == [[1], [1], []]
    assert [len(r["quarantined"]) for r in rows] == [0, 0, 1]
    expected = oracle(3, 6)
    assert np.linalg.norm(theta - expected) <= 1e-9 * np.linalg.norm(expected)


def test_without_redundancy_in_hand_a_bad_reply_cannot_be_detected():
    """Virtual timing, verify=False: the minimal decodable prefix has no spare replica, so a
    wrong reply in it goes unnoticed -- the reason verify=True exists."""
    strategy, theta = run(bad=0, verify=False, rounds=4, seed=3)
    assert any(0 in r["clients_used"] for r in strategy.history)  # the seed makes it used
    expected = oracle(4, 6)
    assert np.linalg.norm(theta - expected) > 1e-3 * np.linalg.norm(expected)


def test_honest_replies_are_verified_and_agree_to_rounding():
    strategy, theta = run(bad=None, seed=4)
    assert all(r["verified"] == "verified" for r in strategy.history)
    assert all(r["disagreement"] < 1e-10 for r in strategy.history)
    expected = oracle(4, 6)
    assert np.linalg.norm(theta - expected) <= 1e-9 * np.linalg.norm(expected)


CHUNKED = ("verify=True is not available for code='comm-efficient' with m > 1: its replies are "
           "chunks of the model and are not cross-checked. Use m=1 (its groups are repetition "
           "groups), code='frc', or verify=False")


def no_redundancy(name, s):
    return (f"verify=True needs redundancy to cross-check replies; code='{name}' with s={s} "
            "has none (no reply is computed twice). Use s >= 1 with code='frc', or "
            "verify=False")


APPROXIMATE = ("verify=True needs an exact code; code='bgc' decodes approximately, so the "
               "replies of a round cannot be cross-checked. Use code='frc', or verify=False")


def no_repetition(name, why):
    return (f"verify=True cannot guarantee anything for code='{name}': against a coalition of "
            "up to s nodes it needs every block to be a repetition group of at least s + 1 "
            f"identical replicas, and {why} (s colluders can make an honest node look like the "
            "culprit). Use code='frc' (needs (s + 1) | n), a GradientCode whose blocks are "
            "repetition groups (e.g. make_code('grouped-rs', n, s) with (s + 1) | n), or "
            "verify=False")


class Bespoke:
    """A user's code object that declares nothing: no name, no s, no chunks, no exactness."""


class Redundant:
    s = 2  # and nothing else: one chunk, exact by default


class Unnamed:
    s = 0


def test_verify_refusal_names_the_code_and_what_to_use_instead():
    assert verify_refusal("comm-efficient", 2, {"m": 1}) is None
    assert verify_refusal("comm-efficient", 2, {}) == CHUNKED  # m defaults to 2
    assert verify_refusal("comm-efficient", 2, {"m": 2}) == CHUNKED
    assert verify_refusal(make_code("comm-efficient", n=6, s=2, m=2), 2, {}) == CHUNKED
    assert verify_refusal(make_code("comm-efficient", n=6, s=2, m=1), 2, {}) is None
    assert verify_refusal("frc", 0, {}) == no_redundancy("frc", 0)
    assert verify_refusal("bgc", 2, {}) == APPROXIMATE
    assert verify_refusal(make_code("bgc", n=6, s=2), 2, {}) == APPROXIMATE
    assert verify_refusal(make_code("frc", n=6, s=2), 2, {}) is None
    # objects: named by their class when they have no name; undeclared s means no redundancy,
    # undeclared chunks one chunk, undeclared exactness exact
    assert verify_refusal(Unnamed(), 0, {}) == no_redundancy("Unnamed", 0)
    assert verify_refusal(Bespoke(), 3, {}) == no_redundancy("Bespoke", 3)
    # a placement verify cannot see is not one it can guarantee anything for
    assert verify_refusal(Redundant(), 2, {}) == no_repetition(
        "Redundant", "it declares no blocks")
    assert verify_refusal("crc", 2, {}) == no_repetition("crc", "it places cyclic blocks")
    for name in ("grouped-rs", "nested"):
        assert verify_refusal(name, 2, {}) == no_repetition(
            name, "it places Reed-Solomon or cyclic blocks when (s + 1) does not divide n")


def test_round_probe_without_verify_is_sampled_only_with_redundancy():
    layout = {"w": (10,)}
    assert round_probe(make_code("uncoded", n=4, s=0), layout, False, {}) is None
    assert round_probe(make_code("frc", n=4, s=0), layout, False, {}) is None
    sampled = round_probe(make_code("frc", n=4, s=1), layout, False, {})
    assert sampled is not None and not sampled.dense and not sampled.metrics
    dense = round_probe(make_code("frc", n=4, s=1), layout, True, {})
    assert dense.dense and dense.metrics is True and dense.q == 16
    # 16 functionals of the arrays, the count, 16 functionals of the metrics
    z = dense({"w": np.zeros(10)}, 3.0, {"loss": 1.0})
    assert z.shape == (33,) and z[16] == 3.0 and np.any(z[17:] != 0.0)
    with pytest.raises(ValueError) as err:
        round_probe(make_code("bgc", n=6, s=2), layout, True, {})
    assert str(err.value) == APPROXIMATE


def test_no_redundancy_by_name_is_refused_whatever_s_says():
    assert verify_refusal("ignore-stragglers", 2, {}) == no_redundancy("ignore-stragglers", 2)
    assert verify_refusal("uncoded", 1, {}) == no_redundancy("uncoded", 1)
