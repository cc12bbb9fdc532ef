"""Replies in float32: the default exact code decodes within 1e-6 of the float64 result.

Expected values come from numpy: the exact average ``sum_j n_j u_j / sum_j n_j`` of the
partition updates (never the code's decoder), replies ``B @ (n * u)`` rounded to float32, and
the server's float32 arithmetic emulated coefficient by coefficient.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fl_gradcode.codes import make_code
from fl_gradcode.codes.stable import (
    DEFAULT_MAX_RELATIVE_AMPLIFICATION,
    GroupedReedSolomonCode,
    plan_groups,
    rs_block,
    rs_rounding_weight,
)
from fl_gradcode.flower import decoder as decoder_module
from fl_gradcode.flower.decoder import AMPLIFICATION_LIMIT, Decoder, error_amplification

TOL = 1e-6
SPREAD = [(4, 1), (8, 2), (16, 4), (20, 5), (22, 5), (30, 7), (31, 7), (50, 12), (64, 10),
          (64, 12), (64, 16), (100, 12), (100, 25), (128, 32), (200, 50), (256, 32), (256, 39),
          (256, 64)]


def partition_updates(k: int, d: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """float32 model deltas: nonzero mean, heavy-tailed per-coordinate scales; example counts."""
    rng = np.random.default_rng(seed)
    scale = (1e-3 * np.abs(rng.standard_t(2, size=d))).astype(np.float32)
    mean = rng.normal(0.5, 0.5, size=d).astype(np.float32)
    u = (scale * (mean + rng.standard_normal((k, d)).astype(np.float32))).astype(np.float32)
    return u.astype(np.float64), rng.integers(20, 400, size=k).astype(np.float64)


def float32_decode(a: np.ndarray, replies32: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """What a server holding float32 replies computes: float32 products and sums, the count
    in float64, then one float32 scaling."""
    read = np.flatnonzero(a)
    count = float(np.sum(a[read] * counts[read]))
    acc = np.zeros(replies32.shape[1], dtype=np.float32)
    for i in read:
        acc += np.float32(a[i]) * replies32[i]
    acc *= np.float32(1.0 / count)
    return acc.astype(np.float64)


def hard_patterns(code: GroupedReedSolomonCode, seed: int) -> list[list[int]]:
    """Straggler sets: contiguous bursts, sets leaving exactly ``t`` adjacent distinct rows
    in a group (at its start and end), random ones."""
    n, s = code.n, code.s
    out = [[(start + i) % n for i in range(s)] for start in range(0, n, max(1, n // 6))]
    for plan, (clients, _) in zip(code.plans, code.blocks, strict=True):
        m = s + plan.t
        if plan.t > 1 and plan.copies == 0:
            for first in (0, m - plan.t):
                keep = clients[first : first + plan.t]
                out.append([c for c in clients[:m] if c not in keep])
    rng = np.random.default_rng(seed)
    out += [rng.choice(n, size=s, replace=False).tolist() for _ in range(3)]
    return out


def worst_float32_error(code: GroupedReedSolomonCode, d: int, seed: int) -> float:
    u, sizes = partition_updates(code.k, d, seed)
    truth = (sizes @ u) / sizes.sum()
    replies = code.B @ (sizes[:, None] * u)  # float64, as the client mod sums them
    counts = code.B @ sizes
    replies32 = replies.astype(np.float32)
    worst = 0.0
    for stragglers in hard_patterns(code, seed):
        received = sorted(set(range(code.n)) - set(stragglers))
        a = np.asarray(code.sparse_decoding(received).coefficients)
        x = float32_decode(a, replies32, counts)
        worst = max(worst, float(np.linalg.norm(x - truth) / np.linalg.norm(truth)),
                    float(np.max(np.abs(x - truth)) / np.max(np.abs(truth))))
    return worst


@pytest.mark.parametrize(("n", "s"), SPREAD)
def test_default_code_decodes_float32_replies_within_1e6(n, s):
    code = make_code("grouped-rs", n=n, s=s)
    assert worst_float32_error(code, d=10_000, seed=n * 1000 + s) <= TOL


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(4, 256), frac=st.floats(0.0, 1.0), seed=st.integers(0, 10_000))
def test_any_n_and_s_up_to_n_over_4_decodes_float32_within_1e6(n, frac, seed):
    s = int(frac * (n // 4))
    code = make_code("grouped-rs", n=n, s=s)
    assert worst_float32_error(code, d=2_000, seed=seed) <= TOL


def test_the_bound_fits_float32_at_every_n_up_to_256_and_s_up_to_n_over_4():
    """The budgeted plan (what a code uses unless its old plan's sampled sets already fit):
    ``sum_g W_g / k`` from the plans alone (cheap) within the budget, load overhead below 4/3."""
    for n in range(2, 257):
        for s in range(0, n // 4 + 1):
            plans = plan_groups(n, s, 1e5, DEFAULT_MAX_RELATIVE_AMPLIFICATION)
            k = sum(s + p.t for p in plans)
            bound = sum(rs_rounding_weight(s, p.t) for p in plans) / k
            assert bound <= 8.0, (n, s, bound)
            assert n / k < 4 / 3, (n, s, n / k)
            assert sum(s + p.t + p.copies for p in plans) == n


@pytest.mark.parametrize(("n", "s"), [(22, 5), (30, 7), (40, 8), (64, 10), (100, 12), (100, 23),
                                    (256, 32)])
def test_every_default_code_fits_by_its_bound_or_by_the_sampled_sets(n, s):
    code = make_code("grouped-rs", n=n, s=s)
    bound, sampled = code.relative_amplification, error_amplification(code, seed=0)
    assert bound <= 8.0 or sampled <= 8.0, (bound, sampled)
    assert Decoder(None, wire="auto", seed=0).wire_for(code) == "model"
    old = GroupedReedSolomonCode(n, s, max_relative_amplification=None)
    if old.relative_amplification > 8.0 and error_amplification(old, seed=0) > 8.0:
        assert code.k < old.k and bound <= 8.0  # changed only where the old one did not fit


@pytest.mark.parametrize(("s", "t"), [(1, 2), (3, 2), (4, 3), (6, 3), (5, 4), (10, 2)])
def test_rs_rounding_weight_is_the_worst_subset_by_least_squares(s, t):
    m = s + t
    B = rs_block(s, t)
    l1 = np.abs(B).sum(axis=1)
    worst = 0.0
    for rows in itertools.combinations(range(m), t):
        a = np.linalg.lstsq(B[list(rows)].T, np.ones(m), rcond=None)[0]
        assert np.allclose(a @ B[list(rows)], 1.0)
        worst = max(worst, float(np.abs(a) @ l1[list(rows)]))
    assert rs_rounding_weight(s, t) == pytest.approx(worst, rel=1e-9)


@pytest.mark.parametrize(("n", "s"), [(7, 1), (9, 2), (10, 2), (11, 2), (12, 2), (11, 3)])
def test_relative_amplification_bounds_every_straggler_set(n, s):
    """Over ALL sets of ``n - s`` replies: ``sum_i |a_i| ||B_i||_1 / k`` of the decoding the
    server uses (sparse) never exceeds the code's bound."""
    for budget in (None, DEFAULT_MAX_RELATIVE_AMPLIFICATION):
        code = GroupedReedSolomonCode(n, s, max_relative_amplification=budget)
        l1 = np.abs(code.B).sum(axis=1)
        worst = 0.0
        for alive in itertools.combinations(range(n), n - s):
            a = np.asarray(code.sparse_decoding(alive).coefficients)
            worst = max(worst, float(np.abs(a) @ l1) / code.k)
        assert worst <= code.relative_amplification * (1 + 1e-9)
        assert code.rounding_amplification == code.relative_amplification


def test_codes_that_already_fit_are_bitwise_unchanged():
    """Every n <= 20 with s <= n/4, the FRC-shaped codes of the committed benchmarks, and
    codes whose sampled sets (the measure servers used) already fit though the bound does not."""
    cases = [(n, s) for n in range(1, 21) for s in range(0, n // 4 + 1)]
    cases += [(100, 19), (20, 3), (12, 3), (24, 3), (100, 10), (1000, 10)]
    cases += [(22, 5), (23, 5), (40, 8), (60, 10), (100, 23)]
    for n, s in cases:
        new = GroupedReedSolomonCode(n, s)
        old = GroupedReedSolomonCode(n, s, max_relative_amplification=None)
        assert new.B.tobytes() == old.B.tobytes(), (n, s)


def test_spare_clients_become_copies_where_the_budget_needs_it():
    code = GroupedReedSolomonCode(256, 39)
    old = GroupedReedSolomonCode(256, 39, max_relative_amplification=None)
    assert old.relative_amplification > 1000
    assert code.relative_amplification <= 8.0
    assert code.load == old.load == 40  # every client still computes s+1 partitions
    assert code.k < old.k == 256
    assert code.load_overhead == pytest.approx(256 / code.k)
    assert code.is_decodable([i for i in range(256) if i not in range(100, 139)])


def test_beyond_the_load_overhead_cap_the_old_plan_is_kept():
    # n=12, s=6: one group of t=6; fitting needs t=2 and 4 copies (load overhead 12/8 > 4/3)
    code = GroupedReedSolomonCode(12, 6)
    assert code.k == 12 and code.relative_amplification > 8.0
    relaxed = GroupedReedSolomonCode(12, 6, max_load_overhead=2.0)
    assert relaxed.k == 8 and relaxed.relative_amplification <= 8.0
    assert relaxed.load_overhead == pytest.approx(1.5)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"max_relative_amplification": 0.5}, "max_relative_amplification=0.5"),
    ({"max_relative_amplification": float("nan")}, "max_relative_amplification=nan"),
    ({"max_load_overhead": 0.9}, "max_load_overhead=0.9"),
])
def test_bad_budgets_are_refused_with_the_value(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GroupedReedSolomonCode(20, 4, **kwargs)


def test_decoder_limit_is_the_codes_budget():
    assert AMPLIFICATION_LIMIT == DEFAULT_MAX_RELATIVE_AMPLIFICATION
    assert AMPLIFICATION_LIMIT * math.ldexp(1.0, -24) < 0.5 * TOL


@pytest.mark.parametrize(("n", "s"), [(64, 10), (100, 12), (256, 32), (256, 39)])
def test_auto_wire_sends_the_default_code_in_the_model_dtype(n, s, monkeypatch):
    # the guaranteed bound decides: no sampling of decodable sets
    def sampled(*args, **kwargs):
        raise AssertionError("sampled amplification used for a code with a bound")

    monkeypatch.setattr(decoder_module, "error_amplification", sampled)
    assert Decoder(None, wire="auto", seed=0).wire_for(make_code("grouped-rs", n=n, s=s)) == "model"


@pytest.mark.parametrize(("n", "s"), [(20, 4), (30, 3)])
def test_crc_goes_in_float64_unless_the_user_asks(n, s):
    code = make_code("crc", n=n, s=s)
    assert Decoder(None, wire="auto", seed=0).wire_for(code) == "float64"
    assert Decoder(None, wire="model", seed=0).wire_for(code) == "model"
    assert Decoder(None, wire="float64", seed=0).wire_for(
        make_code("grouped-rs", n=n, s=s)) == "float64"


def test_experiment_quick_run_writes_every_promised_key(tmp_path):
    from experiments import wire_precision

    result = wire_precision.main(["--quick", "--dim", "500", "--out", str(tmp_path / "wp")])
    assert (tmp_path / "wp.json").exists()
    assert result["default_code_all_within_tol"]
    for r in result["rows"]:
        assert {"code", "n", "s", "amplification", "max_rel_error_float32", "wire",
                "bytes_ratio", "load_overhead"} <= set(r)
        assert r["bytes_ratio"] == (1.0 if r["wire"] == "model" else 2.0)
    assert {r["wire"] for r in result["rows"] if r["code"] == "crc"} == {"float64"}
