"""Seeded fault injection over the public API (``tests/faults/fault_injection.py``).

The fast slice of the randomized suite (the same code as
``python -m tests.faults.fault_injection``) must keep every invariant; then one targeted scenario
per fault kind checks that the kind is injected and handled as the protocol says (rejected with
its reason, excluded by redundancy, a straggler, a skipped round, ...), and that the model still
equals the numpy FedAvg oracle.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np
import pytest
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)

from fl_gradcode.flower.testing import InProcessGrid, set_task_identity
from fl_gradcode.latency import Pareto
from tests.faults import fault_injection as fi
from tests.faults.fault_cases import (
    assert_equals_oracle,
    assert_sound,
    pytestmark,  # noqa: F401 (the warning filter applies here)
    run,
    scenario,
    seed_where_first,
)

ROOT = Path(__file__).resolve().parents[2]


# =============================================================================== the suite
def test_fast_slice_keeps_every_invariant():
    t0 = time.perf_counter()
    result = fi.run_suite(fi.FAST_SCENARIOS, seed=0)
    elapsed = time.perf_counter() - t0
    assert result["invariant_violations"] == []
    assert result["crashes"] == 0
    assert result["corrupted_models"] == 0
    assert result["scenarios"] == fi.FAST_SCENARIOS
    # no round lost: one row per round of every scenario
    planned = sum(fi.make_scenario(0, i).rounds for i in range(fi.FAST_SCENARIOS))
    assert result["rounds"] == planned == sum(result["decode"].values())
    # the slice is not vacuous: every fault kind is injected, exact rounds are compared
    injected = result["faults_injected"]
    assert all(injected[kind] > 0 for kind in fi.ALL_FAULTS), injected
    assert result["exact_rounds_compared_with_oracle"] >= 20
    assert result["max_relative_error"] <= fi.RTOL
    assert min(result["decode"].values()) > 0  # exact, approx and skipped rounds all occur
    assert sum(result["rejections_matched"].values()) >= 30
    assert elapsed < 90


def test_scenarios_are_a_function_of_the_suite_seed_and_respect_the_forgery_budget():
    assert fi.make_scenario(3, 17).as_dict() == fi.make_scenario(3, 17).as_dict()
    assert fi.make_scenario(3, 17).as_dict() != fi.make_scenario(4, 17).as_dict()
    for index in range(200):
        scn = fi.make_scenario(0, index)
        assert scn.n in fi.SIZES and scn.code in fi.CODES and scn.rounds in (3, 4)
        if scn.code == "frc":
            assert scn.n % (scn.s + 1) == 0
        for r in range(1, scn.rounds + 1):
            kinds = [k for (q, _), k in scn.node_faults.items() if q == r]
            assert sum(k in fi.VALUE_FORGING for k in kinds) <= max(1, scn.s)
            assert kinds.count("replay-forged") <= 1
        if scn.timing == "wallclock":
            assert 1 not in scn.round_faults


# =============================================================================== one kind each
def assert_rejected(kind, pattern, *, variant=None, at=(1, 0)):
    out = run(scenario(kind, at=at, variant=variant))
    assert (kind, *at) in out.injected
    row = out.rows[at[0] - 1]
    assert row["rejected"] == 1
    assert re.search(pattern, row["rejected_reasons"][0]), row["rejected_reasons"]
    assert at[1] not in row["clients_used"] and at[1] in row["stragglers"]
    if at[0] == 1:  # (later rounds may find worker 0's replica still busy: approx)
        assert row["decode"] == "exact"  # worker 1 replicates worker 0's partitions (FRC, s=1)
    if row["decode"] == "exact":
        assert_equals_oracle(out, at[0])
    return row


def test_error_reply_from_the_app_is_rejected_naming_the_partition():
    assert_rejected("error", r"error reply \(code 5400: .*failed on partition 0: code 4242")


@pytest.mark.parametrize("variant, where", [(0, "code 5400"), (1, "code 0: ClientAppException")])
def test_exception_in_the_app_or_the_outer_mod_becomes_an_error_reply(variant, where):
    row = assert_rejected("exception", where, variant=variant)
    assert "InjectedFault: injected exception" in row["rejected_reasons"][0]


@pytest.mark.parametrize("kind", ["nan", "inf"])
def test_non_finite_reply_is_rejected(kind):
    assert_rejected(kind, r"array '(w|b)' contains NaN or Inf")


@pytest.mark.parametrize("variant", range(4))
def test_wrong_shape_is_rejected(variant):
    assert_rejected("wrong-shape", r"has shape \(.*\); expected", variant=variant)


@pytest.mark.parametrize("variant, dtype", [(0, "bool"), (1, "int64")])
def test_integer_or_bool_arrays_are_rejected(variant, dtype):
    assert_rejected("wrong-dtype", rf"has dtype {dtype}, not a floating type", variant=variant)


@pytest.mark.parametrize("verify, s", [(False, 1), (True, 2)])
def test_float16_reply_to_a_float64_wire_is_rejected(verify, s):
    out = fi.run_scenario(scenario("wrong-dtype", variant=4, verify=verify, s=s, rounds=1))
    row = out.rows[0]
    assert any("float16" in reason for reason in row["rejected_reasons"]), (
        row["decode"], row["clients_used"], row["rejected_reasons"], out.violations)
    assert 0 not in row["clients_used"]
    assert out.violations == []


@pytest.mark.parametrize(
    "variant, reason",
    [(0, "lacks the 'gradient-coding' ArrayRecord"),
     (1, "lacks the 'gradient-coding-meta' MetricRecord"),
     (2, r"array keys \['(w|b)'\] differ")],
)
def test_missing_records_are_rejected(variant, reason):
    assert_rejected("missing-records", reason, variant=variant)


@pytest.mark.parametrize(
    "variant, reason",
    [(0, r"array bytes are not \.npy"), (1, "array bytes are truncated"),
     (2, r"array bytes are not \.npy"), (3, r"array bytes are not \.npy")],
)
def test_corrupt_bytes_are_rejected_with_a_reason_that_says_so(variant, reason):
    assert_rejected("corrupt-bytes", reason, variant=variant)


@pytest.mark.parametrize(
    "variant, reason",
    [(0, r"'num-examples'=\[1.0, 2.0\] is not a number"),
     (1, r"'compute-s'=\[0.1\] is not a number"),
     (2, r"'metric.train_loss'=\[0.5, 0.5\] is not a number"),
     (3, r"partition-sizes='many' is not a list of numbers")],
)
def test_metrics_of_the_wrong_type_are_rejected(variant, reason):
    assert_rejected("wrong-metric-type", reason, variant=variant)


def test_reply_computed_for_an_earlier_round_is_rejected():
    assert_rejected("replay", r"computed for round 1, not 2", at=(2, 0))


def test_forged_worker_claim_is_rejected():
    assert_rejected("forged-worker", r"claims worker [1-5] but the node is worker 0")


def test_unknown_sender_is_rejected():
    out = run(scenario("unknown-sender"))
    assert ("src_node_id", 0, 1) in out.grid_injected
    row = out.rows[0]
    assert row["rejected_reasons"] == ["unknown sender"]
    assert 0 not in row["clients_used"] and row["decode"] == "exact"
    assert_equals_oracle(out, 1)


def test_reply_sent_under_another_nodes_id_is_rejected_and_that_node_still_counts():
    out = run(scenario("spoofed-sender", at=(1, 2)))
    row = out.rows[0]
    assert row["rejected"] == 1
    assert re.search(fi.REASONS["spoofed-sender"], row["rejected_reasons"][0])
    assert 2 not in row["clients_used"] and row["decode"] == "exact"
    assert_equals_oracle(out, 1)


def test_crash_mid_round_makes_a_straggler_and_the_round_still_decodes():
    t0 = time.perf_counter()
    out = run(scenario("crash"))
    assert ("crash", 0, 1) in out.grid_injected
    first = out.rows[0]
    assert first["rejected"] == 0 and 0 in first["stragglers"] and first["decode"] == "exact"
    assert_equals_oracle(out, 1)
    assert time.perf_counter() - t0 < 10  # waited round_timeout (0.25 s), not forever


def test_duplicated_reply_is_delivered_twice_and_decoded_once():
    out = run(scenario("duplicate"))
    assert ("duplicate", 0, 1) in out.grid_injected
    row = out.rows[0]
    assert row["rejected_reasons"] == ["duplicate sender"] and row["decode"] == "exact"
    assert_equals_oracle(out, 1)


@pytest.mark.parametrize("kind", fi.VALUE_FORGING)
def test_value_forgery_leaves_its_group_out_blaming_nobody_with_verify(kind):
    """FRC s=2 (groups of 3), the forger's reply arrives first. Two agreeing replicas could be
    two colluders, so the forger is not outvoted (before: excluded, exact round): its group is
    left out, nobody in it is blamed, and the other group decodes (approximate round, checked
    by the suite's invariants as a combination of the partitions' updates)."""
    at = (2, 0) if kind == "replay-forged" else (1, 0)
    seed = seed_where_first(0, at[0])
    out = run(scenario(kind, at=at, s=2, verify=True, rounds=at[0], seed=seed))
    assert (kind, *at) in out.injected
    assert_sound(out)
    row = out.rows[at[0] - 1]
    if kind == "forged-consistent":
        # forged coefficients give a num-examples its partition sizes contradict: rejected on
        # arrival, before any comparison (provable from its own reply: an offence)
        assert row["rejected"] == 1
        assert row["rejected_reasons"][0].startswith("partition-sizes=")
    else:
        assert row["disagreement"] > 1e-3
    assert row["inconsistent"] == [] and 0 not in row["clients_used"]
    if row["decode"] != "skipped":
        assert row["decode"] == "approx" and row["verified"] == "verified"
        assert 0 in row["unsettled"] or row["rejected"] == 1


@pytest.mark.parametrize("kind", fi.VALUE_FORGING)
def test_value_forgery_without_redundancy_reaches_the_model_finite(kind):
    """uncoded (s=0): nothing can tell a finite forged reply from an honest one -- the suite
    only checks finiteness there (and counts the round as not compared)."""
    at = (2, 0) if kind == "replay-forged" else (1, 0)
    out = run(scenario(kind, at=at, code="uncoded", s=0, rounds=at[0]))
    row = out.rows[at[0] - 1]
    if kind == "forged-consistent":
        # caught even without redundancy: its num-examples contradicts its partition sizes
        assert row["rejected"] == 1 and 0 not in row["clients_used"]
        assert "do not add up to num-examples" in row["rejected_reasons"][0]
        return
    assert row["decode"] == "exact" and 0 in row["clients_used"]
    assert out.not_compared == 1 and out.compared == at[0] - 1
    got = fi.flat_model(out.models[at[0]])
    expected = fi.flat_model(fi.oracle(out.models[at[0] - 1], 6))
    assert np.isfinite(got).all()
    assert np.linalg.norm(got - expected) > 1e-3 * np.linalg.norm(expected)


# A reply >= 1e6 times too large once masked every other disagreement (the scale came from the
# decoded sum) and got an honest replica excluded; the tests below keep it fixed.


def test_verdict_never_excludes_an_honest_replica_when_a_huge_reply_is_in_the_set():
    from fl_gradcode.codes import make_code
    from fl_gradcode.flower.integrity import verify_replies

    code = make_code("frc", n=8, s=3)  # groups {0,1,2,3}, {4,5,6,7}
    v = np.random.default_rng(0).standard_normal((code.k, 5))
    z = {i: code.B[i] @ v for i in range(8)}
    z[0], z[6] = 1.5 * z[0], 1e30 * z[6]  # two forgers, one per group (s = 3 tolerates both)
    verdict = verify_replies(code, z, [0, 2, 4, 6], 1e-5)
    assert 4 not in verdict.excluded and 2 not in verdict.excluded  # the honest replicas
    # (for contrast: without the 1e30 factor the same pair of forgeries is "contradicted")


@pytest.mark.parametrize("timing, verify", [("wallclock", False), ("virtual", True)])
def test_huge_forgery_cannot_get_an_honest_replica_excluded_end_to_end(timing, verify):
    """Workers 1, 3, 5, 7 crash; 0 scales its reply, 6 multiplies it by 1e30."""
    from flwr.serverapp.strategy import FedAvg

    from fl_gradcode.flower import GradientCoding

    scn = scenario(rounds=1, code="frc", n=8, s=3, timing=timing, verify=verify, seed=3)
    scn.node_faults.update({(1, 0): "scaled", (1, 6): "huge"})
    scn.node_faults.update({(1, w): "crash" for w in (1, 3, 5, 7)})
    scn.variants[(1, 0)] = 1  # x(+1.2..3)
    injector = fi.Injector(scn, fi.node_ids_for(8))
    grid = injector.grid()
    grid.delay = None  # wallclock: the four replies are in hand together
    strategy = GradientCoding(
        FedAvg(fraction_evaluate=0.0, min_available_nodes=8), code="frc", s=3, timing=timing,
        latency=Pareto(1.0, 1.5) if timing == "virtual" else None, seed=3, verify=verify,
        wire="float64", straggler_timeout=1e6 if timing == "virtual" else 0.3,
        round_timeout=0.3,
    )
    models = {}
    with fi.quiet():
        strategy.start(
            grid=grid,
            initial_arrays=ArrayRecord({k: Array(v) for k, v in fi.initial_model().items()}),
            num_rounds=1, train_config=ConfigRecord({}),
            evaluate_fn=lambda r, a: models.__setitem__(r, {k: v.numpy() for k, v in a.items()}),
        )
    row = strategy.history[0]
    assert set(row["inconsistent"]) <= {0, 6}, row["inconsistent"]
    assert np.abs(fi.flat_model(models[1])).max() < 1e6  # the 1e30 forgery never reaches the model


@pytest.mark.parametrize("timing", ["virtual", "wallclock"])
def test_all_slow_round_decodes_nothing_and_keeps_the_model(timing):
    at = (2, 0)
    out = run(scenario(round_kind="all-slow", at=at, rounds=3, timing=timing, timeout=5.0))
    assert ("all-slow", 2, -1) in out.injected
    row = out.rows[1]
    assert row["decode"] == "skipped" and row["clients_used"] == []
    for name in fi.SHAPES:
        np.testing.assert_array_equal(out.models[2][name], out.models[1][name])


@pytest.mark.parametrize("timing", ["virtual", "wallclock"])
def test_after_an_all_busy_round_the_next_round_waits_for_a_free_node(timing):
    """uncoded: round 1 waits for every node, so round 2 sends work to all six, whose replies
    all come after the deadline: round 3 starts with every node busy and must wait."""
    at = (2, 0)
    out = run(scenario(round_kind="all-busy", at=at, rounds=3, timing=timing, timeout=1e6,
                       code="uncoded", s=0))
    assert ("all-busy", 2, -1) in out.injected
    first, second, third = out.rows
    assert first["decode"] == "exact" and second["busy"] == []
    assert second["decode"] == "skipped" and second["clients_used"] == []
    assert len(third["busy"]) < 6  # work was sent: the round was not spent on nothing
    if timing == "wallclock":  # the late replies freed their nodes (counted in round 3)
        assert third["late_dropped"] >= 1
    else:  # virtual: the clock jumped to the first node's arrival; they are counted in round 2
        assert second["late_dropped"] == 6 and third["virtual_s"] > second["virtual_s"]


# =============================================================================== grid options
def _one_round_grid(**options) -> tuple[InProcessGrid, Message]:
    set_task_identity()

    def app(msg, context):
        return Message(RecordDict({"m": MetricRecord({"x": 1.0})}), reply_to=msg)

    grid = InProcessGrid(app, 3, **options)
    msg = Message(RecordDict({"a": ArrayRecord({"w": Array(np.zeros(2))})}),
                  dst_node_id=grid.node_ids[1], message_type=MessageType.TRAIN, group_id="4")
    return grid, msg


def test_in_process_grid_crash_duplicate_and_sender_options():
    grid, msg = _one_round_grid(crash=lambda i, r: (i, r) == (1, 4))
    [mid] = grid.push_messages([msg])
    assert mid and grid.pull_messages([mid]) == [] and grid.pending == 0
    assert grid.injected == [("crash", 1, 4)]

    grid, msg = _one_round_grid(duplicate=lambda i, r: i == 1)
    [mid] = grid.push_messages([msg])
    assert grid.pending == 2
    replies = grid.pull_messages([mid])
    assert len(replies) == 2 and grid.pending == 0 and grid.pull_messages([mid]) == []
    assert {r.metadata.reply_to_message_id for r in replies} == {mid}
    assert len({r.metadata.message_id for r in replies}) == 2

    grid, msg = _one_round_grid(src_node_id=lambda i, r: 77 if r == 4 else None)
    [mid] = grid.push_messages([msg])
    [reply] = grid.pull_messages([mid])
    assert reply.metadata.src_node_id == 77 and grid.injected == [("src_node_id", 1, 4)]


def test_in_process_grid_without_options_is_unchanged():
    grid, msg = _one_round_grid()
    [mid] = grid.push_messages([msg])
    [reply] = grid.pull_messages([mid])
    assert reply.metadata.src_node_id == grid.node_ids[1] and grid.injected == []


def test_readme_fault_injection_figures_are_the_committed_results():
    """The README's fault-injection sentence states what results/fault_injection.json holds."""
    import json

    root = Path(__file__).resolve().parents[2]
    saved = json.loads((root / "results" / "fault_injection.json").read_text())
    text = " ".join((root / "README.md").read_text().split())
    match = re.search(r"(\d+) randomized fault scenarios, (\d+) fault kinds, (\d+) crashes, "
                      r"(\d+) corrupted models, (\d+) wrong models applied as verified, (\d+) "
                      r"runs ended by a node's failure", text)
    assert match is not None
    assert [int(g) for g in match.groups()] == [
        saved["scenarios"], len(saved["faults_injected"]), saved["crashes"],
        saved["corrupted_models"], saved["wrong_models_applied_as_verified"],
        saved["runs_ended_by_node_failure"]]
    assert saved["invariant_violations"] == []
