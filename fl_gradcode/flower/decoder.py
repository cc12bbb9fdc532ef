"""One decoding path for every code: coded replies -> the example-weighted average.

A reply carries ``m`` chunks mixed (``m = code.chunks``; 1 for every code but the
communication-efficient one): the message of worker ``i`` is
``sum_u c_i[u] y_i^(u)`` where ``y_i = [sum_j B_ij n_j dtheta_j (every array, flattened in
order), sum_j B_ij n_j]`` is cut into ``m`` chunks of ``L = ceil((dim + 1) / m)`` values
(zero-padded). The code answers its decoder as an ``(m, n)`` matrix ``D``
(:meth:`~fl_gradcode.codes.GradientCode.chunk_decoder`); chunk ``u`` of the decoded
``[sum_j n_j dtheta_j, sum_j n_j]`` is ``sum_i D[u, i] message_i``. With one chunk the
message is the model's own arrays followed by ``num-examples``; with ``m`` chunks it is the
one array ``chunk`` (:data:`~fl_gradcode.flower.protocol.CHUNK_KEY`).

The decoder then checks the count, adds the privatiser's noise, rejects a non-finite model,
casts to the model's dtypes and hands ONE reply holding the average to the inner strategy.

References:
    Tandon, Lei, Dimakis, Karampatziakis, "Gradient Coding: Avoiding Stragglers in Distributed
    Learning", ICML 2017, https://arxiv.org/abs/1612.03301 (the decoder).
    Kadhe, Koyluoglu, Ramchandran, "Communication-Efficient Gradient Coding for Straggler
    Mitigation in Distributed Learning", ISIT 2020, https://arxiv.org/abs/2005.07184 (replies
    of ``1/m`` of the update, decoded chunk by chunk).
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
import os
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from logging import WARNING
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import scipy.linalg.blas
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp.strategy import FedAvg

from ..codes import Decoding, GradientCode, sampled_amplification
from . import compat, partition_metrics, protocol
from .protocol import CodedReply
from .records import quiet_inner_aggregation
from .round_state import wire_dtypes

if TYPE_CHECKING:  # (the privatiser imports the round state, which imports this module)
    from .privatiser import Privatiser

__all__ = [
    "AMPLIFICATION_LIMIT",
    "BLOCK",
    "COUNT_RTOL",
    "THREADED",
    "Decoded",
    "Decoder",
    "Outcome",
    "ReplyLayout",
    "cast",
    "combine",
    "error_amplification",
    "exact_count",
    "idle_cores",
    "instruction_chunks",
    "replies_read",
    "wire_dtypes",
]

#: Elements per cache block of the decoder (512 KB of float64: in L2); read at each call, so
#: a smaller value (a test's) reaches block boundaries with small arrays.
BLOCK = 1 << 16
#: ``wire="auto"`` sends replies in the model's dtype when rounding is amplified at most this
AMPLIFICATION_LIMIT = 8.0
#: Values of a model from which the decoding is split between idle cores (read at each call).
THREADED = 1 << 20
#: Relative difference tolerated between an exact decoding's example count and the sum of
#: the partitions' checked sizes (the count may travel in a float32 chunk).
COUNT_RTOL = 1e-4


def combine(
    coefficients: Sequence[float] | np.ndarray,
    views: Sequence[np.ndarray],
    dtype: np.dtype | type,
    *,
    scale: float = 1.0,
    offset: np.ndarray | None = None,
    noise: np.ndarray | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray | None:
    """``scale * sum_i a_i v_i + noise + offset`` into one buffer (``out`` when given), or
    ``None`` when the result is not finite. The sums are taken in ``dtype``; ``out`` may have
    another float dtype (e.g. float64 sums of float64 replies written straight into a float32
    model: no float64 copy of the result is ever made).

    Block by block, so that the running sum stays in cache while every reply with a nonzero
    coefficient streams through once: one read per reply (added with BLAS ``axpy`` in place,
    no temporary), one write of the result, the scaling, noise, offset, cast and finiteness
    check done on the block while it is in cache. A reply with a zero coefficient is never
    read; one with a nonzero coefficient holding NaN or Inf makes the block non-finite.
    """
    dtype = np.dtype(dtype)
    size = offset.size if offset is not None else (views[0].size if views else 0)
    acc = np.empty(size, dtype=dtype) if out is None else out
    if acc.shape != (size,):
        raise ValueError(f"out has shape {acc.shape}; expected ({size},)")
    if acc.dtype != dtype and acc.dtype.kind != "f":
        raise ValueError(f"out has dtype {acc.dtype}; expected {dtype} or a float dtype")
    # else sums in a cached block, cast into ``out``
    direct = acc.dtype == dtype and acc.flags.c_contiguous
    work = None if direct else np.empty(min(size, BLOCK), dtype=dtype)
    scratch = None  # only for a reply the BLAS kernel cannot read as it is
    axpy = _axpy(dtype)
    terms = [(dtype.type(a), v) for a, v in zip(coefficients, views, strict=True) if a != 0.0]
    factor = dtype.type(scale)
    for start in range(0, size, BLOCK):
        end = min(start + BLOCK, size)
        block = acc[start:end] if work is None else work[: end - start]
        if not terms:
            block.fill(0)
        for i, (a, v) in enumerate(terms):
            x = v[start:end]
            if i == 0:
                np.multiply(x, a, out=block)
            elif a == 1.0:  # FRC-like decoders are 0/1 (numpy's add: ~7% faster than axpy)
                block += x
            elif axpy is not None and x.dtype == dtype:
                axpy(x, block, a=a)  # block += a x in one pass, in place (contiguous block)
            else:
                if scratch is None:
                    scratch = np.empty(min(size, BLOCK), dtype=dtype)
                np.multiply(x, a, out=scratch[: end - start])
                block += scratch[: end - start]
        if factor != 1.0:
            block *= factor
        if noise is not None:
            block += noise[start:end]
        if offset is not None:
            block += offset[start:end]
        if work is not None:
            with np.errstate(over="ignore"):  # a value beyond ``out``'s range: inf, refused
                acc[start:end] = block
            block = acc[start:end]
        if not np.isfinite(block).all():
            return None
    return acc


def _chunk_major(rows: np.ndarray, views: Sequence[np.ndarray], dtype: np.dtype, *,
                 scale: float, offsets: Sequence[np.ndarray], noise: np.ndarray | None,
                 out: np.ndarray) -> bool:
    """Decode replies that mix ``m`` chunks, reading each reply once: value ``q`` of chunk
    ``u`` (position ``u L + q`` of the decoded vector, ``L`` a reply's length) is
    ``sum_i rows[u, i] views[i][q]``; ``out[p] = scale * that + noise[p] + offset[p]`` for
    every position below ``out.size`` (the count and padding beyond it are not written), the
    offset being ``offsets`` (the model's flat arrays) laid end to end. ``False`` when a
    value is not finite.

    Block by block of reply positions: the ``m`` running sums of a block stay in cache while
    each reply's block streams through once for all ``m`` rows (decoding chunk by chunk
    reads every reply ``m`` times). The block ranges are split between idle cores."""
    m, length = rows.shape[0], views[0].size
    dim = out.size
    bounds = list(itertools.accumulate((o.size for o in offsets), initial=0))
    coefficients = [[dtype.type(c) for c in row] for row in rows]
    factor = dtype.type(scale)
    axpy = _axpy(dtype)

    def run(start: int, stop: int) -> bool:
        work = np.empty((m + 1, min(BLOCK, stop - start)), dtype=dtype)
        for a in range(start, stop, BLOCK):
            b = min(a + BLOCK, stop)
            sums = work[:m, : b - a]
            sums.fill(0)
            for i, view in enumerate(views):
                x = view[a:b]
                if x.dtype != dtype:  # e.g. float32 replies summed in float64: cast once
                    x = work[m, : b - a]
                    np.copyto(x, view[a:b])
                for u in range(m):
                    c = coefficients[u][i]
                    if c == 0.0:
                        continue
                    if c == 1.0:
                        sums[u] += x
                    elif axpy is not None:
                        axpy(x, sums[u], a=c)
                    else:
                        sums[u] += x * c
            for u in range(m):
                p0, p1 = u * length + a, min(u * length + b, dim)
                if p1 <= p0:
                    continue
                block = sums[u, : p1 - p0]
                if factor != 1.0:
                    block *= factor
                if noise is not None:
                    block += noise[p0:p1]
                j, p = bisect.bisect_right(bounds, p0) - 1, p0
                while p < p1:  # the model arrays this range of positions spans
                    e = min(bounds[j + 1], p1)
                    block[p - p0 : e - p0] += offsets[j][p - bounds[j] : e - bounds[j]]
                    p, j = e, j + 1
                with np.errstate(over="ignore"):  # beyond ``out``'s range: inf, refused
                    out[p0:p1] = block
                if not np.isfinite(out[p0:p1]).all():
                    return False
        return True

    threads = min(idle_cores(), -(-length // BLOCK)) if dim >= THREADED else 1
    if threads <= 1:
        return run(0, length)
    step = -(-length // threads // BLOCK) * BLOCK
    with ThreadPoolExecutor(max_workers=threads) as pool:
        return all(pool.map(lambda a: run(a, min(a + step, length)), range(0, length, step)))


@functools.cache
def _axpy(dtype: np.dtype) -> Callable[..., np.ndarray] | None:
    """BLAS ``y += a x`` for ``dtype`` (float32, float64), else ``None``: one read of ``x``
    and one read-modify-write of the cached block where numpy's ``multiply`` then ``add``
    takes two passes and a scratch buffer."""
    if dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        return None
    return scipy.linalg.blas.get_blas_funcs("axpy", dtype=dtype)


def idle_cores() -> int:
    """Cores this process may use that are not already busy (at least 1): the cores of its
    affinity mask minus the other runnable work the 1-minute load average counts."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on every platform
        cores = os.cpu_count() or 1
    try:
        others = max(0, round(os.getloadavg()[0]) - 1)  # the load counts this process too
    except (AttributeError, OSError):
        others = 0
    return max(1, cores - others)


def cast(value: np.ndarray, dtype: np.dtype | type) -> np.ndarray:
    """``value`` in the model's ``dtype`` (integers rounded to the nearest)."""
    if np.issubdtype(dtype, np.integer):
        return np.rint(value).astype(dtype)
    return value.astype(dtype, copy=False)


def error_amplification(code: GradientCode, seed: int, samples: int = 24) -> float:
    """How much the decoder amplifies rounding errors of the replies, relative to the decoded
    sum: ``max_F sum_i (sum_u |D_ui|) ||B_i||_1 / k`` over decodable sets ``F`` (all clients,
    random ``(n-s)``-subsets, contiguous straggler bursts), ``D`` the code's chunk decoder. 1
    for uncoded and FRC (0/1 decoding). (:func:`~fl_gradcode.codes.sampled_amplification`.)"""
    return sampled_amplification(code, seed=seed, samples=samples)


def instruction_chunks(code: GradientCode, worker: int) -> tuple[float, ...]:
    """``worker``'s chunk coefficients as the instruction carries them: none for a code whose
    replies are one chunk (the protocol's encoding of "the whole combination")."""
    gamma = code.chunk_coefficients(worker)
    return tuple(float(c) for c in gamma) if gamma.size > 1 else ()


def exact_count(code: GradientCode, decoding: Decoding,
                sizes: Mapping[int, float]) -> float | None:
    """The example count an exact ``decoding`` must give: ``sum_j w_j n_j`` over the code's
    partitions from their checked ``sizes`` (``None``: not exact, or a size unknown)."""
    if not decoding.exact or any(j not in sizes for j in range(code.k)):
        return None
    weights = code.weights
    return float(sum(float(weights[j]) * float(sizes[j]) for j in range(code.k)))


def replies_read(decoding: Decoding, used: Sequence[int]) -> int:
    """How many of the ``used`` replies the decoder reads (a nonzero coefficient in any of
    its chunk rows)."""
    column = np.any(np.atleast_2d(decoding.coefficients) != 0, axis=0)
    return int(np.count_nonzero(column[list(used)]))


@dataclass(frozen=True)
class ReplyLayout:
    """Where the decoded ``[sum_j n_j dtheta_j..., sum_j n_j]`` lies in a round's replies.

    Attributes:
        names: the model's arrays, in order; ``sizes`` their numbers of values.
        chunks: ``m``, the chunks a reply mixes.
        arrays: the arrays a reply carries and their shapes, in message order.
        count_in_record: the count travels as the reply's ``num-examples`` (one chunk), not
            inside the message.
    """

    names: tuple[str, ...]
    sizes: tuple[int, ...]
    chunks: int
    arrays: dict[str, tuple[int, ...]]
    count_in_record: bool

    @classmethod
    def of(cls, code: GradientCode, theta: Mapping[str, np.ndarray]) -> ReplyLayout:
        """The layout of ``code``'s replies for a model ``theta``: one chunk, the model's own
        arrays; ``m`` chunks, one array of ``ceil((dim + 1) / m)`` values."""
        names = tuple(theta)
        sizes = tuple(int(np.size(theta[name])) for name in names)
        m = code.chunks
        if m == 1:
            arrays = {name: tuple(np.shape(theta[name])) for name in names}
        else:
            arrays = {protocol.CHUNK_KEY: (-(-(sum(sizes) + 1) // m),)}
        return cls(names, sizes, m, arrays, m == 1)

    @property
    def dim(self) -> int:
        """Values of the model (the count is value ``dim`` of the decoded vector)."""
        return sum(self.sizes)

    @cached_property
    def bounds(self) -> tuple[int, ...]:
        """Offsets of the message's segments (the arrays, then the count if it is one)."""
        sizes = [math.prod(shape) for shape in self.arrays.values()]
        return tuple(itertools.accumulate([*sizes, *([1] if self.count_in_record else [])],
                                          initial=0))

    @property
    def length(self) -> int:
        """Values of one reply's message (with the count)."""
        return self.bounds[-1]

    def message(self, reply: CodedReply) -> list[np.ndarray]:
        """``reply``'s message as flat segments, in order (zero-copy views)."""
        segments = [reply.arrays[key].reshape(-1) for key in self.arrays]
        if self.count_in_record:
            segments.append(np.array([reply.num_examples], dtype=np.float64))
        return segments

    def pieces(self, start: int, stop: int) -> list[tuple[int, int, int, int]]:
        """Values ``start:stop`` of the decoded vector as ``(chunk, segment, first, last)``
        pieces of the messages, in order."""
        bounds, out, p = self.bounds, [], start
        while p < stop:
            chunk, q = divmod(p, self.length)
            segment = bisect.bisect_right(bounds, q) - 1
            last = min(bounds[segment + 1], q + stop - p)
            out.append((chunk, segment, q - bounds[segment], last - bounds[segment]))
            p += last - q
        return out


@dataclass
class Decoded:
    """The decoded, privatised average: arrays in the model's dtypes, metrics, count."""

    arrays: dict[str, Array]
    metrics: dict[str, float]
    count: float
    noise_std: float | None
    #: ``(partition, metrics, weight)`` per partition (:func:`.partition_metrics.collect`)
    partitions: list[tuple[int, dict[str, Any], float]] | None = None


class Outcome(NamedTuple):
    """What the inner strategy made of the decoded average."""

    arrays: ArrayRecord
    metrics: MetricRecord | None
    num_examples: float
    noise_std: float | None


class Decoder:
    """Decodes a round's replies, whatever the code, and hands the average to the inner
    strategy.

    Args:
        inner: the inner Message-API strategy.
        privatiser: the central noise (and the checked sizes it is sized from); ``None``:
            no noise.
        wire: ``"auto"``, ``"model"`` or ``"float64"``: the replies' dtype (the ``wire``
            option's value: :class:`~fl_gradcode.flower.options.WireOptions`).
        sparse: decode exact sets with the code's sparse decoding (fewest replies read).
        seed: seed of the sets :func:`error_amplification` samples (the run's ``seed``).
    """

    def __init__(self, inner: Any, privatiser: Privatiser | None = None, *, wire: str,
                 sparse: bool = True, seed: int) -> None:
        self.inner = inner
        self.privatiser = privatiser
        self.wire = wire
        self.sparse = bool(sparse)
        self.seed = int(seed)
        # per code object, weakly: codes built per round come and go
        self._amplification: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def wire_for(self, code: GradientCode) -> str:
        """The reply dtype for ``code`` (``"model"`` or ``"float64"``): with ``wire="auto"``,
        ``"model"`` when the code's guaranteed bound
        (:attr:`~fl_gradcode.codes.GradientCode.rounding_amplification`) is at most
        :data:`AMPLIFICATION_LIMIT` (no sampling), else when its sampled
        :func:`error_amplification` is."""
        if self.wire != "auto":
            return self.wire
        if code not in self._amplification:
            bound = code.rounding_amplification
            self._amplification[code] = (
                bound if bound is not None and bound <= AMPLIFICATION_LIMIT
                else error_amplification(code, seed=self.seed))
        return "model" if self._amplification[code] <= AMPLIFICATION_LIMIT else "float64"

    @property
    def cached_codes(self) -> int:
        """How many live codes have their error amplification cached (codes that are gone
        leave no entry)."""
        return len(self._amplification)

    def decoding(self, code: GradientCode, used: Sequence[int]) -> Decoding | None:
        """The decoding of ``used``: the sparse exact one when enabled (``None``: nothing)."""
        if not used:
            return None
        return code.sparse_decoding(used) if self.sparse else code.decoding(used)

    @staticmethod
    def non_finite(replies: Mapping[int, CodedReply], used: Sequence[int]) -> dict[int, str]:
        """Workers among ``used`` whose replies hold NaN/Inf, with the reason to reject."""
        bad = {}
        for w in used:
            names = protocol.non_finite_arrays(replies[w])
            if names:
                bad[w] = f"array {names[0]!r} contains NaN or Inf"
        return bad

    def decode(self, code: GradientCode, replies: Mapping[int, CodedReply], used: list[int],
               decoding: Decoding, theta: Mapping[str, np.ndarray],
               dtypes: Mapping[str, np.dtype],
               *, round_number: int, sizes: Mapping[int, float]) -> Decoded | None:
        """The example-weighted average ``sum_j n_j theta_j / sum_j n_j`` (plus the central
        noise), or ``None`` (logged) when the count or the model is not usable.

        One pass per array piece: ``acc = sum_i D_ui r_i`` in place into one buffer (in the
        reply dtype when the code allows, else float64; the replies are zero-copy views),
        then ``acc / count + noise + theta``."""
        layout = ReplyLayout.of(code, theta)
        rows = code.chunk_decoder(decoding)[:, used]
        # the replies some chunk row reads (one per FRC group with sparse decoding)
        read = np.flatnonzero(np.any(rows != 0.0, axis=0)).tolist() or list(range(len(used)))
        messages = {i: layout.message(replies[used[i]]) for i in read}
        [(u_count, seg, q, _)] = layout.pieces(layout.dim, layout.dim + 1)
        count = 0.0
        for i in read:
            if rows[u_count, i] != 0.0:
                count += float(rows[u_count, i]) * float(messages[i][seg][q])
        if not (math.isfinite(count) and count > 0):
            log(WARNING, "round %d: decoded example count %r; round skipped", round_number,
                count)
            return None
        expected = exact_count(code, decoding, sizes)
        if expected is not None and not math.isclose(count, expected, rel_tol=COUNT_RTOL):
            log(WARNING, "round %d: decoded example count %.9g, not the %.9g the partitions' "
                "checked sizes sum to: a used reply was altered; round skipped", round_number,
                count, expected)
            return None
        noise_std, noise = None, None
        if self.privatiser is not None and self.privatiser.central:
            noise_std = self.privatiser.noise_std(code, decoding, used, count, sizes,
                                                  round_number)
            if noise_std is None:
                return None
            noise = self.privatiser.draw(layout.dim, noise_std, round_number)
        offsets = np.cumsum([0, *layout.sizes])

        def finish(index: int) -> Array | None:
            name, start, stop = layout.names[index], offsets[index], offsets[index + 1]
            flat = np.asarray(theta[name]).reshape(-1)
            pieces = layout.pieces(int(start), int(stop))
            kinds = [messages[i][s].dtype for i in read for _, s, _, _ in pieces]
            if not code.decodes_in_reply_dtype:
                kinds.append(np.dtype(np.float64))
            dtype = np.result_type(*kinds) if kinds else np.dtype(np.float64)
            # a float model receives the result directly (cast block by block in cache)
            model = np.dtype(dtypes[name])
            acc = np.empty(stop - start, dtype=model if model.kind == "f" else dtype)
            done = 0
            for u, s, first, last in pieces:
                size = last - first
                part = None if noise is None else noise[start + done : start + done + size]
                ok = combine(rows[u, read], [messages[i][s][first:last] for i in read], dtype,
                             scale=1.0 / count, offset=flat[done : done + size], noise=part,
                             out=acc[done : done + size])
                if ok is None:
                    return None
                done += size
            # serialised here, per array: the float buffer is freed before the next one (one
            # copy into the message's bytes; Array(ndarray)'s np.save makes two, same bytes)
            return protocol.npy_array(cast(acc.reshape(np.shape(theta[name])), dtypes[name]))

        model_dtypes = {np.dtype(dtypes[name]) for name in layout.names}
        if layout.chunks > 1 and len(model_dtypes) == 1 and next(iter(model_dtypes)).kind == "f":
            kinds = [messages[i][0].dtype for i in read]
            if not code.decodes_in_reply_dtype:
                kinds.append(np.dtype(np.float64))
            flats = [np.asarray(theta[name]).reshape(-1) for name in layout.names]
            out = np.empty(layout.dim, dtype=next(iter(model_dtypes)))
            ok = _chunk_major(rows[:, read], [messages[i][0] for i in read],
                              np.result_type(*kinds), scale=1.0 / count, offsets=flats,
                              noise=noise, out=out)
            results = [protocol.npy_array(out[a:b].reshape(np.shape(theta[name])))
                       for name, a, b in zip(layout.names, offsets[:-1], offsets[1:], strict=True)
                       ] if ok else [None]
        else:
            # arrays are independent and numpy releases the GIL: one thread per idle core
            # (the decoding is memory-bound: threads on busy cores only contend)
            indices = range(len(layout.names))
            threads = idle_cores() if len(layout.names) > 1 and layout.dim >= THREADED else 1
            if threads > 1:
                with ThreadPoolExecutor(max_workers=min(len(indices), threads)) as pool:
                    results = list(pool.map(finish, indices))
            else:
                results = [finish(i) for i in indices]
        if any(r is None for r in results):
            log(WARNING, "round %d: decoded model not finite; round skipped", round_number)
            return None
        chosen = [replies[w] for w in used]
        names = set.intersection(*(set(r.metrics) for r in chosen)) if chosen else set()
        metrics = {
            k: float(sum(a * r.metrics[k] for a, r in zip(rows[u_count], chosen, strict=True)))
            / count
            for k in sorted(names)
        }
        parts = partition_metrics.collect(code, replies, used, sizes, round_number)
        return Decoded(dict(zip(layout.names, results, strict=True)), metrics, count,
                       noise_std, parts)

    def apply(self, decoded: Decoded, *, round_number: int, array_key: str,
              reply_to: Message) -> Outcome | None:
        """Hand the decoded average to the inner strategy as ONE valid reply (``None``: the
        inner strategy produced nothing, or a non-finite model)."""
        weight_key = getattr(self.inner, "weighted_by_key", "num-examples")
        content = RecordDict(
            {
                array_key: ArrayRecord(decoded.arrays),
                "metrics": MetricRecord({**decoded.metrics, weight_key: decoded.count}),
            }
        )
        # the metric aggregation sees one record per partition (its own metrics and weight):
        # a max stays a max; the arrays it aggregates are the decoded average
        parts = (None if decoded.partitions is None
                 else partition_metrics.records(decoded.partitions, weight_key))
        if type(self.inner) is FedAvg:
            # FedAvg's weighted average of one reply is that reply (weight 1.0): skip the
            # copy through Array.numpy(); its metric aggregation still runs
            inner_metrics = self.inner.train_metrics_aggr_fn(parts or [content], weight_key)
            return Outcome(content[array_key], inner_metrics, decoded.count, decoded.noise_std)
        reply = Message(content, reply_to=reply_to)
        covered = None if decoded.partitions is None else len(decoded.partitions)
        with quiet_inner_aggregation(), partition_metrics.per_partition_metrics(
                self.inner, parts), compat.client_side_dp_count(self.inner, covered,
                                                                round_number):
            arrays_out, inner_metrics = self.inner.aggregate_train(round_number, [reply])
        if arrays_out is None:
            return None
        for arr in arrays_out.values():
            if not np.isfinite(protocol.array_view(arr)).all():
                log(WARNING, "round %d: inner strategy produced a non-finite model; kept the "
                    "previous one", round_number)
                return None
        return Outcome(arrays_out, inner_metrics, decoded.count, decoded.noise_std)
