"""A node that insists on noise gets noise that replicas cannot average away: under a policy it
refuses ``dp-noise='independent'`` (replicas of a partition would release independent draws the
server can average, ``sigma/sqrt(r)`` from ``r`` replicas) and, under ``dp-required`` =
``partition`` or ``sample``, a ``noise-multiplier`` of 0 (a clipped but un-noised release)."""

from __future__ import annotations

import numpy as np
import pytest

from fl_gradcode.flower.mod import MOD_ERROR_CODE, make_gradient_coding_mod
from tests.flower.test_node_dp_policy import NoisyApp, _coded, _context, _inst, _message, _raw

pytestmark = pytest.mark.filterwarnings("ignore:gradient_coding_mod:UserWarning")


def _reply(key_file, instruction, policy, **config):
    app = NoisyApp()
    reply = make_gradient_coding_mod()(_message(instruction, **config),
                                       _context(**{"dp-key-file": key_file}, **policy), app)
    return reply, app


@pytest.mark.parametrize("policy", [{"dp-required": "partition"},
                                    {"dp-min-noise-multiplier": 1.0},
                                    {"dp-required": "central"}])
def test_independent_noise_is_refused_under_a_policy(key_file, policy):
    reply, app = _reply(key_file, _inst(dp="partition", noise_multiplier=1.0, clip_norm=1.0,
                                        dp_noise="independent"), policy)
    assert reply.has_error() and reply.error.code == MOD_ERROR_CODE
    assert "dp-noise='independent' refused" in reply.error.reason
    assert next(iter(policy)) in reply.error.reason
    assert app.seen == []


def test_without_a_policy_independent_noise_is_still_run(key_file):
    """The demonstration mode stays available to a node that insists on nothing: two
    replicas of one partition then release different noise."""
    inst = _inst(dp="partition", noise_multiplier=1.0, clip_norm=1.0, dp_noise="independent")
    a, _ = _reply(key_file, inst, {})
    b, _ = _reply(key_file, _inst(dp="partition", noise_multiplier=1.0, clip_norm=1.0,
                                  dp_noise="independent", worker=1), {})
    assert not np.allclose(_coded(a), _coded(b))


@pytest.mark.parametrize("required", ["partition", "sample"])
def test_a_node_requiring_local_noise_refuses_sigma_zero(key_file, required):
    reply, app = _reply(key_file, _inst(dp=required, noise_multiplier=0.0, clip_norm=1e6),
                        {"dp-required": required})
    assert reply.has_error() and reply.error.code == MOD_ERROR_CODE
    assert "noise-multiplier=0 refused" in reply.error.reason
    assert f"dp-required={required!r}" in reply.error.reason
    assert app.seen == []


def test_under_dp_sample_an_app_config_of_sigma_zero_is_refused(key_file):
    """The instruction's sigma is positive, but the server's train config tells the app's
    DP-SGD to use 0."""
    reply, app = _reply(key_file, _inst(dp="sample", noise_multiplier=1.0),
                        {"dp-required": "sample"}, dp="sample", **{"noise-multiplier": 0.0})
    assert reply.has_error()
    assert "train config noise-multiplier=0.0" in reply.error.reason
    assert "dp-required='sample'" in reply.error.reason
    assert app.seen == []


def test_a_positive_sigma_is_released_noised(key_file):
    reply, _ = _reply(key_file, _inst(dp="partition", noise_multiplier=0.5, clip_norm=1.0),
                      {"dp-required": "partition"})
    coded = _coded(reply)
    clipped = _raw(1) * min(1.0, 1.0 / np.linalg.norm(_raw(1)))
    assert np.linalg.norm(coded - clipped) > 0.1


def test_an_app_checking_its_own_config_refuses_sigma_zero_under_dp_required_sample():
    from fl_gradcode.flower.client_policy import NodePolicy, PolicyError

    policy = NodePolicy.from_node_config({"dp-required": "sample"})
    policy.check_app_config({"dp": "sample", "noise-multiplier": 0.3})
    for sigma in (0.0, "0", None):
        with pytest.raises(PolicyError, match=r"noise-multiplier=.* refused: this node's "
                                              r"policy is dp-required='sample'"):
            policy.check_app_config({"dp": "sample", "noise-multiplier": sigma})
