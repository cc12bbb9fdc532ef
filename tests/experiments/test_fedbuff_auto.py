"""``--methods fedbuff-auto``: the main job's asynchronous ``s='auto'`` (s = 1 with the
replication rule of the ``AUTO_*`` constants: since amendment 32 the class reading, FedBuff
until a class is never learnt while the median is, then the least-served held partition) run
by the one benchmark command, on FedBuff's settings as the cell tunes or gives them."""

from __future__ import annotations

import math

import pytest

from experiments import compare


def _grid():
    grid = compare.load_grid()
    return {**grid, "rules": {**grid["rules"], "fedbuff_tune_server_lr": [1.0],
                              "fedbuff_tune_buffer_fraction": [0.5],
                              "fedbuff_tune_extend": 0}}


def test_it_runs_the_main_jobs_auto_rule_on_fedbuffs_tuned_settings():
    from fl_gradcode.flower.asynchronous import auto_keywords

    with compare.harness_environment():
        cell = compare.run_cell(_grid(), "digits-logreg", "persistent", 6, 6, 4, [10, 11], [0],
                                ["fedbuff", "fedbuff-auto"], 0.5, log=lambda _: None)
    mine = [r for r in cell["runs"] if r["method"] == "fedbuff-auto"]
    assert [r["seed"] for r in mine] == [10, 11]
    rule = {k: (None if v == math.inf else v) for k, v in auto_keywords().items()}
    for run in mine:  # the rule the main job's s='auto' runs, as its record says
        assert run["auto_rule"] == rule and run["s"] == rule["s"]
        assert len(run["updates_per_partition"]) == 6
    # on FedBuff's settings as tuned: the same server steps of the same K
    fedbuff = [r for r in cell["runs"] if r["method"] == "fedbuff"]
    assert [r["rounds"] for r in mine] == [r["rounds"] for r in fedbuff]
    assert cell["settings"]["fedbuff"]["tuning"]["chosen"] == {"server_lr": 1.0,
                                                               "buffer_fraction": 0.5}


def test_it_is_the_class_reading_on_fedbuffs_settings():
    """What amendment 32 says s='auto' runs, as a user can observe it: the same runs as
    ``fedbuff-replicated`` with s = 1, the bar 0 and the class reading at 0.9, FedBuff's
    settings as tuned; where no class is missing (digits, 6 clients) it is FedBuff's run."""
    import dataclasses

    from experiments.rival_runs import run_replicated

    with compare.harness_environment():
        cell = compare.run_cell(_grid(), "digits-logreg", "persistent", 6, 6, 4, [10], [0],
                                ["fedbuff", "fedbuff-auto"], 0.5, log=lambda _: None)
        built = compare.grid_cell(_grid(), "digits-logreg", "persistent", 6, 6, 4, 0.5, None)
        tuned = dataclasses.replace(built, fedbuff_server_lr=1.0, fedbuff_buffer_fraction=0.5)
        by_hand = run_replicated(1, 10, tuned, replicate_below=0.0, lag_level=0.9)
    mine = next(r for r in cell["runs"] if r["method"] == "fedbuff-auto")
    fedbuff = next(r for r in cell["runs"] if r["method"] == "fedbuff")
    assert mine["time_to_target"] == by_hand["time_to_target"]
    assert mine["updates_per_partition"] == by_hand["updates_per_partition"]
    assert mine["lagged_at"] == by_hand["lagged_at"]
    # no class is missing, so it never switched: FedBuff's run
    assert mine["lagged_at"] is None and mine["replicated"] == 0
    assert mine["time_to_target"] == fedbuff["time_to_target"]
    assert mine["auto_rule"] == {"s": 1, "replicate_below": 0.0, "replicate_margin": 0.0,
                                 "need_ratio": None, "need_latch": False,
                                 "need_reference": "own", "need_prior": False,
                                 "lag_level": 0.9}


def test_under_dp_it_is_refused_by_name():
    with pytest.raises(ValueError, match="fedbuff-auto cannot run with dp="):
        compare.run_cell(compare.load_grid(), "digits-logreg", "persistent", 6, 6, 4, [10],
                         [0], ["fedbuff-auto"], 0.5, {"dp": "partition"}, log=lambda _: None)
