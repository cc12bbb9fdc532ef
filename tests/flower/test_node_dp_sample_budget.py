"""A node's ε budget (``dp-max-epsilon``) over its app's own DP-SGD (``dp='sample'``).

The server's config sets how many noisy steps the app's DP-SGD takes (local epochs, batch
size), so a noise floor alone does not bound a release's ε. The app reports each partition's
sample rate and steps in its reply metrics; the node composes them with the partition's
earlier releases and refuses a reply past its budget, before it leaves the node.

Expected ε from Opacus' own ``RDPAccountant`` given the history by hand; the app is the numpy
test app of ``test_node_dp_policy`` reporting the steps its config asks for, and the project's
ClientApp."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from flwr.app import Message, MetricRecord
from hypothesis import given, settings
from hypothesis import strategies as st

from fl_gradcode.flower.mod import MOD_ERROR_CODE, make_gradient_coding_mod
from fl_gradcode.privacy import SAMPLE_RATE_METRIC, STEPS_METRIC, sgm_epsilon
from tests.flower.test_node_dp_policy import (
    NoisyApp,
    _context,
    _inst,
    _logreg_message,
    _message,
)

SIGMA = 1.5
BATCHES = 4  # the test app's partitions: 4 batches an epoch, sample rate 1/4


def _opacus_epsilon(history, delta=1e-5) -> float:
    from opacus.accountants import RDPAccountant

    acc = RDPAccountant()
    acc.history = list(history)
    return acc.get_epsilon(delta=delta)


class ReportingApp(NoisyApp):
    """The numpy app, reporting the DP-SGD its config asks for: ``local-epochs`` epochs of
    ``BATCHES`` Poisson batches (or what ``report`` says instead)."""

    def __init__(self, report=None) -> None:
        super().__init__()
        self.report = report

    def __call__(self, msg: Message, context) -> Message:
        reply = super().__call__(msg, context)
        epochs = int(dict(msg.content["config"]).get("local-epochs", 1))
        report = self.report if self.report is not None else {
            SAMPLE_RATE_METRIC: 1.0 / BATCHES, STEPS_METRIC: epochs * BATCHES}
        reply.content["metrics"] = MetricRecord({**dict(reply.content["metrics"]), **report})
        return reply


def _ask(mod, app, state, rnd, key_file, pids=(1,), dp="sample", nonce="n", **config):
    inst = _inst(round=rnd, nonce=nonce, dp=dp, noise_multiplier=SIGMA, clip_norm=1.0,
                 partition_ids=pids, num_partitions=(3,) * len(pids),
                 coefficients=(1.0,) * len(pids))
    node = {"dp-key-file": key_file, "dp-state-file": str(state)}
    node.update(config.pop("node", {}))
    return mod(_message(inst, **config), _context(**node), app)


def _ledger(state) -> list[dict]:
    return [json.loads(line) for line in state.read_text().splitlines()]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.floats(0.5, 4.0), st.sampled_from([1.0, 0.5, 0.1, 0.01]),
                          st.integers(0, 300)), min_size=1, max_size=4))
def test_sgm_epsilon_is_opacus_rdp_accountants(history):
    expected = _opacus_epsilon(history) if any(k for *_, k in history) else 0.0
    assert sgm_epsilon(history, 1e-5) == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_a_dp_sample_release_is_accounted_from_the_steps_the_app_reports(tmp_path, key_file):
    """ε budget and DP-SGD used to be exclusive: dp-max-epsilon refused every dp='sample'
    release. Now the first is accounted as its DP-SGD ran, and the server asking for more
    epochs (more noisy steps) cannot spend past the budget."""
    state = tmp_path / "node.jsonl"
    one = (SIGMA, 1.0 / BATCHES, BATCHES)
    limit = (_opacus_epsilon([one]) + _opacus_epsilon([(SIGMA, 1.0 / BATCHES, 2 * BATCHES)])) / 2
    mod, app = make_gradient_coding_mod(), ReportingApp()
    node = {"dp-max-epsilon": limit}
    first = _ask(mod, app, state, 1, key_file, node=node, **{"local-epochs": 1})
    assert not first.has_error(), first.error.reason
    (entry,) = _ledger(state)
    assert entry["dp"] == "sample" and entry["sample"] == {"1": [0.25, BATCHES]}
    assert entry["epsilon"]["1"] == pytest.approx(_opacus_epsilon([one]))
    # the server asks for 20 epochs: 80 noisy steps, far past the budget
    greedy = _ask(mod, app, state, 2, key_file, node=node, **{"local-epochs": 20})
    assert greedy.has_error() and greedy.error.code == MOD_ERROR_CODE
    assert f"dp-max-epsilon={limit:g}" in greedy.error.reason
    assert "partition 1" in greedy.error.reason
    assert [e["round"] for e in _ledger(state)] == [1]  # nothing released, nothing recorded
    # one more epoch would bring it to the ε of 2 epochs, over the limit; another partition
    # has its own budget
    assert _ask(mod, app, state, 3, key_file, node=node, **{"local-epochs": 1}).has_error()
    other = _ask(mod, app, state, 4, key_file, pids=(2,), node=node, **{"local-epochs": 1})
    assert not other.has_error(), other.error.reason


def test_partition_and_sample_releases_of_a_partition_compose(tmp_path, key_file):
    state = tmp_path / "node.jsonl"
    mod, app = make_gradient_coding_mod(), ReportingApp()
    assert not _ask(mod, app, state, 1, key_file, dp="partition").has_error()
    assert not _ask(mod, app, state, 2, key_file, **{"local-epochs": 3}).has_error()
    assert not _ask(mod, app, state, 3, key_file, dp="partition").has_error()
    expected = _opacus_epsilon([(SIGMA, 1.0, 1), (SIGMA, 0.25, 3 * BATCHES), (SIGMA, 1.0, 1)])
    assert _ledger(state)[-1]["epsilon"]["1"] == pytest.approx(expected)


@pytest.mark.parametrize(("report", "words"), [
    ({}, f"reported no {SAMPLE_RATE_METRIC}"),
    ({SAMPLE_RATE_METRIC: 2.0, STEPS_METRIC: 4}, f"{SAMPLE_RATE_METRIC}=2.0"),
    ({SAMPLE_RATE_METRIC: 0.5, STEPS_METRIC: 2.5}, f"{STEPS_METRIC}=2.5"),
])
def test_an_app_that_does_not_say_what_it_ran_is_refused_under_the_budget(
        tmp_path, key_file, report, words):
    state = tmp_path / "node.jsonl"
    reply = _ask(make_gradient_coding_mod(), ReportingApp(report), state, 1, key_file,
                 node={"dp-max-epsilon": 10.0})
    assert reply.has_error() and words in reply.error.reason
    assert _ledger(state) == []  # refused before the reply left: not a release


def test_unaccounted_sample_releases_count_as_infinite_once_a_budget_is_set(tmp_path,
                                                                          key_file):
    """A node without ε budget records a dp='sample' release of an app that reports nothing;
    the same node given dp-max-epsilon later cannot pretend it was free."""
    state = tmp_path / "node.jsonl"
    first = _ask(make_gradient_coding_mod(), ReportingApp({}), state, 1, key_file)
    assert not first.has_error(), first.error.reason
    assert _ledger(state)[0]["sample"] is None
    later = _ask(make_gradient_coding_mod(), ReportingApp(), state, 2, key_file,
                 node={"dp-max-epsilon": 100.0})
    assert later.has_error() and "dp-max-epsilon=100" in later.error.reason


def test_the_project_client_app_reports_its_dp_sgd_and_is_accounted(tmp_path, key_file):
    """clients/app.py under update='local': local-epochs of ceil(n / batch-size) Poisson
    batches of partition 1 of 3 (the main job's digits split), as the ledger records it."""
    from clients.app import client_config
    from fl_gradcode.data import run_partitions

    state = tmp_path / "node.jsonl"
    inst = _inst(dp="sample", noise_multiplier=SIGMA, clip_norm=1.0)
    config = {"update": "local", "local-epochs": 2, "batch-size": 64}
    msg, _, _ = _logreg_message(inst, **config)
    ctx = _context(**{"dp-key-file": key_file, "dp-state-file": str(state),
                      "dp-max-epsilon": 1e6, "partition-id": 1})
    cfg = client_config(ctx, msg)
    size = len(run_partitions(cfg, 3)[1][1])
    batches = math.ceil(size / 64)
    from clients.app import train

    reply = make_gradient_coding_mod()(msg, ctx, train)
    assert not reply.has_error(), reply.error.reason
    (entry,) = _ledger(state)
    assert entry["sample"] == {"1": [pytest.approx(1 / batches), 2 * batches]}
    assert entry["epsilon"]["1"] == pytest.approx(
        _opacus_epsilon([(SIGMA, 1 / batches, 2 * batches)]))
    assert np.isfinite(entry["epsilon"]["1"])


def test_without_a_state_file_the_process_ledger_accounts_dp_sgd_too(key_file):
    one = (SIGMA, 1.0 / BATCHES, BATCHES)
    limit = (_opacus_epsilon([one]) + _opacus_epsilon([(SIGMA, 1.0 / BATCHES, 2 * BATCHES)])) / 2
    mod, app = make_gradient_coding_mod(), ReportingApp()

    def ask(rnd, epochs):
        inst = _inst(round=rnd, nonce="m", dp="sample", noise_multiplier=SIGMA, clip_norm=1.0)
        node = {"dp-key-file": key_file, "dp-max-epsilon": limit}
        return mod(_message(inst, **{"local-epochs": epochs}), _context(**node), app)

    with pytest.warns(UserWarning, match="ledger"):
        assert not ask(1, 1).has_error()
    refused = ask(2, 1)  # a second epoch's worth: over the budget
    assert refused.has_error() and "in this process only" in refused.error.reason


def test_many_full_batch_steps_are_accounted_as_opacus_does_without_a_list_per_step():
    """At sample rate 1 the steps were expanded into one entry each: an app reporting 1e9
    steps exhausted the node's memory. k Gaussian steps at noise s compose as one at
    s / sqrt(k) (RDP); the ε is Opacus' for the same history."""
    for history in ([(1.5, 1.0, 10**9)], [(2.0, 1.0, 3), (0.8, 1.0, 5)]):
        assert sgm_epsilon(history, 1e-5) == pytest.approx(_opacus_epsilon(history), rel=1e-9)
