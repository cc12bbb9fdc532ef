"""The integrity ``Probe``: secret linear functionals of a reply (arrays, count, metrics).

Linear in every coordinate it reads, the sampled probe reads few places of a large array and
a small one whole, the exact size of a whole reply without overflow, and per-metric weights
keyed by the probe's secret words."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from fl_gradcode.flower.integrity import Probe


def test_probe_is_linear_and_counts_exactly():
    probe = Probe({"a": (7, 3), "b": (5,)}, (0, 1), q=3, sample=10)
    rng = np.random.default_rng(1)
    x = {"a": rng.standard_normal((7, 3)), "b": rng.standard_normal(5)}
    y = {"a": rng.standard_normal((7, 3)), "b": rng.standard_normal(5)}
    both = {k: 2 * x[k] - y[k] for k in x}
    np.testing.assert_allclose(probe(both, 5.0), 2 * probe(x, 4.0) - probe(y, 3.0))


def test_the_sampled_probe_reads_few_places_of_a_large_array():
    """A reply's bytes are long out of the caches when it is validated: the sampled probe reads
    runs of consecutive coordinates (a few pages), not 2048 scattered ones (about 900 of the
    1024 pages of 1024 coordinates here)."""
    size, window = 1 << 20, 1024
    probe = Probe({"a": (size,)}, (0, 1), q=2, sample=2048)
    rng = np.random.default_rng(0)
    x = np.zeros(size, np.float32)
    read = 0
    for start in range(0, size, window):
        x[start : start + window] = rng.standard_normal(window)
        read += bool(np.any(probe({"a": x}, 0.0)[:2] != 0.0))
        x[start : start + window] = 0.0
    assert 1 <= read <= 2048 // 64
    # still a linear functional of every sampled coordinate, and a small array is read whole
    small = Probe({"b": (100,)}, (0, 1), q=2, sample=2048)
    y = rng.standard_normal(100)
    for j in range(100):
        e = np.zeros(100)
        e[j] = 1.0
        assert np.any(small({"b": e}, 0.0)[:2] != 0.0)
    np.testing.assert_allclose(small({"b": y}, 0.0)[:2],
                               sum(y[j] * small({"b": np.eye(100)[j]}, 0.0)[:2]
                                   for j in range(100)))


def test_probe_size_is_the_exact_norm_of_the_whole_reply_without_overflow():
    """More coordinates than one dense block (2^15), values whose squares overflow: the norm
    by scaling (numpy reference), arrays + count + metrics when probed."""
    layout = {"a": (70_000,), "b": (3, 5)}
    rng = np.random.default_rng(14)
    arrays = {"a": rng.standard_normal(70_000) * 1e200, "b": rng.standard_normal((3, 5))}
    arrays["a"][[5, 40_000, 69_999]] = [3e200, -4e200, 2e200]
    metrics = {"loss": 2.5e200, "acc": -1.0}
    flat = np.concatenate([arrays["a"], arrays["b"].ravel(), [7.0], list(metrics.values())])
    top = np.max(np.abs(flat))
    expected = top * np.linalg.norm(flat / top)
    probe = Probe(layout, (3, 4), q=2, sample=None, metrics=True)
    assert probe.size(arrays, 7.0, metrics) == pytest.approx(expected, rel=1e-12)
    # measure's yardstick, projection by projection: the model's projections against the
    # arrays' norm, the count against itself, the metrics' against the whole reply's norm
    model = flat[:-3]
    top_model = np.max(np.abs(model))
    yardstick = probe.measure(arrays, 7.0, metrics)[1]
    assert yardstick.shape == (2 + 1 + 2,)
    np.testing.assert_allclose(yardstick[:2], top_model * np.linalg.norm(model / top_model),
                               rtol=1e-12)
    assert yardstick[2] == 7.0
    np.testing.assert_allclose(yardstick[3:], expected, rtol=1e-12)
    plain = Probe(layout, (3, 4), q=2, sample=None)  # metrics not probed: not measured
    top = np.max(np.abs(flat[:-2]))
    assert plain.size(arrays, 7.0, metrics) == pytest.approx(
        top * np.linalg.norm(flat[:-2] / top), rel=1e-12)
    arrays["b"][1, 2] = np.nan
    assert np.isnan(probe.size(arrays, 7.0, metrics))


def test_every_metric_has_its_own_secret_weights_and_enters_linearly():
    probe = Probe({"w": (4,)}, (5, 6), q=4, sample=None, metrics=True)
    zero = {"w": np.zeros(4)}

    def part(metrics):
        return probe(zero, 0.0, metrics)[5:]

    loss, acc = part({"loss": 1.0}), part({"acc": 1.0})
    assert np.all(np.abs(loss) <= 0.5) and np.all(np.abs(acc) <= 0.5)
    assert not np.allclose(loss, acc)  # per-name weights
    np.testing.assert_allclose(part({"loss": 3.0, "acc": -2.0}), 3.0 * loss - 2.0 * acc,
                               rtol=1e-12)
    # a forged value changes the projections, whichever metric it is
    assert not np.allclose(part({"loss": 3.5, "acc": -2.0}), part({"loss": 3.0, "acc": -2.0}))
    assert not np.allclose(part({"loss": 3.0, "acc": -2.5}), part({"loss": 3.0, "acc": -2.0}))


def test_metric_weights_are_keyed_by_the_probes_secret_words():
    """Reference: the keyed BLAKE2b of the metric's name (key = BLAKE2b of the words), its 16
    bytes seeding numpy's generator; another probe's words give other weights."""

    def reference(words, name, q):
        key = hashlib.blake2b(repr(list(words)).encode(), digest_size=32).digest()
        digest = hashlib.blake2b(name.encode(), key=key, digest_size=16).digest()
        return np.random.default_rng(list(digest)).random(q) - 0.5

    zero = {"w": np.zeros(3)}
    parts = []
    for words in ([1, 2], [3, 4]):
        probe = Probe({"w": (3,)}, words, q=4, sample=None, metrics=True)
        part = probe(zero, 0.0, {"loss": 2.0})[5:]
        np.testing.assert_allclose(part, 2.0 * reference(words, "loss", 4), rtol=1e-15)
        parts.append(part)
    assert not np.allclose(parts[0], parts[1])  # secret per probe, not per name only


def test_a_single_array_no_larger_than_the_sample_is_read_whole():
    """One array of exactly ``sample`` coordinates: every coordinate is measured (its whole
    sample goes to the one array), so a change anywhere moves the projections."""
    size = 256
    probe = Probe({"w": (size,)}, [7], q=4, sample=size)
    moved = [np.any(probe({"w": np.eye(size)[i]}, 0.0)[:4] != 0.0) for i in range(size)]
    assert all(moved)
