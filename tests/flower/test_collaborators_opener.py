"""GradientCoding's round opener, dispatcher and workload on their own: who is sent work (busy
and excluded members, a round with every member busy), the model's layout and arrays record,
the train instruction (nonce, partitions, weight key, DP noise), and the workload's partitions
and loads."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from flwr.serverapp.strategy import FedAvg

from fl_gradcode.codes import make_code
from fl_gradcode.flower import GradientCoding
from fl_gradcode.flower.clock import VirtualClock
from fl_gradcode.flower.deadline_policy import DeadlinePolicy
from fl_gradcode.flower.options import DeadlineOptions
from fl_gradcode.flower.protocol import Identity
from fl_gradcode.flower.quarantine import Quarantine
from tests.flower.collaborators_support import make_plan, make_verifier


# =============================================================================== opener
def test_the_round_opener_sends_nothing_to_busy_members_it_does_not_queue():
    strategy = GradientCoding(FedAvg(), code="frc", s=1, seed=0)  # busy="skip"
    cohort = [10, 11, 12, 13]
    strategy.clock.busy_until[11] = 5.0  # busy until t=5 (virtual)
    code, idle, queued, held = strategy.opener.plan(1, None, cohort)
    assert code.n == 4 and idle == {11} and queued == set() and held == set()


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
        workload=Workload(identities, {}, None, 0), verifier=make_verifier(),
        wire_for=lambda code: "float64", code_options={}, round_timeout=1.0)
    content = RecordDict({"arrays": ArrayRecord({"w": Array(np.zeros(3))})})
    opened = opener.open(1, None, cohort, content)
    assert opened.idle == {12} and opened.queued == frozenset()
    assert opened.plan.excluded == (2,) and opened.plan.busy == ()


def frc_opener(cohort: list[int]):
    """A RoundOpener of an frc code over a 4-node cohort with default deadlines."""
    from fl_gradcode.flower.opener import RoundOpener
    from fl_gradcode.flower.workload import Workload

    return RoundOpener(
        policy=_ExcludingPolicy(make_code("frc", 4, 1)), clock=VirtualClock(10.0),
        deadlines=DeadlinePolicy(DeadlineOptions(), False), quarantine=Quarantine(),
        workload=Workload({node: Identity(j, 4) for j, node in enumerate(cohort)}, {}, None, 0),
        verifier=make_verifier(), wire_for=lambda code: "float64", code_options={},
        round_timeout=1.0)


def test_the_opened_round_records_the_models_layout():
    from flwr.app import Array, ArrayRecord, RecordDict

    cohort = [10, 11, 12, 13]
    opener = frc_opener(cohort)
    content = RecordDict({"arrays": ArrayRecord({"w": Array(np.zeros((2, 3))),
                                                 "b": Array(np.zeros(3))})})
    state = opener.open(1, None, cohort, content).plan
    assert state.layout == {"w": (2, 3), "b": (3,)}


def test_the_opener_reads_the_arrays_record_by_default_among_several():
    from flwr.app import Array, ArrayRecord, RecordDict

    cohort = [10, 11, 12, 13]
    opener = frc_opener(cohort)
    content = RecordDict({"extra": ArrayRecord({"v": Array(np.zeros(2))}),
                          "arrays": ArrayRecord({"w": Array(np.zeros(3))})})
    state = opener.open(1, None, cohort, content).plan
    assert state.array_key == "arrays" and state.layout == {"w": (3,)}


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
        verifier=make_verifier(), wire_for=lambda code: "float64", code_options={},
        round_timeout=1.0)
    _, idle, queued, held = opener.plan(1, None, cohort)
    assert clock.now == 3.0
    assert policy.asked == [({10, 11, 12, 13}, cohort), ({10, 12, 13}, cohort)]
    assert (idle, queued, held) == ({10, 12, 13}, set(), set())


# =============================================================================== dispatch
def _frc_dispatch(seed: int, nonce: str):
    """An open FRC(4, 1) round on nodes 10-13 and a Dispatcher without DP or partition sizes."""
    from fl_gradcode.flower.dispatch import Dispatcher
    from fl_gradcode.flower.workload import Workload
    from fl_gradcode.privacy import DPConfig

    plan = make_plan(make_code("frc", 4, 1), [10, 11, 12, 13])
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


def test_a_train_instruction_carries_the_runs_nonce_and_the_workers_partitions():
    from flwr.app import RecordDict

    from fl_gradcode.flower import protocol

    plan, dispatcher = _frc_dispatch(seed=3, nonce="run-nonce")
    inst = protocol.parse_instruction(dispatcher.message(plan, 2, 12, RecordDict()).content)
    assert inst.nonce == "run-nonce" and inst.seed == 3 and inst.worker == 2
    assert inst.partition_ids == (2, 3) and inst.num_partitions == (4, 4)  # FRC group {2, 3}


def test_a_train_instruction_carries_the_dp_noise_multiplier():
    from flwr.app import RecordDict

    from fl_gradcode.flower import protocol
    from fl_gradcode.flower.dispatch import Dispatcher
    from fl_gradcode.flower.workload import Workload
    from fl_gradcode.privacy import DPConfig

    plan = make_plan(make_code("frc", 4, 1), [10, 11, 12, 13])
    dispatcher = Dispatcher(seed=0, nonce="n",
                            dp=DPConfig(mode="partition", clip_norm=2.0, noise_multiplier=0.75),
                            clock=VirtualClock(10.0), workload=Workload({}, {}, None, 0),
                            inner=object())
    inst = protocol.parse_instruction(dispatcher.message(plan, 1, 11, RecordDict()).content)
    assert (inst.dp, inst.clip_norm, inst.noise_multiplier) == ("partition", 2.0, 0.75)


# =============================================================================== workload
@pytest.mark.parametrize("of", [4, 8])
def test_a_code_without_one_partition_per_member_is_refused_by_the_workload(of):
    """Nodes 10-13 hold partitions 0-3 of ``of``: a code with k = 2 partitions would be the
    data split 2 ways, not the members' own (the wrapper's policy never plans one; a custom
    policy that does is refused, whether the cohort is every node or a sample)."""
    from fl_gradcode.flower.workload import Workload

    workload = Workload({10 + j: Identity(j, of) for j in range(4)}, {}, None, 0)
    with pytest.raises(ValueError, match=r"code small has k=2 partitions for a cohort of 4 "
                                         r"clients: a round codes the members' own"):
        workload.partitions(SimpleNamespace(k=2, name="small"), [10, 11, 12, 13])
    assert workload.partitions(SimpleNamespace(k=4, name="four"), [12, 10, 11, 13]) == [
        Identity(2, of), Identity(0, of), Identity(1, of), Identity(3, of)]


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
