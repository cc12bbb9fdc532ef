"""Named learning tasks and latency regimes: run-config overrides a harness can look up.

A task is a set of run-config keys (dataset, model, partitioner, update and their parameters)
layered over the defaults; a latency regime is the same for the latency keys. Neither sets
anything else, so ``{**regime.config, **task.config, **user overrides}`` is a run config.

Tasks (docs/tasks.md):

* ``digits-logreg`` (the main job): softmax regression on sklearn's digits, Dirichlet(0.5)
  label skew, one full-batch gradient step per partition.
* ``mnist1d-cnn``: the >= 100k-parameter ``cnn-large`` on MNIST-1D (Greydanus 2020), generated
  offline by ``mnist1d.data.make_dataset(get_dataset_args())`` with ``seed`` = the run's seed
  and 4,000 samples (3,200 train, 800 test); one local epoch of minibatch SGD per partition;
  compute charged from one measured partition update (``virtual-compute=measured-once``).
* ``natural-noniid``: the same data and model on the ``natural`` partition: log-normal client
  sizes (sigma 1) and Dirichlet(0.3) labels per client (:func:`fl_gradcode.data.natural_partition`).

No Flower import: the maths the ServerApp and a harness share.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .data import run_partitions
from .learning import flat_parameters, make_model, measure_partition_cost, parameter_count

__all__ = [
    "REGIMES",
    "TASKS",
    "Task",
    "charged_cost",
    "charged_measured_cost",
    "fedscale_workload",
    "make_regime",
    "make_task",
    "measured_partition_cost",
]

#: Bytes per parameter on the wire (the replies carry float64 arrays).
BYTES_PER_PARAMETER = 8


@dataclass(frozen=True)
class Task:
    """A named set of run-config overrides and what it is."""

    name: str
    description: str
    config: Mapping[str, Any] = field(default_factory=dict)


_CNN_TRAINING = {"dataset": "mnist1d", "model": "cnn-large", "update": "local",
                 "local-epochs": 1, "batch-size": 32, "lr": 0.1,
                 "virtual-compute": "measured-once"}

TASKS: dict[str, Task] = {
    task.name: task for task in (
        Task("digits-logreg", "softmax regression on sklearn digits (8x8), Dirichlet(0.5) "
             "partitions, one gradient step per partition (the main job's defaults)",
             {"dataset": "digits", "model": "logreg", "partitioner": "dirichlet",
              "dirichlet-alpha": 0.5, "update": "gradient"}),
        Task("mnist1d-cnn", "cnn-large (130,282 parameters) on MNIST-1D generated offline "
             "(seeded), Dirichlet(0.5) partitions, one local epoch of SGD per partition, "
             "compute charged from one measured partition update",
             {**_CNN_TRAINING, "partitioner": "dirichlet", "dirichlet-alpha": 0.5}),
        Task("natural-noniid", "cnn-large on MNIST-1D, natural partition: log-normal(σ=1) "
             "client sizes and Dirichlet(0.3) labels per client",
             {**_CNN_TRAINING, "partitioner": "natural", "natural-sigma": 1.0,
              "dirichlet-alpha": 0.3}),
    )
}

#: Latency regimes by name: the existing models with the main job's parameters, and FedScale
#: devices (``fedscale``: compute and upload come from the trace, so nothing else is charged;
#: its rounds last tens of seconds, so the deadline is a minute).
REGIMES: dict[str, Mapping[str, Any]] = {
    "persistent": {"latency": "persistent"},
    "bimodal": {"latency": "bimodal"},
    "pareto": {"latency": "pareto"},
    "shifted-exponential": {"latency": "shifted-exponential"},
    "trace": {"latency": "trace", "latency-trace": "canada"},
    "drift": {"latency": "drift"},
    "none": {"latency": "none"},
    "fedscale": {"latency": "fedscale", "latency-device-trace": "generated",
                 "virtual-compute": "none", "partition-cost-s": 0.0,
                 "straggler-timeout": 120.0, "latency-round-s": 120.0},
}


def make_task(name: str) -> Task:
    """The task called ``name`` (:data:`TASKS`); a ``ValueError`` lists the known ones."""
    if name not in TASKS:
        raise ValueError(f"task={name!r}; expected one of {sorted(TASKS)}")
    return TASKS[name]


def make_regime(name: str) -> dict[str, Any]:
    """The run-config overrides of latency regime ``name`` (:data:`REGIMES`)."""
    if name not in REGIMES:
        raise ValueError(f"latency regime {name!r}; expected one of {sorted(REGIMES)}")
    return dict(REGIMES[name])


def _passes(cfg: Mapping[str, Any]) -> int:
    """Passes over a partition per round: ``local-epochs`` for local updates, else one."""
    return int(cfg["local-epochs"]) if str(cfg["update"]) == "local" else 1


def fedscale_workload(cfg: Mapping[str, Any], n: int) -> dict[str, float]:
    """``make_latency``'s workload arguments for ``latency=fedscale`` over ``n`` clients:
    ``samples_per_load`` (a mean partition's examples times the passes over it per round),
    ``model_bytes`` (parameters times 8 bytes, float64) and ``num_devices`` (``n``)."""
    data, index = run_partitions(cfg, n)
    mean = float(np.mean([len(p) for p in index]))
    model = make_model(str(cfg["model"]), data.input_shape, data.num_classes)
    return {"samples_per_load": mean * _passes(cfg),
            "model_bytes": float(parameter_count(model) * BYTES_PER_PARAMETER),
            "num_devices": max(int(n), 1)}


def measured_partition_cost(cfg: Mapping[str, Any], n: int) -> float:
    """Seconds of one partition update of a mean-sized partition (the run's model, update,
    epochs, batch size, one torch thread), measured once: ``virtual-compute=measured-once``
    charges it per unit of load. The partition is the first ``mean size`` training examples."""
    data, index = run_partitions(cfg, n)
    size = max(1, round(float(np.mean([len(p) for p in index]))))
    model = make_model(str(cfg["model"]), data.input_shape, data.num_classes, int(cfg["seed"]))
    return measure_partition_cost(
        model, flat_parameters(model), data.x_train[:size], data.y_train[:size],
        kind=str(cfg["update"]), lr=float(cfg["lr"]), epochs=int(cfg["local-epochs"]),
        batch_size=int(cfg["batch-size"]),
    )


def charged_cost(seconds: float) -> dict[str, Any]:
    """Run-config overrides that charge ``seconds`` per partition update as a fixed
    ``partition-cost-s`` (``virtual-compute=none``): a harness comparing several schemes on
    one task gives every scheme the same charge."""
    return {"virtual-compute": "none", "partition-cost-s": float(seconds)}


def charged_measured_cost(cfg: Mapping[str, Any], n: int) -> dict[str, Any]:
    """:func:`charged_cost` of :func:`measured_partition_cost`, measured now: a harness
    measures once and charges every scheme that value (with ``measured-once`` each run
    would time its own)."""
    return charged_cost(measured_partition_cost(cfg, n))
