"""Privacy behaviours pinned down after mutation testing (``experiments/mutation.py``).

Expected values are hand-derived or read back from files written here, never produced by the
function under test.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fl_gradcode import privacy
from fl_gradcode.privacy import (
    DPConfig,
    NoiseKeys,
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


def test_keygen_cli_writes_per_partition_keys_for_a_comma_list(tmp_path, capsys):
    path = tmp_path / "p.json"
    privacy._main(["keygen", str(path), "--partitions", "1,4"])
    data = json.loads(path.read_text())
    assert sorted(data["partitions"]) == ["1", "4"]
    assert all(len(bytes.fromhex(h)) == 32 for h in data["partitions"].values())
    assert str(path) in capsys.readouterr().out


def test_keygen_cli_writes_a_master_key_without_partitions(tmp_path):
    path = tmp_path / "m.json"
    privacy._main(["keygen", str(path)])
    assert len(bytes.fromhex(json.loads(path.read_text())["master"])) == 32


def test_keygen_cli_help_documents_the_per_partition_option(capsys):
    with pytest.raises(SystemExit):
        privacy._main(["keygen", "--help"])
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
