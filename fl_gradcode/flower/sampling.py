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
pass an ``order_key`` that names a node by something stable (e.g. its data partition id) so
that runs on different node ids draw the same partitions.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

__all__ = ["SortedNodesGrid", "sampling_seed", "seeded_sampling"]

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
        return sorted(nodes, key=self.order_key) if self.order_key else sorted(nodes)

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
                    order_key: Callable[[int], Any] | None = None) -> S:
    """Make ``strategy`` (a Flower ``Strategy`` sampling with ``random``, e.g. ``FedAvg``, or
    the inner strategy of ``GradientCoding``) draw its cohorts from ``seed``: round ``r``'s
    train cohort depends only on ``(seed, r)``, the node set and the strategy's own sample
    size. Returns the same strategy object (its ``configure_train`` and
    ``configure_evaluate`` are wrapped on the instance; for ``GradientCoding``, those of its
    inner strategy, which samples the cohort).

    ``order_key``: the canonical order of the nodes before sampling (default: node id).
    Refuses a non-integer seed and a strategy wrapped twice (the second seed would silently
    win)."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed={seed!r}: expected an integer")
    from .wrapper import GradientCoding

    if isinstance(strategy, GradientCoding):  # the inner strategy samples the cohort
        seeded_sampling(strategy.inner, seed, order_key)
        return strategy
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
