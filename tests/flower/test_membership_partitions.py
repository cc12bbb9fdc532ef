"""Rounds are about partitions: a dead node's partition is computed by its replicas, and an
impostor's claim cannot evict an honest holder.

The federation is Flower's quickstart shape on ``InProcessGrid``: 6 nodes, ``grouped-rs``,
``s=2``. Faults come from outside the plug-in: an OUTER mod that raises on every message
(the app fails from the first message: the handshake too), node configs that claim another
partition, a grid whose node list changes (a SuperNode re-registering under a new node id).
Expected models come from the independent numpy FedAvg oracle over ALL partitions.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from flwr.app import Message

from fl_gradcode.flower import GradientCoding, gradient_coding_mod
from fl_gradcode.flower.testing import InProcessGrid
from tests.apps.numpy_app import (
    fedavg,
    flat,
    make_app,
    num_examples,
    pytestmark,  # noqa: F401 (the warning filter applies here)
    theta0,
)
from tests.flower.harness import run


def raising(msg: Message, context, call_next) -> Message:
    """An OUTER mod of a node whose app fails on every message, the first one included."""
    raise RuntimeError("the app cannot load its data")


def oracle(rounds: int, parts, num_parts: int = 6) -> dict[int, dict[str, np.ndarray]]:
    models, theta = {0: theta0()}, theta0()
    for r in range(1, rounds + 1):
        theta = fedavg(theta, parts, num_parts)
        models[r] = theta
    return models


def assert_close(got, expected) -> None:
    np.testing.assert_allclose(flat(got), flat(expected), rtol=1e-6, atol=1e-9)


def rows_of(path) -> list[dict]:
    return [json.loads(line) for line in (path / "rounds.jsonl").read_text().splitlines()]


def dead_grid(dead: set[int], n: int = 6, **kwargs) -> InProcessGrid:
    apps = [make_app(raising, gradient_coding_mod) if i in dead else make_app(gradient_coding_mod)
            for i in range(n)]
    return InProcessGrid(None, n, apps=apps, **kwargs)


# ================================================================== dead from the first message
@pytest.mark.parametrize("timing", ["virtual", "wallclock"])
def test_two_nodes_dead_from_the_first_message_cost_no_partition_with_s_2(timing, tmp_path):
    """Nodes 0 and 3 raise on every message: every round is exact and the model is FedAvg
    over all six partitions (204 examples, not the 138 of the four live nodes)."""
    grid = dead_grid({0, 3})
    outcome = run(6, code="grouped-rs", s=2, rounds=3, grid=grid, timing=timing,
                  warmup_timeout=0.5, straggler_timeout=5.0, results_dir=str(tmp_path))
    expected = oracle(3, range(6))
    for r in range(4):
        assert_close(outcome.models[r], expected[r])
    rows = rows_of(tmp_path)
    assert [row["decode"] for row in rows] == ["exact"] * 3
    assert [row["num_examples"] for row in rows] == [sum(map(num_examples, range(6)))] * 3
    assert all(row["missing_partitions"] == [] and row["missing_weight"] == 0.0
               for row in rows)
    assert all(row["unidentified"] == sorted([grid.node_ids[0], grid.node_ids[3]])
               for row in rows)
    # the dead nodes' partitions are named among the stragglers (their placeholders)
    assert all({0, 3} <= set(row["partitions"]["stragglers"]) for row in rows)


def test_three_dead_nodes_with_s_2_are_never_an_exact_round(tmp_path):
    """Three nodes dead from the first message, s=2, the three of one replica group
    (grouped-rs over 6 with s=2: groups {0,1,2} and {3,4,5}): no round may be called exact;
    each names the partitions it is missing, with their share of the examples (an applied
    round) or all of them (a skipped one)."""
    dead = {0, 1, 2}
    outcome = run(6, code="grouped-rs", s=2, rounds=2, grid=dead_grid(dead),
                  warmup_timeout=0.3, max_decode_error=1.0, results_dir=str(tmp_path))
    rows = rows_of(tmp_path)
    assert [row["decode"] for row in rows] != ["exact"] * 2
    for row in rows:
        assert row["decode"] in ("approx", "skipped")
        assert row["missing_partitions"], row
        assert set(row["missing_partitions"]) == (dead if row["decode"] == "approx"
                                                  else set(range(6)))
        # their share of the examples when the server knows each partition's size, else of
        # the round's partitions
        by_examples = sum(map(num_examples, row["missing_partitions"])) / sum(
            map(num_examples, range(6)))
        by_count = len(row["missing_partitions"]) / 6
        assert row["missing_weight"] in (pytest.approx(by_examples), pytest.approx(by_count))
    assert outcome.rows == outcome.strategy.history


def test_a_node_that_never_registers_is_a_straggler_of_its_partition_with_num_partitions(
        tmp_path):
    """The server is told the federation has 6 partitions; only 5 nodes ever connect (the
    sixth SuperNode never starts): partition 5 is computed by its replicas, every round
    exact over all six partitions."""
    grid = InProcessGrid(make_app(gradient_coding_mod), 5,
                         node_config=lambda i: {"num-partitions": 6})
    outcome = run(5, code="grouped-rs", s=1, rounds=2, grid=grid, num_partitions=6,
                  results_dir=str(tmp_path))
    expected = oracle(2, range(6))
    assert_close(outcome.models[2], expected[2])
    assert [row["decode"] for row in rows_of(tmp_path)] == ["exact"] * 2


# ================================================================== identity clashes
@pytest.mark.parametrize("impostor", [0, 1, 2, 4, 5])
def test_an_impostor_claiming_a_partition_cannot_evict_its_holder(impostor):
    """Whatever its node id or answer order, a node claiming node 3's partition makes both
    claimants stragglers of partition 3 (its replicas compute it): the model is FedAvg over
    all six partitions (the impostor's own partition too), every round exact with s=2."""
    grid = InProcessGrid(make_app(gradient_coding_mod), 6,
                         node_config=lambda i: {"partition-id": 3} if i == impostor else {})
    outcome = run(6, code="grouped-rs", s=2, rounds=2, grid=grid)
    expected = oracle(2, range(6))
    assert_close(outcome.models[2], expected[2])
    assert [row["decode"] for row in outcome.rows] == ["exact"] * 2
    clash = sorted([grid.node_ids[3], grid.node_ids[impostor]])
    assert [row["identity_rejected"] for row in outcome.rows] == [clash] * 2


def test_in_sampled_rounds_both_claimants_of_a_partition_stand_for_two_partitions():
    """Half of six nodes sampled a round, node 1 claiming node 3's partition: a round that
    samples both claimants has a partition for each sampled node (the contested one once, a
    partition nobody claims for the other), not one fewer: it used to leave partition 1 out
    of every round while saying exact. Both claimants are placeholders there, more than
    s = 1 can cover: the round says approx and names what it misses. An exact round's model
    is FedAvg over the round's recorded partitions."""
    import random

    from tests.flower.harness import SamplingRecorder

    random.seed(1)
    inner = SamplingRecorder(fraction_train=0.5, fraction_evaluate=0.0)
    grid = InProcessGrid(make_app(gradient_coding_mod), 6,
                         node_config=lambda i: {"partition-id": 3} if i == 1 else {})
    outcome = run(6, code="grouped-rs", s=1, rounds=12, grid=grid, inner=inner,
                  num_partitions=6)
    both = 0
    for row, cohort in zip(outcome.rows, inner.sampled, strict=True):
        parts = sorted(row["partitions"]["used"] + row["partitions"]["stragglers"])
        assert len(parts) == len(cohort), (row["round"], parts, cohort)
        claimants = {grid.node_ids[1], grid.node_ids[3]}
        if claimants <= set(cohort):
            both += 1
            assert 3 in parts and row["decode"] == "approx" and row["missing_partitions"]
            continue
        assert row["decode"] == "exact", row
        expected = fedavg(outcome.models[row["round"] - 1], parts, 6)
        assert_close(outcome.models[row["round"]], expected)
    assert both > 0  # the seed samples both claimants in some round


def test_with_a_roster_an_impostor_is_refused_and_the_holder_keeps_its_partition(tmp_path):
    """The operator's roster (a JSON file of node id -> partition) names each node's
    partition: the impostor claiming partition 3 is refused, node 3 trains partition 3."""
    grid = InProcessGrid(make_app(gradient_coding_mod), 6,
                         node_config=lambda i: {"partition-id": 3} if i == 1 else {})
    roster = tmp_path / "roster.json"
    roster.write_text(json.dumps({str(node): i for i, node in enumerate(grid.node_ids)}))
    outcome = run(6, code="grouped-rs", s=1, rounds=2, grid=grid, roster=str(roster))
    assert_close(outcome.models[2], oracle(2, range(6))[2])
    assert [row["identity_rejected"] for row in outcome.rows] == [[grid.node_ids[1]]] * 2
    assert all(grid.node_ids[3] in row["nodes"]["used"] for row in outcome.rows)


def test_sybils_that_tie_the_num_partitions_vote_do_not_win_it(caplog):
    """Three nodes claim num-partitions=3 against three claiming 6: a tie accepts no claim
    (rounds skipped, every claimant named, the tie logged)."""
    grid = InProcessGrid(make_app(gradient_coding_mod), 6,
                         node_config=lambda i: {"num-partitions": 3} if i < 3 else {})
    outcome = run(6, code="grouped-rs", s=2, rounds=2, grid=grid)
    assert [row["decode"] for row in outcome.rows] == ["skipped"] * 2
    assert [row["identity_rejected"] for row in outcome.rows] == [sorted(grid.node_ids)] * 2
    assert any("tied" in r.getMessage() for r in caplog.records)


def test_a_sybil_majority_does_not_set_num_partitions_configured_on_the_server():
    """Four of six nodes claim num-partitions=3 (a majority of the vote); the server is
    configured with num_partitions=6: the four are excluded, their partitions computed by
    their replicas (grouped-rs s=2: each group keeps a live node), FedAvg over all six."""
    sybils = {0, 1, 3, 4}
    grid = InProcessGrid(make_app(gradient_coding_mod), 6, node_config=lambda i: {
        "partition-id": i % 3, "num-partitions": 3} if i in sybils else {})
    outcome = run(6, code="grouped-rs", s=2, rounds=2, grid=grid, num_partitions=6)
    assert [row["decode"] for row in outcome.rows] == ["exact"] * 2
    assert outcome.rows[0]["identity_rejected"] == sorted(grid.node_ids[i] for i in sybils)
    assert_close(outcome.models[2], oracle(2, range(6))[2])


def test_a_num_partitions_that_is_not_a_count_is_refused():
    from flwr.serverapp.strategy import FedAvg

    with pytest.raises(ValueError, match="num_partitions=0 must be an integer >= 1"):
        GradientCoding(FedAvg(), num_partitions=0)
    with pytest.raises(ValueError, match="roster: nodes 5 and 7 both hold partition 0"):
        GradientCoding(FedAvg(), roster={5: 0, 7: 0})


def test_the_server_apps_roster_key_refuses_a_node_it_does_not_name(tmp_path):
    """server.app's job (run-config ``roster``: a JSON file) on 6 in-process nodes; the roster
    names nodes 0-4 only: node 5's claim is refused every round, its partition computed by its
    replica, every round exact."""
    from server.app import run_in_process

    ids = InProcessGrid(make_app(), 6).node_ids  # the in-process nodes' ids
    roster = tmp_path / "roster.json"
    roster.write_text(json.dumps({"num-partitions": 6,
                                  "nodes": {str(node): i for i, node in enumerate(ids[:5])}}))
    strategy, theta = run_in_process(
        {"code": "frc", "s": 1, "num-rounds": 2, "latency": "none", "virtual-compute": "none",
         "roster": str(roster), "results-dir": str(tmp_path / "run")}, 6)
    rows = strategy.history
    assert [r["decode"] for r in rows] == ["exact"] * 2
    assert [r["identity_rejected"] for r in rows] == [[ids[5]]] * 2
    assert [r["missing_partitions"] for r in rows] == [[]] * 2
    assert np.all(np.isfinite(theta))


# ================================================================== quarantine follows the claim
def lying(msg: Message, context, call_next) -> Message:
    """An OUTER mod: the coded reply of every train round shifted by 5 (a wrong gradient)."""
    from flwr.app import Array, ArrayRecord, MessageType

    from fl_gradcode.flower.protocol import PROTOCOL_KEY

    reply = call_next(msg, context)
    if msg.metadata.message_type != MessageType.TRAIN or reply.has_error() or \
            PROTOCOL_KEY not in reply.content.array_records:
        return reply
    record = reply.content.array_records[PROTOCOL_KEY]
    reply.content.array_records[PROTOCOL_KEY] = ArrayRecord(
        {k: Array(v.numpy() + 5.0) for k, v in record.items()})
    return reply


class ReRegistering(InProcessGrid):
    """Node ``who`` comes back under node id ``new_id`` once round ``after`` was sent (its old
    id is no longer listed: a SuperNode restarted with a fresh identity)."""

    def __init__(self, *args, who: int, new_id: int, after: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.who, self.new_id, self.after, self.last_round = who, new_id, after, 0

    def push_messages(self, messages):
        messages = list(messages)
        for msg in messages:
            if msg.metadata.group_id.isdigit():
                self.last_round = max(self.last_round, int(msg.metadata.group_id))
        return super().push_messages(messages)

    def get_node_ids(self):
        old = self.node_ids[self.who]
        if self.last_round >= self.after and old != self.new_id:
            from flwr.app import Context

            ctx = self.contexts.pop(old)
            self.contexts[self.new_id] = Context(
                run_id=ctx.run_id, node_id=self.new_id, node_config=dict(ctx.node_config),
                state=ctx.state, run_config=dict(ctx.run_config))
            self.node_ids[self.who] = self.new_id
            self.index = {node: i for i, node in enumerate(self.node_ids)}
        return super().get_node_ids()


def erring(msg: Message, context, call_next) -> Message:
    """An OUTER mod: every train message answered with an error reply (an offence the server
    can prove from the reply alone)."""
    from flwr.app import Error, MessageType

    if msg.metadata.message_type == MessageType.TRAIN and "arrays" in msg.content.array_records:
        return Message(Error(code=2, reason="ValueError: out of memory"), reply_to=msg)
    return call_next(msg, context)


def test_a_quarantined_node_re_registering_under_a_new_id_stays_quarantined(tmp_path):
    """Node 1 answers every train message with an error (under ``verify=True`` an offence it
    proves itself): after two offences it is quarantined (rounds 3-7). After round 3 it comes
    back under a new node id, claiming its partition again: the quarantine follows the
    partition, so the new id is still sent no work and no honest node is ever quarantined."""
    apps = [make_app(gradient_coding_mod)] * 6
    apps[1] = make_app(erring, gradient_coding_mod)
    grid = ReRegistering(None, 6, apps=apps, who=1, new_id=424242, after=3)
    liar = grid.node_ids[1]
    outcome = run(6, code="frc", s=2, rounds=6, grid=grid, verify=True,
                  results_dir=str(tmp_path))
    rows = rows_of(tmp_path)
    assert grid.node_ids[1] == 424242  # the scenario happened
    assert [row["quarantined"] for row in rows][2:] == [[liar], [424242], [424242],
                                                       [424242]]
    assert all(liar not in row["nodes"]["used"] and 424242 not in row["nodes"]["used"]
               for row in rows)
    honest = {grid.node_ids[i] for i in (0, 2, 3, 4, 5)}
    assert not honest & {n for row in rows for n in row["quarantined"]}
    # verify=True: the erring node's replica group (partitions 0-2) cannot be settled by s + 1
    # agreeing replicas, so it is left out and every round says so
    assert [(row["decode"], row["missing_partitions"]) for row in rows] == \
        [("approx", [0, 1, 2])] * 6
    assert_close(outcome.models[6], oracle(6, [3, 4, 5])[6])


# ================================================================== the roster's formats
@pytest.mark.parametrize("given", [
    {"7": 0, "9": 1},
    {"num-partitions": 3, "nodes": {"7": 0, "9": 1}},
])
def test_a_roster_file_in_either_format_names_each_nodes_partition(tmp_path, given):
    from fl_gradcode.flower.roster import load_roster

    path = tmp_path / "roster.json"
    path.write_text(json.dumps(given))
    roster = load_roster(str(path))
    assert dict(roster.holder) == {7: 0, 9: 1}
    assert roster.num_partitions == given.get("num-partitions", 2)
    assert load_roster("") is None and load_roster(None) is None


@pytest.mark.parametrize(("given", "message"), [
    ({"7": 2, "9": 1}, "roster: node 7 holds partition 2, not in 0..1"),
    ({"7": "x"}, "roster: partition of node 7='x' must be an integer"),
    ({"num-partitions": 2, "nodes": {"7": 0}, "extra": 1}, r"unknown key\(s\) \['extra'\]"),
    ({"num-partitions": 0, "nodes": {}}, "num-partitions=0 must be >= 1"),
    # two spellings of one node id: the later entry silently replaced the earlier
    ({"num-partitions": 3, "nodes": {"123": 0, "0123": 1}},
     r"roster: node ids '123' and '0123' are both node 123"),
    ({"123": 0, " 123": 1}, r"roster: node ids '123' and ' 123' are both node 123"),
])
def test_a_bad_roster_is_refused_naming_the_entry(given, message):
    from fl_gradcode.flower.roster import load_roster

    with pytest.raises(ValueError, match=message):
        load_roster(given)


def test_a_roster_that_cannot_be_read_is_refused_naming_the_path(tmp_path):
    from fl_gradcode.flower.roster import load_roster

    with pytest.raises(ValueError, match="cannot read it"):
        load_roster(str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="is not JSON"):
        load_roster(str(tmp_path / "bad.json"))


# ================================================================== sampled rounds
class _Claims:
    """Connected nodes answering the handshake with ``claims``; the others never answer."""

    def __init__(self, claims, listed):
        self.claims, self.listed = dict(claims), sorted(listed)

    def get_node_ids(self):
        return list(self.listed)

    def send_and_receive(self, msgs, timeout=None):
        from fl_gradcode.flower.protocol import identity_reply

        return [identity_reply(m, *self.claims[m.metadata.dst_node_id]) for m in msgs
                if m.metadata.dst_node_id in self.claims]


def test_a_sampled_node_that_fails_its_handshake_stands_for_its_roster_partition():
    """Nodes 10-15 hold partitions 0-5 by the roster; a round samples 10, 12 and 14, and 14
    never answers: the round's partitions are 0, 2 and 4, partition 4 on a placeholder."""
    from fl_gradcode.flower.membership import Membership, placeholder
    from fl_gradcode.flower.roster import load_roster

    roster = load_roster({str(10 + j): j for j in range(6)})
    members = Membership(0.2, roster=roster, seed=0)
    grid = _Claims({10 + j: (j, 6) for j in range(6) if j != 4}, listed=range(10, 16))
    assert members.admit(grid, [10, 12, 14], 1) == [10, 12, placeholder(4)]
    assert members.row_fields(1)["unidentified"] == [14]


def test_without_a_roster_a_sampled_node_that_fails_stands_for_an_unclaimed_partition():
    """Without a roster the stand-in is a partition no connected node claims, drawn from the
    seed (the same seed and round: the same draw)."""
    from fl_gradcode.flower.membership import Membership

    grid = _Claims({10 + j: (j, 6) for j in range(4)}, listed=range(10, 16))
    drawn = []
    for _ in range(2):
        members = Membership(0.2, seed=3)
        members.admit(grid, [10, 11, 12, 13], 1)  # partitions 0-3 claimed
        slots = members.admit(grid, [10, 14], 2)  # 14 never answers
        assert slots[0] == 10 and len(slots) == 2 and slots[1] < 0
        drawn.append(members.roles[slots[1]].partition_id)
    assert drawn[0] == drawn[1] and drawn[0] in (4, 5)
