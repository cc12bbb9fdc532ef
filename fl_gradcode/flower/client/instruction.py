"""The instruction check: what a node verifies before it computes anything for a coded
``train`` instruction (the parsed fields are checked by
:func:`~fl_gradcode.flower.protocol.parse_instruction`).

* the node's identity for the ``identify`` handshake (:func:`identify_reply`);
* a computable ``train`` job under the node's own privacy policy (:func:`node_policy`);
* a partition key for every assigned partition under a keyed dp mode
  (:func:`check_partition_keys`);
* a ``(nonce, round)`` the node has not answered, within its release budget
  (:func:`claim_round`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from flwr.app import ConfigRecord, Context, Message

from ...privacy import KEY_FILE_ENV, KEYED_MODES, NoiseKeys
from .. import protocol
from ..client_ledger import Release, ReplayGuard
from ..client_policy import NodePolicy
from ..protocol import Instruction
from .notices import Notices

__all__ = ["KEYED_MODES", "check_partition_keys", "claim_round", "identify_reply",
           "node_keys", "node_policy", "train_config_of"]

MEMORY_REPLAY_WARNING = (
    "gradient_coding_mod: this node answers keyed DP rounds or has a release budget "
    "but no node config 'dp-state-file', so the (nonce, round) pairs it answered (and "
    "its release ledger) are remembered in this process only; after a restart "
    "(and under Flower's deployment engine, which runs each message in a fresh "
    "process) a replayed round would be answered again with the same keyed noise "
    "and the budget would start afresh. Set --node-config "
    "\"dp-state-file='/path/node-state.jsonl'\" (one file per node).")


def identify_reply(msg: Message, context: Context) -> Message:
    """The ``identify`` handshake's reply: the node's ``partition-id`` / ``num-partitions``."""
    cfg = context.node_config
    if "partition-id" not in cfg or "num-partitions" not in cfg:
        raise ValueError(
            f"node config {dict(cfg)} lacks 'partition-id' / 'num-partitions' "
            "(deployment: flower-supernode --node-config "
            "\"partition-id=0 num-partitions=3\")"
        )
    return protocol.identity_reply(msg, int(cfg["partition-id"]), int(cfg["num-partitions"]))


def node_policy(msg: Message, context: Context, instruction: Instruction) -> NodePolicy:
    """The node's privacy policy, after checking that ``instruction`` is a computable
    ``train`` job asking for no less privacy than the node insists on (else ``ValueError`` /
    :class:`~fl_gradcode.flower.client_policy.PolicyError` naming the field)."""
    instruction.check_train()
    policy = NodePolicy.from_node_config(context.node_config)
    train_config = msg.content.config_records.get("config", ConfigRecord())
    policy.check(instruction, context.run_config, train_config)
    return policy


@lru_cache(maxsize=8)
def _keys_from(path: str) -> NoiseKeys:
    return NoiseKeys.from_file(path)


def node_keys(node_config: Any) -> NoiseKeys | None:
    """The node's partition keys (client-side secrets), or ``None`` if it has none."""
    path = node_config.get("dp-key-file") or os.environ.get(KEY_FILE_ENV)
    return _keys_from(str(path)) if path else None


def check_partition_keys(instruction: Instruction, keys: NoiseKeys | None) -> None:
    """dp modes whose randomness is keyed need a key for every assigned partition."""
    if instruction.dp not in KEYED_MODES:
        return
    if keys is None:
        raise ValueError(
            f"dp={instruction.dp!r} needs partition keys on the client: set node config "
            f"'dp-key-file' or {KEY_FILE_ENV} (python -m fl_gradcode.privacy keygen FILE)"
        )
    for pid in instruction.partition_ids:
        try:
            keys.key(pid)
        except ValueError as exc:
            raise ValueError(
                f"dp={instruction.dp!r}: partition-ids holds {pid} but this node's key file "
                f"has no key for it; refused (its randomness would be seeded from public "
                "values). Give the node that partition's key or do not assign it."
            ) from exc


def train_config_of(msg: Message) -> dict[str, Any]:
    """The train config the server sent with ``msg`` (its ``config`` record; empty if none)."""
    if msg.has_content() and "config" in msg.content.config_records:
        return dict(msg.content.config_records["config"])
    return {}


def claim_round(guard: ReplayGuard, context: Context, instruction: Instruction,
                policy: NodePolicy, notices: Notices,
                train_config: Mapping[str, Any] | None = None) -> bool:
    """Claim the instruction's ``(nonce, round)`` for this node, and record its release in the
    node's ledger (refused past ``policy``'s budget), if its computation is keyed (the node has
    partition keys), it keeps a ``dp-state-file`` or has a budget; False if not guarded. The
    data's cut is read from the run config with the ``train_config``'s values of the same
    keys over it: an app may take them from the server's train config (the project's does,
    and under ``run_simulation`` its run config is empty), so a server re-cutting the data
    there is seen as one re-cutting it in the run config."""
    cfg = context.node_config
    has_file = bool(cfg.get("dp-state-file"))
    if not has_file and node_keys(cfg) is None and not policy.budgeted:
        return False
    if not has_file and (instruction.dp in KEYED_MODES or policy.budgeted):
        # what a replay after a restart would break: keyed noise drawn again, a budget reset
        notices.once("memory-replay", MEMORY_REPLAY_WARNING)
    release = Release(tuple(instruction.partition_ids), instruction.dp,
                      float(instruction.noise_multiplier), tuple(instruction.num_partitions),
                      policy.data_cut({**dict(context.run_config), **(train_config or {})}))
    guard.claim(context.node_id, cfg, instruction.nonce, instruction.round, release, policy)
    return True
