"""Each member's train message of a coded round: the inner strategy's content plus the
protocol record that tells :func:`~fl_gradcode.flower.gradient_coding_mod` what to compute.

A worker computes the partitions of its row of the code's encoding matrix ``B`` and replies
with their combination weighted by the row's coefficients (Tandon, Lei, Dimakis,
Karampatziakis, "Gradient Coding", ICML 2017, https://arxiv.org/abs/1612.03301).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from flwr.app import Message, RecordDict

from ..privacy import DPConfig
from . import protocol
from .clock import Clock, job_start
from .decoder import instruction_chunks
from .protocol import Instruction
from .round_state import RoundPlan, payload_bytes
from .workload import Workload

__all__ = ["Dispatcher", "Requests"]


@dataclass(frozen=True)
class Requests:
    """Who was asked what in a round (owner: the dispatcher): worker -> its message, in worker
    order, and the payload bytes of every instruction (``bytes_down``). Messages the grid
    refused are the reply collector's record (:attr:`~.collector.Arrivals.unsent`)."""

    messages: Mapping[int, Message]
    bytes_down: int = 0


class Dispatcher:
    """Builds the members' messages of a round (its :class:`Requests`).

    ``seed`` and ``nonce`` key the app's public seeding and the DP noise; ``dp`` the clients'
    clipping and noise; the ``clock`` says what a worker sleeps and when it stops; the
    ``workload`` samples the delay; ``inner`` names the weight key of its aggregation. A
    worker's chunk coefficients are its code's own
    (:meth:`~fl_gradcode.codes.GradientCode.chunk_coefficients`).
    """

    def __init__(self, *, seed: int, nonce: str, dp: DPConfig, clock: Clock,
                 workload: Workload, inner: Any) -> None:
        self.seed = seed
        self.nonce = nonce
        self.dp = dp
        self.clock = clock
        self.workload = workload
        self.inner = inner

    def dispatch(self, plan: RoundPlan, content_of: Mapping[int, RecordDict],
                 idle: Collection[int]) -> Requests:
        """Every member's message but the ``idle`` ones' (``content_of``: node -> the inner
        strategy's content), in worker order."""
        messages = {worker: self.message(plan, worker, node, content_of[node])
                    for worker, node in enumerate(plan.cohort) if node not in idle}
        return Requests(MappingProxyType(messages),
                        sum(payload_bytes(msg) for msg in messages.values()))

    def message(self, plan: RoundPlan, worker: int, node: int, content: RecordDict) -> Message:
        """The message of one member: ``content`` and its coded instruction (partitions,
        coefficients, DP, timing, wire)."""
        code, partitions = plan.code, list(plan.partitions)
        assigned = list(code.assignment(worker))
        instruction = Instruction(
            op=protocol.OP_TRAIN, round=plan.number, worker=worker, seed=self.seed,
            nonce=self.nonce,
            partition_ids=tuple(partitions[j].partition_id for j in assigned),
            num_partitions=tuple(partitions[j].num_partitions for j in assigned),
            coefficients=tuple(float(c) for c in code.encoding_coefficients(worker)),
            dp=self.dp.mode, clip_norm=self.dp.clip_norm,
            noise_multiplier=self.dp.noise_multiplier, dp_noise=self.dp.noise,
            timing=self.clock.timing,
            delay_s=self.clock.instruction_delay(lambda: self.workload.sampled_delay(
                code, worker, node, plan.number, partitions, job_start(self.clock, worker))),
            weight_key=getattr(self.inner, "weighted_by_key", "num-examples"),
            wire=plan.wire, chunk_coefficients=instruction_chunks(code, worker),
            stop_after_s=self.clock.stop_after_s(plan.number),
        )
        return protocol.instruction_message(content, instruction, node, str(plan.number))
