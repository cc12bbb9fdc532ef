"""Differential privacy composed with gradient coding."""

from __future__ import annotations

import itertools
import json
import math
import pickle
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fl_gradcode import privacy
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


# ======== edges: exact values, bounds and messages ===============================================
def _write_master(path, master: bytes) -> str:
    path.write_text(json.dumps({"master": master.hex()}))
    return str(path)


def test_key_file_path_is_read_from_the_dp_key_file_node_config_entry(tmp_path, monkeypatch):
    """``node_config["dp-key-file"]`` names the key file; the partition keys are the HMACs of
    that file's master key (reference: ``NoiseKeys(master=...)`` built from the same bytes)."""
    monkeypatch.delenv(privacy.KEY_FILE_ENV, raising=False)
    master = bytes(range(32))
    path = _write_master(tmp_path / "k.json", master)
    keys = NoiseKeys.from_config({"dp-key-file": path})
    assert keys.key(4) == NoiseKeys(master=master).key(4)


def test_key_file_path_falls_back_to_the_environment_variable(tmp_path, monkeypatch):
    master = bytes(range(1, 33))
    monkeypatch.setenv(privacy.KEY_FILE_ENV, _write_master(tmp_path / "e.json", master))
    assert NoiseKeys.from_config({}).key(0) == NoiseKeys(master=master).key(0)


def test_independent_noise_multiplier_ignores_a_client_that_holds_no_partition():
    """B = [[1, 1], [0, 0], [1, 0]]: rows' squared norms 2, 0, 1; per-partition shares
    (1/2 + 1, 1/2) -> worst 3/2, so sigma / sqrt(3/2). The empty row contributes nothing."""
    B = np.array([[1.0, 1.0], [0.0, 0.0], [1.0, 0.0]])
    assert independent_noise_multiplier(B, 2.0) == pytest.approx(2.0 / math.sqrt(1.5))


def test_without_dp_a_partition_update_is_released_unchanged_as_float64():
    mech = make_mechanism(DPConfig(mode="none"))
    update = np.array([1.5, -2.0, 3.25], dtype=np.float32)
    out = mech.release(update, keys=None, partition=0, server_round=1, nonce="", worker=0)
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, [1.5, -2.0, 3.25])
    assert mech.server_noise_std(3.0) == 0.0


def _keygen_cli(argv: list[str]) -> None:
    """``python -m fl_gradcode.privacy *argv``, in this process (so capsys sees its output)."""
    import runpy
    import sys
    import warnings

    saved = sys.argv
    sys.argv = ["python -m fl_gradcode.privacy", *argv]
    try:
        with warnings.catch_warnings():  # the module is imported already: runpy says so
            warnings.simplefilter("ignore", RuntimeWarning)
            runpy.run_module("fl_gradcode.privacy", run_name="__main__", alter_sys=True)
    finally:
        sys.argv = saved


def test_keygen_cli_writes_per_partition_keys_for_a_comma_list(tmp_path, capsys):
    path = tmp_path / "p.json"
    _keygen_cli(["keygen", str(path), "--partitions", "1,4"])
    data = json.loads(path.read_text())
    assert sorted(data["partitions"]) == ["1", "4"]
    assert all(len(bytes.fromhex(h)) == 32 for h in data["partitions"].values())
    assert str(path) in capsys.readouterr().out


def test_keygen_cli_writes_a_master_key_without_partitions(tmp_path):
    path = tmp_path / "m.json"
    _keygen_cli(["keygen", str(path)])
    assert len(bytes.fromhex(json.loads(path.read_text())["master"])) == 32


def test_keygen_cli_help_documents_the_per_partition_option(capsys):
    with pytest.raises(SystemExit):
        _keygen_cli(["keygen", "--help"])
    assert "per-partition keys" in capsys.readouterr().out


def test_clip_returns_float64_even_when_the_update_is_already_within_the_norm():
    u = np.array([0.25, -0.5], dtype=np.float32)
    out = privacy.clip(u, 10.0)
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, [0.25, -0.5])


def test_partition_dp_without_keys_names_the_missing_partition_keys():
    mech = make_mechanism(DPConfig(mode="partition", clip_norm=1.0, noise_multiplier=1.0))
    with pytest.raises(ValueError, match="needs partition keys"):
        mech.release(np.ones(3), keys=None, partition=0, server_round=1, nonce="", worker=0)


def _central_reference(key: bytes, dim: int, std: float, server_round: int, nonce: str):
    """The documented draw, by hand: PCG64 seeded with the first 16 bytes (little endian) of
    ``HMAC-SHA256(key, "nonce=..;round=..;purpose=central")``."""
    import hashlib
    import hmac

    tag = f"nonce={nonce};round={server_round};purpose=central".encode()
    seed = int.from_bytes(hmac.new(key, tag, hashlib.sha256).digest()[:16], "little")
    return std * np.random.Generator(np.random.PCG64(seed)).standard_normal(dim)


@pytest.mark.parametrize("field", ["server", "master"])
def test_server_noise_key_file_uses_its_server_or_else_its_master_key(tmp_path, field):
    key = bytes(range(7, 39))
    path = tmp_path / "s.json"
    path.write_text(json.dumps({field: key.hex()}))
    got = privacy.ServerNoise.from_file(path).draw(5, 0.5, 3, nonce="n")
    np.testing.assert_array_equal(got, _central_reference(key, 5, 0.5, 3, "n"))


def test_noise_seed_default_purpose_is_the_documented_hmac_of_round_and_partition():
    """Docstring format: ``HMAC-SHA256(key, "[nonce=N;]round=r;partition=j[;purpose]")``, the
    purpose omitted for the default noise stream; the seed is the first 8 bytes, little
    endian. Reference: hmac/hashlib by hand."""
    import hashlib
    import hmac

    key = b"k" * 32

    def ref(tag: str) -> int:
        return int.from_bytes(hmac.new(key, tag.encode(), hashlib.sha256).digest()[:8], "little")

    assert privacy.noise_seed(key, 5, 2) == ref("round=5;partition=2")
    assert privacy.noise_seed(key, 5, 2, nonce="ab") == ref("nonce=ab;round=5;partition=2")
    assert privacy.noise_seed(key, 5, 2, purpose="data") == ref("round=5;partition=2;purpose=data")


def test_noise_keys_without_any_key_are_refused_saying_what_is_needed():
    with pytest.raises(ValueError, match="NoiseKeys needs a master key or per-partition keys"):
        NoiseKeys()


def test_a_budget_below_one_epsilon_is_still_enforced():
    """target_epsilon=0.5 is a budget (only 0 means none). One round at sigma=0.5, q=1 costs far
    more than 0.5 (reference: Opacus' RDP accountant called directly), so no round may run."""
    from opacus.accountants import RDPAccountant

    ref = RDPAccountant()
    ref.history = [(0.5, 1.0, 1)]
    assert ref.get_epsilon(delta=1e-5) > 0.5

    cfg = DPConfig(mode="partition", noise_multiplier=0.5, target_epsilon=0.5)
    acc = privacy.PrivacyAccountant(cfg, [(0.5, 1.0, 1)])
    assert not acc.can_run_round()
    unlimited = privacy.PrivacyAccountant(DPConfig(mode="partition", noise_multiplier=0.5),
                                          [(0.5, 1.0, 1)])
    assert unlimited.can_run_round()


def test_keygen_cli_without_a_command_exits_2_naming_the_missing_cmd(capsys):
    """The subcommand is required: argparse's usage error (exit status 2) names the ``cmd``
    destination, instead of the run going on with no command."""
    with pytest.raises(SystemExit) as exc:
        _keygen_cli([])
    assert exc.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert re.fullmatch(r".*: error: the following arguments are required: cmd", last), last


def test_keygen_cli_top_level_help_describes_the_keygen_command(capsys):
    with pytest.raises(SystemExit) as exc:
        _keygen_cli(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert re.search(r"^\s+keygen\s+write a fresh key file \(mode 0600\)$", out, re.M), out


def test_clip_of_a_long_float32_update_is_float64_and_exact():
    """u = (3, 4) in float32 has norm 5 (by hand); clipped to C = 1/3 it is the float64
    vector (3, 4) * (1/3) / 5, computed here in float64 numpy (float32 arithmetic differs)."""
    u = np.array([3.0, 4.0], dtype=np.float32)
    out = clip(u, 1.0 / 3.0)
    assert out.dtype == np.float64
    expected = np.array([3.0, 4.0], dtype=np.float64) * ((1.0 / 3.0) / 5.0)
    assert not np.array_equal(expected.astype(np.float32).astype(np.float64), expected)
    np.testing.assert_array_equal(out, expected)
    ints = clip(np.array([3, 4]), 1.0 / 3.0)  # an integer update: float64 too
    assert ints.dtype == np.float64
    np.testing.assert_array_equal(ints, expected)


def test_noise_keys_from_an_empty_config_gives_the_full_keygen_hint(monkeypatch):
    monkeypatch.delenv(privacy.KEY_FILE_ENV, raising=False)
    expected = (
        "dp needs partition keys on the client: set node config 'dp-key-file' or the "
        "environment variable FL_GRADCODE_DP_KEY_FILE (create one with "
        "`python -m fl_gradcode.privacy keygen FILE`)"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
        NoiseKeys.from_config({})


def test_partition_dp_without_keys_refuses_with_its_exact_message():
    mech = make_mechanism(DPConfig(mode="partition"))
    with pytest.raises(ValueError, match=r"^dp='partition' needs partition keys on the client$"):
        mech.release(np.ones(2), keys=None, partition=1, server_round=2, nonce="", worker=0)


def _opacus_rdp_epsilon(steps: list[tuple[float, float]], delta: float = 1e-5) -> float:
    """Reference: Opacus' RDP accountant stepped once per (sigma, q), directly."""
    from opacus.accountants import RDPAccountant

    ref = RDPAccountant()
    for sigma, q in steps:
        ref.step(noise_multiplier=sigma, sample_rate=q)
    return ref.get_epsilon(delta=delta)


def test_rounds_at_their_own_multiplier_mix_with_rounds_at_a_set_multiplier():
    """Rounds at each step's own sigma (``None``) and at a set multiplier compose together."""
    cfg = DPConfig(mode="partition", noise_multiplier=1.0)
    acc = PrivacyAccountant(cfg, [(1.0, 1.0, 1)])
    acc.step()
    eps = acc.step(2.0)
    assert eps == pytest.approx(_opacus_rdp_epsilon([(1.0, 1.0), (2.0, 1.0)]), rel=1e-9)
    acc.step()
    assert acc.epsilon == pytest.approx(
        _opacus_rdp_epsilon([(1.0, 1.0), (2.0, 1.0), (1.0, 1.0)]), rel=1e-9)
    assert acc.epsilon_after(5, 3.0) == pytest.approx(
        _opacus_rdp_epsilon([(1.0, 1.0), (2.0, 1.0), (1.0, 1.0), (3.0, 1.0), (3.0, 1.0)]),
        rel=1e-9)
    assert acc.epsilon_after(4) == pytest.approx(
        _opacus_rdp_epsilon([(1.0, 1.0)] * 3 + [(2.0, 1.0)]), rel=1e-9)


def test_a_round_multiplier_below_one_is_accounted_and_zero_means_no_privacy():
    cfg = DPConfig(mode="partition", noise_multiplier=1.0)
    acc = PrivacyAccountant(cfg, [(1.0, 0.5, 1)])
    assert acc.step(0.5) == pytest.approx(_opacus_rdp_epsilon([(0.5, 0.5)]), rel=1e-9)
    assert acc.step(0) == math.inf  # a round without noise: no finite epsilon
    assert acc.multipliers == [0.5, 0.0]


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan, -0.5, True, "1.0"])
def test_a_round_multiplier_that_is_not_a_finite_non_negative_number_is_refused(bad):
    acc = PrivacyAccountant(DPConfig(mode="partition"), [(1.0, 1.0, 1)])
    msg = f"noise_multiplier={bad!r} must be a finite number >= 0 (or None: each step's own)"
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        acc.step(bad)
    assert acc.rounds == 0 and acc.multipliers == []


def test_server_noise_default_nonce_is_the_empty_nonce(tmp_path):
    """Without a nonce the keyed central draw is the documented one for ``nonce=""``
    (reference: the HMAC/PCG64 draw by hand, :func:`_central_reference`)."""
    key = bytes(range(9, 41))
    got = privacy.ServerNoise(key).draw(6, 0.75, 2)
    np.testing.assert_array_equal(got, _central_reference(key, 6, 0.75, 2, ""))


def test_gaussian_epsilon_is_the_projects_rdp_accountants_epsilon_without_torch():
    """The numpy epsilon of composed sample-rate-1 Gaussian mechanisms (the client's release
    ledger) equals the project's Opacus RDP accountant's, at Opacus' own orders."""
    from opacus.accountants import RDPAccountant

    assert list(privacy.RDP_ORDERS) == list(RDPAccountant.DEFAULT_ALPHAS)
    for sigmas, delta in (([1.0], 1e-5), ([2.0, 2.0, 0.7], 1e-6), ([5.0] * 40 + [3.0], 1e-5)):
        acc = PrivacyAccountant(DPConfig(mode="partition", delta=delta), [(1.0, 1.0, 1)])
        for sigma in sigmas:
            acc.step(sigma)
        assert privacy.gaussian_epsilon(sigmas, delta) == pytest.approx(acc.epsilon, rel=1e-12)
    assert privacy.gaussian_epsilon([], 1e-5) == 0.0
    assert privacy.gaussian_epsilon([1.0, 0.0], 1e-5) == math.inf
