"""A worker's coded update from its partitions' models: ``sum_j w_j (theta_j - theta)``.

Worker ``i`` of a gradient code sends ``sum_j B[i,j] n_j (theta_j - theta)`` (Tandon, Lei,
Dimakis, Karampatziakis, "Gradient Coding: Avoiding Stragglers in Distributed Learning", ICML
2017, https://arxiv.org/abs/1612.03301), ``theta_j`` the app's model after training on
partition ``j``. The sum is taken in float64 (the replicas' rounding must not depend on the
model's dtype) and written in the reply's dtype.

:func:`coded_update` goes block by block over all partitions at once: a block of the float64
sum stays in the CPU's cache while every partition's block streams through once, and is written
once, already in the wire dtype. Adding one partition at a time into a full-size float64
buffer (:func:`accumulate_delta`, the one-partition step, kept public and as the reference the
tests compare with) reads and writes that buffer once per partition, then once more to cast it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

__all__ = ["BLOCK", "accumulate_delta", "coded_update"]

#: Elements per block (the float64 sum and scratch stay in the CPU's cache); read at each
#: call, so a smaller value (a test's) reaches block boundaries with small arrays.
BLOCK = 1 << 16


def accumulate_delta(coded: np.ndarray, weight: float, new: np.ndarray, old: np.ndarray,
                     scratch: np.ndarray) -> None:
    """``coded += weight * (new - old)`` in float64, block by block: the operations (and the
    bits) of ``weight * (new.astype(float64) - old.astype(float64))``, without full-size
    temporaries (a 10M-parameter model would need three of 80 MB each)."""
    out, a, b = coded.reshape(-1), new.reshape(-1), old.reshape(-1)
    for start in range(0, out.size, BLOCK):
        stop = min(start + BLOCK, out.size)
        buf = scratch[: stop - start]
        np.subtract(a[start:stop], b[start:stop], out=buf, dtype=np.float64)
        np.multiply(buf, weight, out=buf)
        out[start:stop] += buf


def coded_update(weights: Sequence[float], models: Sequence[Mapping[str, np.ndarray]],
                 theta: Mapping[str, np.ndarray],
                 dtypes: Mapping[str, np.dtype] | None = None) -> dict[str, np.ndarray]:
    """``sum_j weights[j] (models[j][name] - theta[name])`` for every array of ``theta``.

    The float64 operations, in order, of adding each ``weight * (new.astype(float64) -
    old.astype(float64))`` into a float64 zero buffer (so the same bits as
    :func:`accumulate_delta` partition by partition), then cast to ``dtypes[name]``
    (``same_kind``; float64 when absent). Each partition's array is read once.

    Raises:
        ValueError: if ``weights`` and ``models`` differ in length, or a model's array has
            another number of values than ``theta``'s.
    """
    if len(weights) != len(models):
        raise ValueError(f"{len(weights)} weights for {len(models)} models; expected one each")
    dtypes = dtypes or {}
    out = {}
    for name, old in theta.items():
        flat_old = np.asarray(old).reshape(-1)
        news = [np.asarray(model[name]).reshape(-1) for model in models]
        for new in news:
            if new.size != flat_old.size:
                raise ValueError(f"array {name!r} has {new.size} values in a partition's "
                                 f"model; expected {flat_old.size} (the global model's)")
        size = flat_old.size
        result = np.empty(size, dtype=np.dtype(dtypes.get(name, np.float64)))
        acc = np.empty(min(BLOCK, size))
        buf = np.empty_like(acc)
        for start in range(0, size, BLOCK):
            stop = min(start + BLOCK, size)
            total, part = acc[: stop - start], buf[: stop - start]
            total.fill(0.0)
            for weight, new in zip(weights, news, strict=True):
                np.subtract(new[start:stop], flat_old[start:stop], out=part, dtype=np.float64)
                np.multiply(part, weight, out=part)
                total += part
            np.copyto(result[start:stop], total, casting="same_kind")
        out[name] = result.reshape(np.shape(old))
    return out
