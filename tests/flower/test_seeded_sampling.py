"""``fl_gradcode.flower.seeded_sampling``: one seed, the same cohorts in every run.

Flower's ``FedAvg(fraction_train=0.5)`` samples with the global ``random`` module, so two runs
with one seed sample differently as soon as anything else draws from it (here: a draw between
the runs, and the nodes listed in another order). Cohorts are read from the messages the grid
is pushed (public), not from the strategy."""

from __future__ import annotations

import random

import pytest
from flwr.app import ConfigRecord, MessageType
from flwr.serverapp.strategy import FedAvg

from fl_gradcode.flower import GradientCoding, gradient_coding_mod, seeded_sampling
from fl_gradcode.flower.protocol import OP_TRAIN, parse_instruction
from fl_gradcode.flower.testing import InProcessGrid
from tests.apps.numpy_app import LR, initial_arrays, make_app

pytestmark = pytest.mark.filterwarnings("ignore:gradient_coding_mod. no partition key")

N, ROUNDS = 10, 4


class ShuffledGrid(InProcessGrid):
    """Lists its nodes in another order each time (as a SuperLink may), and records the
    train cohorts it is sent."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.cohorts: dict[int, list[int]] = {}
        self.order = random.Random(99)

    def get_node_ids(self):
        nodes = list(self.node_ids)
        self.order.shuffle(nodes)
        return nodes

    def push_messages(self, messages):
        messages = list(messages)
        train = [self.index[m.metadata.dst_node_id] for m in messages
                 if m.metadata.message_type == MessageType.TRAIN and _trains(m)]
        if train:  # one push of train messages per round
            self.cohorts[len(self.cohorts) + 1] = train
        return super().push_messages(messages)


def _trains(msg) -> bool:
    """A plain train message, or a coded one that trains (not the coding handshake)."""
    instruction = parse_instruction(msg.content)
    return instruction is None or instruction.op == OP_TRAIN


def _cohorts(strategy, mods=()):
    grid = ShuffledGrid(make_app(*mods), N)
    random.random()  # something else draws from the global random module
    strategy.start(grid=grid, initial_arrays=initial_arrays(), num_rounds=ROUNDS,
                   train_config=ConfigRecord({"lr": LR}))
    return {r: sorted(c) for r, c in grid.cohorts.items()}


def _fedavg():
    return FedAvg(fraction_train=0.5, fraction_evaluate=0.0, min_available_nodes=1,
                  min_train_nodes=1)


def test_flowers_fedavg_alone_samples_differently_run_to_run():
    random.seed(1)
    first = _cohorts(_fedavg())
    second = _cohorts(_fedavg())
    assert first != second


def test_two_runs_with_one_seed_sample_identical_cohorts():
    first = _cohorts(seeded_sampling(_fedavg(), 3))
    random.seed(12345)  # whatever the global state
    second = _cohorts(seeded_sampling(_fedavg(), 3))
    assert first == second
    assert sorted(first) == list(range(1, ROUNDS + 1))
    assert all(len(c) == N // 2 for c in first.values())
    assert len({tuple(c) for c in first.values()}) > 1  # rounds differ from each other
    assert _cohorts(seeded_sampling(_fedavg(), 4)) != first


def test_a_coded_run_samples_the_cohorts_its_seeded_rival_samples():
    """GradientCoding's inner FedAvg samples the cohort: wrapping the wrapper seeds it."""
    rival = _cohorts(seeded_sampling(_fedavg(), 5))
    coded = _cohorts(seeded_sampling(GradientCoding(_fedavg(), code="frc", s=1, seed=0,
                                                    measured_compute=False), 5),
                     mods=[gradient_coding_mod])
    assert coded == rival


def test_the_callers_random_state_is_left_alone():
    random.seed(7)
    expected = [random.random() for _ in range(3)]
    random.seed(7)
    seeded_sampling(_fedavg(), 3).configure_train(1, initial_arrays(), ConfigRecord(),
                                                  InProcessGrid(make_app(), N))
    assert [random.random() for _ in range(3)] == expected


def test_bad_seeds_and_a_second_wrapping_are_refused():
    with pytest.raises(ValueError, match=r"^seed='3': expected an integer$"):
        seeded_sampling(_fedavg(), "3")
    strategy = seeded_sampling(_fedavg(), 3)
    with pytest.raises(ValueError, match="FedAvg already samples from seed 3: wrap it once"):
        seeded_sampling(strategy, 4)


def _partition_cohorts(ids_seed, order_key):
    """The train cohorts (as partition ids) of a coded run whose nodes carry ids drawn from
    ``ids_seed`` (a deployment draws them when a SuperNode connects)."""
    ids = random.Random(ids_seed).sample(range(10**6, 10**7), N)
    grid = ShuffledGrid(make_app(gradient_coding_mod), N, node_ids=ids)
    coding = GradientCoding(_fedavg(), code="grouped-rs", s=1, seed=0, measured_compute=False)
    seeded_sampling(coding, 5, order_key=order_key)
    coding.start(grid=grid, initial_arrays=initial_arrays(), num_rounds=ROUNDS,
                 train_config=ConfigRecord({"lr": LR}))
    return {r: sorted(c) for r, c in grid.cohorts.items()}


def test_partition_order_draws_the_same_partitions_whatever_the_node_ids():
    first = _partition_cohorts(1, "partition")
    assert first == _partition_cohorts(2, "partition")
    assert sorted(first) == list(range(1, ROUNDS + 1))
    assert all(len(c) == N // 2 for c in first.values())
    # ordered by node id instead, other ids draw other partitions
    assert _partition_cohorts(1, None) != _partition_cohorts(2, None)


def test_partition_order_needs_the_coding_handshake():
    with pytest.raises(ValueError, match=r"order_key='partition'.*wrap the GradientCoding "
                                         r"strategy, not FedAvg"):
        seeded_sampling(_fedavg(), 3, order_key="partition")
