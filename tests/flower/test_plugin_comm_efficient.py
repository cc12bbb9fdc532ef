"""Communication-efficient gradient coding through the plug-in: replies 1/m of the model."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg

from fl_gradcode.flower import GradientCoding, gradient_coding_mod
from fl_gradcode.flower.testing import InProcessGrid
from fl_gradcode.latency import Pareto
from tests.flower.harness import SamplingRecorder

SHAPES = {"w": (30, 20), "b": (21,)}  # 621 values: m never divides it (padding exercised)


def target(pid: int, name: str) -> np.ndarray:
    return np.random.default_rng([5, pid, len(name)]).standard_normal(SHAPES[name])


def train(msg: Message, context) -> Message:
    pid = int(context.node_config["partition-id"])
    new = {}
    for name in SHAPES:
        theta = msg.content["arrays"][name].numpy()
        new[name] = Array((theta - 0.3 * (theta - target(pid, name))).astype(np.float32))
    return Message(RecordDict({"arrays": ArrayRecord(new),
                               "metrics": MetricRecord({"num-examples": 7 + 2 * pid})}),
                   reply_to=msg)


def oracle(rounds: int, n: int) -> dict[str, np.ndarray]:
    theta = {name: np.zeros(shape) for name, shape in SHAPES.items()}
    sizes = np.array([7 + 2 * j for j in range(n)], dtype=float)
    for _ in range(rounds):
        theta = {
            name: sum(sizes[j] * (t - 0.3 * (t - target(j, name))) for j in range(n))
            / sizes.sum()
            for name, t in theta.items()
        }
    return theta


def run(code: str, s: int, n: int = 6, m: int | None = None, rounds: int = 3,
        fraction_train: float = 1.0, mods=()):
    app = ClientApp(mods=[*mods, gradient_coding_mod])
    app.train()(train)
    inner = FedAvg(fraction_train=fraction_train, fraction_evaluate=0.0, min_available_nodes=n)
    strategy = GradientCoding(inner, code=code, s=s, m=m, latency=Pareto(1.0, 1.5), seed=1)
    initial = ArrayRecord({k: Array(np.zeros(v, np.float32)) for k, v in SHAPES.items()})
    result = strategy.start(grid=InProcessGrid(app, n), initial_arrays=initial,
                            num_rounds=rounds, train_config=ConfigRecord({}))
    return strategy, {k: result.arrays[k].numpy() for k in SHAPES}


@pytest.mark.parametrize(("n", "s", "m"), [(6, 1, 2), (8, 1, 3), (6, 0, 3)])
def test_comm_efficient_decodes_the_example_weighted_average(n, s, m):
    strategy, theta = run("comm-efficient", s, n=n, m=m)
    expected = oracle(3, n)
    assert all(r["decode"] == "exact" for r in strategy.history)
    for name in SHAPES:
        err = np.linalg.norm(theta[name] - expected[name]) / np.linalg.norm(expected[name])
        assert err <= 1e-5


def test_comm_efficient_replies_are_one_mth_of_the_model():
    coded, _ = run("comm-efficient", 1, n=6, m=2, rounds=1)
    plain, _ = run("uncoded", 0, n=6, rounds=1)
    per_reply_coded = coded.history[0]["bytes_up"] / 6
    per_reply_plain = plain.history[0]["bytes_up"] / 6
    # 622 values / 2 in float32 vs 621 float32 values (+ .npy headers)
    assert per_reply_coded / per_reply_plain == pytest.approx(0.5, abs=0.08)


@pytest.mark.parametrize(("n", "s", "m"), [(7, 1, 2), (10, 2, 2)])
def test_s_plus_m_not_dividing_n_is_fedavg_over_every_clients_own_partition(n, s, m, caplog):
    """n = 7, s = 1, m = 2: groups of s + m = 3 do not tile 7 clients. The rounds are
    FedAvg over the app's own 7 partitions (not its data split 6 ways), replies stay 1/m of
    the model, and no WARNING: the code is comm-efficient with s and m, its groups owning
    their members' partitions."""
    import logging

    with caplog.at_level(logging.WARNING, logger="flwr"):
        strategy, theta = run("comm-efficient", s, n=n, m=m)
    expected = oracle(3, n)
    assert all(r["decode"] == "exact" for r in strategy.history)
    for name in SHAPES:
        err = np.linalg.norm(theta[name] - expected[name]) / np.linalg.norm(expected[name])
        assert err <= 1e-5
    code = strategy.code_for(n)
    assert (code.name, code.s, code.m, code.k) == ("comm-efficient", s, m, n)
    assert not [r for r in caplog.records if "partitions" in r.getMessage()]
    plain, _ = run("uncoded", 0, n=n, rounds=1)
    ratio = strategy.history[0]["bytes_up"] / plain.history[0]["bytes_up"]
    assert ratio <= (1 / m) * n / (n - s) + 0.08  # at most n - s short replies used


def test_a_code_object_without_one_partition_per_client_is_refused():
    from fl_gradcode.codes import make_code

    code = make_code("comm-efficient", n=7, s=1, m=2)  # k = 6: the data split 6 ways
    with pytest.raises(ValueError, match=r"code comm-efficient has k=6 partitions for n=7 "
                                         r"clients: a round codes each client's own"):
        GradientCoding(FedAvg(), code=code, s=1)
    kept = make_code("comm-efficient", n=7, s=1, m=2, own_partitions=True)
    assert GradientCoding(FedAvg(), code=kept, s=1).code_for(7) is kept


def test_a_sampled_cohort_gets_comm_efficient_on_the_members_own_partitions(caplog):
    """8 nodes, FedAvg samples 4 a round; comm-efficient s = 1, m = 2 for 4 members: one
    group of 4 owning their own partitions. Each round is FedAvg over the sampled nodes'
    own partitions, with replies 1/m of the model."""
    import logging
    import random

    random.seed(3)
    app = ClientApp(mods=[gradient_coding_mod])
    app.train()(train)
    inner = SamplingRecorder(fraction_train=0.5, fraction_evaluate=0.0, min_available_nodes=8)
    strategy = GradientCoding(inner, code="comm-efficient", s=1, m=2,
                              latency=Pareto(1.0, 1.5), seed=1)
    grid = InProcessGrid(app, 8)
    initial = ArrayRecord({k: Array(np.zeros(v, np.float32)) for k, v in SHAPES.items()})
    with caplog.at_level(logging.WARNING, logger="flwr"):
        result = strategy.start(grid=grid, initial_arrays=initial, num_rounds=3,
                                train_config=ConfigRecord({}))
    assert [r["decode"] for r in strategy.history] == ["exact"] * 3
    code = strategy.code_for(4)
    assert (code.name, code.k, code.m) == ("comm-efficient", 4, 2)
    assert not [r for r in caplog.records if "partitions" in r.getMessage()]
    assert len(inner.sampled) == 3
    assert_sampled_fedavg(result, grid, inner.sampled)


def assert_sampled_fedavg(result, grid, sampled) -> None:
    """The run's model is numpy FedAvg over each round's sampled nodes' own partitions."""
    theta = {name: np.zeros(shape) for name, shape in SHAPES.items()}
    for nodes in sampled:
        parts = [grid.index[node] for node in nodes]
        sizes = np.array([7 + 2 * j for j in parts], dtype=float)
        theta = {name: sum(sz * (th - 0.3 * (th - target(j, name)))
                           for j, sz in zip(parts, sizes, strict=True)) / sizes.sum()
                 for name, th in theta.items()}
    for name in SHAPES:
        got = result.arrays[name].numpy()
        assert np.linalg.norm(got - theta[name]) <= 1e-5 * np.linalg.norm(theta[name])


def test_a_sampled_cohort_whose_code_has_one_partition_per_member_runs():
    """The same sampling with s + m = 4 dividing the cohort: every round exact."""
    strategy, _ = run("comm-efficient", 1, n=8, m=3, fraction_train=0.5)
    assert [r["decode"] for r in strategy.history] == ["exact"] * 3


def _worker_0_shifts_its_reply(msg, context, call_next):
    """An outer mod: worker 0 adds 1000 to every value of its coded reply (the example count
    it carries inside its chunk included)."""
    from fl_gradcode.flower.protocol import OP_TRAIN, PROTOCOL_KEY, parse_instruction

    reply = call_next(msg, context)
    instruction = parse_instruction(msg.content)
    if (reply.has_error() or instruction is None or instruction.op != OP_TRAIN
            or instruction.worker != 0):
        return reply
    coded = reply.content.array_records[PROTOCOL_KEY]
    reply.content[PROTOCOL_KEY] = ArrayRecord(
        {k: Array(v.numpy() + 1000.0) for k, v in coded.items()})
    return reply


def test_a_reply_whose_decoded_count_contradicts_the_checked_sizes_is_not_exact():
    """comm-efficient carries the example count inside the chunks: a reply altered there
    decodes to a count other than the partitions' checked sizes sum to. Such a round used to
    be applied and called exact with a wrong model; it is skipped instead."""
    strategy, _ = run("comm-efficient", 1, n=6, m=2, rounds=4,
                      mods=[_worker_0_shifts_its_reply])
    rows = strategy.history
    with_0 = [r for r in rows if 0 in r["clients_used"]]
    assert with_0, "worker 0 was never used: the test checks nothing"
    assert all(r["decode"] == "skipped" for r in with_0), [(r["decode"], r["clients_used"])
                                                           for r in rows]


def test_an_approximate_round_is_fedavg_over_the_complete_groups_and_lists_the_rest():
    """n = 8, s = 2, m = 2: two groups of four clients, each owning four partitions. Three
    of group 1's members miss the 10 s deadline, so group 1 has one reply (< m). The round
    applies FedAvg over group 0's partitions (numpy reference), counts their examples, and
    lists group 1's partitions as missing; a fit of group 1's two chunks from one mixture
    used to be applied, mixing model coordinates and the example count."""
    from tests.apps.numpy_app import as_dict, fedavg, initial_arrays, num_examples
    from tests.flower.harness import FixedArrivals, run

    times = {r: [1.0] * 8 for r in range(0, 3)}
    for r in times:
        times[r][5:] = [100.0, 100.0, 100.0]
    result = run(8, code="comm-efficient", s=2, rounds=1, latency=FixedArrivals(times),
                 code_options={"m": 2}, straggler_timeout=10.0)
    row = result.rows[0]
    assert row["decode"] == "approx"
    assert row["missing_partitions"] == [4, 5, 6, 7]
    assert row["num_examples"] == pytest.approx(sum(num_examples(j) for j in range(4)))
    expected = fedavg(as_dict(initial_arrays()), range(4), 8)
    for name, value in expected.items():
        np.testing.assert_allclose(result.models[1][name], value, rtol=1e-9, atol=1e-12)
