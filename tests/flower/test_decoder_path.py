"""One decoder path for every code: plain, approximate and communication-efficient replies go
through ``Decoder.decode``; the count check, central noise, finiteness check and cast are
tested once on that path; each code's chunk coefficients are checked against its ``B``."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg

from fl_gradcode.codes import available_codes, make_code
from fl_gradcode.flower import GradientCoding, gradient_coding_mod, protocol
from fl_gradcode.flower.decoder import (
    Decoder,
    ReplyLayout,
    cast,
    combine,
    error_amplification,
    instruction_chunks,
    replies_read,
    wire_dtypes,
)
from fl_gradcode.flower.privatiser import Privatiser
from fl_gradcode.flower.protocol import CodedReply
from fl_gradcode.flower.testing import InProcessGrid
from fl_gradcode.privacy import DPConfig, ServerNoise, make_mechanism

SHAPES = {"w": (5, 3), "b": (4,)}  # 19 values + the count: m = 3 does not divide 20


def _decoder(inner, privatiser=None, **options):
    """A Decoder with ``GradientCoding``'s defaults (``wire="auto"``, seed 0) unless
    ``options`` set them."""
    return Decoder(inner, privatiser, **{"wire": "auto", "seed": 0, **options})


def _model(rng, dtype=np.float64):
    return {k: rng.standard_normal(v).astype(dtype) for k, v in SHAPES.items()}


def _problem(code, seed=0, wire=np.float64):
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


def _average(theta, sizes, deltas, alpha=None):
    """numpy reference: ``theta + sum_j alpha_j n_j dtheta_j / sum_j alpha_j n_j``."""
    alpha = np.ones(len(sizes)) if alpha is None else alpha
    count = float(np.sum(alpha * sizes))
    return {k: theta[k] + sum(a * n * d[k] for a, n, d in zip(alpha, sizes, deltas,
                                                             strict=True)) / count
            for k in SHAPES}


def _decode(code, replies, used, theta, decoder=None, dtypes=None, sizes=None):
    decoder = decoder or _decoder(FedAvg())
    decoding = decoder.decoding(code, used)
    dtypes = dtypes or {k: v.dtype for k, v in theta.items()}
    return decoder.decode(code, replies, used, decoding, theta, dtypes, round_number=1,
                          sizes=sizes or {})


# ================================================================== same results, one path
@pytest.mark.parametrize(("name", "n", "s", "options"), [
    ("uncoded", 6, 0, {}),
    ("frc", 6, 1, {}),
    ("crc", 6, 2, {}),
    ("grouped-rs", 7, 2, {}),
    ("nested", 8, 2, {}),
    ("comm-efficient", 6, 1, {"m": 2}),
    ("comm-efficient", 8, 1, {"m": 3}),
    ("comm-efficient", 6, 1, {"m": 1}),
])
def test_exact_codes_decode_the_example_weighted_average(name, n, s, options):
    code = make_code(name, n=n, s=s, **options)
    theta, sizes, deltas, replies = _problem(code)
    expected = _average(theta, sizes, deltas)
    for used in (list(range(n)), list(range(s, n)), list(range(n - s))):
        used = sorted(used)
        decoded = _decode(code, replies, used, theta)
        assert decoded is not None
        assert decoded.count == pytest.approx(sizes.sum(), rel=1e-12)
        for k in SHAPES:
            np.testing.assert_allclose(decoded.arrays[k].numpy(), expected[k], rtol=1e-9,
                                       atol=1e-11)


@pytest.mark.parametrize(("name", "options"), [("bgc", {}), ("expander", {}),
                                               ("ignore-stragglers", {"rescale": False})])
def test_approximate_codes_decode_the_least_squares_combination(name, options):
    n, s = 10, 3
    code = make_code(name, n=n, s=s, seed=4, **options)
    theta, sizes, deltas, replies = _problem(code, seed=2)
    used = [0, 2, 3, 5, 6, 8, 9]
    # independent: min-norm least squares on B_F^T a = 1 (unit weights); alpha = B_F^T a
    B_F = code.B[used]
    alpha = B_F.T @ (np.linalg.pinv(B_F.T) @ np.ones(code.k))
    expected = _average(theta, sizes, deltas, alpha)
    decoded = _decode(code, replies, used, theta)
    assert decoded is not None
    for k in SHAPES:
        np.testing.assert_allclose(decoded.arrays[k].numpy(), expected[k], rtol=1e-8,
                                   atol=1e-10)


def test_plain_and_chunked_replies_go_through_the_same_decode():
    """The same decoder object decodes a plain and a comm-efficient round in turn."""
    decoder = _decoder(FedAvg())
    for code in (make_code("frc", n=6, s=1), make_code("comm-efficient", n=6, s=1, m=2)):
        theta, sizes, deltas, replies = _problem(code)
        decoded = _decode(code, replies, list(range(1, 6)), theta, decoder=decoder)
        np.testing.assert_allclose(decoded.arrays["w"].numpy(),
                                   _average(theta, sizes, deltas)["w"], rtol=1e-9)


# ================================================================== checks, once
@pytest.mark.parametrize("name", ["frc", "comm-efficient"])
def test_a_count_that_does_not_decode_positive_skips_the_round(name, caplog):
    code = make_code(name, n=6, s=1)
    theta, _, _, replies = _problem(code)
    for r in replies.values():  # every partition claims no examples: the count is 0
        if protocol.CHUNK_KEY in r.arrays:
            r.arrays[protocol.CHUNK_KEY][:] = 0.0
        r.num_examples = 0.0
    with caplog.at_level(logging.WARNING):
        assert _decode(code, replies, list(range(6)), theta) is None
    assert "decoded example count" in caplog.text


@pytest.mark.parametrize("name", ["frc", "comm-efficient"])
def test_a_non_finite_reply_is_found_and_the_model_is_not_released(name, caplog):
    code = make_code(name, n=6, s=1)
    theta, _, _, replies = _problem(code)
    key = next(iter(replies[2].arrays))
    replies[2].arrays[key].reshape(-1)[0] = np.nan
    assert Decoder.non_finite(replies, list(range(6))) == {
        2: f"array {key!r} contains NaN or Inf"}
    used = list(range(6))
    decoder = _decoder(FedAvg(), sparse=False)  # dense: every reply is read
    with caplog.at_level(logging.WARNING):
        assert _decode(code, replies, used, theta, decoder=decoder) is None
    assert "not finite" in caplog.text


def test_the_model_keeps_its_dtypes_integers_rounded():
    code = make_code("frc", n=4, s=1)
    theta, sizes, deltas, replies = _problem(code)
    dtypes = {"w": np.dtype(np.float32), "b": np.dtype(np.int64)}
    decoded = _decode(code, replies, [0, 1, 2, 3], theta, dtypes=dtypes)
    expected = _average(theta, sizes, deltas)
    assert decoded.arrays["w"].numpy().dtype == np.float32
    np.testing.assert_allclose(decoded.arrays["w"].numpy(), expected["w"], rtol=1e-6)
    np.testing.assert_array_equal(decoded.arrays["b"].numpy(), np.rint(expected["b"]))
    assert cast(np.array([1.5, -2.5, 0.4]), np.dtype(np.int32)).tolist() == [2, -2, 0]


@pytest.mark.parametrize("name", ["frc", "grouped-rs", "comm-efficient"])
def test_central_noise_is_the_privatisers_draw_sized_from_the_checked_sizes(name):
    code = make_code(name, n=6, s=1)
    theta, sizes, _, replies = _problem(code)
    dp = DPConfig(mode="central", noise_multiplier=0.5, clip_norm=2.0)
    noise = ServerNoise(b"k" * 32)
    privatiser = Privatiser(dp, make_mechanism(dp), noise, "nonce", {})
    checked = dict(enumerate(sizes))
    used = list(range(1, 6))
    decoded = _decode(code, replies, used, theta, decoder=_decoder(FedAvg(), privatiser),
                      sizes=checked)
    plain = _decode(code, replies, used, theta)
    std = 0.5 * 2.0 * sizes.max() / sizes.sum()  # exact decoding: alpha = 1
    assert decoded.noise_std == pytest.approx(std, rel=1e-12)
    drawn = noise.draw(sum(int(np.prod(s)) for s in SHAPES.values()), decoded.noise_std, 1,
                       "nonce")
    got = np.concatenate([(decoded.arrays[k].numpy() - plain.arrays[k].numpy()).ravel()
                          for k in SHAPES])
    np.testing.assert_allclose(got, drawn, rtol=1e-9, atol=1e-12)
    # no checked size for a partition the decoding weighs: the round is not released
    assert _decode(code, replies, used, theta, decoder=_decoder(FedAvg(), privatiser),
                   sizes={0: sizes[0]}) is None


# ================================================================== codes' own chunks
@pytest.mark.parametrize("name", available_codes())
def test_chunk_coefficients_and_decoder_agree_with_the_codes_B(name):
    options = {"m": 3} if name == "comm-efficient" else {}
    code = make_code(name, n=9, s=2, seed=1, **options)
    m = code.chunks
    coefficients = np.array([code.chunk_coefficients(i) for i in range(code.n)])  # n x m
    assert coefficients.shape == (code.n, m)
    used = [i for i in range(code.n) if i not in (1, 5)]
    decoding = code.decoding(used)
    D = code.chunk_decoder(decoding)
    assert D.shape == (m, code.n)
    assert np.all(D[:, [1, 5]] == 0)
    if m == 1:
        assert np.all(coefficients == 1.0)
        assert instruction_chunks(code, 0) == ()
        # one chunk: its row is the decoding vector, so D B = alpha (1 when exact)
        np.testing.assert_allclose(D[0] @ code.B, decoding.alpha, atol=1e-9)
        return
    assert instruction_chunks(code, 4) == tuple(coefficients[4])
    # m chunks: workers with the same row of B form a group that mixes the same m chunks;
    # from the group's received members, D recovers each chunk: D_T C_T = I (C_T: |T| x m)
    rows = {tuple(code.B[i]) for i in range(code.n)}
    for row in rows:
        group = [i for i in range(code.n) if tuple(code.B[i]) == row]
        got = [i for i in group if i in used]
        assert len(got) >= m
        np.testing.assert_allclose(D[:, got] @ coefficients[got], np.eye(m), atol=1e-9)
        # any m members' coefficients are independent (MDS): any m replies decode the group
        assert np.linalg.matrix_rank(coefficients[group[:m]]) == m


def test_error_amplification_reads_every_chunk_row():
    frc = make_code("frc", n=8, s=1)
    assert error_amplification(frc, seed=0) == pytest.approx(1.0)
    code = make_code("comm-efficient", n=8, s=1, m=2)
    rng = np.random.default_rng(0)
    n, s = code.n, code.s
    sets = [list(range(n))]
    sets += [sorted(rng.choice(n, size=n - s, replace=False).tolist()) for _ in range(24)]
    sets += [[i for i in range(n) if (i - start) % n >= s] for start in range(0, n, 1)]
    row_l1 = np.abs(code.B).sum(axis=1)
    worst = max(float(np.abs(np.asarray(code.decoding(f).coefficients)).sum(axis=0) @ row_l1)
                for f in sets) / code.k
    assert error_amplification(code, seed=0) == pytest.approx(worst)


def test_replies_read_counts_the_replies_any_chunk_row_reads():
    frc = make_code("frc", n=6, s=1)
    assert replies_read(frc.sparse_decoding(list(range(6))), list(range(6))) == 3
    code = make_code("comm-efficient", n=6, s=1, m=2)
    assert replies_read(code.decoding([0, 1, 3, 4, 5]), [0, 1, 3, 4, 5]) == 5


def test_wire_dtypes_follow_the_layout():
    dtypes = {"w": np.dtype(np.float32), "b": np.dtype(np.int64)}
    frc, chunked = make_code("frc", n=4, s=1), make_code("comm-efficient", n=6, s=1, m=2)
    assert wire_dtypes(frc, dtypes, "model") == {"w": np.float32, "b": np.float64}
    assert wire_dtypes(frc, dtypes, "float64") == {"w": np.float64, "b": np.float64}
    assert wire_dtypes(chunked, dtypes, "model") == {protocol.CHUNK_KEY: np.float64}
    only32 = {"w": np.dtype(np.float32)}
    assert wire_dtypes(chunked, only32, "model") == {protocol.CHUNK_KEY: np.float32}
    assert wire_dtypes(chunked, only32, "float64") == {protocol.CHUNK_KEY: np.float64}


@pytest.mark.parametrize(("dim", "m"), [(19, 1), (19, 2), (19, 3), (20, 3), (1, 4)])
def test_the_layout_covers_the_decoded_vector_once(dim, m):
    theta = {"a": np.zeros(dim - 1), "z": np.zeros(1)} if dim > 1 else {"a": np.zeros(1)}
    code = make_code("comm-efficient", n=max(m + 1, 4), s=1, m=m)
    layout = ReplyLayout.of(code, theta)
    seen = []
    for chunk, segment, first, last in layout.pieces(0, dim + 1):
        assert 0 <= chunk < m and first < last
        bounds = np.cumsum([0, *(int(np.prod(s)) for s in layout.arrays.values()),
                            int(layout.count_in_record)])
        seen.extend(chunk * layout.length + bounds[segment] + q for q in range(first, last))
    assert seen == list(range(dim + 1))
    assert layout.length == -(-(dim + 1) // m)


# ================================================================== through the strategy
def _train(msg: Message, context) -> Message:
    pid = int(context.node_config["partition-id"])
    new = {}
    for name, shape in SHAPES.items():
        theta = msg.content["arrays"][name].numpy()
        target = np.random.default_rng([5, pid, len(name)]).standard_normal(shape)
        new[name] = Array((theta - 0.3 * (theta - target)).astype(np.float32))
    return Message(RecordDict({"arrays": ArrayRecord(new),
                               "metrics": MetricRecord({"num-examples": 7 + 2 * pid})}),
                   reply_to=msg)


def test_comm_efficient_with_one_chunk_decodes_through_the_strategy():
    """m = 1: a reply is the group sum itself (the model's arrays); its decoder is a 1 x n
    matrix, read through the one path like every other code's."""
    n = 6
    app = ClientApp(mods=[gradient_coding_mod])
    app.train()(_train)
    strategy = GradientCoding(FedAvg(fraction_evaluate=0.0, min_available_nodes=n),
                              code="comm-efficient", s=1, m=1, seed=1,
                              measured_compute=False)
    initial = ArrayRecord({k: Array(np.zeros(v, np.float32)) for k, v in SHAPES.items()})
    result = strategy.start(grid=InProcessGrid(app, n), initial_arrays=initial, num_rounds=2,
                            train_config=ConfigRecord({}))
    assert [r["decode"] for r in strategy.history] == ["exact", "exact"]
    sizes = np.array([7 + 2 * j for j in range(n)], dtype=float)
    theta = {k: np.zeros(v) for k, v in SHAPES.items()}
    for _ in range(2):
        theta = {k: sum(sizes[j] * (t - 0.3 * (t - np.random.default_rng(
            [5, j, len(k)]).standard_normal(SHAPES[k]))) for j in range(n)) / sizes.sum()
            for k, t in theta.items()}
    for k in SHAPES:
        np.testing.assert_allclose(result.arrays[k].numpy(), theta[k], atol=1e-5)


# ================================================================== edges of the one path
def test_metrics_are_decoded_like_the_count_and_a_fractional_count_is_kept():
    code = make_code("uncoded", n=3, s=0)
    theta, _, _, replies = _problem(code)
    for i, r in replies.items():
        r.metrics = {"loss": float(i + 1)}
        r.num_examples = 0.25  # a count below 1 (weighted data): still an average
        for a in r.arrays.values():
            a *= 0.25 / 1e3
    decoded = _decode(code, replies, [0, 1, 2], theta)
    assert decoded is not None and decoded.count == pytest.approx(0.75)
    assert decoded.metrics == {"loss": pytest.approx((1 + 2 + 3) / 0.75)}


def test_float32_replies_are_summed_in_float32_and_comm_efficient_ones_in_float64():
    code = make_code("uncoded", n=6, s=0)  # decoder: all ones
    theta, _, _, replies = _problem(code, wire=np.float32)
    theta = {k: v.astype(np.float32) for k, v in theta.items()}
    decoded = _decode(code, replies, list(range(6)), theta)
    count = sum(r.num_examples for r in replies.values())
    for k in SHAPES:
        acc = replies[0].arrays[k].reshape(-1).copy()
        for i in range(1, 6):
            acc += replies[i].arrays[k].reshape(-1)
        acc *= np.float32(1.0 / count)
        acc += theta[k].reshape(-1)
        np.testing.assert_array_equal(decoded.arrays[k].numpy().reshape(-1), acc)
    chunked = make_code("comm-efficient", n=6, s=1, m=2)
    assert code.decodes_in_reply_dtype and not chunked.decodes_in_reply_dtype


def test_an_empty_model_array_decodes_to_an_empty_array():
    code = make_code("frc", n=4, s=1)
    theta, sizes, deltas, replies = _problem(code)
    theta["e"] = np.zeros(0, dtype=np.float32)
    for r in replies.values():
        r.arrays["e"] = np.zeros(0)
    decoded = _decode(code, replies, [0, 1, 2, 3], theta)
    assert decoded.arrays["e"].numpy().shape == (0,)
    np.testing.assert_allclose(decoded.arrays["w"].numpy(), _average(theta, sizes, deltas)["w"])


def _large_model(seed: int, b: float):
    """Two arrays of 2^19 + 1 values (more than 2^20 in all: decoded in threads), array "b"
    filled with ``b``, and four replies of standard normal values (2 examples each)."""
    rng = np.random.default_rng(seed)
    size = (1 << 19) + 1
    theta = {"a": np.zeros(size), "b": np.full(size, b)}
    replies = {i: CodedReply(node=i, worker=i, arrays={k: rng.standard_normal(size)
                                                        for k in theta},
                             num_examples=2.0, sizes=(), metrics={}, compute_s=0.0)
               for i in range(4)}
    return theta, replies


def test_a_large_model_is_decoded_array_by_array_in_threads():
    code = make_code("frc", n=4, s=1)
    theta, replies = _large_model(seed=0, b=0.0)
    decoded = _decode(code, replies, [0, 2], theta)  # FRC groups {0, 1} and {2, 3}
    for k in theta:
        np.testing.assert_allclose(decoded.arrays[k].numpy(),
                                   (replies[0].arrays[k] + replies[2].arrays[k]) / 4.0)


def test_combine_cast_and_replies_read_edges():
    v = np.arange(4, dtype=np.float32)
    out = combine([2.0], [v], np.float32, scale=2.0)
    assert out.dtype == np.float32 and out.tolist() == [0.0, 4.0, 8.0, 12.0]
    np.testing.assert_array_equal(combine([0.0], [v], np.float64, offset=v + 1.0), v + 1.0)
    assert cast(v, np.dtype(np.float32)) is v  # no copy of a model already in its dtype
    frc = make_code("frc", n=6, s=2)  # two groups of three: one reply read per group
    assert replies_read(_decoder(FedAvg()).decoding(frc, list(range(6))), range(6)) == 2
    assert replies_read(frc.decoding(list(range(6))), range(6)) == 6


class _NaNInner(FedAvg):
    def aggregate_train(self, server_round, replies):
        arrays, metrics = super().aggregate_train(server_round, replies)
        return ArrayRecord({k: Array(np.full_like(v.numpy(), np.nan))
                            for k, v in arrays.items()}), metrics


class _Averaging:
    """An inner strategy without ``weighted_by_key`` (counts as ``num-examples``)."""

    def aggregate_train(self, server_round, replies):
        [reply] = replies
        self.weight = reply.content["metrics"]["num-examples"]
        return reply.content["arrays"], None


def test_the_decoded_average_reaches_any_inner_strategy_as_one_reply():
    code = make_code("frc", n=4, s=1)
    theta, sizes, _, replies = _problem(code)
    decoded = _decode(code, replies, [0, 1, 2, 3], theta)
    sent = Message(RecordDict({}), dst_node_id=1, message_type="train")
    for inner in (FedAvg(), _Averaging()):
        outcome = _decoder(inner).apply(decoded, round_number=1, array_key="arrays",
                                       reply_to=sent)
        assert outcome.num_examples == decoded.count == pytest.approx(sizes.sum())
        np.testing.assert_array_equal(outcome.arrays["w"].numpy(),
                                      decoded.arrays["w"].numpy())
    assert inner.weight == decoded.count
    assert _decoder(_NaNInner()).apply(decoded, round_number=1, array_key="arrays",
                                      reply_to=sent) is None


# ================================================================== the privatiser
def test_privatiser_logs_outlying_sizes_and_unsized_noise(caplog):
    code = make_code("uncoded", n=4, s=0)
    privatiser = Privatiser(DPConfig(mode="central", noise_multiplier=1.0, clip_norm=1.0),
                            None, ServerNoise(), "n", {})
    from fl_gradcode.flower.protocol import Identity

    partitions = [Identity(j, 4) for j in range(4)]
    reported = {0: (10.0,), 1: (10.0,), 2: (10.0,), 3: (5000.0,)}
    with caplog.at_level(logging.WARNING):
        agreed, excluded = privatiser.check_sizes(code, partitions, reported, 7)
        assert privatiser.noise_std(code, code.decoding([0, 1]), [0, 1], 20.0, {}, 7) is None
    assert agreed == {0: 10.0, 1: 10.0, 2: 10.0, 3: 5000.0} and excluded == {}
    assert privatiser.partition_sizes[(3, 4)] == 5000.0
    assert ("round 7: partition (3, 4) reports 5000 examples, 500 times the median (10); "
            "no replica contradicts it") in caplog.text
    assert "round 7: central DP noise cannot be sized (no checked size for partitions" \
        in caplog.text


def test_privatiser_accounts_independent_noise_only_under_partition_dp():
    from fl_gradcode.privacy import independent_noise_multiplier

    code = make_code("frc", n=4, s=1)

    def multiplier(mode, noise):
        dp = DPConfig(mode=mode, noise=noise, noise_multiplier=1.5, clip_norm=1.0)
        return Privatiser(dp, None, ServerNoise(), "n", {}).noise_multiplier(code)

    assert multiplier("partition", "independent") == independent_noise_multiplier(code.B, 1.5)
    assert multiplier("partition", "identical") is None
    assert multiplier("central", "independent") is None


def test_auto_wire_sends_float64_for_a_code_that_amplifies_rounding_beyond_the_limit():
    decoder = _decoder(FedAvg())
    crc = make_code("crc", 8, 3)  # error amplification about 50 (> 8)
    assert error_amplification(crc, seed=0) > 8
    assert decoder.wire_for(crc) == "float64"
    assert decoder.wire_for(make_code("grouped-rs", 8, 3)) == "model"  # amplification 1
    assert _decoder(FedAvg(), wire="float64").wire_for(make_code("frc", 4, 1)) == "float64"


def test_a_non_finite_inner_model_is_named_with_its_round_in_the_log(caplog):
    code = make_code("frc", n=4, s=1)
    theta, _, _, replies = _problem(code)
    decoded = _decode(code, replies, [0, 1, 2, 3], theta)
    sent = Message(RecordDict({}), dst_node_id=1, message_type="train")
    with caplog.at_level(logging.WARNING, logger="flwr"):
        assert _decoder(_NaNInner()).apply(decoded, round_number=7, array_key="arrays",
                                          reply_to=sent) is None
    assert [r.getMessage() for r in caplog.records] == [
        "round 7: inner strategy produced a non-finite model; kept the previous one"]


def _decode_in_a_round(code, theta, valid, used, sparse, *, integrity=None, probe=None,
                       max_decode_error=0.5):
    """Round 1 of ``code`` on nodes 100, 101, ... holding the replies ``valid``, decoded over
    ``used`` by a RoundAggregator with a fresh verifier (``integrity`` options, the round's
    cross-check ``probe``) and quarantine: ``(outcome, arrays, state)``."""
    import dataclasses

    from fl_gradcode.flower.aggregator import RoundAggregator
    from fl_gradcode.flower.collector import Arrivals
    from fl_gradcode.flower.deadline_policy import DeadlinePolicy
    from fl_gradcode.flower.dispatch import Requests
    from fl_gradcode.flower.options import DeadlineOptions, IntegrityOptions
    from fl_gradcode.flower.quarantine import Quarantine
    from fl_gradcode.flower.round_state import RoundPlan, RoundState
    from fl_gradcode.flower.verifier import RoundVerifier, Verification

    cohort = [100 + w for w in range(code.n)]
    plan = RoundPlan(
        number=1, code=code, cohort=tuple(cohort), partitions=(), busy=(), excluded=(),
        quarantined=(), layout={k: v.shape for k, v in theta.items()}, reply_layout={},
        dtypes={k: v.dtype for k, v in theta.items()}, theta=theta, array_key="arrays",
        wire="float64", wall_start=0.0, probe=probe)
    requests = Requests({w: Message(RecordDict({}), dst_node_id=n, message_type="train")
                         for w, n in enumerate(cohort)})
    arrivals = Arrivals(code)
    for worker, reply in valid.items():
        arrivals.accept(worker, reply)
    state = RoundState(plan, requests, arrivals, verification=Verification(tuple(used), None))
    verifier = RoundVerifier(integrity or IntegrityOptions(),
                             DeadlinePolicy(DeadlineOptions(), False), Quarantine())
    aggregator = RoundAggregator(decoder=_decoder(FedAvg(), sparse=sparse), verifier=verifier,
                                 max_decode_error=max_decode_error)
    state, arrays, _ = aggregator.decode(state)
    assert dataclasses.is_dataclass(state)
    return state.outcome, arrays, state


def _aggregate_with_a_nan_reply(sparse):
    """FRC n=4, s=1, every reply in hand, reply 1 holding a NaN its decoding may not read."""
    code = make_code("frc", n=4, s=1)
    theta, sizes, deltas, replies = _problem(code)
    replies[1].arrays["w"][0, 0] = np.nan
    outcome, arrays, state = _decode_in_a_round(code, theta, dict(replies), [0, 1, 2, 3],
                                                sparse)
    return outcome, arrays, state, _average(theta, sizes, deltas)


def test_a_reply_whose_nan_spoils_the_decoded_model_is_rejected_and_the_round_decoded_again():
    outcome, arrays, state, expected = _aggregate_with_a_nan_reply(sparse=False)
    assert state.rejected == [(101, "array 'w' contains NaN or Inf")] and 1 not in state.valid
    assert outcome.decode == "exact" and outcome.used == [0, 2, 3]
    for k in SHAPES:
        np.testing.assert_allclose(arrays[k].numpy(), expected[k], rtol=1e-10)


def test_a_nan_in_a_reply_the_decoding_does_not_read_rejects_nothing():
    outcome, arrays, state, expected = _aggregate_with_a_nan_reply(sparse=True)
    assert state.rejected == [] and outcome.decode == "exact"
    assert outcome.used == [0, 1, 2, 3] and outcome.replies_read == 2
    for k in SHAPES:
        np.testing.assert_allclose(arrays[k].numpy(), expected[k], rtol=1e-10)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_crc_reply_whose_non_finite_value_spoils_the_sums_is_named_and_the_round_redecoded(
        bad):
    """CRC n=8, s=2, seven float64 replies decoded densely (every coefficient nonzero and not
    1: every reply after the first is added by the in-place BLAS kernel); reply 3 holds one
    non-finite value. The decoded block is not finite, so the replies are checked one by one:
    reply 3 is rejected with its array named, and the six others decode exactly."""
    code = make_code("crc", n=8, s=2, seed=0)
    theta, sizes, deltas, replies = _problem(code)
    used = [0, 1, 2, 3, 4, 5, 6]
    rows = code.chunk_decoder(code.decoding(used))[:, used]
    assert np.all(rows != 0.0) and np.all(rows != 1.0)  # the kernel's path, no 0/1 shortcut
    replies[3].arrays["w"].reshape(-1)[5] = bad
    outcome, arrays, state = _decode_in_a_round(code, theta, {w: replies[w] for w in used},
                                                used, sparse=False)
    assert state.rejected == [(103, "array 'w' contains NaN or Inf")] and 3 not in state.valid
    assert outcome.decode == "exact" and outcome.used == [0, 1, 2, 4, 5, 6]
    expected = _average(theta, sizes, deltas)
    for k in SHAPES:
        np.testing.assert_allclose(arrays[k].numpy(), expected[k], rtol=1e-9)


def _amplification_over(code, sets):
    """The definition of ``error_amplification`` over the given decodable sets (numpy)."""
    row_l1 = np.abs(code.B).sum(axis=1)
    return max(float(np.sum(np.abs(code.chunk_decoder(code.decoding(r))).sum(axis=0) * row_l1))
               / code.k for r in sets)


def test_error_amplification_is_the_worst_decodable_set_and_reproducible():
    import itertools

    crc = make_code("crc", 6, 2)  # 15 four-reply sets: the 24 samples find the worst one
    every = [list(range(6))] + [list(c) for c in itertools.combinations(range(6), 4)]
    assert error_amplification(crc, seed=0) == pytest.approx(_amplification_over(crc, every))
    wide = make_code("crc", 12, 4)  # 495 eight-reply sets: the seed decides the sample
    assert error_amplification(wide, seed=0) == error_amplification(wide, seed=0)


# ================================================================================== decoder: edges
def test_float64_sums_written_into_a_float32_buffer_are_summed_in_float64():
    """2^25 + 1 - 2^25 is 1 in float64 but 0 in float32 (24-bit significand): the sums are
    taken in ``dtype`` even when ``out`` is float32, then cast once."""
    big = np.full(3, 2.0 ** 25)
    views = [big, np.ones(3), -big]
    out = np.empty(3, dtype=np.float32)
    result = combine([1.0, 1.0, 1.0], views, np.float64, out=out)
    assert result is out and out.tolist() == [1.0, 1.0, 1.0]
    # numpy reference: the same three values summed in float32 lose the 1
    assert (np.float32(2.0 ** 25) + np.float32(1.0)) - np.float32(2.0 ** 25) == 0.0


def test_combine_sums_a_dtype_without_a_blas_kernel_with_numpy():
    """float16 has no BLAS ``axpy``: a coefficient other than 0 and 1 goes through numpy."""
    x = np.array([1.0, 2.0, 4.0], dtype=np.float16)
    y = np.array([8.0, 16.0, -4.0], dtype=np.float16)
    out = combine([1.0, 0.5], [x, y], np.float16)
    assert out.dtype == np.float16
    assert out.tolist() == (x.astype(np.float64) + 0.5 * y.astype(np.float64)).tolist()


def test_error_amplification_draws_the_number_of_samples_it_is_given():
    import itertools

    code = make_code("crc", 12, 4)
    bursts = [[i for i in range(12) if (i - start) % 12 >= 4] for start in range(12)]
    assert error_amplification(code, seed=0, samples=0) == pytest.approx(
        _amplification_over(code, [list(range(12)), *bursts]))
    every = [list(c) for c in itertools.combinations(range(8), 5)]
    small = make_code("crc", 8, 3)
    assert error_amplification(small, seed=0, samples=200) == pytest.approx(
        _amplification_over(small, [list(range(8)), *every]))


@pytest.mark.parametrize(("cores", "load", "idle"), [
    (4, 0.0, 4), (4, 1.0, 4), (4, 1.4, 4), (4, 3.0, 2), (4, 9.0, 1), (1, 0.0, 1)])
def test_idle_cores_are_the_affinity_mask_minus_the_other_runnable_work(
        monkeypatch, cores, load, idle):
    import os

    from fl_gradcode.flower.decoder import idle_cores

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    assert idle_cores() == idle


def test_the_count_goes_under_the_inner_strategys_weighting_key():
    code = make_code("frc", n=4, s=1)
    theta, sizes, _, replies = _problem(code)
    decoded = _decode(code, replies, [0, 1, 2, 3], theta)
    sent = Message(RecordDict({}), dst_node_id=1, message_type="train")

    class _Sub(FedAvg):
        pass

    for inner in (FedAvg(weighted_by_key="n-train"), _Sub(weighted_by_key="n-train")):
        outcome = _decoder(inner).apply(decoded, round_number=1, array_key="arrays",
                                       reply_to=sent)
        assert outcome is not None and outcome.num_examples == pytest.approx(sizes.sum())
        np.testing.assert_array_equal(outcome.arrays["w"].numpy(),
                                      decoded.arrays["w"].numpy())


class _Watched(dict):
    """A reply's arrays that record which ones were read."""

    def __init__(self, *args):
        super().__init__(*args)
        self.read = set()

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)


def test_a_reply_the_sparse_decoding_gives_no_weight_is_never_opened():
    code = make_code("frc", n=4, s=1)  # groups {0, 1}, {2, 3}: one reply read per group
    theta, sizes, deltas, replies = _problem(code)
    used = [0, 1, 2, 3]
    rows = code.chunk_decoder(code.sparse_decoding(used))
    unread = [w for w in used if not np.any(rows[:, w] != 0.0)]
    assert len(unread) == 2
    for w in used:
        replies[w].arrays = _Watched(replies[w].arrays)
    decoded = _decode(code, replies, used, theta)
    assert all(replies[w].arrays.read == set() for w in unread)
    assert all(replies[w].arrays.read == set(SHAPES) for w in used if w not in unread)
    expected = _average(theta, sizes, deltas)
    for k in SHAPES:
        np.testing.assert_allclose(decoded.arrays[k].numpy(), expected[k], rtol=1e-10)


def _spy_pools(monkeypatch, cores):
    from concurrent.futures import ThreadPoolExecutor

    import fl_gradcode.flower.decoder as decoder_module

    pools = []

    class _Pool(ThreadPoolExecutor):
        def __init__(self, max_workers=None, **kwargs):
            pools.append(max_workers)
            super().__init__(max_workers=max_workers, **kwargs)

    monkeypatch.setattr(decoder_module, "ThreadPoolExecutor", _Pool)
    monkeypatch.setattr(decoder_module, "idle_cores", lambda: cores)
    return pools


def test_a_large_model_uses_one_thread_per_array_up_to_the_idle_cores(monkeypatch):
    pools = _spy_pools(monkeypatch, 3)
    code = make_code("frc", n=4, s=1)
    theta, replies = _large_model(seed=1, b=1.0)
    decoded = _decode(code, replies, [0, 2], theta)
    assert pools == [2]  # min(two arrays, three idle cores)
    for k in theta:
        np.testing.assert_allclose(decoded.arrays[k].numpy(), theta[k]
                                   + (replies[0].arrays[k] + replies[2].arrays[k]) / 4.0)


def test_a_small_model_is_finished_without_a_thread_pool(monkeypatch):
    pools = _spy_pools(monkeypatch, 3)
    code = make_code("frc", n=4, s=1)
    theta, sizes, deltas, replies = _problem(code)  # two arrays, 19 values
    decoded = _decode(code, replies, [0, 1, 2, 3], theta)
    assert pools == []
    expected = _average(theta, sizes, deltas)
    for k in SHAPES:
        np.testing.assert_allclose(decoded.arrays[k].numpy(), expected[k], rtol=1e-10)


def test_a_non_positive_count_and_a_non_finite_model_are_logged_with_their_round(caplog):
    code = make_code("uncoded", n=2, s=0)
    theta, _, _, replies = _problem(code)
    decoder = _decoder(FedAvg())
    decoding = decoder.decoding(code, [0, 1])
    dtypes = {k: v.dtype for k, v in theta.items()}
    for w in (0, 1):
        replies[w].num_examples = -1.5
    with caplog.at_level(logging.WARNING, logger="flwr"):
        assert decoder.decode(code, replies, [0, 1], decoding, theta, dtypes, round_number=5,
                              sizes={}) is None
    theta, _, _, replies = _problem(code)
    replies[1].arrays["b"][2] = np.inf
    with caplog.at_level(logging.WARNING, logger="flwr"):
        assert decoder.decode(code, replies, [0, 1], decoding, theta, dtypes, round_number=6,
                              sizes={}) is None
    assert [r.getMessage() for r in caplog.records] == [
        "round 5: decoded example count -3.0; round skipped",
        "round 6: decoded model not finite; round skipped"]


def test_auto_wire_samples_the_amplification_with_the_decoders_seed(monkeypatch):
    import fl_gradcode.flower.decoder as decoder_module

    seeds = []

    def spy(code, seed=0, samples=24):
        seeds.append(seed)
        return 100.0

    monkeypatch.setattr(decoder_module, "error_amplification", spy)
    crc = make_code("crc", 8, 3)
    assert crc.rounding_amplification is None or crc.rounding_amplification > 8
    assert _decoder(FedAvg(), seed=7).wire_for(crc) == "float64"
    assert seeds == [7]


def test_unsized_central_noise_is_logged_in_full(caplog):
    import re

    code = make_code("uncoded", n=4, s=0)
    privatiser = Privatiser(DPConfig(mode="central", noise_multiplier=1.0, clip_norm=1.0),
                            None, ServerNoise(), "n", {})
    with caplog.at_level(logging.WARNING, logger="flwr"):
        assert privatiser.noise_std(code, code.decoding([0, 1]), [0, 1], 20.0, {}, 7) is None
    [line] = [r.getMessage() for r in caplog.records]
    assert re.fullmatch(r"round 7: central DP noise cannot be sized \(no checked size for "
                        r"partitions .+\); round skipped", line)


# ================================================================== chunk-major decoding
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize(("n", "m"), [(6, 2), (8, 3)])
def test_chunked_replies_decode_block_by_block_and_split_between_cores(monkeypatch, n, m,
                                                                       threads):
    """Blocks of 2 reply values (chunks and model arrays straddle them), the block ranges
    split between ``threads`` cores, central noise: the numpy reference average plus the
    privatiser's draw, in the model's float32."""
    from fl_gradcode.flower import decoder as module

    monkeypatch.setattr(module, "BLOCK", 2)
    monkeypatch.setattr(module, "THREADED", 1)
    monkeypatch.setattr(module, "idle_cores", lambda: threads)
    code = make_code("comm-efficient", n=n, s=1, m=m)
    theta, sizes, deltas, replies = _problem(code, seed=3)
    dp = DPConfig(mode="central", noise_multiplier=0.5, clip_norm=2.0)
    noise = ServerNoise(b"q" * 32)
    privatiser = Privatiser(dp, make_mechanism(dp), noise, "nonce", {})
    used = [i for i in range(n) if i != 2]
    dtypes = {k: np.dtype(np.float32) for k in SHAPES}
    decoded = _decode(code, replies, used, theta, decoder=_decoder(FedAvg(), privatiser),
                      dtypes=dtypes, sizes=dict(enumerate(sizes)))
    drawn = noise.draw(19, decoded.noise_std, 1, "nonce")
    expected = np.concatenate([_average(theta, sizes, deltas)[k].ravel() for k in SHAPES])
    got = np.concatenate([decoded.arrays[k].numpy().ravel() for k in SHAPES])
    assert {decoded.arrays[k].numpy().dtype for k in SHAPES} == {np.dtype(np.float32)}
    assert [decoded.arrays[k].numpy().shape for k in SHAPES] == list(SHAPES.values())
    np.testing.assert_allclose(got, (expected + drawn).astype(np.float32), rtol=1e-6,
                               atol=1e-6)
    # one value beyond float32's range in one reply: the model is not released
    replies[used[-1]].arrays[protocol.CHUNK_KEY][3] = 1e300
    assert _decode(code, replies, used, theta, dtypes=dtypes) is None


# ============================================================================== decoder: edges (2)
def test_a_round_records_the_decodings_error():
    """FRC n=4, s=1 (groups {0, 1} and {2, 3}): both groups decode exactly (error 0); group 0
    alone at best recovers partitions 0 and 1, ``alpha = [1, 1, 0, 0]``: error
    ``||alpha - 1||^2 / k = 2 / 4``."""
    code = make_code("frc", n=4, s=1)
    theta, sizes, deltas, replies = _problem(code)
    exact, _, _ = _decode_in_a_round(code, theta, dict(replies), [0, 2], sparse=True)
    assert exact.decode == "exact" and exact.decode_error == 0.0
    approx, arrays, _ = _decode_in_a_round(code, theta, dict(replies), [0], sparse=True)
    assert approx.decode == "approx" and approx.decode_error == pytest.approx(0.5, abs=1e-12)
    expected = _average(theta, sizes, deltas, alpha=np.array([1.0, 1.0, 0.0, 0.0]))
    np.testing.assert_allclose(arrays["w"].numpy(), expected["w"], rtol=1e-10)


def test_a_decodable_round_the_decoder_refuses_is_recorded_as_skipped(caplog):
    """Every partition claims no examples: the decoding is exact but the count is 0, so
    nothing is applied and the round says so."""
    code = make_code("frc", n=4, s=1)
    theta, _, _, replies = _problem(code)
    for r in replies.values():
        r.num_examples = 0.0
    with caplog.at_level(logging.WARNING, logger="flwr"):
        outcome, arrays, state = _decode_in_a_round(code, theta, dict(replies), [0, 1, 2, 3],
                                                    sparse=True)
    assert outcome.decode == "skipped" and arrays is None and state.rejected == []
    assert outcome.replies_read == 0 and outcome.num_examples is None
    assert "round 1: decoded example count 0.0; round skipped" in [
        r.getMessage() for r in caplog.records]


def test_under_verify_a_round_skipped_anyway_is_not_said_to_be_withheld(caplog):
    """``verify=True``, the replies not cross-checked: a round with nothing decodable is
    skipped for that reason alone; the "could not all be cross-checked" warning is for a
    decodable round only."""
    from types import SimpleNamespace

    from fl_gradcode.flower.options import IntegrityOptions

    code = make_code("frc", n=4, s=1)
    theta, _, _, replies = _problem(code)
    for used in ([], [0]):  # no decoding; error 0.5 beyond max_decode_error=0.25
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="flwr"):
            outcome, arrays, _ = _decode_in_a_round(
                code, theta, dict(replies), used, sparse=True,
                integrity=IntegrityOptions(verify=True), probe=SimpleNamespace(verdicts={}),
                max_decode_error=0.25)
        assert outcome.decode == "skipped" and arrays is None
        assert outcome.decode_error == (1.0 if not used else pytest.approx(0.5, abs=1e-12))
        assert not any("cross-checked" in r.getMessage() for r in caplog.records)
    with caplog.at_level(logging.WARNING, logger="flwr"):  # a decodable one is withheld
        outcome, _, _ = _decode_in_a_round(
            code, theta, dict(replies), [0, 2], sparse=True,
            integrity=IntegrityOptions(verify=True), probe=SimpleNamespace(verdicts={}))
    assert outcome.decode == "skipped"
    assert [r.getMessage() for r in caplog.records] == [
        "round 1: verify=True and the replies could not all be cross-checked before the "
        "deadline; nothing is applied"]


def test_a_float64_sum_beyond_a_float32_models_range_is_not_released(caplog):
    """float64 replies of a float32 model: 1e39 is finite in float64 but beyond float32's
    largest value (~3.4e38), so the model would hold Inf; the round is skipped."""
    code = make_code("frc", n=4, s=1)
    theta, _, _, replies = _problem(code)
    dtypes = {k: np.dtype(np.float32) for k in SHAPES}
    with np.errstate(over="ignore"):  # numpy reference
        assert np.isinf(np.float64(1e39).astype(np.float32))
    count = replies[0].num_examples + replies[2].num_examples  # the decoded count
    for w in range(4):  # the decoded value: theta + 2e39
        replies[w].arrays["w"][1, 2] = 1e39 * count
    with caplog.at_level(logging.WARNING, logger="flwr"):
        assert _decode(code, replies, [0, 2], theta, dtypes=dtypes) is None
    assert [r.getMessage() for r in caplog.records] == [
        "round 1: decoded model not finite; round skipped"]


def test_a_decoding_that_reads_no_reply_decodes_no_examples(caplog):
    """All-zero coefficients: the decoded count is 0 and the round is skipped (logged)."""
    from fl_gradcode.codes import Decoding

    code = make_code("frc", n=4, s=1)
    theta, _, _, replies = _problem(code)
    nothing = Decoding(received=(0, 1), coefficients=np.zeros(4), exact=False, error=1.0,
                       alpha=np.zeros(4))
    dtypes = {k: v.dtype for k, v in theta.items()}
    with caplog.at_level(logging.WARNING, logger="flwr"):
        assert _decoder(FedAvg()).decode(code, replies, [0, 1], nothing, theta, dtypes,
                                        round_number=3, sizes={}) is None
    assert [r.getMessage() for r in caplog.records] == [
        "round 3: decoded example count 0.0; round skipped"]


def test_combine_takes_one_coefficient_per_reply():
    views = [np.ones(3), np.ones(3)]
    for coefficients in ([1.0], [1.0, 1.0, 1.0]):
        with pytest.raises(ValueError, match=r"^zip\(\) argument 2 is (shorter|longer) than "
                                             r"argument 1$"):
            combine(coefficients, views, np.float64)


def test_combine_weights_a_later_reply_by_its_own_coefficient():
    """Coefficients 1, 2, 1, -1 (small integers: exact in float64): numpy's sum."""
    rng = np.random.default_rng(5)
    views = [rng.integers(-50, 50, size=7).astype(np.float64) for _ in range(4)]
    a = np.array([1.0, 2.0, 1.0, -1.0])
    out = combine(a, views, np.float64)
    np.testing.assert_array_equal(out, a @ np.stack(views))


def test_combine_sums_float32_replies_in_float64_over_a_partial_last_block():
    """Replies in another dtype than the sums go through the scratch buffer; three values
    past the first cache block: the last block is shorter than the buffer."""
    from fl_gradcode.flower import decoder as module

    size = module.BLOCK + 3
    rng = np.random.default_rng(6)
    x, y, z = (rng.standard_normal(size).astype(np.float32) for _ in range(3))
    out = combine([1.0, 0.5, -0.25], [x, y, z], np.float64)
    assert out.dtype == np.float64 and out.shape == (size,)
    expected = x.astype(np.float64) + 0.5 * y.astype(np.float64) - 0.25 * z.astype(np.float64)
    np.testing.assert_allclose(out, expected, rtol=1e-15, atol=1e-15)


@pytest.mark.parametrize(("threshold", "threaded"), [(18, True), (19, True), (20, False)])
def test_chunked_replies_are_split_between_cores_from_the_threshold_on(monkeypatch, threshold,
                                                                         threaded):
    """A 19-value model in blocks of 2 reply values: split between the idle cores once its
    dimension reaches the threshold (``dim >= threshold``), decoded alike either way."""
    from fl_gradcode.flower import decoder as module

    pools = _spy_pools(monkeypatch, 2)
    monkeypatch.setattr(module, "BLOCK", 2)
    monkeypatch.setattr(module, "THREADED", threshold)
    code = make_code("comm-efficient", n=6, s=1, m=2)  # replies of ceil(20 / 2) = 10 values
    theta, sizes, deltas, replies = _problem(code, seed=4)
    dtypes = {k: np.dtype(np.float64) for k in SHAPES}
    decoded = _decode(code, replies, [0, 1, 3, 4, 5], theta, dtypes=dtypes)
    assert pools == ([2] if threaded else [])
    expected = _average(theta, sizes, deltas)
    for k in SHAPES:
        np.testing.assert_allclose(decoded.arrays[k].numpy(), expected[k], rtol=1e-10)
