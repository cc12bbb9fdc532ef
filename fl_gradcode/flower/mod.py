"""``gradient_coding_mod``: a Flower client mod that turns an ordinary ClientApp into a worker.

For a coded ``train`` message the mod calls the wrapped app once per assigned data partition
``j``, with a Context whose node config says ``partition-id=j`` (and the partition's
``num-partitions``), after seeding Python's ``random``, numpy's global RNG and torch's RNG so that
every replica of ``j`` computes the same update (torch only once the process has imported it: a
numpy app never pays torch's import; if the app imports torch during a call, that call is run
again with torch seeded, once per process). It then sends ONE reply: the combination
``sum_j B[i,j] n_j (theta_j - theta)`` of the example-weighted model deltas, ``sum_j B[i,j] n_j``
and the example-weighted scalar metrics. Evaluate and query messages, and train messages
without the protocol record, pass through untouched.

Stopping late work: an instruction with ``stop-after-s > 0`` (the server's ``stop_late_work``)
is abandoned once that many seconds have passed since the message was created (its round's
deadline: the server has closed the round and cannot use the reply). The mod checks before each
partition, after the last one and before the simulated latency (a partition already running is
never cut short), and replies with a short error (code ``MOD_STOPPED_CODE``) that frees the
node for the next round. It compares its own wall clock with the message's creation time, as
Flower's message TTL does: clocks must agree to well within the deadline.

Seeding: without a partition key the seed is a function of ``(run seed, round, j)`` only, so
two runs with the same seed are identical (that is how a coded run is compared with an uncoded
one); noise drawn inside the app (e.g. Opacus DP-SGD) is then reproducible from public values,
and the mod warns once. With a partition key (node config ``dp-key-file`` or the environment
variable ``FL_GRADCODE_DP_KEY_FILE``), the seed is ``HMAC(key_j, nonce, round, j)``: secret to
the server and fresh in every run; the nonce is bound to the instruction's DP parameters, the
app's config and the received arrays (:func:`~fl_gradcode.flower.binding.bound_nonce`), so
replicas share keyed noise only when they compute from identical inputs.

Validation: every instruction field is checked before anything is computed
(:func:`~fl_gradcode.flower.protocol.parse_instruction`: types, allowed sets, finite values,
partition ids unique and in ``[0, num-partitions)``, at most 1024 partitions per instruction,
``num-partitions <= 100000``, ``0 <= delay-s <= 3600``; a train instruction needs
``round >= 1`` and ``worker >= 0``); a bad field gets an error reply (``MOD_ERROR_CODE``)
naming it.

The node's own privacy (:mod:`~fl_gradcode.flower.client_policy`): node config
``dp-required`` and ``dp-min-noise-multiplier`` refuse an instruction asking for less privacy
than the node insists on, and under them the app receives the instruction's checked ``dp``,
``noise-multiplier`` and ``clip-norm`` in its ``config`` record and run config (under
``dp='sample'`` a server config asking the app for less is refused); a train instruction whose
``(nonce, round)`` the node has already answered is refused when the node has partition keys,
a ``dp-state-file`` (remembered there across restarts, with the node's release ledger) or a
release budget (``dp-max-releases``, ``dp-max-epsilon``: refused once spent).
``dp='partition'`` and ``dp='sample'`` refuse a partition the node's key file has no key for.
Under ``dp='partition'`` and ``dp='central'`` the app's scalar metrics are
withheld (the reply carries none: un-noised per-partition values would undo the release); the
example counts ``n_j`` (``partition-sizes`` and ``num-examples``) are still sent, as FedAvg
sends them, because decoding needs ``sum_j B[i,j] n_j``.

The app gets a fresh, empty ``context.state`` in every coded call (replicas must compute
identically); an app that writes it gets a warning once per process.

References:
    Tandon, Lei, Dimakis, Karampatziakis, "Gradient Coding: Avoiding Stragglers in Distributed
    Learning", ICML 2017, https://arxiv.org/abs/1612.03301.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import sys
import time
import warnings
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Context, Error, Message, MessageType, RecordDict

from ..privacy import KEY_FILE_ENV, DPConfig, NoiseKeys, make_mechanism, noise_seed
from . import mod_order, partition_metrics, protocol
from .binding import bound_nonce
from .client_policy import NodePolicy, Release, ReplayGuard
from .encoding import accumulate_delta, coded_update
from .protocol import Instruction
from .records import error_reason

__all__ = ["accumulate_delta", "bound_nonce", "gradient_coding_mod", "make_gradient_coding_mod",
           "partition_seed", "rng_states", "set_rng_states"]

#: Error code of the mod's own error replies (Flower's ClientApp exception code is 0).
MOD_ERROR_CODE = 5400
#: Error code of a reply whose work stopped at its round's deadline (``stop-after-s``).
MOD_STOPPED_CODE = protocol.STOPPED_CODE

_now = time.time  # wall clock compared with the message's creation time (Flower's own TTL clock)


class _Stopped(Exception):
    """The round's deadline passed: the server can no longer use this worker's reply."""

_warned_public_seed = False
_warned_state = False
_warned_memory_replay = False


def partition_seed(
    seed: int, server_round: int, partition: int, key: bytes | None = None, nonce: str = ""
) -> int:
    """The 63-bit seed of partition ``partition``'s computation in ``server_round``.

    Without ``key``: a hash of ``(seed, round, partition)`` (public, reproducible). With the
    partition's key: ``HMAC-SHA256(key, nonce, round, partition)`` (secret, fresh per run).
    """
    if key is not None:
        return noise_seed(key, server_round, partition, purpose="app-rng", nonce=nonce) >> 1
    tag = f"fl-gradcode;seed={int(seed)};round={int(server_round)};partition={int(partition)}"
    return int.from_bytes(hashlib.sha256(tag.encode()).digest()[:8], "little") >> 1


def _torch() -> Any:
    """torch if this process has imported it (the app did), else ``None``."""
    return sys.modules.get("torch")


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's global and (if imported) torch's RNGs: what the mod does before
    each partition's training, and the deadline baseline before each client's."""
    random.seed(seed)
    np.random.seed(seed % 2**32)  # noqa: NPY002 - the app may draw from numpy's global RNG
    torch = _torch()
    if torch is not None:
        _seed_torch(torch, seed)


def _seed_torch(torch: Any, seed: int) -> None:
    """``torch.manual_seed(seed)``. Without an accelerator only the CPU generator exists, and
    it alone is seeded: ``torch.manual_seed`` would also register deferred seeding of every
    absent device, formatting a stack trace for each (a third of a millisecond per partition
    on a quiet machine, milliseconds on a loaded one)."""
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and not accelerator.is_available():
        torch.default_generator.manual_seed(int(seed))
    else:
        torch.manual_seed(seed)


def rng_states() -> tuple[Any, Any, Any]:
    """Python's, numpy's global and (if imported) torch's RNG states, for
    :func:`set_rng_states`."""
    torch = _torch()
    return (random.getstate(), np.random.get_state(),  # noqa: NPY002
            None if torch is None else torch.get_rng_state())


def set_rng_states(states: tuple[Any, Any, Any]) -> None:
    """Restore what :func:`rng_states` saved (torch's only if it was imported then)."""
    random.setstate(states[0])
    np.random.set_state(states[1])  # noqa: NPY002
    torch = _torch()
    if states[2] is not None and torch is not None:
        torch.set_rng_state(states[2])


@lru_cache(maxsize=8)
def _keys_from(path: str) -> NoiseKeys:
    return NoiseKeys.from_file(path)


def node_keys(node_config: Any) -> NoiseKeys | None:
    """The node's partition keys (client-side secrets), or ``None`` if it has none."""
    import os

    path = node_config.get("dp-key-file") or os.environ.get(KEY_FILE_ENV)
    return _keys_from(str(path)) if path else None


def _warn_if_state_written(ctx: Context) -> None:
    """Warn once per process if the app wrote ``context.state`` during a coded call."""
    global _warned_state
    try:
        written = len(ctx.state) > 0
    except TypeError:
        written = True  # the app replaced the state with something else
    if written and not _warned_state:
        _warned_state = True
        warnings.warn(
            "gradient_coding_mod: the app wrote context.state during a coded train call; "
            "those writes are discarded (each partition call gets a fresh, empty state, "
            "because every replica of a partition must compute identically, whichever node "
            "it runs on and whatever that node computed before). Keep state the app needs "
            "across rounds in the messages (the model / config records) or in the run "
            "config, or derive it from the round and partition.",
            stacklevel=3,
        )


def _check_partition_keys(instruction: Instruction, keys: NoiseKeys | None) -> None:
    """dp modes whose randomness is keyed need a key for every assigned partition."""
    if instruction.dp not in _KEYED_MODES:
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


#: dp modes whose client-side randomness must come from partition keys.
_KEYED_MODES = ("partition", "sample")


@dataclass
class PartitionResult:
    """What the app returned for one partition (before the DP release)."""

    arrays: dict[str, np.ndarray]  # theta_j as the app sent it (read-only views of its reply)
    num_examples: float
    metrics: dict[str, float]
    compute_s: float

    def delta(self, theta: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``theta_j - theta`` in float64 (full-size arrays: the DP release needs them)."""
        return {name: np.subtract(self.arrays[name], theta[name], dtype=np.float64)
                for name in theta}


def _view(arr: Any) -> np.ndarray:
    """An Array's values without copying its bytes (Flower's ``numpy()`` for other
    serializations)."""
    try:
        return protocol.array_view(arr)
    except protocol.RejectedReply:
        return arr.numpy()


def _single(records: dict, preferred: str, what: str) -> Any:
    if preferred in records:
        return records[preferred]
    if len(records) == 1:
        return next(iter(records.values()))
    raise ValueError(f"the app's reply has {len(records)} {what}s and none named {preferred!r}")


def _run_partition(
    msg: Message,
    context: Context,
    call_next: Callable[[Message, Context], Message],
    instruction: Instruction,
    index: int,
    theta: dict[str, np.ndarray],
    keys: NoiseKeys | None,
    policy: NodePolicy,
) -> PartitionResult:
    pid, num = instruction.partition_ids[index], instruction.num_partitions[index]
    key = None
    if keys is not None:
        try:
            key = keys.key(pid)
        except ValueError:
            if instruction.dp in _KEYED_MODES:  # checked up front too; never public seeds here
                raise
            key = None
    if key is None:
        global _warned_public_seed
        if not _warned_public_seed:
            _warned_public_seed = True
            warnings.warn(
                "gradient_coding_mod: no partition key on this node, so the seed of each "
                "partition's computation is a function of public values (run seed, round, "
                "partition); noise drawn inside the app (e.g. Opacus DP-SGD) is reproducible "
                "by the server. Give nodes a key file (python -m fl_gradcode.privacy keygen) "
                "for secret, per-run randomness.",
                stacklevel=2,
            )
    seed = partition_seed(instruction.seed, instruction.round, pid, key, instruction.nonce)
    node_config = {**dict(context.node_config), "partition-id": pid, "num-partitions": num}
    run_config = dict(context.run_config) if policy.active else context.run_config
    ctx = Context(
        run_id=context.run_id,
        node_id=context.node_id,
        node_config=node_config,
        state=RecordDict(),  # per-node state would differ between replicas
        run_config=run_config,
    )
    torch = _torch()
    saved = rng_states()
    original = msg.content
    try:
        for _ in range(2):
            t0 = time.perf_counter()
            seed_everything(seed)
            msg.content = _app_view(original, instruction, policy, ctx.run_config)
            reply = call_next(msg, ctx)
            compute_s = time.perf_counter() - t0
            if torch is not None or _torch() is None:
                break
            # the app imported torch during this call: its torch RNG was not seeded, so a
            # replica in another process could differ; run it again with torch seeded (and
            # leave torch's RNG afterwards as the app's import left it)
            torch = _torch()
            saved = (*saved[:2], torch.get_rng_state())
    finally:
        msg.content = original
        set_rng_states(saved)
    _warn_if_state_written(ctx)
    if reply.has_error():
        raise RuntimeError(
            f"the app failed on partition {pid}: code {reply.error.code}: {reply.error.reason}"
        )
    arrays = _single(dict(reply.content.array_records), "arrays", "ArrayRecord")
    metrics = _single(dict(reply.content.metric_records), "metrics", "MetricRecord")
    if instruction.weight_key not in metrics:
        raise ValueError(
            f"the app's train reply for partition {pid} lacks the metric "
            f"{instruction.weight_key!r} (the number of examples it trained on)"
        )
    num_examples = float(metrics[instruction.weight_key])
    if set(arrays.keys()) != set(theta):
        raise ValueError(
            f"the app returned arrays {sorted(arrays.keys())} for partition {pid}; the global "
            f"model has {sorted(theta)}"
        )
    values = {name: _view(arrays[name]) for name in theta}
    for name, value in values.items():
        if value.shape != theta[name].shape:
            raise ValueError(
                f"the app returned array {name!r} of shape {value.shape} for partition {pid}; "
                f"the global model's is {theta[name].shape}"
            )
    scalars = {
        k: float(v)
        for k, v in metrics.items()
        if k != instruction.weight_key and isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    return PartitionResult(values, num_examples, scalars, compute_s)


def _app_view(content: RecordDict, instruction: Instruction, policy: NodePolicy,
              run_config: Any) -> RecordDict:
    """What the app receives: the content without the protocol record; under an active node
    policy, its ``config`` record (and ``run_config``, in place) hold the instruction's checked
    ``dp``, ``noise-multiplier`` and ``clip-norm`` (:meth:`NodePolicy.app_view`)."""
    view = protocol.app_content(content)
    if policy.active:
        config = view["config"] if "config" in view.config_records else ConfigRecord()
        config = ConfigRecord(dict(config))
        policy.app_view(instruction, config, run_config)
        view["config"] = config
    return view


def _coded_reply(
    msg: Message,
    context: Context,
    call_next: Callable[[Message, Context], Message],
    instruction: Instruction,
    cache: MutableMapping[Any, PartitionResult] | None,
    policy: NodePolicy,
) -> Message:
    content = protocol.app_content(msg.content)
    global_arrays = _single(dict(content.array_records), "arrays", "ArrayRecord")
    theta = {name: _view(arr) for name, arr in global_arrays.items()}  # no copy
    mechanism = make_mechanism(
        DPConfig(
            mode=instruction.dp,
            clip_norm=instruction.clip_norm,
            noise_multiplier=instruction.noise_multiplier,
            noise=instruction.dp_noise,
        )
    )
    keys = node_keys(context.node_config)
    _check_partition_keys(instruction, keys)
    if keys is not None:  # keyed seeds: bind them to what this node was asked to compute
        instruction = dataclasses.replace(
            instruction, nonce=bound_nonce(instruction, content)
        )
    released = mechanism.mode in ("partition", "central")  # each delta released on its own
    coded = {name: np.zeros(v.shape) for name, v in theta.items()} if released else {}
    weights: list[float] = []  # otherwise: summed at the end, every block once (float64)
    models: list[dict[str, np.ndarray]] = []
    count, compute_s = 0.0, 0.0
    sizes: list[float] = []
    metric_sums: dict[str, float] | None = None
    own_metrics: list[dict[str, float]] = []  # each partition's own, in order
    names = list(theta)
    stop_at = None
    if instruction.stop_after_s > 0:  # checked between partitions (one is never cut short)
        stop_at = float(msg.metadata.created_at) + instruction.stop_after_s
    total = len(instruction.partition_ids)
    for index, (pid, coef) in enumerate(
        zip(instruction.partition_ids, instruction.coefficients, strict=True)
    ):
        if stop_at is not None and _now() >= stop_at:
            raise _Stopped(f"stopped after {index} of {total} partitions: the round's deadline "
                           f"(stop-after-s={instruction.stop_after_s:g} s after the message "
                           "was created) has passed")
        cache_key: tuple = (pid, instruction.num_partitions[index])
        if policy.active:  # computed from the node's own view of the config: not shared
            cache_key += ("policy",)
        if cache is not None and cache.get("round") != (instruction.nonce, instruction.round):
            cache.clear()  # one round's updates at a time
            cache["round"] = (instruction.nonce, instruction.round)
        result = None if cache is None else cache.get(cache_key)
        if result is None:
            result = _run_partition(msg, context, call_next, instruction, index, theta, keys,
                                    policy)
            if cache is not None:
                cache[cache_key] = result
        # every replica is charged its own computation (a cached result costs what it cost)
        compute_s += result.compute_s
        weight = coef * result.num_examples
        if released:
            delta = result.delta(theta)
            flat = np.concatenate([delta[name].reshape(-1) for name in names])
            flat = mechanism.release(
                flat,
                keys=keys,
                partition=pid,
                server_round=instruction.round,
                nonce=instruction.nonce,
                worker=instruction.worker,
            )
            delta, start = {}, 0
            for name in names:
                size = theta[name].size
                delta[name] = flat[start : start + size].reshape(theta[name].shape)
                start += size
            for name in names:
                coded[name] += weight * delta[name]
        else:  # read-only views of the app's reply: no copy until the coded sum
            weights.append(weight)
            models.append(result.arrays)
        count += weight
        sizes.append(result.num_examples)
        own_metrics.append(result.metrics)
        if metric_sums is None:
            metric_sums = {k: 0.0 for k in result.metrics}
        for k in list(metric_sums):
            if k in result.metrics:
                metric_sums[k] += weight * result.metrics[k]
            else:
                del metric_sums[k]
        # drop this partition's reply (Flower's Message holds reference cycles); without a
        # per-partition release its arrays' bytes stay referenced by ``models`` until the sum
        result = delta = None
    if stop_at is not None and _now() >= stop_at:  # the last partition ended too late
        raise _Stopped(f"stopped after {total} of {total} partitions, before replying: the "
                       f"round's deadline (stop-after-s={instruction.stop_after_s:g} s) passed "
                       "during the last one")
    if instruction.timing == "wallclock" and instruction.delay_s > 0:
        if stop_at is not None and _now() + instruction.delay_s > stop_at:
            time.sleep(max(stop_at - _now(), 0.0))  # the simulated latency outlasts the round
            raise _Stopped(f"stopped after {total} of {total} partitions, before replying: the "
                           f"round's deadline (stop-after-s={instruction.stop_after_s:g} s) "
                           "passed during the simulated latency")
        time.sleep(instruction.delay_s)
    wire = None
    if instruction.wire == "model" and not instruction.chunk_coefficients:
        # the server found the model's dtype accurate enough: float arrays sent in it
        wire = {name: theta[name].dtype for name in names if theta[name].dtype.kind == "f"}
    if not released:
        coded = coded_update(weights, models, theta, wire)
    models.clear()
    if instruction.chunk_coefficients:  # communication-efficient: 1/m of the model
        chunk = _chunked(coded, count, instruction)
        if instruction.wire == "model" and all(
            arr.dtype == "float32" for arr in global_arrays.values()
        ):
            chunk = chunk.astype(np.float32)
        reply = protocol.train_reply(
            msg, instruction, {protocol.CHUNK_KEY: chunk}, count, sizes, {}, compute_s
        )
    else:
        withheld = mechanism.mode in _WITHHELD_METRICS
        reply = protocol.train_reply(msg, instruction, coded, count, sizes,
                                     {} if withheld else metric_sums or {}, compute_s,
                                     dtypes=wire)
    if mechanism.mode in _WITHHELD_METRICS:
        return reply  # un-noised (per-partition) metrics would undo the DP release
    return partition_metrics.attach(reply, own_metrics)  # for the inner metric aggregation


#: dp modes under which the app's scalar metrics are withheld (not sent).
_WITHHELD_METRICS = ("partition", "central")


def _chunked(coded: dict[str, np.ndarray], count: float, instruction: Instruction) -> np.ndarray:
    """``sum_u Gamma[u, t] chunk_u`` of ``[flattened arrays..., count]`` zero-padded to ``m L``
    (Ye and Abbe 2018; Kadhe, Koyluoglu and Ramchandran 2020)."""
    gamma = np.asarray(instruction.chunk_coefficients, dtype=np.float64)
    m = gamma.size
    flat = np.concatenate([*(v.reshape(-1) for v in coded.values()), [count]])
    length = -(-flat.size // m)
    padded = np.zeros(m * length)
    padded[: flat.size] = flat
    return gamma @ padded.reshape(m, length)


def _claim_round(guard: ReplayGuard, context: Context, instruction: Instruction,
                 policy: NodePolicy) -> bool:
    """Claim the instruction's ``(nonce, round)`` for this node, and record its release in the
    node's ledger (refused past ``policy``'s budget), if its computation is keyed (the node has
    partition keys), it keeps a ``dp-state-file`` or has a budget; False if not guarded."""
    cfg = context.node_config
    has_file = bool(cfg.get("dp-state-file"))
    if not has_file and node_keys(cfg) is None and not policy.budgeted:
        return False
    if not has_file:
        global _warned_memory_replay
        if not _warned_memory_replay:
            _warned_memory_replay = True
            warnings.warn(
                "gradient_coding_mod: this node has partition keys or a release budget but "
                "no node config 'dp-state-file', so the (nonce, round) pairs it answered (and "
                "its release ledger) are remembered in this process only; after a restart "
                "(and under Flower's deployment engine, which runs each message in a fresh "
                "process) a replayed round would be answered again with the same keyed noise "
                "and the budget would start afresh. Set --node-config "
                "\"dp-state-file='/path/node-state.jsonl'\" (one file per node).",
                stacklevel=3,
            )
    release = Release(tuple(instruction.partition_ids), instruction.dp,
                      float(instruction.noise_multiplier))
    guard.claim(context.node_id, cfg, instruction.nonce, instruction.round, release, policy)
    return True


def make_gradient_coding_mod(
    cache: MutableMapping[Any, PartitionResult] | None = None,
) -> Callable[[Message, Context, Callable[[Message, Context], Message]], Message]:
    """A gradient-coding client mod.

    ``cache`` (in-process simulations only): replicas of a partition in the same process
    share its computed update, which they would compute bit-identically anyway; each replica
    still reports the measured compute time of that computation as its own.
    """

    guard = ReplayGuard()

    def gradient_coding_mod(
        msg: Message, context: Context, call_next: Callable[[Message, Context], Message]
    ) -> Message:
        if msg.metadata.message_type != MessageType.TRAIN or not msg.has_content():
            return call_next(msg, context)
        try:
            instruction = protocol.parse_instruction(msg.content)
        except Exception as exc:
            error = Error(MOD_ERROR_CODE, f"bad gradient-coding record: {exc}")
            return Message(error, reply_to=msg)
        if instruction is None:
            return call_next(msg, context)
        try:
            if instruction.op == protocol.OP_IDENTIFY:
                cfg = context.node_config
                if "partition-id" not in cfg or "num-partitions" not in cfg:
                    raise ValueError(
                        f"node config {dict(cfg)} lacks 'partition-id' / 'num-partitions' "
                        "(deployment: flower-supernode --node-config "
                        "\"partition-id=0 num-partitions=3\")"
                    )
                return protocol.identity_reply(
                    msg, int(cfg["partition-id"]), int(cfg["num-partitions"])
                )
            if instruction.op != protocol.OP_TRAIN:
                raise ValueError(f"unknown gradient-coding op {instruction.op!r}")
            instruction.check_train()
            policy = NodePolicy.from_node_config(context.node_config)
            train_config = msg.content.config_records.get("config", ConfigRecord())
            policy.check(instruction, context.run_config, train_config)
            mod_order.warn_inner_mods(call_next)  # once per mod listed after this one
            claimed = _claim_round(guard, context, instruction, policy)
            try:
                return _coded_reply(msg, context, call_next, instruction, cache, policy)
            except BaseException:
                if claimed:  # nothing was sent: the round may be asked again
                    guard.release(context.node_id, context.node_config, instruction.nonce,
                                  instruction.round)
                raise
        except _Stopped as why:  # a short error reply: the node is free for the next round
            return Message(Error(MOD_STOPPED_CODE, str(why)), reply_to=msg)
        except Exception as exc:  # the server sees a named error, never a hung round
            # "Type: message", then the app's traceback (capped) for the server's debug.log
            return Message(Error(MOD_ERROR_CODE, error_reason(exc)), reply_to=msg)

    return gradient_coding_mod


#: The client mod: ``ClientApp(mods=[gradient_coding_mod])``.
gradient_coding_mod = make_gradient_coding_mod()
