"""The per-partition runs of the wrapped app: for partition ``j`` the app is called with a
Context whose node config says ``partition-id=j`` (and the partition's ``num-partitions``),
a fresh empty ``context.state``, after seeding Python's, numpy's and (once imported) torch's
RNGs so that every replica of ``j`` computes the same update; its reply is checked (one
ArrayRecord shaped as the global model, the example count under ``weight-key``).

torch is seeded only once the process has imported it (a numpy app never pays torch's
import); if the app imports torch during a call, that call is run again with torch seeded.
"""

from __future__ import annotations

import time
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Context, Message, RecordDict

from ...privacy import NoiseKeys
from .. import protocol
from ..binding import partition_nonce
from ..client_policy import NodePolicy
from ..protocol import Instruction
from .instruction import KEYED_MODES
from .notices import Notices
from .seeding import imported_torch, partition_seed, rng_states, seed_everything, set_rng_states

__all__ = ["PartitionResult", "PartitionRuns", "array_values", "single_record"]

PUBLIC_SEED_WARNING = (
    "gradient_coding_mod: no partition key on this node, so the seed of each "
    "partition's computation is a function of public values (run seed, round, "
    "partition); noise drawn inside the app (e.g. Opacus DP-SGD) is reproducible "
    "by the server. Give nodes a key file (python -m fl_gradcode.privacy keygen) "
    "for secret, per-run randomness.")

STATE_WARNING = (
    "gradient_coding_mod: the app wrote context.state during a coded train call; "
    "those writes are discarded (each partition call gets a fresh, empty state, "
    "because every replica of a partition must compute identically, whichever node "
    "it runs on and whatever that node computed before). Keep state the app needs "
    "across rounds in the messages (the model / config records) or in the run "
    "config, or derive it from the round and partition.")


@dataclass
class PartitionResult:
    """What the app returned for one partition (before the DP release)."""

    arrays: dict[str, np.ndarray]  # theta_j as the app sent it (read-only views of its reply)
    num_examples: float
    metrics: dict[str, float | list[float]]  # the app's numbers and lists of numbers
    compute_s: float

    def delta(self, theta: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``theta_j - theta`` in float64 (full-size arrays: the DP release needs them)."""
        return {name: np.subtract(self.arrays[name], theta[name], dtype=np.float64)
                for name in theta}


def array_values(arr: Any) -> np.ndarray:
    """An Array's values without copying its bytes (Flower's ``numpy()`` for other
    serializations)."""
    try:
        return protocol.array_view(arr)
    except protocol.RejectedReply:
        return arr.numpy()


def single_record(records: dict, preferred: str, what: str) -> Any:
    """The record named ``preferred``, or the only one."""
    if preferred in records:
        return records[preferred]
    if len(records) == 1:
        return next(iter(records.values()))
    raise ValueError(f"the app's reply has {len(records)} {what}s and none named {preferred!r}")


def _app_view(content: RecordDict, instruction: Instruction, policy: NodePolicy,
              run_config: Any) -> RecordDict:
    """What the app receives: the content without the protocol record; under a node policy
    that governs the app (a DP requirement or a budget), its ``config`` record (and
    ``run_config``, in place) hold the instruction's checked ``dp``, ``noise-multiplier``
    and ``clip-norm`` (:meth:`NodePolicy.app_view`)."""
    view = protocol.app_content(content)
    if policy.governs_app:
        config = view["config"] if "config" in view.config_records else ConfigRecord()
        config = ConfigRecord(dict(config))
        policy.app_view(instruction, config, run_config)
        view["config"] = config
    return view


def _state_written(ctx: Context) -> bool:
    try:
        return len(ctx.state) > 0
    except TypeError:
        return True  # the app replaced the state with something else


class PartitionRuns:
    """The app's runs for one instruction's partitions (``index``: the position in
    ``partition-ids``). ``cache`` (in-process simulations only): replicas of a partition in
    the same process share its computed result, one round at a time."""

    def __init__(self, msg: Message, context: Context,
                 call_next: Callable[[Message, Context], Message], instruction: Instruction,
                 theta: dict[str, np.ndarray], keys: NoiseKeys | None, policy: NodePolicy,
                 cache: MutableMapping[Any, PartitionResult] | None, notices: Notices) -> None:
        self.msg, self.context, self.call_next = msg, context, call_next
        self.instruction, self.theta, self.keys = instruction, theta, keys
        self.policy, self.cache, self.notices = policy, cache, notices

    def result(self, index: int) -> PartitionResult:
        """Partition ``index``'s result: cached, or computed (and cached)."""
        instruction, cache = self.instruction, self.cache
        if cache is None:
            return self.run(index)
        key: tuple = (instruction.partition_ids[index], instruction.num_partitions[index])
        if self.policy.governs_app:  # computed from the node's own view of the config: not shared
            key += ("policy",)
        if cache.get("round") != (instruction.nonce, instruction.round):
            cache.clear()  # one round's updates at a time
            cache["round"] = (instruction.nonce, instruction.round)
        result = cache.get(key)
        if result is None:
            result = cache[key] = self.run(index)
        return result

    def seed(self, pid: int, num: int) -> int:
        """The seed of partition ``pid`` (of ``num``)'s run: keyed by the node's key for it,
        else public (warned once)."""
        key = None
        if self.keys is not None:
            try:
                key = self.keys.key(pid)
            except ValueError:
                if self.instruction.dp in KEYED_MODES:  # checked up front too: never public
                    raise
        if key is None:
            self.notices.once("public-seed", PUBLIC_SEED_WARNING)
        instruction = self.instruction
        return partition_seed(instruction.seed, instruction.round, pid, key,
                              partition_nonce(instruction.nonce, num))

    def run(self, index: int) -> PartitionResult:
        """Call the app on partition ``index`` (seeded; run again if it imported torch)."""
        instruction, context, msg = self.instruction, self.context, self.msg
        pid, num = instruction.partition_ids[index], instruction.num_partitions[index]
        seed = self.seed(pid, num)
        node_config = {**dict(context.node_config), "partition-id": pid, "num-partitions": num}
        run_config = dict(context.run_config) if self.policy.governs_app else context.run_config
        ctx = Context(
            run_id=context.run_id,
            node_id=context.node_id,
            node_config=node_config,
            state=RecordDict(),  # per-node state would differ between replicas
            run_config=run_config,
        )
        torch = imported_torch()
        saved = rng_states()
        original = msg.content
        try:
            for _ in range(2):
                t0 = time.perf_counter()
                seed_everything(seed)
                msg.content = _app_view(original, instruction, self.policy, ctx.run_config)
                reply = self.call_next(msg, ctx)
                compute_s = time.perf_counter() - t0
                if torch is not None or imported_torch() is None:
                    break
                # the app imported torch during this call: its torch RNG was not seeded, so a
                # replica in another process could differ; run it again with torch seeded (and
                # leave torch's RNG afterwards as the app's import left it)
                torch = imported_torch()
                saved = (*saved[:2], torch.get_rng_state())
        finally:
            msg.content = original
            set_rng_states(saved)
        if _state_written(ctx):
            self.notices.once("state", STATE_WARNING)
        return self.checked(reply, pid, compute_s)

    def checked(self, reply: Message, pid: int, compute_s: float) -> PartitionResult:
        """The app's reply for partition ``pid`` as a result, or an error naming what is
        wrong with it."""
        instruction, theta = self.instruction, self.theta
        if reply.has_error():
            raise RuntimeError(
                f"the app failed on partition {pid}: code {reply.error.code}: "
                f"{reply.error.reason}"
            )
        arrays = single_record(dict(reply.content.array_records), "arrays", "ArrayRecord")
        metrics = single_record(dict(reply.content.metric_records), "metrics", "MetricRecord")
        if instruction.weight_key not in metrics:
            raise ValueError(
                f"the app's train reply for partition {pid} lacks the metric "
                f"{instruction.weight_key!r} (the number of examples it trained on)"
            )
        num_examples = float(metrics[instruction.weight_key])
        if set(arrays.keys()) != set(theta):
            raise ValueError(
                f"the app returned arrays {sorted(arrays.keys())} for partition {pid}; the "
                f"global model has {sorted(theta)}"
            )
        values = {name: array_values(arrays[name]) for name in theta}
        for name, value in values.items():
            if value.shape != theta[name].shape:
                raise ValueError(
                    f"the app returned array {name!r} of shape {value.shape} for partition "
                    f"{pid}; the global model's is {theta[name].shape}"
                )
        return PartitionResult(values, num_examples, _numeric_metrics(metrics,
                                                                      instruction.weight_key),
                               compute_s)


def _numeric_metrics(metrics: Any, weight_key: str) -> dict[str, float | list[float]]:
    """The app's train metrics but the weight: numbers as floats, lists of numbers (a
    ``MetricRecord`` holds both) as lists of floats; anything else is left out. (Not
    ``option_values.number``: that module imports the codes, which a node never loads.)"""
    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    out: dict[str, float | list[float]] = {}
    for k, v in metrics.items():
        if k == weight_key:
            continue
        if number(v):
            out[k] = float(v)
        elif isinstance(v, list) and v and all(number(x) for x in v):
            out[k] = [float(x) for x in v]
    return out
