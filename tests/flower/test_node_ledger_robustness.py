"""A node's release ledger (``dp-state-file``) holds across what a deployment does to it: the
SuperLink giving the node a new ``node_id``, a disk filling up while the ledger is rewritten,
the file going away mid-round, and bad step reports from the app. Each case releases past the
node's budget, or crashes instead of refusing, on the code before the fix."""

from __future__ import annotations

import errno
import math
import os

import pytest

from fl_gradcode.flower.mod import make_gradient_coding_mod
from fl_gradcode.privacy import SAMPLE_RATE_METRIC, STEPS_METRIC
from tests.flower.test_node_dp_policy import _context, _inst, _message
from tests.flower.test_node_dp_sample_budget import SIGMA, ReportingApp, _opacus_epsilon

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
# between one and two epochs of the test app's DP-SGD on one partition (Opacus' ε)
LIMIT = (_opacus_epsilon([(SIGMA, 0.25, 4)]) + _opacus_epsilon([(SIGMA, 0.25, 8)])) / 2


def ask(mod, state, rnd, key_file, node_id=7, pids=(1,), app=None, partition=False, **node):
    """One dp='sample' round of partitions ``pids`` on a node with an ε budget; without
    ``partition`` its node config names no partition (a deployment's SuperNode)."""
    inst = _inst(round=rnd, nonce="n", dp="sample", noise_multiplier=SIGMA, clip_norm=1.0,
                 partition_ids=pids, num_partitions=(3,) * len(pids),
                 coefficients=(1.0,) * len(pids))
    ctx = _context(node_id, None, **{"dp-key-file": key_file, "dp-state-file": str(state),
                                     "dp-max-epsilon": LIMIT, **node})
    if not partition:
        for k in ("partition-id", "num-partitions"):
            ctx.node_config.pop(k)
    return mod(_message(inst, **{"local-epochs": 1}), ctx, app or ReportingApp())


def test_a_new_node_id_from_the_superlink_does_not_reset_the_budget(tmp_path, key_file):
    state, mod = tmp_path / "s.jsonl", make_gradient_coding_mod()
    assert not ask(mod, state, 1, key_file, node_id=7).has_error()
    assert ask(mod, state, 2, key_file, node_id=7).has_error()  # past the budget
    # the same node, restarted or re-registered: the SuperLink draws it another node_id
    again = ask(make_gradient_coding_mod(), state, 3, key_file, node_id=8)
    assert again.has_error() and "dp-max-epsilon" in again.error.reason


def test_a_replay_under_a_new_node_id_is_refused(tmp_path, key_file):
    state = tmp_path / "s.jsonl"
    assert not ask(make_gradient_coding_mod(), state, 1, key_file, node_id=7,
                   pids=(0,)).has_error()
    replay = ask(make_gradient_coding_mod(), state, 1, key_file, node_id=8, pids=(0,))
    assert replay.has_error() and "already answered" in replay.error.reason


def test_a_full_disk_while_accounting_keeps_the_ledger(tmp_path, key_file, monkeypatch):
    state, mod = tmp_path / "s.jsonl", make_gradient_coding_mod()
    assert not ask(mod, state, 1, key_file).has_error()  # partition 1: about half its budget
    before = state.read_text()
    real_fdopen = os.fdopen

    class Full:
        def __init__(self, f):
            self.f = f

        def __getattr__(self, k):
            return getattr(self.f, k)

        def __enter__(self):
            self.f.__enter__()
            return self

        def __exit__(self, *a):
            return self.f.__exit__(*a)

        def write(self, text):
            if text:
                raise OSError(errno.ENOSPC, "No space left on device")
            return 0

    def fdopen(fd, mode="r", *a, **k):
        handle = real_fdopen(fd, mode, *a, **k)
        return Full(handle) if "w" in mode else handle

    monkeypatch.setattr(os, "fdopen", fdopen)
    second = ask(mod, state, 2, key_file, pids=(2,))  # the disk fills up mid-rewrite
    monkeypatch.undo()
    assert second.has_error()
    assert state.read_text().startswith(before.rstrip("\n"))  # partition 1's release is kept
    third = ask(mod, state, 3, key_file)  # partition 1 again: past the budget
    assert third.has_error() and "dp-max-epsilon" in third.error.reason


def test_a_state_file_gone_mid_round_refuses_the_release(tmp_path, key_file):
    state = tmp_path / "s.jsonl"

    class Unlinking(ReportingApp):
        def __call__(self, msg, context):
            state.unlink()  # an operator or a tmp cleaner, while the app runs
            return super().__call__(msg, context)

    reply = ask(make_gradient_coding_mod(), state, 1, key_file, app=Unlinking())
    assert reply.has_error() and "cannot be accounted" in reply.error.reason


@pytest.mark.parametrize("report", [
    {SAMPLE_RATE_METRIC: 0.5, STEPS_METRIC: math.inf},
    {SAMPLE_RATE_METRIC: 0.0, STEPS_METRIC: 4},
    {SAMPLE_RATE_METRIC: 0.25, STEPS_METRIC: -4},
    {SAMPLE_RATE_METRIC: 0.25, STEPS_METRIC: math.nan},
])
def test_a_bad_step_report_is_refused_by_the_policy(tmp_path, key_file, report):
    reply = ask(make_gradient_coding_mod(), tmp_path / "s.jsonl", 1, key_file,
                app=ReportingApp(report))
    assert reply.has_error()
    assert "expected a sample rate in (0, 1] and a whole number of steps" in reply.error.reason


def test_a_symlinked_state_file_stays_the_ledger_it_links_to(tmp_path, key_file):
    """The ledger is replaced by renaming a new file over it: over a symbolic link (a path
    in an ephemeral folder linking to a persistent volume) that replaced the link, and the
    volume kept a pending line that counts for nothing."""
    target = tmp_path / "volume" / "ledger.jsonl"
    target.parent.mkdir()
    target.write_text("")
    link = tmp_path / "state.jsonl"
    link.symlink_to(target)
    assert not ask(make_gradient_coding_mod(), link, 1, key_file).has_error()
    assert link.is_symlink() and '"epsilon"' in target.read_text()
    again = ask(make_gradient_coding_mod(), link, 2, key_file)  # a restarted node
    assert again.has_error() and "dp-max-epsilon" in again.error.reason


def test_a_state_file_gone_before_its_lock_is_taken_refuses_the_release(tmp_path, key_file,
                                                                       monkeypatch):
    import fcntl

    state, real = tmp_path / "s.jsonl", fcntl.flock

    class Racing(ReportingApp):
        def __call__(self, msg, context):
            def flock(fd, op):  # accounting's lock: the file removed just as it is taken
                real(fd, op)
                if op == fcntl.LOCK_EX:
                    state.unlink(missing_ok=True)
            monkeypatch.setattr(fcntl, "flock", flock)
            return super().__call__(msg, context)

    reply = ask(make_gradient_coding_mod(), state, 1, key_file, app=Racing())
    assert reply.has_error() and "cannot be accounted" in reply.error.reason


def test_a_replay_under_a_new_node_id_is_refused_without_a_state_file(key_file):
    """A node re-registered in the same process (the SuperLink gives it a new node_id) still
    refuses a replayed (nonce, round): the memory is keyed by its partition, not the id."""
    mod = make_gradient_coding_mod()
    inst = _inst(round=1, nonce="n", dp="partition", noise_multiplier=SIGMA, clip_norm=1.0)
    node = {"dp-key-file": key_file, "partition-id": 1}
    assert not mod(_message(inst), _context(7, None, **node), ReportingApp()).has_error()
    replay = mod(_message(inst), _context(8, None, **node), ReportingApp())  # re-registered
    assert replay.has_error() and "already answered" in replay.error.reason
