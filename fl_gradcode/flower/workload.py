"""What each member of a coded round computes, and how long the latency model says it takes.

A code partition stands for a data partition: cohort member ``j``'s own when the code has one
partition per client, else the app's partition ``j`` of ``k``. A worker's load is its examples
over one client's share (counted in partitions while sizes are unknown), the unit in which
load-scaled latency models stretch (Lee, Lam, Pedarsani, Papailiopoulos, Ramchandran,
"Speeding Up Distributed Machine Learning Using Codes", IEEE Trans. Inf. Theory 2018,
https://arxiv.org/abs/1512.02673).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from ..codes import GradientCode
from ..latency import LatencyModel, client_delay, failure_notice
from .protocol import Identity
from .round_state import partition_key

__all__ = ["Workload"]


class Workload:
    """Partitions, loads and simulated delays of a round's workers.

    ``identities`` (node -> its data partition) and ``partition_sizes`` (data partition key ->
    checked size) are the server's live records, read at each call; ``latency`` the model
    sampled per (``seed``, round, partition id).
    """

    def __init__(self, identities: Mapping[int, Identity],
                 partition_sizes: Mapping[tuple[int, int], float],
                 latency: LatencyModel | None, seed: int) -> None:
        self.identities = identities
        self.partition_sizes = partition_sizes
        self.latency = latency
        self.seed = seed

    def partitions(self, code: GradientCode, cohort: list[int]) -> list[Identity]:
        """Code partition j -> the data partition it stands for: cohort member j's own.

        Raises ``ValueError`` for a code without one partition per member (``k`` partitions
        would be the data split another way than the clients': a policy of one's own must
        plan codes with ``k`` = the cohort size)."""
        if code.k != len(cohort):
            raise ValueError(
                f"code {code.name} has k={code.k} partitions for a cohort of {len(cohort)} "
                "clients: a round codes the members' own data partitions, one per member; "
                "plan a code with k = the cohort size (CommunicationEfficientCode("
                "own_partitions=True), or the strategy's code_for(cohort size))")
        return [self.identities[node] for node in cohort]

    def load(self, code: GradientCode, worker: int, partitions: list[Identity]) -> float:
        """The worker's examples over one client's share (partitions if sizes are unknown)."""
        assigned = code.assignment(worker)
        known = [self.partition_sizes.get(partition_key(p)) for p in partitions]
        sizes = [x for x in known if x is not None]
        if not sizes:
            return float(len(assigned)) * code.n / code.k
        mean = float(np.mean(sizes))
        total = sum(x if x is not None else mean for x in known)
        share = total / code.n
        if share <= 0:
            return float(len(assigned)) * code.n / code.k
        mine = sum(known[j] if known[j] is not None else mean for j in assigned)
        return float(mine / share)

    def delay(self, node: int, server_round: int, load: float,
              start_s: float | None = None) -> float:
        """The simulated delay of ``node``: keyed by its partition id, so that a node keeps
        its latency profile (persistently slow, its trace worker) whichever cohort samples it
        and wherever it sits in the cohort (the worker index when every node is sampled and
        the partition ids are ``0..n-1``, as in simulation: the same delays as before).
        ``start_s``: the job's start on the clock (devices' availability is read there)."""
        if self.latency is None:
            return 0.0
        return client_delay(self.latency, worker=self.latency_key(node),
                            round_index=server_round, load=load, seed=self.seed,
                            start_s=start_s)

    def failure_notice(self, node: int, server_round: int, load: float,
                       start_s: float | None = None) -> float:
        """Seconds after its job's start (``start_s``) at which the server hears that
        ``node``, whose delay is infinite, will never reply (``inf``: never; keyed as
        :meth:`delay`)."""
        if self.latency is None:
            return math.inf
        return failure_notice(self.latency, worker=self.latency_key(node),
                              round_index=server_round, load=load, seed=self.seed,
                              start_s=start_s)

    def latency_key(self, node: int) -> int:
        """The worker a node's latency draws are keyed by: its partition id (the node id
        when it has no identity)."""
        identity = self.identities.get(node)
        return identity.partition_id if identity is not None else node

    def sampled_delay(self, code: GradientCode, worker: int, node: int, server_round: int,
                      partitions: list[Identity], start_s: float | None = None) -> float:
        """The delay at the worker's load (0 without a latency model, the load not
        computed)."""
        if self.latency is None:
            return 0.0
        return self.delay(node, server_round, self.load(code, worker, partitions), start_s)
