"""GradientCoding's collaborators on their own: clocks, deadline policy, round state, round log,
and the strategy's shape (only the clock knows the timing mode, no collaborator reads another
object's private attributes) with its serial-BLAS block. The reply collector and the round
verifier are in ``test_collaborators_replies.py``, the round opener, dispatcher and workload in
``test_collaborators_opener.py``."""

from __future__ import annotations

import ast
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
from fl_gradcode.flower.deadline_policy import DeadlinePolicy
from fl_gradcode.flower.dispatch import Requests
from fl_gradcode.flower.options import DeadlineOptions, TimingOptions
from fl_gradcode.flower.protocol import Identity
from fl_gradcode.flower.records import ROW_DEFAULTS, RoundLog
from fl_gradcode.flower.round_state import partition_key, payload_bytes, rejection
from tests.flower.collaborators_support import late_reply, make_plan, make_state

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


def test_a_prediction_of_zero_seconds_keeps_the_straggler_deadline():
    policy = DeadlinePolicy(DeadlineOptions(straggler_timeout=100.0, auto_deadline=1.5), True)
    assert policy.round_deadline(SimpleNamespace(expected_time=0.0)) == 100.0
    assert policy.round_deadline(SimpleNamespace(expected_time=-1.0)) == 100.0


# =============================================================================== round state
def test_reject_keeps_the_public_reason_and_the_traceback_apart():
    state = make_state(make_code("frc", 4, 1), [10, 11, 12, 13])
    state.arrivals.reject(rejection(1, 11, 1, "ValueError: bad\n--- traceback ---\nTraceback ..."))
    assert state.rejected == [(11, "ValueError: bad")]
    assert state.rejected_details == [(1, "ValueError: bad", "Traceback ...")]
    assert state.worker_of == {10: 0, 11: 1, 12: 2, 13: 3}


def test_partition_key_and_payload_bytes():
    assert partition_key(Identity(2, 5)) == (2, 5)
    assert payload_bytes(late_reply("1", True)) == 0


def test_decodability_is_built_from_the_valid_replies():
    state = make_state(make_code("frc", 4, 1), [10, 11, 12, 13], valid={0: None})
    assert not state.arrivals.decodability().decodable
    state.arrivals.accept(3, None)
    assert state.arrivals.decodability().decodable


def test_wire_dtypes_follow_the_model_for_float_arrays_only():
    dtypes = {"w": np.dtype(np.float32), "n": np.dtype(np.int64)}
    plan = make_plan(make_code("frc", 4, 1), [10, 11, 12, 13], dtypes=dtypes, wire="model")
    assert plan.wire_dtypes == {"w": np.float32, "n": np.float64}
    plan = make_plan(make_code("frc", 4, 1), [10, 11, 12, 13], dtypes=dtypes, wire="float64")
    assert plan.wire_dtypes == {"w": np.float64, "n": np.float64}


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


def test_the_wire_dtypes_are_computed_once_per_code_dtypes_and_wire(monkeypatch):
    from fl_gradcode.flower import round_state

    calls = []
    real = round_state.wire_dtypes

    def counting(*key):
        calls.append(key)
        return real(*key)

    monkeypatch.setattr(round_state, "wire_dtypes", counting)
    dtypes = {"w": np.dtype(np.float32)}
    plan = make_plan(make_code("frc", 4, 1), [10, 11, 12, 13], dtypes=dtypes, wire="float64")
    for _ in range(3):
        assert plan.wire_dtypes == {"w": np.dtype(np.float64)}
    assert len(calls) == 1
    plan = make_plan(make_code("frc", 4, 1), [10, 11, 12, 13], dtypes=dtypes, wire="model")
    assert plan.wire_dtypes == {"w": np.dtype(np.float32)}
    assert len(calls) == 2


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

    state = make_state(make_code("frc", 4, 1), [10, 11, 12, 13], busy=[3], wire="model")
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
    strategy.collector.open(make_plan(make_code("frc", 4, 1), [10, 11, 12, 13]), Requests({}))
    assert strategy.wrap_grid(object()).inner is not None
    assert strategy.deadline_s(None) == 9.0 and strategy.first_reply_deadline_s() == 5.0


def test_the_aggregators_status_follows_the_decoding_error():
    strategy = GradientCoding(FedAvg(), code="frc", s=1, max_decode_error=0.2)
    status = strategy.aggregator.status
    assert status(None) == "skipped"
    assert status(SimpleNamespace(exact=True, error=0.0)) == "exact"
    assert status(SimpleNamespace(exact=False, error=0.2)) == "approx"
    assert status(SimpleNamespace(exact=False, error=0.3)) == "skipped"


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
    plain = resolve_code_policy(None, code="frc", s=1, timing="wallclock")
    assert type(plain) is FixedCodePolicy and plain.busy == "skip"  # wallclock never queues


# =============================================================================== serial BLAS
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
