"""How the decoder sums the replies: ``combine``'s dtypes, kernels and coefficients (numpy
references), a large model decoded array by array in threads up to the idle cores, and
chunked replies decoded block by block and split between cores from the threshold on."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.serverapp.strategy import FedAvg

from fl_gradcode.codes import make_code
from fl_gradcode.flower import protocol
from fl_gradcode.flower.decoder import cast, combine, replies_read
from fl_gradcode.flower.privatiser import Privatiser
from fl_gradcode.flower.protocol import CodedReply
from fl_gradcode.privacy import DPConfig, ServerNoise, make_mechanism
from tests.flower.decoder_support import SHAPES, average, decode, make_decoder, problem


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
    decoded = decode(code, replies, [0, 2], theta)  # FRC groups {0, 1} and {2, 3}
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
    assert replies_read(make_decoder(FedAvg()).decoding(frc, list(range(6))), range(6)) == 2
    assert replies_read(frc.decoding(list(range(6))), range(6)) == 6


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


@pytest.mark.parametrize(("cores", "load", "idle"), [
    (4, 0.0, 4), (4, 1.0, 4), (4, 1.4, 4), (4, 3.0, 2), (4, 9.0, 1), (1, 0.0, 1)])
def test_idle_cores_are_the_affinity_mask_minus_the_other_runnable_work(
        monkeypatch, cores, load, idle):
    import os

    from fl_gradcode.flower.decoder import idle_cores

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    assert idle_cores() == idle


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
    decoded = decode(code, replies, [0, 2], theta)
    assert pools == [2]  # min(two arrays, three idle cores)
    for k in theta:
        np.testing.assert_allclose(decoded.arrays[k].numpy(), theta[k]
                                   + (replies[0].arrays[k] + replies[2].arrays[k]) / 4.0)


def test_a_small_model_is_finished_without_a_thread_pool(monkeypatch):
    pools = _spy_pools(monkeypatch, 3)
    code = make_code("frc", n=4, s=1)
    theta, sizes, deltas, replies = problem(code)  # two arrays, 19 values
    decoded = decode(code, replies, [0, 1, 2, 3], theta)
    assert pools == []
    expected = average(theta, sizes, deltas)
    for k in SHAPES:
        np.testing.assert_allclose(decoded.arrays[k].numpy(), expected[k], rtol=1e-10)


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
    theta, sizes, deltas, replies = problem(code, seed=3)
    dp = DPConfig(mode="central", noise_multiplier=0.5, clip_norm=2.0)
    noise = ServerNoise(b"q" * 32)
    privatiser = Privatiser(dp, make_mechanism(dp), noise, "nonce", {})
    used = [i for i in range(n) if i != 2]
    dtypes = {k: np.dtype(np.float32) for k in SHAPES}
    decoded = decode(code, replies, used, theta, decoder=make_decoder(FedAvg(), privatiser),
                     dtypes=dtypes, sizes=dict(enumerate(sizes)))
    drawn = noise.draw(19, decoded.noise_std, 1, "nonce")
    expected = np.concatenate([average(theta, sizes, deltas)[k].ravel() for k in SHAPES])
    got = np.concatenate([decoded.arrays[k].numpy().ravel() for k in SHAPES])
    assert {decoded.arrays[k].numpy().dtype for k in SHAPES} == {np.dtype(np.float32)}
    assert [decoded.arrays[k].numpy().shape for k in SHAPES] == list(SHAPES.values())
    np.testing.assert_allclose(got, (expected + drawn).astype(np.float32), rtol=1e-6,
                               atol=1e-6)
    # one value beyond float32's range in one reply: the model is not released
    replies[used[-1]].arrays[protocol.CHUNK_KEY][3] = 1e300
    assert decode(code, replies, used, theta, dtypes=dtypes) is None


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
    theta, sizes, deltas, replies = problem(code, seed=4)
    dtypes = {k: np.dtype(np.float64) for k in SHAPES}
    decoded = decode(code, replies, [0, 1, 3, 4, 5], theta, dtypes=dtypes)
    assert pools == ([2] if threaded else [])
    expected = average(theta, sizes, deltas)
    for k in SHAPES:
        np.testing.assert_allclose(decoded.arrays[k].numpy(), expected[k], rtol=1e-10)
