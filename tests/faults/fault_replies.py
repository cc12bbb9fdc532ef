"""The rewritten replies of the fault suite's outer client mod (``Injector.fault_mod`` in
``tests/faults/fault_injector.py``): the malformed replies the protocol must reject and the
finite value forgeries (``huge``, ``scaled``, ``replay-forged``). The edge kinds' forgeries are
in ``fault_kinds``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from fl_gradcode.flower.protocol import PROTOCOL_KEY

META_KEY = PROTOCOL_KEY + "-meta"

#: The reason a rejected reply must carry, per fault the protocol must reject.
REASONS = {
    "error": r"error reply \(code 5400: RuntimeError: the app failed on partition \d+: code 4242",
    "exception": r"error reply \(code (5400|0): .*InjectedFault: injected exception",
    "nan": r"contains NaN or Inf",
    "inf": r"contains NaN or Inf",
    "wrong-shape": r"has shape .* expected",
    "wrong-dtype": r"has dtype (int64|bool|float16)",
    "missing-records": r"reply lacks the|array keys .* differ",
    "corrupt-bytes": r"array bytes are (not \.npy|truncated)",
    "wrong-metric-type": r"is not a number|is not a list of numbers",
    # (a node whose worker index changed since, e.g. after a late join, is caught first by
    # its worker claim)
    "replay": r"computed for round \d+, not \d+|claims worker \d+ but the node is worker \d+",
    "forged-worker": r"claims worker \d+ but the node is worker \d+",
    "unknown-sender": r"unknown sender",
    "spoofed-sender": r"claims worker \d+ but|duplicate sender|sender was not sent work",
}


def match(faults: list[str], reasons: list[str]) -> int:
    """The most faults that can each be given a distinct reason matching its pattern."""
    owner: dict[int, int] = {}

    def augment(f: int, seen: set[int]) -> bool:
        for j, reason in enumerate(reasons):
            if j in seen or not re.search(REASONS[faults[f]], reason):
                continue
            seen.add(j)
            if j not in owner or augment(owner[j], seen):
                owner[j] = f
                return True
        return False

    return sum(augment(f, set()) for f in range(len(faults)))


def forged_coefficients(
    msg: Message, context: Context, call_next: Callable[[Message, Context], Message],
    rng: np.random.Generator,
) -> Message:
    """The reply of an honest computation of forged coefficients (``forged-consistent``)."""
    original = msg.content
    rec = ConfigRecord(dict(original.config_records[PROTOCOL_KEY]))
    coefficients = list(rec["coefficients"])
    rec["coefficients"] = [float(c * rng.uniform(1.2, 2.5)) for c in coefficients]
    records = {k: v for k, v in original.items() if k != PROTOCOL_KEY}
    records[PROTOCOL_KEY] = rec
    msg.content = RecordDict(records)
    try:
        return call_next(msg, context)
    finally:
        msg.content = original


def rewrite(
    kind: str,
    variant: int,
    rng: np.random.Generator,
    arrays: dict[str, np.ndarray],
    meta: dict[str, Any],
    earlier: dict[int, tuple[dict, dict]],
    server_round: int,
    node: int,
    n: int,
) -> RecordDict | None:
    """The reply content of ``node`` in ``server_round`` under fault ``kind`` (``earlier``: the
    node's honest replies of earlier rounds, by round), or ``None`` if it cannot be injected."""
    r = server_round
    arrays = {k: v.copy() for k, v in arrays.items()}
    meta = dict(meta)
    records: dict[str, Any] | None = None
    name = str(rng.choice(list(arrays)))
    if kind == "inf":
        arrays[name].flat[int(rng.integers(arrays[name].size))] = (
            np.inf if variant % 2 else -np.inf
        )
    elif kind == "wrong-shape":
        arr = arrays[name]
        arrays[name] = (
            arr.reshape(-1)[:-1],
            arr.reshape(-1, 1),
            np.concatenate([arr, arr]),
            arr.T.copy() if arr.ndim == 2 else arr[None, :],
        )[variant]
    elif kind == "wrong-dtype":
        if variant == 4:  # a float dtype below the wire's (only on request: see the tests)
            arrays = {k: v.astype(np.float16) for k, v in arrays.items()}
        elif variant % 2:
            arrays[name] = np.rint(arrays[name]).astype(np.int64)
        else:
            arrays[name] = arrays[name] > 0
    elif kind == "missing-records":
        if variant == 0:
            records = {META_KEY: MetricRecord(meta)}
        elif variant == 1:
            records = {PROTOCOL_KEY: array_record(arrays)}
        else:
            del arrays[name]
    elif kind == "corrupt-bytes":
        good = Array(arrays[name])
        if variant == 0:
            data = rng.bytes(len(good.data))
        elif variant == 1:
            data = good.data[: len(good.data) - 8 * int(rng.integers(1, 4))]
        elif variant == 2:
            data = good.data[:8] + b"\x10\x00{'descr': garbage" + good.data[40:]
        else:
            data = b"garbage"
        records = {PROTOCOL_KEY: array_record(arrays), META_KEY: MetricRecord(meta)}
        records[PROTOCOL_KEY][name] = Array(
            dtype=good.dtype, shape=tuple(good.shape), stype="numpy.ndarray", data=data
        )
    elif kind == "wrong-metric-type":
        record = MetricRecord(meta)
        if variant == 0:
            record["num-examples"] = [1.0, 2.0]
        elif variant == 1:
            record["compute-s"] = [0.1]
        elif variant == 2:
            record["metric.train_loss"] = [0.5, 0.5]
        else:
            record.__dict__["_data"]["partition-sizes"] = "many"  # what Flower would refuse
        records = {PROTOCOL_KEY: array_record(arrays), META_KEY: record}
    elif kind in ("replay", "replay-forged"):
        rounds = [q for q in earlier if q < r]
        if not rounds:
            return None
        old_arrays, old_meta = earlier[int(rng.choice(rounds))]
        arrays = {k: v.copy() for k, v in old_arrays.items()}
        if kind == "replay":
            meta = dict(old_meta)  # verbatim: computed for the earlier round
        else:  # relabelled as this round's reply (finite, wrong unless the model is unchanged)
            meta = {**old_meta, "round": r, "compute-s": meta["compute-s"],
                    "worker": meta["worker"]}
    elif kind == "forged-worker":
        worker = int(meta["worker"])  # the node's worker index this round
        meta["worker"] = int((worker + 1 + rng.integers(n - 1)) % n)
    elif kind == "huge":
        factor = 1e30 * rng.uniform(1.0, 2.0)
        arrays = {k: v * factor for k, v in arrays.items()}
    elif kind == "scaled":
        factor = rng.uniform(1.2, 3.0) * (1 if variant % 2 else -1)
        arrays = {k: v * factor for k, v in arrays.items()}
    else:
        raise AssertionError(kind)
    return RecordDict(records) if records is not None else content(arrays, meta)


def array_record(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in arrays.items()})


def content(arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> RecordDict:
    return RecordDict({PROTOCOL_KEY: array_record(arrays), META_KEY: MetricRecord(meta)})
