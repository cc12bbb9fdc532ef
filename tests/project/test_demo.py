"""The digits demo (coded gradient descent), checked against a plain numpy gradient descent."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.special import softmax
from sklearn.datasets import load_digits

from fl_gradcode.codes import make_code
from fl_gradcode.demo import accuracy, load_digits_split, main, run, softmax_grad


def _reference_grad(W: np.ndarray, X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Gradient of sum_i -log softmax(x_i W + b)[y_i]: Xb^T (softmax - onehot)."""
    Xb = np.hstack([X, np.ones((len(X), 1))])
    return (Xb.T @ (softmax(Xb @ W, axis=1) - np.eye(10)[y])).reshape(-1)


def _reference_descent(n, s, rounds, seed, lr=0.5, ignore=False):
    """Full-batch gradient descent on the label-sorted partitions; ``ignore``: the replies of
    the ``s`` stragglers of each round are dropped and the rest rescaled by ``n/(n-s)``."""
    X, y, Xt, yt = load_digits_split(seed)
    parts = np.array_split(np.argsort(y, kind="stable"), n)
    rng = np.random.default_rng(seed + 1)
    stragglers = [set(rng.choice(n, size=s, replace=False).tolist()) for _ in range(rounds)]
    W = np.zeros(650)
    for r in range(rounds):
        used = [j for j in range(n) if not (ignore and j in stragglers[r])]
        g = sum(_reference_grad(W.reshape(65, 10), X[parts[j]], y[parts[j]]) for j in used)
        if ignore:
            g = g * n / (n - s)
        W = W - lr * g / len(y)
    return W, Xt, yt


# ======== edges: exact values, bounds and messages ===============================================
def test_the_split_is_a_seeded_permutation_of_the_scaled_digits_80_20():
    X, y = load_digits(return_X_y=True)
    order = np.random.default_rng(3).permutation(len(y))
    Xtr, ytr, Xte, yte = load_digits_split(3)
    assert len(ytr) == int(0.8 * len(y)) == 1437 and len(yte) == len(y) - 1437
    np.testing.assert_array_equal(np.vstack([Xtr, Xte]), X[order] / 16.0)
    np.testing.assert_array_equal(np.concatenate([ytr, yte]), y[order])


def test_softmax_grad_is_the_cross_entropy_gradient_even_for_large_logits():
    rng = np.random.default_rng(0)
    X, y = rng.random((7, 64)), rng.integers(0, 10, 7)
    for scale in (0.1, 1000.0):
        W = rng.standard_normal((65, 10)) * scale
        got = softmax_grad(W, X, y)
        assert np.all(np.isfinite(got))
        np.testing.assert_allclose(got, _reference_grad(W, X, y), rtol=1e-9, atol=1e-9)


def test_accuracy_counts_the_argmax_with_the_bias():
    X = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    W = np.zeros((3, 10))
    W[0, 2] = W[1, 5] = 1.0
    W[2, 7] = 0.5  # the bias: picks class 7 for the zero input
    assert accuracy(W, X, np.array([2, 5, 7])) == 1.0
    assert accuracy(W, X, np.array([2, 4, 0])) == pytest.approx(1 / 3)


def test_run_matches_numpy_gradient_descent_for_every_scheme():
    n, s, rounds = 4, 1, 3
    res = run(n, s, rounds, seed=0)
    assert list(res) == ["uncoded (wait for all)", "ignore-stragglers", "frc", "grouped-rs",
                         "bgc"]
    W, Xt, yt = _reference_descent(n, s, rounds, 0)
    Wi, _, _ = _reference_descent(n, s, rounds, 0, ignore=True)
    ref = res["uncoded (wait for all)"]
    assert ref["test_accuracy"] == pytest.approx(accuracy(W.reshape(65, 10), Xt, yt))
    assert ref["distance_to_uncoded"] == 0.0 and ref["mean_decoding_error"] == 0.0
    assert (ref["load"], ref["k"]) == (1, 4)
    ign = res["ignore-stragglers"]
    assert ign["distance_to_uncoded"] == pytest.approx(
        np.linalg.norm(Wi - W) / np.linalg.norm(W), rel=1e-9)
    assert ign["test_accuracy"] == pytest.approx(accuracy(Wi.reshape(65, 10), Xt, yt))
    assert ign["mean_decoding_error"] > 0 and ign["load"] == 1
    for exact in ("frc", "grouped-rs"):
        assert res[exact]["distance_to_uncoded"] < 1e-12, exact
        assert res[exact]["mean_decoding_error"] == pytest.approx(0.0, abs=1e-20)
        assert res[exact]["load"] == s + 1 and res[exact]["k"] == n
        assert res[exact]["test_accuracy"] == ref["test_accuracy"]


def test_run_skips_frc_when_s_plus_1_does_not_divide_n_and_seeds_the_stragglers():
    res = run(5, 1, 2, seed=1)
    assert "frc" not in res and res["grouped-rs"]["distance_to_uncoded"] < 1e-12
    W, _, _ = _reference_descent(5, 1, 2, 1)
    Wi, _, _ = _reference_descent(5, 1, 2, 1, ignore=True)
    assert res["ignore-stragglers"]["distance_to_uncoded"] == pytest.approx(
        np.linalg.norm(Wi - W) / np.linalg.norm(W), rel=1e-9)


def test_run_uses_the_learning_rate():
    W, Xt, yt = _reference_descent(4, 1, 2, 0, lr=0.05)
    res = run(4, 1, 2, seed=0, lr=0.05)
    assert res["uncoded (wait for all)"]["test_accuracy"] == pytest.approx(
        accuracy(W.reshape(65, 10), Xt, yt))
    Wi, _, _ = _reference_descent(4, 1, 2, 0, lr=0.05, ignore=True)
    assert res["ignore-stragglers"]["distance_to_uncoded"] == pytest.approx(
        np.linalg.norm(Wi - W) / np.linalg.norm(W), rel=1e-9)


def test_main_prints_the_table_and_writes_its_json(capsys, tmp_path):
    out = tmp_path / "demo.json"
    main(["--clients", "4", "--stragglers", "1", "--rounds", "2", "--seed", "2",
          "--json", str(out)])
    data = json.loads(out.read_text())
    assert data["args"] == {"clients": 4, "stragglers": 1, "rounds": 2, "seed": 2,
                            "json": str(out)}
    assert data["results"] == run(4, 1, 2, seed=2)
    assert out.read_text().startswith('{\n  "args": {\n    "clients": 4,')
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == ("sklearn digits, n=4 clients, s=1 random stragglers per round, 2 rounds "
                        "of gradient descent (label-sorted partitions)")
    assert lines[1] == "scheme".ljust(24) + " load  test acc   mean err  rel. dist. to uncoded"
    frc = data["results"]["frc"]
    assert lines[4] == ("frc".ljust(24) + "    2" + f"{frc['test_accuracy']:>10.3f}"
                        f"{frc['mean_decoding_error']:>11.2e}"
                        f"{frc['distance_to_uncoded']:>23.2e}")
    assert lines[-1].startswith("(") and lines[-1].endswith(" s)")
    assert len(lines) == 2 + 5 + 1


def test_main_defaults_and_help(capsys, tmp_path):
    out = tmp_path / "d.json"
    main(["--rounds", "1", "--json", str(out)])
    assert json.loads(out.read_text())["args"] == {"clients": 12, "stragglers": 3, "rounds": 1,
                                                   "seed": 0, "json": str(out)}
    capsys.readouterr()
    main(["--clients", "4", "--stragglers", "1"])  # no --json: nothing written
    assert "n=4 clients, s=1 random stragglers per round, 40 rounds" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Coded gradient descent on the embedded sklearn digits data" in text
    assert "--json JSON also write the table as JSON" in text


def _reference_coded_descent(code, n, s, rounds, seed, lr=0.5):
    """Gradient descent on what ``code`` decodes from the non-stragglers' encoded replies
    (the partition gradients computed with numpy)."""
    X, y, _, _ = load_digits_split(seed)
    parts = np.array_split(np.argsort(y, kind="stable"), n)
    rng = np.random.default_rng(seed + 1)
    stragglers = [set(rng.choice(n, size=s, replace=False).tolist()) for _ in range(rounds)]
    W = np.zeros(650)
    for r in range(rounds):
        grads = {j: _reference_grad(W.reshape(65, 10), X[p], y[p]) for j, p in enumerate(parts)}
        replies = {i: code.encode(i, grads) for i in range(n) if i not in stragglers[r]}
        W = W - lr * code.decode(replies, approximate=True) / len(y)
    return W


def test_stragglers_are_distinct_and_bgc_is_drawn_from_the_runs_seed():
    n, s, rounds, seed = 6, 2, 3, 1
    res = run(n, s, rounds, seed=seed)
    W, _, _ = _reference_descent(n, s, rounds, seed)
    Wi, _, _ = _reference_descent(n, s, rounds, seed, ignore=True)
    assert res["ignore-stragglers"]["distance_to_uncoded"] == pytest.approx(
        np.linalg.norm(Wi - W) / np.linalg.norm(W), rel=1e-9)
    Wb = _reference_coded_descent(make_code("bgc", n=n, s=s, seed=seed), n, s, rounds, seed)
    assert res["bgc"]["distance_to_uncoded"] == pytest.approx(
        np.linalg.norm(Wb - W) / np.linalg.norm(W), rel=1e-9)
