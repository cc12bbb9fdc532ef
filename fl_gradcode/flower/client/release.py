"""The DP release of a worker's partitions (:mod:`fl_gradcode.privacy`): under
``dp='partition'`` and ``dp='central'`` each partition's delta is released on its own
(noised with the partition's keyed noise, or clipped for the server's noise) before it enters
the coded sum, and the app's scalar metrics are withheld (un-noised per-partition values would
undo the release)."""

from __future__ import annotations

import numpy as np

from ...privacy import DPConfig, NoiseKeys, make_mechanism
from ..binding import partition_nonce
from ..protocol import Instruction

__all__ = ["WITHHELD_METRICS", "PartitionRelease"]

#: dp modes under which the app's scalar metrics are withheld (not sent).
WITHHELD_METRICS = ("partition", "central")


class PartitionRelease:
    """The instruction's DP mechanism (built, and its parameters checked, on creation)."""

    def __init__(self, instruction: Instruction) -> None:
        self.mechanism = make_mechanism(
            DPConfig(
                mode=instruction.dp,
                clip_norm=instruction.clip_norm,
                noise_multiplier=instruction.noise_multiplier,
                noise=instruction.dp_noise,
            )
        )
        #: each partition's delta is released on its own, before coding
        self.per_partition = self.mechanism.mode in ("partition", "central")
        #: the app's scalar metrics are not sent
        self.withholds_metrics = self.mechanism.mode in WITHHELD_METRICS

    def release(self, delta: dict[str, np.ndarray], instruction: Instruction,
                keys: NoiseKeys | None, partition: int,
                num_partitions: int) -> dict[str, np.ndarray]:
        """Partition ``partition`` (of ``num_partitions``)'s delta (float64 arrays) as
        released, flattened in ``delta``'s order for the mechanism and reshaped back."""
        names = list(delta)
        flat = np.concatenate([delta[name].reshape(-1) for name in names])
        flat = self.mechanism.release(
            flat,
            keys=keys,
            partition=partition,
            server_round=instruction.round,
            nonce=partition_nonce(instruction.nonce, num_partitions),
            worker=instruction.worker,
        )
        released, start = {}, 0
        for name in names:
            size = delta[name].size
            released[name] = flat[start : start + size].reshape(delta[name].shape)
            start += size
        return released
