"""Replies for the decoder tests (``test_decoder_*.py``), shared by several of them.

A two-array model (``SHAPES``: 19 values and the count, so m = 3 does not divide it), every
worker's coded reply through the code's own ``encode`` laid out as the mod sends it
(``problem``), the numpy reference average (``average``), a ``Decoder`` with
``GradientCoding``'s defaults (``make_decoder``) and one decode through ``Decoder.decode``
(``decode``)."""

from __future__ import annotations

import numpy as np
from flwr.serverapp.strategy import FedAvg

from fl_gradcode.flower import protocol
from fl_gradcode.flower.decoder import Decoder, ReplyLayout
from fl_gradcode.flower.protocol import CodedReply

SHAPES = {"w": (5, 3), "b": (4,)}  # 19 values + the count: m = 3 does not divide 20


def make_decoder(inner, privatiser=None, **options):
    """A Decoder with ``GradientCoding``'s defaults (``wire="auto"``, seed 0) unless
    ``options`` set them."""
    return Decoder(inner, privatiser, **{"wire": "auto", "seed": 0, **options})


def _model(rng, dtype=np.float64):
    return {k: rng.standard_normal(v).astype(dtype) for k, v in SHAPES.items()}


def problem(code, seed=0, wire=np.float64):
    """Per partition ``y_j = [n_j dtheta_j..., n_j]``; every worker's coded reply (through the
    code's own ``encode``), laid out as the mod sends it."""
    rng = np.random.default_rng(seed)
    theta = _model(rng)
    sizes = rng.integers(3, 20, size=code.k).astype(float)
    deltas = [_model(rng) for _ in range(code.k)]
    y = {j: np.concatenate([sizes[j] * np.concatenate([deltas[j][k].ravel() for k in SHAPES]),
                            [sizes[j]]]) for j in range(code.k)}
    layout = ReplyLayout.of(code, theta)
    replies = {}
    for i in range(code.n):
        message = code.encode(i, y)
        if layout.count_in_record:
            arrays, start = {}, 0
            for name, shape in SHAPES.items():
                size = int(np.prod(shape))
                arrays[name] = message[start:start + size].reshape(shape).astype(wire)
                start += size
            count = float(message[-1])
        else:
            arrays, count = {protocol.CHUNK_KEY: message.astype(wire)}, 1.0
        replies[i] = CodedReply(node=100 + i, worker=i, arrays=arrays, num_examples=count,
                                sizes=(), metrics={}, compute_s=0.0)
    return theta, sizes, deltas, replies


def average(theta, sizes, deltas, alpha=None):
    """numpy reference: ``theta + sum_j alpha_j n_j dtheta_j / sum_j alpha_j n_j``."""
    alpha = np.ones(len(sizes)) if alpha is None else alpha
    count = float(np.sum(alpha * sizes))
    return {k: theta[k] + sum(a * n * d[k] for a, n, d in zip(alpha, sizes, deltas,
                                                             strict=True)) / count
            for k in SHAPES}


def decode(code, replies, used, theta, decoder=None, dtypes=None, sizes=None):
    decoder = decoder or make_decoder(FedAvg())
    decoding = decoder.decoding(code, used)
    dtypes = dtypes or {k: v.dtype for k, v in theta.items()}
    return decoder.decode(code, replies, used, decoding, theta, dtypes, round_number=1,
                          sizes=sizes or {})
