"""Integrity from redundancy: a reply the other replicas contradict never reaches the model."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg

from fl_gradcode.codes import GradientCode, make_code
from fl_gradcode.flower import GradientCoding, gradient_coding_mod
from fl_gradcode.flower.integrity import (
    Probe,
    applied_disagreement,
    round_probe,
    verify_refusal,
    verify_replies,
)
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


def test_verdict_identifies_the_outvoted_replica_and_refuses_a_tie():
    code = make_code("frc", n=6, s=2)
    rng = np.random.default_rng(0)
    v = rng.standard_normal((code.k, 5))
    z = {i: code.B[i] @ v for i in range(6)}
    assert verify_replies(code, z, range(6), 1e-9).status == "verified"
    bad = dict(z)
    bad[4] = 1.5 * z[4]
    verdict = verify_replies(code, bad, range(6), 1e-9)
    assert verdict.excluded == [4] and verdict.disagreement > 1e-3
    # two replicas of a group disagree and nobody breaks the tie: unresolved
    tie = verify_replies(code, bad, [0, 1, 4, 5], 1e-9)
    assert tie.status == "contradicted" and tie.unresolved and tie.excluded == []


def test_probe_is_linear_and_counts_exactly():
    probe = Probe({"a": (7, 3), "b": (5,)}, (0, 1), q=3, sample=10)
    rng = np.random.default_rng(1)
    x = {"a": rng.standard_normal((7, 3)), "b": rng.standard_normal(5)}
    y = {"a": rng.standard_normal((7, 3)), "b": rng.standard_normal(5)}
    both = {k: 2 * x[k] - y[k] for k in x}
    np.testing.assert_allclose(probe(both, 5.0), 2 * probe(x, 4.0) - probe(y, 3.0))


def test_the_sampled_probe_reads_every_array_in_float64_and_an_empty_reply_is_its_count():
    """Arrays of several shapes and dtypes: the projections are those of the float64 values
    (a float32 reply and its float64 copy give the same z), linear in every coordinate; a
    layout without arrays projects to ``[0, count]``."""
    layout = {"a": (70, 3), "b": (500,), "c": ()}
    probe = Probe(layout, (0, 2), q=3, sample=96)
    rng = np.random.default_rng(4)
    x32 = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in layout.items()}
    x64 = {name: v.astype(np.float64) for name, v in x32.items()}
    z = probe(x32, 3.0)
    np.testing.assert_array_equal(z, probe(x64, 3.0))
    assert z.shape == (4,) and z[3] == 3.0
    basis = []  # z of each unit coordinate: z(x) = sum_j x_j z(e_j)
    for name, shape in layout.items():
        for j in range(int(np.prod(shape))):
            e = {k: np.zeros(s) for k, s in layout.items()}
            e[name].reshape(-1)[j] = 1.0
            basis.append((float(x64[name].reshape(-1)[j]), probe(e, 0.0)[:3]))
    np.testing.assert_allclose(z[:3], sum(v * col for v, col in basis), rtol=1e-12, atol=1e-12)
    z, size = Probe({}, (0, 1), q=2).measure({}, 5.0)
    assert size is None and z.tolist() == [0.0, 5.0]


def test_the_sampled_probe_reads_few_places_of_a_large_array():
    """A reply's bytes are long out of the caches when it is validated: the sampled probe reads
    runs of consecutive coordinates (a few pages), not 2048 scattered ones (about 900 of the
    1024 pages of 1024 coordinates here)."""
    size, window = 1 << 20, 1024
    probe = Probe({"a": (size,)}, (0, 1), q=2, sample=2048)
    rng = np.random.default_rng(0)
    x = np.zeros(size, np.float32)
    read = 0
    for start in range(0, size, window):
        x[start : start + window] = rng.standard_normal(window)
        read += bool(np.any(probe({"a": x}, 0.0)[:2] != 0.0))
        x[start : start + window] = 0.0
    assert 1 <= read <= 2048 // 64
    # still a linear functional of every sampled coordinate, and a small array is read whole
    small = Probe({"b": (100,)}, (0, 1), q=2, sample=2048)
    y = rng.standard_normal(100)
    for j in range(100):
        e = np.zeros(100)
        e[j] = 1.0
        assert np.any(small({"b": e}, 0.0)[:2] != 0.0)
    np.testing.assert_allclose(small({"b": y}, 0.0)[:2],
                               sum(y[j] * small({"b": np.eye(100)[j]}, 0.0)[:2]
                                   for j in range(100)))


def test_a_minimal_decodable_set_is_consistent_but_unverified():
    # FRC n=6, s=2: one reply per group decodes, but nothing checks it
    code = make_code("frc", n=6, s=2)
    v = np.random.default_rng(2).standard_normal((code.k, 5))
    z = {i: code.B[i] @ v for i in range(6)}
    verdict = verify_replies(code, z, [0, 3], 1e-9)
    assert verdict.status == "unverified" and verdict.excluded == []
    # one group fully checked, the other not: still unverified as a whole
    assert verify_replies(code, z, [0, 1, 3], 1e-9).status == "unverified"
    # every reply in hand cross-checked (decodability is the stopping rule's business)
    assert verify_replies(code, z, [0, 1], 1e-9).status == "verified"


def test_an_unresolved_contradiction_reports_how_far_the_replicas_disagree():
    code = make_code("frc", n=6, s=2)
    v = np.random.default_rng(3).standard_normal((code.k, 5))
    z = {i: code.B[i] @ v for i in range(6)}
    z[4] = 1.5 * z[4]
    tie = verify_replies(code, z, [0, 1, 4, 5], 1e-9)
    assert tie.unresolved
    # group (3, 4, 5) from replies 4 (1.5 y) and 5 (y): min-norm decodes 1.25 y, each reply
    # alone y or 1.5 y, so 0.25 |y| apart, relative to the median reply size 1.25 |y|: 0.2
    assert tie.disagreement == pytest.approx(0.25 / 1.25, rel=1e-6)



def test_replies_that_do_not_decode_their_block_or_no_replies_are_unverified():
    code = make_code("crc", n=3, s=1)  # one block: any 2 of the 3 replies decode
    v = np.random.default_rng(5).standard_normal((code.k, 5))
    z = {i: code.B[i] @ v for i in range(3)}
    assert verify_replies(code, z, [0], 1e-9).status == "unverified"
    assert verify_replies(code, z, [], 1e-9).status == "unverified"
    assert verify_replies(code, z, [0, 1, 2], 1e-9).status == "verified"


# --- exact values from an independent numpy reference (pinv least squares), boundaries ---

def loo_reference(A, Z, scale):
    """The largest leave-one-out disagreement by the definition: the min-norm decoder ``a`` of
    the rows ``A`` (``A^T a = 1``) against the min-norm decoder of every decodable ``A`` without
    row ``i``, applied to the replies ``Z``, relative to ``scale`` (numpy pinv, no SVD update)."""
    A, Z = np.asarray(A, np.float64), np.asarray(Z, np.float64)
    a = np.linalg.pinv(A.T) @ np.ones(A.shape[1])
    assert np.allclose(A.T @ a, 1.0)
    worst = 0.0
    for i in range(A.shape[0]):
        keep = [j for j in range(A.shape[0]) if j != i]
        b = np.linalg.pinv(A[keep].T) @ np.ones(A.shape[1])
        if np.allclose(A[keep].T @ b, 1.0):
            worst = max(worst, np.linalg.norm(a @ Z - b @ Z[keep]) / scale)
    return worst


@pytest.mark.parametrize("with_sizes", [False, True])
def test_disagreement_is_the_leave_one_out_distance_over_the_median_size(with_sizes):
    """float32 projections are measured exactly (float64); the yardstick is the median of the
    exact sizes when given, else of the projections' norms."""
    code = make_code("crc", n=6, s=2)  # one block: any 4 of the 6 replies decode
    rng = np.random.default_rng(7)
    z = {i: (code.B[i] @ rng.standard_normal((code.k, 5))).astype(np.float32) * 3.3
         for i in range(6)}  # six replies from different models: far from consistent
    Z = np.array([z[i] for i in range(6)], np.float64)
    sizes = {i: float(10.0 + 7 * i) for i in range(6)} if with_sizes else None
    scale = np.median(list(sizes.values())) if with_sizes else np.median(
        np.linalg.norm(Z, axis=1))
    verdict = verify_replies(code, z, range(6), 1e-6, sizes=sizes)
    assert verdict.status == "contradicted" and verdict.unresolved
    assert verdict.disagreement == pytest.approx(loo_reference(code.B, Z, scale), rel=1e-10)


def test_zero_replies_agree_exactly_and_a_reply_beside_zero_sized_ones_is_infinitely_off():
    code = make_code("frc", n=6, s=2)
    zero = {i: np.zeros(4) for i in range(6)}
    verdict = verify_replies(code, zero, range(6), 0.0)  # a tolerance of 0 is met by 0
    assert (verdict.status, verdict.excluded, verdict.disagreement) == ("verified", [], 0.0)
    # the median reply of group (0, 1, 2) has size 0: reply 2's disagreement is infinite,
    # and dropping it leaves two agreeing replicas
    odd = dict(zero)
    odd[2] = np.array([1.0, -2.0, 0.5, 3.0])
    verdict = verify_replies(code, odd, [0, 1, 2], 1e-9)
    assert verdict.excluded == [2] and verdict.disagreement == float("inf")
    assert verdict.status == "verified"


@pytest.mark.parametrize("with_sizes", [False, True])
def test_a_large_block_names_its_one_wrong_reply(with_sizes):
    """Twenty replies in one block (more than the small-block search handles): the residual
    points at the wrong reply, whose exclusion leaves every other reply cross-checked."""
    code = make_code("crc", n=20, s=2)
    rng = np.random.default_rng(11)
    v = rng.standard_normal((code.k, 6))
    z = {i: code.B[i] @ v for i in range(20)}
    z[13] = 1.5 * z[13]
    Z = np.array([z[i] for i in range(20)])
    sizes = {i: float(np.linalg.norm(z[i])) * 40.0 for i in range(20)} if with_sizes else None
    scale = np.median(np.linalg.norm(Z, axis=1)) * (40.0 if with_sizes else 1.0)
    verdict = verify_replies(code, z, range(20), 1e-9, sizes=sizes)
    assert verdict.status == "verified" and verdict.excluded == [13]
    assert not verdict.unresolved
    assert verdict.disagreement == pytest.approx(loo_reference(code.B, Z, scale), rel=1e-8)


def test_the_exclusion_check_measures_the_rest_against_the_exact_sizes():
    """Honest replicas that differ by 1e-6 of their projections (non-deterministic training)
    are consistent against exact sizes 1e6 times larger: the outvoted replica is excluded."""
    code = make_code("frc", n=6, s=2)
    rng = np.random.default_rng(12)
    v = rng.standard_normal((code.k, 5))
    z = {i: code.B[i] @ v * (1 + 1e-6 * rng.standard_normal(5)) for i in range(6)}
    z[4] = 1.5 * z[4]
    sizes = {i: 1e6 * float(np.linalg.norm(z[i])) for i in range(6)}
    verdict = verify_replies(code, z, range(6), 1e-9, sizes=sizes)
    assert (verdict.status, verdict.excluded) == ("verified", [4])
    # against the projections' own norms the replicas' 1e-6 is a contradiction nobody explains
    assert verify_replies(code, z, range(6), 1e-9).status == "contradicted"


def test_pure_replication_more_replies_than_partitions_in_a_block():
    """Three replicas of one partition (B = ones(3, 1)): two agreeing replies outvote a third."""
    code = GradientCode(np.ones((3, 1)), 2, is_exact=True)
    y = np.array([0.5, -1.0, 2.0])
    z = {i: y.copy() for i in range(3)}
    assert verify_replies(code, z, range(3), 1e-9).status == "verified"
    z[1] = 2.0 * y
    verdict = verify_replies(code, z, range(3), 1e-9)
    assert (verdict.status, verdict.excluded) == ("verified", [1])
    # min-norm decoding (y + 2y + y)/3 = 4y/3; without reply 0: (2y + y)/2 (|y|/6 apart),
    # without reply 1: (y + y)/2 (|y|/3 apart, the largest); over the median size |y|
    assert verdict.disagreement == pytest.approx(1 / 3, rel=1e-12)


def test_an_excluded_reply_leaves_an_essential_one_unchecked_and_the_cache_keeps_block_verdicts():
    """One block: replies 0, 1, 2 replicate partition 0, reply 3 = 2 u_0 + u_1 is the only one
    with partition 1. Reply 2 is outvoted; reply 3 cannot be checked: 'unverified'."""
    B = np.array([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [2.0, 1.0]])
    code = GradientCode(B, 1, is_exact=False)
    u = np.random.default_rng(13).standard_normal((2, 4))
    z = {i: B[i] @ u for i in range(4)}
    z[2] = z[2] + 0.5
    cache: dict = {}
    verdict = verify_replies(code, z, range(4), 1e-9, cache=cache)
    assert (verdict.status, verdict.excluded) == ("unverified", [2])
    assert [v.status for v in cache.values()] == ["unverified"]
    # a set that does not decode partition 1: its block's cached verdict is 'unverified' too
    cache = {}
    assert verify_replies(code, z, [0, 1], 1e-9, cache=cache).status == "unverified"
    assert [v.status for v in cache.values()] == ["unverified"]


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


def test_probe_size_is_the_exact_norm_of_the_whole_reply_without_overflow():
    """More coordinates than one dense block (2^15), values whose squares overflow: the norm
    by scaling (numpy reference), arrays + count + metrics when probed."""
    layout = {"a": (70_000,), "b": (3, 5)}
    rng = np.random.default_rng(14)
    arrays = {"a": rng.standard_normal(70_000) * 1e200, "b": rng.standard_normal((3, 5))}
    arrays["a"][[5, 40_000, 69_999]] = [3e200, -4e200, 2e200]
    metrics = {"loss": 2.5e200, "acc": -1.0}
    flat = np.concatenate([arrays["a"], arrays["b"].ravel(), [7.0], list(metrics.values())])
    top = np.max(np.abs(flat))
    expected = top * np.linalg.norm(flat / top)
    probe = Probe(layout, (3, 4), q=2, sample=None, metrics=True)
    assert probe.size(arrays, 7.0, metrics) == pytest.approx(expected, rel=1e-12)
    assert probe.measure(arrays, 7.0, metrics)[1] == pytest.approx(expected, rel=1e-12)
    plain = Probe(layout, (3, 4), q=2, sample=None)  # metrics not probed: not measured
    top = np.max(np.abs(flat[:-2]))
    assert plain.size(arrays, 7.0, metrics) == pytest.approx(
        top * np.linalg.norm(flat[:-2] / top), rel=1e-12)
    arrays["b"][1, 2] = np.nan
    assert np.isnan(probe.size(arrays, 7.0, metrics))


def test_every_metric_has_its_own_secret_weights_and_enters_linearly():
    probe = Probe({"w": (4,)}, (5, 6), q=4, sample=None, metrics=True)
    zero = {"w": np.zeros(4)}

    def part(metrics):
        return probe(zero, 0.0, metrics)[5:]

    loss, acc = part({"loss": 1.0}), part({"acc": 1.0})
    assert np.all(np.abs(loss) <= 0.5) and np.all(np.abs(acc) <= 0.5)
    assert not np.allclose(loss, acc)  # per-name weights
    np.testing.assert_allclose(part({"loss": 3.0, "acc": -2.0}), 3.0 * loss - 2.0 * acc,
                               rtol=1e-12)
    # a forged value changes the projections, whichever metric it is
    assert not np.allclose(part({"loss": 3.5, "acc": -2.0}), part({"loss": 3.0, "acc": -2.0}))
    assert not np.allclose(part({"loss": 3.0, "acc": -2.5}), part({"loss": 3.0, "acc": -2.0}))


def test_a_large_block_resolves_a_contradiction_that_one_exclusion_explains():
    """'Resolved' (module docstring): removing exactly one reply leaves a consistent set that
    still decodes. Reply 7 is scaled by 1.5; reply 5 is off by 1e-3 of itself, and the 19
    replies without 7 disagree by about 0.02 <= the tolerance 0.05."""
    code = make_code("crc", n=20, s=2)
    v = np.random.default_rng(11).standard_normal((code.k, 6))
    z = {i: code.B[i] @ v for i in range(20)}
    z[7] = 1.5 * z[7]
    z[5] = z[5] * (1 + 1e-3)
    rest = [i for i in range(20) if i != 7]
    Z = np.array([z[i] for i in rest])
    scale = np.median(np.linalg.norm(Z, axis=1))
    assert loo_reference(code.B[rest], Z, scale) <= 0.05  # consistent without reply 7
    assert verify_replies(code, z, rest, 0.05).status == "verified"
    assert verify_replies(code, z, range(20), 0.05).excluded == [7]


def test_a_huge_reply_in_a_large_block_is_excluded():
    """A reply 1e160 times too large among 20 (one block): the rest is measured at its own
    scale, so the huge one is named."""
    code = make_code("crc", n=20, s=2)
    v = np.random.default_rng(18).standard_normal((code.k, 5))
    z = {i: code.B[i] @ v for i in range(20)}
    z[3] = z[3] * 1e160
    verdict = verify_replies(code, z, range(20), 1e-9)
    assert (verdict.status, verdict.excluded) == ("verified", [3])


def test_a_non_finite_reply_in_a_large_block_is_excluded():
    """As in a small block: without the NaN reply the rest is consistent."""
    for n in (12, 20):
        code = make_code("crc", n=n, s=2)
        v = np.random.default_rng(19).standard_normal((code.k, 5))
        z = {i: code.B[i] @ v for i in range(n)}
        z[3] = z[3].copy()
        z[3][1] = np.nan
        verdict = verify_replies(code, z, range(n), 1e-9)
        assert (verdict.status, verdict.excluded) == ("verified", [3]), n
        # an overflowing size (finite projections) is the same: that reply alone explains it
        z[3] = code.B[3] @ v
        sizes = {i: 1.0 + i for i in range(n)}
        sizes[3] = float("inf")
        verdict = verify_replies(code, z, range(n), 1e-9, sizes)
        assert (verdict.status, verdict.excluded) == ("verified", [3]), n
        # two such replies: no single exclusion explains them
        sizes[8] = float("nan")
        assert verify_replies(code, z, range(n), 1e-9, sizes).unresolved, n


def test_a_large_block_exclusion_checks_the_rest_or_refuses():
    """17 replicas of partition 0 and one reply 2 u_0 + u_1, the only one with partition 1:
    the outvoted replica is excluded, the essential reply stays unchecked ('unverified').
    CRC n=17, s=1 with all 17 replies: without any one reply nothing is left to cross-check,
    so no exclusion is confirmed (unresolved)."""
    B = np.vstack([np.tile([1.0, 0.0], (17, 1)), [[2.0, 1.0]]])
    code = GradientCode(B, 16, is_exact=False)
    u = np.random.default_rng(16).standard_normal((2, 3))
    z = {i: B[i] @ u for i in range(18)}
    z[9] = z[9] + 0.5
    verdict = verify_replies(code, z, range(18), 1e-9)
    assert (verdict.status, verdict.excluded) == ("unverified", [9])
    crc = make_code("crc", n=17, s=1)
    v = np.random.default_rng(17).standard_normal((crc.k, 3))
    z = {i: crc.B[i] @ v for i in range(17)}
    z[4] = 1.5 * z[4]
    verdict = verify_replies(crc, z, range(17), 1e-9)
    assert verdict.status == "contradicted" and verdict.unresolved and verdict.excluded == []


@pytest.mark.parametrize("trial", [0, 1, 2, 17, 22, 29])  # 17, 22, 29: one reply near tolerance
def test_a_large_blocks_verdict_is_the_definition_by_brute_force(trial):
    """17 to 22 replies in one block, one scaled, two others off by 1e-5 to 1e-2 of themselves
    (tolerance 0.05): the verdict is the module docstring's, every exclusion tried with numpy."""
    rng = np.random.default_rng(100 + trial)
    n, tol = int(rng.integers(17, 23)), 0.05
    code = make_code("crc", n=n, s=2)
    v = rng.standard_normal((code.k, 4))
    z = {i: code.B[i] @ v for i in range(n)}
    z[int(rng.integers(n))] *= 1.5
    for i in rng.choice(n, size=2, replace=False):
        z[int(i)] = z[int(i)] * (1 + 10 ** rng.uniform(-5, -2))
    Z = np.array([z[i] for i in range(n)])
    norms = np.linalg.norm(Z, axis=1)
    loo = [loo_reference(np.delete(code.B, c, 0), np.delete(Z, c, 0),
                         np.median(np.delete(norms, c))) for c in range(n)]
    assert all(abs(d - tol) > 1e-6 * tol for d in loo)  # no rounding coin-flip at the boundary
    explained = [c for c in range(n) if loo[c] <= tol]
    verdict = verify_replies(code, z, range(n), tol)
    assert verdict.disagreement == pytest.approx(loo_reference(code.B, Z, np.median(norms)),
                                                 rel=1e-8)
    assert verdict.excluded == (explained if len(explained) == 1 else [])
    assert verdict.unresolved == (len(explained) != 1)


@pytest.mark.parametrize("with_sizes", [False, True])
@pytest.mark.parametrize("unit", [1e-3, 1e3])
def test_a_large_block_excludes_exactly_when_the_rest_is_within_the_tolerance(with_sizes, unit):
    """The exclusion's own disagreement (numpy reference) against tolerances 1e-7 either side
    of it: excluded just above, an unresolved contradiction just below."""
    code = make_code("crc", n=20, s=2)
    rng = np.random.default_rng(15)
    v = rng.standard_normal((code.k, 6)) * unit
    z = {i: code.B[i] @ v for i in range(20)}
    z[7] = 1.5 * z[7]
    z[5] = z[5] * (1 + 1e-3)
    sizes = {i: float(3 + i) * unit for i in range(20)} if with_sizes else None
    rest = [i for i in range(20) if i != 7]
    Z = np.array([z[i] for i in rest])
    scale = np.median([sizes[i] for i in rest]) if with_sizes else np.median(
        np.linalg.norm(Z, axis=1))
    own = loo_reference(code.B[rest], Z, scale)
    above = verify_replies(code, z, range(20), own * (1 + 1e-7), sizes)
    assert (above.status, above.excluded, above.unresolved) == ("verified", [7], False)
    below = verify_replies(code, z, range(20), own * (1 - 1e-7), sizes)
    assert (below.status, below.excluded, below.unresolved) == ("contradicted", [], True)


def test_no_redundancy_by_name_is_refused_whatever_s_says():
    assert verify_refusal("ignore-stragglers", 2, {}) == no_redundancy("ignore-stragglers", 2)
    assert verify_refusal("uncoded", 1, {}) == no_redundancy("uncoded", 1)


def test_metric_weights_are_keyed_by_the_probes_secret_words():
    """Reference: the keyed BLAKE2b of the metric's name (key = BLAKE2b of the words), its 16
    bytes seeding numpy's generator; another probe's words give other weights."""

    def reference(words, name, q):
        key = hashlib.blake2b(repr(list(words)).encode(), digest_size=32).digest()
        digest = hashlib.blake2b(name.encode(), key=key, digest_size=16).digest()
        return np.random.default_rng(list(digest)).random(q) - 0.5

    zero = {"w": np.zeros(3)}
    parts = []
    for words in ([1, 2], [3, 4]):
        probe = Probe({"w": (3,)}, words, q=4, sample=None, metrics=True)
        part = probe(zero, 0.0, {"loss": 2.0})[5:]
        np.testing.assert_allclose(part, 2.0 * reference(words, "loss", 4), rtol=1e-15)
        parts.append(part)
    assert not np.allclose(parts[0], parts[1])  # secret per probe, not per name only


def test_a_single_array_no_larger_than_the_sample_is_read_whole():
    """One array of exactly ``sample`` coordinates: every coordinate is measured (its whole
    sample goes to the one array), so a change anywhere moves the projections."""
    size = 256
    probe = Probe({"w": (size,)}, [7], q=4, sample=size)
    moved = [np.any(probe({"w": np.eye(size)[i]}, 0.0)[:4] != 0.0) for i in range(size)]
    assert all(moved)


def test_replies_projected_on_no_functional_agree_exactly():
    """Zero functionals (empty projections): nothing can disagree; a verdict, not a crash."""
    code = make_code("frc", n=6, s=2)
    z = {w: np.zeros(0) for w in range(6)}
    verdict = verify_replies(code, z, range(6), 1e-9)
    assert (verdict.status, verdict.excluded, verdict.disagreement) == ("verified", [], 0.0)


def test_applied_disagreement_is_infinite_when_the_used_replies_do_not_decode():
    code = make_code("crc", n=6, s=2)  # one block: one reply alone does not decode it
    z = {w: np.ones(3) for w in range(6)}
    assert applied_disagreement(code, z, [0], np.eye(6)[0]) == float("inf")


def test_applied_disagreement_of_float32_projections_is_computed_in_float64():
    """float32 projections that nearly agree: the distance of the applied decoding (worker 0
    alone) from the min-norm one (1/3 each) is ``|2 z0 - z1 - z2| / 3`` over the median norm,
    computed here in float64; float32 arithmetic on the scaled projections would be off by
    ~1e-7 of their size, a large relative error of a distance this small."""
    code = make_code("frc", n=6, s=2)
    base = np.array([3.1, -1.7, 0.9, 2.3], dtype=np.float32)
    step = np.float32(1e-5)
    z = {0: base, 1: base + step, 2: base - 2 * step}
    assert all(v.dtype == np.float32 for v in z.values())
    coefficients = np.zeros(6)
    coefficients[0] = 1.0
    Z = np.array([z[w] for w in range(3)], dtype=np.float64)
    a = np.linalg.pinv(code.B[:3, :3].T) @ np.ones(3)  # min-norm decoder of {0, 1, 2}
    np.testing.assert_allclose(a, np.full(3, 1.0 / 3.0), rtol=1e-12)
    expected = (np.linalg.norm((coefficients[:3] - a) @ Z)
                / np.median([np.linalg.norm(row) for row in Z]))
    got = applied_disagreement(code, z, [0, 1, 2], coefficients)
    assert got == pytest.approx(expected, rel=1e-9)
    # float32 arithmetic on the scaled projections gives another value: the check bites
    top = np.float32(np.max(np.abs(Z)))
    Z32 = np.array([z[w] for w in range(3)]) / top
    float32_value = (np.linalg.norm((coefficients[:3] - a) @ Z32)
                     / (np.median([np.linalg.norm(row) for row in Z]) / float(top)))
    assert float32_value != pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("n", [20, 40])
def test_a_large_block_confirms_only_its_candidates_whatever_its_size(n, monkeypatch):
    """The module docstring's cost: every leave-one-out of a block comes from one SVD. One
    wrong reply among ``n`` in one block: one SVD decodes the block, one serves the candidate
    search, one confirms the single candidate -- not one per reply."""
    calls = []
    svd = np.linalg.svd

    def counting(*args, **kwargs):
        calls.append(1)
        return svd(*args, **kwargs)

    code = make_code("crc", n=n, s=2)
    v = np.random.default_rng(21).standard_normal((code.k, 6))
    z = {i: code.B[i] @ v for i in range(n)}
    z[13] = 1.5 * z[13]
    monkeypatch.setattr(np.linalg, "svd", counting)
    verdict = verify_replies(code, z, range(n), 1e-9)
    monkeypatch.undo()
    assert (verdict.status, verdict.excluded) == ("verified", [13])
    assert len(calls) == 3


needs_longdouble = pytest.mark.skipif(np.finfo(np.longdouble).eps >= np.finfo(np.float64).eps,
                                      reason="long double is float64 on this platform")


@needs_longdouble
def test_the_sampled_probe_reads_a_long_double_reply_as_its_float64_rounding():
    """A model kept in long double sends long double replies (``wire="model"``): the sampled
    probe, like the dense one, measures the float64 values, so such a reply and its float64
    rounding give the same projections bit for bit."""
    layout = {"a": (300,), "b": (40, 5)}
    rng = np.random.default_rng(22)
    x = {name: rng.standard_normal(shape).astype(np.longdouble) / 3
         for name, shape in layout.items()}
    rounded = {name: v.astype(np.float64) for name, v in x.items()}
    assert any(np.any(x[name] != rounded[name]) for name in layout)  # more digits than float64
    for probe in (Probe(layout, (5, 6), q=4, sample=128),
                  Probe(layout, (5, 6), q=4, sample=None)):
        np.testing.assert_array_equal(probe(x, 2.0), probe(rounded, 2.0))


@needs_longdouble
def test_applied_disagreement_reads_long_double_coefficients_as_float64():
    """Coefficients given in long double are the float64 values they round to (every input of
    the check is float64): the same disagreement bit for bit."""
    code = make_code("frc", n=6, s=2)
    rng = np.random.default_rng(23)
    z = {w: rng.standard_normal(4) for w in range(6)}
    coefficients = np.zeros(6, dtype=np.longdouble)
    coefficients[:3] = np.longdouble(1) / 3 + np.array([1, -2, 1], dtype=np.longdouble) / 7e5
    rounded = coefficients.astype(np.float64)
    assert np.any(coefficients != rounded)
    got = applied_disagreement(code, z, [0, 1, 2], coefficients)
    assert got > 0.0
    assert got == applied_disagreement(code, z, [0, 1, 2], rounded)
