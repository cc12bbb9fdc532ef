"""Run-config keys: pyproject's [tool.flwr.app.config] and the code's defaults agree."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from fl_gradcode.config import DEFAULTS, merge_config

ROOT = Path(__file__).resolve().parents[2]
REQUIRED = [
    "num-rounds", "code", "s", "update", "local-epochs", "lr", "server-optimizer", "dataset",
    "partitioner", "dirichlet-alpha", "latency", "timing", "straggler-timeout", "seed",
    "results-dir",
]


def test_pyproject_run_config_equals_defaults():
    app = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    assert app["config"] == DEFAULTS
    assert app["components"] == {"serverapp": "server.app:app", "clientapp": "clients.app:app"}


def test_run_config_keys_exist_and_are_documented_in_the_readme():
    readme = (ROOT / "README.md").read_text()
    for key in REQUIRED:
        assert key in DEFAULTS
        assert f"`{key}`" in readme, key


def test_merge_config_rejects_unknown_keys_and_wrong_types():
    assert merge_config({"s": 2})["s"] == 2
    assert merge_config({"lr": 1})["lr"] == 1.0  # an int where a float is expected is fine
    with pytest.raises(ValueError, match="unknown run-config key 'stragglers'"):
        merge_config({"stragglers": 3})
    with pytest.raises(ValueError, match="num-rounds='5' must be int"):
        merge_config({"num-rounds": "5"})


@pytest.mark.parametrize(
    ("run_config", "expected"),
    [({}, "skip"), ({"s": "auto"}, "queue"), ({"busy": "queue"}, "queue"),
     ({"s": "auto", "busy": "skip"}, "skip"), ({"busy": "queue", "timing": "wallclock"}, "skip")],
)
def test_busy_run_config_key_reaches_the_strategy(run_config, expected, tmp_path):
    from server.app import build

    cfg = merge_config({**run_config, "results-dir": str(tmp_path)})
    strategy = build(cfg, 4)[0]
    assert strategy.busy_mode == expected


def test_bad_busy_value_is_refused_with_its_value(tmp_path):
    from server.app import build

    with pytest.raises(ValueError, match="busy='later'"):
        build(merge_config({"busy": "later", "results-dir": str(tmp_path)}), 4)


def test_auto_margin_run_config_key_reaches_the_strategy_and_is_validated(tmp_path):
    from server.app import build

    base = {"s": "auto", "results-dir": str(tmp_path)}
    assert build(merge_config(base), 4)[0].auto_margin == 0.1  # the documented default
    assert build(merge_config({**base, "auto-margin": 0.25}), 4)[0].auto_margin == 0.25
    with pytest.raises(ValueError, match=r"auto_margin=-0\.5"):
        build(merge_config({**base, "auto-margin": -0.5}), 4)


def test_exclude_slow_run_config_key_reaches_the_strategy_and_is_validated(tmp_path):
    from server.app import build

    base = {"s": "auto", "results-dir": str(tmp_path)}
    assert build(merge_config(base), 4)[0].exclude_slow is None  # 0: never (the default)
    assert build(merge_config({**base, "exclude-slow": 5.0}), 4)[0].exclude_slow == 5.0
    with pytest.raises(ValueError, match=r"exclude_slow=0\.5"):
        build(merge_config({**base, "exclude-slow": 0.5}), 4)
    with pytest.raises(ValueError, match="needs s='auto'"):
        build(merge_config({"exclude-slow": 5.0, "results-dir": str(tmp_path)}), 4)


def test_fraction_train_samples_a_cohort_every_round_and_is_validated(tmp_path):
    import random

    import numpy as np

    from server.app import build, run_in_process

    base = {"results-dir": str(tmp_path)}
    # Flower samples max(int(connected * fraction), min_train_nodes) nodes: all 12 connected,
    # everyone / 6 as before; asked for one node at least, a dead node never stalls the job
    inner = build(merge_config(base), 12)[0].inner
    assert (inner.fraction_train, inner.min_train_nodes, inner.min_available_nodes) == (1.0, 1, 1)
    inner = build(merge_config({**base, "fraction-train": 0.5}), 12)[0].inner
    assert (inner.fraction_train, inner.min_train_nodes, inner.min_available_nodes) == (0.5, 1, 1)
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match=f"fraction-train={bad}"):
            build(merge_config({**base, "fraction-train": bad}), 12)
    run = {**base, "fraction-train": 0.5, "num-rounds": 3, "s": 2, "latency": "pareto",
           "virtual-compute": "none"}
    random.seed(12345)  # the run seeds the cohort sampling itself
    strategy, theta = run_in_process(run, 12)
    assert len(strategy.history) == 3
    assert all(r["decode"] == "exact" and r["s"] == 2 for r in strategy.history)
    # 6 replies at most per round: the code is built over the 6-node cohort
    assert all(len(r["clients_used"]) <= 6 for r in strategy.history)
    assert len(strategy.identities) > 6  # different cohorts were sampled
    random.seed(999)
    again, theta_again = run_in_process(run, 12)  # same seed, same cohorts, same model
    np.testing.assert_array_equal(theta, theta_again)
    assert [r["virtual_s"] for r in again.history] == [r["virtual_s"] for r in strategy.history]


def test_independent_noise_is_accounted_with_the_sampled_cohorts_code(tmp_path):
    """Partition DP with independent noise: the accountant's noise multiplier comes from the
    code the rounds use, the one over the sampled cohort (6 of 12 nodes: grouped-rs s = 3 on
    6 clients, multiplier 0.72), not the one over all 12 (1.0)."""
    from fl_gradcode.codes import make_code
    from fl_gradcode.privacy import independent_noise_multiplier
    from server.app import build

    cfg = merge_config({"results-dir": str(tmp_path), "dp": "partition",
                        "dp-noise": "independent", "noise-multiplier": 1.0, "s": 3,
                        "code": "grouped-rs", "fraction-train": 0.5})
    strategy = build(cfg, 12)[0]
    ((sigma, q, count),) = strategy.accountant.units[0]
    cohort = independent_noise_multiplier(make_code("grouped-rs", n=6, s=3, seed=0).B, 1.0)
    everyone = independent_noise_multiplier(make_code("grouped-rs", n=12, s=3, seed=0).B, 1.0)
    assert abs(cohort - everyone) > 0.1  # the premise: the two codes differ
    assert sigma == pytest.approx(cohort)
    assert (q, count) == (1.0, 1)


def test_latency_seed_picks_the_slow_clients_and_the_run_seed_the_draws(tmp_path):
    from server.app import build

    def strategy(**keys):
        cfg = merge_config({"latency": "persistent", "latency-p": 0.3,
                            "results-dir": str(tmp_path), **keys})
        return build(cfg, 40)[0]

    def slow(st):
        return [w for w in range(40) if st.latency.is_slow(w)]

    shared = strategy(seed=5, **{"latency-seed": 1})
    seed1, seed5 = strategy(seed=1), strategy(seed=5)
    assert slow(shared) == slow(seed1) != slow(seed5)  # the federation's hardware of seed 1
    assert shared.seed == 5  # per-round draws follow the run seed


def test_latency_state_run_config_key_reaches_the_strategy(tmp_path):
    from server.app import build

    base = {"s": "auto", "results-dir": str(tmp_path)}
    assert build(merge_config(base), 4)[0].latency_state is None
    path = tmp_path / "sub" / "latency.json"
    st = build(merge_config({**base, "latency-state": str(path)}), 4)[0]
    assert st.latency_state == str(path.resolve())
