"""Integrity against an adaptive client: secret dense probes, overflow, any cohort size,
refusals, quarantine, verified metrics.

Every model a round applies is compared with an independent numpy FedAvg step (``step``)."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg
from hypothesis import given, settings
from hypothesis import strategies as st

from fl_gradcode.codes import make_code
from fl_gradcode.flower import GradientCoding, gradient_coding_mod, protocol
from fl_gradcode.flower.integrity import Probe, verify_replies
from fl_gradcode.flower.testing import InProcessGrid
from fl_gradcode.latency import Pareto
from fl_gradcode.results import read_rounds


@functools.lru_cache(maxsize=64)
def target(pid: int, dim: int) -> np.ndarray:
    return np.random.default_rng([11, pid]).standard_normal(dim)


def size(pid: int) -> int:
    return 10 + 3 * pid


def train(msg: Message, context) -> Message:
    """Deterministic: theta_j = theta - 0.5 (theta - target_j), n_j = 10 + 3j, loss_j = j."""
    pid = int(context.node_config["partition-id"])
    theta = msg.content["arrays"]["w"].numpy()
    new = theta - 0.5 * (theta - target(pid, theta.size))
    return Message(
        RecordDict({"arrays": ArrayRecord({"w": Array(new)}),
                    "metrics": MetricRecord({"num-examples": size(pid), "loss": float(pid)})}),
        reply_to=msg,
    )


def step(theta: np.ndarray, parts) -> np.ndarray:
    """One plain numpy FedAvg round over ``parts`` (independent of the mod and the wrapper)."""
    sizes = np.array([size(j) for j in parts], dtype=float)
    models = np.array([theta - 0.5 * (theta - target(j, theta.size)) for j in parts])
    return sizes @ models / sizes.sum()


def forging(bad: int, forge):
    """An outer mod (outside gradient_coding_mod): the node with ``bad`` rewrites its coded
    reply with ``forge(arrays, meta, instruction)``, knowing everything the server sent."""

    def mod(msg, context, call_next):
        instruction = protocol.parse_instruction(msg.content)
        reply = call_next(msg, context)
        if int(context.node_config["partition-id"]) != bad or reply.has_error():
            return reply
        record = reply.content.array_records.get(protocol.PROTOCOL_KEY)
        if record is None or instruction is None or instruction.op != protocol.OP_TRAIN:
            return reply
        arrays = {name: record[name].numpy().copy() for name in record.keys()}
        meta = reply.content.metric_records[protocol.PROTOCOL_KEY + "-meta"]
        forge(arrays, meta, instruction)
        for name, value in arrays.items():
            record[name] = Array(value)
        return reply

    return mod


def run(*, n=6, s=2, code="frc", rounds=3, dim=40, bad=None, forge=None, verify=True,
        seed=0, **options):
    apps = []
    for pid in range(n):
        mods = [forging(bad, forge), gradient_coding_mod] if pid == bad else [
            gradient_coding_mod]
        app = ClientApp(mods=mods)
        app.train()(train)
        apps.append(app)
    grid = InProcessGrid(None, n, apps=apps)
    strategy = GradientCoding(FedAvg(fraction_evaluate=0.0, min_available_nodes=n), code=code,
                              s=s, latency=Pareto(1.0, 1.5), seed=seed, verify=verify,
                              straggler_timeout=1e6, wire="float64", **options)
    models = {}

    def evaluate_fn(server_round, arrays):
        models[server_round] = arrays["w"].numpy().copy()

    strategy.start(grid=grid, initial_arrays=ArrayRecord({"w": Array(np.zeros(dim))}),
                   num_rounds=rounds, train_config=ConfigRecord({}), evaluate_fn=evaluate_fn)
    return strategy, models


def used_partitions(row):
    """The data partitions of the clients a round used (its row's ``partitions``)."""
    return sorted(set(row["partitions"]["used"]))


def wrong_rounds(strategy, models, n, parts_of=None):
    """Rounds whose applied model differs from the oracle (skipped: the model must not move)."""
    wrong = []
    for row in strategy.history:
        r = row["round"]
        prev, got = models[r - 1], models[r]
        if row["decode"] == "skipped":
            expected = prev
        else:
            expected = step(prev, parts_of(row) if parts_of else range(n))
        if not np.linalg.norm(got - expected) <= 1e-7 * max(np.linalg.norm(expected), 1e-12):
            wrong.append(r)
    return wrong


# ---------------------------------------------------------------- forgers
def old_probe_coordinates(instruction, layout) -> dict[str, np.ndarray]:
    """The coordinates the previous probe recipe sampled: seeded from (run seed, round), 2048
    coordinates split over the arrays. Everything in it is public to a client."""
    rng = np.random.default_rng([instruction.seed, instruction.round, 0x5EED])
    per_array = max(64, 2048 // max(1, len(layout)))
    out = {}
    for name, shape in layout.items():
        total = int(np.prod(shape))
        out[name] = np.sort(rng.choice(total, size=min(total, per_array), replace=False))
        rng.standard_normal((4, min(total, per_array)))  # the recipe's weights, same stream
    return out


def unprobed_forgery(arrays, meta, instruction):
    """Perturb only coordinates the old probe did not look at."""
    sampled = old_probe_coordinates(instruction, {k: v.shape for k, v in arrays.items()})
    for name, value in arrays.items():
        free = np.setdiff1d(np.arange(value.size), sampled[name])[:50]
        value.reshape(-1)[free] += 10.0 * (1.0 + np.abs(value).max())


def test_a_forger_that_rebuilds_the_old_probe_is_caught():
    n, rounds, dim = 6, 3, 200_000
    strategy, models = run(n=n, s=2, dim=dim, rounds=rounds, bad=0, forge=unprobed_forgery)
    assert wrong_rounds(strategy, models, n, parts_of=used_partitions) == []
    # caught: its group is left out (2 agreeing replicas could be 2 colluders: none blamed)
    assert all(row["decode"] == "approx" for row in strategy.history)
    assert all(0 not in row["clients_used"] for row in strategy.history)
    assert all(0 in row["unsettled"] for row in strategy.history)


def blind_sparse_forgery(arrays, meta, instruction):
    rng = np.random.default_rng([99, instruction.round])
    for value in arrays.values():
        flat = value.reshape(-1)
        idx = rng.choice(flat.size, size=3, replace=False)
        flat[idx] *= 10.0


def test_a_blind_sparse_forger_never_gets_a_wrong_model_applied_over_20_rounds():
    n, rounds, dim = 6, 20, 200_000
    strategy, models = run(n=n, s=2, dim=dim, rounds=rounds, bad=0, forge=blind_sparse_forgery)
    assert wrong_rounds(strategy, models, n, parts_of=used_partitions) == []
    assert all(row["decode"] == "approx" for row in strategy.history)
    assert all(row["verified"] == "verified" for row in strategy.history)


def huge(arrays, meta, instruction):
    for value in arrays.values():
        value *= 1e160


@pytest.mark.parametrize("s", [1, 2])
def test_a_reply_times_1e160_is_never_agreement(s):
    n = 6
    strategy, models = run(n=n, s=s, rounds=3, bad=1, forge=huge)
    # its group is left out every round, the others decode (nobody quarantined)
    assert wrong_rounds(strategy, models, n, parts_of=used_partitions) == []
    rows = strategy.history
    assert all(1 not in row["clients_used"] and 1 in row["unsettled"] for row in rows)
    assert rows[0]["disagreement"] > 0.1  # measured as a contradiction, not NaN
    assert all(row["decode"] == "approx" and row["quarantined"] == [] for row in rows)


def test_verify_works_for_cohorts_over_200():
    n = 204  # FRC s = 2: 68 groups of 3
    strategy, models = run(n=n, s=2, rounds=2, bad=7, forge=lambda a, m, i: a["w"].__imul__(1.5))
    assert wrong_rounds(strategy, models, n, parts_of=used_partitions) == []
    assert all(row["verified"] == "verified" for row in strategy.history)
    assert strategy.history[0]["unsettled"] == [6, 7, 8]


def scaled_metrics(arrays, meta, instruction):
    meta[protocol.METRIC_PREFIX + "loss"] = 1.5 * float(meta[protocol.METRIC_PREFIX + "loss"])


def test_forged_train_metrics_are_caught():
    """Only the coded metric is forged (the arrays are honest): the projection covers it."""
    strategy, models = run(n=6, s=2, rounds=2, bad=4, forge=scaled_metrics)
    assert [row["unsettled"] for row in strategy.history] == [[3, 4, 5], [3, 4, 5]]
    assert wrong_rounds(strategy, models, 6, parts_of=used_partitions) == []


# ---------------------------------------------------------------- refusals
@pytest.mark.parametrize("code, s, options, match", [
    ("comm-efficient", 1, {}, "comm-efficient"),
    ("comm-efficient", 1, {"m": 3}, "m > 1"),
    ("frc", 0, {}, "redundancy"),
    ("uncoded", 1, {}, "redundancy"),
    ("ignore-stragglers", 1, {}, "redundancy"),
    ("bgc", 1, {}, "exact code"),
])
def test_verify_refuses_codes_it_cannot_check(code, s, options, match):
    with pytest.raises(ValueError, match=match):
        GradientCoding(FedAvg(), code=code, s=s, verify=True, code_options=options)
    GradientCoding(FedAvg(), code=code, s=s, verify=False, code_options=options)  # fine


def test_verify_refuses_a_code_object_without_redundancy():
    with pytest.raises(ValueError, match="redundancy"):
        GradientCoding(FedAvg(), code=make_code("frc", n=4, s=0), verify=True)


# ---------------------------------------------------------------- quarantine
def scale(arrays, meta, instruction):
    for value in arrays.values():
        value *= 1.5


def test_a_contradicted_pair_is_left_out_and_nobody_is_quarantined_with_s1(tmp_path):
    """s = 1: the faulty node and its replica contradict each other and nothing tells them
    apart. Before, both were quarantined (the honest twin too) after two skipped rounds; now
    neither is blamed and every round decodes from the other groups (FedAvg over their
    partitions) from round 1."""
    n, rounds = 6, 7
    strategy, models = run(n=n, s=1, rounds=rounds, bad=0, forge=scale,
                           results_dir=str(tmp_path))
    rows = read_rounds(str(tmp_path))
    assert all(row["decode"] == "approx" for row in rows)
    assert [row["quarantined"] for row in rows] == [[]] * rounds
    assert all(sorted(row["unsettled"]) == [0, 1] for row in rows)
    assert wrong_rounds(strategy, models, n, parts_of=lambda row: range(2, n)) == []


def test_quarantine_doubles_on_repeat():
    from fl_gradcode.flower.quarantine import Quarantine

    q = Quarantine(offences=2, window=10, rounds=5)
    assert q.offend(1, [7], "x") == []
    assert q.offend(2, [7], "x") == [7]
    assert q.held(3, [7, 8]) == {7} and q.held(7, [7]) == {7} and q.held(8, [7]) == set()
    q.offend(8, [7], "x")
    assert q.offend(9, [7], "x") == [7]
    assert q.held(19, [7]) == {7} and q.held(20, [7]) == set()  # 10 rounds the second time
    with pytest.raises(ValueError, match="rounds=0"):
        Quarantine(rounds=0)


# ---------------------------------------------------------------- the probe
def test_secret_probes_are_fresh_and_never_change_a_decoded_value():
    layout = {"w": (50,)}
    x = {"w": np.arange(50.0)}
    assert not np.allclose(Probe(layout, sample=None)(x, 1.0), Probe(layout, sample=None)(x, 1.0))
    a, models_a = run(rounds=2, seed=3)
    _, models_b = run(rounds=2, seed=3)
    assert all(np.array_equal(models_a[r], models_b[r]) for r in models_a)
    assert [r["verified"] for r in a.history] == ["verified", "verified"]


SMALL_CODES = [("frc", 6, 2), ("frc", 4, 1), ("crc", 5, 2), ("grouped-rs", 6, 2)]


@settings(max_examples=25, deadline=None)
@given(
    which=st.integers(0, len(SMALL_CODES) - 1),
    worker=st.integers(0, 5),
    coordinate=st.integers(0, 29),
    magnitude=st.floats(1e-3, 1e6),
    sign=st.sampled_from([-1.0, 1.0]),
    seed=st.integers(0, 2**16),
)
def test_a_single_coordinate_change_is_detected(which, worker, coordinate, magnitude, sign,
                                                seed):
    """Any one coordinate of any checked reply changed by at least 1e-3 of the replies' size
    (100x the tolerance): the reply is excluded or the set is contradicted, never verified."""
    name, n, s = SMALL_CODES[which]
    code = make_code(name, n=n, s=s, seed=seed)
    worker %= n
    v = np.random.default_rng(seed).standard_normal((code.k, 30))
    replies = {i: {"w": code.B[i] @ v} for i in range(n)}
    probe = Probe({"w": (30,)}, sample=None, q=16)
    counts = {i: float(code.B[i].sum()) for i in range(n)}  # linear too: one example each
    sizes = {i: probe.size(r, counts[i]) for i, r in replies.items()}
    honest = {i: probe(r, counts[i]) for i, r in replies.items()}
    assert verify_replies(code, honest, range(n), 1e-5, sizes).status == "verified"
    forged = replies[worker]["w"].copy()
    forged[coordinate] += sign * magnitude * np.median(list(sizes.values()))
    z = dict(honest)
    z[worker] = probe({"w": forged}, counts[worker])
    verdict = verify_replies(code, z, range(n), 1e-5, sizes)
    assert verdict.status == "contradicted" or worker in verdict.excluded


def test_round_probe_per_code():
    """verify=True: dense secret probes; a round with s=0 (s="auto" may choose it) has none;
    a code verify cannot check refuses; verify=False keeps the cheap sampled probe."""
    from fl_gradcode.flower.integrity import round_probe

    layout = {"w": (10,)}
    dense = round_probe(make_code("frc", n=4, s=1), layout, True, {})
    assert dense is not None and dense.dense and dense.metrics
    assert round_probe(make_code("frc", n=4, s=0), layout, True, {}) is None
    with pytest.raises(ValueError, match="m > 1"):
        round_probe(make_code("comm-efficient", n=6, s=1), layout, True, {})
    sampled = round_probe(make_code("frc", n=4, s=1), layout, False, {})
    assert sampled is not None and not sampled.dense
    assert round_probe(make_code("comm-efficient", n=6, s=1), layout, False, {}) is None
