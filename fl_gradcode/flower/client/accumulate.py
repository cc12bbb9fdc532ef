"""The coded accumulation of one worker: ``sum_j B[i,j] n_j (theta_j - theta)`` over its
partitions (Tandon, Lei, Dimakis, Karampatziakis, "Gradient Coding: Avoiding Stragglers in
Distributed Learning", ICML 2017, https://arxiv.org/abs/1612.03301), with the coded count
``sum_j B[i,j] n_j``, the partitions' example counts, the example-weighted scalar metrics and
the compute time charged."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..encoding import coded_update
from .partitions import PartitionResult

__all__ = ["CodedSum"]


class CodedSum:
    """The running coded sum. Released deltas (a per-partition DP release) are summed as
    they come, in float64; otherwise the app's arrays are kept (read-only views, no copy)
    and summed once at the end, every block once (:func:`~fl_gradcode.flower.encoding.
    coded_update`)."""

    def __init__(self, theta: Mapping[str, np.ndarray], released: bool) -> None:
        self.released = released
        self.coded = {name: np.zeros(v.shape) for name, v in theta.items()} if released else {}
        self.weights: list[float] = []
        self.models: list[dict[str, np.ndarray]] = []
        self.count = 0.0  # sum_j B[i,j] n_j
        self.compute_s = 0.0
        self.sizes: list[float] = []  # n_j, in order
        self.metric_sums: dict[str, float] | None = None  # over the keys every partition has
        self.own_metrics: list[dict[str, float | list[float]]] = []  # each partition's own

    def add(self, coefficient: float, result: PartitionResult,
            released: Mapping[str, np.ndarray] | None = None) -> None:
        """Add partition ``result`` with coefficient ``B[i,j]`` (``released``: its delta as
        released, when the release is per partition)."""
        # every replica is charged its own computation (a cached result costs what it cost)
        self.compute_s += result.compute_s
        weight = coefficient * result.num_examples
        if self.released:
            if released is None:
                raise ValueError("a per-partition DP release needs the released delta")
            for name, value in released.items():
                self.coded[name] += weight * value
        else:  # read-only views of the app's reply: no copy until the coded sum
            self.weights.append(weight)
            self.models.append(result.arrays)
        self.count += weight
        self.sizes.append(result.num_examples)
        self.own_metrics.append(result.metrics)
        if self.metric_sums is None:  # the coded metrics: numbers (a list goes per partition)
            self.metric_sums = {k: 0.0 for k, v in result.metrics.items()
                                if isinstance(v, float)}
        for k in list(self.metric_sums):
            value = result.metrics.get(k)
            if isinstance(value, float):
                self.metric_sums[k] += weight * value
            else:
                del self.metric_sums[k]

    def total(self, theta: Mapping[str, np.ndarray],
              wire: Mapping[str, np.dtype] | None) -> dict[str, np.ndarray]:
        """The coded arrays (summed in the ``wire`` dtypes where given); the app's arrays are
        released afterwards."""
        coded = self.coded if self.released else coded_update(self.weights, self.models, theta,
                                                              wire)
        self.models.clear()
        return coded
