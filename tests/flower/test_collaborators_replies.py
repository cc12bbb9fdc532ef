"""GradientCoding's reply collector and round verifier on their own: late, unsent, foreign and
unexpected replies, the early return, a reply's dtype against the round's wire, fingerprints and
the collector's log lines; the stopping rule, the replicas' cross-check and size vote, the
clearance (withholding, the applied decoding against the replies) and its log lines."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from fl_gradcode.codes import make_code
from fl_gradcode.flower.clock import VirtualClock, WallClock
from fl_gradcode.flower.collector import ReplyCollector
from fl_gradcode.flower.compat import ReplyFingerprints
from fl_gradcode.flower.deadline_policy import DeadlinePolicy
from fl_gradcode.flower.integrity import Verdict
from fl_gradcode.flower.options import DeadlineOptions, IntegrityOptions
from fl_gradcode.flower.protocol import STOPPED_CODE
from fl_gradcode.flower.quarantine import Quarantine
from fl_gradcode.flower.round_state import rejection
from fl_gradcode.flower.verifier import RoundVerifier
from tests.flower.collaborators_support import (
    StubReply,
    late_reply,
    log_messages,
    make_state,
    make_verifier,
)


# =============================================================================== collector
def _collector(clock=None):
    clock = clock or VirtualClock(10.0)
    return ReplyCollector(clock, DeadlinePolicy(DeadlineOptions(), False), IntegrityOptions(),
                          Quarantine(), ReplyFingerprints())


def test_late_replies_are_counted_until_taken():
    collector = _collector()
    collector.on_late_reply(late_reply("1", False))
    collector.on_late_reply(late_reply("1", True))
    collector.on_late_reply(late_reply("1", False))
    assert collector.take_late() == (2, 1)
    assert collector.take_late() == (0, 0)


def test_unsent_messages_leave_the_round():
    collector = _collector()
    msg = StubReply("1", False, node=11)
    state = make_state(make_code("frc", 4, 1), [10, 11, 12, 13], sent={0: object(), 1: msg},
                       collector=collector)
    collector.on_unsent([msg])
    assert list(state.sent) == [0]


def test_early_return_rules_only_on_a_clock_that_returns_early():
    virtual = _collector(VirtualClock(10.0))
    make_state(make_code("frc", 4, 1), [10, 11, 12, 13], collector=virtual)
    assert not virtual.ready() and virtual.prioritize([1, 2]) == [1, 2]
    wall = _collector(WallClock(10.0))
    state = make_state(make_code("frc", 4, 1), [10, 11, 12, 13], collector=wall)
    assert not wall.ready()
    state.arrivals.accept(0, None)  # one reply per FRC group
    state.arrivals.accept(2, None)
    assert wall.ready()


def test_the_collectors_log_lines_name_the_node_and_the_round(caplog):
    import logging

    collector = _collector()
    msg = StubReply("1", False, node=11)
    make_state(make_code("frc", 4, 1), [10, 11, 12, 13], sent={1: msg}, collector=collector)
    with caplog.at_level(logging.DEBUG, logger="flwr"):
        collector.on_unsent([msg])
        collector.on_late_reply(StubReply("3", False, node=12))
        collector.on_late_reply(StubReply("4", True, node=13))
        rejection(1, 11, 1, "bad")
    assert log_messages(caplog) == [
        "message to node 11 was not accepted by the grid: straggler",
        "dropped late reply from node 12 to round 3",
        "node 13 stopped its work on round 4 at the deadline",
        "round 1: rejected reply from node 11 (worker 1): bad",
    ]


class _ErrorReply:
    """An error reply answering the message ``reply_to`` from ``sender`` (the SuperLink's
    id, 1, for the error it writes for an unreachable node)."""

    def __init__(self, reply_to: str, code: int, sender: int = 1) -> None:
        self.metadata = SimpleNamespace(src_node_id=sender, message_id="r1", group_id="1",
                                        reply_to_message_id=reply_to)
        self.error = SimpleNamespace(code=code, reason="stopped")
        self.content = {}

    def has_error(self) -> bool:
        return True


def test_the_superlinks_error_reply_is_the_failure_of_the_node_it_answers(caplog):
    import logging

    collector = _collector()
    state = make_state(make_code("frc", 4, 1), [10, 11, 12, 13], collector=collector,
                       sent={0: SimpleNamespace(metadata=SimpleNamespace(message_id="m0",
                                                                         dst_node_id=10)),
                             1: SimpleNamespace(metadata=SimpleNamespace(message_id="m1",
                                                                         dst_node_id=11))})
    with caplog.at_level(logging.INFO, logger="flwr"):
        collector.on_reply(_ErrorReply("m1", STOPPED_CODE))
    assert state.stopped == [1] and state.answered == {1} and state.rejected == []
    assert log_messages(caplog) == ["round 1: node 11 stopped at the deadline (stopped)"]


def test_a_reply_from_a_member_sent_nothing_is_rejected_with_its_worker():
    collector = _collector()
    state = make_state(make_code("frc", 4, 1), [10, 11, 12, 13], collector=collector)
    reply = StubReply("1", False, node=11)
    reply.metadata.message_id = "r11"
    collector.on_reply(reply)
    assert state.rejected == [(11, "sender was not sent work this round")]
    assert state.rejected_details == [(1, "sender was not sent work this round", None)]
    assert state.answered == {1} and state.valid == {}


def _round_expecting_w():
    """An open FRC(4, 1) round on nodes 10, 7, 12, 13 whose replies carry one float64 array
    ``w`` of shape (3,); worker 1 (node 7) was sent ``request``:
    ``(collector, state, request)``."""
    from flwr.app import Message, MessageType, RecordDict

    collector = _collector()
    request = Message(RecordDict(), dst_node_id=7, message_type=MessageType.TRAIN)
    state = make_state(make_code("frc", 4, 1), [10, 7, 12, 13], reply_layout={"w": (3,)},
                       dtypes={"w": np.dtype(np.float64)}, sent={1: request}, collector=collector)
    return collector, state, request


def test_a_reply_in_another_dtype_than_the_rounds_wire_is_rejected():
    from fl_gradcode.flower import protocol
    from tests.flower.messages import train_instruction

    collector, state, request = _round_expecting_w()
    inst = train_instruction(worker=1, round=1)
    for dtype in (np.float32, np.float64):
        reply = protocol.train_reply(request, inst, {"w": np.ones(3, dtype=dtype)}, 5.0,
                                     [2.0, 3.0], {}, 0.1)
        reply.metadata.group_id = "1"
        collector.on_reply(reply)
    assert state.rejected == [(7, "array 'w' has dtype float32; this round's wire is float64")]
    assert list(state.valid) == [1]


def test_under_verify_a_decodable_round_returns_early_only_once_cross_checked():
    collector = ReplyCollector(WallClock(10.0), DeadlinePolicy(DeadlineOptions(), False),
                               IntegrityOptions(verify=True), Quarantine(), ReplyFingerprints())
    z = {0: [1.0, 0.0], 1: [1.0, 0.0], 2: [0.0, 1.0], 3: [0.0, 1.0]}
    valid = {w: SimpleNamespace(extra={"z": np.array(v), "size": 1.0}) for w, v in z.items()}

    def opened(sent, replies):
        make_state(make_code("frc", 4, 1), [10, 11, 12, 13], probe=SimpleNamespace(verdicts={}),
                   sent=sent, valid=replies, collector=collector)

    opened({}, valid)
    assert collector.ready()  # the replicas of both groups agree
    opened(dict.fromkeys(range(4)), {w: r for w, r in valid.items() if w != 1})
    assert not collector.ready()  # worker 1's reply could still settle its group
    valid[1].extra["z"] = np.array([2.0, 0.0])  # two replicas disagree: nothing to wait
    opened(dict.fromkeys(range(4)), valid)
    assert collector.ready()  # for, the group is left out and the other one settled


def test_a_reply_without_an_open_round_is_ignored():
    collector = _collector()
    reply = StubReply("1", False, node=11)
    reply.metadata.message_id = "r11"
    collector.on_reply(reply)  # no round in progress: nothing to validate it against
    assert collector.state is None


def test_an_accepted_reply_is_fingerprinted_for_its_round():
    from fl_gradcode.flower import protocol
    from fl_gradcode.flower.compat import CompositionError
    from tests.flower.messages import train_instruction

    collector, state, request = _round_expecting_w()
    reply = protocol.train_reply(request, train_instruction(worker=1, round=1),
                                 {"w": np.ones(3)}, 5.0, [2.0, 3.0], {}, 0.1)
    reply.metadata.group_id = "1"
    reply.metadata.__dict__["_message_id"] = "r7"  # as the SuperLink stores it
    assert reply.metadata.message_id == "r7"
    collector.on_reply(reply)
    assert list(state.valid) == [1]
    with pytest.raises(CompositionError, match=r"^round 1: the replies from node\(s\) 7 were "
                                               r"cached by GradientCoding but removed"):
        collector.fingerprints.check(1, [], "Outer")


# =============================================================================== verifier
def _cross_check(verifier, state, used):
    """``(used, verdict)`` of the verifier's cross-check of ``used`` (the window's replies)."""
    from fl_gradcode.flower.clock import RoundWindow
    from fl_gradcode.flower.closer import Closing

    closed = dataclasses.replace(state, closing=Closing(RoundWindow(list(used), 0.0)))
    checked = verifier.cross_check(closed).verification
    return list(checked.used), checked.verdict


def test_the_stopping_rule_is_a_decodable_set():
    code = make_code("frc", 4, 1)
    rule = make_verifier().stopping_rule(make_state(code, [10, 11, 12, 13]), code)
    assert not rule([]) and not rule([0, 1]) and rule([0, 2])


def test_withholding_rules(caplog):
    verifier = make_verifier()
    state = make_state(make_code("frc", 4, 1), [10, 11, 12, 13])
    unresolved = Verdict("contradicted", disagreement=0.5, unresolved=True)

    def withholds(verifier, state, verdict, decode):
        return verifier.clearance(state, [], None, verdict, decode)[1]

    assert withholds(verifier, state, unresolved, "skipped")
    assert not withholds(verifier, state, None, "exact")  # not verifying
    verifying = make_verifier(verify=True)
    state = make_state(make_code("frc", 4, 1), [10, 11, 12, 13], probe=object())
    assert withholds(verifying, state, None, "exact")
    assert not withholds(verifying, state, None, "skipped")
    checked = Verdict("verified")
    assert not withholds(verifying, state, checked, "exact")


def test_an_outvoted_size_report_is_rejected_with_its_worker_and_the_agreed_sizes_kept():
    """FRC n=6, s=2: workers 0-2 replicate partitions 0-2; worker 2 reports 99 examples for
    partition 0 where workers 0 and 1 report 5."""
    from fl_gradcode.flower.privatiser import Privatiser
    from fl_gradcode.privacy import DPConfig, ServerNoise

    code = make_code("frc", 6, 2)
    reported = {0: (5.0, 6.0, 7.0), 1: (5.0, 6.0, 7.0), 2: (99.0, 6.0, 7.0),
                3: (8.0, 9.0, 10.0), 4: (8.0, 9.0, 10.0), 5: (8.0, 9.0, 10.0)}
    state = make_state(code, [10, 11, 12, 13, 14, 15],
                       valid={w: SimpleNamespace(sizes=sizes) for w, sizes in reported.items()})
    quarantine = Quarantine(offences=1)
    verifier = RoundVerifier(IntegrityOptions(), DeadlinePolicy(DeadlineOptions(), False),
                             quarantine, Privatiser(DPConfig(), None, ServerNoise(), "n", {}))
    state = verifier.check_sizes(state)
    assert sorted(state.valid) == [0, 1, 3, 4, 5]
    assert state.sizes == {0: 5.0, 1: 6.0, 2: 7.0, 3: 8.0, 4: 9.0, 5: 10.0}
    [(node, reason)] = state.rejected
    assert node == 12 and reason.startswith("partition-sizes: n_0=99 disagrees with the other")
    assert [d[:2] for d in state.rejected_details] == [(2, reason)]
    assert quarantine.held(2, [10, 11, 12, 13, 14, 15]) == {12}


def test_the_cross_check_measures_disagreement_against_the_replies_exact_sizes():
    """Two FRC replicas of norm 100 whose projections differ by 0.1 disagree by 0.1 / 2 / 100
    relative to their size (verified at tolerance 0.01); against the projections' own norms
    (about 1) they would disagree by about 0.05 (contradicted)."""
    verifier = make_verifier(verify=True, tolerance=0.01)
    state = make_state(make_code("frc", 4, 1), [10, 11, 12, 13], probe=SimpleNamespace(verdicts={}),
                       valid={0: SimpleNamespace(extra={"z": np.array([1.0, 0.0]), "size": 100.0}),
                              1: SimpleNamespace(extra={"z": np.array([1.1, 0.0]), "size": 100.0})})
    verdict = verifier.verdict(state, [0, 1])
    assert verdict.status == "verified"
    assert verdict.disagreement == pytest.approx(0.1 / 2 / 100)


def test_a_two_to_one_group_is_left_out_blaming_nobody_and_logged(caplog):
    """FRC(6, 2): two agreeing replicas could be two colluders, so the third is not
    outvoted (before, it was excluded as the culprit)."""
    import logging

    z = {0: [1.0, 0.0], 1: [1.0, 0.0], 2: [5.0, 0.0], 3: [0.0, 1.0], 4: [0.0, 1.0],
         5: [0.0, 1.0]}
    state = make_state(make_code("frc", 6, 2), [10, 11, 12, 13, 14, 15],
                       probe=SimpleNamespace(verdicts={}),
                       valid={w: SimpleNamespace(extra={"z": np.array(v), "size": 1.0})
                              for w, v in z.items()})
    with caplog.at_level(logging.WARNING, logger="flwr"):
        used, verdict = _cross_check(make_verifier(verify=True), state, list(range(6)))
    assert used == [3, 4, 5] and verdict.excluded == [] and verdict.unsettled == [0, 1, 2]
    assert ("round 1: workers [0, 1, 2]: no s + 1 = 3 agreeing replicas settle their group "
            "(disagreement 1.33, or replies missing); left out of the decoding, nobody blamed"
            ) in log_messages(caplog)


def test_withholding_says_why_in_the_log(caplog):
    import logging

    verifying = make_verifier(verify=True)
    state = make_state(make_code("frc", 4, 1), [10, 11, 12, 13], probe=object())
    unresolved = Verdict("contradicted", disagreement=0.5, unresolved=True)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        assert verifying.clearance(state, [], None, unresolved, "exact")[1]
        assert verifying.clearance(state, [], None, None, "exact")[1]
    assert log_messages(caplog) == [
        "round 1: replies disagree (relative 0.5) and no single reply explains it; nothing is "
        "applied",
        "round 1: verify=True and the replies could not all be cross-checked before the "
        "deadline; nothing is applied",
    ]


def test_an_applied_decoding_the_replicas_contradict_turns_the_verdict_contradicted():
    """FRC(4, 1), workers 0 and 2 used: the min-norm decoding weighs each by 1; applying
    weight 2 to worker 0 (reply [1, 0], size 1) is off by |2 - 1| * 1 / 1 = 1."""
    verifier = make_verifier(verify=True, tolerance=0.01)
    state = make_state(make_code("frc", 4, 1), [10, 11, 12, 13],
                       valid={0: SimpleNamespace(extra={"z": np.array([1.0, 0.0]), "size": 1.0}),
                              2: SimpleNamespace(extra={"z": np.array([0.0, 1.0]), "size": 1.0})})
    for before, after in ((0.0, 1.0), (5.0, 5.0)):
        verdict = Verdict("verified", disagreement=before)
        decoding = SimpleNamespace(coefficients=np.array([2.0, 0.0, 1.0, 0.0]))
        verdict, _ = verifier.clearance(state, [0, 2], decoding, verdict, "exact")
        assert verdict.status == "contradicted" and verdict.unresolved is True
        assert verdict.disagreement == pytest.approx(after)
    agreeing, _ = verifier.clearance(
        state, [0, 2], SimpleNamespace(coefficients=np.array([1.0, 0.0, 1.0, 0.0])),
        Verdict("verified"), "exact")
    assert agreeing.status == "verified" and agreeing.unresolved is False


def test_verify_warns_once_that_rounds_without_redundancy_are_applied_unverified(caplog):
    import logging

    verifier = make_verifier(verify=True)
    code = make_code("frc", 4, 0)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        assert verifier.probe_for(1, code, {"w": (3,)}, {}) is None
        assert verifier.probe_for(1, code, {"w": (3,)}, {}) is None
    assert log_messages(caplog) == [
        "verify=True: round 1 uses s=0 (no redundancy): such rounds are applied unverified "
        "(verified=None in rounds.jsonl)"]
    assert make_verifier().probe_for(1, code, {"w": (3,)}, {}) is None  # not verifying: no probe


def test_the_applied_decoding_is_measured_against_the_replies_exact_sizes():
    """FRC(4, 1), workers 0 and 2 used, replies [1, 0] and [0, 1] of exact norm 100: applying
    weight 1.5 instead of 1 to worker 0 is off by 0.5 * 1 / 100 = 0.005 relative to the
    replies' size (verified at tolerance 0.01); against the projections' norms (1) it would be
    off by 0.5 (contradicted)."""
    verifier = make_verifier(verify=True, tolerance=0.01)
    state = make_state(make_code("frc", 4, 1), [10, 11, 12, 13],
                       valid={0: SimpleNamespace(extra={"z": np.array([1.0, 0.0]), "size": 100.0}),
                              2: SimpleNamespace(extra={"z": np.array([0.0, 1.0]), "size": 100.0})})
    verdict, _ = verifier.clearance(
        state, [0, 2], SimpleNamespace(coefficients=np.array([1.5, 0.0, 1.0, 0.0])),
        Verdict("verified"), "exact")
    assert verdict.status == "verified" and verdict.unresolved is False
    assert verdict.disagreement == 0.0


def test_an_applied_decoding_exactly_at_the_tolerance_agrees():
    """Tolerance 0 asks for exact agreement: all-zero replies (a zero gradient) agree exactly
    with any decoding (disagreement 0 <= 0), so the verdict stays verified."""
    verifier = make_verifier(verify=True, tolerance=0.0)
    state = make_state(make_code("frc", 4, 1), [10, 11, 12, 13],
                       valid={w: SimpleNamespace(extra={"z": np.zeros(2), "size": 0.0})
                              for w in (0, 2)})
    verdict, _ = verifier.clearance(
        state, [0, 2], SimpleNamespace(coefficients=np.array([2.0, 0.0, 1.0, 0.0])),
        Verdict("verified"), "exact")
    assert verdict.status == "verified" and verdict.unresolved is False


def test_twins_in_a_contradiction_are_left_out_and_never_quarantined(caplog):
    """FRC(4, 1): the twins 0 and 1 disagree and nothing tells which lies; even with one
    offence enough, neither is quarantined (before, both were: the honest one too)."""
    import logging

    verifier = make_verifier(verify=True, quarantine=Quarantine(offences=1, rounds=5))
    z = {0: [1.0, 0.0], 1: [2.0, 0.0], 2: [0.0, 1.0], 3: [0.0, 1.0]}
    state = make_state(make_code("frc", 4, 1), [10, 11, 12, 13], probe=SimpleNamespace(verdicts={}),
                       valid={w: SimpleNamespace(extra={"z": np.array(v), "size": 1.0})
                              for w, v in z.items()})
    with caplog.at_level(logging.WARNING, logger="flwr"):
        _, verdict = _cross_check(verifier, state, [0, 1, 2, 3])
    assert not verdict.unresolved and verdict.unsettled == [0, 1]
    assert [m for m in log_messages(caplog) if "quarantined" in m] == []
