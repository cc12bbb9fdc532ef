"""The edge fault kinds of ``tests/faults/fault_kinds.py`` and the membership faults, one
targeted scenario each (as ``python -m tests.faults.fault_injection`` draws them), and the fast
slice of the suite with them: every kind is injected, no run ends by a node's failure, nothing
wrong is applied as verified, and the model still equals the numpy FedAvg oracle.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from tests.faults import fault_injection as fi
from tests.faults.fault_cases import (
    assert_equals_oracle,
    assert_sound,
    pytestmark,  # noqa: F401 (the warning filter applies here)
    run,
    scenario,
    seed_where_first,
)

# =============================================================================== edge faults
# The kinds of tests/faults/fault_kinds.py. On the code before the edge fixes several of these
# fail (the defects they measure): see the module's docstring for what each kind does.
edges = fi.edges


def test_edge_scenarios_keep_the_other_faults_and_respect_the_forgery_budget():
    forging = fi.VALUE_FORGING + edges.EDGE_FORGING
    seen = set()
    for index in range(200):
        plain, scn = fi.make_scenario(0, index), fi.make_scenario(0, index, edge_faults=True)
        assert fi.make_scenario(0, index, edge_faults=True).as_dict() == scn.as_dict()
        touched = set(scn.joins) | set(scn.claims) | {
            i for (_, i), k in scn.node_faults.items() if k in edges.MEMBERSHIP_FAULTS}
        for (r, node), kind in plain.node_faults.items():
            if node not in touched:
                assert scn.node_faults[(r, node)] == kind
        assert plain.round_faults == scn.round_faults
        for r in range(1, scn.rounds + 1):
            kinds = [k for (q, _), k in scn.node_faults.items() if q == r]
            assert sum(k in forging for k in kinds) <= max(1, scn.s)
        # one run-level fault (Sybils: half the nodes claim together)
        assert len(scn.joins) + len(scn.claims) <= 1 or scn.num_partitions
        for node, first in scn.joins.items():
            assert 1 <= first < scn.rounds
            assert [q for (q, i) in scn.node_faults if i == node and q <= first] == [first]
        if "lost-reply" in scn.node_faults.values():
            assert scn.timing == "wallclock" and scn.round_gap_s > 0
        seen.update(scn.node_faults.values())
    assert set(edges.EDGE_FAULTS) <= seen


def test_fast_slice_with_edge_faults_keeps_every_invariant():
    """The fast slice with every edge kind: 0 wrong models applied as verified, 0 runs ended
    by a node's failure, no violation."""
    result = fi.run_suite(fi.FAST_SCENARIOS, seed=0, edge_faults=True)
    injected = result["faults_injected"]
    # lost replies need wallclock rounds; coalitions are drawn with verify=True only, so one
    # of their two kinds is enough here (the full run has both: results/fault_injection.json)
    assert all(injected[k] > 0 for k in edges.EDGE_FAULTS
               if k not in ("lost-reply", *edges.COALITION_FORGING)), injected
    assert any(injected.get(k, 0) > 0 for k in edges.COALITION_FORGING), injected
    assert result["wrong_models_applied_as_verified"] == 0
    assert result["runs_ended_by_node_failure"] == 0
    assert result["invariant_violations"] == []
    assert result["exact_rounds_compared_with_oracle"] >= 20


def test_predicted_probe_sample_is_the_public_probe_s():
    """The public-knowledge forger's prediction, rebuilt from public values only, is exactly
    the coordinate sample of the probe the server seeded from those values (so the forger
    below really is one that an integrity check seeded from public values cannot see)."""
    from fl_gradcode.flower import integrity

    layout = dict(fi.ALL_SHAPES)
    try:
        index = integrity.Probe(layout, (1234, 3, edges.PROBE_SALT)).sampled_coordinates
    except (AttributeError, TypeError):
        pytest.skip("the integrity check no longer has the public-seeded sampled probe")
    if sum(len(v) for v in index.values()) == sum(np.prod(s) for s in layout.values()):
        pytest.skip("the probe reads every coordinate: nothing to predict")
    assert {k: v.tolist() for k, v in index.items()} == {
        k: v.tolist() for k, v in edges.probe_sample(layout, 1234, 3).items()
    }


@pytest.mark.parametrize("verify", [True, False])
def test_public_knowledge_forger_is_never_applied_as_verified(verify):
    """FRC s=2, the forger first: it perturbs every coordinate a probe seeded from (seed,
    round) would not read. The round must not apply its reply as verified."""
    seed = seed_where_first(0, 1)
    scn = scenario("public-forger", s=2, verify=verify, rounds=1, seed=seed)
    scn.wide = True
    out = fi.run_scenario(scn)
    assert ("public-forger", 1, 0) in out.injected
    assert_sound(out)
    row = out.rows[0]
    if row["verified"] == "verified":
        assert 0 not in row["clients_used"]


def _sparse_coordinates(scn, server_round, node):
    """The coordinates the blind sparse forger of ``(round, node)`` changes (its draws)."""
    ones = {k: np.ones(shape) for k, shape in scn.shapes().items()}
    public = SimpleNamespace(seed=scn.seed, round=server_round, coefficients=(1.0,))
    forged, _ = edges.forge("sparse-forger", 0, fi.rng_for(scn, server_round, node, 2), ones, {},
                            public)
    return {k: set(np.flatnonzero(forged[k] != 1.0).tolist()) for k in ones}


def test_blind_sparse_forger_that_the_public_sample_misses_is_caught():
    """A seed where the blind forger's few coordinates (x 1e3..1e6) all miss the coordinates a
    public-seeded probe reads, and its reply arrives first (FRC s=2, verify=True)."""
    for seed in range(2000):
        scn = scenario("sparse-forger", s=2, verify=True, rounds=1, seed=seed)
        scn.wide = True
        layout = scn.shapes()
        sampled = edges.probe_sample(layout, seed, 1)
        hits = _sparse_coordinates(scn, 1, 0)
        if any(hits[k] & set(sampled[k].tolist()) for k in layout):
            continue
        if seed != seed_where_first(0, 1, start=seed):
            continue
        break
    else:
        raise AssertionError("no such seed")
    out = fi.run_scenario(scn)
    assert ("sparse-forger", 1, 0) in out.injected
    assert_sound(out)


def test_overflowing_reply_is_never_applied():
    """A reply x 1e160: finite, but its disagreement overflows."""
    seed = seed_where_first(0, 1)
    out = fi.run_scenario(scenario("overflow", s=2, verify=True, rounds=1, seed=seed))
    assert ("overflow", 1, 0) in out.injected
    assert_sound(out)
    assert np.abs(fi.flat_model(out.models[1])).max() < 1e6


@pytest.mark.parametrize("kind", ["size-forgery", "size-forgery-consistent"])
@pytest.mark.parametrize("variant", [0, 1])  # partition-sizes 0, 1e15
@pytest.mark.parametrize("verify, s", [(True, 2), (False, 1)])
def test_partition_size_forgery_never_changes_the_model_unseen(kind, variant, verify, s):
    """partition-sizes 0 / 1e15, alone or with num-examples made consistent with them."""
    seed = seed_where_first(0, 1)
    out = fi.run_scenario(scenario(kind, s=s, verify=verify, rounds=1, seed=seed,
                                   variant=variant))
    assert (kind, 1, 0) in out.injected
    assert_sound(out)
    row = out.rows[0]
    # an exact round's model is compared with the oracle (an approximate one -- s = 1: the
    # forger and its honest twin tie and are both excluded -- is checked by assert_sound as a
    # combination of the partitions' updates)
    if row["decode"] == "exact" and (kind == "size-forgery" or row["verified"] == "verified"):
        assert out.compared == 1


@pytest.mark.parametrize("kind, variant", [("handshake-error", 0), ("handshake-error", 1),
                                           ("handshake-silent", 0)])
def test_handshake_failure_in_round_one_makes_a_straggler_not_the_end(kind, variant):
    scn = scenario(kind, at=(1, 2), variant=variant, rounds=2, code="crc")
    scn.joins = {2: 1}  # its handshake is in round 1
    out = fi.run_scenario(scn)
    assert (kind, 1, 2) in out.injected
    assert_sound(out)
    assert len(out.rows) == 2
    assert (2, 2) in out.workers  # asked again and sent work in the next round


def _late(kind, code="crc"):
    scn = scenario(kind, at=(2, 2), rounds=3, code=code)
    scn.joins = {2: 2}  # first sampled in round 2
    return scn


@pytest.mark.parametrize("kind", edges.HANDSHAKE_FAULTS)
def test_handshake_failure_when_first_sampled_in_a_later_round(kind):
    out = fi.run_scenario(_late(kind))
    assert (kind, 2, 2) in out.injected and (1, 2) not in out.workers
    assert_sound(out)
    assert (3, 2) in out.workers


def test_cohort_size_the_code_cannot_take_does_not_end_the_run():
    """FRC s=1 over 6 nodes, one not there in round 1 (5 cannot be split into pairs)."""
    assert_sound(fi.run_scenario(_late("handshake-error", code="frc")))


def test_two_nodes_claiming_one_partition_do_not_end_the_run():
    scn = scenario("identity-clash", at=(1, 1), rounds=2, code="crc")
    scn.claims = {1: (3, 6)}
    out = fi.run_scenario(scn)
    assert_sound(out)
    # the claim was made, and the round says whom it refused: the claimant and the node
    # whose partition it claimed (without a roster nobody can tell which one lies)
    ids = fi.node_ids_for(scn.n)
    assert ("identity-clash", 1, 1) in out.injected
    assert all({ids[1], ids[3]} <= set(row["identity_rejected"]) for row in out.rows)


def test_claim_of_partition_0_of_1_is_not_trained_as_such():
    """A node claiming partition-id=0 of num-partitions=1: honest replicas must not train
    "partition 0 of 1" (other data) while the node's own partition is never computed."""
    scn = scenario("claims-0-of-1", at=(1, 4), rounds=2, s=2, verify=True)
    scn.claims = {4: (0, 1)}
    out = fi.run_scenario(scn)
    assert_sound(out)
    ids = fi.node_ids_for(scn.n)
    assert ("claims-0-of-1", 1, 4) in out.injected
    assert all(row["identity_rejected"] == [ids[4]] for row in out.rows)


def test_replayed_instruction_is_refused_by_the_mod():
    """[client defence] The same (nonce, round) again with another noise multiplier, straight
    to the node's gradient_coding_mod."""
    out = fi.run_scenario(scenario("replayed-nonce", rounds=1))
    assert ("replayed-nonce", 1, 0) in out.injected and len(out.replays) == 1
    assert_sound(out)
    assert out.replays[0][2], out.replays


@pytest.mark.parametrize("variant", [0, 1, 2, 3])
def test_a_dp_off_train_config_gets_no_raw_release_from_a_node_with_a_policy(variant):
    """[client defence] dp='sample' asked of a node with dp-required / dp-min-noise-multiplier,
    the server's train config saying dp='none', sigma 0 or nothing: refused or noised."""
    out = fi.run_scenario(scenario("dp-off-config", rounds=1, variant=variant))
    assert ("dp-off-config", 1, 0) in out.injected and len(out.dp_attacks) == 1
    assert_sound(out)
    assert out.dp_attacks[0][3] in ("refused", "noised"), out.dp_attacks


def test_replicas_given_different_models_under_one_nonce_keep_their_noise():
    """[client defence] Two replicas with dp-required='partition', one (nonce, round), models
    1e-3 apart: the difference of their releases keeps the noise."""
    out = fi.run_scenario(scenario("dp-model-split", rounds=1))
    assert ("dp-model-split", 1, 0) in out.injected and len(out.dp_attacks) == 1
    assert_sound(out)
    assert out.dp_attacks[0][3] == "noised", out.dp_attacks


def test_lost_wallclock_reply_expires_and_its_node_is_free_again():
    """The grid loses node 0's round-1 reply; rounds are 2 s apart: from the round that starts
    EXPIRY_BOUND_S after round 1 on, node 0 must no longer be busy."""
    scn = scenario("lost-reply", timing="wallclock", rounds=4)
    scn.round_gap_s = edges.LOST_REPLY_GAP_S
    out = fi.run_scenario(scn)
    assert ("lost-reply", 1, 0) in out.injected
    starts = out.round_starts
    assert starts[4] - starts[1] >= edges.EXPIRY_BOUND_S  # the check bites
    assert_sound(out)


# =============================================================================== membership
def _dead(nodes, *, code="frc", s=1, rounds=2):
    scn = scenario(code=code, s=s, rounds=rounds)
    for node in nodes:
        for r in range(1, rounds + 1):
            scn.node_faults[(r, node)] = "dead-from-start"
    return scn


def test_nodes_dead_from_the_first_message_within_s_cost_no_partition():
    """FRC(6, s=1), node 2's app fails every message from the first: every round is exact
    over all six partitions (its partition from its replica)."""
    out = run(_dead([2]))
    assert ("dead-from-start", 1, 2) in out.injected
    assert [row["decode"] for row in out.rows] == ["exact", "exact"]
    for r in (1, 2):
        assert_equals_oracle(out, r)
    assert (out.exact_missing, out.honest_punished) == (0, 0)


def test_a_whole_replica_group_dead_from_the_first_message_is_never_exact():
    out = run(_dead([0, 1]))  # FRC(6, s=1): the group {0, 1}
    assert all(row["decode"] != "exact" for row in out.rows)
    assert all(row["missing_partitions"] for row in out.rows)
    assert out.exact_missing == 0


def test_an_impostor_refused_by_the_roster_punishes_no_honest_node():
    scn = scenario("impostor-roster", at=(1, 1), rounds=2)
    scn.claims, scn.roster = {1: (3, 6)}, True
    out = run(scn)
    assert [row["identity_rejected"] for row in out.rows] == [[fi.node_ids_for(6)[1]]] * 2
    assert [row["decode"] for row in out.rows] == ["exact", "exact"]
    assert out.honest_punished == 0


def test_sybils_against_a_configured_num_partitions_punish_no_honest_node():
    scn = scenario("sybil-tie", at=(1, 0), rounds=2, s=2)
    scn.claims, scn.num_partitions = {0: (0, 3), 3: (1, 3), 4: (2, 3)}, True
    for node in (3, 4):
        scn.node_faults[(1, node)] = "sybil-tie"
    out = run(scn)
    assert [row["decode"] for row in out.rows] == ["exact", "exact"]
    assert out.honest_punished == 0
    assert_equals_oracle(out, 2)


def test_the_membership_counts_see_a_missing_partition_and_a_punished_honest_node():
    """The invariants are not vacuous: a row recorded exact over 5 of 6 partitions, and an
    honest node excluded for its identity, are counted."""
    scn = scenario("impostor-roster", at=(1, 1))
    scn.claims, scn.roster = {1: (3, 6)}, True
    ids = fi.node_ids_for(6)
    rows = [{"round": 1, "decode": "exact", "clients_used": [0, 1, 2, 3, 4], "stragglers": [],
             "missing_partitions": [], "identity_rejected": [ids[1], ids[3]]}]
    missing, punished, bad = edges.membership_counts(scn, rows, ids)
    assert (missing, punished) == (1, 1) and len(bad) == 2
