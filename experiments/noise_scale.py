"""How noisy one client's update is against the cohort's mean: the gradient noise scale.

``python -m experiments.noise_scale [--seeds 0,1,2] [--out results/noise_scale.json]``
computes, per task of :mod:`fl_gradcode.tasks` at the scale the grid runs it, on the
development seeds only, the *simple noise scale* of McCandlish, Kaplan, Amodei et al., "An
Empirical Model of Large-Batch Training" (2018, https://arxiv.org/abs/1812.06162),
``B_noise = tr(Σ) / |G|²``, with clients as the samples: ``G`` the example-weighted mean
update of a sampled cohort at the initial model, ``tr(Σ)`` the example-weighted mean squared
distance of a client's update from ``G``. In that model a step averaging ``B`` clients makes
``1 / (1 + B_noise / B)`` of the progress of a step on the whole population, so a round
that keeps ``B`` of a cohort's replies costs ``time / (1 + B_noise / B)`` per unit of
progress, not ``time / (1 - e)`` (``auto-approximate``'s model, with ``e`` the relative error
against the cohort's exact update).

It is a diagnostic of *when* ``auto``'s pricing of approximate rounds is wrong, not a change
to ``auto``: a small ``B_noise`` against the cohort means rounds that keep few replies lose
little progress per round, which the ``1 - e`` model (``e`` near 1 for a few replies of a
non-IID cohort) prices as nearly none. Measured at the initial model only; the noise scale
grows as training converges (McCandlish et al.), so it is a lower bound for later rounds.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from experiments.common import dumps
from fl_gradcode.config import merge_config
from fl_gradcode.data import run_partitions
from fl_gradcode.learning import flat_parameters, make_model, partition_update
from fl_gradcode.tasks import make_task

__all__ = ["SCALES", "main", "measure", "noise_scale"]

OUT = Path(__file__).resolve().parents[1] / "results" / "noise_scale.json"
#: (task, n nodes, cohort) as the grid runs each task (experiments/grid.toml)
SCALES = (("digits-logreg", 20, 20), ("digits-logreg", 100, 100), ("mnist1d-cnn", 20, 20),
          ("mnist1d-cnn", 100, 100), ("natural-noniid", 1000, 100))


def noise_scale(updates: np.ndarray, weights: Sequence[float]) -> float:
    """``tr(Σ) / |G|²`` of the rows of ``updates`` (one client's update each), weighted by
    ``weights`` (examples per client): ``G = Σ w_i u_i / Σ w_i``, ``tr(Σ) = Σ w_i |u_i - G|² /
    Σ w_i``. ``inf`` when ``G`` is zero."""
    u = np.asarray(updates, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    if u.ndim != 2 or w.shape != (u.shape[0],) or u.shape[0] < 1:
        raise ValueError(f"updates of shape {u.shape} and weights of shape {w.shape}: expected "
                         "(clients, parameters) and (clients,)")
    if not (np.all(np.isfinite(w)) and np.all(w >= 0) and w.sum() > 0):
        raise ValueError(f"weights must be finite, >= 0 and not all 0; got {w.tolist()}")
    mean = w @ u / w.sum()
    spread = float(w @ np.sum((u - mean) ** 2, axis=1) / w.sum())
    signal = float(mean @ mean)
    return spread / signal if signal > 0 else float("inf")


def measure(task: str, n: int, cohort: int, seed: int) -> dict[str, Any]:
    """The noise scale of one cohort (drawn from ``seed``) at the task's initial model."""
    cfg = merge_config({**make_task(task).config, "seed": int(seed), "num-clients": int(n)})
    data, index = run_partitions(cfg, n)
    model = make_model(str(cfg["model"]), data.input_shape, data.num_classes, int(seed))
    theta = flat_parameters(model)
    members = np.random.default_rng(int(seed)).choice(n, size=cohort, replace=False)
    updates, weights = [], []
    for i in sorted(int(m) for m in members):
        rows = index[i]
        if len(rows) == 0:
            continue
        updates.append(partition_update(
            model, theta, data.x_train[rows], data.y_train[rows], kind=str(cfg["update"]),
            lr=float(cfg["lr"]), epochs=int(cfg["local-epochs"]),
            batch_size=int(cfg["batch-size"]), seed=(int(seed), 0, i)))
        weights.append(len(rows))
    b = noise_scale(np.array(updates), weights)
    return {"task": task, "n": n, "cohort": cohort, "seed": int(seed), "clients": len(weights),
            "mean_examples": float(np.mean(weights)), "noise_scale_clients": b,
            "progress_of_full_cohort": 1.0 / (1.0 + b / len(weights))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0,1,2", help="development seeds (default 0,1,2)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--quick", action="store_true", help="digits-logreg at 20 only")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    if any(s >= 10 for s in seeds):
        raise SystemExit(f"--seeds {args.seeds}: development seeds only (below 10)")
    scales = SCALES[:1] if args.quick else SCALES
    rows = [measure(t, n, c, s) for t, n, c in scales for s in seeds]
    for r in rows:
        print(f"{r['task']:>15} {r['n']}x{r['cohort']} seed {r['seed']}: B_noise "
              f"{r['noise_scale_clients']:.1f} clients ({r['clients']} in the cohort)")
    args.out.write_text(dumps({"seeds": seeds, "rows": rows}))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
