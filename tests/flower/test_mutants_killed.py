"""Tests written to kill mutants that survived the fast suite (``experiments/mutation.py``).

One behaviour per test, named for it. Expected values come from an independent reference (a
numpy least-squares solve, a hand-built matrix, hand-computed clock times, chance level of the
dataset, a recording fake grid), never from the code path under test.
"""

from __future__ import annotations

import itertools
import uuid

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, MessageType, RecordDict

from fl_gradcode.codes import make_code
from fl_gradcode.codes.repetition import frc_matrix
from fl_gradcode.flower import protocol
from fl_gradcode.flower.clock import VirtualClock
from fl_gradcode.flower.grid import EarlyReturnGrid
from fl_gradcode.flower.testing import set_task_identity


# ============================================================================ codes
def _weighted_error(w: np.ndarray, alpha: np.ndarray) -> float:
    return float(np.sum((w * (alpha - 1.0)) ** 2) / np.sum(w**2))


def test_approximate_decoding_is_weighted_least_squares_not_plain_least_squares():
    """Weighted expander code, n=6, one straggler: the decoder minimises ``||w (B_F^T a - 1)||``.

    Reference: numpy's lstsq on the row-scaled system ``diag(w) B_F^T a = w``. Plain least
    squares (``B_F^T a = 1``) gives a visibly larger weighted error (0.0562 vs 0.00965)."""
    w = np.arange(1.0, 7.0)
    code = make_code("expander", n=6, s=1, seed=0, weights=w)
    got = (0, 1, 2, 3, 4)
    BF = code.B[list(got)]
    a_ref, *_ = np.linalg.lstsq((BF * w).T, w, rcond=None)
    err_ref = _weighted_error(w, a_ref @ BF)
    a_plain, *_ = np.linalg.lstsq(BF.T, np.ones(6), rcond=None)
    err_plain = _weighted_error(w, a_plain @ BF)
    assert err_plain > 2 * err_ref  # the case tells the two decoders apart

    dec = code.decoding(got)
    assert dec.error == pytest.approx(err_ref, rel=1e-9)
    np.testing.assert_allclose(dec.alpha, a_ref @ BF, atol=1e-12)
    assert code.decoding_error(got) == pytest.approx(err_ref, rel=1e-9)


def test_frc_groups_are_consecutive_clients_sharing_consecutive_partitions():
    """Tandon et al. Sec. 3: client ``i`` holds partitions ``d*(i//d) .. d*(i//d)+d-1``
    (``d = s+1``), all with coefficient 1. Reference: the matrix built entry by entry."""
    for n, s in [(6, 1), (6, 2), (12, 3)]:
        d = s + 1
        expected = np.array(
            [[1.0 if i // d == j // d else 0.0 for j in range(n)] for i in range(n)]
        )
        np.testing.assert_array_equal(frc_matrix(n, s), expected)
        np.testing.assert_array_equal(make_code("frc", n=n, s=s).B, expected)


# ============================================================================ clock
def test_virtual_clock_keeps_a_client_that_never_replied_busy_until_the_deadline():
    """Hand-computed: round starts at t=0, deadline 10 s, round ends at 3 s. Node 1 replied at
    2 s (free at 3), node 2 answered with an error (free at the round end), node 3 never
    answered: busy until 10 s, free again after that."""
    clock = VirtualClock(straggler_timeout=10.0)
    clock.start_round()
    clock.finish_round([1, 2, 3], {1: 2.0}, end=3.0, answered=[2])
    assert clock.now == 3.0
    assert clock.busy([1, 2, 3]) == {3}
    assert clock.busy_until == {1: 2.0, 2: 3.0, 3: 10.0}
    clock.wait_for_any_free([3])
    assert clock.now == 10.0
    assert clock.busy([1, 2, 3]) == set()


# ============================================================================ late replies
def _train_message(node: int, server_round: int) -> Message:
    content = RecordDict({protocol.PROTOCOL_KEY: ConfigRecord({"op": protocol.OP_TRAIN})})
    return Message(content, dst_node_id=node, message_type=MessageType.TRAIN,
                   group_id=str(server_round))


class _SilentNodeGrid:
    """Accepts every message; replies of nodes in ``silent`` are held back until ``release``."""

    def __init__(self, silent: set[int]) -> None:
        self.silent = silent
        self.held: dict[str, Message] = {}
        self.ready: dict[str, Message] = {}

    def push_messages(self, messages):
        ids = []
        for msg in messages:
            mid = str(uuid.uuid4())
            msg.metadata.__dict__["_message_id"] = mid
            reply = Message(RecordDict(), reply_to=msg)
            reply.metadata.__dict__["_src_node_id"] = msg.metadata.dst_node_id
            reply.metadata.__dict__["_message_id"] = str(uuid.uuid4())
            (self.held if msg.metadata.dst_node_id in self.silent else self.ready)[mid] = reply
            ids.append(mid)
        return ids

    def release(self, node: int) -> None:
        for mid, reply in list(self.held.items()):
            if reply.metadata.src_node_id == node:
                self.ready[mid] = self.held.pop(mid)

    def pull_messages(self, ids):
        return [self.ready.pop(mid) for mid in list(ids) if mid in self.ready]


class _RecordingOwner:
    """The strategy side of the grid: records what it is handed, never ready early."""

    def __init__(self) -> None:
        self.current: list[tuple[int, str]] = []
        self.late: list[tuple[int, str]] = []

    def on_reply(self, reply):
        self.current.append((reply.metadata.src_node_id, reply.metadata.group_id))

    def on_late_reply(self, reply):
        self.late.append((reply.metadata.src_node_id, reply.metadata.group_id))

    def ready(self):
        return False

    def deadline_s(self, timeout):
        return 0.05

    def first_reply_deadline_s(self):
        return None

    def on_unsent(self, messages):
        raise AssertionError("every message is accepted")


def test_late_reply_to_an_earlier_round_is_never_handed_to_the_current_round():
    """Round 1: node 3 does not answer before the deadline (busy). Round 2 (nodes 1, 2): its
    round-1 reply arrives meanwhile; the grid hands it to ``on_late_reply`` only, never to
    ``on_reply``, and returns only the round-2 replies."""
    set_task_identity()  # Flower's Message() needs a run id, as inside a ServerApp
    inner = _SilentNodeGrid(silent={3})
    owner = _RecordingOwner()
    grid = EarlyReturnGrid(inner, owner, poll_interval=0.001)

    replies = grid.send_and_receive([_train_message(n, 1) for n in (1, 2, 3)])
    assert sorted(r.metadata.src_node_id for r in replies) == [1, 2]
    assert grid.busy_nodes() == {3}

    inner.release(3)  # the round-1 reply of node 3 is now pullable
    replies = grid.send_and_receive([_train_message(n, 2) for n in (1, 2)])

    assert sorted((r.metadata.src_node_id, r.metadata.group_id) for r in replies) == [
        (1, "2"), (2, "2")]
    assert sorted(owner.current) == [(1, "1"), (1, "2"), (2, "1"), (2, "2")]
    assert owner.late == [(3, "1")]
    assert grid.busy_nodes() == set()


# ============================================================================ our ClientApp
@pytest.mark.filterwarnings("ignore:gradient_coding_mod. no partition key:UserWarning")
def test_local_update_training_of_our_client_app_learns_digits(tmp_path):
    """``update=local``: the client applies its SGD delta ``theta + delta``. Five coded rounds on
    the 10-class digits must go well above chance (0.1) with the evaluation loss falling."""
    from server.app import run_in_process

    cfg = {"update": "local", "num-rounds": 5, "latency": "none", "code": "grouped-rs", "s": 1,
           "results-dir": str(tmp_path)}
    strategy, theta = run_in_process(cfg, 4)
    rows = strategy.history
    assert len(rows) == 5
    assert np.all(np.isfinite(theta))
    losses = [r["loss"] for r in rows]
    assert rows[-1]["accuracy"] > 0.6  # chance on 10 balanced classes is 0.1
    assert losses[-1] < losses[0]
    assert all(b <= a * 1.05 for a, b in itertools.pairwise(losses))
