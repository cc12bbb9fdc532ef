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
replicas share keyed noise only when they compute from identical inputs. A plain train
message (no gradient-coding record) that a node's DP policy lets through (``dp='sample'``,
the app's own DP-SGD) reaches the app with Python's, numpy's and torch's global RNGs reseeded
from the node's own randomness (``secrets``), whatever an outer mod seeded them with, and
restored after: noise the app draws from them cannot be predicted from the server's seed and
round (an app that seeds its own generator from the config is its own to fix).

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
identically); an app that writes it gets a warning once per mod instance (as do the other
warnings: public seeds, an in-memory replay guard, mods listed after this one).

The parts (:mod:`fl_gradcode.flower.client`): the instruction check, the per-partition runs,
the DP release, the coded accumulation, the deadline and wallclock latency, the wire encoding.

References:
    Tandon, Lei, Dimakis, Karampatziakis, "Gradient Coding: Avoiding Stragglers in Distributed
    Learning", ICML 2017, https://arxiv.org/abs/1612.03301.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from collections.abc import Callable, MutableMapping
from logging import ERROR
from typing import Any

from flwr.app import Context, Error, Message, MessageType
from flwr.common.logger import log

from . import mod_order, protocol
from .binding import bound_nonce
from .client.accumulate import CodedSum
from .client.deadline import Stopped, WorkDeadline
from .client.instruction import (
    check_partition_keys,
    claim_round,
    identify_reply,
    node_keys,
    node_policy,
    train_config_of,
)
from .client.notices import Notices
from .client.partitions import PartitionResult, PartitionRuns, array_values, single_record
from .client.release import PartitionRelease
from .client.seeding import (
    partition_seed,
    reseeded,
    rng_states,
    seed_everything,
    set_rng_states,
)
from .client.wire import coded_reply_message
from .client_ledger import PolicyError, ReplayGuard
from .client_policy import LOCAL_NOISE, NodePolicy
from .encoding import accumulate_delta
from .protocol import Instruction
from .records import error_reason

__all__ = ["MOD_ERROR_CODE", "MOD_STOPPED_CODE", "PartitionResult", "accumulate_delta",
           "bound_nonce", "gradient_coding_mod", "make_gradient_coding_mod", "partition_seed",
           "rng_states", "seed_everything", "set_rng_states"]

#: Error code of the mod's own error replies (Flower's ClientApp exception code is 0).
MOD_ERROR_CODE = 5400
#: Error code of a reply whose work stopped at its round's deadline (``stop-after-s``).
MOD_STOPPED_CODE = protocol.STOPPED_CODE

Cache = MutableMapping[Any, PartitionResult]


def _coded_reply(msg: Message, context: Context,
                 call_next: Callable[[Message, Context], Message], instruction: Instruction,
                 policy: NodePolicy, cache: Cache | None, notices: Notices,
                 wall_clock: Callable[[], float],
                 reported: dict[int, dict[str, float]], started: list[int]) -> Message:
    """The one coded reply to a checked ``train`` instruction: each assigned partition run
    (or taken from ``cache``), released, added to the coded sum, then encoded for the wire;
    :class:`~fl_gradcode.flower.client.deadline.Stopped` once the round's deadline passes.
    ``reported`` gets each partition's reply metrics (what the app says it did), ``started``
    each partition as its computation starts (the app has then run on its data)."""
    content = protocol.app_content(msg.content)
    global_arrays = single_record(dict(content.array_records), "arrays", "ArrayRecord")
    theta = {name: array_values(arr) for name, arr in global_arrays.items()}  # no copy
    release = PartitionRelease(instruction)
    keys = node_keys(context.node_config)
    check_partition_keys(instruction, keys)
    if keys is not None:  # keyed seeds: bind them to what this node was asked to compute
        instruction = dataclasses.replace(
            instruction, nonce=bound_nonce(instruction, content, context.run_config,
                                            msg.metadata.message_type,
                                            msg.metadata.group_id))
    runs = PartitionRuns(msg, context, call_next, instruction, theta, keys, policy, cache,
                         notices)
    deadline = WorkDeadline(msg, instruction, wall_clock)
    coded = CodedSum(theta, released=release.per_partition)
    total = len(instruction.partition_ids)
    for index, (pid, coefficient) in enumerate(
        zip(instruction.partition_ids, instruction.coefficients, strict=True)
    ):
        deadline.before_partition(index, total)  # a partition is never cut short
        started.append(pid)
        result = runs.result(index)
        reported[pid] = result.metrics
        released = None
        if release.per_partition:
            released = release.release(result.delta(theta), instruction, keys, pid,
                                       instruction.num_partitions[index])
        coded.add(coefficient, result, released)
        # drop this partition's reply (Flower's Message holds reference cycles); without a
        # per-partition release its arrays' bytes stay referenced by the sum until it is taken
        result = released = None
    deadline.before_reply(total)
    deadline.simulated_latency(total)
    return coded_reply_message(msg, instruction, coded, theta, global_arrays,
                               release.withholds_metrics)


def make_gradient_coding_mod(
    cache: Cache | None = None, *, wall_clock: Callable[[], float] = time.time,
) -> Callable[[Message, Context, Callable[[Message, Context], Message]], Message]:
    """A gradient-coding client mod.

    ``cache`` (in-process simulations only): replicas of a partition in the same process
    share its computed update, which they would compute bit-identically anyway; each replica
    still reports the measured compute time of that computation as its own.
    ``wall_clock``: the clock compared with a message's creation time for ``stop-after-s``
    (Flower's message TTL clock, :func:`time.time`).

    Each mod gives each of its warnings once (:class:`~fl_gradcode.flower.client.notices.
    Notices`), attributed to the code that called it.
    """

    guard = ReplayGuard()
    notices = Notices()

    def gradient_coding_mod(
        msg: Message, context: Context, call_next: Callable[[Message, Context], Message]
    ) -> Message:
        # "train" and its actions ("train.default", ...): every one reaches a train handler
        category = msg.metadata.message_type.split(".", 1)[0]
        if category in (MessageType.EVALUATE, MessageType.QUERY):
            return _evaluate_or_query(msg, context, call_next, notices)
        if category != MessageType.TRAIN or not msg.has_content():
            return call_next(msg, context)
        try:
            instruction = protocol.parse_instruction(msg.content)
        except Exception as exc:
            error = Error(MOD_ERROR_CODE, f"bad gradient-coding record: {exc}")
            return Message(error, reply_to=msg)
        if instruction is None:  # a plain train message: the app's, unless the node's DP
            try:  # policy needs the mod's DP, which a plain message does not get
                train_config = msg.content.config_records.get("config")
                plain_policy = NodePolicy.from_node_config(context.node_config)
                plain_policy.check_plain_train(
                    plain_dp(msg, context), context.run_config,
                    {} if train_config is None else train_config)
            except Exception as exc:
                return Message(Error(MOD_ERROR_CODE, error_reason(exc)), reply_to=msg)
            if not plain_policy.active:
                return call_next(msg, context)
            # the app's DP-SGD draws its noise from the global RNGs, which an outer mod or the
            # app may have seeded from the server's seed and round: reseed them from this
            # node's own randomness so the server cannot predict (and subtract) the noise
            with reseeded(secrets.randbits(63)):
                return call_next(msg, context)
        try:
            if instruction.op == protocol.OP_IDENTIFY:
                return identify_reply(msg, context)
            if instruction.op != protocol.OP_TRAIN:
                raise ValueError(f"unknown gradient-coding op {instruction.op!r}")
            policy = node_policy(msg, context, instruction)
            if policy.floorless:
                notices.once("no-floor", NO_FLOOR_WARNING)
            mod_order.warn_inner_mods(call_next, notices)  # once per mod listed after this one
            claimed = claim_round(guard, context, instruction, policy, notices,
                                  train_config_of(msg))
            reported: dict[int, dict[str, float]] = {}
            started: list[int] = []
            try:
                try:
                    reply = _coded_reply(msg, context, call_next, instruction, policy, cache,
                                         notices, wall_clock, reported, started)
                except Exception as exc:
                    if claimed and started and instruction.dp in LOCAL_NOISE:
                        # the app ran on the data, for a release the node noises, and failed
                        # or was stopped by the deadline the server set: whether it fails or
                        # finishes in time, and its message, may depend on the data, which no
                        # noise covers (a release without the node's noise covers nothing
                        # either: its app's message is sent as before). The round stays
                        # answered (a server cannot ask again with another model until one
                        # question fails), and its reason names no more than that; the app's
                        # error is logged on the node only
                        if isinstance(exc, Stopped):
                            raise DataStopped() from None
                        log(ERROR, "gradient_coding_mod: round %s: %s", instruction.round,
                            error_reason(exc))
                        raise DataFailure(DATA_FAILURE_REASON) from None
                    raise
                if claimed and instruction.dp == "sample":  # the app's DP-SGD, as it ran
                    guard.account(context.node_id, context.node_config, instruction.nonce,
                                  instruction.round, reported, policy)
                return reply
            except (DataFailure, DataStopped):
                raise  # the round stays answered
            except BaseException:
                # nothing was sent, and the data decided nothing (a deadline stopped the work,
                # the budget refused it, or it failed before the app ran): it may be asked again
                if claimed:
                    guard.release(context.node_id, context.node_config, instruction.nonce,
                                  instruction.round)
                raise
        except Stopped as why:  # a short error reply: the node is free for the next round
            return Message(Error(MOD_STOPPED_CODE, str(why)), reply_to=msg)
        except Exception as exc:  # the server sees a named error, never a hung round
            # "Type: message", then the app's traceback (capped) for the server's debug.log
            return Message(Error(MOD_ERROR_CODE, error_reason(exc)), reply_to=msg)

    return gradient_coding_mod


class DataStopped(Stopped):
    """A guarded node's work stopped by its deadline after the app ran on the data (the round
    stays answered)."""

    def __init__(self) -> None:
        super().__init__("stopped by the round's deadline after the app ran on this node's "
                         "data; the round counts as answered (this node guards its releases: "
                         "whether the work finishes in time may depend on the data)")


class DataFailure(PolicyError):
    """A guarded node's app failed after it ran on the data (:data:`DATA_FAILURE_REASON`)."""


#: The reason a guarded node gives when its app failed after running on the data (the app's
#: own message and traceback stay on the node: they may depend on the data).
DATA_FAILURE_REASON = (
    "the app failed after it ran on this node's data; its message is withheld and the round "
    "counts as answered (this node guards its releases: a failure may depend on the data, "
    "which no noise covers). The node's operator sees the app's error in the node's log")


def _evaluate_or_query(msg: Message, context: Context,
                       call_next: Callable[[Message, Context], Message],
                       notices: Notices) -> Message:
    """An evaluate or query message: the app's, unless node config ``dp-evaluate`` refuses it
    (its reply carries no noise); a node with a DP policy that allows it is warned once."""
    try:
        policy = NodePolicy.from_node_config(context.node_config)
        policy.check_evaluate(msg.metadata.message_type)
    except Exception as exc:
        return Message(Error(MOD_ERROR_CODE, error_reason(exc)), reply_to=msg)
    if policy.active or policy.budgeted:
        notices.once("evaluate", EVALUATE_WARNING)
    return call_next(msg, context)


#: Warned once by a node with a DP policy that lets evaluate and query messages through.
EVALUATE_WARNING = (
    "gradient_coding_mod: this node has a DP policy, but evaluate and query messages reach "
    "the app as they are: its replies (e.g. a loss on this node's data, for any model the "
    "server sends) carry no noise and count against no budget. Set node config "
    "dp-evaluate='refuse' to refuse them")


#: Warned once by a node whose ``dp-required`` adds noise on the node with no amount set.
NO_FLOOR_WARNING = (
    "gradient_coding_mod: node config dp-required refuses noise-multiplier=0 only; any "
    "positive noise multiplier the server sends passes (1e-300 releases the clipped update "
    "as it is). Set dp-min-noise-multiplier (or dp-max-epsilon) to insist on an amount")


def plain_dp(msg: Message, context: Context) -> str:
    """The ``dp`` a plain train message asks the app for: its train config's, else the run
    config's (``"none"`` when neither says)."""
    train_config = msg.content.config_records.get("config")
    if train_config is not None and "dp" in train_config:
        return str(train_config["dp"])
    return str(context.run_config.get("dp", "none"))


#: The client mod: ``ClientApp(mods=[gradient_coding_mod])``.
gradient_coding_mod = make_gradient_coding_mod()
