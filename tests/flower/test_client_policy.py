"""The node's replay memory (ReplayGuard) and its dp-state-file, unit by unit."""

from __future__ import annotations

import json
import stat

import pytest

from fl_gradcode.flower.client_policy import PolicyError, ReplayGuard


def _line(node: str, nonce: str, rnd: int) -> str:
    return json.dumps({"node": node, "nonce": nonce, "round": rnd}, sort_keys=True) + "\n"


# ======== edges: exact values, bounds and messages ===============================================
def test_a_claim_appends_one_sorted_line_to_a_private_state_file_in_new_folders(tmp_path):
    state = tmp_path / "a" / "b" / "state.jsonl"
    guard = ReplayGuard()
    guard.claim(7, {"dp-state-file": str(state)}, "n1", 3)
    guard.claim(7, {"dp-state-file": str(state), "partition-id": 2, "num-partitions": 4},
                "n1", 4)
    # a node config without a partition: the file's owner, never the SuperLink's node_id
    assert state.read_text() == _line("node", "n1", 3) + _line("partition=2/4", "n1", 4)
    assert stat.S_IMODE(state.stat().st_mode) == 0o600


def test_a_claim_recorded_in_the_file_is_refused_by_a_fresh_guard_naming_the_file(tmp_path):
    state = tmp_path / "state.jsonl"
    cfg = {"dp-state-file": str(state)}
    ReplayGuard().claim(7, cfg, "n1", 3)
    with pytest.raises(PolicyError) as info:
        ReplayGuard().claim(7, cfg, "n1", 3)
    assert str(info.value).endswith(f"(recorded in dp-state-file {state})")
    assert "round=3 with nonce='n1' was already answered by this node" in str(info.value)
    with pytest.raises(PolicyError):  # the same node under another node_id (re-registered)
        ReplayGuard().claim(8, cfg, "n1", 3)
    # a file written with node_id labels: its lines are the owner's all the same
    state.write_text(_line("node=5", "n2", 1))
    with pytest.raises(PolicyError):
        ReplayGuard().claim(8, cfg, "n2", 1)
    # a partition's entries are its own
    ReplayGuard().claim(8, {**cfg, "partition-id": 1, "num-partitions": 2}, "n1", 3)


def test_release_removes_exactly_its_entry_from_the_file_and_the_memory(tmp_path):
    state = tmp_path / "state.jsonl"
    cfg = {"dp-state-file": str(state)}
    guard = ReplayGuard()
    guard.claim(7, cfg, "n1", 3)
    guard.claim(7, cfg, "n1", 4)
    part = {**cfg, "partition-id": 1, "num-partitions": 2}
    guard.claim(9, part, "n1", 3)
    guard.release(7, cfg, "n1", 3)
    assert state.read_text() == _line("node", "n1", 4) + _line("partition=1/2", "n1", 3)
    ReplayGuard().claim(7, cfg, "n1", 3)  # a fresh process may ask the released round again
    guard.release(7, cfg, "n1", 3)
    guard.claim(7, cfg, "n1", 3)  # and so may this guard, whose memory forgot it


def test_release_of_a_partition_label_and_without_a_file_yet(tmp_path):
    state = tmp_path / "state.jsonl"
    cfg = {"dp-state-file": str(state), "partition-id": 1, "num-partitions": 2}
    guard = ReplayGuard()
    guard.release(5, cfg, "n", 1)  # nothing claimed, no file: nothing to do
    assert not state.exists()
    guard.claim(5, cfg, "n", 1)
    guard.release(5, cfg, "n", 1)
    assert state.read_text() == ""


def _asks(dp: str, sigma: float = 0.0):
    from fl_gradcode.flower.protocol import Instruction

    return Instruction(op="train", round=1, dp=dp, noise_multiplier=sigma)


def test_only_dp_sample_reads_the_run_configs_sigma_and_its_floor_is_inclusive():
    from fl_gradcode.flower.client_policy import NodePolicy

    policy = NodePolicy(dp_required="none", min_noise_multiplier=1.0)
    low_app = {"noise-multiplier": 0.1}
    policy.check(_asks("partition", 2.0), low_app)  # the app's DP-SGD sigma is not used
    NodePolicy(dp_required="central", min_noise_multiplier=1.0).check(
        _asks("central", 1.0), low_app)  # central: only where the node requires it
    policy.check(_asks("sample", 1.0), {"noise-multiplier": 1.0})  # at the floor: accepted
    policy.check(_asks("sample", 1.0), {"noise-multiplier": "1.5"})
    policy.check(_asks("sample", 1.0), {})  # no app sigma: the instruction's is checked
    with pytest.raises(PolicyError) as info:
        policy.check(_asks("sample", 1.0), {"noise-multiplier": "lots"})
    assert str(info.value) == ("run config noise-multiplier='lots' (the app's DP-SGD noise) "
                               "refused: this node's policy is dp-min-noise-multiplier=1")
    with pytest.raises(PolicyError, match=r"^run config noise-multiplier=None "):
        policy.check(_asks("sample", 1.0), {"noise-multiplier": None})


def test_an_empty_or_absent_dp_required_means_none():
    from fl_gradcode.flower.client_policy import NodePolicy

    for cfg in ({"dp-required": ""}, {"dp-required": None}, {}):
        policy = NodePolicy.from_node_config(cfg)
        assert policy == NodePolicy("none", 0.0) and not policy.active


def test_a_replay_is_refused_with_the_whole_reason():
    guard = ReplayGuard()
    guard.claim(3, {}, "abc", 2)
    with pytest.raises(PolicyError) as info:
        guard.claim(3, {}, "abc", 2)
    assert str(info.value) == (
        "round=2 with nonce='abc' was already answered by this node: a second instruction for "
        "an answered (nonce, round) is refused, whatever it asks (its keyed noise would "
        "repeat)")


def test_release_rewrites_the_entries_it_keeps_in_the_files_sorted_form(tmp_path):
    state = tmp_path / "state.jsonl"
    state.write_text('{"round": 9, "nonce": "z", "node": "node=1"}\n')  # written by hand
    cfg = {"dp-state-file": str(state)}
    guard = ReplayGuard()
    guard.claim(2, cfg, "n", 1)
    guard.release(2, cfg, "n", 1)
    assert state.read_text() == _line("node=1", "z", 9)
