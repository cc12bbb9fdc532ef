"""Client mods before / after ``gradient_coding_mod`` and Flower's client-side DP wrapper.

* A mod listed before ``gradient_coding_mod`` that fails on the protocol's handshake (as the
  TensorBoard mod of Flower's examples/custom-mods does: it reads ``msg.content["config"]``) is
  named, with the fix, in the handshake warning.
* A mod listed after it is warned about once, by name (it runs once per partition).
* ``DifferentialPrivacyClientSideFixedClipping`` inside ``GradientCoding`` with
  ``fixedclipping_mod`` inside ``gradient_coding_mod`` equals Flower's own uncoded run of the
  same wrapper and mod (same seeded noise); outside, it is refused with its own reason.
"""

from __future__ import annotations

import logging
import traceback
import warnings

import numpy as np
import pytest
from flwr.app import ConfigRecord, Error, Message
from flwr.clientapp.mod import fixedclipping_mod
from flwr.serverapp.strategy import DifferentialPrivacyClientSideFixedClipping, FedAvg

from fl_gradcode.flower import GradientCoding, gradient_coding_mod
from fl_gradcode.flower.compat import CompositionError
from fl_gradcode.flower.testing import InProcessGrid
from tests.apps.numpy_app import LR, as_dict, flat, initial_arrays, make_app
from tests.flower.harness import run

pytestmark = [
    pytest.mark.filterwarnings("ignore:gradient_coding_mod. no partition key:UserWarning"),
]


def tensorboard_mod(msg, context, app):
    """Flower's examples/custom-mods TensorBoard mod, without TensorBoard: it reads the
    train config's server round before calling the app, and logs after."""
    server_round = msg.content["config"]["server-round"]
    reply = app(msg, context)
    tensorboard_mod.logged.append((context.node_id, server_round))
    return reply


tensorboard_mod.logged = []


def ray_engine(app):
    """``app`` run the way Flower's simulation engine runs it under Ray: an exception becomes
    the error reply ``str(type(ex)) + ":<'" + str(ex) + "'>"`` of the actor's RayTaskError."""
    from flwr.clientapp.client_app import ClientAppException
    from ray.exceptions import RayTaskError

    def engine(msg, context):
        try:
            try:
                return app(msg, context)
            except Exception as ex:
                raise ClientAppException(str(ex)) from ex
        except ClientAppException as ex:
            err = RayTaskError("run", traceback.format_exc(), ex,
                               proctitle="ray::ClientAppActor.run", pid=1, ip="127.0.0.1")
            err = err.as_instanceof_cause()
            return Message(Error(code=2, reason=str(type(err)) + ":<'" + str(err) + "'>"),
                           reply_to=msg)

    return engine


def _handshake_warning(grid, caplog) -> str:
    with caplog.at_level(logging.WARNING, logger="flwr"):
        out = run(4, code="frc", s=1, grid=grid)
    assert out.rows[0]["unidentified"]  # nobody passed the handshake
    (text,) = [r.getMessage() for r in caplog.records
               if "did not pass the gradient-coding handshake" in r.getMessage()]
    return text


def test_a_mod_before_gradient_coding_mod_raising_on_the_handshake_is_named_with_the_fix(caplog):
    pytest.importorskip("ray")
    grid = InProcessGrid(ray_engine(make_app(tensorboard_mod, gradient_coding_mod)), 4)
    text = _handshake_warning(grid, caplog)
    assert "KeyError: 'config'" in text
    assert "tensorboard_mod (a client mod listed before gradient_coding_mod)" in text
    assert "ClientApp(mods=[gradient_coding_mod, tensorboard_mod])" in text
    assert "as its FIRST mod" in text  # the hint points at the mod order too


def test_without_a_traceback_the_hint_still_gives_the_mod_order_fix_in_full(caplog):
    grid = InProcessGrid(make_app(tensorboard_mod, gradient_coding_mod), 4)
    text = _handshake_warning(grid, caplog)
    assert "a client mod listed BEFORE gradient_coding_mod failed" in text
    assert "ClientApp(mods=[gradient_coding_mod, your_mod])" in text
    # the explanation is not cut: it ends with the other cause's fix
    assert ("or the ClientApp does not run gradient_coding_mod: add it as the first mod, "
            "ClientApp(mods=[gradient_coding_mod, ...])") in text


def test_a_mod_after_gradient_coding_mod_is_warned_about_once_by_name():
    def timing_logger_mod(msg, context, app):
        return app(msg, context)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = run(4, code="frc", s=1, rounds=2,
                  grid=InProcessGrid(make_app(gradient_coding_mod, timing_logger_mod), 4))
    assert [r["decode"] for r in out.rows] == ["exact", "exact"]
    named = [w for w in caught if "timing_logger_mod is listed after gradient_coding_mod"
             in str(w.message)]
    assert len(named) == 1
    assert "once per partition" in str(named[0].message)
    assert not any("fixedclipping_mod is listed" in str(w.message) for w in caught)


# ============================================================ Flower's client-side DP wrapper
N, CLIP, SIGMA = 4, 0.5, 0.3


def _client_side(inner):
    return DifferentialPrivacyClientSideFixedClipping(inner, noise_multiplier=SIGMA,
                                                      clipping_norm=CLIP, num_sampled_clients=N)


@pytest.fixture
def global_numpy_rng():
    """numpy's legacy global generator (Flower's DP wrappers draw their noise from it),
    restored after the test."""
    state = np.random.get_state()  # noqa: NPY002
    yield lambda seed: np.random.seed(seed)  # noqa: NPY002
    np.random.set_state(state)  # noqa: NPY002


def test_flower_client_side_fixed_clipping_inside_equals_flowers_uncoded_run(global_numpy_rng,
                                                                            caplog):
    global_numpy_rng(11)
    grid = InProcessGrid(make_app(fixedclipping_mod), N)
    uncoded = _client_side(FedAvg(fraction_evaluate=0.0)).start(
        grid=grid, initial_arrays=initial_arrays(), num_rounds=2,
        train_config=ConfigRecord({"lr": LR}))
    global_numpy_rng(11)
    coded = GradientCoding(_client_side(FedAvg(fraction_evaluate=0.0)), code="frc", s=1,
                           seed=0, measured_compute=False)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="flwr"):
        result = coded.start(
            grid=InProcessGrid(make_app(gradient_coding_mod, fixedclipping_mod), N),
            initial_arrays=initial_arrays(), num_rounds=2,
            train_config=ConfigRecord({"lr": LR}))
    # its noise was added in both rounds, and no false "1 client returned parameters" warning
    lines = [r.getMessage() for r in caplog.records]
    assert sum("central DP noise with" in m for m in lines) == 2
    assert not any("number of clients returning parameters" in m for m in lines)
    assert [r["decode"] for r in coded.history] == ["exact", "exact"]
    np.testing.assert_allclose(flat(as_dict(result.arrays)), flat(as_dict(uncoded.arrays)),
                               rtol=1e-7, atol=1e-9)
    # the noise was added (a run without it differs)
    global_numpy_rng(11)
    plain = FedAvg(fraction_evaluate=0.0).start(
        grid=InProcessGrid(make_app(fixedclipping_mod), N), initial_arrays=initial_arrays(),
        num_rounds=2, train_config=ConfigRecord({"lr": LR, "clipping_norm": CLIP}))
    assert np.abs(flat(as_dict(plain.arrays)) - flat(as_dict(result.arrays))).max() > 1e-3


def test_flower_client_side_fixed_clipping_outside_is_refused_with_its_own_reason():
    coded = GradientCoding(FedAvg(fraction_evaluate=0.0), code="frc", s=1,
                           measured_compute=False)
    outer = _client_side(coded)
    grid = InProcessGrid(make_app(gradient_coding_mod, fixedclipping_mod), N)
    with pytest.raises(CompositionError, match="skips aggregation for the whole round") as info:
        outer.start(grid=coded.wrap_grid(grid), initial_arrays=initial_arrays(), num_rounds=1,
                    train_config=ConfigRecord({"lr": LR}))
    text = str(info.value)
    assert "clips the coded replies" not in text and "no DP guarantee" not in text
    assert "exact INSIDE" in text
