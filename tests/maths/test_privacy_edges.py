"""Differential privacy composed with gradient coding, edges: exact values, bounds and
messages of the key files and their keygen CLI, clipping, the keyed noise draws (client and
server), the refusals without keys, and the accountant (budgets, per-round multipliers)."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from fl_gradcode import privacy
from fl_gradcode.privacy import (
    MIN_CLIP_NORM,
    DPConfig,
    NoiseKeys,
    PrivacyAccountant,
    clip,
    independent_noise_multiplier,
    make_mechanism,
)


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


def _best_unbiased_sigma_by_monte_carlo(B, sizes, sigma, samples=40000, seed=0):
    """Replies y_i = sum_j B_ij n_j (u_j + z_ij), z_ij ~ N(0, sigma^2) drawn per replica:
    for each partition the minimum-variance unbiased combination of the replies (weights
    W_ij / var_i), its empirical noise sd over n_j; the worst (smallest) over partitions."""
    rng = np.random.default_rng(seed)
    W = np.asarray(B, float) * np.asarray(sizes, float)[None, :]
    z = rng.standard_normal((samples, *W.shape)) * sigma
    noise = np.einsum("ij,tij->ti", W, z)
    var = noise.var(axis=0)
    worst = np.inf
    for j in range(W.shape[1]):
        held = W[:, j] != 0
        a, v = W[held, j], var[held]
        estimate = (noise[:, held] @ (a / v)) / (a @ (a / v))
        worst = min(worst, estimate.std())
    return worst


@pytest.mark.parametrize(("code", "sizes"), [
    (("frc", 4, 1), [40.0, 10.0, 25.0, 25.0]),
    (("frc", 6, 2), [5.0, 50.0, 12.0, 12.0, 30.0, 7.0]),
    (("crc", 6, 2), [10.0, 20.0, 30.0, 40.0, 50.0, 60.0]),
])
def test_independent_noise_is_accounted_at_the_example_weighted_multiplier(code, sizes):
    """A client weights partition j's release by B_ij n_j, so a large partition dominates the
    noise of its replies and the server averaging the replicas sees less than sigma for it;
    the unweighted multiplier (equal sizes) understated epsilon (frc:1 with these sizes:
    sigma 1.0 accounted, 0.729 real)."""
    from fl_gradcode.codes import make_code
    from fl_gradcode.privacy import independent_noise_multiplier

    name, n, s = code
    B = make_code(name, n=n, s=s, **({"seed": 0} if name == "crc" else {})).B
    expected = _best_unbiased_sigma_by_monte_carlo(B, sizes, 1.0)
    assert independent_noise_multiplier(B, 1.0, np.array(sizes)) == pytest.approx(expected,
                                                                                rel=0.03)


def test_a_partition_of_unknown_size_is_taken_at_its_worst():
    """FRC n = 4, s = 1: a partition of unknown size may dominate both replies holding it,
    sigma / sqrt(2); partitions of known size are never accounted above that either."""
    from fl_gradcode.codes import make_code
    from fl_gradcode.privacy import independent_noise_multiplier

    B = make_code("frc", n=4, s=1).B
    got = independent_noise_multiplier(B, 1.0, np.array([np.nan, 10.0, 25.0, 25.0]))
    assert got == pytest.approx(1 / np.sqrt(2), rel=1e-12)
    assert independent_noise_multiplier(B, 1.0, np.array([10.0, 10.0, 10.0, 10.0])) == (
        pytest.approx(1.0, rel=1e-12))
    with pytest.raises(ValueError, match=r"sizes=.* expected 4 example counts >= 0"):
        independent_noise_multiplier(B, 1.0, np.array([1.0, 2.0]))


@pytest.mark.parametrize(("code", "s", "replicas"), [("frc", 1, 2), ("grouped-rs", 2, 3)])
def test_the_server_apps_budget_check_starts_at_the_worst_case_of_independent_noise(code, s,
                                                                                   replicas):
    """Each round is accounted at its example-weighted multiplier, known only once sizes are
    agreed; the budget check before a round must not judge it at more: the accountant starts
    at sigma / sqrt(replicas) (a partition dominating both replies that hold it), so a target
    between that epsilon and the equal-size one refuses the first round instead of running it
    past the budget."""
    from fl_gradcode.config import DEFAULTS
    from fl_gradcode.privacy import DPConfig
    from server.app import make_accountant, strategy_keywords

    n = 4 if code == "frc" else 6
    cfg = {**DEFAULTS, "code": code, "s": s, "dp": "partition", "dp-noise": "independent",
           "noise-multiplier": 1.0}
    keywords = strategy_keywords(cfg, n)
    accountant = make_accountant(keywords["dp"], keywords, n, np.full(n, 30.0), cfg)
    worst = 1.0 / np.sqrt(replicas)
    assert accountant.epsilon_after(1) == pytest.approx(accountant.epsilon_after(1, worst),
                                                        rel=1e-12)
    target = (accountant.epsilon_after(1, worst) + accountant.epsilon_after(1, 1.0)) / 2
    capped = make_accountant(DPConfig(mode="partition", noise="independent",
                                      noise_multiplier=1.0, target_epsilon=target),
                             keywords, n, np.full(n, 30.0), cfg)
    assert not capped.can_run_round()


@pytest.mark.parametrize("clip_norm", [MIN_CLIP_NORM, 1e-300, 3e-308, 1e-200])
@pytest.mark.parametrize("scale", [1.0, 1e10, 1e100])
def test_clip_bounds_the_norm_even_when_the_ratio_underflows(clip_norm, scale):
    """With C / ||u|| below the smallest normal float, scaling by it rounded the clipped
    norm up to about twice C (what the noise, sized for C, does not cover). The norm,
    computed independently (in units of C), is at most C up to rounding."""
    rng = np.random.default_rng(0)
    for _ in range(20):
        u = rng.normal(size=50) * scale
        out = clip(u, clip_norm)
        ratio = np.linalg.norm(out / clip_norm)  # (out itself squared would underflow)
        assert ratio <= 1 + 1e-9, (clip_norm, scale, ratio)


def test_a_clip_norm_below_the_smallest_normal_float_is_refused_by_name():
    with pytest.raises(ValueError, match="clip-norm=5e-323"):
        DPConfig(mode="partition", clip_norm=5e-323)
    DPConfig(mode="partition", clip_norm=MIN_CLIP_NORM)  # the smallest accepted


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("mode", ["partition", "central"])
def test_a_non_finite_update_is_released_as_the_zero_vector_would_be(bad, mode):
    """A NaN or inf passed through clipping and noise, so which releases were non-finite told
    the server exactly which partitions hold a record whose update overflowed on a model it
    chose. The release of such an update is the zero vector's (inside the clip ball)."""
    mechanism = privacy.make_mechanism(privacy.DPConfig(mode=mode, clip_norm=0.5,
                                                        noise_multiplier=1.3))
    keys = NoiseKeys(master=b"\x07" * 32)
    update = np.linspace(-3.0, 3.0, 12)
    update[5] = bad
    kw = dict(keys=keys, partition=2, server_round=4, nonce="n", worker=1)
    released = mechanism.release(update, **kw)
    np.testing.assert_array_equal(released, mechanism.release(np.zeros(12), **kw))
    assert np.isfinite(released).all()
    np.testing.assert_array_equal(privacy.clip(update, 0.5), np.zeros(12))
