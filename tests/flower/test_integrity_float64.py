"""The integrity checks compute in float64 whatever the replies' dtype: float32 and long double
replies are probed as their float64 values, float32 projections and long double coefficients
give the disagreement float64 arithmetic gives."""

from __future__ import annotations

import numpy as np
import pytest

from fl_gradcode.codes import make_code
from fl_gradcode.flower.integrity import Probe, applied_disagreement


def test_the_sampled_probe_reads_every_array_in_float64_and_an_empty_reply_is_its_count():
    """Arrays of several shapes and dtypes: the projections are those of the float64 values
    (a float32 reply and its float64 copy give the same z), linear in every coordinate; a
    layout without arrays projects to ``[0, count]``."""
    layout = {"a": (70, 3), "b": (500,), "c": ()}
    probe = Probe(layout, (0, 2), q=3, sample=96)
    rng = np.random.default_rng(4)
    x32 = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in layout.items()}
    x64 = {name: v.astype(np.float64) for name, v in x32.items()}
    z = probe(x32, 3.0)
    np.testing.assert_array_equal(z, probe(x64, 3.0))
    assert z.shape == (4,) and z[3] == 3.0
    basis = []  # z of each unit coordinate: z(x) = sum_j x_j z(e_j)
    for name, shape in layout.items():
        for j in range(int(np.prod(shape))):
            e = {k: np.zeros(s) for k, s in layout.items()}
            e[name].reshape(-1)[j] = 1.0
            basis.append((float(x64[name].reshape(-1)[j]), probe(e, 0.0)[:3]))
    np.testing.assert_allclose(z[:3], sum(v * col for v, col in basis), rtol=1e-12, atol=1e-12)
    z, size = Probe({}, (0, 1), q=2).measure({}, 5.0)
    assert size.tolist() == [0.0, 5.0] and z.tolist() == [0.0, 5.0]


def test_applied_disagreement_of_float32_projections_is_computed_in_float64():
    """float32 projections that nearly agree: the distance of the applied decoding (worker 0
    alone) from the min-norm one (1/3 each) is ``|2 z0 - z1 - z2| / 3`` over the median norm,
    computed here in float64; float32 arithmetic on the scaled projections would be off by
    ~1e-7 of their size, a large relative error of a distance this small."""
    code = make_code("frc", n=6, s=2)
    base = np.array([3.1, -1.7, 0.9, 2.3], dtype=np.float32)
    step = np.float32(1e-5)
    z = {0: base, 1: base + step, 2: base - 2 * step}
    assert all(v.dtype == np.float32 for v in z.values())
    coefficients = np.zeros(6)
    coefficients[0] = 1.0
    Z = np.array([z[w] for w in range(3)], dtype=np.float64)
    a = np.linalg.pinv(code.B[:3, :3].T) @ np.ones(3)  # min-norm decoder of {0, 1, 2}
    np.testing.assert_allclose(a, np.full(3, 1.0 / 3.0), rtol=1e-12)
    expected = (np.linalg.norm((coefficients[:3] - a) @ Z)
                / np.median([np.linalg.norm(row) for row in Z]))
    got = applied_disagreement(code, z, [0, 1, 2], coefficients)
    assert got == pytest.approx(expected, rel=1e-9)
    # float32 arithmetic on the scaled projections gives another value: the check bites
    top = np.float32(np.max(np.abs(Z)))
    Z32 = np.array([z[w] for w in range(3)]) / top
    float32_value = (np.linalg.norm((coefficients[:3] - a) @ Z32)
                     / (np.median([np.linalg.norm(row) for row in Z]) / float(top)))
    assert float32_value != pytest.approx(expected, rel=1e-6)


needs_longdouble = pytest.mark.skipif(np.finfo(np.longdouble).eps >= np.finfo(np.float64).eps,
                                      reason="long double is float64 on this platform")


@needs_longdouble
def test_the_sampled_probe_reads_a_long_double_reply_as_its_float64_rounding():
    """A model kept in long double sends long double replies (``wire="model"``): the sampled
    probe, like the dense one, measures the float64 values, so such a reply and its float64
    rounding give the same projections bit for bit."""
    layout = {"a": (300,), "b": (40, 5)}
    rng = np.random.default_rng(22)
    x = {name: rng.standard_normal(shape).astype(np.longdouble) / 3
         for name, shape in layout.items()}
    rounded = {name: v.astype(np.float64) for name, v in x.items()}
    assert any(np.any(x[name] != rounded[name]) for name in layout)  # more digits than float64
    for probe in (Probe(layout, (5, 6), q=4, sample=128),
                  Probe(layout, (5, 6), q=4, sample=None)):
        np.testing.assert_array_equal(probe(x, 2.0), probe(rounded, 2.0))


@needs_longdouble
def test_applied_disagreement_reads_long_double_coefficients_as_float64():
    """Coefficients given in long double are the float64 values they round to (every input of
    the check is float64): the same disagreement bit for bit."""
    code = make_code("frc", n=6, s=2)
    rng = np.random.default_rng(23)
    z = {w: rng.standard_normal(4) for w in range(6)}
    coefficients = np.zeros(6, dtype=np.longdouble)
    coefficients[:3] = np.longdouble(1) / 3 + np.array([1, -2, 1], dtype=np.longdouble) / 7e5
    rounded = coefficients.astype(np.float64)
    assert np.any(coefficients != rounded)
    got = applied_disagreement(code, z, [0, 1, 2], coefficients)
    assert got > 0.0
    assert got == applied_disagreement(code, z, [0, 1, 2], rounded)
