"""The main job's asynchronous mode (run-config ``asynchronous=true``): the ServerApp runs
FedBuff over replicated partitions with the run config's keys, and refuses, naming it, a key
it would not honour."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fl_gradcode.config import merge_config
from fl_gradcode.flower.asynchronous import ReplicatedFedBuff

pytestmark = [
    pytest.mark.filterwarnings("ignore:gradient_coding_mod. no partition key:UserWarning"),
]

N = 6


def _grid(cfg):
    from clients.app import make_client_app
    from fl_gradcode.flower.testing import InProcessGrid

    return InProcessGrid(make_client_app(), N, run_config=cfg)


def _config(tmp_path, **overrides):
    return merge_config({"results-dir": str(tmp_path / "run"), "asynchronous": True, "s": 1,
                         "num-rounds": 2, "num-clients": N, **overrides})


@pytest.mark.parametrize(("overrides", "named"), [
    ({"s": "auto", "replicate-below": 0.3}, "replicate-below=0.3 with s='auto'"),
    ({"replicate-below": 1.5}, "replicate-below=1.5"),
    ({"replicate-below": -0.1}, "replicate-below=-0.1"),
    ({"s": "auto", "replicate-margin": 2.0}, "replicate-margin=2.0 with s='auto'"),
    ({"replicate-margin": -1.0}, "replicate-margin=-1.0"),
    ({"replicate-margin": math.inf}, "replicate-margin=inf"),
    ({"s": "auto", "need-ratio": 1.5}, "need-ratio=1.5 with s='auto'"),
    ({"need-ratio": -1.0}, "need-ratio=-1.0"),
    ({"need-ratio": math.inf}, "need-ratio=inf"),
    ({"s": "auto", "need-latch": True}, "need-latch=True with s='auto'"),
    ({"need-latch": True}, "need-latch=True without need-ratio"),
    ({"s": "auto", "need-reference": "era"}, "need-reference='era' with s='auto'"),
    ({"need-reference": "era"}, "need-reference='era' without need-ratio"),
    ({"need-reference": "mine", "need-ratio": 1.5, "replicate-below": 0.25},
     "need-reference='mine': expected one of 'own', 'era', 'cohort'"),
    ({"s": "auto", "need-prior": True}, "need-prior=True with s='auto'"),
    ({"need-prior": True, "need-ratio": 1.5, "replicate-below": 0.25},
     "need-prior=True with need-reference='own'"),
    ({"need-prior": True, "need-ratio": 1.5, "replicate-below": 0.25, "need-reference": "era"},
     "need-prior=True with need-reference='era'"),
    ({"s": "auto", "lag-level": 0.5}, "lag-level=0.5 with s='auto'"),
    ({"lag-level": 1.5, "replicate-below": 0.0}, r"lag-level=1.5: expected a number in \[0, 1\]"),
    ({"lag-level": 0.9}, "lag-level=0.9 with replicate-below=1"),
    ({"s": 0, "lag-level": 0.9}, "lag-level=0.9 with s=0"),
    ({"s": 0, "replicate-margin": 1.0}, "replicate-margin=1.0 with s=0"),
    ({"s": 0, "replicate-below": 0.5}, "replicate-below=0.5 with s=0"),
    ({"need-ratio": 1.5}, "need-ratio=1.5 with replicate-below=1"),
    ({"replicate-below": 0.0, "replicate-margin": 2.0}, "replicate-margin=2.0 with "
     "replicate-below=0"),
    ({"dp": "partition"}, "dp='partition'"),
    ({"server-optimizer": "adam"}, "server-optimizer='adam'"),
    ({"rival": "drop-stragglers"}, "rival='drop-stragglers'"),
    ({"code": "bgc"}, "code='bgc'"),
    ({"straggler-timeout": 3.0}, "straggler-timeout=3.0"),
    ({"verify": True}, "verify=True"),
    ({"warmup-timeout": -1.0}, "warmup-timeout=-1.0"),
    ({"buffer-size": -1}, "buffer-size=-1"),
    ({"timing": "wallclock", "latency": "none", "upload-bandwidth": 1e6},
     "upload-bandwidth=1000000.0"),
    ({"timing": "wallclock", "latency": "none", "partition-cost-s": 0.2},
     "partition-cost-s=0.2"),
    ({"timing": "wallclock", "latency": "none", "virtual-compute": "measured"},
     "virtual-compute='measured'"),
    ({"nan-workers": "7"}, r"nan-workers='7': no client \[7\] among the 6"),
    ({"slow-workers": "2", "slow-delay-s": 3.0}, "slow-delay-s=3.0"),
])
def test_a_key_it_would_not_honour_is_refused_by_name(tmp_path, overrides, named):
    from server.app import run

    cfg = _config(tmp_path, **overrides)
    with pytest.raises(ValueError, match=named):
        run(_grid(cfg), cfg)


def test_buffer_size_without_asynchronous_is_refused(tmp_path):
    from server.app import run

    cfg = _config(tmp_path, **{"asynchronous": False, "s": "auto", "buffer-size": 4})
    with pytest.raises(ValueError, match="buffer-size=4 is read by asynchronous runs only"):
        run(_grid(cfg), cfg)


def test_the_run_is_replicated_fedbuff_with_the_keys_settings(tmp_path):
    """Against the class run by hand: a cohort of 4 of 6 in flight, K = ceil(4 / 4) = 1 by
    default, as many server steps as 2 rounds of 4 updates take (8), server-lr, seed,
    the latency draws and the partitions' sizes."""
    from server.app import run, run_latency, run_partition_cost, run_partitions

    cfg = _config(tmp_path, **{"fraction-train": 4 / N, "server-lr": 0.7, "seed": 3})
    built = run(_grid(cfg), cfg)
    assert len(built.history) == 8
    assert built.identify_timeout == cfg["warmup-timeout"]  # the handshake's wait
    _, index = run_partitions(cfg, N)
    by_hand = ReplicatedFedBuff(
        s=1, buffer_size=1, concurrency=4, server_lr=0.7, latency=run_latency(cfg, N),
        seed=3, partition_sizes=[len(p) for p in index], measured_compute=False,
        compute_cost_s=run_partition_cost(cfg, N))
    from server.app import model_and_evaluation

    data, _ = run_partitions(cfg, N)
    initial, evaluate_fn, train_config = model_and_evaluation(cfg, data)
    by_hand.start(_grid(cfg), initial, num_rounds=8, train_config=train_config,
                  evaluate_fn=evaluate_fn)
    keep = ("clients_used", "computed_by", "staleness", "virtual_s", "accuracy")
    assert [{k: r[k] for k in keep} for r in built.history] == [
        {k: r[k] for k in keep} for r in by_hand.history]
    model = np.load(tmp_path / "run" / "final_model.npz")
    assert all(np.all(np.isfinite(model[k])) for k in model.files)


def test_a_nan_clients_partition_enters_through_its_neighbour(tmp_path):
    from server.app import run

    cfg = _config(tmp_path, **{"nan-workers": "1", "buffer-size": 2, "num-rounds": 3,
                                 "latency": "none"})
    strategy = run(_grid(cfg), cfg)
    assert len(strategy.history) == math.ceil(3 * N / 2)
    pairs = [(p, by) for row in strategy.history
             for p, by in zip(row["clients_used"], row["computed_by"], strict=True)]
    assert all(by != 1 for _, by in pairs)  # its NaN replies were dropped
    assert (1, 0) in pairs  # client 0 holds partitions 0 and 1
    assert sum(row["rejected"] for row in strategy.history) >= 1
    assert all(math.isfinite(row["accuracy"]) for row in strategy.history)


@pytest.mark.parametrize(("key", "value"), [("replicate-below", 0.5),
                                             ("replicate-margin", 2.0), ("need-ratio", 1.5),
                                             ("need-latch", True),
                                             ("need-reference", "era"),
                                             ("need-prior", True), ("lag-level", 0.9)])
def test_a_replication_key_without_asynchronous_is_refused(tmp_path, key, value):
    from server.app import run

    cfg = _config(tmp_path, **{"asynchronous": False, "s": "auto", key: value})
    with pytest.raises(ValueError, match=rf"{key}={value!r} is read by asynchronous runs"):
        run(_grid(cfg), cfg)


def _pairs(strategy):
    return [(p, by) for row in strategy.history
            for p, by in zip(row["clients_used"], row["computed_by"], strict=True)]


def test_s_auto_runs_the_picked_rule_and_records_it(tmp_path):
    """``s='auto'``: the placement s = 1 with the rule picked on development seeds (amendment
    32: FedBuff until the class reading trips, then the least-served held partition), the
    same run as the keys set by hand; config.json says what ran. Where only the slow clients
    hold two classes it trips (seed 0): its steps up to the one that tripped are FedBuff's,
    and after it a client computes a neighbour's partition."""
    import json

    from fl_gradcode.flower.asynchronous import (
        AUTO_LAG_LEVEL,
        AUTO_NEED_LATCH,
        AUTO_NEED_PRIOR,
        AUTO_NEED_RATIO,
        AUTO_NEED_REFERENCE,
        AUTO_REPLICATE_BELOW,
        AUTO_REPLICATE_MARGIN,
        AUTO_S,
    )
    from server.app import run
    from server.asynchronous import lag_key, need_key

    setting = {"num-rounds": 8, "seed": 0, "slow-classes": 2, "latency": "persistent"}
    auto = run(_grid(cfg := _config(tmp_path, s="auto", **setting)), cfg)
    recorded = json.loads((tmp_path / "run" / "config.json").read_text())
    assert (recorded["s"], recorded["replicate-below"], recorded["replicate-margin"],
            recorded["need-ratio"], recorded["need-latch"], recorded["need-reference"],
            recorded["need-prior"], recorded["lag-level"]) == (
        AUTO_S, AUTO_REPLICATE_BELOW, AUTO_REPLICATE_MARGIN, need_key(AUTO_NEED_RATIO),
        AUTO_NEED_LATCH, AUTO_NEED_REFERENCE, AUTO_NEED_PRIOR, lag_key(AUTO_LAG_LEVEL))
    by_hand = run(_grid(cfg := _config(tmp_path, s=AUTO_S, **setting,
                                       **{"replicate-below": AUTO_REPLICATE_BELOW,
                                          "replicate-margin": AUTO_REPLICATE_MARGIN,
                                          "need-ratio": need_key(AUTO_NEED_RATIO),
                                          "need-latch": AUTO_NEED_LATCH,
                                          "need-reference": AUTO_NEED_REFERENCE,
                                          "need-prior": AUTO_NEED_PRIOR,
                                          "lag-level": lag_key(AUTO_LAG_LEVEL)})), cfg)
    assert _pairs(auto) == _pairs(by_hand)
    fedbuff = run(_grid(cfg := _config(tmp_path, s=0, **setting)), cfg)
    tripped = next(i for i, row in enumerate(auto.history) if row["lagged_at"] is not None)
    assert auto.history[tripped]["lagged_at"] == auto.history[tripped]["virtual_s"]
    assert _pairs(_Steps(auto.history[:tripped + 1])) == _pairs(
        _Steps(fedbuff.history[:tripped + 1]))
    assert any(p != by for p, by in _pairs(_Steps(auto.history[tripped + 1:])))
    assert all(row["lagged_at"] == auto.history[tripped]["lagged_at"]
               for row in auto.history[tripped:])


class _Steps:
    """A run's server steps, in the shape :func:`_pairs` reads."""

    def __init__(self, history):
        self.history = history


def test_a_bar_of_zero_is_fedbuff_whatever_s(tmp_path):
    from server.app import run

    cfg = _config(tmp_path, **{"s": 2, "replicate-below": 0.0, "num-rounds": 3})
    pairs = _pairs(run(_grid(cfg), cfg))
    assert pairs and all(p == by for p, by in pairs)


def test_the_synchronous_builder_refuses_an_asynchronous_config(tmp_path):
    """The harness builds coded runs with ``build``: an ``asynchronous=true`` given to it (a
    benchmark's ``--set``) must not run synchronous rounds instead."""
    from server.app import build

    with pytest.raises(ValueError, match="asynchronous=True: this builds synchronous"):
        build(_config(tmp_path, s=2), N)


def test_the_margin_key_reaches_the_run(tmp_path):
    """``replicate-margin`` reaches the run: config.json records it, and under persistent
    stragglers it changes which partitions are computed (the bar alone, 1, replicates
    from the first lead)."""
    import json

    from server.app import run

    keys = {"num-rounds": 12, "seed": 3, "latency": "persistent", "latency-p": 0.3,
            "latency-slowdown": 20.0}
    margin = run(_grid(cfg := _config(tmp_path, **keys, **{"replicate-margin": 1.0})), cfg)
    assert json.loads((tmp_path / "run" / "config.json").read_text())["replicate-margin"] == 1.0
    alone = run(_grid(cfg := _config(tmp_path, **keys)), cfg)
    assert _pairs(margin) != _pairs(alone)


def test_the_need_ratio_key_reaches_the_run(tmp_path):
    """``need-ratio`` reaches the run (0 is off): config.json records it, and it changes
    which partitions are computed against the bar alone."""
    import json

    from server.app import run

    keys = {"num-rounds": 12, "seed": 3, "latency": "persistent", "latency-p": 0.3,
            "latency-slowdown": 20.0, "replicate-below": 0.25}
    latched = run(_grid(cfg := _config(tmp_path, **keys, **{"need-ratio": 1.0,
                                                             "need-latch": True})), cfg)
    assert json.loads((tmp_path / "run" / "config.json").read_text())["need-latch"] is True
    need = run(_grid(cfg := _config(tmp_path, **keys, **{"need-ratio": 1.0})), cfg)
    assert json.loads((tmp_path / "run" / "config.json").read_text())["need-ratio"] == 1.0
    alone = run(_grid(cfg := _config(tmp_path, **keys)), cfg)
    assert json.loads((tmp_path / "run" / "config.json").read_text())["need-ratio"] == 0.0
    assert _pairs(need) != _pairs(alone)
    era = run(_grid(cfg := _config(tmp_path, **keys, **{"need-ratio": 1.0, "need-latch": True,
                                                         "need-reference": "era"})), cfg)
    assert json.loads((tmp_path / "run" / "config.json").read_text())["need-reference"] == "era"
    assert _pairs(era) != _pairs(latched)
    prior = run(_grid(cfg := _config(tmp_path, **keys, **{
        "need-ratio": 1.0, "need-latch": True, "need-reference": "cohort",
        "need-prior": True})), cfg)
    recorded = json.loads((tmp_path / "run" / "config.json").read_text())
    assert (recorded["need-reference"], recorded["need-prior"]) == ("cohort", True)
    assert _pairs(prior) != _pairs(era)
    assert _pairs(latched) != _pairs(need)


def test_a_margin_beside_the_class_reading_is_run_and_acts_after_the_switch(tmp_path):
    """``replicate-margin`` with ``replicate-below=0`` and a ``lag-level`` is not refused:
    the class reading lifts the bar to 1 once it trips, and the margin then holds a
    neighbour's partition back until the own partition leads it. Where the reading trips
    (seed 0, the slow clients holding two classes) the run records the margin, and after
    the switch it computes other partitions than the same run without it."""
    import json

    from server.app import run

    setting = {"num-rounds": 8, "seed": 0, "slow-classes": 2, "latency": "persistent",
               "s": 1, "replicate-below": 0.0, "lag-level": 0.9}
    margin = run(_grid(cfg := _config(tmp_path, **setting, **{"replicate-margin": 2.0})), cfg)
    assert json.loads((tmp_path / "run" / "config.json").read_text())["replicate-margin"] == 2.0
    alone = run(_grid(cfg := _config(tmp_path, **setting)), cfg)
    tripped = next(i for i, row in enumerate(alone.history) if row["lagged_at"] is not None)
    assert _pairs(_Steps(margin.history[:tripped + 1])) == _pairs(
        _Steps(alone.history[:tripped + 1]))
    assert _pairs(margin) != _pairs(alone)


@pytest.mark.parametrize("asynchronous", [True, False])
@pytest.mark.parametrize("rounds", [0, -1])
def test_a_run_of_no_round_is_refused_by_name(tmp_path, asynchronous, rounds):
    """``num-rounds`` below 1 trains nothing (it ended with 'no round applied'): refused."""
    from server.app import run

    cfg = _config(tmp_path, **{"asynchronous": asynchronous, "num-rounds": rounds,
                               **({} if asynchronous else {"s": "auto"})})
    with pytest.raises(ValueError, match=rf"num-rounds={rounds}: expected an integer >= 1"):
        run(_grid(cfg), cfg)
