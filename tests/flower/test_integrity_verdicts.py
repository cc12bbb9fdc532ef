"""Integrity verdicts: ``verify_replies`` on a round's projected replies, checked against
exact values of an independent numpy reference (pinv least squares, every leave-one-out tried).

Small blocks (FRC groups, pure replication) and large ones (one SVD for every leave-one-out):
the outvoted replica is named, a tie or an unexplained contradiction is refused, a set that
cannot be cross-checked is 'unverified', the tolerance boundary is exact; and
``applied_disagreement`` of the decoding a round applied."""

from __future__ import annotations

import numpy as np
import pytest

from fl_gradcode.codes import GradientCode, make_code
from fl_gradcode.flower.integrity import applied_disagreement, verify_replies


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
