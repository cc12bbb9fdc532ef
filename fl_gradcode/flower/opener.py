"""Opening a coded round: who gets work, with which code, from when.

:class:`RoundOpener` asks the code policy (:mod:`~fl_gradcode.flower.policy`) for the round's
code over the admitted cohort, settles the members sent nothing (busy and not queued,
excluded by ``s="auto"``, quarantined), starts the clock at the deadline policy's deadline and
builds the round's :class:`~fl_gradcode.flower.round_state.RoundPlan` (its one owner). The
gradient code's placement of partitions on workers follows Tandon, Lei, Dimakis,
Karampatziakis, "Gradient Coding: Avoiding Stragglers in Distributed Learning", ICML 2017,
https://arxiv.org/abs/1612.03301.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from flwr.app import RecordDict

from ..codes import GradientCode
from . import protocol
from .clock import Clock
from .deadline_policy import DeadlinePolicy
from .decoder import ReplyLayout
from .grid import EarlyReturnGrid
from .policy import CodePolicy
from .quarantine import Quarantine
from .round_state import RoundPlan, array_key
from .verifier import RoundVerifier
from .workload import Workload

__all__ = ["OpenedRound", "RoundOpener"]


@dataclass(frozen=True)
class OpenedRound:
    """A round just opened: its plan, the members sent nothing (``idle``) and the busy ones
    whose work is queued behind their current job (``queued``)."""

    plan: RoundPlan
    idle: frozenset[int]
    queued: frozenset[int]


class RoundOpener:
    """Plans and opens each coded round (one job: the start of a round).

    ``wire_for(code)``: the reply dtype of a code (``"model"`` or ``"float64"``);
    ``code_options``: the code's options (the integrity probe reads them); ``verifier``:
    builds the round's integrity probe; ``round_timeout``: seconds to wait for a busy cohort
    to free up."""

    def __init__(self, *, policy: CodePolicy, clock: Clock, deadlines: DeadlinePolicy,
                 quarantine: Quarantine, workload: Workload, verifier: RoundVerifier,
                 wire_for: Callable[[GradientCode], str],
                 code_options: Mapping[str, Any], round_timeout: float,
                 arrays_key: str = "arrays") -> None:
        self.policy, self.clock, self.deadlines = policy, clock, deadlines
        self.quarantine, self.workload, self.verifier = quarantine, workload, verifier
        self.wire_for = wire_for
        self.code_options, self.round_timeout = code_options, float(round_timeout)
        self.arrays_key = arrays_key

    def plan(self, server_round: int, grid: Any, cohort: list[int],
             absent: frozenset[int] = frozenset(),
             ) -> tuple[GradientCode, set[int], set[int], set[int]]:
        """``(code, idle, queued, held)``: the round's code from the code policy; the members
        sent nothing (busy and not queued, excluded by ``s="auto"``, quarantined, ``absent``:
        placeholders of partitions no node can work on, priced as busy members that never
        start); the busy members whose work is queued behind their current job; the
        quarantined ones."""
        held = self.quarantine.held(server_round, cohort)  # stragglers: no work
        if isinstance(grid, EarlyReturnGrid):
            grid.collect_late()
        policy, clock = self.policy, self.clock
        present = [node for node in cohort if node not in absent]
        busy_nodes = clock.busy_members(present, grid) | set(absent)
        code = policy.plan(cohort, busy_nodes)
        excluded = {cohort[w] for w in policy.excluded_workers()}
        queued = policy.queued(busy_nodes, cohort) - excluded - absent
        if busy_nodes | excluded >= set(cohort) and not queued:  # never spend a round on nothing
            clock.wait_for_free(present, grid, self.round_timeout)
            busy_nodes = clock.busy_members(present, grid) | set(absent)
            queued = policy.queued(busy_nodes, cohort) - excluded - absent
        queued = queued - held  # quarantined: no work
        return code, (busy_nodes | held | excluded) - queued, queued, held

    def open(self, server_round: int, grid: Any, cohort: list[int],
             content: RecordDict, absent: frozenset[int] = frozenset()) -> OpenedRound:
        """Plan the round (``content``: the inner strategy's train
        content, holding the global arrays; ``absent``: the cohort's placeholders, sent
        nothing); the clock starts at the round's deadline."""
        code, idle, queued, held = self.plan(server_round, grid, cohort, absent)
        partitions = self.workload.partitions(code, cohort)
        key = array_key(content, self.arrays_key)
        theta = {name: protocol.array_view(arr)
                 for name, arr in content.array_records[key].items()}
        excluded_workers = self.policy.excluded_workers()
        excluded = {cohort[w] for w in excluded_workers}
        queued_workers = {w: node for w, node in enumerate(cohort) if node in queued}
        self.clock.start_round(queued_workers,
                               deadline=self.deadlines.round_deadline(self.policy.decision))
        reply_layout = ReplyLayout.of(code, theta).arrays
        wall_start = time.monotonic()
        wire = self.wire_for(code)
        plan = RoundPlan(
            number=server_round, code=code, cohort=tuple(cohort), partitions=tuple(partitions),
            busy=tuple(sorted(w for w, node in enumerate(cohort)
                              if node in idle and node not in excluded and node not in absent)),
            excluded=tuple(sorted(excluded_workers)), quarantined=tuple(sorted(held)),
            layout={name: tuple(a.shape) for name, a in theta.items()},
            reply_layout=reply_layout,
            dtypes={name: a.dtype for name, a in theta.items()},
            theta=theta,  # zero-copy views of the global arrays, model dtype
            array_key=key, wire=wire, wall_start=wall_start,
            probe=self.verifier.probe_for(server_round, code, reply_layout, self.code_options),
        )
        return OpenedRound(plan, frozenset(idle), frozenset(queued))
