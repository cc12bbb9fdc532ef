"""Correctness of the aggregation's fast paths against numpy (speed lives in
``experiments/bench_aggregation.py``, never in a unit test): float64 sums written straight into
a float32 model, the finiteness check after that cast, the thread count, and the benchmark's
smoke setting."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from flwr.serverapp.strategy import FedAvg
from hypothesis import given, settings
from hypothesis import strategies as st

from fl_gradcode.codes import make_code
from fl_gradcode.flower import decoder as decoder_module
from fl_gradcode.flower.decoder import Decoder, combine
from fl_gradcode.flower.protocol import CodedReply

ROOT = Path(__file__).resolve().parents[2]
BLOCK = 1 << 16  # the decoder's cache block: sizes below straddle it


def _reference(coefficients, views, scale, offset, noise):
    """numpy, float64 throughout: ``scale * sum_i a_i v_i + noise + offset``."""
    acc = np.zeros(views[0].size, dtype=np.float64)
    for a, v in zip(coefficients, views, strict=True):
        acc += float(a) * v.astype(np.float64)
    acc *= scale
    if noise is not None:
        acc += noise.astype(np.float64)
    return acc + offset.astype(np.float64)


@settings(max_examples=25, deadline=None)
@given(
    size=st.sampled_from([1, 7, BLOCK - 1, BLOCK, BLOCK + 3, 2 * BLOCK + 5]),
    coefficients=st.lists(st.sampled_from([0.0, 1.0, -1.0, 0.5, 3.25, -1e3, 1e-4]),
                          min_size=1, max_size=6),
    scale=st.sampled_from([1.0, 0.25, 1.0 / 3.0]),
    with_noise=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_float64_sums_written_into_a_float32_model_equal_numpy_then_cast(
        size, coefficients, scale, with_noise, seed):
    rng = np.random.default_rng(seed)
    views = [rng.standard_normal(size) for _ in coefficients]
    offset = rng.standard_normal(size).astype(np.float32)
    noise = rng.standard_normal(size) if with_noise else None
    out = np.empty(size, dtype=np.float32)
    got = combine(coefficients, views, np.float64, scale=scale, offset=offset, noise=noise,
                  out=out)
    assert got is out and got.dtype == np.float32
    expected = _reference(coefficients, views, scale, offset, noise).astype(np.float32)
    np.testing.assert_allclose(got, expected, rtol=2e-7, atol=1e-6)


def test_sums_stay_in_float64_when_the_output_is_float32():
    """1e8 + 1 - 1e8: float32 sums lose the 1, float64 sums keep it."""
    views = [np.full(3, 1e8), np.ones(3), np.full(3, -1e8)]
    out = np.empty(3, dtype=np.float32)
    got = combine([1.0, 1.0, 1.0], views, np.float64, out=out)
    np.testing.assert_array_equal(got, np.ones(3, dtype=np.float32))


def test_a_sum_finite_in_float64_but_not_in_the_float32_model_is_refused():
    views = [np.full(BLOCK + 2, 1e38)]
    assert combine([10.0], views, np.float64, out=np.empty(BLOCK + 2, np.float32)) is None
    assert combine([10.0], views, np.float64) is not None  # finite in float64


def test_combine_refuses_an_output_of_the_wrong_shape_or_an_integer_dtype():
    views = [np.ones(4)]
    with pytest.raises(ValueError, match=r"out has shape \(3,\); expected \(4,\)"):
        combine([1.0], views, np.float64, out=np.empty(3))
    with pytest.raises(ValueError, match="out has dtype int32"):
        combine([1.0], views, np.float64, out=np.empty(4, dtype=np.int32))


def _read_only(values: np.ndarray) -> np.ndarray:
    """A read-only view over bytes, as a reply's ``.npy`` payload is read."""
    return np.frombuffer(values.tobytes(), dtype=values.dtype)


@settings(max_examples=25, deadline=None)
@given(
    size=st.sampled_from([1, 5, BLOCK - 1, BLOCK + 3, 2 * BLOCK + 5]),
    coefficients=st.lists(st.sampled_from([0.0, 1.0, -1.0, 0.5, 3.25, -1e3, 1e-4]),
                          min_size=1, max_size=6),
    dtype=st.sampled_from([np.float32, np.float64]),
    layout=st.sampled_from(["read-only", "strided", "byte-swapped"]),
    scale=st.sampled_from([1.0, 1.0 / 3.0]),
    seed=st.integers(0, 2**16),
)
def test_sums_in_the_replies_dtype_equal_numpy_whatever_the_replies_memory_layout(
        size, coefficients, dtype, layout, scale, seed):
    """The in-place kernel (read-only replies), and the fallback for replies it cannot read as
    they are (strided, other byte order): the same sums as numpy's, the replies untouched."""
    rng = np.random.default_rng(seed)
    values = [rng.standard_normal(size).astype(dtype) for _ in coefficients]
    if layout == "read-only":
        views = [_read_only(v) for v in values]
    elif layout == "strided":
        views = [np.repeat(v, 2)[::2] for v in values]
    else:
        views = [v.astype(np.dtype(dtype).newbyteorder()) for v in values]
    before = [v.copy() for v in views]
    offset = rng.standard_normal(size).astype(dtype)
    got = combine(coefficients, views, dtype, scale=scale, offset=offset)
    assert got.dtype == dtype
    expected = _reference(coefficients, values, scale, offset, None)
    tol = 1e-12 if dtype == np.float64 else 2e-5
    total = sum(abs(a) for a in coefficients) * scale + 1.0
    np.testing.assert_allclose(got, expected, rtol=tol, atol=tol * total * 8)
    for v, b in zip(views, before, strict=True):
        np.testing.assert_array_equal(v, b)


def test_combine_writes_into_a_strided_output_of_the_sums_dtype():
    views = [np.arange(BLOCK + 3, dtype=np.float64), np.ones(BLOCK + 3)]
    backing = np.zeros(2 * (BLOCK + 3))
    out = backing[::2]
    assert combine([2.0, 3.0], views, np.float64, out=out) is out
    np.testing.assert_array_equal(backing[::2], 2.0 * views[0] + 3.0)
    assert not backing[1::2].any()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("position", [0, 1, 2])
def test_one_non_finite_value_in_a_read_reply_makes_the_combined_result_non_finite(
        dtype, bad, position):
    """Why one finiteness check of the combined block finds every bad reply that is read:
    NaN and Inf times a nonzero coefficient, added to finite values, stay non-finite (first
    reply, multiplied into the block, or a later one, added in place), in whichever block."""
    size = 2 * BLOCK + 5
    views = [np.ones(size, dtype=dtype) for _ in range(3)]
    views[position] = views[position].copy()
    views[position][BLOCK + 1] = bad
    for coefficients in ([1.0, 1.0, 1.0], [0.5, -2.0, 3.0], [-1e-3, 1e-3, 7.0]):
        assert combine(coefficients, [_read_only(v) for v in views], dtype) is None
        out = np.empty(size, np.float32)
        assert combine(coefficients, views, np.float64, out=out) is None


def test_a_reply_with_a_zero_coefficient_is_not_read_though_zero_times_inf_is_nan():
    """A zero coefficient's reply is skipped, not multiplied: were it multiplied, 0 * Inf = NaN
    would make the round non-finite on account of a reply the decoding does not use."""
    with np.errstate(invalid="ignore"):
        assert np.isnan(np.multiply(np.array([np.inf, -np.inf]), 0.0)).all()
        assert np.isnan(np.float64(0.0) * np.nan)
    good = np.arange(7, dtype=np.float64)
    bad = np.full(7, np.inf)
    bad[3] = np.nan
    for views, coefficients in (([bad, good], [0.0, 2.0]), ([good, bad], [2.0, 0.0])):
        np.testing.assert_array_equal(combine(coefficients, views, np.float64), 2.0 * good)


def _float64_round(code, size, seed=0):
    """float64 replies of a float32 model (what ``wire="float64"`` sends) and the float64
    reference average ``theta + sum_j n_j d_j / sum_j n_j``."""
    rng = np.random.default_rng(seed)
    theta = {"a": rng.standard_normal(size).astype(np.float32),
             "b": rng.standard_normal((2, size)).astype(np.float32)}
    sizes = rng.integers(5, 50, size=code.k).astype(float)
    deltas = [{k: rng.standard_normal(v.shape) for k, v in theta.items()} for _ in sizes]
    replies = {}
    for i in range(code.n):
        row = code.B[i]
        arrays = {k: sum(row[j] * sizes[j] * deltas[j][k] for j in range(code.k))
                  for k in theta}
        replies[i] = CodedReply(node=i, worker=i, arrays=arrays,
                                num_examples=float(row @ sizes), sizes=(), metrics={},
                                compute_s=0.0)
    expected = {k: theta[k].astype(np.float64)
                + sum(n * d[k] for n, d in zip(sizes, deltas, strict=True)) / sizes.sum()
                for k in theta}
    return theta, replies, expected


def _decode(code, replies, used, theta):
    decoder = Decoder(FedAvg(), wire="auto", seed=0)
    return decoder.decode(code, replies, used, decoder.decoding(code, used), theta,
                          {k: v.dtype for k, v in theta.items()}, round_number=1, sizes={})


@pytest.mark.parametrize(("name", "n", "s"), [("crc", 8, 3), ("grouped-rs", 10, 2),
                                               ("frc", 6, 2), ("nested", 8, 2)])
def test_float64_replies_decode_into_the_float32_model_like_numpy(name, n, s):
    code = make_code(name, n=n, s=s, seed=1)
    theta, replies, expected = _float64_round(code, 301)
    used = [w for w in range(n) if w not in (1, n - 1)][: n - s]
    decoded = _decode(code, replies, sorted(used), theta)
    assert decoded is not None
    for k, ref in expected.items():
        got = decoded.arrays[k].numpy()
        assert got.dtype == np.float32 and got.shape == theta[k].shape
        np.testing.assert_allclose(got, ref.astype(np.float32), rtol=1e-5, atol=1e-5)


def test_a_float64_decoded_model_that_overflows_float32_skips_the_round(caplog):
    code = make_code("frc", n=4, s=1)
    theta, replies, _ = _float64_round(code, 5)
    for r in replies.values():
        r.arrays["a"] = np.full(5, 1e300)  # finite float64, inf once cast to float32
    assert _decode(code, replies, [0, 1, 2, 3], theta) is None
    assert "decoded model not finite" in caplog.text


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_the_decoded_model_does_not_depend_on_the_thread_count(threads, monkeypatch):
    monkeypatch.setattr(decoder_module, "idle_cores", lambda: threads)
    code = make_code("crc", n=5, s=2, seed=0)
    size = (1 << 18) + 3  # 3 arrays, more than 2^20 values in all: the threaded path
    theta, replies, expected = _float64_round(code, size, seed=3)
    decoded = _decode(code, replies, [0, 2, 3], theta)
    for k, ref in expected.items():
        np.testing.assert_allclose(decoded.arrays[k].numpy(), ref.astype(np.float32),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("load", "cores", "expected"),
                         [(0.2, 4, 4), (1.0, 4, 4), (3.0, 4, 2), (9.0, 4, 1), (0.0, 1, 1)])
def test_idle_cores_subtracts_the_other_runnable_work(load, cores, expected, monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    assert decoder_module.idle_cores() == expected


def test_idle_cores_without_a_load_average_uses_every_core(monkeypatch):
    def unavailable():
        raise OSError("no load average")

    monkeypatch.setattr(os, "getloadavg", unavailable)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    assert decoder_module.idle_cores() == 3


# ================================================================== the benchmark's smoke run
def _bench():
    from experiments import bench_aggregation

    return bench_aggregation


def test_bench_aggregation_quick_writes_every_promised_key(tmp_path):
    out = tmp_path / "bench.json"
    result = _bench().main(["--quick", "--codes", "grouped-rs,frc,crc", "--s", "2,4",
                            "--out", str(out)])
    saved = json.loads(out.read_text())
    assert saved["rows"] == json.loads(json.dumps(saved["rows"]))
    rows = saved["rows"]
    assert len(rows) == len(result["rows"])
    keys = {"params", "n", "s", "code", "fedavg_s", "coded_s", "bytes_fedavg", "bytes_coded",
            "reaction_ms_p50", "peak_bytes", "wire", "replies", "replies_read",
            "result_ms_p50", "load_avg", "relative_error", "wire_requested"}
    assert all(keys <= set(r) for r in rows)
    # frc refuses s = 2 at n = 20 ((s+1) does not divide n): skipped with the code's reason
    assert [(r["code"], r["s"]) for r in saved["skipped"]] == [("frc", 2)]
    assert "(s+1) | n" in saved["skipped"][0]["reason"]
    # crc auto-chooses float64 here: its row is followed by a wire="model" row
    crc = [(r["s"], r["wire_requested"], r["wire"]) for r in rows if r["code"] == "crc"]
    assert crc == [(2, "auto", "float64"), (2, "model", "model"),
                   (4, "auto", "float64"), (4, "model", "model")]
    for r in rows:
        assert r["replies"] == r["n"] - r["s"] and 1 <= r["replies_read"] <= r["replies"]
        assert len(r["stragglers"]) == r["s"]
        assert r["bytes_coded"] / r["bytes_fedavg"] == pytest.approx(
            2.0 if r["wire"] == "float64" else 1.0, rel=0.05)  # .npy headers
        assert r["relative_error"] < (1e-6 if r["wire"] == "float64" else 1e-4)
        assert r["result_ms_p50"] >= r["reaction_ms_p50"] > 0
    assert set(saved["definitions"]) >= {"reaction_ms_p50", "result_ms_p50", "peak_bytes"}


def test_bench_aggregation_runs_every_exact_code_and_skips_the_rest_with_a_reason(tmp_path):
    """Codes beyond the committed rows: a communication-efficient code's replies are built
    from the definition (1/m of ``[arrays..., count]``) and decode to the numpy average; a code
    that tolerates fewer stragglers than ``s`` (uncoded) and approximate codes are skipped,
    each with its reason, never a crash."""
    out = tmp_path / "bench.json"
    _bench().main(["--quick", "--codes", "comm-efficient,uncoded,bgc", "--s", "2",
                   "--out", str(out)])
    saved = json.loads(out.read_text())
    [row] = saved["rows"]
    code = make_code("comm-efficient", row["n"], 2, seed=0)
    assert (row["code"], row["replies"]) == ("comm-efficient", row["n"] - 2)
    assert row["bytes_coded"] / row["bytes_fedavg"] == pytest.approx(1 / code.m, rel=0.05)
    assert row["relative_error"] < (1e-6 if row["wire"] == "float64" else 1e-4)
    reasons = {r["code"]: r["reason"] for r in saved["skipped"]}
    assert reasons == {"uncoded": "tolerates 0 stragglers, not s=2",
                       "bgc": "not an exact code"}


def test_bench_merge_replaces_the_configurations_measured_again_and_keeps_the_rest():
    bench = _bench()

    def row(params, n, s, code, wire="auto", value=0.0):
        return {"params": params, "n": n, "s": s, "code": code, "wire_requested": wire,
                "coded_s": value}

    old = {"rows": [row(10, 20, 2, "crc"), row(10, 20, 2, "crc", "model"),
                    row(10, 20, 4, "grouped-rs"), row(5, 20, 4, "frc")],
           "skipped": [{"params": 10, "n": 20, "s": 2, "code": "frc", "reason": "r"}],
           "runs": ["first"]}
    new_rows = [row(10, 20, 2, "crc", value=1.0)]  # crc auto-chose the model's dtype now
    rows, skipped, runs = bench.merged(old, new_rows, [], "second")
    assert [(r["params"], r["s"], r["code"], r["wire_requested"], r["coded_s"]) for r in rows] \
        == [(5, 4, "frc", "auto", 0.0), (10, 2, "crc", "auto", 1.0),
            (10, 4, "grouped-rs", "auto", 0.0)]
    assert skipped == old["skipped"] and runs == ["first", "second"]


# ================================================================== BLAS threads
def _blas_threads() -> int:
    from threadpoolctl import ThreadpoolController

    return max(lib["num_threads"] for lib in ThreadpoolController().select(
        user_api="blas").info())


def test_serial_blas_limits_blas_to_one_thread_and_restores_it():
    from threadpoolctl import threadpool_limits

    from fl_gradcode.flower.collector import serial_blas

    with threadpool_limits(limits=2, user_api="blas"):
        outside = _blas_threads()
        with serial_blas():
            assert _blas_threads() == 1
        assert _blas_threads() == outside


def test_the_servers_solves_run_on_one_blas_thread_and_the_inner_strategy_keeps_its_own(
        monkeypatch):
    """Decodability on arrival, the window's rule, the cross-check and the sparse decoding run
    with BLAS on one thread; the inner strategy's aggregation sees the process's setting."""
    from threadpoolctl import threadpool_limits

    from fl_gradcode.codes.base import GradientCode
    from fl_gradcode.flower import verifier as verifier_module

    bench = _bench()
    seen: dict[str, list[int]] = {"decodable": [], "sparse": [], "verify": [], "inner": []}

    def recorded(name, fn):
        def wrapper(*args, **kwargs):
            seen[name].append(_blas_threads())
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(GradientCode, "is_decodable",
                        recorded("decodable", GradientCode.is_decodable))
    monkeypatch.setattr(GradientCode, "sparse_decoding",
                        recorded("sparse", GradientCode.sparse_decoding))
    monkeypatch.setattr(verifier_module, "verify_replies",
                        recorded("verify", verifier_module.verify_replies))

    class Inner(FedAvg):
        def aggregate_train(self, server_round, replies):
            seen["inner"].append(_blas_threads())
            return super().aggregate_train(server_round, replies)

    with threadpool_limits(limits=2, user_api="blas"):
        outside = _blas_threads()
        strategy, _, wrapped, arrays, config = bench.setup("crc", 6, 2, 600, "auto")
        strategy.inner = strategy.decoder.inner = Inner(
            fraction_evaluate=0.0, min_available_nodes=6, min_train_nodes=6)
        by_worker = bench.configure(strategy, wrapped, arrays, config)
        cached, _ = bench.payloads(strategy.current_round.code, range(6), 600, True)
        replies = bench.coded_replies(strategy, by_worker, [0, 1, 3, 5], cached)
        for reply in replies:
            strategy.on_reply(reply)
        strategy.ready()
        out, _ = strategy.aggregate_train(1, replies)
    assert out is not None
    assert seen["decodable"] and seen["sparse"] and seen["verify"]
    assert {t for k in ("decodable", "sparse", "verify") for t in seen[k]} == {1}
    assert seen["inner"] == [outside]


def test_a_reply_offered_again_is_not_validated_again_nor_blas_reconfigured(monkeypatch):
    """``aggregate_train`` offers every reply again after ``on_reply`` saw it: a reply already
    seen returns before the BLAS thread setting is read (threadpoolctl's symbol lookups cost
    up to 0.2 ms a reply on a loaded machine)."""
    from fl_gradcode.flower import collector as collector_module

    bench = _bench()
    strategy, _, wrapped, arrays, config = bench.setup("crc", 6, 2, 600, "auto")
    by_worker = bench.configure(strategy, wrapped, arrays, config)
    cached, _ = bench.payloads(strategy.current_round.code, range(6), 600, True)
    replies = bench.coded_replies(strategy, by_worker, [0, 1, 3, 5], cached)
    entered = []
    original = collector_module.serial_blas

    def counted():
        entered.append(1)
        return original()

    monkeypatch.setattr(collector_module, "serial_blas", counted)
    for reply in replies:
        strategy.on_reply(reply)
    assert len(entered) == len(replies)
    for reply in replies:
        strategy.on_reply(reply)
    assert len(entered) == len(replies)
    out, _ = strategy.aggregate_train(1, replies)
    assert out is not None and strategy.history[-1]["decode"] == "exact"

