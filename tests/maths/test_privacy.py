"""Differential privacy composed with gradient coding.

Exact values, bounds and messages (key files and their CLI, keyed draws, the accountant's
edges) are tested in test_privacy_edges.py."""

from __future__ import annotations

import itertools
import json
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fl_gradcode.codes import make_code
from fl_gradcode.privacy import (
    DPConfig,
    NoiseKeys,
    PrivacyAccountant,
    clip,
    decoded_noise_variance,
    independent_noise_multiplier,
    make_mechanism,
    noise_seed,
    partition_noise,
    write_key_file,
)

KEYS = NoiseKeys(master=bytes(range(32)))


# ---------------------------------------------------------------- mechanism algebra
@settings(max_examples=50, deadline=None)
@given(
    u=st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=20),
    c=st.floats(1e-3, 1e3),
)
def test_clipping_bounds_the_norm_and_keeps_short_vectors(u, c):
    u = np.array(u)
    out = clip(u, c)
    assert np.linalg.norm(out) <= c * (1 + 1e-12)
    if np.linalg.norm(u) <= c:
        np.testing.assert_array_equal(out, u)
    else:  # same direction
        np.testing.assert_allclose(out * np.linalg.norm(u) / c, u, rtol=1e-9, atol=1e-9)


def test_partition_noise_is_float64_deterministic_and_keyed():
    a = partition_noise(KEYS.key(3), 5, 3, 1000, 2.0)
    assert a.dtype == np.float64
    np.testing.assert_array_equal(a, partition_noise(KEYS.key(3), 5, 3, 1000, 2.0))
    assert not np.array_equal(a, partition_noise(KEYS.key(3), 6, 3, 1000, 2.0))
    assert not np.array_equal(a, partition_noise(KEYS.key(4), 5, 4, 1000, 2.0))
    other = NoiseKeys(master=bytes(32))
    assert not np.array_equal(a, partition_noise(other.key(3), 5, 3, 1000, 2.0))
    assert a.std() == pytest.approx(2.0, rel=0.1)
    assert noise_seed(KEYS.key(3), 5, 3) != noise_seed(KEYS.key(3), 5, 3, purpose="data")


def test_key_files_master_and_per_partition(tmp_path):
    path = write_key_file(tmp_path / "k.json")
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    keys = NoiseKeys.from_file(path)
    assert keys.key(0) != keys.key(1) and len(keys.key(0)) == 32
    only = NoiseKeys.from_file(write_key_file(tmp_path / "p.json", partitions=[2, 5]))
    assert only.key(5) != only.key(2)
    with pytest.raises(ValueError, match="no key for partition 3"):
        only.key(3)
    with pytest.raises(ValueError, match="dp-key-file"):
        NoiseKeys.from_config({})


def client_release(code, updates, cfg, keys, worker):
    """What a client releases for ``updates`` under ``cfg`` (no training: fixed u_j), through
    the mechanism object the client mod uses."""
    mechanism = make_mechanism(
        DPConfig(mode=cfg["dp"], clip_norm=cfg["clip-norm"],
                 noise_multiplier=cfg["noise-multiplier"], noise=cfg["dp-noise"])
    )
    out = np.zeros_like(next(iter(updates.values())))
    for j, c in zip(code.assignment(worker), code.encoding_coefficients(worker), strict=True):
        out += c * mechanism.release(updates[j], keys=keys, partition=j,
                                     server_round=cfg["server-round"], nonce="", worker=worker)
    return out


DP_CFG = {"dp": "partition", "clip-norm": 1.0, "noise-multiplier": 0.7, "server-round": 4,
          "dp-noise": "identical"}


@pytest.mark.parametrize(("name", "n", "s"), [("frc", 6, 2), ("crc", 6, 2), ("grouped-rs", 7, 3)])
def test_identical_noise_decodes_exactly_to_noisy_clipped_sum_for_every_pattern(name, n, s):
    rng = np.random.default_rng(0)
    weights = rng.uniform(0.5, 2, size=make_code(name, n=n, s=s).k)
    code = make_code(name, n=n, s=s, weights=weights)
    updates = {j: rng.standard_normal(50) * 3 for j in range(code.k)}
    target = sum(
        weights[j] * (clip(updates[j], 1.0) + partition_noise(KEYS.key(j), 4, j, 50, 0.7))
        for j in range(code.k)
    )
    replies = {i: client_release(code, updates, DP_CFG, KEYS, i) for i in range(n)}
    for stragglers in itertools.combinations(range(n), s):
        got = {i: r for i, r in replies.items() if i not in stragglers}
        np.testing.assert_allclose(code.decode(got), target, rtol=1e-9, atol=1e-9)


def test_independent_noise_breaks_replica_agreement():
    code = make_code("frc", n=4, s=1)
    updates = {j: np.ones(10) for j in range(4)}
    cfg = {**DP_CFG, "dp-noise": "independent"}
    a = client_release(code, updates, cfg, KEYS, 0)
    b = client_release(code, updates, cfg, KEYS, 1)  # same group, same partitions
    assert not np.allclose(a, b)
    same = client_release(code, updates, DP_CFG, KEYS, 0)
    np.testing.assert_array_equal(same, client_release(code, updates, DP_CFG, KEYS, 1))


@pytest.mark.parametrize(("name", "noise"), [("frc", "identical"), ("frc", "independent"),
                                              ("crc", "identical"), ("crc", "independent")])
def test_decoded_noise_variance_matches_monte_carlo(name, noise):
    """identical: sigma^2 C^2 k; independent: sigma^2 C^2 sum_i a_i^2 ||B_i||^2."""
    n, s, sd = 6, 2, 0.5
    code = make_code(name, n=n, s=s, seed=0)
    alive = [0, 2, 3, 5]
    dec = code.decoding(alive)
    predicted = decoded_noise_variance(code.B, code.weights, dec.coefficients, dec.alpha, sd, noise)
    if noise == "identical":
        assert predicted == pytest.approx(sd**2 * code.k)
    rng = np.random.default_rng(1)
    trials, dim = 400, 200
    samples = []
    for _ in range(trials):
        if noise == "identical":
            shared = rng.standard_normal((code.k, dim)) * sd
            msgs = code.B @ shared
        else:
            msgs = np.stack(
                [code.B[i] @ (rng.standard_normal((code.k, dim)) * sd) for i in range(n)]
            )
        samples.append(dec.coefficients[alive] @ msgs[alive])
    measured = np.var(np.stack(samples))
    assert measured == pytest.approx(predicted, rel=0.05)
    if name == "crc" and noise == "independent":
        assert predicted > 3 * sd**2 * code.k  # why identical noise matters


def test_independent_noise_multiplier_frc_keeps_sigma_and_crc_loses():
    code = make_code("frc", n=12, s=2)
    assert independent_noise_multiplier(code.B, 1.2) == pytest.approx(1.2)
    assert independent_noise_multiplier(np.eye(5), 1.2) == pytest.approx(1.2)
    crc = make_code("crc", n=6, s=2, seed=0)
    assert independent_noise_multiplier(crc.B, 1.0) < 1.0


# ---------------------------------------------------------------- accounting
@pytest.mark.parametrize("accountant", ["rdp", "prv"])
@pytest.mark.parametrize(("sigma", "q", "steps"), [(1.0, 1.0, 100), (1.1, 0.1, 37), (2.0, 0.02, 5)])
def test_epsilon_equals_opacus_own_accountant(accountant, sigma, q, steps):
    from opacus.accountants import PRVAccountant, RDPAccountant

    ours = PrivacyAccountant(DPConfig(mode="partition", accountant=accountant), [(sigma, q, 1)])
    ref = RDPAccountant() if accountant == "rdp" else PRVAccountant()
    for _ in range(steps):
        ref.step(noise_multiplier=sigma, sample_rate=q)
    assert ours.epsilon_after(steps) == pytest.approx(ref.get_epsilon(delta=1e-5), rel=1e-9)
    if accountant == "rdp" and (sigma, q, steps) == (1.0, 1.0, 100):
        # Opacus' RDP accountant at sigma = 1, q = 1, 100 steps, computed once
        assert ours.epsilon_after(100) == pytest.approx(96.116, abs=1e-3)


def test_worst_unit_sets_epsilon_and_target_budget_is_respected():
    cfg = DPConfig(mode="sample", target_epsilon=5.0)
    acc = PrivacyAccountant(cfg, [[(1.0, 0.1, 5)], [(1.0, 0.5, 2)]])
    single = PrivacyAccountant(cfg, [(1.0, 0.5, 2)])
    assert acc.epsilon_after(3) == pytest.approx(
        max(single.epsilon_after(3), PrivacyAccountant(cfg, [(1.0, 0.1, 5)]).epsilon_after(3))
    )
    while acc.can_run_round():
        acc.step()
    assert acc.epsilon <= 5.0 < acc.epsilon_after(acc.rounds + 1)


# ---------------------------------------------------------------- end to end (no Ray)
MASTER = bytes(range(32))


@pytest.fixture
def server_key_file(tmp_path):
    path = tmp_path / "server-key.json"
    path.write_text(json.dumps({"server": bytes(range(50, 82)).hex()}))
    return str(path)


def run_job(overrides, key_file, n=4, rounds=3, record=None):
    """The real ServerApp setup, coding mod and ClientApp, in process (no Ray)."""
    from server.app import run_in_process

    cfg = {"num-rounds": rounds, "virtual-compute": "none", **overrides}
    return run_in_process(cfg, n, key_file=key_file, recorded=record)


@pytest.mark.parametrize("mode", ["partition", "central", "sample"])
def test_exactness_survives_dp_coded_run_equals_uncoded_dp_run(
    mode, tmp_path, key_file, server_key_file
):
    common = {
        "dp": mode,
        "noise-multiplier": 0.8,
        "clip-norm": 0.5,
        "latency": "shifted-exponential",  # stragglers every round in virtual time
        "seed": 2,
        "update": "local" if mode == "sample" else "gradient",
        "lr": 0.2,
        "dp-run-nonce": "compare-coded-with-uncoded",  # identical noise in both runs
        "dp-server-key-file": server_key_file,
    }
    # keyed noise (partition, sample) is bound to the received model, which the coded and
    # uncoded runs share bit for bit in round 1 only (later, equal up to rounding): one round
    rounds = 3 if mode == "central" else 1
    coded, theta_c = run_job(
        {**common, "code": "grouped-rs", "s": 1, "results-dir": str(tmp_path / "c")}, key_file,
        rounds=rounds,
    )
    uncoded, theta_u = run_job(
        {**common, "code": "uncoded", "s": 0, "results-dir": str(tmp_path / "u")}, key_file,
        rounds=rounds,
    )
    assert all(len(r["stragglers"]) >= 1 and r["decode"] == "exact" for r in coded.history)
    assert all(len(r["clients_used"]) == 4 for r in uncoded.history)
    assert np.linalg.norm(theta_c - theta_u) <= 1e-6 * np.linalg.norm(theta_u)
    assert coded.history[-1]["epsilon"] == pytest.approx(uncoded.history[-1]["epsilon"])
    assert coded.history[-1]["epsilon"] <= uncoded.history[-1]["epsilon"] + 1e-12


def test_server_messages_and_state_never_contain_the_partition_key(tmp_path, key_file):
    keys = NoiseKeys(master=MASTER)
    derived = [keys.key(j) for j in range(4)]
    pushed = []
    strategy, _ = run_job(
        {"dp": "partition", "code": "grouped-rs", "s": 1, "latency": "none",
         "results-dir": str(tmp_path / "k")},
        key_file,
        record=pushed,
    )
    assert pushed
    needles = [MASTER, *derived]
    blobs = [pickle.dumps({k: v for k, v in strategy.__dict__.items()
                           if k in ("code_spec", "dp", "accountant", "history", "nonce",
                                    "identities", "partition_sizes", "_codes")})]
    for msg in pushed:
        for rec in msg.content.config_records.values():
            blobs.append(pickle.dumps(dict(rec)))
        for rec in msg.content.array_records.values():
            blobs.extend(arr.numpy().tobytes() for arr in rec.values())
    for blob in blobs:
        for needle in needles:
            assert needle not in blob
            assert needle.hex().encode() not in blob
    assert all(r["epsilon"] is not None for r in strategy.history)


def test_target_epsilon_stops_training_before_the_budget_is_exceeded(tmp_path, key_file):
    sigma = 3.0
    acc = PrivacyAccountant(DPConfig(mode="central"), [(sigma, 1.0, 1)])
    target = (acc.epsilon_after(3) + acc.epsilon_after(4)) / 2  # allows exactly 3 rounds
    strategy, _ = run_job(
        {"dp": "central", "noise-multiplier": sigma, "target-epsilon": target,
         "code": "grouped-rs", "s": 1, "latency": "none", "results-dir": str(tmp_path / "t")},
        key_file,
        rounds=6,
    )
    rows = strategy.history
    assert [r["stopped"] for r in rows] == [False] * 3 + [True] * 3
    assert all(r["epsilon"] <= target for r in rows)
    assert rows[-1]["epsilon"] == pytest.approx(acc.epsilon_after(3))
    assert all(r["decode"] == "skipped" for r in rows[3:])
    assert rows[2]["accuracy"] == rows[-1]["accuracy"]  # the last model within budget is kept


def _one_round(tmp_path, key_file, name, **overrides):
    cfg = {"code": "frc", "s": 1, "latency": "none", "update": "gradient", "lr": 0.5,
           "results-dir": str(tmp_path / name), **overrides}
    return run_job(cfg, key_file, n=4, rounds=1)


def test_central_noise_is_present_with_the_stated_std(tmp_path, key_file):
    """Released minus noiseless model = the server's noise: std sigma C max_j n_j / sum n_j
    (exact decoding, FedAvg with step 1). Independent reference: the partition sizes."""
    from fl_gradcode.config import merge_config
    from fl_gradcode.data import run_partitions

    sigma, c = 2.0, 0.5
    common = {"dp": "central", "clip-norm": c}
    released, theta = _one_round(tmp_path, key_file, "r", **common, **{"noise-multiplier": sigma})
    _, clean = _one_round(tmp_path, key_file, "c", **common, **{"noise-multiplier": 0.0})
    _, index = run_partitions(merge_config({}), 4)
    sizes = np.array([len(i) for i in index], dtype=float)
    expected = sigma * c * sizes.max() / sizes.sum()
    noise = theta - clean
    assert noise.size > 500
    assert np.std(noise) == pytest.approx(expected, rel=0.1)
    assert abs(np.mean(noise)) < 4 * expected / np.sqrt(noise.size)
    assert released.history[0]["central_noise_std"] == pytest.approx(expected)


def test_central_noise_is_not_derived_from_anything_clients_know(tmp_path, key_file):
    """Without a server key the noise comes from OS randomness: two identical runs differ, and
    no generator seeded from public run-config values reproduces it."""
    common = {"dp": "central", "noise-multiplier": 1.0, "clip-norm": 0.5, "seed": 0}
    _, a = _one_round(tmp_path, key_file, "a", **common)
    _, b = _one_round(tmp_path, key_file, "b", **common)
    _, clean = _one_round(tmp_path, key_file, "c", **{**common, "noise-multiplier": 0.0})
    noise = a - clean
    assert np.linalg.norm(a - b) > 0.5 * np.linalg.norm(noise)
    for seed in ([0, 1, 0xC0DE], [0, 1], 0, 1):
        guess = np.random.Generator(np.random.PCG64(seed)).standard_normal(noise.size)
        assert abs(np.corrcoef(guess, noise)[0, 1]) < 0.2


def test_partition_noise_is_fresh_in_every_run_unless_the_nonce_is_pinned(tmp_path, key_file):
    common = {"dp": "partition", "noise-multiplier": 1.0, "clip-norm": 0.5}
    _, a = _one_round(tmp_path, key_file, "a", **common)
    _, b = _one_round(tmp_path, key_file, "b", **common)
    assert np.linalg.norm(a - b) > 1e-3 * np.linalg.norm(a)  # the noise does not cancel
    pinned = {**common, "dp-run-nonce": "pinned"}
    _, c = _one_round(tmp_path, key_file, "c", **pinned)
    _, d = _one_round(tmp_path, key_file, "d", **pinned)
    assert np.array_equal(c, d)


def test_keyed_noise_differs_per_partition_per_round_and_per_nonce():
    draws = {
        (j, r, nonce): partition_noise(MASTER, r, j, 64, 1.0, nonce=nonce)
        for j in range(3) for r in (1, 2) for nonce in ("", "a", "b")
    }
    values = list(draws.values())
    for x, y in itertools.combinations(values, 2):
        assert not np.allclose(x, y)


def test_dp_config_validation():
    with pytest.raises(ValueError, match="dp='local'"):
        DPConfig(mode="local")
    with pytest.raises(ValueError, match="clip-norm=0"):
        DPConfig(mode="partition", clip_norm=0)
    with pytest.raises(ValueError, match="dp-noise='shared'"):
        DPConfig(mode="partition", noise="shared")
    with pytest.raises(ValueError, match=r"delta=1\.5"):
        DPConfig(delta=1.5)
