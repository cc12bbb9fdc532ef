"""``compat``'s refusals and warnings say, exactly, what a user must type or change; and the
one-time averaging check hands the inner strategy the synthetic replies its definition names.

Expected texts are the guidance a person needs (names to type, the strategy's class, the
exception type and text), checked case-sensitively; expected numbers come from the definition
(four replies, the last one ten times as far off, one reply holding their example-weighted
average computed here with numpy), never from ``compat``'s own code path.
"""

from __future__ import annotations

import logging
from typing import ClassVar

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict
from flwr.server.strategy import FedAvg as LegacyFedAvg
from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping, FedAvg

from fl_gradcode.flower import GradientCoding, compat
from fl_gradcode.flower.compat import CompositionError, ReplyFingerprints, explain_error_reply
from fl_gradcode.flower.mod import MOD_ERROR_CODE
from fl_gradcode.flower.testing import InProcessGrid, set_task_identity
from tests.apps.numpy_app import (
    LR,
    initial_arrays,
    make_app,
    pytestmark,  # noqa: F401 (the warning filter applies here)
)
from tests.doubles import CheckpointingFedAvg, MedianFedAvg, MomentumInPlace

_RECIPES_HEAD = "Use one of the recipes that compose with coding: (1) this library's DP, "
_VERIFY = ("For robustness to faulty or malicious clients use the coded alternative: "
           "GradientCoding(FedAvg(...), code=..., s=..., verify=True)")


def _sent(node: int, mid: str) -> Message:
    """A message the server sent to ``node`` (its id set as the grid would)."""
    set_task_identity()
    msg = Message(RecordDict(), dst_node_id=node, message_type="train")
    msg.metadata.__dict__["_message_id"] = mid
    return msg


def _reply(node: int, mid: str, content: RecordDict | None = None) -> Message:
    sent = _sent(node, f"to-{mid}")
    reply = Message(content if content is not None else RecordDict({
        "arrays": ArrayRecord({"w": Array(np.arange(3.0))}),
        "metrics": MetricRecord({"num-examples": 2.0})}), reply_to=sent)
    reply.metadata.__dict__["_message_id"] = mid
    return reply


# ================================================================ Flower's DP wrapper bases
# (both bases found: every Flower DP wrapper is refused inside and outside GradientCoding,
# tests/flower/test_composition.py::test_flower_dp_wrapper_*_gradient_coding_is_refused*)
_WITHOUT_FIXED_CLIPPING = """
import importlib
real = importlib.import_module
def without_fixed(name, *args, **kwargs):
    if name == "flwr.serverapp.strategy.dp_fixed_clipping":
        raise ImportError(name)
    return real(name, *args, **kwargs)
importlib.import_module = without_fixed
from flwr.serverapp.strategy import (
    DifferentialPrivacyServerSideAdaptiveClipping, DifferentialPrivacyServerSideFixedClipping,
    FedAvg,
)
from fl_gradcode.flower import GradientCoding
adaptive = DifferentialPrivacyServerSideAdaptiveClipping(
    FedAvg(), noise_multiplier=1.0, num_sampled_clients=4, initial_clipping_norm=1.0,
    clipped_count_stddev=1.0)
try:
    GradientCoding(adaptive, code="frc", s=1)
except TypeError as e:
    print("adaptive refused:", "would clip the decoded average once" in str(e))
fixed = DifferentialPrivacyServerSideFixedClipping(FedAvg(), noise_multiplier=1.0,
                                                   clipping_norm=1.0, num_sampled_clients=4)
GradientCoding(fixed, code="frc", s=1)
print("fixed accepted")
"""


def test_a_flower_lacking_the_fixed_clipping_module_still_has_its_adaptive_wrappers_refused():
    """Another Flower version whose fixed-clipping module cannot be imported by name (run in
    a fresh interpreter, so the package looks for the bases then): the adaptive DP wrapper
    is still refused inside GradientCoding, and the unrecognised fixed one is not (what
    this Flower would allow)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _WITHOUT_FIXED_CLIPPING], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines()[-2:] == ["adaptive refused: True", "fixed accepted"]


# ================================================================ refusals at construction
class MyLegacy(LegacyFedAvg):
    """A user's legacy strategy: no Message-API strategy of the same name exists."""


@pytest.mark.parametrize("case", ["legacy FedAvg", "legacy subclass", "not a strategy"])
def test_refused_inner_strategy_is_named_by_module_and_class_with_what_to_use(case):
    inner = {"legacy FedAvg": LegacyFedAvg(), "legacy subclass": MyLegacy(),
             "not a strategy": 42}[case]
    full = f"{type(inner).__module__}.{type(inner).__qualname__}"
    with pytest.raises(TypeError) as info:
        GradientCoding(inner)
    text = str(info.value)
    if case == "not a strategy":
        assert text == ("strategy must be a flwr.serverapp.strategy.Strategy (e.g. "
                        "flwr.serverapp.strategy.FedAvg(...)); got builtins.int")
        return
    assert text.startswith(f"strategy={full} is a legacy flwr.server.strategy strategy; "
                           "GradientCoding wraps Message-API strategies: use ")
    use = ("flwr.serverapp.strategy.FedAvg. " if case == "legacy FedAvg" else
           "a flwr.serverapp.strategy.Strategy (e.g. flwr.serverapp.strategy.FedAvg). ")
    assert f"Message-API strategies: use {use}GradientCoding is a Message-API strategy" in text


def test_inner_start_override_warning_says_where_its_hooks_belong(flwr_log):
    GradientCoding(CheckpointingFedAvg(), code="frc", s=1)
    assert (logging.WARNING,
            "CheckpointingFedAvg overrides start(); under GradientCoding it does not run "
            "(GradientCoding.start runs Flower's Strategy.start loop with the coded rounds): "
            "its own hooks (checkpoints, result files, experiment tracking) are skipped. Put "
            "them in an evaluate_fn passed to GradientCoding.start, or in the ServerApp after "
            "start returns.") in flwr_log


def test_outer_dp_wrapper_refusal_explains_why_and_gives_the_recipes():
    coded = GradientCoding(FedAvg(fraction_evaluate=0.0), code="frc", s=1,
                           measured_compute=False)
    outer = DifferentialPrivacyServerSideFixedClipping(coded, noise_multiplier=1.0,
                                                       clipping_norm=1.0, num_sampled_clients=2)
    grid = coded.wrap_grid(InProcessGrid(make_app(), 2))
    with pytest.raises(CompositionError) as info:
        outer.configure_train(1, initial_arrays(), ConfigRecord({"lr": LR}), grid)
    assert str(info.value).startswith(
        "DifferentialPrivacyServerSideFixedClipping(GradientCoding(...)) cannot be exact: an "
        "outer DP wrapper clips the coded replies (linear combinations of several partitions' "
        "updates, not updates), which the decoder never reads back, and adds noise calibrated "
        "to one client per reply to an average in which each partition has a weight "
        "n_j/sum_j n_j: no DP guarantee. " + _RECIPES_HEAD)


# ================================================================ the one-time averaging check
class RecordingFedAvg(FedAvg):
    """FedAvg reading its weight where Flower's apps put it, recording what it is given (on
    the class: the check runs on deep copies)."""

    calls: ClassVar[list[tuple[int, list[Message]]]] = []

    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        type(self).calls.append((server_round, replies))
        for reply in replies:  # as Flower's templates read it
            assert reply.content["metrics"]["num-examples"] > 0
        return super().aggregate_train(server_round, replies)


def test_averaging_check_gives_four_spread_replies_then_one_holding_their_weighted_average():
    rng = np.random.default_rng(3)
    theta = {"w": rng.uniform(-4.0, 4.0, 20_000).astype(np.float32),
             "steps": np.array([7, 8], dtype=np.int64)}
    scale = max(1.0, float(np.max(np.abs(theta["w"]))))
    assert scale > 3.0  # the spread is relative to the model's magnitude, not absolute
    RecordingFedAvg.calls = []
    compat.check_averaging(RecordingFedAvg(), 7, _sent(3, "m"), "arrays", theta, "num-examples")
    # four replies, then one holding their average (twice: a metric that differs between two
    # identical calls summarises no reply)
    (round_many, many), (round_one, (one,)), (round_again, (again,)) = RecordingFedAvg.calls
    assert round_many == round_one == round_again == 7
    assert again.content["metrics"]["num-examples"] == one.content["metrics"]["num-examples"]
    assert len(many) == 4
    weights = np.array([r.content["metrics"]["num-examples"] for r in many])
    assert len(set(weights)) == 4  # unequal weights
    arrays = [r.content["arrays"]["w"].numpy() for r in many]
    spreads = [float(np.std((a.astype(np.float64) - theta["w"]) / scale)) for a in arrays]
    np.testing.assert_allclose(spreads, [1.0, 1.0, 1.0, 10.0], rtol=0.03)  # one far-off reply
    for r in many:
        np.testing.assert_array_equal(r.content["arrays"]["steps"].numpy(), theta["steps"])
    assert one.content["metrics"]["num-examples"] == weights.sum()
    average = one.content["arrays"]["w"].numpy()
    assert average.dtype == np.float32  # the model's own dtype
    expected = sum(w * a.astype(np.float64) for w, a in zip(weights, arrays, strict=True))
    np.testing.assert_allclose(average, expected / weights.sum(), rtol=1e-6, atol=1e-5)


class Exploding(FedAvg):
    def aggregate_train(self, server_round, replies):
        raise RuntimeError("boom")


class Uncopyable(FedAvg):
    def __deepcopy__(self, memo):
        raise RuntimeError("no copies")


def test_averaging_check_failure_names_the_strategy_the_exception_and_the_reply_layout():
    with pytest.raises(ValueError) as info:
        compat.check_averaging(Exploding(), 1, _sent(3, "m"), "arrays",
                               {"w": np.zeros(3)}, "num-examples")
    assert str(info.value).startswith(
        "Exploding.aggregate_train failed on synthetic replies (RuntimeError: boom); "
        "GradientCoding hands the inner strategy ONE reply holding the decoded average, so it "
        "must aggregate replies with 'arrays' arrays and a 'num-examples' weight. " + _VERIFY)


def test_averaging_check_refusal_of_a_per_client_aggregator_names_it_and_what_composes():
    with pytest.raises(ValueError) as info:
        compat.check_averaging(MedianFedAvg(), 1, _sent(3, "m"), "arrays",
                               {"w": np.zeros(50)}, "num-examples")
    assert str(info.value).startswith(
        "MedianFedAvg.aggregate_train does not depend on the replies only through their "
        "example-weighted average (on four replies it returns another model than on one reply "
        "holding their weighted average): it aggregates individual replies, which coding never "
        "delivers (the inner strategy receives ONE decoded reply). Server optimizers on the "
        "average (FedAvgM, FedAdam, FedYogi, FedAdagrad) compose; robust or per-client "
        "aggregators do not. " + _VERIFY)


def test_averaging_check_on_an_uncopyable_strategy_warns_with_the_reason(flwr_log):
    compat.check_averaging(Uncopyable(), 1, _sent(3, "m"), "arrays", {"w": np.zeros(3)},
                           "num-examples")
    assert (logging.WARNING,
            "could not check that Uncopyable's aggregation depends only on the weighted "
            "average of the replies (it cannot be copied: no copies); coding hands it one "
            "decoded reply, which is exact only if it does") in flwr_log


def test_averaging_check_leaves_state_the_inner_strategy_changes_in_place_untouched():
    """The check runs on copies of the user's strategy (its own state untouched): a buffer or
    list that ``aggregate_train`` changes in place is the user's before and after the check."""
    theta = {"w": np.arange(-3.0, 3.0)}
    inner = MomentumInPlace(theta)
    velocity, rounds = inner.velocity["w"], inner.rounds
    compat.check_averaging(inner, 4, _sent(3, "m"), "arrays", theta, "num-examples")  # passes
    assert inner.rounds == [] and inner.rounds is rounds
    assert inner.velocity["w"] is velocity
    np.testing.assert_array_equal(velocity, np.zeros(6))


# ================================================================ ReplyFingerprints
def test_a_reply_whose_array_record_moved_to_another_key_counts_as_modified():
    fingerprints = ReplyFingerprints()
    reply = _reply(5, "r5")
    fingerprints.record(1, reply)
    record = reply.content["arrays"]
    del reply.content["arrays"]
    reply.content["renamed"] = record  # the same ArrayRecord object under another key
    with pytest.raises(CompositionError, match=r"^round 1: the reply from node 5 was modified "
                       r"after GradientCoding cached it \(by a strategy wrapping it, e\.g\. in "
                       r"its aggregate_train\)"):
        fingerprints.check(1, [reply], None)


def _interleaved() -> RecordDict:
    """Array, metric and config records interleaved: every record of each type is watched."""
    return RecordDict({
        "cfg": ConfigRecord({"x": 1}),
        "a1": ArrayRecord({"w": Array(np.arange(3.0)), "v": Array(np.ones(2))}),
        "m1": MetricRecord({"num-examples": 2.0}),
        "cfg2": ConfigRecord({"y": "z"}),
        "a2": ArrayRecord({"u": Array(np.zeros(4))}),
        "m2": MetricRecord({"loss": 0.5, "acc": 0.25}),
    })


def _swap_data(content):
    content["a2"]["u"].data = bytes(bytearray(content["a2"]["u"].data))  # equal, another object


MODIFICATIONS = {
    "first array replaced": lambda c: c["a1"].__setitem__("w", Array(np.arange(3.0))),
    "last array's data swapped": _swap_data,
    "second array record replaced": lambda c: c.__setitem__(
        "a2", ArrayRecord({"u": Array(np.zeros(4))})),
    "array added to the second record": lambda c: c["a2"].__setitem__("t", Array(np.ones(1))),
    "second metric changed": lambda c: c["m2"].__setitem__("acc", 0.5),
    "second metric record replaced": lambda c: c.__setitem__(
        "m2", MetricRecord({"loss": 0.5, "acc": 0.25})),
    "metric record removed": lambda c: c.__delitem__("m1"),
    "array record added": lambda c: c.__setitem__("a3", ArrayRecord({"q": Array(np.ones(1))})),
}


@pytest.mark.parametrize("case", sorted(MODIFICATIONS))
def test_every_record_of_an_interleaved_reply_is_watched(case):
    fingerprints = ReplyFingerprints()
    reply = _reply(4, "r4", _interleaved())
    before = list(reply.content.items())
    fingerprints.record(3, reply)
    assert list(reply.content.items()) == before  # recording leaves the content alone
    fingerprints.check(3, [reply], None)  # unmodified: passes
    MODIFICATIONS[case](reply.content)
    with pytest.raises(CompositionError, match=r"^round 3: the reply from node 4 was modified"):
        fingerprints.check(3, [reply], None)


def test_config_records_of_a_reply_are_not_watched():
    fingerprints = ReplyFingerprints()
    reply = _reply(4, "r4", _interleaved())
    fingerprints.record(3, reply)
    reply.content["cfg"]["x"] = 2  # the protocol's own records: not a reply's payload
    fingerprints.check(3, [reply], None)


def test_replies_removed_by_an_outer_strategy_are_listed_with_the_remedy():
    fingerprints = ReplyFingerprints()
    replies = [_reply(node, f"r{node}") for node in (3, 5, 7)]
    for reply in replies:
        fingerprints.record(2, reply)
    with pytest.raises(CompositionError) as info:
        fingerprints.check(2, replies[2:], "FilteringOuter")
    assert str(info.value) == (
        "round 2: the replies from node(s) 3, 5 were cached by GradientCoding but removed "
        "before its aggregate_train (by the outer strategy FilteringOuter): GradientCoding "
        "decodes each coded reply as it arrives, so a filter applied afterwards would be "
        "silently ignored. Only wrappers that pass replies through unchanged compose with it; "
        "to exclude faulty clients use verify=True.")


# ================================================================ error replies explained
_MOD_ORDER = ("{mod} rejected the coded message before gradient_coding_mod saw it. Mods listed "
              "before gradient_coding_mod wrap it and see the coded protocol messages, not the "
              "app's: put gradient_coding_mod first, e.g. ClientApp(mods=[gradient_coding_mod, "
              "{name}]) (each partition's update then passes through the mod before coding)")
EXPLAINED = {
    "secagg": (0, "ValueError: secaggplus_mod needs SecAggPlusWorkflow's stages",
               ": secaggplus_mod (or secagg_mod) runs only under Flower's SecAggPlusWorkflow, "
               "which cannot run coded rounds (decoding needs each coded reply; SecAgg+ reveals "
               "only their sum, which is not a decodable set): remove it from the ClientApp's "
               "mods, and for privacy use this library's dp=DPConfig(mode='partition' | "
               "'central', ...)"),
    "named mod, any code": (0, "RuntimeError: message_size_mod found no app message",
                            ": " + _MOD_ORDER.format(mod="message_size_mod",
                                                     name="message_size_mod")),
    "unnamed mod, code 6": (6, "RuntimeError: a precondition failed",
                            ": " + _MOD_ORDER.format(mod="a client mod", name="your_mod")),
    "not from the mod": (0, "KeyError: 'arrays'",
                         ": this error did not come from gradient_coding_mod (its errors have "
                         f"code {MOD_ERROR_CODE}). Either a client mod listed BEFORE "
                         "gradient_coding_mod failed on the coded protocol message (such mods "
                         "see the protocol's messages, e.g. the identify handshake, which "
                         "carries no 'arrays' or 'config' record): move it after, "
                         "ClientApp(mods=[gradient_coding_mod, your_mod]), or make it pass on "
                         "messages it does not understand; or the ClientApp does not run "
                         "gradient_coding_mod: add it as the first mod, "
                         "ClientApp(mods=[gradient_coding_mod, ...])"),
}


@pytest.mark.parametrize("case", list(EXPLAINED))
def test_error_replies_are_explained_with_what_to_change(case):
    code, reason, tail = EXPLAINED[case]
    reply = Message(Error(code=code, reason=reason), reply_to=_sent(4, "m"))
    assert explain_error_reply(reply) == f"error reply (code {code}: {reason})" + tail
