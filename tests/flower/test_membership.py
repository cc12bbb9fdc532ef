"""Membership that survives a federation: handshake failures, identity claims, cohort sizes.

Every run uses the tiny numpy app of ``test_wrapper`` on ``InProcessGrid`` with the real mod;
expected models come from the independent numpy FedAvg oracle (``fedavg``: the app's train
handler called once per partition, no mod, no code) over the partitions of the nodes that can
take part. Faults are injected from outside the plug-in: the grid's ``crash`` (a node that
never answers), an outer mod that answers the handshake with an error, node configs that claim
another partition.

Membership's rules on their own (grid doubles, no Flower run) and ``code_for_cohort`` are in
``test_membership_rules.py``; the project's ServerApp and launchers in
``test_membership_server.py``.
"""

from __future__ import annotations

import json
import logging
import random
import time

import numpy as np
import pytest
from flwr.app import Error, Message

from fl_gradcode.flower import gradient_coding_mod
from fl_gradcode.flower.membership import Membership
from fl_gradcode.flower.protocol import OP_IDENTIFY, parse_instruction
from fl_gradcode.flower.testing import InProcessGrid
from tests.apps.numpy_app import (
    assert_model,
    fedavg,
    make_app,
    pytestmark,  # noqa: F401 (the warning filter applies here)
    theta0,
)
from tests.flower.harness import SamplingRecorder, run


def chain(rounds: list[list[int]], num_parts: int) -> dict[int, dict[str, np.ndarray]]:
    """The oracle's model after each round: FedAvg over ``rounds[r - 1]``'s partitions."""
    models, theta = {0: theta0()}, theta0()
    for r, parts in enumerate(rounds, start=1):
        theta = fedavg(theta, parts, num_parts) if parts else theta  # idle: model kept
        models[r] = theta
    return models


def assert_rounds(outcome, expected: dict[int, dict[str, np.ndarray]]) -> None:
    assert sorted(outcome.models) == sorted(expected)
    for r, model in expected.items():
        assert_model(outcome.models[r], model)


# ================================================================== handshake failures
@pytest.mark.parametrize("timing", ["virtual", "wallclock"])
def test_node_down_from_the_first_round_is_a_straggler_and_the_run_completes(timing, tmp_path):
    """Node 5 never answers anything: it is a straggler of its partition, which its replicas
    compute (s=1): every round decodes exactly, the model is FedAvg over all six partitions,
    and rounds.jsonl names node 5 as unidentified."""
    grid = InProcessGrid(make_app(gradient_coding_mod), 6, crash=lambda i, r: i == 5)
    dead = grid.node_ids[5]
    outcome = run(6, code="grouped-rs", s=1, rounds=3, grid=grid, timing=timing,
                  warmup_timeout=0.3, straggler_timeout=5.0, results_dir=str(tmp_path))
    assert [row["decode"] for row in outcome.rows] == ["exact"] * 3
    assert_rounds(outcome, chain([list(range(6))] * 3, 6))
    rows = [json.loads(line) for line in (tmp_path / "rounds.jsonl").read_text().splitlines()]
    assert [row["unidentified"] for row in rows] == [[dead]] * 3
    assert [row["identity_rejected"] for row in rows] == [[]] * 3


def test_a_dead_node_costs_the_warmup_once_then_only_the_retry_timeout(monkeypatch):
    """After its first failed handshake a dead node is waited for at most the retry timeout:
    four rounds take about one warmup, not four."""
    monkeypatch.setattr(Membership, "RETRY_TIMEOUT_S", 0.05)
    grid = InProcessGrid(make_app(gradient_coding_mod), 4, crash=lambda i, r: i == 3)
    t0 = time.monotonic()
    outcome = run(4, code="grouped-rs", s=1, rounds=4, grid=grid, warmup_timeout=1.0)
    elapsed = time.monotonic() - t0
    assert [len(row["unidentified"]) for row in outcome.rows] == [1, 1, 1, 1]
    assert 1.0 <= elapsed < 2.5  # four warmups would be >= 4 s


def flaky_identify(failures: int):
    """An OUTER mod that answers the first ``failures`` handshakes with an error reply."""
    asked = []

    def mod(msg: Message, context, call_next) -> Message:
        instruction = parse_instruction(msg.content) if msg.has_content() else None
        if instruction is not None and instruction.op == OP_IDENTIFY:
            asked.append(1)
            if len(asked) <= failures:
                return Message(Error(0, "node config not loaded yet"), reply_to=msg)
        return call_next(msg, context)

    return mod


def test_node_erroring_at_the_handshake_recovers_and_gets_work_again():
    """Node 2 answers the handshakes of rounds 1 and 2 with an error: it is a straggler in
    those rounds (its partition computed by its replicas: FedAvg over all six) and takes part
    again from round 3."""
    apps = [make_app(gradient_coding_mod)] * 6
    apps[2] = make_app(flaky_identify(2), gradient_coding_mod)
    grid = InProcessGrid(None, 6, apps=apps)
    node = grid.node_ids[2]
    outcome = run(6, code="grouped-rs", s=1, rounds=4, grid=grid, warmup_timeout=0.3)
    assert_rounds(outcome, chain([list(range(6))] * 4, 6))
    assert [row["unidentified"] for row in outcome.rows] == [[node], [node], [], []]
    assert [len(row["clients_used"]) + len(row["stragglers"]) for row in outcome.rows] == [
        6, 6, 6, 6]
    assert [row["nodes"]["used"].count(node) for row in outcome.rows][:2] == [0, 0]


def test_an_error_reply_written_for_a_node_is_that_nodes_failure(caplog):
    """Flower's SuperLink answers a message to an unreachable node with an error reply under
    its own id (1): the reply is matched to the node by the message it answers."""
    apps = [make_app(gradient_coding_mod)] * 4
    apps[2] = make_app(flaky_identify(99), gradient_coding_mod)
    grid = InProcessGrid(None, 4, apps=apps,
                         src_node_id=lambda i, r: 1 if (i, r) == (2, 0) else None)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        outcome = run(4, code="grouped-rs", rounds=1, grid=grid, warmup_timeout=0.3)
    assert outcome.rows[0]["unidentified"] == [grid.node_ids[2]]
    warned = [r.getMessage() for r in caplog.records if "handshake" in r.getMessage()]
    assert f"node {grid.node_ids[2]}: error reply (code 0: node config not loaded yet)" in \
        warned[0]
    assert "not loaded yet)..." not in warned[0]  # a short reason is not cut


def test_dead_node_first_sampled_in_a_later_round_does_not_end_the_run():
    """fraction_train=0.5 over 6 nodes; the node that is dead is one not sampled in round 1
    (chosen when it is first sampled, so it never answered anything): the run completes and
    every round is FedAvg over the partitions of the round's sampled live nodes and, for the
    dead node, the partition nobody has claimed that it stands for (named in the row)."""
    random.seed(11)
    inner = SamplingRecorder(fraction_train=0.5, fraction_evaluate=0.0)
    state: dict[str, int] = {}

    def crash(i: int, server_round: int) -> bool:  # called once the grid exists
        node = grid.node_ids[i]
        if "dead" not in state and len(inner.sampled) >= 2 and node in inner.sampled[-1] and \
                all(node not in cohort for cohort in inner.sampled[:-1]):
            state["dead"] = node
        return state.get("dead") == node

    grid = InProcessGrid(make_app(gradient_coding_mod), 6, crash=crash)
    outcome = run(6, code="grouped-rs", s=1, rounds=6, grid=grid, inner=inner,
                  warmup_timeout=0.3)
    assert "dead" in state  # the scenario happened: first sampled after round 1
    dead = state["dead"]
    first = next(r for r, cohort in enumerate(inner.sampled, start=1) if dead in cohort)
    assert first > 1
    parts = []
    for r, (cohort, row) in enumerate(zip(inner.sampled, outcome.rows, strict=True), start=1):
        live = [grid.index[n] for n in cohort if n != dead]
        stand_in = [p for p, node in zip(row["partitions"]["stragglers"],
                                         row["nodes"]["stragglers"], strict=True)
                    if node is None]
        assert len(stand_in) == (1 if dead in cohort else 0)
        # a partition no node sampled so far has claimed (the dead node's among them)
        claimed = {grid.index[n] for c in inner.sampled[:r] for n in c if n != dead}
        assert not set(stand_in) & claimed
        parts.append(live + stand_in)
        assert row["unidentified"] == ([dead] if dead in cohort else [])
        assert row["decode"] == "exact"
    assert_rounds(outcome, chain(parts, 6))


def test_no_node_running_the_mod_ends_the_run_after_three_rounds_with_the_hint(tmp_path):
    """No decodable set can ever form: rounds 1 and 2 are idle (recorded, every node
    unidentified) and round 3 ends the run with the mod / node-config hint."""
    grid = InProcessGrid(make_app(), 3)
    with pytest.raises(RuntimeError, match="gradient_coding_mod") as info:
        run(3, rounds=5, grid=grid, warmup_timeout=0.3, results_dir=str(tmp_path))
    message = str(info.value)
    assert "3 rounds in a row" in message and f"node {min(grid.node_ids)}" in message
    rows = [json.loads(line) for line in (tmp_path / "rounds.jsonl").read_text().splitlines()]
    assert [(row["round"], row["decode"]) for row in rows] == [(1, "skipped"), (2, "skipped")]
    assert all(row["unidentified"] == sorted(grid.node_ids) for row in rows)


def test_a_run_whose_nodes_all_fail_at_first_carries_on_once_one_answers():
    """Every node errors at its first two handshakes: rounds 1-2 are idle, round 3 trains
    (the patience counts rounds in a row; a node that answers resets it)."""
    grid = InProcessGrid(None, 3, apps=[make_app(flaky_identify(2), gradient_coding_mod)
                                        for _ in range(3)])
    outcome = run(3, code="grouped-rs", rounds=4, grid=grid, warmup_timeout=0.3)
    assert [row["decode"] for row in outcome.rows] == ["skipped", "skipped", "exact", "exact"]
    assert_rounds(outcome, chain([[], [], [0, 1, 2], [0, 1, 2]], 3))


def test_node_without_the_mod_is_a_straggler_named_in_the_log(caplog):
    apps = [make_app(gradient_coding_mod)] * 5 + [make_app()]
    grid = InProcessGrid(None, 6, apps=apps)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        outcome = run(6, code="grouped-rs", rounds=2, grid=grid, warmup_timeout=0.3)
    assert_rounds(outcome, chain([list(range(6))] * 2, 6))  # partition 5: its replicas
    warned = [r.getMessage() for r in caplog.records if "handshake" in r.getMessage()]
    assert warned and f"node {grid.node_ids[5]}" in warned[0]
    assert "gradient_coding_mod" in warned[0]


def test_a_handshake_error_text_is_logged_on_one_bounded_line(caplog):
    def noisy(msg, context, call_next):
        instruction = parse_instruction(msg.content) if msg.has_content() else None
        if instruction is not None and instruction.op == OP_IDENTIFY:
            return Message(Error(0, "line\nforged " + "x" * 5000), reply_to=msg)
        return call_next(msg, context)

    apps = [make_app(gradient_coding_mod)] * 3 + [make_app(noisy, gradient_coding_mod)]
    grid = InProcessGrid(None, 4, apps=apps)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        run(4, code="grouped-rs", rounds=1, grid=grid, warmup_timeout=0.3)
    warned = [r.getMessage() for r in caplog.records if "handshake" in r.getMessage()]
    assert "\n" not in warned[0] and len(warned[0]) < 1400 and "line forged xxx" in warned[0]
    start = warned[0].index("error reply (code 0: line forged ")
    # the client's reason: its first 300 characters (whitespace collapsed), then the
    # explanation, whole (it used to be cut at 300 characters with the reason)
    reason = warned[0][start:start + 21 + 300]
    assert reason == ("error reply (code 0: line forged " + "x" * 5000)[:321]
    assert warned[0][start + 321:start + 324] == "): "
    assert "add it as the first mod, ClientApp(mods=[gradient_coding_mod, ...])" in warned[0]


def test_an_error_reply_written_for_a_node_in_a_training_round_names_that_node():
    """The SuperLink's error reply for an unreachable node carries the SuperLink's id (1): in a
    training round it is matched to the node by the message it answers, so the round records
    that node's failure with its reason, not an 'unknown sender'."""

    def down(msg: Message, context, call_next) -> Message:
        instruction = parse_instruction(msg.content) if msg.has_content() else None
        if instruction is not None and instruction.op != OP_IDENTIFY:
            return Message(Error(0, "node unreachable"), reply_to=msg)
        return call_next(msg, context)

    apps = [make_app(gradient_coding_mod)] * 4
    apps[2] = make_app(down, gradient_coding_mod)
    grid = InProcessGrid(None, 4, apps=apps,
                         src_node_id=lambda i, r: 1 if (i, r) == (2, 1) else None)
    outcome = run(4, code="grouped-rs", rounds=1, grid=grid)
    row = outcome.rows[0]
    assert row["decode"] == "exact"
    assert row["rejected_reasons"] == ["error reply (code 0: node unreachable)"]
    assert row["nodes"]["rejected"] == [grid.node_ids[2]]


# ================================================================== identity claims
def test_two_nodes_claiming_one_partition_are_both_stragglers_of_it(caplog):
    """Nodes 0 and 5 both claim partition 0 of 6: neither claim is used (no first-come or
    lowest-id rule), both are named in the log and in identity_rejected; partitions 0 and 5
    are computed by their replicas (s=2): the model is FedAvg over all six."""
    grid = InProcessGrid(make_app(gradient_coding_mod), 6,
                         node_config=lambda i: {"partition-id": i % 5})
    pair = sorted([grid.node_ids[0], grid.node_ids[5]])
    with caplog.at_level(logging.WARNING, logger="flwr"):
        outcome = run(6, code="grouped-rs", s=2, rounds=2, grid=grid)
    assert_rounds(outcome, chain([list(range(6))] * 2, 6))
    assert [row["decode"] for row in outcome.rows] == ["exact"] * 2
    assert [row["identity_rejected"] for row in outcome.rows] == [pair, pair]
    warned = [r.getMessage() for r in caplog.records if "excluded: its identity" in
              r.getMessage()]
    assert len(warned) == 2  # once per node and reason
    assert f"node {pair[0]}" in warned[0] and f"as does node {pair[1]}" in warned[0]


@pytest.mark.parametrize("liar", [0, 3, 5])
def test_lone_claimant_of_partition_0_of_1_among_six_is_excluded(liar):
    """A node claiming (0, 1) among nodes claiming num-partitions=6 is excluded (the
    majority's num-partitions); the other five train their own partitions and the partition
    nobody claims is computed by its replicas."""
    grid = InProcessGrid(
        make_app(gradient_coding_mod), 6,
        node_config=lambda i: {"partition-id": 0, "num-partitions": 1} if i == liar else {},
    )
    outcome = run(6, code="grouped-rs", rounds=2, grid=grid)
    assert_rounds(outcome, chain([list(range(6))] * 2, 6))
    assert [row["identity_rejected"] for row in outcome.rows] == [[grid.node_ids[liar]]] * 2


def test_out_of_range_claim_is_excluded_not_retried():
    grid = InProcessGrid(make_app(gradient_coding_mod), 6,
                         node_config=lambda i: {"partition-id": 9} if i == 4 else {})
    pushed = []
    push = grid.push_messages

    def recording(messages):
        messages = list(messages)
        pushed.extend(m.metadata.dst_node_id for m in messages if m.metadata.group_id ==
                      "identify")
        return push(messages)

    grid.push_messages = recording
    outcome = run(6, code="grouped-rs", rounds=3, grid=grid)
    assert_rounds(outcome, chain([list(range(6))] * 3, 6))  # partition 4: its replicas
    assert [row["identity_rejected"] for row in outcome.rows] == [[grid.node_ids[4]]] * 3
    assert pushed.count(grid.node_ids[4]) == 1  # a node config does not change: asked once


# ================================================================== cohort sizes
def test_frc_with_a_cohort_size_it_cannot_take_falls_back_to_grouped_rs_once(caplog):
    """FRC s=1 over 5 nodes ((s+1) does not divide 5): grouped-rs with s=1 (exact for every
    n, the same tolerance and load), one WARNING for the size, every round exact."""
    with caplog.at_level(logging.WARNING, logger="flwr"):
        outcome = run(5, code="frc", s=1, rounds=3)
    assert_rounds(outcome, chain([list(range(5))] * 3, 5))
    assert [row["s"] for row in outcome.rows] == [1, 1, 1]
    assert outcome.strategy.code_for(5).name == "grouped-rs"
    warned = [r.getMessage() for r in caplog.records if "cannot take a cohort of 5" in
              r.getMessage()]
    assert len(warned) == 1 and "using grouped-rs with s=1" in warned[0]


def test_an_s_the_cohort_cannot_tolerate_runs_capped_with_one_warning(caplog):
    """s=5 over 3 nodes: the rounds run s=2 (the most 3 replies can lose and leave one), and
    the log says so once, naming both tolerances."""
    with caplog.at_level(logging.WARNING, logger="flwr"):
        outcome = run(3, code="grouped-rs", s=5, rounds=2)
    assert [row["s"] for row in outcome.rows] == [2, 2]
    assert [row["decode"] for row in outcome.rows] == ["exact"] * 2
    warned = [r.getMessage() for r in caplog.records
              if "s=5 stragglers cannot be tolerated with a cohort of 3" in r.getMessage()]
    assert len(warned) == 1 and warned[0].endswith("using grouped-rs with s=2 for cohorts of 3")


def test_frc_with_a_dead_node_keeps_its_size_and_decodes_every_partition_exactly():
    grid = InProcessGrid(make_app(gradient_coding_mod), 6, crash=lambda i, r: i == 1)
    outcome = run(6, code="frc", s=1, rounds=2, grid=grid, warmup_timeout=0.3)
    assert_rounds(outcome, chain([list(range(6))] * 2, 6))
    assert [row["decode"] for row in outcome.rows] == ["exact"] * 2
