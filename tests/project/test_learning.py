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
    evaluate_classes,
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


# ======== edges: exact values, bounds and messages ===============================================
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


# ---- numpy references for the kill tests below (written from the definitions, not the code)
def _fedprox_synthetic_reference(alpha, beta, seed, devices=30, dim=60):
    """FedProx Synthetic(alpha, beta) (Li et al. 2020, Sec. 5.1), drawn in the documented order
    from one PCG64 stream: device sizes floor(LogNormal(4, 1)) + 50; per device
    u ~ N(0, alpha), W ~ N(u, 1) (dim x 10), b ~ N(u, 1), B ~ N(0, beta), v ~ N(B, 1),
    x ~ N(v, diag(j^-1.2)); y = argmax(x W + b)."""
    rng = np.random.default_rng(seed)
    sizes = np.floor(np.exp(4.0 + 1.0 * rng.standard_normal(devices))).astype(int) + 50
    scale = np.sqrt(np.arange(1, dim + 1, dtype=float) ** -1.2)
    xs, ys = [], []
    for k in range(devices):
        u = np.sqrt(alpha) * rng.standard_normal()
        w = u + rng.standard_normal((dim, 10))
        b = u + rng.standard_normal(10)
        v = np.sqrt(beta) * rng.standard_normal() + rng.standard_normal(dim)
        x = v + scale * rng.standard_normal((sizes[k], dim))
        xs.append(x)
        ys.append(np.argmax(x @ w + b, axis=1))
    return np.vstack(xs), np.concatenate(ys)


def _rows_sorted(x, y):
    order = np.lexsort(x.T[::-1])
    return x[order], y[order]


def _assert_is_synthetic(data, alpha, beta, seed):
    x_ref, y_ref = _fedprox_synthetic_reference(alpha, beta, seed)
    x = np.vstack([data.x_train, data.x_test])
    y = np.concatenate([data.y_train, data.y_test])
    assert len(data.y_train) == round(0.8 * len(y_ref)) and x.shape == x_ref.shape
    got, want = _rows_sorted(x, y), _rows_sorted(x_ref, y_ref)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(got[1], want[1])


def test_synthetic_dataset_is_fedprox_synthetic_alpha_beta():
    data = load_dataset.__wrapped__("synthetic", 3, 0.5, 2.0)
    assert (data.input_shape, data.num_classes) == ((60,), 10)
    _assert_is_synthetic(data, 0.5, 2.0, 3)


def test_run_partitions_reads_dataset_seed_synthetic_alpha_beta_and_partitioner():
    from fl_gradcode.data import run_partitions

    cfg = {"dataset": "synthetic", "seed": 3, "synthetic-alpha": 0.5, "synthetic-beta": 2.0,
           "partitioner": "iid", "dirichlet-alpha": 0.05}
    data, parts = run_partitions(cfg, 4)
    _assert_is_synthetic(data, 0.5, 2.0, 3)
    sizes = [len(p) for p in parts]
    assert sum(sizes) == len(data.y_train) and max(sizes) - min(sizes) <= 1  # iid: equal split
    assert len(np.unique(np.concatenate(parts))) == len(data.y_train)


def test_partition_indices_defaults_to_dirichlet_takes_one_partition_and_refuses_bad_k():
    y = np.arange(60) % 4
    default = partition_indices(y, 3, alpha=0.3, seed=2)
    named = partition_indices(y, 3, "dirichlet", alpha=0.3, seed=2)
    assert all(np.array_equal(a, b) for a, b in zip(default, named, strict=True))
    for partitioner in ("iid", "dirichlet"):
        (whole,) = partition_indices(y, 1, partitioner)
        np.testing.assert_array_equal(whole, np.arange(60))
        assert whole.dtype == np.int64
    for k in (True, False, 2.5, "3", 0, -1, None):
        with pytest.raises(ValueError, match=f"k={k!r} partitions must be a positive integer"):
            partition_indices(y, k)


def test_dp_sgd_steps_are_one_full_batch_step_or_the_loaders_batches_per_epoch():
    from fl_gradcode.learning import dp_sgd_steps

    assert dp_sgd_steps(100, kind="gradient", epochs=3, batch_size=32) == (1.0, 1)
    assert dp_sgd_steps(100, kind="local", epochs=3, batch_size=32) == (0.25, 12)  # ceil 100/32
    assert dp_sgd_steps(64, kind="local", epochs=2, batch_size=32) == (0.5, 4)


def test_dp_gradient_update_passes_a_tiny_per_example_gradient_unscaled():
    """Example 0 is classified with a logit margin of 29 (x = 0): its gradient, norm ~4e-13,
    is far under the clip and enters the sum as it is (the 1e-12 guard only keeps the clip
    factor finite; it must never flip or blow up a small gradient)."""
    from fl_gradcode.learning import dp_sgd_update

    x = np.array([[0.0, 0.0, 0.0], [0.4, -1.2, 0.7]])
    y = np.array([0, 1])
    model = make_model("logreg", (3,), 2)
    theta = np.zeros(flat_parameters(model).size)
    theta[-2:] = [29.0, 0.0]  # bias of class 0
    got = dp_sgd_update(model, theta, x, y, kind="gradient", clip_norm=1.0, noise_multiplier=0.0,
                        data_seed=0, noise_seed=0)
    g = _softmax_regression_per_example_grads(theta, x, y, 2)
    assert np.linalg.norm(g[0]) < 1e-12
    clipped = g * np.minimum(1.0, 1.0 / (np.linalg.norm(g, axis=1, keepdims=True) + 1e-12))
    np.testing.assert_allclose(got, clipped.sum(axis=0) / 2, rtol=1e-9, atol=1e-15)


def test_dp_updates_convert_inputs_to_float64_and_int64_and_take_any_seed():
    from fl_gradcode.learning import dp_sgd_update

    rng = np.random.default_rng(5)
    x, y = rng.normal(size=(6, 4)).astype(np.float32), rng.integers(0, 3, size=6)
    model = make_model("logreg", (4,), 3, seed=1)
    theta = flat_parameters(model)
    got = dp_sgd_update(model, theta, x, y.astype(np.int32), kind="gradient", clip_norm=0.5,
                        noise_multiplier=0.0, data_seed=0, noise_seed=0)
    g = _softmax_regression_per_example_grads(theta, x.astype(np.float64), y, 3)
    clipped = g * np.minimum(1.0, 0.5 / (np.linalg.norm(g, axis=1, keepdims=True) + 1e-12))
    np.testing.assert_allclose(got, clipped.sum(axis=0) / 6, rtol=1e-10, atol=1e-12)
    # a seed beyond 64 bits (e.g. derived from a 128-bit entropy pool) is taken, reproducibly
    x, y = rng.normal(size=(40, 4)), rng.integers(0, 3, size=40)
    kw = dict(kind="local", clip_norm=1.0, noise_multiplier=0.8, epochs=1, batch_size=8,
              data_seed=1)
    a = dp_sgd_update(model, theta, x, y, noise_seed=2**70 + 3, **kw)
    b = dp_sgd_update(model, theta, x, y, noise_seed=2**70 + 3, **kw)
    np.testing.assert_array_equal(a, b)
    assert np.all(np.isfinite(a)) and np.any(a != 0)


@pytest.mark.parametrize("name", MODELS)
def test_models_are_float64_from_the_start(name):
    model = make_model(name, (1, 8, 8), 10)
    assert {p.dtype for p in model.parameters()} == {torch.float64}
    out = model(torch.zeros(2, 64, dtype=torch.float64))
    assert out.shape == (2, 10) and out.dtype == torch.float64


@pytest.mark.parametrize("name", ["logreg", "mlp"])
def test_dense_models_take_inputs_in_their_input_shape_or_flat(name):
    """The numpy forward pass: softmax regression z = x W^T + b; the MLP
    relu(x W1^T + b1) W2^T + b2 (one hidden layer of 64)."""
    model = make_model(name, (1, 8, 8), 10, seed=4)
    p = [t.detach().numpy() for t in model.parameters()]
    x = np.random.default_rng(0).normal(size=(5, 1, 8, 8))
    flat = x.reshape(5, 64)
    want = (flat @ p[0].T + p[1] if name == "logreg" else
            np.maximum(flat @ p[0].T + p[1], 0.0) @ p[2].T + p[3])
    with torch.no_grad():
        for batch in (x, flat):
            np.testing.assert_allclose(model(torch.as_tensor(batch)).numpy(), want, rtol=1e-12,
                                       atol=1e-12)


def _conv1d_same(x, w, b):
    """numpy Conv1d, kernel 3, zero padding 1: out[n, o, t] = b[o] + sum_{c, j} w[o, c, j]
    x[n, c, t + j - 1]."""
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1)))
    length = x.shape[2]
    windows = np.stack([xp[:, :, j:j + length] for j in range(3)], axis=-1)  # n, c, t, j
    return np.einsum("nctj,ocj->not", windows, w) + b[None, :, None]


def test_cnn_is_conv_relu_pool_conv_relu_then_a_linear_head():
    model = make_model("cnn", (1, 6), 3, seed=1)
    w1, b1, w2, b2, wh, bh = (t.detach().numpy() for t in model.parameters())
    x = np.random.default_rng(2).normal(size=(4, 6))
    h = np.maximum(_conv1d_same(x[:, None, :], w1, b1), 0.0)
    h = np.maximum(h[:, :, 0::2], h[:, :, 1::2])  # max-pool 2
    h = np.maximum(_conv1d_same(h, w2, b2), 0.0)
    want = h.reshape(4, -1) @ wh.T + bh
    with torch.no_grad():
        got = model(torch.as_tensor(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match=r"cnn needs image or sequence inputs; got input shape "
                                         r"\(64,\)"):
        make_model("cnn", (64,), 10)


@pytest.mark.parametrize("batch_size", [20, 64])
def test_local_update_with_one_batch_per_epoch_is_full_batch_gradient_descent(batch_size):
    """A batch of at least the partition: each epoch is one step of the mean gradient (numpy
    softmax regression), whatever the minibatch order."""
    rng = np.random.default_rng(6)
    x, y = rng.normal(size=(20, 4)), rng.integers(0, 3, size=20)
    model = make_model("logreg", (4,), 3, seed=0)
    theta = flat_parameters(model)
    got = partition_update(model, theta, x, y, kind="local", lr=0.3, epochs=3,
                           batch_size=batch_size, seed=(1, 2, 3))
    t = theta.copy()
    for _ in range(3):
        t = t - 0.3 * _softmax_regression_per_example_grads(t, x, y, 3).mean(axis=0)
    np.testing.assert_allclose(got, t - theta, rtol=1e-10, atol=1e-12)


def test_dp_local_update_takes_a_step_on_an_empty_poisson_batch():
    """Poisson sampling (rate 1/2 for 2 examples in batches of 1) draws empty batches: such a
    step adds only the noise (here none), as DP-SGD defines it, instead of failing. Every
    result is one of the 16 numpy outcomes of two steps theta -= lr * sum_{i in B} g_i / 1
    over the batches B in {}, {0}, {1}, {0, 1}; the all-empty outcome (delta 0) occurs."""
    from fl_gradcode.learning import dp_sgd_update

    rng = np.random.default_rng(7)
    x, y = rng.normal(size=(2, 3)), np.array([0, 1])
    model = make_model("logreg", (3,), 2, seed=0)
    theta = flat_parameters(model)
    batches = [[], [0], [1], [0, 1]]
    outcomes = []
    for first, second in itertools.product(batches, batches):
        t = theta.copy()
        for batch in (first, second):
            g = _softmax_regression_per_example_grads(t, x, y, 2)
            t = t - 0.5 * g[batch].sum(axis=0)
        outcomes.append(t - theta)
    seen = set()
    for seed in range(16):
        got = dp_sgd_update(model, theta, x, y, kind="local", clip_norm=1e6,
                            noise_multiplier=0.0, data_seed=seed, noise_seed=seed, lr=0.5,
                            epochs=1, batch_size=1)
        match = [j for j, o in enumerate(outcomes) if np.allclose(got, o, rtol=1e-9, atol=1e-12)]
        assert match, f"seed {seed}: {got} is no outcome of two Poisson steps"
        seen.add(match[0])
    assert 0 in seen and len(seen) > 1  # an all-empty round happened, and others


def _overflow_on_one_example():
    """Softmax regression data and a model on which only example 0's logit overflows (only it
    has a nonzero first feature, and the model weighs that feature by 1.7e308)."""
    rng = np.random.default_rng(5)
    x, y, classes = rng.normal(size=(12, 4)), rng.integers(0, 3, size=12), 3
    x[1:, 0] = 0.0
    x[0, 0] = 1.0
    model = make_model("logreg", (4,), classes, seed=0)
    theta = np.zeros(flat_parameters(model).size)
    theta[0] = 1.7e308  # weight of feature 0 into class 0
    theta[classes * 4] = 1.7e308  # bias of class 0
    return model, theta, x, y, classes


def test_dp_gradient_update_counts_an_overflowing_example_as_zero():
    """A server choosing a model on which one record's gradient is NaN read that record's
    membership from the NaN in the release (the noise does not hide it). The record's gradient
    counts as zero, within the clip norm; the others' are clipped and noised as before."""
    from fl_gradcode.learning import dp_sgd_update

    model, theta, x, y, classes = _overflow_on_one_example()
    got = dp_sgd_update(model, theta, x, y, kind="gradient", clip_norm=0.5,
                        noise_multiplier=1.1, data_seed=0, noise_seed=9)
    g = _softmax_regression_per_example_grads(theta, x[1:], y[1:], classes)
    clipped = g * np.minimum(1.0, 0.5 / (np.linalg.norm(g, axis=1, keepdims=True) + 1e-12))
    noise = np.random.Generator(np.random.PCG64(9)).standard_normal(theta.size)
    expected = (clipped.sum(axis=0) + 1.1 * 0.5 * noise) / len(y)
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)


def test_dp_local_update_counts_an_overflowing_example_as_zero():
    """The same through Opacus' DP-SGD (its per-sample gradients before it clips them): the
    update is finite; without the fix every step holding example 0 was NaN."""
    from fl_gradcode.learning import dp_sgd_update

    model, theta, x, y, _ = _overflow_on_one_example()
    got = dp_sgd_update(model, theta, x, y, kind="local", clip_norm=0.5, noise_multiplier=1.1,
                        lr=0.1, epochs=3, batch_size=4, data_seed=1, noise_seed=2)
    assert np.isfinite(got).all()


def test_class_recalls_are_nan_for_an_absent_class_and_match_a_hand_count():
    """Logits set by hand (a linear model whose weights are the identity): each class's
    recall is counted apart from the predictions; a class with no example is nan."""
    model = make_model("logreg", (3,), 3, seed=0)
    theta = np.concatenate([np.eye(3).ravel(), np.zeros(3)])  # logits = x
    x = np.array([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0], [1.0, 0, 0], [0, 0, 1.0]])
    y = np.array([0, 0, 0, 0, 2])  # class 1 absent; class 0: 2 of 4 predicted right
    loss, acc, recall = evaluate_classes(model, theta, x, y, 3)
    assert recall[0] == pytest.approx(0.5) and recall[2] == pytest.approx(1.0)
    assert np.isnan(recall[1])
    assert acc == pytest.approx(3 / 5)
    assert loss == pytest.approx(float(np.mean(
        [np.log(np.exp(r).sum()) - r[c] for r, c in zip(x, y, strict=True)])))


@pytest.mark.parametrize("label", [-1, 3])
def test_class_recalls_refuse_a_label_outside_the_classes_naming_it(label):
    model = make_model("logreg", (3,), 3, seed=0)
    with pytest.raises(ValueError, match=rf"label {label} is outside the 3 classes"):
        evaluate_classes(model, np.zeros(12), np.eye(3), np.array([0, label, 1]), 3)


def test_class_recalls_refuse_a_class_count_the_model_does_not_have():
    model = make_model("logreg", (3,), 3, seed=0)
    with pytest.raises(ValueError, match="num_classes=4 but the model gives 3 logits"):
        evaluate_classes(model, np.zeros(12), np.eye(3), np.array([0, 1, 2]), 4)
