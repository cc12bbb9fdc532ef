"""How much decoding amplifies the replies' rounding errors, sampled over decodable sets.

References:
    Tandon, Lei, Dimakis, Karampatziakis, "Gradient Coding: Avoiding Stragglers in Distributed
    Learning", ICML 2017, https://arxiv.org/abs/1612.03301 (the decoder whose coefficients
    multiply the rounding errors).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .base import GradientCode

__all__ = ["sampled_amplification"]


def sampled_amplification(code: GradientCode, seed: int = 0, samples: int = 24) -> float:
    """``max_F sum_i (sum_u |D_ui|) ||B_i||_1 / k`` over decodable sets ``F`` (all clients,
    ``samples`` random ``(n-s)``-subsets drawn with ``seed``, contiguous straggler bursts),
    ``D`` the code's chunk decoder of its minimum-norm decoding. 1 for uncoded and FRC."""
    rng = np.random.default_rng(seed)
    n, s = code.n, min(code.s, code.n - 1)
    row_l1 = np.abs(code.B).sum(axis=1)
    sets = [list(range(n))]
    sets += [sorted(rng.choice(n, size=n - s, replace=False).tolist()) for _ in range(samples)]
    sets += [[i for i in range(n) if (i - start) % n >= s] for start in range(0, n, max(1, n // 8))]
    worst = 0.0
    for received in sets:
        a = np.abs(code.chunk_decoder(code.decoding(received))).sum(axis=0)
        worst = max(worst, float(np.sum(a * row_l1)) / code.k)
    return worst
