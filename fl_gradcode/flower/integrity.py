"""Integrity from redundancy: replies that the code's redundancy contradicts never reach the model.

Every reply is ``r_i = sum_j B[i,j] v_j``. When more replies than a decodable set are in hand,
different decodable subsets must decode to the same result; a wrong reply (a buggy or malicious
client, or a replica whose training is not deterministic) makes them disagree. The checks run on
random projections of each reply (``q`` secret linear functionals of its coordinates, plus its
example count, exactly), so they cost ``O(q)`` per reply once projected, not a model.

* ``consistent(F)``: the min-norm decoding of ``F`` and of every decodable ``F \\ {i}`` agree
  (disagreement relative to the median reply's size <= ``tolerance``: a huge reply cannot
  drown the other disagreements);
* a reply is *checked* when ``F \\ {i}`` still decodes: its contribution is then compared with
  a decoding that does not use it; ``verified(F)`` = consistent and every reply checked;
* a contradiction is *resolved* when removing exactly one reply ``c`` leaves a consistent set
  that still decodes (e.g. a majority inside a repetition group); otherwise the round must not
  apply anything decoded from ``F``.

All leave-one-out decodings of a block come from one SVD of ``B_F = U S V^T``: the decoders of
``F`` are ``a + N y`` (``a`` the min-norm one, ``N`` the left null space), the min-norm decoder
without ``i`` is ``a - a_i N N_i^T / |N_i|^2``, so its disagreement with ``a`` is
``a_i N_i (N^T Z) / |N_i|^2``: ``O(|F|^3)`` per block however many leave-one-outs, for any
cohort size. Projections are scaled by their largest entry before any product, and a
non-finite disagreement or scale is a contradiction (never agreement).

**Detection** (``Probe(..., sample=None)``, used with ``verify=True``). The ``q`` functionals
have weights ``w = (D - 127.5) / 256`` with ``D`` uniform bytes drawn, per round, from a key of
the server's OS randomness (:mod:`secrets`): never derived from the run seed, never sent, so a
client cannot know which directions are measured. A reply changed by ``delta`` changes a
leave-one-out disagreement by ``u = a_i delta`` (linear); with ``W = w + J`` (``J`` an
independent uniform jitter of one byte step) ``W`` is uniform on ``[-1/2, 1/2]^d`` and, by
K. Ball's cube-slicing theorem (Proc. AMS 97, 1986), ``w.u / |u|`` has density at most
``sqrt 2``. With ``P(|J.u| <= t |u|) >= 1 - 2^-16 / (12 t^2)`` (Chebyshev),
``P(|w.u| <= e |u|) <= 2 sqrt2 (e + t) / (1 - 2^-16 / (12 t^2))``: with ``t = 0.01``,
``e = 0.05`` at most 0.172 per functional, so for ``q = 16`` independent functionals
``P(|Wu| <= 0.05 |u|) <= 0.172^16 < 6e-13``, whatever ``u`` (one coordinate or all of them).
The leave-one-out disagreement of the changed reply ``i`` is exactly ``|W u|`` with
``u = a_i delta`` (``a_i`` its weight in the min-norm decoding, ``1/(s+1)`` inside a
repetition group), measured relative to the median exact norm of the replies (not their
projections), part by part (:meth:`Probe.measure`: the model's projections against the arrays'
norm, the count against the count, the metrics' against the whole reply, so that a large
honest metric cannot widen the model's tolerance): a change of the model with
``|a_i delta| >= 20 * tolerance * median |r|`` (``|r|`` the arrays' norm) is caught with
probability >= 1 - 1e-12 per round, fresh keys each round. A reply with ``a_i = 0`` that the
applied decoding reads with weight ``c_i`` is caught the same way with ``c_i``
(:func:`applied_disagreement`). Metrics are coordinates too
(per-name secret weights), so forged train metrics are caught the same way.

References:
    Tandon, Lei, Dimakis, Karampatziakis, "Gradient Coding", ICML 2017 (replies as linear
    combinations of partition updates, ``B``); Chen, Wang, Charles, Papailiopoulos, "DRACO:
    Byzantine-resilient Distributed Training via Redundant Gradients", ICML 2018,
    https://arxiv.org/abs/1803.09877 (majority vote inside repetition groups); K. Ball, "Cube
    slicing in R^n", Proc. AMS 97 (1986) 465-473 (anti-concentration of the functionals).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..codes import GradientCode
from .yardsticks import norm, relative, relative_rows, typical_yardstick, yardsticks

__all__ = [
    "Probe",
    "Verdict",
    "applied_disagreement",
    "check_block",
    "reply_sizes",
    "round_probe",
    "verify_refusal",
    "verify_replies",
]

_EXACT = 1e-8
_APPROXIMATE = ("bgc", "expander")  # registry codes that decode approximately
_BLOCK = 1 << 15  # coordinates per block of the dense probe (memory O(q * block))
_RUN = 64  # consecutive coordinates per run of the sampled probe


class Probe:
    """``q`` secret random linear functionals of a reply (plus its example count, exactly).

    ``seed=None`` (what the server uses): the key is fresh OS randomness, never derived from
    the run seed and never sent; a sequence of ints gives a reproducible probe (tests).

    ``sample`` coordinates (default 2048, split evenly over the arrays, at least 64 per
    array, the whole array when smaller; secret aligned runs of 64 consecutive coordinates in
    a large array, so that a reply is read in few places): a cheap consistency check,
    ``O(q sample)`` per reply. ``sample=None``: dense functionals over every coordinate (and, with
    ``metrics=True``, every metric by name), computed block by block in float64 with memory
    ``O(q * block)``: a change to any coordinate is caught with probability >= 1 - 1e-12
    (module docstring).
    """

    def __init__(
        self, layout: Mapping[str, tuple[int, ...]], seed: Sequence[int] | None = None,
        q: int = 4, sample: int | None = 2048, metrics: bool = False,
    ) -> None:
        if seed is None:
            words = [secrets.randbits(32) for _ in range(8)]
        else:
            words = [int(x) for x in seed]
        self._words = words
        self._key = hashlib.blake2b(repr(words).encode(), digest_size=32).digest()
        self.q = int(q)
        self.dense = sample is None
        self.verdicts: dict = {}  # verify_replies' cache for this probe's round
        self.metrics = bool(metrics)
        self._layout = {name: int(np.prod(shape)) if shape else 1
                        for name, shape in layout.items()}
        self._index: dict[str, np.ndarray] = {}
        self._weights: dict[str, np.ndarray] = {}
        if self.dense:
            return
        rng = np.random.default_rng(words)
        per_array = max(64, int(sample) // max(1, len(layout)))
        for name, size in self._layout.items():
            take = min(size, per_array)
            self._index[name] = _sample_runs(rng, size, take)
            self._weights[name] = rng.standard_normal((self.q, take))
        # the same weights side by side: one product per reply instead of one per array
        self._stacked = (np.concatenate(list(self._weights.values()), axis=1)
                         if self._weights else None)

    @property
    def sampled_coordinates(self) -> dict[str, np.ndarray]:
        """A copy of the flat coordinates a sampled probe reads, per array (empty for a dense
        probe). Secret when the probe's words are: never sent anywhere."""
        return {name: index.copy() for name, index in self._index.items()}

    def __call__(self, arrays: Mapping[str, np.ndarray], count: float,
                 metrics: Mapping[str, float] | None = None) -> np.ndarray:
        return self.measure(arrays, count, metrics)[0]

    def measure(self, arrays: Mapping[str, np.ndarray], count: float,
                metrics: Mapping[str, float] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(z, yardstick)``: the projections, and for each of them the size it is judged
        against, from the same pass over the reply: the model's projections against the
        arrays' exact norm (a dense probe; a sampled one: the norm of those projections),
        the example count against its own size, the metrics' against the whole reply's
        norm. Each part has its own: a large count or app metric (a cumulative sample count)
        must not widen the tolerance on the model's coordinates."""
        with np.errstate(all="ignore"):  # NaN/Inf/overflow give a non-finite z: rejected
            if self.dense:
                z, (scale, ssq) = self._dense(arrays)
                model = _finish(scale, ssq)
            else:
                z = np.atleast_1d(self._sampled(arrays))
                model = norm(z)
                scale, ssq = _accumulate(0.0, 0.0, z)
            tail = [float(count)]
            if self.metrics:
                tail += list(self._metric_part(metrics or {}))
            extra = [float(count)] + (list((metrics or {}).values()) if self.metrics else [])
            scale, ssq = _accumulate(scale, ssq, np.asarray(extra, dtype=np.float64))
            whole = _finish(scale, ssq)
            yardstick = np.concatenate([np.full(z.size, model), [abs(float(count))],
                                        np.full(len(tail) - 1, whole)])
            return np.concatenate([z, tail]), yardstick

    def size(self, arrays: Mapping[str, np.ndarray], count: float,
             metrics: Mapping[str, float] | None = None) -> float:
        """The exact Euclidean norm of the whole reply (arrays, count, metrics if probed),
        without overflow (scaled block by block, as BLAS ``nrm2``): the disagreements'
        yardstick. ``inf``/``nan`` for a reply with non-finite values."""
        extra = [float(count)] + (list((metrics or {}).values()) if self.metrics else [])
        scale, ssq = _accumulate(0.0, 0.0, np.asarray(extra, dtype=np.float64))
        for name in self._layout:
            flat = np.asarray(arrays[name]).reshape(-1)
            for i in range(0, flat.size, _BLOCK):
                scale, ssq = _accumulate(scale, ssq, flat[i : i + _BLOCK])
        return _finish(scale, ssq)

    def _sampled(self, arrays: Mapping[str, np.ndarray]) -> np.ndarray:
        """Every array's sampled coordinates gathered into one float64 vector, then one
        product with the stacked weights (a reply costs one small GEMV, not one per array)."""
        if self._stacked is None:  # no arrays: nothing sampled
            return 0
        x = np.concatenate([np.asarray(arrays[name]).reshape(-1)[idx]
                            for name, idx in self._index.items()],
                           dtype=np.float64, casting="unsafe")  # as ``astype(np.float64)``
        return self._stacked @ x

    def _dense(self, arrays: Mapping[str, np.ndarray]):
        """``(sum_k w_k . x, (scale, ssq))`` with ``w = (D - 127.5) / 256``, ``D`` bytes drawn
        per block from the key (the same weights for every reply of the round, never
        materialised whole), and the reply's scaled sum of squares from the same blocks."""
        z = np.zeros(self.q)
        buf = np.empty((self.q, _BLOCK))
        scale, ssq = 0.0, 0.0
        for a, (name, size) in enumerate(self._layout.items()):
            flat = np.asarray(arrays[name]).reshape(-1)
            for b, start in enumerate(range(0, size, _BLOCK)):
                x = flat[start : start + _BLOCK].astype(np.float64, copy=False)
                scale, ssq = _accumulate(scale, ssq, x)
                rng = np.random.default_rng([*self._words, a, b])
                raw = np.frombuffer(rng.bytes(self.q * x.size), dtype=np.uint8)
                w = buf[:, : x.size]
                np.subtract(raw.reshape(self.q, x.size), 127.5, out=w)
                # einsum: one core, no BLAS threads (a threaded GEMV this thin is many times
                # slower when the cores are shared)
                z += np.einsum("kj,j->k", w, x)
        return z / 256.0, (scale, ssq)

    def _metric_part(self, metrics: Mapping[str, float]) -> np.ndarray:
        """Per metric name, ``q`` secret weights uniform on ``[-1/2, 1/2]`` (keyed by name)."""
        out = np.zeros(self.q)
        for name, value in metrics.items():
            digest = hashlib.blake2b(str(name).encode(), key=self._key, digest_size=16).digest()
            weights = np.random.default_rng(list(digest)).random(self.q) - 0.5
            out += weights * float(value)
        return out


def _sample_runs(rng: np.random.Generator, size: int, take: int) -> np.ndarray:
    """``take`` distinct sorted coordinates of ``[0, size)``: random aligned runs of ``_RUN``
    consecutive ones when the array has room for many more runs, else single coordinates.
    A run is one or two pages and a few cache lines: the sampled probe of a reply whose bytes
    left the caches long ago reads ``take / _RUN`` places of memory, not ``take`` (measured:
    2 ms instead of 0.1 ms per 10M-parameter reply when each coordinate is a memory miss)."""
    runs = -(-take // _RUN)
    if take == size or size // _RUN < 8 * runs:
        return np.sort(rng.choice(size, size=take, replace=False))
    starts = rng.choice(size // _RUN, size=runs, replace=False) * _RUN
    return np.sort((starts[:, None] + np.arange(_RUN)).reshape(-1)[:take])


def _accumulate(scale: float, ssq: float, x: np.ndarray) -> tuple[float, float]:
    """``(scale, ssq)`` with ``scale^2 ssq`` the running sum of squares, updated with ``x``
    (never overflows; a non-finite ``x`` makes ``scale`` non-finite)."""
    if x.size == 0:
        return scale, ssq
    with np.errstate(all="ignore"):
        top = float(np.max(np.abs(x)))
        if not np.isfinite(top):
            return top if np.isnan(top) else float("inf"), ssq
        if top == 0.0 or not np.isfinite(scale):
            return scale, ssq
        if top > scale:
            ssq = ssq * (scale / top) ** 2 if scale else 0.0
            scale = top
        y = np.asarray(x, dtype=np.float64) / scale
        return scale, ssq + float(np.einsum("j,j->", y, y))


def _finish(scale: float, ssq: float) -> float:
    if not np.isfinite(scale):
        return scale
    return scale * float(np.sqrt(ssq)) if scale else 0.0


@dataclass
class Verdict:
    """What the redundancy says about a set of replies."""

    status: str  # "verified", "unverified" (consistent, not every reply checked), "contradicted"
    excluded: list[int] = field(default_factory=list)  # identified inconsistent workers
    disagreement: float = 0.0  # largest relative disagreement measured (before exclusion)
    unresolved: bool = False  # a contradiction no single exclusion explains
    involved: list[int] = field(default_factory=list)  # workers of unresolved contradictions
    # verify=True: replies of blocks no s + 1 agreeing replicas settle (left out of decoding)
    unsettled: list[int] = field(default_factory=list)
    # False: the heuristic cross-check of verify=False (sampled projections, no theorem)
    proven: bool = True


def verify_refusal(code: object, s: object, options: Mapping[str, object],
                   placement: bool = True) -> str | None:
    """Why ``verify=True`` cannot work for this code (``None``: it can). A registry name or a
    :class:`GradientCode`; ``s`` as given to ``GradientCoding``. ``placement=False``: not
    the placement rule (:func:`~fl_gradcode.flower.settle.placement_refusal`; a round's
    fallback code is checked block by block instead)."""
    name = code if isinstance(code, str) else getattr(code, "name", type(code).__name__)
    if isinstance(code, str):
        chunked = code == "comm-efficient" and options.get("m", 2) != 1
        no_redundancy = code in ("uncoded", "ignore-stragglers") or s == 0
        approximate = code in _APPROXIMATE
    else:
        chunked = getattr(code, "chunks", 1) > 1
        no_redundancy = getattr(code, "s", 0) == 0
        approximate = not getattr(code, "is_exact", True)
    if chunked:
        return (f"verify=True is not available for code={name!r} with m > 1: its replies are "
                "chunks of the model and are not cross-checked. Use m=1 (its groups are "
                "repetition groups), code='frc', or verify=False")
    if no_redundancy:
        return (f"verify=True needs redundancy to cross-check replies; code={name!r} with "
                f"s={s!r} has none (no reply is computed twice). Use s >= 1 with code='frc', "
                "or verify=False")
    if approximate:
        return (f"verify=True needs an exact code; code={name!r} decodes approximately, so "
                "the replies of a round cannot be cross-checked. Use code='frc', or "
                "verify=False")
    if not placement:
        return None
    if isinstance(code, str):
        why = None if code in ("frc", "comm-efficient") else (
            "it places cyclic blocks" if code == "crc" else
            "it places Reed-Solomon or cyclic blocks when (s + 1) does not divide n")
    else:
        from .settle import placement_refusal  # settle builds on this module

        why = placement_refusal(code)
    if why is not None:
        return (f"verify=True cannot guarantee anything for code={name!r}: against a "
                "coalition of up to s nodes it needs every block to be a repetition group of "
                f"at least s + 1 identical replicas, and {why} (s colluders can make an honest "
                "node look like the culprit). Use code='frc' (needs (s + 1) | n), a "
                "GradientCode whose blocks are repetition groups (e.g. "
                "make_code('grouped-rs', n, s) with (s + 1) | n), or verify=False")
    return None


def round_probe(code: GradientCode, layout: Mapping[str, tuple[int, ...]], verify: bool,
                options: Mapping[str, object]) -> Probe | None:
    """A round's probe, from fresh server secrets (never the run seed, never sent).

    ``verify=True``: dense over every coordinate and metric (``q = 16``); a code verify
    cannot check raises :class:`ValueError` (:func:`verify_refusal`), except a round with
    ``s = 0`` (``s="auto"`` may choose it): ``None``, nothing to cross-check. A fallback code
    whose blocks are not all repetition groups is probed: such blocks never settle.
    ``verify=False``: a cheap sampled probe for codes with redundancy, ``None`` otherwise.
    """
    chunked = code.chunks > 1
    if not verify:
        return Probe(layout) if code.s > 0 and not chunked else None
    if code.s == 0:
        return None
    refusal = verify_refusal(code, code.s, options, placement=False)
    if refusal is not None:
        raise ValueError(refusal)
    return Probe(layout, q=16, sample=None, metrics=True)


def reply_sizes(extras: Mapping[int, Mapping[str, object]]) -> dict[int, np.ndarray] | None:
    """Each reply's yardstick as its probe measured it (``extra["size"]``: one size per
    projection, :meth:`Probe.measure`), or ``None`` when any is missing (the projections'
    norms are then the yardstick)."""
    sizes = {w: extra.get("size") for w, extra in extras.items()}
    if any(v is None for v in sizes.values()):
        return None
    return {w: np.asarray(v, dtype=np.float64) for w, v in sizes.items()}


def _analyse(B: np.ndarray, workers: Sequence[int]):
    """``(a, N)``: the min-norm ``a`` with ``B[F]^T a = 1`` and an orthonormal basis ``N`` of
    the left null space of ``B[F]``, or ``None`` if ``F`` does not decode."""
    if not workers:
        return None
    A = B[list(workers)]
    U, S, Vt = np.linalg.svd(A, full_matrices=True)
    cut = (S[0] if S.size else 0.0) * max(A.shape) * np.finfo(float).eps
    r = int(np.count_nonzero(S > cut))
    a = U[:, :r] @ ((Vt[:r] @ np.ones(A.shape[1])) / S[:r])
    if np.max(np.abs(A.T @ a - 1.0)) > _EXACT:
        return None
    return a, U[:, r:]


def check_block(B, z: Mapping[int, np.ndarray], workers: list[int], sizes=None):
    """``(disagreement, checked workers)`` of ``workers`` (their projections ``z``) for
    ``B`` restricted to one block's partitions, or ``None`` if they do not decode: the
    largest leave-one-out disagreement relative to the median reply's size."""
    return _check(B, z, workers, sizes)


def _check(B, z: Mapping[int, np.ndarray], workers: list[int], sizes=None):
    """``(disagreement, checked workers)`` of ``workers``, or ``None`` if they do not decode."""
    found = _analyse(B, workers)
    if found is None:
        return None
    a, N = found
    Z = np.array([np.asarray(z[w], dtype=np.float64) for w in workers])
    # the typical reply's size: one huge reply must not make every other disagreement look
    # like rounding (a scale from the decoded sums would grow with it)
    scale = typical_yardstick(z, sizes, workers)
    weight = np.sum(N * N, axis=1)
    checked = {w for i, w in enumerate(workers) if weight[i] > 1e-12 or abs(a[i]) < 1e-12}
    with np.errstate(all="ignore"):
        top = float(np.max(np.abs(Z))) if Z.size else 0.0
        if not np.isfinite(top):
            return float("inf"), checked
        if top > 0:
            Z = Z / top
            scale = scale / top
        W = N.T @ Z
        rows = (weight > 1e-12) & (a != 0.0)
        diff = (a[rows] / weight[rows])[:, None] * (N[rows] @ W)
        worst = float(np.max(relative_rows(diff, scale), initial=0.0))
    return worst, checked


def verify_replies(
    code: GradientCode, z: Mapping[int, np.ndarray], workers: Sequence[int], tolerance: float,
    sizes: Mapping[int, float] | None = None, cache: dict | None = None,
) -> Verdict:
    """The verdict of the redundancy among ``workers`` (their projections ``z``), block by
    block of ``code.blocks`` (a huge reply in one block cannot hide a disagreement in another
    through floating point cancellation). ``sizes``: each reply's exact norm (the yardstick;
    default: the norms of the projections). ``cache``: a dict kept for one round's replies
    (the same ``z``): a block's verdict is computed once per set of its members (a stopping
    rule that grows the set one reply at a time re-solves one block per reply)."""
    B = code.B
    workers = sorted(workers)
    verdicts = []
    for index, (clients, parts) in enumerate(code.blocks):
        members = set(clients)
        mine = [w for w in workers if w in members]
        if not mine:
            continue
        key = (id(code), index, tuple(mine), tolerance)
        if cache is not None and key in cache:
            verdicts.append(cache[key])
            continue
        sub = np.zeros((B.shape[0], len(parts)))
        sub[list(clients)] = B[np.ix_(list(clients), list(parts))]
        verdicts.append(_verify_block(sub, z, mine, tolerance, sizes))
        if cache is not None:
            cache[key] = verdicts[-1]
    if not verdicts:
        return Verdict("unverified")
    if any(v.status == "contradicted" for v in verdicts):
        status = "contradicted"
    elif all(v.status == "verified" for v in verdicts):
        status = "verified"
    else:
        status = "unverified"
    return Verdict(
        status,
        sorted(w for v in verdicts for w in v.excluded),
        max(v.disagreement for v in verdicts),
        unresolved=any(v.unresolved for v in verdicts),
        involved=sorted(w for v in verdicts for w in v.involved),
    )


def _candidates(B: np.ndarray, z, workers: list[int], sizes, tolerance: float) -> list[int]:
    """The workers whose single exclusion could explain the block's residual (each is then
    confirmed by its own decoding): all of them in a small block; in a large one, ``O(|F| q)``
    each, those ``c`` that explain the residual alone (one wrong reply ``c`` leaves
    ``N^T Z = N_c^T delta``: rank one along ``N_c``) or whose leave-one-out disagreement, by a
    rank-one update of the block's SVD (without ``c`` the null basis is ``N`` projected off
    ``N_c``, the min-norm decoder ``a - a_c N N_c^T / |N_c|^2``), is within the tolerance;
    with non-finite values, the one reply that has them (none if several do)."""
    if len(workers) <= 16:
        return list(workers)
    found = _analyse(B, workers)
    if found is None:
        return list(workers)
    a, N = found
    Z = np.array([np.asarray(z[w], dtype=np.float64) for w in workers])
    values = yardsticks(z, sizes, workers)
    finite = np.all(np.isfinite(Z), axis=1) & np.all(np.isfinite(values), axis=1)
    if not finite.all():
        return [workers[int(i)] for i in np.flatnonzero(~finite)] if np.sum(~finite) == 1 else []
    with np.errstate(all="ignore"):
        top = float(np.max(np.abs(Z)))
        if not top > 0:
            return []
        W = N.T @ (Z / top)
        total = norm(W)
        NW = N @ W  # row i: N_i (N^T Z)
        G = N @ N.T  # G[i, c] = N_i . N_c
        weight = np.diag(G)
        out = []
        for c, w in enumerate(workers):
            if weight[c] <= 1e-12:
                continue
            rest = W - np.outer(N[c], N[c] @ W) / weight[c]
            # the residual lies along N_c up to rounding (1e-3: an angle under 0.06 degrees)
            if norm(rest) <= 1e-3 * total:
                out.append(w)
                continue
            t = G[:, c] / weight[c]
            keep = np.arange(len(workers)) != c
            rest_weight, rest_a = weight - G[:, c] * t, a - a[c] * t
            used = keep & (rest_weight > 1e-12) & (rest_a != 0.0)
            residual = NW[used] - np.outer(t[used], NW[c])
            scale = np.median(values[keep], axis=0) / top
            diff = (np.abs(rest_a[used]) / rest_weight[used])[:, None] * residual
            worst = float(np.max(relative_rows(diff, scale), initial=0.0))
            if worst <= tolerance * (1 + 1e-6):
                out.append(w)
    return out


def _verify_block(
    B: np.ndarray, z: Mapping[int, np.ndarray], workers: list[int], tolerance: float,
    sizes: Mapping[int, float] | None = None,
) -> Verdict:
    """:func:`verify_replies` inside one block (``B`` restricted to the block's columns)."""
    result = _check(B, z, workers, sizes)
    if result is None:
        return Verdict("unverified")
    worst, checked = result
    if worst <= tolerance:
        return Verdict("verified" if checked == set(workers) else "unverified", [], worst)
    candidates = []
    for c in _candidates(B, z, workers, sizes, tolerance):
        rest = [w for w in workers if w != c]
        sub = _check(B, z, rest, sizes)
        if sub is not None and sub[0] <= tolerance and sub[1]:
            candidates.append((c, sub[1] == set(rest)))
    if len(candidates) == 1:
        culprit, all_checked = candidates[0]
        return Verdict("verified" if all_checked else "unverified", [culprit], worst)
    return Verdict("contradicted", [], worst, unresolved=True, involved=list(workers))


def applied_disagreement(
    code: GradientCode, z: Mapping[int, np.ndarray], used: Sequence[int],
    coefficients: np.ndarray, sizes: Mapping[int, float] | None = None,
) -> float:
    """How far the decoding actually applied (``coefficients``, one per worker of the code)
    is from the min-norm decoding of ``used`` that the verdict cross-checked, block by block,
    relative to the median reply's size (a reply every checked decoding gives weight 0 but
    the applied one reads would otherwise go unchecked). ``inf`` when ``used`` does not
    decode."""
    B = code.B
    used = sorted(used)
    c_all = np.asarray(coefficients, dtype=np.float64)
    if c_all.ndim == 2 and c_all.shape[0] == 1:  # a one-chunk code's decoder: one row
        c_all = c_all[0]
    worst = 0.0
    for clients, parts in code.blocks:
        members = set(clients)
        mine = [w for w in used if w in members]
        if not mine:
            continue  # a block nothing was received from: the decoding reads nothing there
        sub = np.zeros((B.shape[0], len(parts)))
        sub[list(clients)] = B[np.ix_(list(clients), list(parts))]
        found = _analyse(sub, mine)
        if found is None:
            return float("inf")
        a, _ = found
        Z = np.array([np.asarray(z[w], dtype=np.float64) for w in mine])
        scale = typical_yardstick(z, sizes, mine)
        with np.errstate(all="ignore"):
            top = float(np.max(np.abs(Z))) if Z.size else 0.0
            if not np.isfinite(top):
                return float("inf")
            if top > 0:
                Z, scale = Z / top, scale / top
            worst = max(worst, relative((c_all[mine] - a) @ Z, scale))
    return worst
