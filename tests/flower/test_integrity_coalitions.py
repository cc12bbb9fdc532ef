"""``verify=True`` against coalitions of up to ``s`` nodes: never a forged model applied as
``verified``, never an honest node blamed, and training goes on when a group cannot be settled.

The attackers know everything public (the code matrix ``B``, their instructions) and collude:
they forge replies that form a consistent codeword everywhere except at one honest replica
(they solve ``B[honest \\ {victim}] u = 0`` with ``1^T u != 0``). Every applied model is compared
with an independent numpy FedAvg step over the partitions of the replies the round says it used.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg

from fl_gradcode.codes import make_code
from fl_gradcode.flower import GradientCoding, gradient_coding_mod, protocol
from fl_gradcode.flower.testing import InProcessGrid
from fl_gradcode.latency import Pareto

DIM = 24


def target(pid: int) -> np.ndarray:
    return np.random.default_rng([11, pid]).standard_normal(DIM)


def size(pid: int) -> int:
    return 10 + 3 * pid


def train(msg: Message, context) -> Message:
    """Deterministic: theta_j = theta - 0.5 (theta - target_j), n_j = 10 + 3j."""
    pid = int(context.node_config["partition-id"])
    theta = msg.content["arrays"]["w"].numpy()
    return Message(
        RecordDict({"arrays": ArrayRecord({"w": Array(theta - 0.5 * (theta - target(pid)))}),
                    "metrics": MetricRecord({"num-examples": size(pid)})}),
        reply_to=msg,
    )


def step(theta: np.ndarray, parts) -> np.ndarray:
    """One numpy FedAvg round over the data partitions ``parts`` (the oracle)."""
    parts = sorted(parts)
    sizes = np.array([size(j) for j in parts], dtype=float)
    return sizes @ np.array([theta - 0.5 * (theta - target(j)) for j in parts]) / sizes.sum()


def null_forgery(B: np.ndarray, coalition: list[int], victim: int) -> np.ndarray:
    """``u`` with ``B[h] u = 0`` for every honest row ``h`` except ``victim`` and
    ``1^T u = 1``: the coalition's rows ``B[c] u`` make the replies a consistent codeword of a
    wrong sum everywhere except at the victim (least squares on the public matrix)."""
    honest = [h for h in range(B.shape[0]) if h not in coalition and h != victim]
    A = np.vstack([B[honest], np.ones((1, B.shape[1]))])
    rhs = np.zeros(A.shape[0])
    rhs[-1] = 1.0
    u = np.linalg.lstsq(A, rhs, rcond=None)[0]
    assert np.allclose(A @ u, rhs, atol=1e-9), "no such forgery for this placement"
    return u


class World:
    """Per round: which node is which worker (each node's mod records its instruction)."""

    def __init__(self) -> None:
        self.worker_of: dict[int, int] = {}  # node id -> worker (last round seen)
        self.parts_of: dict[tuple[int, int], tuple[int, ...]] = {}  # (round, worker) -> pids
        self.client_s = 0.0  # seconds spent inside the clients (the grid runs them in turn)

    def mod(self, behave):
        def mod(msg, context, call_next):
            instruction = protocol.parse_instruction(msg.content)
            if instruction is None or instruction.op != protocol.OP_TRAIN:
                return call_next(msg, context)
            self.worker_of[context.node_id] = instruction.worker
            self.parts_of[(instruction.round, instruction.worker)] = tuple(
                instruction.partition_ids)
            start = time.perf_counter()
            try:
                return behave(msg, context, call_next, instruction)
            finally:
                self.client_s += time.perf_counter() - start
        return mod


def run(n, s, behave, rounds, world, code="frc", **options):
    apps = []
    for _ in range(n):
        app = ClientApp(mods=[world.mod(behave), gradient_coding_mod])
        app.train()(train)
        apps.append(app)
    grid = InProcessGrid(None, n, apps=apps)
    strategy = GradientCoding(FedAvg(fraction_evaluate=0.0, min_available_nodes=n), code=code,
                              s=s, latency=Pareto(1.0, 1.5), seed=0, verify=True,
                              straggler_timeout=1e6, wire="float64", **options)
    models = {}

    def evaluate_fn(server_round, arrays):
        models[server_round] = arrays["w"].numpy().copy()

    strategy.start(grid=grid, initial_arrays=ArrayRecord({"w": Array(np.zeros(DIM))}),
                   num_rounds=rounds, train_config=ConfigRecord({}), evaluate_fn=evaluate_fn)
    return strategy, models


def wrong_verified(strategy, models, world) -> list[int]:
    """Rounds applied as ``verified`` whose model is not the oracle's FedAvg step over the
    data partitions of the replies the round used."""
    wrong = []
    for row in strategy.history:
        r = row["round"]
        if row["decode"] == "skipped" or row["verified"] != "verified":
            continue
        parts = {p for w in row["clients_used"] for p in world.parts_of[(r, w)]}
        expected = step(models[r - 1], parts)
        if not np.linalg.norm(models[r] - expected) <= 1e-7 * np.linalg.norm(expected):
            wrong.append(r)
    return wrong


def punished(strategy, honest_nodes) -> set[int]:
    return {node for row in strategy.history for node in row["quarantined"]} & honest_nodes


def coalition_forger(B, coalition, victim, scale=3.0):
    """Workers in ``coalition`` add ``(B[w] u) d`` to their coded arrays (``d`` a fixed
    direction): every reply but the victim's is consistent with a sum off by ``u``."""
    u = null_forgery(B, coalition, victim)
    d = np.random.default_rng(5).standard_normal(DIM) * scale

    def behave(msg, context, call_next, instruction):
        reply = call_next(msg, context)
        if instruction.worker not in coalition or reply.has_error():
            return reply
        record = reply.content.array_records[protocol.PROTOCOL_KEY]
        name = next(iter(record.keys()))
        value = record[name].numpy().copy()
        record[name] = Array(value + float(B[instruction.worker] @ u) * d.reshape(value.shape))
        return reply

    return behave


@pytest.mark.parametrize("coalition, victim", [([0, 1], 2), ([1, 2], 0), ([3, 5], 4)])
def test_s_colluders_in_a_repetition_group_never_get_a_model_verified_nor_frame_anyone(
        coalition, victim):
    n, s, rounds = 6, 2, 6
    B = make_code("frc", n=n, s=s).B
    world = World()
    strategy, models = run(n, s, coalition_forger(B, coalition, victim), rounds, world)
    assert wrong_verified(strategy, models, world) == []
    honest = {node for node, w in world.worker_of.items() if w not in coalition}
    assert punished(strategy, honest) == set()
    rows = strategy.history
    # the other group settles every round: the forged one is left out, the round goes on
    assert all(r["decode"] == "approx" and r["verified"] == "verified" for r in rows), rows
    assert all(not set(r["clients_used"]) & set([*coalition, victim]) for r in rows)
    assert all(sorted(r["unsettled"]) == sorted([*coalition, victim]) for r in rows)


@pytest.mark.parametrize("code, n", [("crc", 6), ("grouped-rs", 7), ("nested", 7)])
def test_codes_whose_blocks_are_not_repetition_groups_are_refused_with_what_works(code, n):
    """In a cyclic or Reed-Solomon block, ``s`` colluders that share no partition solve
    ``B[honest \\ {victim}] u = 0``: the replies are a consistent codeword except at an
    honest node, and no check of the round can tell which side lies."""
    instance = make_code(code, n=n, s=2)
    assert any(len(clients) > 3 for clients, _ in instance.blocks)
    for given in (code, instance):
        with pytest.raises(ValueError) as info:
            GradientCoding(FedAvg(), code=given, s=2, verify=True)
        text = str(info.value)
        assert "repetition" in text and "'frc'" in text and "verify=False" in text


def test_a_code_instance_whose_blocks_are_repetition_groups_is_accepted():
    """Accepted with verification on, not accepted by turning it off."""
    grouped = GradientCoding(FedAvg(), code=make_code("grouped-rs", n=6, s=2), s=2,
                             verify=True)
    comm = GradientCoding(FedAvg(), code=make_code("comm-efficient", n=6, s=1, m=1), s=1,
                          verify=True, m=1)
    assert grouped.verify is True and comm.verify is True


@pytest.mark.parametrize("code", ["name", "instance"])
def test_comm_efficient_m1_with_verify_trains(code):
    """Once an ``IndexError`` in round 1 (the decoder's coefficients of a one-chunk code).
    With ``m = 1`` its groups are repetition groups, so verify=True is accepted."""
    n, s = 6, 1
    world = World()
    given = "comm-efficient" if code == "name" else make_code("comm-efficient", n=n, s=s, m=1)
    strategy, models = run(n, s, lambda m, c, nxt, i: nxt(m, c), 3, world, code=given, m=1)
    rows = strategy.history
    assert [r["decode"] for r in rows] == ["exact"] * 3
    assert all(r["verified"] == "verified" for r in rows)
    assert wrong_verified(strategy, models, world) == []


# ---------------------------------------------------------------- liveness, s = 1
def erroring(bad_worker):
    def behave(msg, context, call_next, instruction):
        if instruction.worker == bad_worker:
            raise RuntimeError("this node always fails")
        return call_next(msg, context)
    return behave


def scaling(bad_worker):
    def behave(msg, context, call_next, instruction):
        reply = call_next(msg, context)
        if instruction.worker == bad_worker and not reply.has_error():
            record = reply.content.array_records[protocol.PROTOCOL_KEY]
            for name in list(record.keys()):
                record[name] = Array(record[name].numpy() * 1.5)
        return reply
    return behave


def self_inconsistent_sizes(bad_worker):
    def behave(msg, context, call_next, instruction):
        reply = call_next(msg, context)
        if instruction.worker == bad_worker and not reply.has_error():
            meta = reply.content.metric_records[protocol.PROTOCOL_KEY + "-meta"]
            meta["partition-sizes"] = [0.0] * len(list(meta["partition-sizes"]))
        return reply
    return behave


@pytest.mark.parametrize("behaviour", [erroring, scaling, self_inconsistent_sizes])
def test_with_s1_one_bad_client_every_round_does_not_stop_training(behaviour):
    n, s, rounds, bad = 6, 1, 20, 0
    world = World()
    strategy, models = run(n, s, behaviour(bad), rounds, world)
    rows = strategy.history
    applied = [r for r in rows if r["decode"] != "skipped"]
    assert len(applied) >= 18, [(r["decode"], r["verified"]) for r in rows]
    assert wrong_verified(strategy, models, world) == []
    assert all(r["verified"] == "verified" for r in applied)
    twin = {node for node, w in world.worker_of.items() if w == 1}
    assert punished(strategy, twin) == set()  # the honest twin is never blamed
    if behaviour is not scaling:  # provable from the node's own replies: quarantined
        bad_node = {node for node, w in world.worker_of.items() if w == bad}
        assert {q for r in rows for q in r["quarantined"]} == bad_node


# ---------------------------------------------------------------- the size vote
def size_liars(liars):
    """The liars report their partitions' sizes rotated (the sum, hence num-examples and the
    arrays, unchanged: only the vote on ``partition-sizes`` can see it)."""
    def behave(msg, context, call_next, instruction):
        reply = call_next(msg, context)
        if instruction.worker in liars and not reply.has_error():
            meta = reply.content.metric_records[protocol.PROTOCOL_KEY + "-meta"]
            sizes = list(meta["partition-sizes"])
            meta["partition-sizes"] = sizes[1:] + sizes[:1]
        return reply
    return behave


@pytest.mark.parametrize("liars", [[0, 1], [1, 2], [0, 2]])
def test_two_size_liars_cannot_pick_an_honest_replica_to_blame(liars):
    n, s, rounds = 6, 2, 5
    world = World()
    strategy, models = run(n, s, size_liars(liars), rounds, world)
    honest = {node for node, w in world.worker_of.items() if w not in liars}
    assert punished(strategy, honest) == set()
    assert wrong_verified(strategy, models, world) == []
    assert all(r["decode"] != "skipped" for r in strategy.history)


# ---------------------------------------------------------------- caps
def many_metrics(count):
    def behave(msg, context, call_next, instruction):
        reply = call_next(msg, context)
        if instruction.worker == 0 and not reply.has_error():
            meta = reply.content.metric_records[protocol.PROTOCOL_KEY + "-meta"]
            for i in range(count):
                meta[f"{protocol.METRIC_PREFIX}m{i}"] = 1.0
        return reply
    return behave


def test_a_reply_with_a_million_metric_keys_is_rejected_cheaply_naming_the_cap():
    """Once ~35 us of server time per key under verify=True (36 s for this reply)."""
    world = World()
    strategy, _ = run(6, 2, many_metrics(1_000_000), 1, world)
    row = strategy.history[0]
    assert row["decode"] == "approx"  # the other group settles
    reasons = [r for r in row["rejected_reasons"] if "metric" in r]
    assert reasons and f"MAX_METRICS={protocol.MAX_METRICS}" in reasons[0], reasons
    # the in-process grid runs the clients in turn: the rest of the round is the server's
    server_s = row["wall_s"] - world.client_s
    assert server_s < 1.0, (row["wall_s"], world.client_s)


def test_a_partition_sizes_list_over_the_cap_is_rejected_naming_the_cap():
    def behave(msg, context, call_next, instruction):
        reply = call_next(msg, context)
        if instruction.worker == 0 and not reply.has_error():
            meta = reply.content.metric_records[protocol.PROTOCOL_KEY + "-meta"]
            meta["partition-sizes"] = [1.0] * (protocol.MAX_LIST + 1)
        return reply

    world = World()
    strategy, _ = run(6, 2, behave, 1, world)
    reasons = strategy.history[0]["rejected_reasons"]
    assert any(str(protocol.MAX_LIST) in r and "partition-sizes" in r for r in reasons), reasons
