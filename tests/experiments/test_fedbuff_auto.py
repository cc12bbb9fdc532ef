"""``--methods fedbuff-auto``: the main job's asynchronous ``s='auto'`` (s = 1 and the online
replication rule of the ``AUTO_*`` constants) run by the one benchmark command, on FedBuff's
settings as the cell tunes or gives them."""

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
    from fl_gradcode.flower.asynchronous import (
        AUTO_NEED_LATCH,
        AUTO_NEED_RATIO,
        AUTO_REPLICATE_BELOW,
        AUTO_S,
    )

    with compare.harness_environment():
        cell = compare.run_cell(_grid(), "digits-logreg", "persistent", 6, 6, 4, [10, 11], [0],
                                ["fedbuff", "fedbuff-auto"], 0.5, log=lambda _: None)
    mine = [r for r in cell["runs"] if r["method"] == "fedbuff-auto"]
    assert [r["seed"] for r in mine] == [10, 11]
    for run in mine:  # the rule the main job's s='auto' runs, as its record says
        assert run["s"] == AUTO_S  # a bar of 1 (the least served) is not recorded
        assert run.get("replicate_below", 1.0) == AUTO_REPLICATE_BELOW
        assert run.get("need_ratio", math.inf) == AUTO_NEED_RATIO
        assert run.get("need_latch", False) == AUTO_NEED_LATCH
        assert len(run["updates_per_partition"]) == 6
    # on FedBuff's settings as tuned: the same server steps of the same K
    fedbuff = [r for r in cell["runs"] if r["method"] == "fedbuff"]
    assert [r["rounds"] for r in mine] == [r["rounds"] for r in fedbuff]
    assert cell["settings"]["fedbuff"]["tuning"]["chosen"] == {"server_lr": 1.0,
                                                               "buffer_fraction": 0.5}


def test_it_is_the_replicated_run_with_the_same_rule_by_hand():
    import dataclasses

    from experiments.rival_runs import run_replicated
    from fl_gradcode.flower import asynchronous as auto

    with compare.harness_environment():
        cell = compare.run_cell(_grid(), "digits-logreg", "persistent", 6, 6, 4, [10], [0],
                                ["fedbuff-auto"], 0.5, log=lambda _: None)
        built = compare.grid_cell(_grid(), "digits-logreg", "persistent", 6, 6, 4, 0.5, None)
        tuned = dataclasses.replace(built, fedbuff_server_lr=1.0, fedbuff_buffer_fraction=0.5)
        by_hand = run_replicated(auto.AUTO_S, 10, tuned,
                                 replicate_below=auto.AUTO_REPLICATE_BELOW,
                                 replicate_margin=auto.AUTO_REPLICATE_MARGIN,
                                 need_ratio=auto.AUTO_NEED_RATIO,
                                 need_latch=auto.AUTO_NEED_LATCH,
                                 need_reference=auto.AUTO_NEED_REFERENCE,
                                 need_prior=auto.AUTO_NEED_PRIOR)
    mine = next(r for r in cell["runs"] if r["method"] == "fedbuff-auto")
    assert mine["time_to_target"] == by_hand["time_to_target"]
    assert mine["updates_per_partition"] == by_hand["updates_per_partition"]


def test_under_dp_it_is_refused_by_name():
    with pytest.raises(ValueError, match="fedbuff-auto cannot run with dp="):
        compare.run_cell(compare.load_grid(), "digits-logreg", "persistent", 6, 6, 4, [10],
                         [0], ["fedbuff-auto"], 0.5, {"dp": "partition"}, log=lambda _: None)
