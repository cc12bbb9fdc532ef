"""Membership that survives a federation: handshake failures, identity claims, cohort sizes.

Every run uses the tiny numpy app of ``test_wrapper`` on ``InProcessGrid`` with the real mod;
expected models come from the independent numpy FedAvg oracle (``fedavg``: the app's train
handler called once per partition, no mod, no code) over the partitions of the nodes that can
take part. Faults are injected from outside the plug-in: the grid's ``crash`` (a node that
never answers), an outer mod that answers the handshake with an error, node configs that claim
another partition.
"""

from __future__ import annotations

import json
import logging
import random
import time

import numpy as np
import pytest
from flwr.app import Error, Message

from fl_gradcode.codes import make_code
from fl_gradcode.flower import gradient_coding_mod
from fl_gradcode.flower.membership import Membership, code_for_cohort
from fl_gradcode.flower.protocol import (
    OP_IDENTIFY,
    identity_reply,
    parse_instruction,
)
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


def test_a_bad_code_name_or_option_is_an_error_not_a_fallback():
    with pytest.raises(ValueError, match="unknown code 'no-such-code'"):
        code_for_cohort("no-such-code", 6, 1, 0, {})
    with pytest.raises(ValueError, match="invalid option for code 'frc'"):
        code_for_cohort("frc", 5, 1, 0, {"m": 2})


def test_a_code_object_built_for_another_size_falls_back_by_name():
    code, why = code_for_cohort(make_code("frc", n=6, s=1), 5, 1, 0, {})
    assert (code.name, code.n, code.s) == ("grouped-rs", 5, 1)
    assert "built for n=6" in why


# ================================================================== the project's ServerApp
def test_server_app_carries_on_when_a_supernode_dies_instead_of_waiting_for_it(monkeypatch,
                                                                              tmp_path):
    """server.app's job on 6 in-process nodes (frc, s=1); node 5 leaves the grid's node list
    after round 2 (a killed SuperNode once Flower stops listing it). Flower's sampling must
    not wait for it (its wait loop sleeps: a sleep here fails the test instead of hanging);
    rounds 3-4 keep the federation's six partitions, node 5's computed by its replica."""
    from flwr.serverapp.strategy import strategy_utils

    import fl_gradcode.flower.testing as testing
    from server.app import run_in_process

    def stalled(seconds):
        raise AssertionError("Flower is waiting for nodes to connect")

    monkeypatch.setattr(strategy_utils, "sleep", stalled)

    class DyingGrid(InProcessGrid):
        last_round = 0

        def push_messages(self, messages):
            messages = list(messages)
            for msg in messages:
                if msg.metadata.group_id.isdigit():
                    self.last_round = max(self.last_round, int(msg.metadata.group_id))
            return super().push_messages(messages)

        def get_node_ids(self):
            nodes = super().get_node_ids()
            return nodes[:-1] if self.last_round >= 2 else nodes

    monkeypatch.setattr(testing, "InProcessGrid", DyingGrid)
    strategy, theta = run_in_process(
        {"code": "frc", "s": 1, "num-rounds": 4, "latency": "none", "virtual-compute": "none",
         "results-dir": str(tmp_path)}, 6)
    rows = strategy.history
    assert [r["decode"] for r in rows] == ["exact"] * 4
    assert [len(r["clients_used"]) + len(r["stragglers"]) for r in rows] == [6, 6, 6, 6]
    assert [r["missing_partitions"] for r in rows] == [[]] * 4
    assert np.all(np.isfinite(theta))


# ================================================================== launchers' exit codes
FAKE_FLWR = '''#!{python}
"""A stand-in for Flower's CLI: `run` streams a log and exits {run_rc} whatever the ServerApp
did (as flwr run --stream does); `ls` reports the run's status as flwr ls --format json."""
import json, sys
with open({calls!r}, "a") as fh:
    fh.write(json.dumps(sys.argv[1:]) + "\\n")
if sys.argv[1] == "run":
    print("Successfully started run 4242")
    print("ERROR :   ServerApp raised an exception")
    sys.exit({run_rc})
if sys.argv[1] == "ls":
    print("Displaying information for run ID 4242...")
    print(json.dumps({{"success": True, "runs": [{{"run-id": "4242", "status": {status!r},
                      "status-details": "ServerApp failed with exception: boom"}}]}}))
'''

FAKE_DAEMON = '''#!{python}
import time
time.sleep(60)
'''


def fake_flower(tmp_path, monkeypatch, status: str, run_rc: int = 0):
    """Fake ``flwr``, ``flower-superlink`` and ``flower-supernode`` next to a fake
    ``sys.executable`` (where both launchers look for Flower's binaries)."""
    import stat
    import sys

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.jsonl"
    scripts = {"flwr": FAKE_FLWR.format(python=sys.executable, calls=str(calls),
                                        status=status, run_rc=run_rc),
               "flower-superlink": FAKE_DAEMON.format(python=sys.executable),
               "flower-supernode": FAKE_DAEMON.format(python=sys.executable)}
    for name, text in scripts.items():
        path = bin_dir / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python"))
    monkeypatch.setenv("FL_GRADCODE_DP_KEY_FILE", str(tmp_path / "unused-keys.json"))
    return calls


def test_deploy_local_fails_when_the_runs_left_no_rounds_to_compare(tmp_path, monkeypatch):
    """Both runs completed (as the fake SuperLink says) but wrote no rounds.jsonl: exit 1 with
    the reason, not a traceback."""
    from server import deploy_local

    calls = fake_flower(tmp_path, monkeypatch, "finished:completed", 0)
    monkeypatch.setattr(deploy_local, "wait_for_port", lambda port, timeout=60.0: None)
    assert deploy_local.run(2, "num-rounds=1", workdir=tmp_path / "work", timeout=60) == 1
    runs = [c for c in _calls(calls) if c[0] == "run"]
    assert len(runs) == 2 and "rival='fedavg'" in runs[1][runs[1].index("--run-config") + 1]


def _calls(path) -> list[list[str]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize(("status", "run_rc", "expected"), [
    ("finished:failed", 0, 1),  # the ServerApp raised: flwr run still exits 0
    ("finished:stopped", 0, 1),
    ("finished:completed", 0, 0),
    ("finished:completed", 3, 3),  # flwr run's own failure is returned as is
])
def test_deploy_local_exits_non_zero_when_the_server_app_failed(tmp_path, monkeypatch, status,
                                                                run_rc, expected):
    from server import deploy_local

    calls = fake_flower(tmp_path, monkeypatch, status, run_rc)
    monkeypatch.setattr(deploy_local, "wait_for_port", lambda port, timeout=60.0: None)
    # the coded run's exit code (the FedAvg comparison after it: --no-compare)
    code = deploy_local.run(2, "num-rounds=1", workdir=tmp_path / "work", timeout=60,
                            compare=False)
    assert code == expected
    if run_rc == 0:  # the status is read from the deployment's SuperLink connection
        assert _calls(calls)[-1] == ["ls", "deploy", "--run-id", "4242", "--format", "json"]


@pytest.mark.parametrize(("status", "expected"), [("finished:failed", 1),
                                                  ("finished:completed", 0)])
def test_launch_exits_non_zero_when_the_server_app_failed(tmp_path, monkeypatch, status,
                                                          expected):
    from server import launch

    calls = fake_flower(tmp_path, monkeypatch, status)
    code = launch.main(["--no-compare", "--home", str(tmp_path / "home"),
                        "--results-dir", str(tmp_path / "results")])
    assert code == expected
    assert _calls(calls)[-1] == ["ls", "--run-id", "4242", "--format", "json"]


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
