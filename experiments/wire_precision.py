"""Replies in the model's dtype (float32): how far the decoded average moves from float64.

For each exact code and ``(n, s)`` with ``s <= n/4``: partition updates of a float32 model
(``d`` coordinates, Gaussian around a nonzero mean, per-coordinate scales heavy-tailed: a
Student-t with 2 degrees of freedom), replies encoded as the client mod does (float64 sum
``sum_j B_ij n_j u_j``, then rounded to the wire dtype), decoded as the server does (the
code's sparse decoding, :func:`~fl_gradcode.flower.decoder.combine` in the reply dtype, 1/count
in float64). Straggler patterns: none, every contiguous burst of ``s`` (cyclic, up to 16
starts), patterns that leave exactly ``t`` distinct replies in a group (grouped-rs: each group
with ``t > 1`` and no copies, ``t`` adjacent rows at its start, middle and end kept), and
random ones. Per row: ``amplification`` (the code's guaranteed bound where it has one, else the
sampled :func:`~fl_gradcode.flower.decoder.error_amplification`, as ``wire="auto"`` uses
them; ``amplification_is_bound``), ``wire`` (what
``wire="auto"`` chooses), ``max_rel_error_float32`` (max over patterns of
``||avg32 - avg64|| / ||avg64||``, 2-norm; ``max_rel_error_float32_inf`` in the max-norm),
``bytes_ratio`` (a reply's bytes over FedAvg's, whose replies are the float32 model),
``load_overhead`` (load fraction over ``(s+1)/n``); for grouped-rs also the minimum-norm
decoding (``sparse_decoding=False``, every reply read) summed in float32 and in float64, and
``before_float32_budget``: the same measures for the construction without
``max_relative_amplification`` where its matrix differs.

``options`` (codes that cannot use float32, CRC): float64; a two-part reply (hi = float32,
lo = float32 of the residual, on every coordinate or only on the largest ``q`` of them, sent
with their int32 indices); error feedback (the client adds last round's rounding residual
before rounding, numpy simulation over rounds: per-round and cumulative error of the decoded
averages). ``grouped_rs_nodes``: the rounding weight of one RS group with equispaced and
Chebyshev nodes (why the construction changes ``t``, not the nodes).

Run: ``python -m experiments.wire_precision [--quick] [--out results/wire_precision.json]``.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import time

import numpy as np

from experiments.common import save
from fl_gradcode.codes import make_code
from fl_gradcode.flower.decoder import AMPLIFICATION_LIMIT, Decoder, combine, error_amplification

TOL = 1e-6
DIM = 10_000


def updates(k: int, d: int, rng: np.random.Generator,
            heavy: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """``k`` float32 partition deltas (as float64) and example counts; ``heavy``: the
    coordinates' scales are heavy-tailed (else all 1e-3)."""
    scale = 1e-3 * (np.abs(rng.standard_t(2, size=d)) if heavy else np.ones(d))
    scale = scale.astype(np.float32)
    mean = rng.normal(0.5, 0.5, size=d).astype(np.float32)
    u = (scale * (mean + rng.standard_normal((k, d)).astype(np.float32))).astype(np.float32)
    sizes = rng.integers(20, 400, size=k).astype(np.float64)
    return u.astype(np.float64), sizes


def encode(code, u: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every client's float64 reply ``sum_j B_ij w_j n_j u_j`` and its count."""
    coef = code.B * code.weights
    return coef @ (sizes[:, None] * u), coef @ sizes


def decode(code, replies: np.ndarray, counts: np.ndarray, received: list[int],
           dtype, sparse: bool = True) -> np.ndarray:
    """The server's decoded average from ``received`` replies held in ``dtype``."""
    dec = code.sparse_decoding(received) if sparse else code.decoding(received)
    rows = code.chunk_decoder(dec)[0]
    read = [i for i in received if rows[i] != 0.0]
    count = float(sum(float(rows[i]) * float(counts[i]) for i in read))
    out = combine(rows[read], [replies[i] for i in read], dtype, scale=1.0 / count)
    return np.asarray(out, dtype=np.float64)


def patterns(code, rng: np.random.Generator, randoms: int = 8) -> list[tuple[str, list[int]]]:
    """``(kind, stragglers)``: none, contiguous bursts, leave-``t``-in-a-group, random."""
    n, s = code.n, code.s
    out: list[tuple[str, list[int]]] = [("none", [])]
    if s == 0:
        return out
    for start in range(0, n, max(1, n // 16)):
        out.append(("burst", [(start + i) % n for i in range(s)]))
    for plan, (clients, _) in zip(getattr(code, "plans", []), code.blocks, strict=False):
        m = s + plan.t
        if plan.t == 1 or plan.copies:
            continue
        for first in sorted({0, (m - plan.t) // 2, m - plan.t}):
            keep = set(clients[first : first + plan.t])
            out.append(("leave-t", [c for c in clients[:m] if c not in keep]))
    for _ in range(randoms):
        out.append(("random", sorted(rng.choice(n, size=s, replace=False).tolist())))
    return out


def measure(code, d: int, seed: int, sparse: bool = True, accumulate=np.float32) -> dict:
    rng = np.random.default_rng(seed)
    u, sizes = updates(code.k, d, rng)
    truth = (sizes @ u) / sizes.sum()
    r64, counts = encode(code, u, sizes)
    r32 = r64.astype(np.float32)
    worst = {"l2": 0.0, "inf": 0.0, "l2_64": 0.0, "kind": None}
    for kind, stragglers in patterns(code, rng):
        received = sorted(set(range(code.n)) - set(stragglers))
        x64 = decode(code, r64, counts, received, np.float64, sparse)
        x32 = decode(code, r32, counts, received, accumulate, sparse)
        l2 = float(np.linalg.norm(x32 - x64) / np.linalg.norm(x64))
        if l2 > worst["l2"]:
            worst["kind"] = kind
        worst["l2"] = max(worst["l2"], l2)
        worst["inf"] = max(worst["inf"],
                           float(np.max(np.abs(x32 - x64)) / np.max(np.abs(x64))))
        worst["l2_64"] = max(worst["l2_64"],
                             float(np.linalg.norm(x64 - truth) / np.linalg.norm(truth)))
    return worst


def row(name: str, n: int, s: int, d: int, seed: int, **options) -> dict | None:
    try:
        code = make_code(name, n=n, s=s, seed=seed, **options)
    except ValueError:
        return None
    t0 = time.perf_counter()
    bound = code.rounding_amplification  # what wire="auto" uses: a bound within the limit,
    if bound is not None and bound > AMPLIFICATION_LIMIT:  # else the sampled sets
        bound = None
    amp = error_amplification(code, seed=seed) if bound is None else bound
    wire = Decoder(None, seed=seed, wire="auto").wire_for(code)
    worst = measure(code, d, seed)
    dense = dense64 = None
    if name == "grouped-rs":  # sparse_decoding=False; and float32 replies summed in float64
        dense = measure(code, d, seed, sparse=False)["l2"]
        dense64 = measure(code, d, seed, sparse=False, accumulate=np.float64)["l2"]
    return {
        "code": name, "n": n, "s": s, "k": code.k,
        "amplification": amp, "amplification_is_bound": bound is not None,
        "wire": wire,
        "max_rel_error_float32": worst["l2"], "max_rel_error_float32_inf": worst["inf"],
        "max_rel_error_float32_dense_decoding": dense,
        "max_rel_error_float32_dense_decoding_float64_sum": dense64,
        "worst_pattern": worst["kind"], "max_rel_error_float64_vs_exact": worst["l2_64"],
        "float32_within_tol": worst["l2"] <= TOL and worst["inf"] <= TOL,
        "bytes_ratio": 1.0 if wire == "model" else 2.0,
        "load_overhead": code.load_fraction / ((s + 1) / n),
        "seconds": time.perf_counter() - t0,
    }


def before(n: int, s: int, d: int, seed: int) -> dict | None:
    """grouped-rs without the float32 budget (the construction before it), where it differs."""
    old = make_code("grouped-rs", n=n, s=s, max_relative_amplification=None)
    if np.array_equal(old.B, make_code("grouped-rs", n=n, s=s).B):
        return None
    r = row("grouped-rs", n, s, d, seed, max_relative_amplification=None)
    return {k: r[k] for k in ("k", "amplification", "wire", "max_rel_error_float32",
                              "max_rel_error_float32_inf", "worst_pattern", "bytes_ratio",
                              "load_overhead")}


def crc_options(n: int, s: int, d: int, seed: int, heavy: bool, rounds: int = 30) -> dict:
    """Float64, two-part (hi/lo), partial two-part, error feedback, for a CRC code (replies
    decoded in float64 here: only the wire's rounding counts)."""
    code = make_code("crc", n=n, s=s, seed=seed)
    rng = np.random.default_rng(seed)
    u, sizes = updates(code.k, d, rng, heavy)
    r64, counts = encode(code, u, sizes)
    sets = [sorted(set(range(n)) - set(st)) for _, st in patterns(code, rng, randoms=4)]

    def worst(replies: np.ndarray, extra: np.ndarray | None = None) -> float:
        err = 0.0
        for received in sets:
            x64 = decode(code, r64, counts, received, np.float64)
            x = decode(code, replies, counts, received, np.float64)
            if extra is not None:
                x = x + decode(code, extra, counts, received, np.float64)
            err = max(err, float(np.linalg.norm(x - x64) / np.linalg.norm(x64)))
        return err

    hi = r64.astype(np.float32).astype(np.float64)
    lo = (r64 - hi).astype(np.float32).astype(np.float64)
    out = {"code": "crc", "n": n, "s": s, "heavy_tailed": heavy,
           "amplification": error_amplification(code, seed=seed),
           "float32": {"bytes_ratio": 1.0, "max_rel_error": worst(hi)},
           "float64": {"bytes_ratio": 2.0,
                       "max_rel_error": worst(r64.astype(np.float64))},
           "two_part": {"bytes_ratio": 2.0, "max_rel_error": worst(hi, lo)}}
    for q in (0.01, 0.1, 0.5):  # lo only on each reply's largest q of the coordinates
        top = np.argsort(-np.abs(r64), axis=1)[:, : max(1, int(q * d))]
        part = np.zeros_like(lo)
        np.put_along_axis(part, top, np.take_along_axis(lo, top, axis=1), axis=1)
        out[f"two_part_top{q:g}"] = {"bytes_ratio": 1.0 + 2.0 * q,
                                     "max_rel_error": worst(hi, part)}
    out["error_feedback"] = {
        "random_stragglers": error_feedback(code, d, seed, rounds, heavy, fixed=False),
        "same_stragglers": error_feedback(code, d, seed, rounds, heavy, fixed=True)}
    return out


def error_feedback(code, d: int, seed: int, rounds: int, heavy: bool, fixed: bool) -> dict:
    """Per-round and cumulative error of the decoded averages over ``rounds`` rounds, float32
    replies with and without the client carrying its rounding residual (stragglers keep
    theirs: their reply was computed, not received); ``fixed``: the same stragglers every
    round (the case where the residuals telescope)."""
    rng = np.random.default_rng(seed + 1)
    n, s = code.n, code.s
    first = sorted(rng.choice(n, size=n - s, replace=False).tolist())
    residual = np.zeros((n, d))
    per_round = {"plain": 0.0, "feedback": 0.0}
    total = {"plain": np.zeros(d), "feedback": np.zeros(d), "float64": np.zeros(d)}
    for _ in range(rounds):
        u, sizes = updates(code.k, d, rng, heavy)
        r64, counts = encode(code, u, sizes)
        received = first if fixed else sorted(rng.choice(n, size=n - s, replace=False).tolist())
        x64 = decode(code, r64, counts, received, np.float64)
        plain = decode(code, r64.astype(np.float32), counts, received, np.float32)
        wanted = r64 + residual
        sent = wanted.astype(np.float32)
        residual = wanted - sent.astype(np.float64)
        fed = decode(code, sent, counts, received, np.float32)
        norm = np.linalg.norm(x64)
        per_round["plain"] = max(per_round["plain"], float(np.linalg.norm(plain - x64) / norm))
        per_round["feedback"] = max(per_round["feedback"],
                                    float(np.linalg.norm(fed - x64) / norm))
        total["plain"] += plain
        total["feedback"] += fed
        total["float64"] += x64
    ref = np.linalg.norm(total["float64"])
    return {"rounds": rounds,
            "max_rel_error_per_round": per_round,
            "rel_error_of_sum_over_rounds": {
                k: float(np.linalg.norm(total[k] - total["float64"]) / ref)
                for k in ("plain", "feedback")}}


def node_comparison() -> list[dict]:
    """Worst ``sum_{w in S} |a_w| ||B_w||_1`` of one RS group, equispaced vs Chebyshev nodes."""
    rows = []
    for s, t in [(4, 2), (10, 2), (10, 3), (32, 2), (32, 3)]:
        m = s + t
        entry = {"s": s, "t": t}
        for label, x in [("equispaced", np.linspace(-1.0, 1.0, m)),
                         ("chebyshev", np.cos(np.pi * (2 * np.arange(m) + 1) / (2 * m)))]:
            block = np.zeros((m, m))
            for j in range(m):
                missing = [(j + q) % m for q in range(1, t)]
                for p in range(m):
                    block[p, j] = np.prod(x[p] - x[missing])
            l1 = np.abs(block).sum(axis=1)
            best = 0.0
            for sub in itertools.combinations(range(m), t):
                a = np.array([1.0 / np.prod([x[w] - x[v] for v in sub if v != w]) for w in sub])
                best = max(best, float(np.sum(np.abs(a) * l1[list(sub)])))
            entry[label] = best / m  # relative to the group's m partitions
        rows.append(entry)
    return rows


def grid(quick: bool) -> list[tuple[str, int, int]]:
    ns = [10, 20, 64, 100] if quick else [8, 10, 16, 20, 22, 30, 31, 50, 64, 100, 128, 200, 256]
    out = []
    for n in ns:
        ss = sorted({1, 2, 3, 4, max(1, n // 8), max(1, (n // 4) - 1), n // 4} - {0})
        for s in ss:
            if s > n // 4:
                continue
            out.append(("grouped-rs", n, s))
            if n <= 100 or s in (1, 4, n // 8):
                out.append(("crc", n, s))
            out.append(("frc", n, s))
            if n <= 100:
                out.append(("nested", n, s))
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dim", type=int, default=DIM)
    parser.add_argument("--out", default="results/wire_precision.json")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    rows = []
    for name, n, s in grid(args.quick):
        r = row(name, n, s, args.dim, args.seed)
        if r is None:
            continue
        if name == "grouped-rs":
            r["before_float32_budget"] = before(n, s, args.dim, args.seed)
        rows.append(r)
        print(f"{name:>10} n={n:3d} s={s:2d} amp={r['amplification']:9.3g} wire={r['wire']:7s} "
              f"err32={r['max_rel_error_float32']:.2e} ({r['worst_pattern']}) "
              f"load_overhead={r['load_overhead']:.3f}", flush=True)
    options = [crc_options(n, s, args.dim, args.seed, heavy) for n, s in
               ([(20, 4)] if args.quick else [(20, 4), (30, 3), (64, 8)])
               for heavy in (True, False)]
    for o in options:
        print({k: v for k, v in o.items() if k != "error_feedback"}, o["error_feedback"])
    default = [r for r in rows if r["code"] == "grouped-rs"]
    result = {
        "description": __doc__.splitlines()[0],
        "seed": args.seed, "dim": args.dim, "tolerance": TOL,
        "loadavg": os.getloadavg(), "seconds": time.perf_counter() - t0,
        "default_code_all_within_tol": all(r["float32_within_tol"] and r["wire"] == "model"
                                           for r in default),
        "rows": rows, "options": options, "grouped_rs_nodes": node_comparison(),
        "float32_unit_roundoff": math.ldexp(1.0, -24),
    }
    print("default code within tolerance everywhere:", result["default_code_all_within_tol"])
    save(result, args.out)
    return result


if __name__ == "__main__":
    main()
