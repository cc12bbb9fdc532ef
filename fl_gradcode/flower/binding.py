"""What a node's keyed seeds are bound to: the instruction's DP parameters, the app's config
and the received model.

A node with partition keys seeds the partition noise and the app's RNG with
``HMAC(key_j, nonce, round, j)`` (:func:`fl_gradcode.privacy.noise_seed`). Replicas of
partition ``j`` must draw identical noise (exact decoding with per-partition DP needs it), but
a server that sends two replicas *different* inputs under one ``(nonce, round)`` must not get
two releases with the same noise: subtracting them would cancel it, e.g. two models ``theta``
and ``theta + d`` for a least-squares partition give ``X^T X d`` exactly. :func:`bound_nonce`
therefore folds a hash of everything the app computes from (the DP parameters, the non-array
records such as ``lr``, the run config, and the received arrays' values; per partition, its
``num-partitions``) into the nonce the keyed seeds use:
identical inputs still give identical noise; any difference gives independent noise (each
such release is then a release of its own, which the node's ledger counts).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, MessageType, RecordDict

from ..config import KEYS
from . import protocol
from .protocol import Instruction

__all__ = ["arrays_digest", "bound_nonce", "partition_nonce"]

#: Run-config keys of the key table only the server reads (the code, its tolerance, where
#: results go, ...): left out of the binding, so a coded and an uncoded run of one pinned
#: nonce draw the same noise. Any other key (an app's own included) is bound.
_SERVER_KEYS = frozenset(k.name for k in KEYS if k.side == "server")


def _values(arr) -> np.ndarray:
    try:
        return protocol.array_view(arr)
    except protocol.RejectedReply:
        return arr.numpy()


def _bind_order(digest: Any, key: str, names: Iterable[Any]) -> list[str]:
    """Add ``[key, "order", names]`` to ``digest`` when ``names`` (a record's, as received) are
    not in sorted order; returns them."""
    received = [str(name) for name in names]
    if received != sorted(received):
        digest.update(json.dumps([key, "order", received]).encode())
    return received


def arrays_digest(content: RecordDict) -> str:
    """SHA-256 of the values of every array in ``content`` (records and names sorted), and of
    a record's names in the order received when that is not the sorted order.

    The order is bound because it is part of what the node computes and releases: an app
    reading the arrays by position trains another model from another order, and the release
    lays the noise out over the arrays in the order received, so two replicas sent one model
    in two orders under one noise seed would carry the same noise on different arrays, and
    their difference would cancel it.

    Floating arrays are hashed as float64 with ``-0.0`` read as ``0.0``, so the same values
    sent in another byte order or memory layout hash alike (they give the app the same
    model); their precision (float16, float32, float64), shapes and names are part of the
    hash: an app computing in the dtype it is sent releases another update from float16."""
    digest = hashlib.sha256()
    for key in sorted(content.keys()):
        record = content[key]
        if not isinstance(record, ArrayRecord):
            continue
        received = _bind_order(digest, key, record.keys())
        if not received:  # present, if empty: the app may read that it is there
            digest.update(json.dumps([key, "empty"]).encode())
        for name in sorted(record.keys()):
            values = _values(record[name])
            if values.dtype.kind == "f":
                # the precision is bound (an app computing in the dtype it is sent gives
                # another update), not the byte order or layout; float64 hashes as it did
                size = values.dtype.itemsize
                kind = "float" if size == 8 else f"float{8 * size}"
                values = np.asarray(values, dtype=np.float64) + 0.0  # -0.0 -> 0.0
            else:
                kind = values.dtype.str
            values = np.ascontiguousarray(values)
            digest.update(json.dumps([key, name, kind, list(values.shape)]).encode())
            digest.update(values.reshape(-1).view(np.uint8))
    return digest.hexdigest()


def partition_nonce(nonce: str, num_partitions: int) -> str:
    """``nonce`` bound to how many partitions the data of partition ``j`` is one of: the same
    ``j`` of another ``num-partitions`` is other data, so it draws independent keyed noise."""
    return f"{nonce};of={int(num_partitions)}"


def bound_nonce(instruction: Instruction, content: RecordDict,
                run_config: Mapping[str, Any] | None = None,
                message_type: str = MessageType.TRAIN, group_id: str | None = None) -> str:
    """The run nonce bound to this instruction's inputs: ``"<nonce>;bind=<sha256 prefix>"``.

    Bound: the DP parameters (``dp``, ``clip-norm``, ``noise-multiplier``, ``dp-noise``), the
    app's non-array records (its config, e.g. ``lr``), the node's ``run_config`` (which an
    app reads its data split from; not the keys only the server reads) and the received
    arrays' values (:func:`arrays_digest`); each partition's seeds also bind its
    ``num-partitions`` (:func:`partition_nonce`). Keyed seeds (partition noise, the app's
    RNG) use it, so two releases of a partition share their keyed noise only if they were
    computed from the same inputs: honest replicas (the server sends every replica the same)
    draw identical noise, while a server that sends replicas one round with another sigma,
    lr, model, run config or partitioning gets independent noise, which does not cancel when
    it subtracts the releases. ``message_type``: a train action other than the default
    (``"train.<action>"``, which Flower routes to another handler of the app, i.e. another
    computation) is bound too; ``"train"`` and ``"train.default"`` reach the same handler and
    bind nothing more. What an app may read beside the values is bound where it is not what
    honest senders send alike: the order of the records and of a record's items when it is
    not sorted by name (an app may take the first record, or read its config by position),
    an empty ArrayRecord, and a ``group_id`` other than the round's number (Flower's
    senders set it to the round; an app may schedule its step by it)."""
    digest = hashlib.sha256()
    params = {"dp": instruction.dp, "clip-norm": repr(float(instruction.clip_norm)),
              "noise-multiplier": repr(float(instruction.noise_multiplier)),
              "dp-noise": instruction.dp_noise}
    digest.update(json.dumps(params, sort_keys=True).encode())
    received = [str(key) for key in content.keys()]
    if received != sorted(received):  # an app may take the first record
        digest.update(json.dumps(["record-order", [
            [key, type(content[key]).__name__] for key in received]]).encode())
    for key in sorted(content.keys()):
        record = content[key]
        if isinstance(record, ArrayRecord):
            continue
        items = sorted((str(name), repr(value)) for name, value in record.items())
        digest.update(json.dumps([key, type(record).__name__, items]).encode())
        _bind_order(digest, key, record.keys())  # an app may read its config by position
    if group_id is not None and str(group_id) != str(instruction.round):
        digest.update(json.dumps(["group-id", str(group_id)]).encode())
    # the run config the app may read (its data split, seed, ...; not the keys only the
    # server reads, e.g. the code): replicas of one run share it
    items = sorted((str(name), repr(value)) for name, value in (run_config or {}).items()
                   if name not in _SERVER_KEYS)
    digest.update(json.dumps(["run-config", items]).encode())
    action = message_type.split(".", 1)[1] if "." in message_type else "default"
    if action != "default":  # another handler of the app: another computation
        digest.update(json.dumps(["train-action", action]).encode())
    digest.update(f";arrays={arrays_digest(content)}".encode())
    return f"{instruction.nonce};bind={digest.hexdigest()[:32]}"
