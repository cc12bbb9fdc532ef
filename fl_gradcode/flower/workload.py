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
from logging import WARNING

import numpy as np
from flwr.common.logger import log

from ..codes import GradientCode
from ..latency import LatencyModel, client_delay, failure_notice
from .protocol import Identity
from .round_state import partition_key

__all__ = ["Workload"]


def sampled_share(identities: Mapping[int, Identity],
                  cohort: list[int]) -> tuple[int, int] | None:
    """``(held, total)`` when the cohort holds only part of the app's data (a sampled
    cohort): the distinct data partitions its nodes' identities name, of the app's total;
    ``None`` when it holds all of it or a member's identity is unknown."""
    known = [identities.get(node) for node in cohort]
    if None in known:
        return None
    held = set(known)
    total = max(identity.num_partitions for identity in held)  # type: ignore[union-attr]
    return (len(held), total) if len(held) < total or total != len(cohort) else None


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
        self.warned_repartition = False

    def partitions(self, code: GradientCode, cohort: list[int]) -> list[Identity]:
        """Code partition j -> the data partition it stands for: cohort member j's own, or
        (if the code has fewer partitions than clients and the cohort holds all the app's
        data) the app's partition j of k.

        Raises ``ValueError`` when the code has ``k`` partitions for a cohort that holds
        only part of the app's data (a sampled cohort): the app's data split into ``k``
        partitions is all of it, so the round would train on every client's data instead of
        the cohort's."""
        if code.k == len(cohort):
            return [self.identities[node] for node in cohort]
        share = sampled_share(self.identities, cohort)
        if share is not None:
            held, total = share
            raise ValueError(
                f"code {code.name} has k={code.k} partitions for a cohort of {len(cohort)} "
                f"clients holding {held} of the app's {total} data partitions: split "
                f"into k partitions, the app's data would be all {total} partitions, not "
                f"the cohort's. Use a code with one partition per cohort member (for "
                f"comm-efficient: s + m dividing the cohort size {len(cohort)}; or "
                f"grouped-rs), or train every node each round")
        if not self.warned_repartition:
            self.warned_repartition = True
            log(WARNING, "code %s has k=%d partitions for %d clients: the app's data is split "
                "into k partitions (partition-id=j, num-partitions=k); the round's sum is "
                "the same only if the app's update is one full-batch gradient (local epochs "
                "or minibatches on other partitions train another model)", code.name,
                code.k, len(cohort))
        return [Identity(j, code.k) for j in range(code.k)]

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
