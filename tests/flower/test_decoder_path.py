"""One decoder path for every code: plain, approximate and communication-efficient replies go
through ``Decoder.decode``; the count check, central noise, finiteness check and cast are
tested once on that path, with the decoded average handed to any inner strategy, and the
privatiser that sizes the central noise.

Each code's chunks, the layout and the wire are tested in ``test_decoder_chunks.py``, the sums
and their threads in ``test_decoder_sums.py``, the decoder inside a round in
``test_decoder_rounds.py``; the problems they share are in ``decoder_support.py``."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg

from fl_gradcode.codes import make_code
from fl_gradcode.flower import GradientCoding, gradient_coding_mod, protocol
from fl_gradcode.flower.decoder import Decoder, cast
from fl_gradcode.flower.privatiser import Privatiser
from fl_gradcode.flower.testing import InProcessGrid
from fl_gradcode.privacy import DPConfig, ServerNoise, make_mechanism
from tests.flower.decoder_support import SHAPES, average, decode, make_decoder, problem


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
    theta, sizes, deltas, replies = problem(code)
    expected = average(theta, sizes, deltas)
    for used in (list(range(n)), list(range(s, n)), list(range(n - s))):
        used = sorted(used)
        decoded = decode(code, replies, used, theta)
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
    theta, sizes, deltas, replies = problem(code, seed=2)
    used = [0, 2, 3, 5, 6, 8, 9]
    # independent: min-norm least squares on B_F^T a = 1 (unit weights); alpha = B_F^T a
    B_F = code.B[used]
    alpha = B_F.T @ (np.linalg.pinv(B_F.T) @ np.ones(code.k))
    expected = average(theta, sizes, deltas, alpha)
    decoded = decode(code, replies, used, theta)
    assert decoded is not None
    for k in SHAPES:
        np.testing.assert_allclose(decoded.arrays[k].numpy(), expected[k], rtol=1e-8,
                                   atol=1e-10)


def test_plain_and_chunked_replies_go_through_the_same_decode():
    """The same decoder object decodes a plain and a comm-efficient round in turn."""
    decoder = make_decoder(FedAvg())
    for code in (make_code("frc", n=6, s=1), make_code("comm-efficient", n=6, s=1, m=2)):
        theta, sizes, deltas, replies = problem(code)
        decoded = decode(code, replies, list(range(1, 6)), theta, decoder=decoder)
        np.testing.assert_allclose(decoded.arrays["w"].numpy(),
                                   average(theta, sizes, deltas)["w"], rtol=1e-9)


# ================================================================== checks, once
@pytest.mark.parametrize("name", ["frc", "comm-efficient"])
def test_a_count_that_does_not_decode_positive_skips_the_round(name, caplog):
    code = make_code(name, n=6, s=1)
    theta, _, _, replies = problem(code)
    for r in replies.values():  # every partition claims no examples: the count is 0
        if protocol.CHUNK_KEY in r.arrays:
            r.arrays[protocol.CHUNK_KEY][:] = 0.0
        r.num_examples = 0.0
    with caplog.at_level(logging.WARNING):
        assert decode(code, replies, list(range(6)), theta) is None
    assert "decoded example count" in caplog.text


@pytest.mark.parametrize("name", ["frc", "comm-efficient"])
def test_a_non_finite_reply_is_found_and_the_model_is_not_released(name, caplog):
    code = make_code(name, n=6, s=1)
    theta, _, _, replies = problem(code)
    key = next(iter(replies[2].arrays))
    replies[2].arrays[key].reshape(-1)[0] = np.nan
    assert Decoder.non_finite(replies, list(range(6))) == {
        2: f"array {key!r} contains NaN or Inf"}
    used = list(range(6))
    decoder = make_decoder(FedAvg(), sparse=False)  # dense: every reply is read
    with caplog.at_level(logging.WARNING):
        assert decode(code, replies, used, theta, decoder=decoder) is None
    assert "not finite" in caplog.text


def test_the_model_keeps_its_dtypes_integers_rounded():
    code = make_code("frc", n=4, s=1)
    theta, sizes, deltas, replies = problem(code)
    dtypes = {"w": np.dtype(np.float32), "b": np.dtype(np.int64)}
    decoded = decode(code, replies, [0, 1, 2, 3], theta, dtypes=dtypes)
    expected = average(theta, sizes, deltas)
    assert decoded.arrays["w"].numpy().dtype == np.float32
    np.testing.assert_allclose(decoded.arrays["w"].numpy(), expected["w"], rtol=1e-6)
    np.testing.assert_array_equal(decoded.arrays["b"].numpy(), np.rint(expected["b"]))
    assert cast(np.array([1.5, -2.5, 0.4]), np.dtype(np.int32)).tolist() == [2, -2, 0]


@pytest.mark.parametrize("name", ["frc", "grouped-rs", "comm-efficient"])
def test_central_noise_is_the_privatisers_draw_sized_from_the_checked_sizes(name):
    code = make_code(name, n=6, s=1)
    theta, sizes, _, replies = problem(code)
    dp = DPConfig(mode="central", noise_multiplier=0.5, clip_norm=2.0)
    noise = ServerNoise(b"k" * 32)
    privatiser = Privatiser(dp, make_mechanism(dp), noise, "nonce", {})
    checked = dict(enumerate(sizes))
    used = list(range(1, 6))
    decoded = decode(code, replies, used, theta, decoder=make_decoder(FedAvg(), privatiser),
                     sizes=checked)
    plain = decode(code, replies, used, theta)
    std = 0.5 * 2.0 * sizes.max() / sizes.sum()  # exact decoding: alpha = 1
    assert decoded.noise_std == pytest.approx(std, rel=1e-12)
    drawn = noise.draw(sum(int(np.prod(s)) for s in SHAPES.values()), decoded.noise_std, 1,
                       "nonce")
    got = np.concatenate([(decoded.arrays[k].numpy() - plain.arrays[k].numpy()).ravel()
                          for k in SHAPES])
    np.testing.assert_allclose(got, drawn, rtol=1e-9, atol=1e-12)
    # no checked size for a partition the decoding weighs: the round is not released
    assert decode(code, replies, used, theta, decoder=make_decoder(FedAvg(), privatiser),
                  sizes={0: sizes[0]}) is None


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
    theta, _, _, replies = problem(code)
    for i, r in replies.items():
        r.metrics = {"loss": float(i + 1)}
        r.num_examples = 0.25  # a count below 1 (weighted data): still an average
        for a in r.arrays.values():
            a *= 0.25 / 1e3
    decoded = decode(code, replies, [0, 1, 2], theta)
    assert decoded is not None and decoded.count == pytest.approx(0.75)
    assert decoded.metrics == {"loss": pytest.approx((1 + 2 + 3) / 0.75)}


def test_float32_replies_are_summed_in_float32_and_comm_efficient_ones_in_float64():
    code = make_code("uncoded", n=6, s=0)  # decoder: all ones
    theta, _, _, replies = problem(code, wire=np.float32)
    theta = {k: v.astype(np.float32) for k, v in theta.items()}
    decoded = decode(code, replies, list(range(6)), theta)
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
    theta, sizes, deltas, replies = problem(code)
    theta["e"] = np.zeros(0, dtype=np.float32)
    for r in replies.values():
        r.arrays["e"] = np.zeros(0)
    decoded = decode(code, replies, [0, 1, 2, 3], theta)
    assert decoded.arrays["e"].numpy().shape == (0,)
    np.testing.assert_allclose(decoded.arrays["w"].numpy(), average(theta, sizes, deltas)["w"])


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
    theta, sizes, _, replies = problem(code)
    decoded = decode(code, replies, [0, 1, 2, 3], theta)
    sent = Message(RecordDict({}), dst_node_id=1, message_type="train")
    for inner in (FedAvg(), _Averaging()):
        outcome = make_decoder(inner).apply(decoded, round_number=1, array_key="arrays",
                                            reply_to=sent)
        assert outcome.num_examples == decoded.count == pytest.approx(sizes.sum())
        np.testing.assert_array_equal(outcome.arrays["w"].numpy(),
                                      decoded.arrays["w"].numpy())
    assert inner.weight == decoded.count
    assert make_decoder(_NaNInner()).apply(decoded, round_number=1, array_key="arrays",
                                           reply_to=sent) is None


def test_a_non_finite_inner_model_is_named_with_its_round_in_the_log(caplog):
    code = make_code("frc", n=4, s=1)
    theta, _, _, replies = problem(code)
    decoded = decode(code, replies, [0, 1, 2, 3], theta)
    sent = Message(RecordDict({}), dst_node_id=1, message_type="train")
    with caplog.at_level(logging.WARNING, logger="flwr"):
        assert make_decoder(_NaNInner()).apply(decoded, round_number=7, array_key="arrays",
                                               reply_to=sent) is None
    assert [r.getMessage() for r in caplog.records] == [
        "round 7: inner strategy produced a non-finite model; kept the previous one"]


def test_the_count_goes_under_the_inner_strategys_weighting_key():
    code = make_code("frc", n=4, s=1)
    theta, sizes, _, replies = problem(code)
    decoded = decode(code, replies, [0, 1, 2, 3], theta)
    sent = Message(RecordDict({}), dst_node_id=1, message_type="train")

    class _Sub(FedAvg):
        pass

    for inner in (FedAvg(weighted_by_key="n-train"), _Sub(weighted_by_key="n-train")):
        outcome = make_decoder(inner).apply(decoded, round_number=1, array_key="arrays",
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
    theta, sizes, deltas, replies = problem(code)
    used = [0, 1, 2, 3]
    rows = code.chunk_decoder(code.sparse_decoding(used))
    unread = [w for w in used if not np.any(rows[:, w] != 0.0)]
    assert len(unread) == 2
    for w in used:
        replies[w].arrays = _Watched(replies[w].arrays)
    decoded = decode(code, replies, used, theta)
    assert all(replies[w].arrays.read == set() for w in unread)
    assert all(replies[w].arrays.read == set(SHAPES) for w in used if w not in unread)
    expected = average(theta, sizes, deltas)
    for k in SHAPES:
        np.testing.assert_allclose(decoded.arrays[k].numpy(), expected[k], rtol=1e-10)


def test_a_non_positive_count_and_a_non_finite_model_are_logged_with_their_round(caplog):
    code = make_code("uncoded", n=2, s=0)
    theta, _, _, replies = problem(code)
    decoder = make_decoder(FedAvg())
    decoding = decoder.decoding(code, [0, 1])
    dtypes = {k: v.dtype for k, v in theta.items()}
    for w in (0, 1):
        replies[w].num_examples = -1.5
    with caplog.at_level(logging.WARNING, logger="flwr"):
        assert decoder.decode(code, replies, [0, 1], decoding, theta, dtypes, round_number=5,
                              sizes={}) is None
    theta, _, _, replies = problem(code)
    replies[1].arrays["b"][2] = np.inf
    with caplog.at_level(logging.WARNING, logger="flwr"):
        assert decoder.decode(code, replies, [0, 1], decoding, theta, dtypes, round_number=6,
                              sizes={}) is None
    assert [r.getMessage() for r in caplog.records] == [
        "round 5: decoded example count -3.0; round skipped",
        "round 6: decoded model not finite; round skipped"]


def test_a_float64_sum_beyond_a_float32_models_range_is_not_released(caplog):
    """float64 replies of a float32 model: 1e39 is finite in float64 but beyond float32's
    largest value (~3.4e38), so the model would hold Inf; the round is skipped."""
    code = make_code("frc", n=4, s=1)
    theta, _, _, replies = problem(code)
    dtypes = {k: np.dtype(np.float32) for k in SHAPES}
    with np.errstate(over="ignore"):  # numpy reference
        assert np.isinf(np.float64(1e39).astype(np.float32))
    count = replies[0].num_examples + replies[2].num_examples  # the decoded count
    for w in range(4):  # the decoded value: theta + 2e39
        replies[w].arrays["w"][1, 2] = 1e39 * count
    with caplog.at_level(logging.WARNING, logger="flwr"):
        assert decode(code, replies, [0, 2], theta, dtypes=dtypes) is None
    assert [r.getMessage() for r in caplog.records] == [
        "round 1: decoded model not finite; round skipped"]


def test_a_decoding_that_reads_no_reply_decodes_no_examples(caplog):
    """All-zero coefficients: the decoded count is 0 and the round is skipped (logged)."""
    from fl_gradcode.codes import Decoding

    code = make_code("frc", n=4, s=1)
    theta, _, _, replies = problem(code)
    nothing = Decoding(received=(0, 1), coefficients=np.zeros(4), exact=False, error=1.0,
                       alpha=np.zeros(4))
    dtypes = {k: v.dtype for k, v in theta.items()}
    with caplog.at_level(logging.WARNING, logger="flwr"):
        assert make_decoder(FedAvg()).decode(code, replies, [0, 1], nothing, theta, dtypes,
                                             round_number=3, sizes={}) is None
    assert [r.getMessage() for r in caplog.records] == [
        "round 3: decoded example count 0.0; round skipped"]


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
    code = make_code("frc", n=4, s=1)  # every partition held by two replicas

    def multiplier(mode, noise, sizes=None):
        dp = DPConfig(mode=mode, noise=noise, noise_multiplier=1.5, clip_norm=1.0)
        return Privatiser(dp, None, ServerNoise(), "n", {}).noise_multiplier(code, sizes)

    # equal agreed sizes: FRC keeps sigma; no agreed size: each partition at its worst,
    # dominating both replies that hold it (sigma / sqrt(2))
    equal = dict.fromkeys(range(4), 10.0)
    assert multiplier("partition", "independent", equal) == pytest.approx(1.5, rel=1e-12)
    assert multiplier("partition", "independent") == pytest.approx(1.5 / math.sqrt(2),
                                                                   rel=1e-12)
    assert multiplier("partition", "identical", equal) is None
    assert multiplier("central", "independent", equal) is None


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
