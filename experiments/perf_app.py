"""The app of the performance benchmarks: a CNN on scikit-learn's embedded digits, upsampled.

``Net(hidden)``: the PyTorch MNIST example's CNN (LeCun et al., "Gradient-based learning
applied to document recognition", Proc. IEEE 1998, in the shape of pytorch/examples' mnist):
two 3x3 convolutions (32, 64 channels), a 2x2 max-pool, a ``hidden``-unit dense layer and 10
outputs on 28x28 inputs (the 8x8 digits upsampled bilinearly). ``hidden=128``: 1.2M
parameters; ``hidden=1084``: 10.0M. ``Net(0)`` is a small MLP on the raw 8x8 digits (4.8k
parameters) for the scale run, where the messaging, not the model, is measured.

Training is deterministic (no shuffling, no dropout, no random draws): a coded run and FedAvg
on the same seeds compute the same partition models, so their results can be compared.
Partition ``j`` of ``k``: disjoint IID slices of the pool in sizes proportional to
``1 + j % 3`` when every slice gets at least 16 examples, else 16 examples drawn from the pool
with the seed ``(7, j)``. Batch 32, SGD, ``local-epochs`` epochs (train config, default 1).

``FLGC_PERF_LOG`` (environment, a file path): every train call appends one JSON line
``{"start": ..., "end": ..., "partition": j, "pid": ...}`` (wall clock) so a benchmark can sum
the app's own compute across Ray actors.
"""

from __future__ import annotations

import json
import os
import time
from functools import lru_cache

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from torch import nn

POOL = 1497  # training pool (the rest of the 1797 digits is the held-out test set)
MIN_PARTITION = 16
LOG_ENV = "FLGC_PERF_LOG"
torch.set_num_threads(1)  # two cores shared by Ray actors (and other jobs): one thread each


class Net(nn.Module):
    """The CNN (``hidden > 0``) or the small MLP (``hidden == 0``)."""

    def __init__(self, hidden: int = 128) -> None:
        super().__init__()
        if hidden < 0:
            raise ValueError(f"hidden={hidden!r}; expected 0 (MLP) or a positive width")
        self.hidden = hidden
        if hidden == 0:
            self.fc1, self.fc2 = nn.Linear(64, 64), nn.Linear(64, 10)
        else:
            self.conv1, self.conv2 = nn.Conv2d(1, 32, 3), nn.Conv2d(32, 64, 3)
            self.fc1, self.fc2 = nn.Linear(9216, hidden), nn.Linear(hidden, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.hidden == 0:
            return self.fc2(torch.relu(self.fc1(x.flatten(1))))
        x = torch.relu(self.conv2(torch.relu(self.conv1(x))))
        x = torch.flatten(torch.max_pool2d(x, 2), 1)
        return self.fc2(torch.relu(self.fc1(x)))


def num_params(hidden: int) -> int:
    return sum(p.numel() for p in Net(hidden).parameters())


def initial_arrays(hidden: int, seed: int = 0) -> ArrayRecord:
    torch.manual_seed(seed)
    return to_arrays(Net(hidden))


def to_arrays(model: nn.Module) -> ArrayRecord:
    return ArrayRecord({k: Array(v.detach().cpu().numpy()) for k, v in model.state_dict().items()})


@lru_cache(maxsize=2)
def _digits(small: bool) -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    order = np.random.default_rng(0).permutation(len(digits.target))
    x = torch.from_numpy((digits.images[order].astype(np.float32) / 16.0 - 0.5) / 0.5)[:, None]
    if not small:
        x = torch.nn.functional.interpolate(x, size=(28, 28), mode="bilinear",
                                            align_corners=False)
    return x, torch.from_numpy(digits.target[order].astype(np.int64))


def partition(pid: int, k: int, small: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Partition ``pid`` of ``k`` of the training pool (see the module docstring)."""
    if not 0 <= pid < k:
        raise ValueError(f"partition-id={pid!r}; expected 0 <= id < num-partitions={k}")
    x, y = _digits(small)
    weights = 1 + np.arange(k) % 3
    bounds = np.round(np.cumsum(np.r_[0, weights]) / weights.sum() * POOL).astype(int)
    if np.diff(bounds).min() >= MIN_PARTITION:
        idx = np.arange(bounds[pid], bounds[pid + 1])
    else:
        idx = np.random.default_rng([7, pid]).choice(POOL, MIN_PARTITION, replace=False)
    return x[idx], y[idx]


def test_set(small: bool) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = _digits(small)
    return x[POOL:], y[POOL:]


def load(model: nn.Module, arrays: ArrayRecord) -> None:
    model.load_state_dict({k: torch.from_numpy(np.array(arrays[k].numpy()))
                           for k in arrays.keys()})


def accuracy(hidden: int, arrays: ArrayRecord) -> float:
    model = Net(hidden)
    load(model, arrays)
    x, y = test_set(hidden == 0)
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def train_partition(hidden: int, arrays: ArrayRecord, pid: int, k: int, lr: float,
                    epochs: int = 1) -> tuple[ArrayRecord, int, float]:
    """``epochs`` local epochs on partition ``pid``: the new arrays, the example count, the
    last epoch's loss."""
    model = Net(hidden)
    load(model, arrays)
    x, y = partition(pid, k, hidden == 0)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(epochs):
        total = 0.0
        for start in range(0, len(y), 32):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x[start:start + 32]), y[start:start + 32])
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(y[start:start + 32])
    return to_arrays(model), len(y), total / len(y)


def train(msg: Message, context: Context) -> Message:
    """The ClientApp's train handler (the quickstart's shape)."""
    t0 = time.time()
    cfg = msg.content["config"]
    pid, k = int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    arrays, count, loss = train_partition(int(cfg["hidden"]), msg.content["arrays"], pid, k,
                                          float(cfg["lr"]), int(cfg.get("local-epochs", 1)))
    reply = Message(RecordDict({"arrays": arrays, "metrics": MetricRecord(
        {"num-examples": count, "train-loss": loss})}), reply_to=msg)
    path = os.environ.get(LOG_ENV)
    if path:
        with open(path, "a") as fh:
            fh.write(json.dumps({"start": t0, "end": time.time(), "partition": pid,
                                 "pid": os.getpid()}) + "\n")
    return reply


def make_app(coded: bool, timed: bool = False) -> ClientApp:
    """The ClientApp, with ``gradient_coding_mod`` (``coded``) or without it; ``timed``:
    ``train_timing_mod`` first (what the drop-stragglers rival, ``DeadlineFedAvg``, reads),
    as in the main job's ClientApp."""
    from fl_gradcode.flower import gradient_coding_mod
    from fl_gradcode.flower.deadline import train_timing_mod

    mods = ([train_timing_mod] if timed else []) + ([gradient_coding_mod] if coded else [])
    app = ClientApp(mods=mods)
    app.train()(train)
    return app


coded_app = make_app(True)
plain_app = make_app(False)
#: the stragglers part's app: coded runs and the drop-stragglers rival in one federation
timed_app = make_app(True, timed=True)
