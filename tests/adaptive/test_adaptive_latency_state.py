"""s="auto" through the plug-in: the latency state file (``latency_state``). A run saves its
latency observations and the next run warm-starts from them; a bad file stops the run before it
starts, an unwritable one only warns; the records of clients a sampled cohort has not met are
kept; a node that rejoins is named apart; the file records how time was measured."""

from __future__ import annotations

import json

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg

from fl_gradcode.adaptive import LatencyEstimator
from fl_gradcode.flower import GradientCoding, gradient_coding_mod
from fl_gradcode.flower.testing import InProcessGrid
from fl_gradcode.latency import Pareto, ShiftedExponential
from tests.adaptive.support import N, run
from tests.apps.vector_app import DIM, oracle, train


def test_a_saved_latency_state_warm_starts_the_next_run(tmp_path):
    """T = load * 0.1 exactly: coding only costs. A cold run starts at s_max (no
    observation); a run that reads the first run's observations starts from them."""
    path = tmp_path / "latency.json"
    deterministic = ShiftedExponential(shift=0.1, rate=1e9)
    cold, _ = run(deterministic, rounds=4, latency_state=str(path))
    assert cold.history[0]["s"] == 3 and cold.history[0]["expected_round_s"] is None
    saved = json.loads(path.read_text())
    assert len(saved["rounds"]) == 4
    assert sorted(saved["clients"]) == sorted(f"{i}/{N}" for i in range(N))
    assert all(sum(r["load"]) > 0 for r in saved["rounds"])
    warm, theta = run(deterministic, rounds=4, latency_state=str(path))
    first = warm.history[0]
    assert first["expected_round_s"] is not None and first["s"] < 3
    # the prediction made from the file is what the clock then measures, and the round is
    # far shorter than the cold run's first (s_max: four partitions per client)
    assert first["expected_round_s"] == pytest.approx(first["virtual_s"], rel=0.1)
    assert first["virtual_s"] < 0.5 * cold.history[0]["virtual_s"]
    assert all(r["decode"] == "exact" for r in warm.history)
    expected = oracle(4, N)
    assert np.linalg.norm(theta - expected) <= 1e-9 * np.linalg.norm(expected)
    assert len(json.loads(path.read_text())["rounds"]) == 8  # both runs remembered


def test_a_bad_latency_state_stops_the_run_before_it_starts_and_an_unwritable_one_does_not(
    tmp_path,
):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "something else"}')
    with pytest.raises(ValueError, match=r"bad\.json"):
        GradientCoding(FedAvg(), s="auto", latency_state=str(bad))
    bad.write_text("not json")
    with pytest.raises(ValueError, match="latency observations"):
        GradientCoding(FedAvg(), s="auto", latency_state=bad)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    strategy, _ = run(Pareto(1.0, 1.5), rounds=2, latency_state=str(blocker / "state.json"))
    assert len(strategy.history) == 2 and not (blocker / "state.json").exists()


def test_a_latency_state_without_the_estimator_is_flagged(tmp_path, caplog):
    import logging

    with caplog.at_level(logging.WARNING, logger="flwr"):
        GradientCoding(FedAvg(), s=2, latency_state=str(tmp_path / "state.json"))
    assert any("only with s='auto'" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="flwr"):
        GradientCoding(FedAvg(), s="auto", latency_state=str(tmp_path / "state.json"))
    assert not any("only with s='auto'" in r.getMessage() for r in caplog.records)


def test_a_latency_state_keeps_the_clients_a_sampled_cohort_has_not_met(tmp_path):
    """Half the nodes per round: the file's records of the others are kept (written back as
    read) for the rounds that sample them, not dropped with the first rewrite."""
    path = tmp_path / "latency.json"
    run(Pareto(1.0, 1.5), rounds=3, latency_state=str(path))
    before = json.loads(path.read_text())
    app = ClientApp(mods=[gradient_coding_mod])
    app.train()(train)
    strategy = GradientCoding(
        FedAvg(fraction_train=0.5, fraction_evaluate=0.0, min_available_nodes=N), s="auto",
        s_max=2, latency=Pareto(1.0, 1.5), seed=0, wire="float64", straggler_timeout=1e6,
        compute_cost_s=0.1, measured_compute=False, latency_state=str(path))
    strategy.start(grid=InProcessGrid(app, N), initial_arrays=ArrayRecord({"w": Array(
        np.zeros(DIM))}), num_rounds=1, train_config=ConfigRecord({}))
    after = json.loads(path.read_text())
    assert sorted(after["clients"]) == sorted(before["clients"])
    sampled = {f"{strategy.identities[node].partition_id}/{N}"
               for node in strategy.code_policy.book.node_index}
    assert len(sampled) == N // 2
    for key in set(before["clients"]) - sampled:  # unmet: the same records, as read
        i, j = before["clients"].index(key), after["clients"].index(key)
        for old, new in zip(before["rounds"], after["rounds"][:3], strict=True):
            assert [new[f][j] for f in ("time", "censored_at", "load", "busy")] == \
                [old[f][i] for f in ("time", "censored_at", "load", "busy")]
        assert after["rounds"][3]["load"][j] == 0.0  # not sampled in the new round


def test_a_latency_state_names_a_node_that_rejoins_apart_and_warns_on_a_foreign_file(
    tmp_path, caplog,
):
    import logging

    from fl_gradcode.flower.protocol import Identity

    foreign = tmp_path / "foreign.json"
    est = LatencyEstimator(1)
    est.update([1.0], [1.0], 2.0)
    foreign.write_text(json.dumps(est.export_rounds(["7/40"])))
    strategy = GradientCoding(FedAvg(), s="auto", latency_state=str(foreign))
    strategy.identities = {101: Identity(0, 2), 102: Identity(1, 2), 103: Identity(0, 2)}
    policy = strategy.code_policy
    with caplog.at_level(logging.WARNING, logger="flwr"):
        policy.estimator(2, [101, 102])
    assert any("informs nothing" in r.getMessage() for r in caplog.records)
    policy.estimator(2, [103, 102])  # partition 0 again, under a new node id
    assert policy.book.keys == ["7/40", "0/2", "1/2", "0/2#3"]
    assert policy.book.node_index == {101: 1, 102: 2, 103: 3}
    policy.save_state()
    # clients with no work in any remembered round carry no information: not written
    saved = json.loads(foreign.read_text())
    assert saved["clients"] == ["7/40"] and saved["rounds"][0]["load"] == [1.0]


def test_a_failed_latency_state_write_warns_and_leaves_no_temporary_file(
    tmp_path, caplog, monkeypatch,
):
    import logging
    import os

    def refuse(src, dst):  # the temporary file is written, the rename fails
        assert os.path.exists(src)
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", refuse)
    target = tmp_path / "state.json"
    with caplog.at_level(logging.WARNING, logger="flwr"):
        strategy, _ = run(Pareto(1.0, 1.5), rounds=2, latency_state=str(target))
    assert len(strategy.history) == 2
    assert sum("could not write latency observations" in r.getMessage()
               for r in caplog.records) == 2
    assert list(tmp_path.iterdir()) == []  # no file, no temporary file left behind


def test_a_latency_state_records_how_time_was_measured_and_flags_another_clock(
    tmp_path, caplog,
):
    import logging

    path = tmp_path / "latency.json"
    run(Pareto(1.0, 1.5), rounds=2, latency_state=str(path))
    saved = json.loads(path.read_text())
    # the run helper's clock: virtual timing, a modelled 0.1 s per partition
    assert saved["meta"] == {"timing": "virtual", "measured_compute": False,
                             "compute_cost_s": 0.1}
    with caplog.at_level(logging.WARNING, logger="flwr"):
        GradientCoding(FedAvg(), s="auto", latency_state=str(path), compute_cost_s=0.1,
                       measured_compute=False)
    assert not any("may not compare" in r.getMessage() for r in caplog.records)
    saved["meta"]["timing"] = "wallclock"
    path.write_text(json.dumps(saved))
    with caplog.at_level(logging.WARNING, logger="flwr"):
        GradientCoding(FedAvg(), s="auto", latency_state=str(path), compute_cost_s=0.1,
                       measured_compute=False)
    flagged = [r.getMessage() for r in caplog.records if "may not compare" in r.getMessage()]
    assert len(flagged) == 1 and "'timing': 'wallclock'" in flagged[0]
    path.write_text(json.dumps({**saved, "meta": []}))
    with pytest.raises(ValueError, match="meta must be an object"):
        GradientCoding(FedAvg(), s="auto", latency_state=str(path))
