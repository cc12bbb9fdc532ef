"""Seeded cohort sampling for any Flower strategy: one seed, the same cohorts in every run.

Flower's strategies (``FedAvg`` and its subclasses) sample each round's cohort with
``random.sample`` over ``grid.get_node_ids()``: the process-global ``random`` module, moved by
anything else that draws from it, over the nodes in whatever order the grid lists them. Two
runs with one seed (a coded run and its rival, say) then train different cohorts, and their
comparison is not paired. :func:`seeded_sampling` fixes both without touching Flower's code:
around the strategy's own ``configure_train`` / ``configure_evaluate`` it

* seeds ``random`` from ``(seed, server round, "train" | "evaluate")`` and restores the
  caller's state after (nothing else's draws move, and nothing moves the sampling), and
* hands the strategy a view of the grid that lists the nodes in a canonical order (sorted by
  ``order_key``; default: the node id).

The strategy still samples with its own rule (``fraction_train``, ``min_train_nodes``, ...),
so what it means is unchanged: only which nodes are drawn becomes a function of the seed, the
round and the node set. In a deployment, where node ids are drawn when a SuperNode connects,
pass an ``order_key`` that names a node by something stable so that runs on different node
ids draw the same partitions: for ``GradientCoding``, ``order_key="partition"`` orders the
nodes by the data partition each names in the coding handshake (asked before the first
sampling, as the wrapper would ask it after).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

__all__ = ["PARTITION", "PartitionOrder", "SortedNodesGrid", "sampling_seed", "seeded_sampling"]

#: ``seeded_sampling(coding, seed, order_key=PARTITION)``: nodes in data-partition order.
PARTITION = "partition"

S = TypeVar("S")


def sampling_seed(seed: int, server_round: int, stage: str) -> int:
    """The ``random`` seed of one round's sampling (a 64-bit digest of the three values)."""
    digest = hashlib.sha256(f"fl-gradcode-sampling/{seed}/{server_round}/{stage}".encode())
    return int.from_bytes(digest.digest()[:8], "big")


class SortedNodesGrid:
    """A view of ``grid`` whose ``get_node_ids`` lists the nodes sorted by ``order_key``;
    everything else is the grid's own."""

    def __init__(self, grid: Any, order_key: Callable[[int], Any] | None = None) -> None:
        self.grid = grid
        self.order_key = order_key

    def get_node_ids(self) -> list[int]:
        nodes = list(self.grid.get_node_ids())
        prepare = getattr(self.order_key, "prepare", None)
        if prepare is not None:  # a key that must learn something of the nodes first
            prepare(self.grid, nodes)
        return sorted(nodes, key=self.order_key) if self.order_key else sorted(nodes)


class PartitionOrder:
    """A node's place in the order: the data partition it named in ``GradientCoding``'s
    handshake (``membership``), nodes with no accepted claim after every claimed partition
    (by node id). ``prepare`` asks the nodes not asked yet, on the grid the wrapper asks
    them on (the handshake is asked once per node and kept)."""

    def __init__(self, membership: Any) -> None:
        self.membership = membership

    def prepare(self, grid: Any, nodes: list[int]) -> None:
        self.membership.handshake(getattr(grid, "inner", grid), nodes)

    def __call__(self, node: int) -> tuple[int, int, int]:
        claim = self.membership.claims.get(node)
        if claim is None or node in self.membership.verdicts():
            return (1, 0, node)
        return (0, int(claim.partition_id), node)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.grid, name)


@contextmanager
def _seeded(seed: int) -> Iterator[None]:
    saved = random.getstate()
    random.seed(seed)
    try:
        yield
    finally:
        random.setstate(saved)


def seeded_sampling(strategy: S, seed: int,
                    order_key: Callable[[int], Any] | str | None = None) -> S:
    """Make ``strategy`` (a Flower ``Strategy`` sampling with ``random``, e.g. ``FedAvg``, or
    the inner strategy of ``GradientCoding``) draw its cohorts from ``seed``: round ``r``'s
    train cohort depends only on ``(seed, r)``, the node set and the strategy's own sample
    size. Returns the same strategy object (its ``configure_train`` and
    ``configure_evaluate`` are wrapped on the instance; for ``GradientCoding``, those of its
    inner strategy, which samples the cohort).

    ``order_key``: the canonical order of the nodes before sampling (default: node id);
    ``"partition"`` (:data:`PARTITION`, ``GradientCoding`` only): the data partition each node
    names (:class:`PartitionOrder`), so that runs whose node ids differ (a deployment's) draw
    the same partitions. Refuses a non-integer seed, ``"partition"`` for a strategy that
    runs no coding handshake, and a strategy wrapped twice (the second seed would silently
    win)."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed={seed!r}: expected an integer")
    from .wrapper import GradientCoding

    if isinstance(strategy, GradientCoding):  # the inner strategy samples the cohort
        key = PartitionOrder(strategy.membership) if order_key == PARTITION else order_key
        seeded_sampling(strategy.inner, seed, key)
        return strategy
    if isinstance(order_key, str):
        raise ValueError(f"order_key={order_key!r}: {PARTITION!r} orders the nodes by the "
                         "partition each names in GradientCoding's handshake: wrap the "
                         f"GradientCoding strategy, not {type(strategy).__name__}")
    if getattr(strategy, "sampling_seed", None) is not None:
        raise ValueError(f"{type(strategy).__name__} already samples from seed "
                         f"{strategy.sampling_seed!r}: wrap it once")  # type: ignore[attr-defined]
    for stage in ("train", "evaluate"):
        name = f"configure_{stage}"
        original = getattr(strategy, name)

        def configure(server_round: int, arrays: Any, config: Any, grid: Any,
                      _original: Callable[..., Iterable[Any]] = original,
                      _stage: str = stage) -> list[Any]:
            with _seeded(sampling_seed(seed, server_round, _stage)):
                return list(_original(server_round, arrays, config,
                                      SortedNodesGrid(grid, order_key)))

        setattr(strategy, name, configure)
    strategy.sampling_seed = seed  # type: ignore[attr-defined]
    return strategy
