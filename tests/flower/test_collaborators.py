"""GradientCoding's collaborators on their own: clocks, deadline policy, reply collector, round
state and round log."""

from __future__ import annotations

import ast
import dataclasses
import json
import pathlib
import time
from types import SimpleNamespace

import numpy as np
import pytest
from flwr.serverapp.strategy import FedAvg

from fl_gradcode.codes import make_code
from fl_gradcode.flower import GradientCoding
from fl_gradcode.flower.clock import VirtualClock, WallClock, make_clock
from fl_gradcode.flower.collector import Arrivals, ReplyCollector
from fl_gradcode.flower.compat import ReplyFingerprints
from fl_gradcode.flower.deadline_policy import DeadlinePolicy
from fl_gradcode.flower.dispatch import Requests
from fl_gradcode.flower.integrity import Verdict
from fl_gradcode.flower.options import DeadlineOptions, IntegrityOptions, TimingOptions
from fl_gradcode.flower.protocol import STOPPED_CODE, Identity
from fl_gradcode.flower.quarantine import Quarantine
from fl_gradcode.flower.records import ROW_DEFAULTS, RoundLog
from fl_gradcode.flower.round_state import (
    RoundPlan,
    RoundState,
    partition_key,
    payload_bytes,
    rejection,
)
from fl_gradcode.flower.verifier import RoundVerifier

FLOWER = pathlib.Path(__file__).resolve().parents[2] / "fl_gradcode" / "flower"


# =============================================================================== clocks
def test_virtual_arrival_is_compute_cost_delay_and_transfer():
    clock = VirtualClock(10.0, measured_compute=True, compute_cost_s=0.5, upload_bandwidth=100.0)
    seen = []
    t = clock.arrival(1.0, 300, lambda: 2.0, lambda load: seen.append(load) or 4.0)
    assert t == 1.0 + 0.5 * 2.0 + 4.0 + 3.0 and seen == [2.0]
    unmeasured = VirtualClock(10.0, measured_compute=False)
    assert unmeasured.arrival(7.0, 300, lambda: 1.0, lambda load: 0.0) == 0.0


def test_wallclock_arrivals_are_not_modelled_and_workers_sleep_their_delay():
    clock = WallClock(10.0)
    assert clock.arrival(5.0, 10, lambda: pytest.fail("no load"), lambda load: 1.0) == 0.0
    assert clock.instruction_delay(lambda: 2.5) == 2.5
    assert VirtualClock(10.0).instruction_delay(lambda: pytest.fail("no delay")) == 0.0


@pytest.mark.parametrize("stop", [False, True])
def test_only_wallclock_workers_after_round_one_are_told_to_stop(stop):
    wall = make_clock(TimingOptions(mode="wallclock", stop_late_work=stop), 4.0)
    virtual = make_clock(TimingOptions(mode="virtual", stop_late_work=stop), 4.0)
    assert wall.stop_after_s(1) == 0.0 and virtual.stop_after_s(2) == 0.0
    assert wall.stop_after_s(2) == (4.0 if stop else 0.0)
    assert virtual.stop_at_deadline is stop and wall.stop_at_deadline is stop


def test_start_round_sets_the_rounds_deadline():
    for clock in (VirtualClock(10.0), WallClock(10.0)):
        clock.start_round({}, deadline=3.0)
        assert clock.straggler_timeout == 3.0
        clock.start_round({})
        assert clock.straggler_timeout == 3.0  # unchanged without a deadline


def test_grid_limits_per_clock():
    timeouts = DeadlineOptions(straggler_timeout=5.0, warmup_timeout=9.0, round_timeout=60.0)
    virtual, wall = VirtualClock(5.0), WallClock(5.0)
    assert virtual.grid_limit_s(1, timeouts, None, ()) == 60.0
    assert virtual.grid_limit_s(2, timeouts, 30.0, ()) == 30.0
    assert wall.grid_limit_s(1, timeouts, None, ()) == 9.0  # start-up
    assert wall.grid_limit_s(2, timeouts, None, ()) == 5.0
    assert wall.grid_limit_s(2, timeouts, 2.0, ()) == 2.0
    stopping = WallClock(5.0, stop_at_deadline=True)
    sent = [SimpleNamespace(metadata=SimpleNamespace(created_at=time.time() - 2.0))]
    assert stopping.grid_limit_s(2, timeouts, None, sent) == pytest.approx(3.0, abs=0.2)
    assert stopping.grid_limit_s(1, timeouts, None, sent) == 9.0
    assert wall.first_reply_deadline_s(1, 5.0) == 5.0
    assert wall.first_reply_deadline_s(2, 5.0) is None
    assert virtual.first_reply_deadline_s(1, 5.0) is None


def test_busy_members_per_clock():
    virtual = VirtualClock(5.0)
    virtual.busy_until = {1: 3.0, 2: 0.0}
    assert virtual.busy_members([1, 2, 3], grid=None) == {1}
    virtual.wait_for_free([1], grid=None, timeout=1.0)
    assert virtual.now == 3.0
    assert WallClock(5.0).busy_members([1, 2], grid=object()) == set()


# =============================================================================== deadline policy
def test_predicted_deadline_backs_off_after_each_miss_and_resets_after_an_exact_round():
    policy = DeadlinePolicy(DeadlineOptions(straggler_timeout=100.0, auto_deadline=1.5), True)
    decision = SimpleNamespace(expected_time=4.0)
    assert policy.round_deadline(decision) == 6.0
    policy.after_round("approx", 6.0)
    assert policy.round_deadline(decision) == 12.0
    policy.after_round("skipped", 12.0)
    assert policy.round_deadline(decision) == 24.0
    policy.after_round("exact", 24.0)
    assert policy.round_deadline(decision) == 6.0
    policy.after_round("approx", 100.0)  # the straggler deadline: not a predicted miss
    assert policy.missed == 0
    assert policy.round_deadline(SimpleNamespace(expected_time=float("inf"))) == 100.0
    assert policy.round_deadline(None) == 100.0
    assert policy.round_deadline(SimpleNamespace(expected_time=1000.0)) == 100.0


def test_no_predicted_deadline_without_a_prediction_or_a_factor():
    decision = SimpleNamespace(expected_time=4.0)
    assert DeadlinePolicy(DeadlineOptions(auto_deadline=1.5), False).round_deadline(
        decision) == 10.0
    assert DeadlinePolicy(DeadlineOptions(), True).round_deadline(decision) == 10.0


def test_stopping_replies():
    exact, approx = make_code("frc", 6, 2), make_code("bgc", 6, 2, seed=0)
    assert DeadlinePolicy(DeadlineOptions(), False).stopping_replies(exact) is None
    assert DeadlinePolicy(DeadlineOptions(), False).stopping_replies(approx) == 4
    assert DeadlinePolicy(DeadlineOptions(min_replies=9), False).stopping_replies(exact) == 6


# =============================================================================== collector
def _collector(clock=None):
    clock = clock or VirtualClock(10.0)
    return ReplyCollector(clock, DeadlinePolicy(DeadlineOptions(), False), IntegrityOptions(),
                          Quarantine(), ReplyFingerprints())


def _verifier(verify=False, tolerance=1e-5, quarantine=None):
    return RoundVerifier(IntegrityOptions(verify=verify, verify_tolerance=tolerance),
                         DeadlinePolicy(DeadlineOptions(), False), quarantine or Quarantine())


def _cross_check(verifier, state, used):
    """``(used, verdict)`` of the verifier's cross-check of ``used`` (the window's replies)."""
    from fl_gradcode.flower.clock import RoundWindow
    from fl_gradcode.flower.closer import Closing

    closed = dataclasses.replace(state, closing=Closing(RoundWindow(list(used), 0.0)))
    checked = verifier.cross_check(closed).verification
    return list(checked.used), checked.verdict


def _plan(code, cohort, *, probe=None, reply_layout=None, dtypes=None, busy=(),
          wire="float64"):
    """Round 1's plan (what the opener builds) on ``cohort``, one partition per member."""
    return RoundPlan(number=1, code=code, cohort=tuple(cohort),
                     partitions=tuple(Identity(j, len(cohort)) for j in range(len(cohort))),
                     busy=tuple(busy), excluded=(), quarantined=(), layout={},
                     reply_layout=reply_layout or {}, dtypes=dtypes or {}, theta={},
                     array_key="arrays", wire=wire, wall_start=0.0, probe=probe)


def _state(code, cohort, *, sent=None, valid=None, collector=None, **plan):
    """Round 1's state: ``sent`` (worker -> message), the ``valid`` replies arrived; opened
    by ``collector`` when given (its round in progress)."""
    requests = Requests(dict(sent or {}))
    if collector is not None:
        state = collector.open(_plan(code, cohort, **plan), requests)
    else:
        state = RoundState(_plan(code, cohort, **plan), requests, Arrivals(code))
    for worker, reply in (valid or {}).items():
        state.arrivals.accept(worker, reply)
    return state


class _Reply:
    """What the collector reads of a reply (no Flower run needed)."""

    def __init__(self, group: str, stopped: bool, node: int = 7) -> None:
        self.metadata = SimpleNamespace(src_node_id=node, dst_node_id=node, group_id=group)
        self.error = SimpleNamespace(code=STOPPED_CODE if stopped else 0, reason="stopped")
        self.content = {}

    def has_error(self) -> bool:
        return self.error.code == STOPPED_CODE


def _late(group: str, stopped: bool) -> _Reply:
    return _Reply(group, stopped)


def test_late_replies_are_counted_until_taken():
    collector = _collector()
    collector.on_late_reply(_late("1", False))
    collector.on_late_reply(_late("1", True))
    collector.on_late_reply(_late("1", False))
    assert collector.take_late() == (2, 1)
    assert collector.take_late() == (0, 0)


def test_unsent_messages_leave_the_round():
    collector = _collector()
    msg = _Reply("1", False, node=11)
    state = _state(make_code("frc", 4, 1), [10, 11, 12, 13], sent={0: object(), 1: msg},
                   collector=collector)
    collector.on_unsent([msg])
    assert list(state.sent) == [0]


def test_early_return_rules_only_on_a_clock_that_returns_early():
    virtual = _collector(VirtualClock(10.0))
    _state(make_code("frc", 4, 1), [10, 11, 12, 13], collector=virtual)
    assert not virtual.ready() and virtual.prioritize([1, 2]) == [1, 2]
    wall = _collector(WallClock(10.0))
    state = _state(make_code("frc", 4, 1), [10, 11, 12, 13], collector=wall)
    assert not wall.ready()
    state.arrivals.accept(0, None)  # one reply per FRC group
    state.arrivals.accept(2, None)
    assert wall.ready()


def test_the_stopping_rule_is_a_decodable_set():
    code = make_code("frc", 4, 1)
    rule = _verifier().stopping_rule(_state(code, [10, 11, 12, 13]), code)
    assert not rule([]) and not rule([0, 1]) and rule([0, 2])


# =============================================================================== round state
def test_reject_keeps_the_public_reason_and_the_traceback_apart():
    state = _state(make_code("frc", 4, 1), [10, 11, 12, 13])
    state.arrivals.reject(rejection(1, 11, 1, "ValueError: bad\n--- traceback ---\nTraceback ..."))
    assert state.rejected == [(11, "ValueError: bad")]
    assert state.rejected_details == [(1, "ValueError: bad", "Traceback ...")]
    assert state.worker_of == {10: 0, 11: 1, 12: 2, 13: 3}


def test_partition_key_and_payload_bytes():
    assert partition_key(Identity(2, 5)) == (2, 5)
    assert payload_bytes(_late("1", True)) == 0


def test_decodability_is_built_from_the_valid_replies():
    state = _state(make_code("frc", 4, 1), [10, 11, 12, 13], valid={0: None})
    assert not state.arrivals.decodability().decodable
    state.arrivals.accept(3, None)
    assert state.arrivals.decodability().decodable


def test_wire_dtypes_follow_the_model_for_float_arrays_only():
    dtypes = {"w": np.dtype(np.float32), "n": np.dtype(np.int64)}
    plan = _plan(make_code("frc", 4, 1), [10, 11, 12, 13], dtypes=dtypes, wire="model")
    assert plan.wire_dtypes == {"w": np.float32, "n": np.float64}
    plan = _plan(make_code("frc", 4, 1), [10, 11, 12, 13], dtypes=dtypes, wire="float64")
    assert plan.wire_dtypes == {"w": np.float64, "n": np.float64}


# =============================================================================== round log
class _Membership:
    def row_fields(self, server_round):
        return {"unidentified": [server_round]}


class _Recorder:
    def __init__(self):
        self.rows = []

    def record(self, row):
        self.rows.append(json.loads(json.dumps(row)))


def test_rows_have_every_key_in_order_and_wait_for_the_evaluation():
    recorder = _Recorder()
    log = RoundLog(recorder, _Membership(), VirtualClock(1.0), s=2)
    log.waits_for_evaluation = True
    row = log.record(3, decode="exact", stopped=False)
    assert list(row) == [*ROW_DEFAULTS, "partitions", "nodes"]
    assert row["s"] == 2 and row["unidentified"] == [3] and row["decode"] == "exact"
    assert recorder.rows == []
    log.flush({"accuracy": 0.5, "loss": 1})
    assert recorder.rows[0]["accuracy"] == 0.5 and log.history == [row]
    log.flush(None)  # nothing pending
    assert len(log.history) == 1
    second = log.record(4)
    second["busy"].append(1)  # rows never share the defaults' lists
    assert log.record(5)["busy"] == []


def test_metrics_are_namespaced():
    log = RoundLog(None, _Membership(), VirtualClock(1.0), s=1)
    row = log.record(1, epsilon=0.5)
    metrics = RoundLog.metrics(row, None)
    assert metrics["gc/decoded"] == 0 and metrics["gc/epsilon"] == 0.5
    assert metrics["gc/s"] == 1


# =============================================================================== the strategy
def test_the_strategy_never_branches_on_the_timing_mode():
    tree = ast.parse((FLOWER / "wrapper.py").read_text())
    compares = [node for node in ast.walk(tree) if isinstance(node, ast.Compare)
                and any(isinstance(side, ast.Attribute) and side.attr == "timing"
                        for side in (node.left, *node.comparators))]
    assert compares == []


@pytest.mark.parametrize("module", ["wrapper.py", "policy.py", "opener.py", "collector.py"])
def test_only_the_clock_knows_its_type(module):
    tree = ast.parse((FLOWER / module).read_text())
    checks = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call)
              and getattr(node.func, "id", None) == "isinstance"
              and any(getattr(arg, "id", "") in ("VirtualClock", "WallClock")
                      for arg in node.args[1:])]
    assert checks == []


def test_the_round_opener_sends_nothing_to_busy_members_it_does_not_queue():
    strategy = GradientCoding(FedAvg(), code="frc", s=1, seed=0)  # busy="skip"
    cohort = [10, 11, 12, 13]
    strategy.clock.busy_until[11] = 5.0  # busy until t=5 (virtual)
    code, idle, queued, held = strategy.opener.plan(1, None, cohort)
    assert code.n == 4 and idle == {11} and queued == set() and held == set()


@pytest.mark.parametrize("module", ["options.py", "collector.py", "deadline_policy.py",
                                    "round_state.py", "clock.py", "records.py", "policy.py",
                                    "latency_book.py", "opener.py", "workload.py",
                                    "dispatch.py", "closer.py", "aggregator.py", "decoder.py",
                                    "privatiser.py", "wrapper.py"])
def test_collaborators_read_no_other_objects_private_attributes(module):
    tree = ast.parse((FLOWER / module).read_text())
    reads = [f"{ast.unparse(node)} (line {node.lineno})" for node in ast.walk(tree)
             if isinstance(node, ast.Attribute) and node.attr.startswith("_")
             and not node.attr.startswith("__")
             and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))]
    assert reads == []


def test_the_grid_is_answered_by_the_collaborators():
    strategy = GradientCoding(FedAvg(), timing="wallclock", straggler_timeout=5.0,
                              warmup_timeout=9.0)
    assert strategy.deadline_s(None) == 5.0 and strategy.first_reply_deadline_s() is None
    strategy.collector.open(_plan(make_code("frc", 4, 1), [10, 11, 12, 13]), Requests({}))
    assert strategy.wrap_grid(object()).inner is not None
    assert strategy.deadline_s(None) == 9.0 and strategy.first_reply_deadline_s() == 5.0


def test_evaluating_writes_each_row_with_its_evaluation():
    recorder = _Recorder()
    log = RoundLog(recorder, _Membership(), VirtualClock(1.0), s=1)
    evaluate = log.evaluating(lambda server_round, arrays: {"accuracy": 0.25})
    assert log.waits_for_evaluation
    log.record(1)
    assert recorder.rows == []
    assert evaluate(0, None) == {"accuracy": 0.25} and recorder.rows == []  # round 0: no row
    evaluate(1, None)
    assert recorder.rows[0]["accuracy"] == 0.25
    log.evaluating(None)
    log.record(2)
    assert len(recorder.rows) == 2 and recorder.rows[1]["accuracy"] is None


def test_coded_fields_name_every_group_from_the_state_and_the_outcome():
    from fl_gradcode.flower.records import RoundOutcome

    state = _state(make_code("frc", 4, 1), [10, 11, 12, 13], busy=[3], wire="model")
    state.arrivals.receive("", 100)
    state.arrivals.reject(rejection(1, 12, 2, "bad"))
    verdict = SimpleNamespace(status="verified", excluded=[1], disagreement=0.0)
    outcome = RoundOutcome("exact", [0, 2], 2, 0.0, verdict, 40.0, None)
    identities = {node: Identity(j, 4) for j, node in enumerate(state.cohort)}
    log = RoundLog(None, _Membership(), VirtualClock(1.0), s=1)
    fields = log.coded_fields(state, outcome, identities, wall_s=1.5)
    assert fields["stragglers"] == [1, 3] and fields["busy"] == [3]
    assert fields["rejected"] == 1 and fields["rejected_reasons"] == ["bad"]
    assert fields["verified"] == "verified" and fields["inconsistent"] == [1]
    assert fields["wall_s"] == 1.5 and fields["bytes_up"] == 100 and fields["wire"] == "model"
    assert fields["nodes"]["used"] == [10, 12] and fields["partitions"]["rejected"] == [2]
    row = log.record(1, **fields)
    assert list(row) == [*ROW_DEFAULTS, "partitions", "nodes"]


def test_withholding_rules(caplog):
    verifier = _verifier()
    state = _state(make_code("frc", 4, 1), [10, 11, 12, 13])
    unresolved = Verdict("contradicted", disagreement=0.5, unresolved=True)

    def withholds(verifier, state, verdict, decode):
        return verifier.clearance(state, [], None, verdict, decode)[1]

    assert withholds(verifier, state, unresolved, "skipped")
    assert not withholds(verifier, state, None, "exact")  # not verifying
    verifying = _verifier(verify=True)
    state = _state(make_code("frc", 4, 1), [10, 11, 12, 13], probe=object())
    assert withholds(verifying, state, None, "exact")
    assert not withholds(verifying, state, None, "skipped")
    checked = Verdict("verified")
    assert not withholds(verifying, state, checked, "exact")


def test_the_aggregators_status_follows_the_decoding_error():
    strategy = GradientCoding(FedAvg(), code="frc", s=1, max_decode_error=0.2)
    status = strategy.aggregator.status
    assert status(None) == "skipped"
    assert status(SimpleNamespace(exact=True, error=0.0)) == "exact"
    assert status(SimpleNamespace(exact=False, error=0.2)) == "approx"
    assert status(SimpleNamespace(exact=False, error=0.3)) == "skipped"


def test_an_outvoted_size_report_is_rejected_with_its_worker_and_the_agreed_sizes_kept():
    """FRC n=6, s=2: workers 0-2 replicate partitions 0-2; worker 2 reports 99 examples for
    partition 0 where workers 0 and 1 report 5."""
    from fl_gradcode.flower.privatiser import Privatiser
    from fl_gradcode.privacy import DPConfig, ServerNoise

    code = make_code("frc", 6, 2)
    reported = {0: (5.0, 6.0, 7.0), 1: (5.0, 6.0, 7.0), 2: (99.0, 6.0, 7.0),
                3: (8.0, 9.0, 10.0), 4: (8.0, 9.0, 10.0), 5: (8.0, 9.0, 10.0)}
    state = _state(code, [10, 11, 12, 13, 14, 15],
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


def test_a_code_policy_is_resolved_from_an_instance_a_class_or_the_keywords():
    from fl_gradcode.flower.policy import (
        AdaptiveCodePolicy,
        FixedCodePolicy,
        resolve_code_policy,
    )

    given = FixedCodePolicy(code="frc", s=1)
    assert resolve_code_policy(given, code="bgc", s=2) is given
    built = resolve_code_policy(AdaptiveCodePolicy, code="nested", s="auto", s_max=2)
    assert type(built) is AdaptiveCodePolicy and built.s_max == 2
    plain = resolve_code_policy(None, code="frc", s=1, busy="queue", timing="wallclock")
    assert type(plain) is FixedCodePolicy and plain.busy == "skip"  # wallclock never queues


# =========================================================================================== edges
def _messages(caplog):
    return [r.getMessage() for r in caplog.records]


def test_the_collectors_log_lines_name_the_node_and_the_round(caplog):
    import logging

    collector = _collector()
    msg = _Reply("1", False, node=11)
    _state(make_code("frc", 4, 1), [10, 11, 12, 13], sent={1: msg}, collector=collector)
    with caplog.at_level(logging.DEBUG, logger="flwr"):
        collector.on_unsent([msg])
        collector.on_late_reply(_Reply("3", False, node=12))
        collector.on_late_reply(_Reply("4", True, node=13))
        rejection(1, 11, 1, "bad")
    assert _messages(caplog) == [
        "message to node 11 was not accepted by the grid: straggler",
        "dropped late reply from node 12 to round 3",
        "node 13 stopped its work on round 4 at the deadline",
        "round 1: rejected reply from node 11 (worker 1): bad",
    ]


class _ErrorReply:
    """An error reply the SuperLink writes for an unreachable node: its own sender id, the
    id of the message it answers."""

    def __init__(self, reply_to: str, code: int) -> None:
        self.metadata = SimpleNamespace(src_node_id=99, message_id="r1", group_id="1",
                                        reply_to_message_id=reply_to)
        self.error = SimpleNamespace(code=code, reason="stopped")
        self.content = {}

    def has_error(self) -> bool:
        return True


def test_an_error_reply_with_a_foreign_sender_is_the_failure_of_the_node_it_answers(caplog):
    import logging

    collector = _collector()
    state = _state(make_code("frc", 4, 1), [10, 11, 12, 13], collector=collector,
                   sent={0: SimpleNamespace(metadata=SimpleNamespace(message_id="m0")),
                         1: SimpleNamespace(metadata=SimpleNamespace(message_id="m1"))})
    with caplog.at_level(logging.INFO, logger="flwr"):
        collector.on_reply(_ErrorReply("m1", STOPPED_CODE))
    assert state.stopped == [1] and state.answered == {1} and state.rejected == []
    assert _messages(caplog) == ["round 1: node 11 stopped at the deadline (stopped)"]


def test_a_reply_from_a_member_sent_nothing_is_rejected_with_its_worker():
    collector = _collector()
    state = _state(make_code("frc", 4, 1), [10, 11, 12, 13], collector=collector)
    reply = _Reply("1", False, node=11)
    reply.metadata.message_id = "r11"
    collector.on_reply(reply)
    assert state.rejected == [(11, "sender was not sent work this round")]
    assert state.rejected_details == [(1, "sender was not sent work this round", None)]
    assert state.answered == {1} and state.valid == {}


def test_the_cross_check_measures_disagreement_against_the_replies_exact_sizes():
    """Two FRC replicas of norm 100 whose projections differ by 0.1 disagree by 0.1 / 2 / 100
    relative to their size (verified at tolerance 0.01); against the projections' own norms
    (about 1) they would disagree by about 0.05 (contradicted)."""
    verifier = _verifier(verify=True, tolerance=0.01)
    state = _state(make_code("frc", 4, 1), [10, 11, 12, 13], probe=SimpleNamespace(verdicts={}),
                   valid={0: SimpleNamespace(extra={"z": np.array([1.0, 0.0]), "size": 100.0}),
                          1: SimpleNamespace(extra={"z": np.array([1.1, 0.0]), "size": 100.0})})
    verdict = verifier.verdict(state, [0, 1])
    assert verdict.status == "verified"
    assert verdict.disagreement == pytest.approx(0.1 / 2 / 100)


def _round_expecting_w():
    """An open FRC(4, 1) round on nodes 10, 7, 12, 13 whose replies carry one float64 array
    ``w`` of shape (3,); worker 1 (node 7) was sent ``request``:
    ``(collector, state, request)``."""
    from flwr.app import Message, MessageType, RecordDict

    collector = _collector()
    request = Message(RecordDict(), dst_node_id=7, message_type=MessageType.TRAIN)
    state = _state(make_code("frc", 4, 1), [10, 7, 12, 13], reply_layout={"w": (3,)},
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
        _state(make_code("frc", 4, 1), [10, 11, 12, 13], probe=SimpleNamespace(verdicts={}),
               sent=sent, valid=replies, collector=collector)

    opened({}, valid)
    assert collector.ready()  # the replicas of both groups agree
    opened(dict.fromkeys(range(4)), {w: r for w, r in valid.items() if w != 1})
    assert not collector.ready()  # worker 1's reply could still settle its group
    valid[1].extra["z"] = np.array([2.0, 0.0])  # two replicas disagree: nothing to wait
    opened(dict.fromkeys(range(4)), valid)
    assert collector.ready()  # for, the group is left out and the other one settled


def test_a_two_to_one_group_is_left_out_blaming_nobody_and_logged(caplog):
    """FRC(6, 2): two agreeing replicas could be two colluders, so the third is not
    outvoted (before, it was excluded as the culprit)."""
    import logging

    z = {0: [1.0, 0.0], 1: [1.0, 0.0], 2: [5.0, 0.0], 3: [0.0, 1.0], 4: [0.0, 1.0],
         5: [0.0, 1.0]}
    state = _state(make_code("frc", 6, 2), [10, 11, 12, 13, 14, 15],
                   probe=SimpleNamespace(verdicts={}),
                   valid={w: SimpleNamespace(extra={"z": np.array(v), "size": 1.0})
                          for w, v in z.items()})
    with caplog.at_level(logging.WARNING, logger="flwr"):
        used, verdict = _cross_check(_verifier(verify=True), state, list(range(6)))
    assert used == [3, 4, 5] and verdict.excluded == [] and verdict.unsettled == [0, 1, 2]
    assert ("round 1: workers [0, 1, 2]: no s + 1 = 3 agreeing replicas settle their group "
            "(disagreement 1.33, or replies missing); left out of the decoding, nobody blamed"
            ) in _messages(caplog)


def test_withholding_says_why_in_the_log(caplog):
    import logging

    verifying = _verifier(verify=True)
    state = _state(make_code("frc", 4, 1), [10, 11, 12, 13], probe=object())
    unresolved = Verdict("contradicted", disagreement=0.5, unresolved=True)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        assert verifying.clearance(state, [], None, unresolved, "exact")[1]
        assert verifying.clearance(state, [], None, None, "exact")[1]
    assert _messages(caplog) == [
        "round 1: replies disagree (relative 0.5) and no single reply explains it; nothing is "
        "applied",
        "round 1: verify=True and the replies could not all be cross-checked before the "
        "deadline; nothing is applied",
    ]


def test_a_code_with_fewer_partitions_than_clients_splits_the_apps_data_and_says_so_once(caplog):
    import logging

    from fl_gradcode.flower.workload import Workload

    workload = Workload({10 + j: Identity(j, 4) for j in range(4)}, {}, None, 0)
    code = SimpleNamespace(k=2, name="small")
    with caplog.at_level(logging.WARNING, logger="flwr"):
        assert workload.partitions(code, [10, 11, 12, 13]) == [Identity(0, 2), Identity(1, 2)]
        workload.partitions(code, [10, 11, 12, 13])
    assert _messages(caplog) == [
        "code small has k=2 partitions for 4 clients: the app's data is split into k "
        "partitions (partition-id=j, num-partitions=k); the round's sum is the same only if "
        "the app's update is one full-batch gradient (local epochs or minibatches on other "
        "partitions train another model)"]


def test_a_code_with_fewer_partitions_than_a_sampled_cohort_is_refused_by_the_workload():
    """Nodes 10-13 hold partitions 0-3 of 8: split 2 ways, the app's data would be all 8
    partitions, not the cohort's 4 (the wrapper's policy never plans such a code; a custom
    one that does is refused)."""
    from fl_gradcode.flower.workload import Workload

    workload = Workload({10 + j: Identity(j, 8) for j in range(4)}, {}, None, 0)
    with pytest.raises(ValueError, match=r"code small has k=2 partitions for a cohort of 4 "
                                         r"clients holding 4 of the app's 8 data partitions"):
        workload.partitions(SimpleNamespace(k=2, name="small"), [10, 11, 12, 13])


def _frc_dispatch(seed: int, nonce: str):
    """An open FRC(4, 1) round on nodes 10-13 and a Dispatcher without DP or partition sizes."""
    from fl_gradcode.flower.dispatch import Dispatcher
    from fl_gradcode.flower.workload import Workload
    from fl_gradcode.privacy import DPConfig

    plan = _plan(make_code("frc", 4, 1), [10, 11, 12, 13])
    return plan, Dispatcher(seed=seed, nonce=nonce, dp=DPConfig(), clock=VirtualClock(10.0),
                             workload=Workload({}, {}, None, 0), inner=object())


def test_the_weight_key_defaults_to_num_examples_for_a_strategy_without_one():
    from flwr.app import RecordDict

    from fl_gradcode.flower import protocol

    plan, dispatcher = _frc_dispatch(seed=0, nonce="n")
    requests = dispatcher.dispatch(plan, {10: RecordDict()}, idle={11, 12, 13})
    msg = requests.messages[0]
    assert protocol.parse_instruction(msg.content).weight_key == "num-examples"
    assert requests.messages == {0: msg}


def test_a_prediction_of_zero_seconds_keeps_the_straggler_deadline():
    policy = DeadlinePolicy(DeadlineOptions(straggler_timeout=100.0, auto_deadline=1.5), True)
    assert policy.round_deadline(SimpleNamespace(expected_time=0.0)) == 100.0
    assert policy.round_deadline(SimpleNamespace(expected_time=-1.0)) == 100.0


class _ExcludingPolicy:
    """A code policy that excludes worker 2 and queues nobody (what the opener asks of it)."""

    decision = None

    def __init__(self, code):
        self.code = code

    def plan(self, cohort, busy):
        return self.code

    def excluded_workers(self):
        return [2]

    def queued(self, busy, cohort):
        return set()


def test_a_member_the_policy_excludes_is_sent_nothing_and_recorded_as_excluded_not_busy():
    from flwr.app import Array, ArrayRecord, RecordDict

    from fl_gradcode.flower.opener import RoundOpener
    from fl_gradcode.flower.workload import Workload

    cohort = [10, 11, 12, 13]
    identities = {node: Identity(j, 4) for j, node in enumerate(cohort)}
    opener = RoundOpener(
        policy=_ExcludingPolicy(make_code("frc", 4, 1)), clock=VirtualClock(10.0),
        deadlines=DeadlinePolicy(DeadlineOptions(), False), quarantine=Quarantine(),
        workload=Workload(identities, {}, None, 0), verifier=_verifier(),
        wire_for=lambda code: "float64", code_options={}, round_timeout=1.0)
    content = RecordDict({"arrays": ArrayRecord({"w": Array(np.zeros(3))})})
    opened = opener.open(1, None, cohort, content)
    assert opened.idle == {12} and opened.queued == frozenset()
    assert opened.plan.excluded == (2,) and opened.plan.busy == ()


def test_the_model_arrays_key_falls_back_to_the_only_array_record():
    from flwr.app import Array, ArrayRecord, RecordDict

    from fl_gradcode.flower.round_state import array_key

    only = RecordDict({"model": ArrayRecord({"w": Array(np.zeros(2))})})
    assert array_key(only, "arrays") == "model"
    assert array_key(only, "model") == "model"
    two = RecordDict({"a": ArrayRecord({"w": Array(np.zeros(2))}),
                      "b": ArrayRecord({"w": Array(np.zeros(2))})})
    with pytest.raises(ValueError, match=r"^the inner strategy's train content has no "
                                         r"ArrayRecord 'arrays'$"):
        array_key(two, "arrays")


def test_a_chunk_travels_in_float32_only_with_wire_model_and_an_all_float32_model():
    from fl_gradcode.flower.round_state import wire_dtypes

    code = make_code("comm-efficient", 4, 1, m=2)
    f32, f64 = np.dtype(np.float32), np.dtype(np.float64)
    assert wire_dtypes(code, {"a": f32, "b": f32}, "model") == {"chunk": f32}
    assert wire_dtypes(code, {"a": f32, "b": f64}, "model") == {"chunk": f64}
    assert wire_dtypes(code, {"a": f32, "b": f32}, "float64") == {"chunk": f64}


def test_a_workers_load_is_its_examples_over_one_clients_share():
    """FRC(4, 1): workers 0 and 1 hold partitions {0, 1}, workers 2 and 3 hold {2, 3}."""
    from fl_gradcode.flower.workload import Workload

    code = make_code("frc", 4, 1)
    parts = [Identity(j, 4) for j in range(4)]
    sized = Workload({}, {(0, 4): 10.0, (1, 4): 10.0, (2, 4): 30.0, (3, 4): 30.0}, None, 0)
    # one client's share = 80 / 4 = 20 examples; worker 0 computes 10 + 10, worker 2 30 + 30
    assert sized.load(code, 0, parts) == 1.0 and sized.load(code, 2, parts) == 3.0
    # partition 3's size unknown: the mean of the known (50 / 3) stands in for it
    partly = Workload({}, {(0, 4): 10.0, (1, 4): 10.0, (2, 4): 30.0}, None, 0)
    share = (50.0 + 50.0 / 3) / 4
    assert partly.load(code, 2, parts) == pytest.approx((30.0 + 50.0 / 3) / share)
    # sizes unknown or all zero: counted in partitions, 2 of one client's 1
    assert Workload({}, {}, None, 0).load(code, 0, parts) == 2.0
    empty = Workload({}, {(j, 4): 0.0 for j in range(4)}, None, 0)
    assert empty.load(code, 0, parts) == 2.0


def test_the_opened_round_records_the_models_layout():
    from flwr.app import Array, ArrayRecord, RecordDict

    from fl_gradcode.flower.opener import RoundOpener
    from fl_gradcode.flower.workload import Workload

    cohort = [10, 11, 12, 13]
    opener = RoundOpener(
        policy=_ExcludingPolicy(make_code("frc", 4, 1)), clock=VirtualClock(10.0),
        deadlines=DeadlinePolicy(DeadlineOptions(), False), quarantine=Quarantine(),
        workload=Workload({node: Identity(j, 4) for j, node in enumerate(cohort)}, {}, None, 0),
        verifier=_verifier(), wire_for=lambda code: "float64", code_options={},
        round_timeout=1.0)
    content = RecordDict({"arrays": ArrayRecord({"w": Array(np.zeros((2, 3))),
                                                 "b": Array(np.zeros(3))})})
    state = opener.open(1, None, cohort, content).plan
    assert state.layout == {"w": (2, 3), "b": (3,)}


def test_a_reply_without_an_open_round_is_ignored():
    collector = _collector()
    reply = _Reply("1", False, node=11)
    reply.metadata.message_id = "r11"
    collector.on_reply(reply)  # no round in progress: nothing to validate it against
    assert collector.state is None


def test_serial_blas_sets_multithreaded_blas_to_one_thread_and_restores_it():
    from threadpoolctl import ThreadpoolController, threadpool_limits

    from fl_gradcode.flower.collector import serial_blas

    def threads():
        return [lib.num_threads for lib in ThreadpoolController().select(
            user_api="blas").lib_controllers]

    with threadpool_limits(limits=2, user_api="blas"):
        before = threads()
        if not before or 2 not in before:
            pytest.skip("no BLAS library that runs on 2 threads here")
        with serial_blas():
            assert set(threads()) == {1}
        assert threads() == before


def test_a_serial_blas_block_inside_another_leaves_the_libraries_alone(monkeypatch):
    """Only the outermost block reads and sets the thread counts (the grid's block around a
    batch makes each reply's own block free); the outer one restores them on exit."""
    from fl_gradcode.flower import blas
    from fl_gradcode.flower.collector import serial_blas

    calls = []

    class Lib:
        threads = 4

        def get_num_threads(self):
            calls.append("get")
            return self.threads

        def set_num_threads(self, n):
            calls.append(("set", n))
            self.threads = n

    lib = Lib()
    monkeypatch.setattr(blas, "_blas", lambda: [lib])
    with serial_blas():
        assert calls == ["get", ("set", 1)]
        for _ in range(3):
            with serial_blas():
                assert lib.threads == 1
        assert calls == ["get", ("set", 1)] and lib.threads == 1
    assert calls == ["get", ("set", 1), ("set", 4)] and lib.threads == 4
    with serial_blas():  # a fresh outermost block reads and sets again
        pass
    assert calls[3:] == ["get", ("set", 1), ("set", 4)]


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


def test_an_applied_decoding_the_replicas_contradict_turns_the_verdict_contradicted():
    """FRC(4, 1), workers 0 and 2 used: the min-norm decoding weighs each by 1; applying
    weight 2 to worker 0 (reply [1, 0], size 1) is off by |2 - 1| * 1 / 1 = 1."""
    verifier = _verifier(verify=True, tolerance=0.01)
    state = _state(make_code("frc", 4, 1), [10, 11, 12, 13],
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

    verifier = _verifier(verify=True)
    code = make_code("frc", 4, 0)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        assert verifier.probe_for(1, code, {"w": (3,)}, {}) is None
        assert verifier.probe_for(1, code, {"w": (3,)}, {}) is None
    assert _messages(caplog) == [
        "verify=True: round 1 uses s=0 (no redundancy): such rounds are applied unverified "
        "(verified=None in rounds.jsonl)"]
    assert _verifier().probe_for(1, code, {"w": (3,)}, {}) is None  # not verifying: no probe


def test_a_train_instruction_carries_the_runs_nonce_and_the_workers_partitions():
    from flwr.app import RecordDict

    from fl_gradcode.flower import protocol

    plan, dispatcher = _frc_dispatch(seed=3, nonce="run-nonce")
    inst = protocol.parse_instruction(dispatcher.message(plan, 2, 12, RecordDict()).content)
    assert inst.nonce == "run-nonce" and inst.seed == 3 and inst.worker == 2
    assert inst.partition_ids == (2, 3) and inst.num_partitions == (4, 4)  # FRC group {2, 3}


def test_the_opener_reads_the_arrays_record_by_default_among_several():
    from flwr.app import Array, ArrayRecord, RecordDict

    from fl_gradcode.flower.opener import RoundOpener
    from fl_gradcode.flower.workload import Workload

    cohort = [10, 11, 12, 13]
    opener = RoundOpener(
        policy=_ExcludingPolicy(make_code("frc", 4, 1)), clock=VirtualClock(10.0),
        deadlines=DeadlinePolicy(DeadlineOptions(), False), quarantine=Quarantine(),
        workload=Workload({node: Identity(j, 4) for j, node in enumerate(cohort)}, {}, None, 0),
        verifier=_verifier(), wire_for=lambda code: "float64", code_options={},
        round_timeout=1.0)
    content = RecordDict({"extra": ArrayRecord({"v": Array(np.zeros(2))}),
                          "arrays": ArrayRecord({"w": Array(np.zeros(3))})})
    state = opener.open(1, None, cohort, content).plan
    assert state.array_key == "arrays" and state.layout == {"w": (3,)}


def test_the_applied_decoding_is_measured_against_the_replies_exact_sizes():
    """FRC(4, 1), workers 0 and 2 used, replies [1, 0] and [0, 1] of exact norm 100: applying
    weight 1.5 instead of 1 to worker 0 is off by 0.5 * 1 / 100 = 0.005 relative to the
    replies' size (verified at tolerance 0.01); against the projections' norms (1) it would be
    off by 0.5 (contradicted)."""
    verifier = _verifier(verify=True, tolerance=0.01)
    state = _state(make_code("frc", 4, 1), [10, 11, 12, 13],
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
    verifier = _verifier(verify=True, tolerance=0.0)
    state = _state(make_code("frc", 4, 1), [10, 11, 12, 13],
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

    verifier = _verifier(verify=True, quarantine=Quarantine(offences=1, rounds=5))
    z = {0: [1.0, 0.0], 1: [2.0, 0.0], 2: [0.0, 1.0], 3: [0.0, 1.0]}
    state = _state(make_code("frc", 4, 1), [10, 11, 12, 13], probe=SimpleNamespace(verdicts={}),
                   valid={w: SimpleNamespace(extra={"z": np.array(v), "size": 1.0})
                          for w, v in z.items()})
    with caplog.at_level(logging.WARNING, logger="flwr"):
        _, verdict = _cross_check(verifier, state, [0, 1, 2, 3])
    assert not verdict.unresolved and verdict.unsettled == [0, 1]
    assert [m for m in _messages(caplog) if "quarantined" in m] == []


def test_a_train_instruction_carries_the_dp_noise_multiplier():
    from flwr.app import RecordDict

    from fl_gradcode.flower import protocol
    from fl_gradcode.flower.dispatch import Dispatcher
    from fl_gradcode.flower.workload import Workload
    from fl_gradcode.privacy import DPConfig

    plan = _plan(make_code("frc", 4, 1), [10, 11, 12, 13])
    dispatcher = Dispatcher(seed=0, nonce="n",
                            dp=DPConfig(mode="partition", clip_norm=2.0, noise_multiplier=0.75),
                            clock=VirtualClock(10.0), workload=Workload({}, {}, None, 0),
                            inner=object())
    inst = protocol.parse_instruction(dispatcher.message(plan, 1, 11, RecordDict()).content)
    assert (inst.dp, inst.clip_norm, inst.noise_multiplier) == ("partition", 2.0, 0.75)


class _RecordingPolicy(_ExcludingPolicy):
    """Excludes and queues nobody, recording what it is asked to queue from."""

    def __init__(self, code):
        super().__init__(code)
        self.asked = []

    def excluded_workers(self):
        return []

    def queued(self, busy, cohort):
        self.asked.append((set(busy), cohort))
        return set()


def test_a_round_with_every_member_busy_waits_and_asks_the_policy_again_with_the_cohort():
    """Every member busy until 5, 3, 7, 9 s and nothing queued: the virtual clock jumps to
    3 s, when node 11 is free, and the policy is asked again with the round's cohort."""
    from fl_gradcode.flower.opener import RoundOpener
    from fl_gradcode.flower.workload import Workload

    cohort = [10, 11, 12, 13]
    clock = VirtualClock(10.0)
    clock.busy_until = {10: 5.0, 11: 3.0, 12: 7.0, 13: 9.0}
    policy = _RecordingPolicy(make_code("frc", 4, 1))
    opener = RoundOpener(
        policy=policy, clock=clock,
        deadlines=DeadlinePolicy(DeadlineOptions(), False), quarantine=Quarantine(),
        workload=Workload({node: Identity(j, 4) for j, node in enumerate(cohort)}, {}, None, 0),
        verifier=_verifier(), wire_for=lambda code: "float64", code_options={},
        round_timeout=1.0)
    _, idle, queued, held = opener.plan(1, None, cohort)
    assert clock.now == 3.0
    assert policy.asked == [({10, 11, 12, 13}, cohort), ({10, 12, 13}, cohort)]
    assert (idle, queued, held) == ({10, 12, 13}, set(), set())


def test_the_wire_dtypes_are_computed_once_per_code_dtypes_and_wire(monkeypatch):
    from fl_gradcode.flower import round_state

    calls = []
    real = round_state.wire_dtypes

    def counting(*key):
        calls.append(key)
        return real(*key)

    monkeypatch.setattr(round_state, "wire_dtypes", counting)
    dtypes = {"w": np.dtype(np.float32)}
    plan = _plan(make_code("frc", 4, 1), [10, 11, 12, 13], dtypes=dtypes, wire="float64")
    for _ in range(3):
        assert plan.wire_dtypes == {"w": np.dtype(np.float64)}
    assert len(calls) == 1
    plan = _plan(make_code("frc", 4, 1), [10, 11, 12, 13], dtypes=dtypes, wire="model")
    assert plan.wire_dtypes == {"w": np.dtype(np.float32)}
    assert len(calls) == 2
