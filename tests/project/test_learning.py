"""Datasets, partitions, models and per-partition updates."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from fl_gradcode.data import DATASETS, load_dataset, partition_indices
from fl_gradcode.learning import (
    MODELS,
    evaluate,
    flat_parameters,
    make_model,
    partition_update,
    set_flat_parameters,
)


@pytest.mark.parametrize("name", DATASETS)
def test_embedded_datasets_load_offline_with_a_seeded_split(name):
    d = load_dataset(name, 0)
    assert len(d.x_train) > 4 * len(d.x_test) * 0.9
    assert d.x_train.shape[1:] == d.x_test.shape[1:]
    assert set(np.unique(d.y_train)) <= set(range(d.num_classes))
    again = load_dataset.__wrapped__(name, 0)
    np.testing.assert_array_equal(again.x_train, d.x_train)


@pytest.mark.parametrize("partitioner", ["iid", "dirichlet", "pathological"])
def test_partitions_are_disjoint_complete_and_deterministic(partitioner):
    y = load_dataset("digits", 0).y_train
    parts = partition_indices(y, 12, partitioner, alpha=0.5, seed=1)
    assert len(parts) == 12 and all(len(p) > 0 for p in parts)
    joined = np.concatenate(parts)
    assert len(joined) == len(set(joined.tolist()))
    if partitioner != "pathological":
        assert len(joined) == len(y)
    again = partition_indices(y, 12, partitioner, alpha=0.5, seed=1)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    if partitioner == "pathological":
        assert all(len(np.unique(y[p])) <= 2 for p in parts)


def test_dirichlet_partitions_are_non_iid_and_seed_dependent():
    y = load_dataset("digits", 0).y_train
    parts = partition_indices(y, 10, "dirichlet", alpha=0.1, seed=0)
    shares = [np.bincount(y[p], minlength=10).max() / len(p) for p in parts]
    assert np.mean(shares) > 0.4  # IID would be ~0.1
    other = partition_indices(y, 10, "dirichlet", alpha=0.1, seed=5)
    assert any(len(a) != len(b) for a, b in zip(parts, other, strict=True))


def test_bad_data_arguments_are_rejected():
    with pytest.raises(ValueError, match="dataset='cifar'"):
        load_dataset("cifar")
    y = np.arange(20) % 2
    with pytest.raises(ValueError, match="partitioner='random'"):
        partition_indices(y, 2, "random")
    with pytest.raises(ValueError, match="dirichlet-alpha=0"):
        partition_indices(y, 2, "dirichlet", alpha=0)


@pytest.mark.parametrize("model_name", MODELS)
@pytest.mark.parametrize("dataset", ["digits", "mnist1d"])
def test_gradient_update_matches_finite_differences(model_name, dataset):
    d = load_dataset(dataset, 0)
    model = make_model(model_name, d.input_shape, d.num_classes, seed=0)
    theta = flat_parameters(model)
    x, y = d.x_train[:40], d.y_train[:40]
    g = partition_update(model, theta, x, y, kind="gradient")
    rng = np.random.default_rng(0)
    direction = rng.standard_normal(theta.size)
    direction /= np.linalg.norm(direction)  # a small step, so ReLU/max-pool kinks are not crossed
    eps = 1e-5
    lp, _ = evaluate(model, theta + eps * direction, x, y)
    lm, _ = evaluate(model, theta - eps * direction, x, y)
    assert (lp - lm) / (2 * eps) == pytest.approx(g @ direction, rel=1e-4, abs=1e-8)


def test_local_update_is_replica_identical_and_seed_dependent():
    d = load_dataset("digits", 0)
    model = make_model("mlp", d.input_shape, d.num_classes)
    theta = flat_parameters(model)
    x, y = d.x_train[:100], d.y_train[:100]
    other_model = make_model("mlp", d.input_shape, d.num_classes, seed=9)  # another replica
    a = partition_update(model, theta, x, y, kind="local", epochs=2, seed=(0, 3, 5))
    np.testing.assert_allclose(flat_parameters(model) - a, theta, atol=1e-12)  # moved by delta
    b = partition_update(other_model, theta, x, y, kind="local", epochs=2, seed=(0, 3, 5))
    c = partition_update(model, theta, x, y, kind="local", epochs=2, seed=(0, 4, 5))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_set_flat_parameters_copies_and_checks_length():
    model = make_model("logreg", (64,), 10)
    theta = np.zeros(flat_parameters(model).size)
    set_flat_parameters(model, theta)
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    assert np.all(theta == 0)  # the caller's array is never aliased
    with pytest.raises(ValueError, match="expected"):
        set_flat_parameters(model, np.zeros(3))
    with pytest.raises(ValueError, match="model='resnet'"):
        make_model("resnet", (64,), 10)


# ======== found by mutation testing ==============================================================
@pytest.mark.mutation_found("clients.app")
@pytest.mark.filterwarnings("ignore:gradient_coding_mod. no partition key:UserWarning")
def test_local_update_training_of_our_client_app_learns_digits(tmp_path):
    """``update=local``: the client applies its SGD delta ``theta + delta``. Five coded rounds on
    the 10-class digits must go well above chance (0.1) with the evaluation loss falling."""
    from server.app import run_in_process

    cfg = {"update": "local", "num-rounds": 5, "latency": "none", "code": "grouped-rs", "s": 1,
           "results-dir": str(tmp_path)}
    strategy, theta = run_in_process(cfg, 4)
    rows = strategy.history
    assert len(rows) == 5
    assert np.all(np.isfinite(theta))
    losses = [r["loss"] for r in rows]
    assert rows[-1]["accuracy"] > 0.6  # chance on 10 balanced classes is 0.1
    assert losses[-1] < losses[0]
    assert all(b <= a * 1.05 for a, b in itertools.pairwise(losses))


def _softmax_regression_per_example_grads(theta, x, y, classes):
    """Per-example gradients of the summed cross-entropy of softmax regression, in the order of
    ``nn.Linear``'s parameters (weight rows, then bias): a numpy reference."""
    d = x.shape[1]
    w, b = theta[: classes * d].reshape(classes, d), theta[classes * d:]
    z = x @ w.T + b
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(len(y)), y] -= 1.0
    return np.concatenate([(p[:, :, None] * x[:, None, :]).reshape(len(y), -1), p], axis=1)


@pytest.mark.mutation_found("learning")
@pytest.mark.parametrize("clip_norm, noise", [(0.05, 0.0), (10.0, 0.0), (0.3, 1.3)])
def test_dp_gradient_update_is_the_clipped_noised_mean_of_per_example_gradients(clip_norm, noise):
    from fl_gradcode.learning import dp_sgd_update

    rng = np.random.default_rng(3)
    x, y, classes = rng.normal(size=(9, 5)), rng.integers(0, 3, size=9), 3
    model = make_model("logreg", (5,), classes, seed=2)
    theta = flat_parameters(model) + rng.normal(scale=0.5, size=flat_parameters(model).size)
    got = dp_sgd_update(model, theta, x, y, kind="gradient", clip_norm=clip_norm,
                        noise_multiplier=noise, data_seed=0, noise_seed=11)
    g = _softmax_regression_per_example_grads(theta, x, y, classes)
    norms = np.linalg.norm(g, axis=1, keepdims=True)
    clipped = g * np.minimum(1.0, clip_norm / (norms + 1e-12))
    noise_draw = np.random.Generator(np.random.PCG64(11)).standard_normal(theta.size)
    expected = (clipped.sum(axis=0) + noise * clip_norm * noise_draw) / len(y)
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)
    assert got.shape == theta.shape
    # the caller's model is left as it was
    np.testing.assert_array_equal(flat_parameters(model), flat_parameters(
        make_model("logreg", (5,), classes, seed=2)))


@pytest.mark.mutation_found("learning")
def test_dp_local_update_is_reproducible_from_its_seeds_and_refuses_an_unknown_kind():
    from fl_gradcode.learning import dp_sgd_update

    rng = np.random.default_rng(4)
    x, y = rng.normal(size=(40, 4)), rng.integers(0, 2, size=40)
    model = make_model("logreg", (4,), 2, seed=0)
    theta = flat_parameters(model)
    kw = dict(kind="local", clip_norm=1.0, noise_multiplier=0.8, lr=0.1, epochs=2, batch_size=8)
    a = dp_sgd_update(model, theta, x, y, data_seed=1, noise_seed=2, **kw)
    b = dp_sgd_update(model, theta, x, y, data_seed=1, noise_seed=2, **kw)
    c = dp_sgd_update(model, theta, x, y, data_seed=1, noise_seed=3, **kw)
    np.testing.assert_array_equal(a, b)
    assert a.shape == theta.shape and np.all(np.isfinite(a)) and np.any(a != 0)
    assert not np.allclose(a, c)
    with pytest.raises(ValueError, match="update='newton'"):
        dp_sgd_update(model, theta, x, y, kind="newton", clip_norm=1.0, noise_multiplier=0.0,
                      data_seed=0, noise_seed=0)
