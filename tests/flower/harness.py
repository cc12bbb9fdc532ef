"""Run ``GradientCoding`` on in-process nodes of the numpy app, with faults injected from outside.

Stragglers and faults are injected from outside the plug-in: by an OUTER client mod that
rewrites the coded reply (``ClientApp(mods=[fault_mod, gradient_coding_mod])``), by the grid's
wall-clock ``delay``, or, in virtual timing, by a fixed table of arrival times
(``FixedArrivals`` with ``measured_compute=False``: arrivals are exactly the table).
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Error,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp.strategy import FedAvg, Strategy

from fl_gradcode.flower import GradientCoding, gradient_coding_mod
from fl_gradcode.flower.protocol import OP_TRAIN, PROTOCOL_KEY, parse_instruction
from fl_gradcode.flower.testing import InProcessGrid
from fl_gradcode.latency import TraceReplay
from tests.apps.numpy_app import LR, META_KEY, as_dict, initial_arrays, make_app


# =============================================================================== injection
def fault_mod(faults: Mapping[tuple[int, int], str]):
    """An OUTER mod: rewrites worker ``w``'s coded reply in round ``r`` as ``faults[w, r]``."""

    def mod(msg: Message, context: Context, call_next) -> Message:
        reply = call_next(msg, context)
        if msg.metadata.message_type != MessageType.TRAIN:
            return reply
        instruction = parse_instruction(msg.content)
        if instruction is None or instruction.op != OP_TRAIN:
            return reply
        kind = faults.get((instruction.worker, instruction.round))
        return reply if kind is None else corrupt(kind, msg, reply)

    return mod


def _force(record: MetricRecord, key: str, value: Any) -> None:
    """Put a value Flower's MetricRecord would refuse (a str) into it, as a hostile peer might."""
    record.__dict__["_data"][key] = value


def corrupt(kind: str, msg: Message, reply: Message) -> Message:
    """The reply rewritten by fault ``kind``. Arrays are also poisoned (+1000) wherever the
    reply stays parseable, so that decoding it anyway would change the model."""
    if kind == "error":
        return Message(Error(code=0, reason="client crashed"), reply_to=msg)
    coded = {k: v.numpy() for k, v in reply.content.array_records[PROTOCOL_KEY].items()}
    arrays: dict[str, Array] = {k: Array(v + 1000.0) for k, v in coded.items()}
    meta = MetricRecord(dict(reply.content.metric_records[META_KEY]))
    records: dict[str, Any] = {}
    if kind == "no-arrays":
        records = {META_KEY: meta}
    elif kind == "no-metrics":
        records = {PROTOCOL_KEY: ArrayRecord(arrays)}
    else:
        if kind == "wrong-keys":
            arrays = {("weights" if k == "w" else k): v for k, v in arrays.items()}
        elif kind == "extra-key":
            arrays["extra"] = Array(np.zeros(2))
        elif kind == "wrong-shape":
            arrays["w"] = Array(coded["w"][:-1])
        elif kind == "string-dtype":
            arrays["w"] = Array(np.array(["x"] * coded["w"].size))
        elif kind == "bool-dtype":
            arrays["w"] = Array(np.ones(coded["w"].shape, dtype=bool))
        elif kind == "complex-dtype":
            arrays["w"] = Array(coded["w"] + 1j)
        elif kind == "nan":
            arrays["w"] = Array(np.where(np.arange(coded["w"].size) == 1, np.nan, coded["w"]))
        elif kind == "inf":
            arrays["b"] = Array(np.full(coded["b"].shape, np.inf))
        elif kind == "int-dtype":
            arrays["w"] = Array(np.arange(coded["w"].size))
        elif kind == "corrupt-bytes":
            arrays["w"] = Array(dtype="float64", shape=(3,), stype="numpy.ndarray", data=b"garbage")
        elif kind == "truncated-bytes":
            good = Array(coded["w"])
            arrays["w"] = Array(dtype=good.dtype, shape=good.shape, stype=good.stype,
                                data=good.data[:-8])
        elif kind == "object-dtype":  # a .npy header announcing pickled objects
            header = io.BytesIO()
            np.lib.format.write_array_header_1_0(
                header, {"descr": "|O", "fortran_order": False, "shape": (3,)}
            )
            data = header.getvalue() + bytes(24)
            arrays["w"] = Array(dtype="object", shape=(3,), stype="numpy.ndarray", data=data)
        elif kind == "wrong-stype":
            good = Array(coded["w"])
            arrays["w"] = Array(dtype=good.dtype, shape=good.shape, stype="torch", data=good.data)
        elif kind == "list-count":
            meta["num-examples"] = [1.0, 2.0]
        elif kind == "str-compute":
            _force(meta, "compute-s", "fast")
        elif kind == "list-app-metric":
            meta["metric.train_loss"] = [0.5, 0.5]
        elif kind == "nan-count":
            meta["num-examples"] = float("nan")
        elif kind == "negative-compute":
            meta["compute-s"] = -1.0
        elif kind == "other-worker":
            meta["worker"] = 1
        elif kind == "other-round":
            meta["round"] = 99
        else:
            raise AssertionError(kind)
        records = {PROTOCOL_KEY: ArrayRecord(arrays), META_KEY: meta}
    return Message(RecordDict(records), reply_to=msg)


class FixedArrivals(TraceReplay):
    """Virtual arrival times from a table: ``times[round][worker]`` seconds after round start
    (``TraceReplay`` with an in-memory trace)."""

    def __init__(self, times: Mapping[int, list[float]]):
        table = np.zeros((max(times) + 1, max(len(row) for row in times.values())))
        for r, row in times.items():
            table[r, : len(row)] = row
        self.name, self.table, self.load_scaled = "fixed", table, False


class DevicesOff(FixedArrivals):
    """:class:`FixedArrivals` whose ``inf`` entries are devices that went off: the server hears
    that worker ``w`` of round ``r`` will never reply ``notices[r][w]`` seconds after the round
    starts (the ``unavailable_notice`` a latency model of devices answers: ``inf`` for a
    worker that replies, one not in ``notices``)."""

    def __init__(self, times: Mapping[int, list[float]],
                 notices: Mapping[int, Mapping[int, float]]):
        super().__init__(times)
        self.notices = {r: dict(row) for r, row in notices.items()}

    def unavailable_notice(self, worker: int, round_index: int, load: float = 1.0) -> float:
        return float(self.notices.get(round_index, {}).get(worker, math.inf))


# =============================================================================== runner
class SamplingRecorder(FedAvg):
    """FedAvg that records the nodes it samples each round."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.sampled: list[list[int]] = []

    def configure_train(self, server_round, arrays, config, grid):
        messages = list(super().configure_train(server_round, arrays, config, grid))
        self.sampled.append([m.metadata.dst_node_id for m in messages])
        return messages


@dataclass
class Run:
    strategy: GradientCoding
    result: Any
    models: dict[int, dict[str, np.ndarray]]  # model after round r (0: initial)
    grid: Any

    @property
    def rows(self) -> list[dict[str, Any]]:
        return self.strategy.history


def run(
    n: int,
    *,
    code: str = "frc",
    s: int = 1,
    rounds: int = 1,
    faults: Mapping[tuple[int, int], str] | None = None,
    inner: Strategy | None = None,
    timing: str = "virtual",
    grid: Any = None,
    delay: Callable[[int, int], float] | None = None,
    **options: Any,
) -> Run:
    """``rounds`` rounds of ``GradientCoding(inner)`` on ``n`` in-process nodes."""
    if grid is None:
        mods = [fault_mod(faults), gradient_coding_mod] if faults else [gradient_coding_mod]
        grid = InProcessGrid(make_app(*mods), n, delay=delay)
    options.setdefault("measured_compute", False)
    strategy = GradientCoding(
        inner if inner is not None else FedAvg(fraction_evaluate=0.0),
        code=code,
        s=s,
        timing=timing,
        seed=0,
        **options,
    )
    models: dict[int, dict[str, np.ndarray]] = {}

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> None:
        models[server_round] = as_dict(arrays)

    result = strategy.start(
        grid=grid,
        initial_arrays=initial_arrays(),
        num_rounds=rounds,
        train_config=ConfigRecord({"lr": LR}),
        evaluate_fn=evaluate_fn,
    )
    return Run(strategy, result, models, grid)


# =============================================================================== clocks
class ScriptedClock:
    """A round clock of one's own for code-policy tests: what a policy asks of a clock (the
    policy-facing part of :class:`~fl_gradcode.flower.clock.Clock`), answered from a script.

    ``free_at``: node -> clock time its current work ends (absent: free); ``queues``: whether
    work can be queued behind a busy member's current job (when not, rounds skip busy
    members, as under wallclock timing)."""

    timing = "scripted"

    def __init__(self, *, now: float = 0.0, queues: bool = True,
                 free_at: Mapping[int, float] | None = None,
                 last_duration: float | None = None, straggler_timeout: float = 10.0) -> None:
        self.now = self.round_start = float(now)
        self.queues = queues
        self.free_at = dict(free_at or {})
        self.last_duration = last_duration
        self.straggler_timeout = straggler_timeout
        self.stop_at_end = False
        self.backlog: dict[int, float] = {}

    def busy_mode(self, requested: str) -> str:
        return requested if self.queues else "skip"

    def queueable(self, nodes, within_s: float = float("inf")) -> set[int]:
        if not self.queues:
            return set()
        return {n for n in nodes if self.free_at.get(n, 0.0) - self.now < within_s}

    def busy_members(self, cohort, grid: Any = None) -> set[int]:
        return {n for n in cohort if self.free_at.get(n, 0.0) > self.now}
