"""The wire protocol between :func:`gradient_coding_mod` and :class:`GradientCoding`.

One module owns every key, the layout of instructions and replies, and the parsing of a reply
into either a :class:`CodedReply` or a :class:`RejectedReply` whose message is the public
rejection reason. The mod, the strategy wrapper and the in-process test grid all use it.

Instruction (server -> client), a ``train`` message whose content is exactly what the inner
strategy would send (its ``arrays`` and ``config`` records) plus one ConfigRecord
:data:`PROTOCOL_KEY`:

* ``op``: ``"identify"`` (reply with the node's ``partition-id`` / ``num-partitions``) or
  ``"train"`` (compute the assigned partitions and reply with one coded combination);
* ``round``, ``worker``, ``seed``, ``nonce``: the round, the worker index in the code, the run
  seed and the per-run nonce (both public) that enter the replica-identical seeding;
* ``partition-ids``, ``num-partitions``, ``coefficients``: for every assigned data partition,
  the node config the app must see and the coefficient ``B[i, j]``;
* ``dp``, ``clip-norm``, ``noise-multiplier``, ``dp-noise``: the public DP parameters;
* ``timing``, ``delay-s``: wallclock demos sleep ``delay-s`` before replying;
* ``wire``: ``float64`` or ``model`` (replies in the global arrays' own dtype, chosen by the
  server when the code's error amplification keeps the decoded result accurate);
* ``chunk-coefficients``: communication-efficient codes only (``m > 1`` values): the worker
  sends ``sum_u Gamma[u, t] chunk_u`` of its group sum, one array ``chunk`` of length
  ``ceil((D + 1) / m)`` (``D`` model values, then the example count, zero-padded);
* ``weight-key``: the app's metric that counts its examples (the inner strategy's
  ``weighted_by_key``, ``num-examples`` by default).

Reply (client -> server): ArrayRecord :data:`PROTOCOL_KEY` with, for every model array ``name``,
``sum_j B[i,j] n_j (theta_j - theta)[name]`` (in the ``wire`` dtype), and MetricRecord
``gradient-coding-meta`` with ``worker``, ``round``, ``compute-s``, ``num-examples``
(``sum_j B[i,j] n_j``), the sizes ``n_j`` of the assigned partitions (``partition-sizes``,
public in FedAvg), and every scalar metric of the app as ``metric.<name>``
(``sum_j B[i,j] n_j m_j``).

References:
    Tandon, Lei, Dimakis, Karampatziakis, "Gradient Coding: Avoiding Stragglers in Distributed
    Learning", ICML 2017, https://arxiv.org/abs/1612.03301 (one coded reply per worker).
"""

from __future__ import annotations

import functools
import io
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)

from ..privacy import DP_MODES, DP_NOISE, normal_clip_norm
from .clock import CLOCKS
from .finite import finite_number

__all__ = [
    "MAX_LIST",
    "MAX_METRICS",
    "METRIC_PREFIX",
    "OP_IDENTIFY",
    "OP_TRAIN",
    "PROTOCOL_KEY",
    "CodedReply",
    "Identity",
    "Instruction",
    "RejectedReply",
    "identity_reply",
    "instruction_message",
    "parse_identity",
    "parse_instruction",
    "parse_reply",
    "train_reply",
]

PROTOCOL_KEY = "gradient-coding"
OP_IDENTIFY = "identify"
OP_TRAIN = "train"
#: Error code of a worker's reply saying it stopped at its round's deadline (``stop-after-s``).
STOPPED_CODE = 5401
METRIC_PREFIX = "metric."
CHUNK_KEY = "chunk"
MAX_METRICS, MAX_LIST = 1024, 4096  # caps on a reply's meta entries / a list's: checked first


class RejectedReply(Exception):
    """A reply that must not be decoded; ``str(exc)`` is the public rejection reason."""


@dataclass(frozen=True)
class Instruction:
    """What one worker must compute in one round (the parsed protocol ConfigRecord)."""

    op: str
    round: int = 0
    worker: int = -1
    seed: int = 0
    nonce: str = ""
    partition_ids: tuple[int, ...] = ()
    num_partitions: tuple[int, ...] = ()
    coefficients: tuple[float, ...] = ()
    dp: str = "none"
    clip_norm: float = 1.0
    noise_multiplier: float = 0.0
    dp_noise: str = "identical"
    timing: str = "virtual"
    delay_s: float = 0.0
    weight_key: str = "num-examples"
    wire: str = "float64"  # "float64", or "model": each array in the global model's dtype
    chunk_coefficients: tuple[float, ...] = ()  # communication-efficient codes: Gamma[:, t]
    # > 0: stop working this many seconds after the message was created (its round's
    # deadline has passed: the server can no longer use the reply); 0: never
    stop_after_s: float = 0.0

    def check_train(self) -> None:
        """Raise ``ValueError`` naming the field unless this is a computable ``train`` job:
        ``round >= 1`` and ``worker >= 0`` (the parsed defaults 0 / -1 mean "not sent")."""
        if self.round < 1:
            raise ValueError(f"round={self.round!r}; a train instruction needs round >= 1")
        if self.worker < 0:
            raise ValueError(f"worker={self.worker!r}; a train instruction needs worker >= 0")

    def to_record(self) -> ConfigRecord:
        return ConfigRecord(
            {
                "op": self.op,
                "round": int(self.round),
                "worker": int(self.worker),
                "seed": int(self.seed),
                "nonce": self.nonce,
                # Flower records reject empty lists: -1 / 0.0 mark "no partition"
                "partition-ids": [int(j) for j in self.partition_ids] or [-1],
                "num-partitions": [int(k) for k in self.num_partitions] or [-1],
                "coefficients": [float(c) for c in self.coefficients] or [0.0],
                "dp": self.dp,
                "clip-norm": float(self.clip_norm),
                "noise-multiplier": float(self.noise_multiplier),
                "dp-noise": self.dp_noise,
                "timing": self.timing,
                "delay-s": float(self.delay_s),
                "weight-key": self.weight_key,
                "wire": self.wire,
                "chunk-coefficients": [float(c) for c in self.chunk_coefficients] or [0.0],
                "stop-after-s": float(self.stop_after_s),
            }
        )


def instruction_message(
    content: RecordDict, instruction: Instruction, dst_node_id: int, group_id: str
) -> Message:
    """A ``train`` message: the inner strategy's records plus the protocol record."""
    records = {key: rec for key, rec in content.items() if key != PROTOCOL_KEY}
    records[PROTOCOL_KEY] = instruction.to_record()
    return Message(
        RecordDict(records),
        dst_node_id=dst_node_id,
        message_type=MessageType.TRAIN,
        group_id=group_id,
    )


#: Bounds a worker checks before computing anything (a bad field gets an error reply naming it).
MAX_NUM_PARTITIONS = 100_000  # num-partitions of any partition
MAX_ASSIGNED_PARTITIONS = 1024  # partitions in one instruction
MAX_DELAY_S = 3600.0  # simulated wallclock latency of one reply
MAX_TEXT = 256  # nonce and weight-key characters
OPS = (OP_IDENTIFY, OP_TRAIN)
TIMINGS = tuple(CLOCKS)  # the registered clocks' timing modes
WIRES = ("float64", "model")


def _int_field(rec: ConfigRecord, key: str, default: int, low: int) -> int:
    value = rec.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key}={value!r} is not an integer")
    if value < low:
        raise ValueError(f"{key}={value!r}; expected an integer >= {low}")
    return int(value)


def _float_field(
    rec: ConfigRecord, key: str, default: float, low: float, high: float = math.inf,
    positive: bool = False,
) -> float:
    value = rec.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{key}={value!r} is not a number")
    ok = finite_number(value) and low <= value <= high and (value > 0 or not positive)
    if not ok:
        rng = f"> {low:g}" if positive else f">= {low:g}"
        if math.isfinite(high):
            rng += f" and <= {high:g}"
        raise ValueError(f"{key}={value!r}; expected a finite number {rng}")
    return float(value)


def _choice_field(rec: ConfigRecord, key: str, default: str, allowed: Sequence[str]) -> str:
    value = rec.get(key, default)
    if value not in allowed:
        raise ValueError(f"{key}={value!r}; expected one of {tuple(allowed)}")
    return str(value)


def _text_field(rec: ConfigRecord, key: str, default: str, nonempty: bool = False) -> str:
    value = rec.get(key, default)
    if not isinstance(value, str) or len(value) > MAX_TEXT or (nonempty and not value):
        shown = value if not isinstance(value, str) else value[:40]
        raise ValueError(
            f"{key}={shown!r} is not a{' non-empty' if nonempty else ''} string of at most "
            f"{MAX_TEXT} characters"
        )
    return value


def _list_field(rec: ConfigRecord, key: str, default: list, kind: type) -> list:
    value = rec.get(key, default)
    if not isinstance(value, list):
        raise ValueError(f"{key}={value!r} is not a list")
    for x in value:
        if isinstance(x, bool) or not isinstance(x, (int, float) if kind is float else int):
            raise ValueError(f"{key} holds {x!r}, not {'a number' if kind is float else 'an int'}")
        if kind is float and not finite_number(x):
            raise ValueError(f"{key} holds {x!r}; expected finite numbers")
    return [kind(x) for x in value]


def parse_instruction(content: RecordDict) -> Instruction | None:
    """The instruction in a message's content, or ``None`` if it carries none.

    Strict: a field of the wrong type, outside its allowed set or bounds, non-finite, or
    lists of different lengths raise ``ValueError`` naming the field (the mod answers with an
    error reply). ``partition-ids=[-1]`` (with ``num-partitions=[-1]``, ``coefficients=[0.0]``)
    is the wire form of "no partitions" (Flower records reject empty lists). Bounds: at most
    :data:`MAX_ASSIGNED_PARTITIONS` ids per instruction, each unique and in
    ``[0, num-partitions)``, ``1 <= num-partitions <= MAX_NUM_PARTITIONS``,
    ``0 <= delay-s <= MAX_DELAY_S``. Round and worker are only checked against their
    defaults' ranges here (``>= 0``, ``>= -1``); :meth:`Instruction.check_train` requires a
    real round and worker of a ``train`` instruction.
    """
    if PROTOCOL_KEY not in content.config_records:
        return None
    rec = content.config_records[PROTOCOL_KEY]
    op = rec.get("op")
    if op not in OPS:
        raise ValueError(f"unknown gradient-coding op {op!r} (field op); expected one of {OPS}")
    ids = _list_field(rec, "partition-ids", [-1], int)
    nums = _list_field(rec, "num-partitions", [-1], int)
    coefs = _list_field(rec, "coefficients", [0.0], float)
    if ids == [-1]:  # the wire form of "no partitions"
        if nums != [-1] or len(coefs) != 1:
            raise ValueError(
                f"partition-ids=[-1] (no partitions) needs num-partitions=[-1] and one "
                f"placeholder coefficient; got num-partitions={nums!r}, "
                f"coefficients={coefs!r}"
            )
        ids, nums, coefs = [], [], []
    if len(ids) > MAX_ASSIGNED_PARTITIONS:
        raise ValueError(
            f"partition-ids has {len(ids)} entries; at most {MAX_ASSIGNED_PARTITIONS} "
            "partitions per instruction"
        )
    if not (len(nums) == len(ids) == len(coefs)):
        raise ValueError(
            f"partition-ids ({len(ids)}), num-partitions ({len(nums)}) and coefficients "
            f"({len(coefs)}) must have the same length"
        )
    for k in nums:
        if not 1 <= k <= MAX_NUM_PARTITIONS:
            raise ValueError(f"num-partitions holds {k}; expected 1 <= num-partitions <= "
                             f"{MAX_NUM_PARTITIONS}")
    for j, k in zip(ids, nums, strict=True):
        if not 0 <= j < k:
            raise ValueError(f"partition-ids holds {j}; expected 0 <= id < num-partitions={k}")
    if len(set(ids)) != len(ids):
        dup = sorted({j for j in ids if ids.count(j) > 1})
        raise ValueError(f"partition-ids repeats {dup}; each partition at most once")
    chunk = _list_field(rec, "chunk-coefficients", [0.0], float)
    if len(chunk) > MAX_ASSIGNED_PARTITIONS:
        raise ValueError(f"chunk-coefficients has {len(chunk)} entries; at most "
                         f"{MAX_ASSIGNED_PARTITIONS}")
    seed = rec.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed={seed!r} is not an integer")
    return Instruction(
        op=op,
        round=_int_field(rec, "round", 0, 0),
        worker=_int_field(rec, "worker", -1, -1),
        seed=int(seed),
        nonce=_text_field(rec, "nonce", ""),
        partition_ids=tuple(ids),
        num_partitions=tuple(nums),
        coefficients=tuple(coefs),
        dp=_choice_field(rec, "dp", "none", DP_MODES),
        clip_norm=normal_clip_norm(_float_field(rec, "clip-norm", 1.0, 0.0, positive=True)),
        noise_multiplier=_float_field(rec, "noise-multiplier", 0.0, 0.0),
        dp_noise=_choice_field(rec, "dp-noise", "identical", DP_NOISE),
        timing=_choice_field(rec, "timing", "virtual", TIMINGS),
        delay_s=_float_field(rec, "delay-s", 0.0, 0.0, MAX_DELAY_S),
        weight_key=_text_field(rec, "weight-key", "num-examples", nonempty=True),
        wire=_choice_field(rec, "wire", "float64", WIRES),
        chunk_coefficients=tuple(chunk) if len(chunk) > 1 else (),
        stop_after_s=_float_field(rec, "stop-after-s", 0.0, 0.0),
    )


def app_content(content: RecordDict) -> RecordDict:
    """The content the app sees: everything but the protocol record."""
    return RecordDict({key: rec for key, rec in content.items() if key != PROTOCOL_KEY})


# ---------------------------------------------------------------------------- identify
@dataclass(frozen=True)
class Identity:
    """A node's data partition as its node config states it."""

    partition_id: int
    num_partitions: int


def identity_reply(msg: Message, partition_id: int, num_partitions: int) -> Message:
    rec = MetricRecord({"partition-id": int(partition_id), "num-partitions": int(num_partitions)})
    return Message(RecordDict({PROTOCOL_KEY: rec}), reply_to=msg)


def parse_identity(reply: Message) -> Identity:
    """The identity in a reply to an ``identify`` instruction, else :class:`RejectedReply`."""
    if reply.has_error():
        raise RejectedReply(f"error reply (code {reply.error.code}: {reply.error.reason})")
    try:
        rec = reply.content.metric_records[PROTOCOL_KEY]
        pid, num = rec["partition-id"], rec["num-partitions"]
    except Exception as exc:  # any malformed content is a rejection, never a crash
        raise RejectedReply(f"no identity in the reply ({type(exc).__name__}: {exc})") from exc
    if not (isinstance(pid, int) and isinstance(num, int) and 0 <= pid < num):
        raise RejectedReply(f"partition-id={pid!r} num-partitions={num!r} are not 0 <= id < num")
    return Identity(int(pid), int(num))


# ---------------------------------------------------------------------------- arrays
_HEADER = re.compile(
    rb"^\{'descr': '([<>|=][a-z]\d{1,2})', 'fortran_order': (True|False), "
    rb"'shape': \(((?:\d+, ?)*\d*)\), \} *\n$"
)


def _npy_header(data: bytes) -> tuple[tuple[int, ...], bool, np.dtype, int] | None:
    """``(shape, fortran, dtype, data offset)`` of a version-1.0 ``.npy`` header as numpy
    writes it, or ``None`` (then numpy's parser decides)."""
    if len(data) < 10 or data[:8] != b"\x93NUMPY\x01\x00":
        return None
    size = int.from_bytes(data[8:10], "little")
    fields = _header_fields(bytes(data[10 : 10 + size]))
    if fields is None:
        return None
    return (*fields, 10 + size)


@functools.lru_cache(maxsize=1024)
def _header_fields(header: bytes) -> tuple[tuple[int, ...], bool, np.dtype] | None:
    """``(shape, fortran, dtype)`` of a header's dictionary, or ``None``; cached: every reply
    of a round carries the same few headers."""
    match = _HEADER.match(header)
    if match is None:
        return None
    shape = tuple(int(x) for x in match.group(3).split(b",") if x.strip())
    try:
        dtype = np.dtype(match.group(1).decode())
    except (TypeError, ValueError):  # e.g. '<f9': numpy's own parser refuses it, with reason
        return None
    return shape, match.group(2) == b"True", dtype


def array_view(arr: Array) -> np.ndarray:
    """A read-only ndarray over an Array's ``.npy`` bytes, without copying them (Flower's
    ``Array.numpy()`` copies through ``np.load``). Raises :class:`RejectedReply` for another
    serialization, object dtypes or truncated bytes."""
    if arr.stype != "numpy.ndarray":
        raise RejectedReply(f"unsupported array serialization {arr.stype!r}")
    data = arr.data
    header = _npy_header(data)
    if header is not None:
        shape, fortran, dtype, offset = header
    else:  # anything unusual: numpy's own (slower, literal_eval-based) parser
        fp = io.BytesIO(data)
        try:
            version = np.lib.format.read_magic(fp)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(fp)
            else:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(fp)
        except Exception as exc:
            raise RejectedReply(f"array bytes are not .npy ({type(exc).__name__}: {exc})") from exc
        offset = fp.tell()
    if dtype.hasobject:
        raise RejectedReply(f"array dtype {dtype} holds Python objects")
    if dtype.itemsize == 0:
        raise RejectedReply(f"array dtype {dtype} has values of zero bytes")
    count = math.prod(shape)
    if len(data) < offset + count * dtype.itemsize:
        raise RejectedReply(f"array bytes are truncated ({len(data)} bytes for {shape} {dtype})")
    flat = np.frombuffer(data, dtype=dtype, count=count, offset=offset)
    if len(shape) == 1:  # already the array (no reshape: a microsecond per array of a reply)
        return flat
    return flat.reshape(shape, order="F") if fortran else flat.reshape(shape)


def npy_array(values: np.ndarray, dtype: Any = None) -> Array:
    """``Array(values.astype(dtype))`` (Flower's ``.npy`` serialization, the same bytes as
    ``np.save``) with one copy of the values into the message's bytes (``np.save`` into a
    ``BytesIO`` and ``getvalue`` make two, plus the cast's). Casts are ``same_kind``
    (float64 -> float32 rounds; float -> int is refused)."""
    values = np.asarray(values)
    dtype = values.dtype if dtype is None else np.dtype(dtype)
    if dtype.hasobject:
        raise TypeError(f"dtype {dtype} holds Python objects; arrays of numbers only")
    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(head, {
        "descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False,
        "shape": tuple(values.shape)})
    body = np.ascontiguousarray(values.astype(dtype, casting="same_kind", copy=False))
    data = b"".join([head.getvalue(), memoryview(body.reshape(-1)).cast("B")])
    return Array(dtype=str(dtype), shape=tuple(values.shape), stype="numpy.ndarray", data=data)


# ---------------------------------------------------------------------------- train replies
def train_reply(
    msg: Message,
    instruction: Instruction,
    coded: Mapping[str, np.ndarray],
    num_examples: float,
    sizes: Sequence[float],
    metrics: Mapping[str, float],
    compute_s: float,
    dtypes: Mapping[str, np.dtype] | None = None,
) -> Message:
    """The one coded reply of a worker; ``dtypes``: arrays sent in another dtype than their
    own (the wire dtype), cast while serializing."""
    dtypes = dtypes or {}
    arrays = ArrayRecord({name: npy_array(v, dtypes.get(name)) for name, v in coded.items()})
    meta: dict[str, Any] = {
        "worker": int(instruction.worker),
        "round": int(instruction.round),
        "compute-s": float(compute_s),
        "num-examples": float(num_examples),
        "partition-sizes": [float(n) for n in sizes] or [0.0],
    }
    for name, value in metrics.items():
        meta[METRIC_PREFIX + name] = float(value)
    return Message(
        RecordDict({PROTOCOL_KEY: arrays, PROTOCOL_KEY + "-meta": MetricRecord(meta)}),
        reply_to=msg,
    )


@dataclass
class CodedReply:
    """A parsed, validated coded reply."""

    node: int
    worker: int
    arrays: dict[str, np.ndarray]
    num_examples: float
    sizes: tuple[float, ...]
    metrics: dict[str, float]
    compute_s: float
    extra: dict[str, Any] = field(default_factory=dict)



def parse_reply(
    reply: Message,
    *,
    worker: int,
    round: int,
    layout: Mapping[str, tuple[int, ...]],
    check_values: bool = True,
    dtypes: Mapping[str, np.dtype] | None = None,
) -> CodedReply:
    """Validate a coded reply from the node that is ``worker`` in round ``round``.

    ``check_values=False`` skips the one full read that checks every value is finite (the
    caller then checks the decoded result, which is finite exactly when every reply it used
    is: wallclock rounds return without reading whole models on the critical path).

    Every failure (error reply, missing, malformed or oversized records, wrong round, worker,
    keys, shapes or dtype, non-finite values, bytes that do not deserialize) raises
    :class:`RejectedReply` with the reason; nothing escapes as another exception.
    """
    if reply.has_error():
        raise RejectedReply(f"error reply (code {reply.error.code}: {reply.error.reason})")
    try:
        return _parse_train(reply, worker, round, layout, check_values, dtypes)
    except RejectedReply:
        raise
    except Exception as exc:  # corrupt bytes, wrong record types, ...: a reason, not a crash
        raise RejectedReply(f"malformed reply ({type(exc).__name__}: {exc})") from exc


def non_finite_arrays(reply: CodedReply) -> list[str]:
    """The names of a parsed reply's arrays that hold NaN or Inf."""
    return [name for name, arr in reply.arrays.items() if not _all_finite(arr)]


def _all_finite(arr: np.ndarray) -> bool:
    """Whether every value is finite, in one read: a finite float64 sum implies finite values
    (NaN and Inf propagate); only a non-finite sum (e.g. huge float64 values that overflow) is
    checked element by element."""
    if math.isfinite(float(np.sum(arr, dtype=np.float64))):
        return True
    return bool(np.isfinite(arr).all())


def _number(meta: MetricRecord, key: str) -> float:
    value = meta.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RejectedReply(f"metric {key!r}={value!r} is not a number")
    if not finite_number(value):
        raise RejectedReply(f"metric {key!r}={value!r} is not finite")
    return float(value)


_ANY = object()  # no wire dtype named for an array


def _parse_train(
    reply: Message,
    worker: int,
    round: int,
    layout: Mapping[str, tuple[int, ...]],
    check_values: bool = True,
    dtypes: Mapping[str, np.dtype] | None = None,
) -> CodedReply:
    content = reply.content
    # direct lookups: RecordDict's array_records / metric_records build a new dict per call
    record = content.get(PROTOCOL_KEY)
    if not isinstance(record, ArrayRecord):
        raise RejectedReply(f"reply lacks the {PROTOCOL_KEY!r} ArrayRecord")
    meta = content.get(PROTOCOL_KEY + "-meta")
    if not isinstance(meta, MetricRecord):
        raise RejectedReply(f"reply lacks the {PROTOCOL_KEY + '-meta'!r} MetricRecord")
    if len(meta) > MAX_METRICS + 8:  # the protocol's own entries are fewer than 8
        raise RejectedReply(f"{len(meta)} meta entries: over MAX_METRICS={MAX_METRICS} metrics")
    for key, value in meta.items():
        if isinstance(value, list) and len(value) > MAX_LIST:
            raise RejectedReply(f"{key!r} has {len(value)} entries: more than MAX_LIST={MAX_LIST}")
    claimed = meta.get("worker")
    if claimed != worker:
        raise RejectedReply(f"claims worker {claimed!r} but the node is worker {worker}")
    if meta.get("round") != round:
        raise RejectedReply(f"computed for round {meta.get('round')!r}, not {round}")
    if list(record.keys()) != list(layout):
        raise RejectedReply(f"array keys {list(record.keys())} differ from the model's")
    arrays: dict[str, np.ndarray] = {}
    wire = dtypes if dtypes is not None else {}
    # the keys are the layout's, in its order: one pass over both, no lookup per array
    for (name, shape), value in zip(layout.items(), record.values(), strict=True):
        arr = array_view(value)
        dtype, want = arr.dtype, wire.get(name, _ANY)
        if dtype.kind != "f":
            raise RejectedReply(f"array {name!r} has dtype {dtype}, not a floating type")
        # (numpy's float dtypes are singletons: ``is`` settles the usual case)
        if want is not _ANY and dtype is not want and dtype != want:
            raise RejectedReply(f"array {name!r} has dtype {dtype}; this round's wire is {want}")
        if arr.shape != (shape if type(shape) is tuple else tuple(shape)):
            raise RejectedReply(f"array {name!r} has shape {arr.shape}; expected {shape}")
        if check_values and not _all_finite(arr):
            raise RejectedReply(f"array {name!r} contains NaN or Inf")
        arrays[name] = arr  # a zero-copy view of the message's bytes
    count = _number(meta, "num-examples")
    compute_s = _number(meta, "compute-s")
    if compute_s < 0:
        raise RejectedReply(f"compute-s={compute_s!r} is negative")
    sizes_raw = meta.get("partition-sizes")
    if not isinstance(sizes_raw, list) or not all(
        isinstance(x, (int, float)) and not isinstance(x, bool) for x in sizes_raw
    ):
        raise RejectedReply(f"partition-sizes={sizes_raw!r} is not a list of numbers")
    if not all(finite_number(x) and x >= 0 for x in sizes_raw):
        raise RejectedReply(f"partition-sizes={sizes_raw!r} are not non-negative counts")
    sizes = tuple(float(x) for x in sizes_raw)
    metrics = {key[len(METRIC_PREFIX) :]: _number(meta, key) for key in meta.keys()
               if key.startswith(METRIC_PREFIX)}
    return CodedReply(
        node=reply.metadata.src_node_id,
        worker=worker,
        arrays=arrays,
        num_examples=count,
        sizes=sizes,
        metrics=metrics,
        compute_s=compute_s,
    )
