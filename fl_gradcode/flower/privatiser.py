"""The privatiser: the partition sizes a round's noise is sized from, and the noise itself.

A trusted server (``dp-mode=central``) releases the decoded average with Gaussian noise of
standard deviation ``sigma C max_j |alpha_j| n_j / count`` (the sensitivity of the average to
one partition's clipped update: :func:`~fl_gradcode.flower.reports.central_noise_scale`),
where the sizes ``n_j`` are only those the replicas of each partition agree on
(:func:`~fl_gradcode.flower.reports.agree_sizes`): a client cannot shrink the noise by
claiming a small partition. Under ``partition`` DP with independent noise the round is
accounted at the code's effective multiplier
(:func:`~fl_gradcode.privacy.independent_noise_multiplier`).

References:
    Dwork, Roth, "The Algorithmic Foundations of Differential Privacy", 2014 (the Gaussian
    mechanism, sensitivity).
    McMahan, Ramage, Talwar, Zhang, "Learning Differentially Private Recurrent Language
    Models", ICLR 2018, https://arxiv.org/abs/1710.06963 (central DP for federated averaging).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from logging import WARNING
from typing import Any

import numpy as np
from flwr.common.logger import log

from ..codes import Decoding, GradientCode
from ..privacy import DPConfig, ServerNoise, independent_noise_multiplier
from .protocol import Identity
from .reports import agree_sizes, central_noise_scale, outlying_sizes
from .round_state import partition_key

__all__ = ["Privatiser", "SizesView"]


class SizesView(Mapping[tuple[int, int], float]):
    """A read-only view of the checked partition sizes (it pickles, unlike a mappingproxy)."""

    def __init__(self, sizes: Mapping[tuple[int, int], float]) -> None:
        self._sizes = sizes

    def __getitem__(self, key: tuple[int, int]) -> float:
        return self._sizes[key]

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(self._sizes)

    def __len__(self) -> int:
        return len(self._sizes)

    def __repr__(self) -> str:
        return repr(dict(self._sizes))


class Privatiser:
    """Checked partition sizes and the central noise sized from them.

    Args:
        dp: the run's DP configuration.
        mechanism: its mechanism (``server_noise_std(scale)``).
        server_noise: the source of the server's noise (keyed draws).
        nonce: the run's nonce, part of every draw's key.
        partition_sizes: where to keep the run's checked sizes (``None``: a dict of its own).

    The privatiser is the one owner of the run's checked sizes by ``(partition-id,
    num-partitions)``: :attr:`partition_sizes` is a read-only view of them, updated each round
    (the workload reads it to weigh workers' loads).
    """

    def __init__(self, dp: DPConfig, mechanism: Any, server_noise: ServerNoise, nonce: str,
                 partition_sizes: dict[tuple[int, int], float] | None = None) -> None:
        self.dp = dp
        self.mechanism = mechanism
        self.server_noise = server_noise
        self.nonce = nonce
        self._sizes: dict[tuple[int, int], float] = (
            {} if partition_sizes is None else partition_sizes)
        self.partition_sizes: Mapping[tuple[int, int], float] = SizesView(self._sizes)
        self.confirmed_sizes: dict[tuple[int, int], float] = {}  # by >= 2 agreeing replicas

    def check_sizes(self, code: GradientCode, partitions: Sequence[Identity],
                    reported: Mapping[int, Sequence[float]],
                    round_number: int, bound: int | None = None,
                    ) -> tuple[dict[int, float], dict[int, str]]:
        """Cross-check the replicas' ``partition-sizes`` (``reported``: worker -> sizes, each
        already consistent with its reply's ``num-examples``).

        Returns the agreed sizes by code partition (they become ``partition_sizes``; confirmed
        by two or more replicas, they decide later ties) and the outvoted workers with the
        reason to reject them. ``bound``: ``verify=True``'s coalition bound
        (:func:`~fl_gradcode.flower.reports.agree_sizes`).
        """
        confirmed = {j: self.confirmed_sizes[partition_key(p)] for j, p in enumerate(partitions)
                     if partition_key(p) in self.confirmed_sizes}
        agreed, excluded, confirmed_now = agree_sizes(code, reported, confirmed, bound)
        for j, size in agreed.items():
            self._sizes[partition_key(partitions[j])] = size
        for j, size in confirmed_now.items():
            self.confirmed_sizes[partition_key(partitions[j])] = size
        for j, size, median in outlying_sizes(agreed):
            log(WARNING, "round %d: partition %s reports %g examples, %.3g times the median "
                "(%g); no replica contradicts it", round_number, partition_key(partitions[j]),
                size, size / median, median)
        return agreed, excluded

    @property
    def central(self) -> bool:
        """Whether the server adds the noise (``dp-mode=central``)."""
        return self.dp.mode == "central"

    def noise_std(self, code: GradientCode, decoding: Decoding, used: Iterable[int], count: float,
                  sizes: Mapping[int, float], round_number: int) -> float | None:
        """Std of the trusted server's noise on the decoded average delta: ``sigma C`` times
        the largest weight one partition has in it, ``max_j |alpha_j| n_j / count``, from the
        checked ``sizes`` of the partitions the ``used`` replies hold (never below
        ``sigma C / k``). ``None`` (the round is not released): no such sizes."""
        held = {int(j) for w in used for j in code.assignment(w)}
        agreed = {j: n for j, n in sizes.items() if j in held}
        try:
            scale = central_noise_scale(decoding, agreed, count)
        except ValueError as exc:
            log(WARNING, "round %d: central DP noise cannot be sized (%s); round skipped",
                round_number, exc)
            return None
        return self.mechanism.server_noise_std(scale)

    def draw(self, dim: int, std: float, round_number: int) -> np.ndarray:
        """The round's noise vector (``dim`` values), keyed by the round and the run nonce."""
        return self.server_noise.draw(dim, std, round_number, self.nonce)

    def noise_multiplier(self, code: GradientCode,
                         sizes: Mapping[int, float] | None = None) -> float | None:
        """The noise multiplier the round is accounted at: with ``dp-noise=independent`` under
        ``partition`` DP, the round's code's effective one (the server can average a
        partition's replicas, each weighted by its examples: ``sizes``, the round's agreed
        size of each code partition, a partition without one taken at its worst); ``None``
        (the accountant's own) otherwise."""
        if self.dp.mode == "partition" and self.dp.noise == "independent":
            known = {} if sizes is None else sizes
            return independent_noise_multiplier(
                np.asarray(code.B, dtype=np.float64), self.dp.noise_multiplier,
                np.array([float(known.get(j, math.nan)) for j in range(code.k)]))
        return None
