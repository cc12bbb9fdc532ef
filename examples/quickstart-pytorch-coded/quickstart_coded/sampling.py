"""quickstart_coded: cohorts sampled by data partition from the run seed.

Flower's ``FedAvg`` samples ``fraction_train`` of the connected nodes with ``random.sample``
over their node ids, which the SuperLink draws at random when a SuperNode connects: two runs
with the same ``seed`` train on different partitions, and a coded run cannot be compared with
an uncoded one. :class:`PartitionSampledFedAvg` samples *partitions* instead: in round ``r`` it
draws a permutation of ``0..num-partitions-1`` from ``(seed, r)`` and takes, in that order, the
first ``max(int(connected * fraction_train), min_train_nodes)`` partitions whose node passed
the gradient-coding handshake. With every node up, two runs with one seed train the same
partitions in every round, whatever the node ids.

The partition ids come from the handshake that ``GradientCoding`` runs anyway (``identify``,
answered by ``gradient_coding_mod`` from the node config): give the strategy the wrapper's
``membership`` after building the wrapper. With ``fraction_train=1`` it is Flower's FedAvg.
"""

from __future__ import annotations

from collections.abc import Iterable
from logging import INFO
from time import sleep
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.common.logger import log
from flwr.serverapp.strategy import FedAvg


class PartitionSampledFedAvg(FedAvg):
    """``FedAvg`` whose train cohorts are drawn by partition id from ``seed``.

    Set ``membership`` (``GradientCoding(...).membership``) before the run starts.
    """

    def __init__(self, *, seed: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed={seed!r}: expected an integer (the run config's 'seed')")
        self.seed = seed
        self.membership: Any = None

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Any
    ) -> Iterable[Message]:
        if self.fraction_train == 0.0:
            return []
        if self.fraction_train == 1.0:  # every node: nothing to draw
            return super().configure_train(server_round, arrays, config, grid)
        if self.membership is None:
            raise RuntimeError(
                "PartitionSampledFedAvg needs the partition ids the gradient-coding handshake "
                "learns: set strategy.membership = GradientCoding(strategy, ...).membership"
            )
        nodes = self._wait_for_nodes(grid)
        sample_size = max(int(len(nodes) * self.fraction_train), self.min_train_nodes)
        membership = self.membership
        # node ids are asked once and kept; a node whose handshake failed is asked again
        membership.handshake(getattr(grid, "inner", grid), nodes)
        excluded = membership.verdicts()
        owner = {membership.claims[n].partition_id: n for n in sorted(nodes)
                 if n in membership.claims and n not in excluded}
        num_partitions = membership.num_partitions() or 0
        order = np.random.default_rng([self.seed, server_round]).permutation(num_partitions)
        chosen = [owner[int(p)] for p in order if int(p) in owner][:sample_size]
        log(INFO, "configure_train: sampled partitions %s (%d of %d nodes; seed %d)",
            sorted(membership.claims[n].partition_id for n in chosen), len(chosen), len(nodes),
            self.seed)
        config["server-round"] = server_round
        record = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config})
        return self._construct_messages(record, chosen, MessageType.TRAIN)

    def _wait_for_nodes(self, grid: Any) -> list[int]:
        """The connected nodes, once at least ``min_available_nodes`` are (as Flower waits)."""
        while len(nodes := list(grid.get_node_ids())) < self.min_available_nodes:
            log(INFO, "Waiting for nodes to connect: %d connected (minimum required: %d).",
                len(nodes), self.min_available_nodes)
            sleep(1)
        return nodes
