"""Records that name clients, the wrapper's metrics under ``gc/``, and logs a person reads.

Real ClientApps under ``gradient_coding_mod`` on ``InProcessGrid`` (the tiny numpy app of
``test_wrapper``). The expected names come from the grid's own node configuration (node ``i``
of the grid has ``partition-id=i``): independent of the wrapper's handshake bookkeeping.
"""

from __future__ import annotations

import json
import logging

import pytest
from flwr.app import ConfigRecord, MetricRecord
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAdam, FedAvg

from fl_gradcode.flower import GradientCoding, gradient_coding_mod
from fl_gradcode.flower.records import TRACEBACK_MARKER, split_reason
from fl_gradcode.flower.testing import InProcessGrid
from tests.apps.numpy_app import (
    evaluate,
    initial_arrays,
    pytestmark,  # noqa: F401 (the warning filter applies here)
    train,
)
from tests.flower.harness import FixedArrivals

GROUPS = {"used", "stragglers", "busy", "rejected", "excluded", "inconsistent", "stopped"}


def _app(train_fn) -> ClientApp:
    app = ClientApp(mods=[gradient_coding_mod])
    app.train()(train_fn)
    app.evaluate()(evaluate)
    return app


def _rows(directory) -> list[dict]:
    return [json.loads(line) for line in (directory / "rounds.jsonl").read_text().splitlines()]


def _start(strategy, grid, rounds):
    return strategy.start(grid, initial_arrays(), num_rounds=rounds,
                          train_config=ConfigRecord({"lr": 0.3}))


# ------------------------------------------------------------------ names under sampling
def test_rows_name_clients_by_partition_and_node_under_sampling(tmp_path):
    grid = InProcessGrid(_app(train), 8)
    partition_of_node = {node: i for i, node in enumerate(grid.node_ids)}  # grid's config
    inner = FedAvg(fraction_train=0.5, min_train_nodes=4, min_available_nodes=8,
                   fraction_evaluate=0.0)
    strategy = GradientCoding(inner, s=1, seed=3, results_dir=str(tmp_path))
    _start(strategy, grid, rounds=4)
    rows = _rows(tmp_path)
    assert len(rows) == 4
    sampled = set()
    for row in rows:
        assert set(row["partitions"]) == GROUPS and set(row["nodes"]) == GROUPS
        for group in GROUPS:
            nodes, parts = row["nodes"][group], row["partitions"][group]
            assert parts == [partition_of_node[node] for node in nodes]
        # every cohort member is used or a straggler, each once
        cohort = row["nodes"]["used"] + row["nodes"]["stragglers"]
        assert len(cohort) == len(set(cohort)) == 4
        # the positions kept beside the names: same counts, in cohort order
        assert len(row["partitions"]["used"]) == len(row["clients_used"])
        assert len(row["partitions"]["stragglers"]) == len(row["stragglers"])
        sampled |= set(cohort)
    assert len(sampled) > 4  # sampling really changed the cohort: positions alone mislead


@pytest.mark.parametrize("stop_late_work", [False, True])
def test_busy_and_stopped_clients_are_named(stop_late_work):
    """Partition 0 takes 50 virtual seconds in round 1 (deadline 10 s, the round decodes at
    1 s): a straggler, stopped at the deadline with stop_late_work, and busy in round 2."""
    grid = InProcessGrid(_app(train), 6)
    latency = FixedArrivals({1: [50.0, 1, 1, 1, 1, 1], 2: [1.0] * 6})
    strategy = GradientCoding(FedAvg(fraction_evaluate=0.0), code="frc", s=1, latency=latency,
                              measured_compute=False, straggler_timeout=10.0,
                              stop_late_work=stop_late_work)
    _start(strategy, grid, rounds=2)
    first, second = strategy.history
    slow = grid.node_ids[0]  # node i has partition-id i
    # (replies arriving together: the window may close before reading all of them)
    assert slow in first["nodes"]["stragglers"] and 0 in first["partitions"]["stragglers"]
    assert 0 not in first["partitions"]["used"] and 1 in first["partitions"]["used"]
    if stop_late_work:  # its work stops at the deadline (10 s), still ahead in round 2
        assert first["nodes"]["stopped"] == [slow] and first["partitions"]["stopped"] == [0]
    else:
        assert first["nodes"]["stopped"] == [] and first["partitions"]["stopped"] == []
    assert second["nodes"]["busy"] == [slow] and second["partitions"]["busy"] == [0]


def test_an_idle_round_has_every_group_empty(tmp_path):
    strategy = GradientCoding(FedAvg(), results_dir=str(tmp_path))
    strategy.aggregate_train(1, [])
    (row,) = _rows(tmp_path)
    assert row["partitions"] == {group: [] for group in GROUPS}
    assert row["nodes"] == {group: [] for group in GROUPS}


# ------------------------------------------------------------------ gc/ namespace
def _train_with_metric_named_exact(msg, context):
    reply = train(msg, context)
    metrics = reply.content["metrics"]
    pid = int(context.node_config["partition-id"])
    reply.content["metrics"] = MetricRecord({**metrics, "exact": 100.0 + pid, "s": 7.0})
    return reply


def test_wrapper_metrics_live_under_gc_and_the_apps_own_survive():
    """The app reports metrics named ``exact`` and ``s`` (example-weighted by FedAvg); ours
    are ``gc/exact``, ``gc/s``, ... and do not overwrite them."""
    grid = InProcessGrid(_app(_train_with_metric_named_exact), 4)
    strategy = GradientCoding(FedAvg(fraction_evaluate=0.0), s=1)
    result = _start(strategy, grid, rounds=1)
    metrics = result.train_metrics_clientapp[1]
    sizes = {j: 10 + j for j in range(4)}  # test_wrapper's app: 10 + j examples
    weighted = sum(n * (100.0 + j) for j, n in sizes.items()) / sum(sizes.values())
    assert metrics["exact"] == pytest.approx(weighted, rel=1e-12)
    assert metrics["s"] == pytest.approx(7.0)
    assert metrics["gc/exact"] == 1 and metrics["gc/decoded"] == 1 and metrics["gc/s"] == 1
    assert metrics["gc/clients_used"] + metrics["gc/stragglers"] == 4
    assert metrics["gc/rejected"] == 0
    ours = {k for k in metrics if k.startswith("gc/")}
    assert {"gc/decode_error", "gc/virtual_s", "gc/wall_s", "gc/stopped"} <= ours
    assert set(metrics) - ours == {"train_loss", "exact", "s"}


# ------------------------------------------------------------------ rejected replies
def _train_crashing_on_2(msg, context):
    if int(context.node_config["partition-id"]) == 2:
        raise ValueError("no data for partition two")
    return train(msg, context)


def test_one_log_line_per_rejected_reply_and_the_traceback_in_debug_log(tmp_path, caplog):
    grid = InProcessGrid(_app(_train_crashing_on_2), 4)
    strategy = GradientCoding(FedAdam(fraction_evaluate=0.0), code="frc", s=1,
                              results_dir=str(tmp_path))
    with caplog.at_level(logging.INFO, logger="flwr"):
        _start(strategy, grid, rounds=2)
    rows = _rows(tmp_path)
    # frc s=1 on 4 clients: partition 2 is held by workers 2 and 3 (nodes of partitions 2, 3)
    crashed = {grid.node_ids[2], grid.node_ids[3]}
    for row in rows:
        assert set(row["nodes"]["rejected"]) == crashed
        assert row["partitions"]["rejected"] == [
            grid.node_ids.index(node) for node in row["nodes"]["rejected"]]
        assert row["rejected_reasons"] == [
            "error reply (code 5400: ValueError: no data for partition two)"] * 2
    rejected_lines = [r.getMessage() for r in caplog.records if "rejected reply" in r.getMessage()]
    assert len(rejected_lines) == 4  # two replies in each of two rounds, one line each
    for line in rejected_lines:
        assert "\n" not in line and len(line) < 300
        assert "ValueError: no data for partition two" in line
        assert "Traceback" not in line
    assert any("round 1" in line and "partition 2/4" in line for line in rejected_lines)
    assert any("round 2" in line and "partition 3/4" in line for line in rejected_lines)
    # Flower's "Received 1 results" of the inner aggregation: not logged every round
    assert not [r for r in caplog.records if "Received 1 results" in r.getMessage()]
    text = (tmp_path / "debug.log").read_text()
    assert text.count("=== round") == 4
    assert f"round 2: rejected reply from node {grid.node_ids[2]} (partition 2/4" in text
    assert "Traceback (most recent call last)" in text
    assert "in _train_crashing_on_2" in text  # the app's own frame
    assert 'raise ValueError("no data for partition two")' in text


def test_the_error_reason_carries_a_capped_traceback_after_one_line():
    from fl_gradcode.flower.records import error_reason

    def deep(n):
        if n == 0:
            raise KeyError("deep")
        deep(n - 1)

    try:
        deep(400)
    except KeyError as exc:
        reason = error_reason(exc, limit=2000)
    head, tail = reason.split(TRACEBACK_MARKER)
    assert head == "KeyError: 'deep'"
    assert len(tail) < 2100 and tail.rstrip().endswith("KeyError: 'deep'")
    assert split_reason(f"error reply (code 5400: {reason})")[0] == (
        "error reply (code 5400: KeyError: 'deep')")


def test_a_ray_style_traceback_reason_is_summarised_on_one_line():
    reason = ("<class 'ray.exceptions.RayTaskError(ClientAppException)'>:<'ray::"
              "ClientAppActor.run()\nTraceback (most recent call last):\n  File \"a.py\", line 1,"
              " in run\n    x()\nflwr.clientapp.client_app.ClientAppException: \nException "
              "ClientAppException occurred. Message: CUDA out of memory'>")
    summary, detail = split_reason(reason)
    assert "\n" not in summary
    assert summary == "ClientAppException: CUDA out of memory"  # Ray's repr unwrapped
    assert detail == reason


def test_without_a_results_directory_the_traceback_is_logged_at_debug_level(caplog):
    grid = InProcessGrid(_app(_train_crashing_on_2), 4)
    strategy = GradientCoding(FedAvg(fraction_evaluate=0.0), code="frc", s=1)
    with caplog.at_level(logging.DEBUG, logger="flwr"):
        _start(strategy, grid, rounds=1)
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG
             and "Traceback (most recent call last)" in r.getMessage()]
    assert len(debug) == 2  # the two replicas of partition 2
    assert all("in _train_crashing_on_2" in text for text in debug)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING
                and "rejected reply" in r.getMessage()]
    assert len(warnings) == 2 and all("\n" not in r.getMessage() for r in warnings)


# ======== edges: exact values, bounds and messages ===============================================
def test_a_traceback_of_exactly_the_limit_is_kept_whole_and_a_longer_one_is_cut_from_the_front():
    import traceback

    from fl_gradcode.flower.records import error_reason

    try:
        raise ValueError("boom")
    except ValueError as exc:
        full = traceback.format_exc()
        whole = error_reason(exc, limit=len(full))
        cut = error_reason(exc, limit=len(full) - 7)
    assert whole == "ValueError: boom" + TRACEBACK_MARKER + full
    assert cut == ("ValueError: boom" + TRACEBACK_MARKER + "[7 characters cut]\n"
                   + full[7:])


def test_error_reason_outside_an_except_block_is_its_head_only():
    from fl_gradcode.flower.records import error_reason

    assert error_reason(RuntimeError("late")) == "RuntimeError: late"


def test_split_reason_keeps_a_second_marker_in_the_traceback_and_moves_only_owed_parentheses():
    tail = "Traceback\n" + TRACEBACK_MARKER + "more)"
    assert split_reason("E: x" + TRACEBACK_MARKER + tail) == ("E: x", tail)
    # the head opens one parenthesis: one of the tail's closing ones is moved back to it
    assert split_reason("reply (code 1: E: x" + TRACEBACK_MARKER + "tb\nE: x))") == (
        "reply (code 1: E: x)", "tb\nE: x)")
    # a head with balanced parentheses gets none
    assert split_reason("f(a) E: x" + TRACEBACK_MARKER + "tb)") == ("f(a) E: x", "tb)")
    assert split_reason("no traceback here") == ("no traceback here", None)


def test_a_plain_python_traceback_reason_is_summarised_by_its_exception_line():
    text = ("Traceback (most recent call last):\n  File \"a.py\", line 1, in f\n"
            "    g()\nValueError: bad value 3\n")
    assert split_reason(text) == ("ValueError: bad value 3", text)


def test_a_debug_entry_names_the_reply_and_escapes_control_characters():
    from fl_gradcode.flower.records import debug_entry

    assert debug_entry(3, 17, "2/4", 5, "E: x", None) == (
        "=== round 3: rejected reply from node 17 (partition 2/4, worker 5) ===\nE: x\n\n")
    assert debug_entry(3, None, None, None, "E: \x1b[31mred\u2028", "tb\tline\n\n") == (
        "=== round 3: rejected reply from node None (partition ?, worker ?) ===\n"
        "E: \\x1b[31mred\\u2028\ntb\tline\n\n")


def _state(**over):
    from types import SimpleNamespace as NS

    base = dict(code=NS(s=1, n=4), busy=[3], excluded=[2], rejected=[(107, "E: bad")],
                rejected_details=[(1, "E: bad", None)], wire="float32", quarantined=[5],
                bytes_up=10, bytes_down=20, valid={0: NS(compute_s=0.5), 1: NS(compute_s=0.25)},
                number=3, cohort=[100, 101, 102, 103], stopped=[3, 3])
    return NS(**{**base, **over})


def _identities():
    from types import SimpleNamespace as NS

    return {100: NS(partition_id=0, num_partitions=4), 101: NS(partition_id=1, num_partitions=4),
            103: NS(partition_id=3, num_partitions=4)}


def test_the_coded_fields_of_a_round_name_every_value_and_group(caplog):
    from types import SimpleNamespace as NS

    from fl_gradcode.flower.records import RoundLog, RoundOutcome

    log = RoundLog(None, NS(row_fields=lambda r: {}), NS(now=0.0), s=1)
    verdict = NS(status="verified", excluded=[2], disagreement=0.125)
    outcome = RoundOutcome(decode="exact", used=[0, 1], replies_read=2, decode_error=0.0,
                           verdict=verdict, num_examples=40.0, central_noise_std=None)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        fields = log.coded_fields(_state(), outcome, _identities(), round_virtual_s=1.5)
    assert fields == {
        "decode": "exact", "s": 1, "clients_used": [0, 1], "replies_read": 2,
        "stragglers": [2, 3], "busy": [3], "excluded": [2], "rejected": 1,
        "rejected_reasons": ["E: bad"], "decode_error": 0.0, "num_examples": 40.0,
        "wire": "float32", "verified": "verified", "cross_check": None, "quarantined": [5],
        "inconsistent": [2],
        "disagreement": 0.125, "unsettled": [], "bytes_up": 10, "bytes_down": 20, "compute_s": 0.75,
        "central_noise_std": None, "round_virtual_s": 1.5,
        "partitions": {"used": [0, 1], "stragglers": [None, 3], "busy": [3],
                       "rejected": [None], "excluded": [None], "inconsistent": [None],
                       "stopped": [3]},
        "nodes": {"used": [100, 101], "stragglers": [102, 103], "busy": [103],
                  "rejected": [107], "excluded": [102], "inconsistent": [102],
                  "stopped": [103]},
    }
    assert [r.getMessage() for r in caplog.records] == [
        "round 3: rejected reply from partition ? (node 107, worker 1): E: bad"]
    unchecked = RoundOutcome(decode="approx", used=[0], replies_read=1, decode_error=0.5)
    fields = log.coded_fields(_state(rejected=[], rejected_details=[]), unchecked,
                              _identities())
    assert (fields["verified"], fields["inconsistent"], fields["disagreement"]) == (None, [],
                                                                                    None)
    assert fields["nodes"]["inconsistent"] == [] and fields["stragglers"] == [1, 2, 3]


def test_rows_wait_for_the_evaluation_of_their_round_and_carry_its_accuracy():
    from types import SimpleNamespace as NS

    from fl_gradcode.flower.records import RoundLog

    log = RoundLog(None, NS(row_fields=lambda r: {"unidentified": [r]}), NS(now=2.5), s=2)
    calls = []

    def evaluate(server_round, arrays):
        calls.append((server_round, arrays))
        return {"accuracy": 0.5, "loss": 1.25}

    hook = log.evaluating(evaluate)
    assert log.waits_for_evaluation is True
    row = log.record(1, decode="exact")
    assert log.history == [] and log.pending is row
    # the evaluation of the initial model (round 0) completes no row
    assert hook(0, "initial") == {"accuracy": 0.5, "loss": 1.25}
    assert log.history == [] and log.pending is row
    assert (row["s"], row["virtual_s"], row["unidentified"]) == (2, 2.5, [1])
    hook(1, "model-1")
    assert calls == [(0, "initial"), (1, "model-1")]
    assert log.history == [row] and (row["accuracy"], row["loss"]) == (0.5, 1.25)
    plain = RoundLog(None, NS(row_fields=lambda r: {}), NS(now=0.0), s=1)
    # no evaluate_fn: none is given to Flower (which then logs no global evaluation), and
    # rows are written as rounds end
    assert plain.evaluating(None) is None
    assert plain.waits_for_evaluation is False
    plain.record(1)
    assert len(plain.history) == 1


def test_round_metrics_are_the_rows_statistics_under_gc_beside_the_apps_own():
    from fl_gradcode.flower.records import ROW_DEFAULTS, RoundLog

    row = {**ROW_DEFAULTS, "round": 2, "s": 1, "decode": "skipped", "clients_used": [0],
           "stragglers": [1, 2], "busy": [2], "late_dropped": 3, "rejected": 1,
           "decode_error": 0.5, "virtual_s": 4.0, "wall_s": 0.25, "stopped": True,
           "epsilon": 1.5}
    got = dict(RoundLog.metrics(row, MetricRecord({"train_loss": 0.75, "gc/s": 9})).items())
    assert got == {"train_loss": 0.75, "gc/decoded": 0, "gc/exact": 0, "gc/s": 1,
                   "gc/clients_used": 1, "gc/stragglers": 2, "gc/busy": 1,
                   "gc/late_dropped": 3, "gc/rejected": 1, "gc/decode_error": 0.5,
                   "gc/virtual_s": 4.0, "gc/wall_s": 0.25, "gc/stopped": 1, "gc/epsilon": 1.5}
    approx = dict(RoundLog.metrics({**row, "decode": "approx", "epsilon": float("inf")},
                                   None).items())
    assert (approx["gc/decoded"], approx["gc/exact"]) == (1, 0) and "gc/epsilon" not in approx
    assert "train_loss" not in approx


def test_a_plain_traceback_keeps_the_quotes_of_its_exception_line():
    text = ("Traceback (most recent call last):\n  File \"a.py\", line 1, in f\n"
            "    d['k']\nKeyError: 'k'\n")
    assert split_reason(text) == ("KeyError: 'k'", text)
    quoted = 'Traceback (most recent call last):\n  x\nValueError: "v"'
    assert split_reason(quoted)[0] == 'ValueError: "v"'
