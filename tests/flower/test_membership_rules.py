"""Membership's rules on their own, on grid doubles (no Flower run): the handshake (not
delivered, malformed, unanswered, the nonce), identity claims (the majority's num-partitions,
contested partitions, a SuperNode back under a new node id, a departed node's claim), the
handshake warnings and when membership ends the run; and ``code_for_cohort``: the code a cohort
of another size, or an ``s`` it cannot tolerate, gets instead, and the reason it gives.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from flwr.app import Message

from fl_gradcode.codes import make_code
from fl_gradcode.flower.membership import Membership, code_for_cohort
from fl_gradcode.flower.protocol import OP_IDENTIFY, identity_reply, parse_instruction


# ================================================================== handshake and identity claims
class _Grid:
    """Answers each handshake with the claims given for the asked nodes."""

    def __init__(self, claims: dict[int, tuple[int, int]]):
        self.claims = claims

    def send_and_receive(self, messages, *, timeout=None):
        out = []
        for msg in messages:
            node = msg.metadata.dst_node_id
            if node in self.claims:
                reply = identity_reply(msg, *self.claims[node])
                reply.metadata.__dict__["_src_node_id"] = node
                out.append(reply)
        return out

    def get_node_ids(self):
        return list(self.claims)


def test_first_node_lying_is_excluded_once_the_majority_has_answered():
    """Sampled alone in round 1, a (0, 1) claimant is all the server knows: accepted. When
    five nodes claiming 6 partitions answer in round 2, the majority says 6: it is excluded
    from then on (re-evaluated as nodes arrive), and partition 5, which nobody claims, gets a
    placeholder worker (sent nothing)."""
    members = Membership(1.0, seed=0)
    grid = _Grid({7: (0, 1), **{10 + j: (j, 6) for j in range(5)}})
    assert members.admit(grid, [7], 1) == [7]
    assert members.admit(grid, [7, 10, 11, 12, 13, 14], 2) == [10, 11, 12, 13, 14, -6]
    assert members.row_fields(2) == {"unidentified": [], "identity_rejected": [7]}
    assert members.row_fields(1) == {}  # only the last admitted round


class _Federation:
    """A grid of nodes that answer the handshake with their claims; ``listed`` is who is
    connected now (a SuperNode that died is no longer listed)."""

    def __init__(self, claims: dict[int, tuple[int, int]]) -> None:
        self.claims = dict(claims)
        self.listed = set(claims)

    def get_node_ids(self):
        return sorted(self.listed)

    def send_and_receive(self, msgs, timeout=None):
        from fl_gradcode.flower.protocol import identity_reply

        return [identity_reply(m, *self.claims[m.metadata.dst_node_id]) for m in msgs
                if m.metadata.dst_node_id in self.listed]


def test_a_supernode_restarted_under_a_new_node_id_takes_its_partition_back():
    """Node 13 holds partition 2 of 4 and dies; the SuperNode comes back as node 99 claiming
    partition 2. Its former self is gone from the grid, so this is no clash: 99 is a member
    (before, the dead node's claim was kept for good and 99 was excluded as a later claimant)."""
    grid = _Federation({10: (0, 4), 11: (1, 4), 13: (2, 4), 14: (3, 4)})
    members = Membership(1.0, seed=0)
    assert members.admit(grid, [10, 11, 13, 14], 1) == [10, 11, 13, 14]
    grid.listed.discard(13)
    grid.claims[99] = (2, 4)
    grid.listed.add(99)
    assert members.admit(grid, [10, 11, 14, 99], 2) == [10, 11, 99, 14]
    assert members.identity_rejected == []
    # a second node claiming partition 2 while 99 is connected is a clash: neither is used,
    # partition 2 gets a placeholder worker
    grid.claims[100] = (2, 4)
    grid.listed.add(100)
    assert members.admit(grid, [10, 11, 14, 99, 100], 3) == [10, 11, -3, 14]
    assert members.identity_rejected == [99, 100]


class _DownGrid:
    """A grid whose delivery fails; keeps the messages it was given."""

    def __init__(self) -> None:
        self.sent: list = []

    def send_and_receive(self, messages, timeout):
        self.sent.extend(messages)
        raise RuntimeError("down")


def test_a_handshake_the_grid_cannot_deliver_fails_each_asked_node_with_the_cause():
    grid = _DownGrid()
    members = Membership(warmup_timeout=0.5, nonce="run-7", seed=0)
    members.handshake(grid, [5, 6])
    assert members.failed == {5: "handshake not delivered (RuntimeError: down)",
                              6: "handshake not delivered (RuntimeError: down)"}
    asked = [parse_instruction(m.content) for m in grid.sent]
    assert [(i.op, i.nonce) for i in asked] == [(OP_IDENTIFY, "run-7")] * 2


class _Nodes:
    """Connected nodes (``listed``) answering the handshake: ``claims`` with their identity,
    ``replies`` with a reply built from the message, any other listed node never answers."""

    def __init__(self, claims=None, replies=None, listed=()) -> None:
        self.claims = dict(claims or {})
        self.replies = dict(replies or {})
        self.listed = set(self.claims) | set(self.replies) | set(listed)

    def get_node_ids(self):
        return sorted(self.listed)

    def send_and_receive(self, msgs, timeout=None):
        out = []
        for m in msgs:
            node = m.metadata.dst_node_id
            if node not in self.listed:
                continue
            if node in self.claims:
                out.append(identity_reply(m, *self.claims[node]))
            elif node in self.replies:
                out.append(self.replies[node](m))
        return out


HINT = ("Does every ClientApp run gradient_coding_mod as its FIRST mod "
        "(ClientApp(mods=[gradient_coding_mod, ...]): a mod listed before it sees the protocol's "
        "messages) and have 'partition-id' and 'num-partitions' in its node config?")


def test_a_malformed_identity_is_a_failure_with_its_own_short_reason_and_a_bad_range_named():
    """Node 5 answers with a fractional partition-id (not an error reply): its failure is the
    rejection reason as written, uncut (no advice for error replies, no '...'); node 6 claims
    partition 9 of 6: excluded, the valid range 0..5 named."""
    from flwr.app import MetricRecord, RecordDict

    from fl_gradcode.flower.protocol import PROTOCOL_KEY

    def fractional(msg):
        rec = MetricRecord({"partition-id": 1.5, "num-partitions": 4})
        return Message(RecordDict({PROTOCOL_KEY: rec}), reply_to=msg)

    members = Membership(1.0, seed=0)
    grid = _Nodes(claims={6: (9, 6), 7: (0, 6)}, replies={5: fractional})
    # the federation has 6 partitions (node 7's claim): 1-5 get placeholder workers
    assert members.admit(grid, [5, 6, 7], 1) == [7, -2, -3, -4, -5, -6]
    assert members.failed == {5: "partition-id=1.5 num-partitions=4 are not 0 <= id < num"}
    assert members.invalid == {6: "partition-id=9 is not in 0..5 (num-partitions=6)"}
    assert members.row_fields(1) == {"unidentified": [5], "identity_rejected": [6]}


def test_an_empty_nonce_is_replaced_by_the_default_one():
    sent = {}
    for nonce in ("", None):
        grid = _DownGrid()
        Membership(0.5, nonce=nonce, seed=0).handshake(grid, [5])
        sent[nonce] = parse_instruction(grid.sent[0].content).nonce
    grid = _DownGrid()
    Membership(0.5, seed=0).handshake(grid, [5])
    default = parse_instruction(grid.sent[0].content).nonce
    assert default and sent == {"": default, None: default}


def test_a_departed_nodes_released_claim_is_logged_with_the_node_and_its_partition(caplog):
    grid = _Nodes(claims={10: (0, 3), 11: (1, 3), 13: (2, 3)})
    members = Membership(1.0, seed=0)
    members.admit(grid, [10, 11, 13], 1)
    grid.listed.discard(13)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        assert members.admit(grid, [10, 11], 2) == [10, 11, -3]
    assert [r.getMessage() for r in caplog.records] == [
        "node 13 (partition-id=2) left the federation: its claim is released",
        "round 2: partition(s) [2] of 3 have no usable holder this round (dead, unidentified "
        "or contested): their other replicas compute them"]
    assert 13 not in members.claims


def test_neither_claimant_keeps_a_contested_partition_whatever_the_order_or_ids():
    """Node 20 claims partition 0 in round 1; node 10 (a smaller id) claims it in round 2:
    neither is used from then on (answer order and node ids decide nothing), partition 0 gets
    a placeholder worker."""
    grid = _Nodes(claims={20: (0, 2), 10: (0, 2), 30: (1, 2)})
    members = Membership(1.0, seed=0)
    assert members.admit(grid, [20], 1) == [20]
    assert members.admit(grid, [10, 20, 30], 2) == [-1, 30]
    why = ("claims partition-id=0 of 2, as does node {}: conflicting claims, neither is used "
           "(the partition's other replicas compute it)")
    assert members.verdicts() == {10: why.format(20), 20: why.format(10)}


def test_the_handshake_warning_gives_the_hint_only_the_first_time_a_node_fails(caplog):
    grid = _DownGrid()
    grid.get_node_ids = lambda: [5]
    members = Membership(0.5, seed=0)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        members.admit(grid, [5], 1)
        members.admit(grid, [5], 2)
    head = ("did not pass the gradient-coding handshake and get no work this round (asked "
            "again when next sampled): node 5: handshake not delivered (RuntimeError: down)")
    assert [r.getMessage() for r in caplog.records] == [
        f"round 1: 1 node(s) {head}. {HINT}", f"round 2: 1 node(s) {head}"]


def test_once_a_node_was_accepted_membership_never_ends_the_run():
    """Node 10 passes in round 1 and leaves; node 11 never answers: rounds 2-7 are idle (no
    member), never the end of the run (a cohort of one accepted node decodes)."""
    grid = _Nodes(claims={10: (0, 2)}, listed=[11])
    members = Membership(0.5, seed=0)
    assert members.admit(grid, [10], 1) == [10]
    grid.listed.discard(10)
    for r in range(2, 8):
        assert members.admit(grid, [11], r) == []
    assert members.failed == {11: "no reply within 0.5 s"}


def test_no_decodable_set_ends_the_run_naming_the_rounds_and_the_nodes():
    grid = _Nodes(listed=[5, 6])
    members = Membership(1.0, seed=0)
    assert members.admit(grid, [5, 6], 1) == []
    assert members.admit(grid, [5, 6], 2) == []
    with pytest.raises(RuntimeError) as info:
        members.admit(grid, [5, 6], 3)
    assert str(info.value) == (
        "no node passed the gradient-coding handshake in 3 rounds in a row (up to round 3) and "
        "every one of the 2 connected nodes has failed it, so no decodable set can form (node "
        f"5: no reply within 1 s; node 6: no reply within 1 s). {HINT}")


# ================================================================== cohort sizes
@pytest.mark.parametrize(
    ("spec", "n", "s", "options", "expected"),
    [
        ("frc", 6, 1, {}, ("frc", 1)),  # takes it: no fallback
        ("frc", 7, 2, {}, ("grouped-rs", 2)),
        ("comm-efficient", 2, 1, {"m": 2}, ("comm-efficient", 0)),  # s + m <= n
        ("expander", 2, 1, {}, ("expander", 0)),
        ("comm-efficient", 1, 0, {"m": 2}, ("uncoded", 0)),  # m > n: nothing else takes it
    ],
)
def test_code_for_cohort_picks_the_nearest_code_that_takes_the_size(spec, n, s, options,
                                                                    expected):
    code, why = code_for_cohort(spec, n, s, 0, options)
    assert (code.name, code.s, code.n) == (*expected, n)
    assert (why is None) == (expected == (spec, s))


def test_every_code_for_a_cohort_has_one_partition_per_member():
    """Whatever the code's own construction gives (comm-efficient with s + m not dividing
    the cohort: floor(n/(s+m))(s+m) partitions; grouped-rs with copied rows), the code a
    round runs codes the members' own partitions, k = n, at the tolerance asked for."""
    from fl_gradcode.codes import available_codes

    for name in available_codes():
        for n in range(2, 11):
            for s in range(n):
                code, _ = code_for_cohort(name, n, s, 0, {"m": 2} if name == "comm-efficient"
                                          else {})
                assert (code.n, code.k) == (n, n), (name, n, s)
                if name in ("frc", "crc", "grouped-rs", "nested"):  # exact at every s < n
                    assert code.s == s and code.is_exact, (name, n, s, code.name, code.s)
    assert make_code("comm-efficient", n=7, s=1, m=2).k == 6  # the premise
    code, why = code_for_cohort("comm-efficient", 7, 1, 0, {"m": 2})
    assert (code.name, code.s, code.m, why) == ("comm-efficient", 1, 2, None)


@pytest.mark.parametrize(("n", "s", "expected", "said"), [
    (6, 3, ("grouped-rs", 3), "using grouped-rs (without its float32 error budget) with s=3"),
    (13, 6, ("nested", 6), "using nested with s=6"),
])
def test_grouped_rs_with_a_copied_row_falls_back_at_the_same_tolerance(n, s, expected, said):
    """grouped-rs's budgets copy a row at (6, 3) and (13, 6): k < n. The fallback keeps s:
    grouped-rs without its float32 budget where that has k = n, else the nested code (at
    (13, 6) a load of 8, where comm-efficient with m = 1 would be one group of 13)."""
    assert make_code("grouped-rs", n=n, s=s).k < n  # the premise
    code, why = code_for_cohort("grouped-rs", n, s, 0, {})
    assert (code.name, code.s, code.k) == (*expected, n)
    assert f"it has k={make_code('grouped-rs', n=n, s=s).k} partitions, not one per client" in why
    assert said in why
    assert code.load < n


def test_a_comm_efficient_object_for_another_size_keeps_its_m():
    code, _ = code_for_cohort(make_code("comm-efficient", n=8, s=1, m=3), 7, 1, 0, {})
    assert (code.name, code.n, code.s, code.m, code.k) == ("comm-efficient", 7, 1, 3, 7)


def test_a_bad_code_name_or_option_is_an_error_not_a_fallback():
    with pytest.raises(ValueError, match="unknown code 'no-such-code'"):
        code_for_cohort("no-such-code", 6, 1, 0, {})
    with pytest.raises(ValueError, match="invalid option for code 'frc'"):
        code_for_cohort("frc", 5, 1, 0, {"m": 2})


def test_a_code_object_built_for_another_size_falls_back_by_name():
    code, why = code_for_cohort(make_code("frc", n=6, s=1), 5, 1, 0, {})
    assert (code.name, code.n, code.s) == ("grouped-rs", 5, 1)
    assert "built for n=6" in why


def test_a_code_object_for_another_size_is_rebuilt_under_its_own_name_from_the_seed():
    code, why = code_for_cohort(make_code("bgc", n=6, s=2, seed=3), 5, 2, 7, {})
    assert (code.name, code.n, code.s) == ("bgc", 5, 2)
    np.testing.assert_array_equal(code.B, make_code("bgc", n=5, s=2, seed=7).B)
    assert why == ("the code was built for n=6 clients but the cohort has 5; using bgc with "
                   "s=2 for cohorts of 5")


def test_an_s_beyond_the_cohort_is_capped_at_n_minus_1_and_says_so():
    code, why = code_for_cohort("grouped-rs", 3, 7, 0, {})
    assert (code.name, code.n, code.s) == ("grouped-rs", 3, 2)
    assert why == ("s=7 stragglers cannot be tolerated with a cohort of 3 (at most 2); "
                   "using grouped-rs with s=2 for cohorts of 3")


def test_a_capped_s_that_the_code_still_cannot_take_names_both_changes():
    code, why = code_for_cohort("frc", 4, 5, 0, {})  # s=3 for 4: (s+1) | n holds, frc builds
    assert (code.name, code.s) == ("frc", 3)
    code, why = code_for_cohort("frc", 5, 9, 0, {})  # s=4 for 5: frc builds (5 | 5)
    assert (code.name, code.s) == ("frc", 4) and why.startswith("s=9 stragglers")
    code, why = code_for_cohort("comm-efficient", 3, 5, 0, {"m": 2})  # s=2: s + m > 3
    assert (code.name, code.s) == ("comm-efficient", 1)
    assert why.startswith("s=5 stragglers cannot be tolerated with a cohort of 3 (at most 2)")
    assert why.endswith("using comm-efficient with s=1 for cohorts of 3")


def test_a_code_object_with_s_beyond_the_cohort_says_both():
    code, why = code_for_cohort(make_code("grouped-rs", n=6, s=4), 3, 4, 0, {})
    assert (code.name, code.n, code.s) == ("grouped-rs", 3, 2)
    assert "built for n=6" in why and why.endswith("using grouped-rs with s=2 for cohorts of 3")


def test_a_code_for_a_cohort_is_drawn_from_the_runs_seed():
    code, why = code_for_cohort("bgc", 5, 2, 7, {})
    assert why is None
    np.testing.assert_array_equal(code.B, make_code("bgc", n=5, s=2, seed=7).B)
