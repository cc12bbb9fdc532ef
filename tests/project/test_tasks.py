"""Tasks beyond digits: the >= 100k-parameter CNN on offline MNIST-1D, the natural non-IID
partition (measured skew against its stated parameters), the task registry, compute charged
from one measured partition update, and a run whose devices go off (``latency=fedscale``)."""

from __future__ import annotations

import json
import pickle
import socket

import numpy as np
import pytest

from fl_gradcode.config import merge_config
from fl_gradcode.data import load_dataset, natural_partition, partition_indices
from fl_gradcode.learning import evaluate, flat_parameters, make_model, partition_update
from fl_gradcode.tasks import REGIMES, TASKS, charged_measured_cost, make_regime, make_task


def test_cnn_large_has_over_100k_parameters_by_its_layer_shapes():
    d = load_dataset("mnist1d", 0)
    assert d.input_shape == (1, 40)
    model = make_model("cnn-large", d.input_shape, d.num_classes, seed=0)
    # conv1d 1->32 (k=3), conv1d 32->64 (k=3), max-pool 2: 64 x 20 features, 96 hidden, 10
    by_hand = (1 * 32 * 3 + 32) + (32 * 64 * 3 + 64) + (64 * 20 * 96 + 96) + (96 * 10 + 10)
    assert by_hand == 130_282
    assert flat_parameters(model).size == by_hand >= 100_000


def test_cnn_large_learns_mnist1d_in_a_few_seeded_local_steps(one_torch_thread):
    d = load_dataset("mnist1d", 0)
    model = make_model("cnn-large", d.input_shape, d.num_classes, seed=0)
    theta = flat_parameters(model)
    _, before = evaluate(model, theta, d.x_test, d.y_test)
    runs = []
    for _ in range(2):
        t = theta.copy()
        for step in range(3):  # 3 epochs of 10 minibatches of 32: 30 SGD steps
            t = t + partition_update(model, t, d.x_train[:320], d.y_train[:320], kind="local",
                                     lr=0.1, epochs=1, batch_size=32, seed=(0, step))
        runs.append(t)
    np.testing.assert_array_equal(runs[0], runs[1])  # seeded: the same steps twice
    _, after = evaluate(model, runs[0], d.x_test, d.y_test)
    chance = 1 / d.num_classes
    assert before < chance + 0.03  # the initial model guesses
    assert after > chance + 0.05  # 800 test examples: 0.15 is > 5 standard errors above 0.1


def test_mnist1d_is_generated_without_the_network(monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("MNIST-1D must be generated offline")

    with monkeypatch.context() as patched:
        patched.setattr(socket, "socket", no_network)
        patched.setattr(socket, "create_connection", no_network)
        fresh = load_dataset.__wrapped__("mnist1d", 0)  # generated now, not the cached copy
    assert fresh.x_train.shape == (3200, 40) and fresh.x_test.shape == (800, 40)
    cached = load_dataset("mnist1d", 0)  # seeded: the same data as any earlier generation
    np.testing.assert_array_equal(fresh.x_train, cached.x_train)
    np.testing.assert_array_equal(fresh.y_test, cached.y_test)


def _balanced(n_per_class: int, classes: int = 10) -> np.ndarray:
    return np.repeat(np.arange(classes), n_per_class)


@pytest.mark.parametrize(("alpha", "sigma"), [(0.3, 1.0), (1.0, 0.5)])
def test_natural_partition_skew_matches_its_stated_parameters(alpha, sigma):
    """Quantity skew: the sizes' log has standard deviation sigma. Label skew: for
    q ~ Dir(alpha 1_C), E[sum_c q_c^2] = (alpha + 1) / (C alpha + 1), so the measured mean
    concentration inverts to alpha_hat = (1 - H) / (C H - 1)."""
    classes, k = 10, 200
    labels = _balanced(20_000, classes)
    parts = natural_partition(labels, k, alpha=alpha, sigma=sigma, seed=5)
    sizes = np.array([len(p) for p in parts])
    assert sizes.min() >= 1
    allidx = np.concatenate(parts)
    assert len(allidx) == len(np.unique(allidx))  # disjoint
    # measured quantity skew (200 clients: the standard error of the std is ~5% of sigma)
    assert np.std(np.log(sizes)) == pytest.approx(sigma, rel=0.15)
    # measured label skew, weighting every client equally
    props = np.array([np.bincount(labels[p], minlength=classes) / len(p) for p in parts])
    big = sizes >= 50  # rounding of tiny clients aside
    h = float(np.mean(np.sum(props[big] ** 2, axis=1)))
    alpha_hat = (1 - h) / (classes * h - 1)
    assert alpha_hat == pytest.approx(alpha, rel=0.25)
    # the same seed gives the same partition; another seed another one
    again = natural_partition(labels, k, alpha=alpha, sigma=sigma, seed=5)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    other = natural_partition(labels, k, alpha=alpha, sigma=sigma, seed=6)
    assert not all(np.array_equal(a, b) for a, b in zip(parts, other, strict=True))


def test_natural_partition_is_a_partitioner_of_the_run_config():
    d = load_dataset("mnist1d", 0)
    parts = partition_indices(d.y_train, 20, "natural", alpha=0.3, sigma=1.0, seed=0)
    direct = natural_partition(d.y_train, 20, alpha=0.3, sigma=1.0, seed=0)
    assert all(np.array_equal(a, b) for a, b in zip(parts, direct, strict=True))
    sizes = [len(p) for p in parts]
    assert max(sizes) > 4 * min(sizes)  # quantity skew on the task's own data
    with pytest.raises(ValueError, match="dirichlet-alpha"):
        natural_partition(d.y_train, 20, alpha=0.0)
    # every client asks again: the same split, and a caller's changes stay its own
    parts[0][:] = -1
    again = partition_indices(d.y_train, 20, "natural", alpha=0.3, sigma=1.0, seed=0)
    assert all(np.array_equal(a, b) for a, b in zip(again, direct, strict=True))
    other = partition_indices(d.y_train, 20, "natural", alpha=0.3, sigma=1.0, seed=1)
    assert not all(np.array_equal(a, b) for a, b in zip(other, direct, strict=True))


def test_tasks_and_regimes_are_run_configs_by_name():
    assert {"digits-logreg", "mnist1d-cnn", "natural-noniid"} <= set(TASKS)
    assert make_task("digits-logreg").config["model"] == "logreg"
    assert make_task("mnist1d-cnn").config["model"] == "cnn-large"
    assert make_task("natural-noniid").config["partitioner"] == "natural"
    for name in TASKS:
        for regime in REGIMES:
            merge_config({**make_regime(regime), **make_task(name).config})  # valid keys
    with pytest.raises(ValueError, match="mnist1d-cnn"):
        make_task("cifar")
    with pytest.raises(ValueError, match="fedscale"):
        make_regime("gamma")


def test_measured_once_charges_one_timed_partition_update(one_torch_thread):
    from server.app import strategy_keywords

    cfg = merge_config({**make_task("mnist1d-cnn").config, "partitioner": "iid"})
    keywords = strategy_keywords(cfg, 10, only=("compute_cost_s", "measured_compute"))
    assert keywords["measured_compute"] is False
    # one local epoch of 320 examples in batches of 32 with one torch thread: a few ms to
    # a second whatever the machine; never the partition-cost-s default
    assert 1e-4 < keywords["compute_cost_s"] < 2.0
    assert keywords["compute_cost_s"] != cfg["partition-cost-s"]
    plain = strategy_keywords(merge_config({}), 10, only=("compute_cost_s",))
    assert plain["compute_cost_s"] == merge_config({})["partition-cost-s"]
    # a harness measures once and charges every scheme the same fixed cost
    fixed = charged_measured_cost(cfg, 10)
    assert fixed["virtual-compute"] == "none" and 1e-4 < fixed["partition-cost-s"] < 2.0
    again = strategy_keywords(merge_config({**cfg, **fixed}), 10, only=("compute_cost_s",))
    assert again["compute_cost_s"] == fixed["partition-cost-s"]


def _off_in_round_one_trace(tmp_path, n):
    """FedScale pickles: n identical devices; device 1 (client 0) is on 0.01-900 s of its
    1000 s cycle, read at each round's virtual start: off in round 1 (starting at 0 s; off
    since 900 s of the last cycle, so reported at once) and on in rounds 2 and 3 (round 1
    lasts longer than 0.01 s)."""
    capacity = {c: {"computation": 1.0, "communication": 10_000.0} for c in range(1, n + 1)}
    behave = {1: {"active": [0.01], "inactive": [900.0], "finish_time": 1000.0}}
    with open(tmp_path / "client_device_capacity", "wb") as fh:
        pickle.dump(capacity, fh)
    with open(tmp_path / "client_behave_trace", "wb") as fh:
        pickle.dump(behave, fh)
    return str(tmp_path)


@pytest.mark.parametrize("rival", ["", "drop-stragglers"])
def test_a_device_off_never_replies_and_is_back_when_it_is_on(tmp_path, rival):
    from server.app import run_in_process, run_rival_in_process

    n = 6
    cfg = {**make_regime("fedscale"), "latency-device-trace": _off_in_round_one_trace(tmp_path, n),
           "num-rounds": 3, "partitioner": "iid",
           "straggler-timeout": 5.0, "results-dir": str(tmp_path / "run")}
    if rival:
        run_rival_in_process({**cfg, "rival": rival}, n)
    else:
        run_in_process(cfg, n)
    rows = [json.loads(line) for line in open(tmp_path / "run" / "rounds.jsonl")]
    assert [row["round"] for row in rows] == [1, 2, 3]
    first, *later = rows
    assert 0 not in first["clients_used"] and 0 in first["stragglers"]
    assert first["clients_used"]  # the others replied
    assert first["round_virtual_s"] <= 5.0
    for row in later:  # on again: no longer busy with the work it never did
        assert 0 in row["clients_used"], row


def test_fedscale_devices_are_refused_in_wallclock_timing(tmp_path):
    from flwr.serverapp.strategy import FedAvg

    from fl_gradcode.flower import GradientCoding
    from fl_gradcode.latency import make_latency

    model = make_latency("fedscale", device_trace=_off_in_round_one_trace(tmp_path, 3))
    with pytest.raises(ValueError, match="timing='virtual'"):
        GradientCoding(FedAvg(), latency=model, timing="wallclock")
    GradientCoding(FedAvg(), latency=model, timing="virtual")  # accepted
