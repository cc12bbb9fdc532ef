"""A DP key set where the run applies no DP that reads it is refused by name, in every kind of
run the ServerApp builds (coded rounds, a rival, asynchronous): a user who set a noise
multiplier and forgot ``dp`` must not train without the privacy they asked for."""

from __future__ import annotations

import pytest

from fl_gradcode.config import merge_config

N = 6


def _builders():
    from server.app import build, build_rival
    from server.asynchronous import build_async

    return {"coded": (build, {}), "rival": (build_rival, {"rival": "fedavg"}),
            "asynchronous": (build_async, {"asynchronous": True, "s": 1})}


@pytest.mark.parametrize("kind", ["coded", "rival", "asynchronous"])
@pytest.mark.parametrize(("key", "value"), [
    ("noise-multiplier", 2.0), ("clip-norm", 0.5), ("target-epsilon", 3.0),
    ("delta", 1e-6), ("accountant", "prv"), ("dp-noise", "independent"),
    ("dp-server-key-file", "/tmp/key"),
])
def test_a_dp_key_with_dp_none_is_refused_by_name(tmp_path, kind, key, value):
    build, extra = _builders()[kind]
    cfg = merge_config({"results-dir": "", "num-clients": N, **extra, key: value})
    with pytest.raises(ValueError, match=f"{key}=.*dp='none', which applies no DP"):
        build(cfg, N)


@pytest.mark.parametrize("kind", ["coded", "rival", "asynchronous"])
def test_the_defaults_and_a_pinned_nonce_still_build(kind):
    build, extra = _builders()[kind]
    cfg = merge_config({"results-dir": "", "num-clients": N, **extra, "dp-run-nonce": "x"})
    assert build(cfg, N)[0] is not None


def test_dp_keys_with_dp_on_still_build():
    from server.app import build

    cfg = merge_config({"results-dir": "", "num-clients": N, "dp": "partition",
                        "noise-multiplier": 2.0, "clip-norm": 0.5})
    assert build(cfg, N)[0] is not None
