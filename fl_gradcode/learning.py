"""Models and per-partition updates (torch, float64, no Flower import).

A partition update is what gradient coding combines: ``gradient`` (the mean loss gradient of
the partition at the global model) or ``local`` (the model delta after ``E`` epochs of
minibatch SGD on that partition alone). Both are deterministic functions of
``(global model, partition, run seed, round)``: minibatch order is drawn from a generator
seeded by ``(seed, round, partition)``, so every replica of a partition computes the same
update and decoding stays exact.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

__all__ = [
    "MODELS",
    "dp_sgd_steps",
    "dp_sgd_update",
    "evaluate",
    "flat_parameters",
    "make_model",
    "measure_partition_cost",
    "parameter_count",
    "partition_update",
    "set_flat_parameters",
]

MODELS = ("logreg", "mlp", "cnn", "cnn-large")


class _CNN(nn.Module):
    """Two conv layers (2-D for images, 1-D for sequences) and a linear head."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        if len(input_shape) == 3:
            conv, pool = nn.Conv2d, nn.MaxPool2d
        elif len(input_shape) == 2:
            conv, pool = nn.Conv1d, nn.MaxPool1d
        else:
            raise ValueError(f"cnn needs image or sequence inputs; got input shape {input_shape}")
        c = input_shape[0]
        self.features = nn.Sequential(
            conv(c, 8, 3, padding=1), nn.ReLU(), pool(2), conv(8, 16, 3, padding=1), nn.ReLU()
        ).to(torch.float64)
        with torch.no_grad():
            size = self.features(torch.zeros(1, *input_shape, dtype=torch.float64)).numel()
        self.head = nn.Linear(size, num_classes)
        self.input_shape = input_shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(x.shape[0], *self.input_shape)
        return self.head(self.features(x).flatten(1))


class _LargeCNN(nn.Module):
    """Conv 32 -> conv 64 (kernel 3, ReLU), max-pool 2, a hidden layer of 96, a linear head;
    2-D for images, 1-D for sequences. On MNIST-1D (1 x 40) it has 130,282 parameters (the
    small ``_CNN`` has under 4k), on digits (1 x 8 x 8) 118,186."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        if len(input_shape) == 3:
            conv, pool = nn.Conv2d, nn.MaxPool2d
        elif len(input_shape) == 2:
            conv, pool = nn.Conv1d, nn.MaxPool1d
        else:
            raise ValueError(f"cnn-large needs image or sequence inputs; got input shape "
                             f"{input_shape}")
        self.features = nn.Sequential(
            conv(input_shape[0], 32, 3, padding=1), nn.ReLU(),
            conv(32, 64, 3, padding=1), nn.ReLU(), pool(2),
        ).to(torch.float64)
        with torch.no_grad():
            size = self.features(torch.zeros(1, *input_shape, dtype=torch.float64)).numel()
        self.head = nn.Sequential(nn.Linear(size, 96), nn.ReLU(), nn.Linear(96, num_classes))
        self.input_shape = input_shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(x.shape[0], *self.input_shape)
        return self.head(self.features(x).flatten(1))


def make_model(
    name: str, input_shape: tuple[int, ...], num_classes: int, seed: int = 0
) -> nn.Module:
    """``logreg`` (softmax regression), ``mlp`` (one hidden layer of 64), ``cnn`` (small) or
    ``cnn-large`` (>= 100k parameters); float64."""
    features = int(np.prod(input_shape))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if name == "logreg":
            model = nn.Sequential(nn.Flatten(), nn.Linear(features, num_classes))
        elif name == "mlp":
            model = nn.Sequential(
                nn.Flatten(), nn.Linear(features, 64), nn.ReLU(), nn.Linear(64, num_classes)
            )
        elif name == "cnn":
            model = _CNN(tuple(input_shape), num_classes)
        elif name == "cnn-large":
            model = _LargeCNN(tuple(input_shape), num_classes)
        else:
            raise ValueError(f"model={name!r}; expected one of {list(MODELS)}")
    return model.to(torch.float64)


def parameter_count(model: nn.Module) -> int:
    """Number of scalar parameters of ``model``."""
    return int(sum(p.numel() for p in model.parameters()))


def measure_partition_cost(
    model: nn.Module,
    theta: np.ndarray,
    x: np.ndarray,
    y: np.ndarray,
    *,
    kind: str,
    lr: float = 0.1,
    epochs: int = 1,
    batch_size: int = 32,
    repeats: int = 3,
) -> float:
    """Seconds one :func:`partition_update` on ``(x, y)`` takes with one torch thread: the
    fastest of ``repeats`` timed runs after one warm-up (the least disturbed by other load)."""
    import time

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        best = float("inf")
        for i in range(repeats + 1):
            start = time.perf_counter()
            partition_update(model, theta, x, y, kind=kind, lr=lr, epochs=epochs,
                             batch_size=batch_size, seed=(0, i))
            if i:
                best = min(best, time.perf_counter() - start)
        return best
    finally:
        torch.set_num_threads(threads)


def flat_parameters(model: nn.Module) -> np.ndarray:
    """All parameters as one float64 vector (the order of ``model.parameters()``)."""
    return nn.utils.parameters_to_vector(model.parameters()).detach().cpu().numpy().copy()


def set_flat_parameters(model: nn.Module, flat: np.ndarray) -> None:
    """Load a flat vector produced by :func:`flat_parameters` into ``model``."""
    expected = sum(p.numel() for p in model.parameters())
    if flat.shape != (expected,):
        raise ValueError(f"parameter vector has shape {flat.shape}; expected ({expected},)")
    # a copy: the parameters must never alias the caller's array (SGD updates them in place)
    nn.utils.vector_to_parameters(torch.tensor(flat, dtype=torch.float64), model.parameters())


def _mean_gradient(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    model.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(x), y)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    return torch.cat([g.reshape(-1) for g in grads]).detach().numpy().copy()


def partition_update(
    model: nn.Module,
    theta: np.ndarray,
    x: np.ndarray,
    y: np.ndarray,
    *,
    kind: str,
    lr: float = 0.1,
    epochs: int = 1,
    batch_size: int = 32,
    seed: tuple[int, ...] = (0,),
) -> np.ndarray:
    """One partition's update at global parameters ``theta``.

    Args:
        kind: ``"gradient"``: mean cross-entropy gradient over the partition;
            ``"local"``: ``theta_E - theta`` after ``epochs`` of minibatch SGD (step ``lr``,
            batches of ``batch_size``) with minibatch order from ``torch.Generator`` seeded by
            ``seed`` (pass ``(run seed, round, partition)``).
    """
    set_flat_parameters(model, theta)
    xt = torch.as_tensor(x, dtype=torch.float64)
    yt = torch.as_tensor(y, dtype=torch.int64)
    if kind == "gradient":
        return _mean_gradient(model, xt, yt)
    if kind != "local":
        raise ValueError(f"update={kind!r}; expected 'gradient' or 'local'")
    gen = torch.Generator().manual_seed(int(np.random.default_rng(list(seed)).integers(2**62)))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(epochs):
        order = torch.randperm(len(yt), generator=gen)
        for start in range(0, len(yt), batch_size):
            idx = order[start : start + batch_size]
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(xt[idx]), yt[idx]).backward()
            opt.step()
    return flat_parameters(model) - theta


@torch.no_grad()
def evaluate(
    model: nn.Module, theta: np.ndarray, x: np.ndarray, y: np.ndarray
) -> tuple[float, float]:
    """``(mean cross-entropy, accuracy)`` of parameters ``theta`` on ``(x, y)``."""
    set_flat_parameters(model, theta)
    logits = model(torch.as_tensor(x, dtype=torch.float64))
    yt = torch.as_tensor(y, dtype=torch.int64)
    loss = float(nn.functional.cross_entropy(logits, yt))
    acc = float((logits.argmax(dim=1) == yt).double().mean())
    return loss, acc


@torch.no_grad()
def evaluate_classes(
    model: nn.Module, theta: np.ndarray, x: np.ndarray, y: np.ndarray, num_classes: int
) -> tuple[float, float, list[float]]:
    """``(mean cross-entropy, accuracy, recall of each class)`` of parameters ``theta`` on
    ``(x, y)``: a class's recall is the fraction of its examples predicted as it (``nan`` for a
    class with no example in ``y``)."""
    labels = np.asarray(y, dtype=np.int64)
    bad = labels[(labels < 0) | (labels >= num_classes)]
    if bad.size:
        raise ValueError(f"label {int(bad[0])} is outside the {num_classes} classes "
                         f"(expected 0 to {num_classes - 1})")
    set_flat_parameters(model, theta)
    logits = model(torch.as_tensor(x, dtype=torch.float64))
    if logits.shape[1] != num_classes:
        raise ValueError(f"num_classes={num_classes} but the model gives {logits.shape[1]} "
                         "logits per example")
    yt = torch.as_tensor(labels, dtype=torch.int64)
    loss = float(nn.functional.cross_entropy(logits, yt))
    hit = (logits.argmax(dim=1) == yt).numpy()
    total = np.bincount(labels, minlength=num_classes).astype(np.float64)
    right = np.bincount(labels[hit], minlength=num_classes).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        recall = np.where(total > 0, right / np.where(total > 0, total, 1.0), np.nan)
    return loss, float(hit.mean()), [float(r) for r in recall]


def dp_sgd_update(
    model: nn.Module,
    theta: np.ndarray,
    x: np.ndarray,
    y: np.ndarray,
    *,
    kind: str,
    clip_norm: float,
    noise_multiplier: float,
    data_seed: int,
    noise_seed: int,
    lr: float = 0.1,
    epochs: int = 1,
    batch_size: int = 32,
) -> np.ndarray:
    """Record-level DP partition update with Opacus (Abadi et al. 2016).

    ``gradient``: per-sample gradients (Opacus ``GradSampleModule``) clipped to ``clip_norm``,
    summed, plus ``N(0, (noise_multiplier * clip_norm)^2)`` drawn in float64 from a PCG64
    generator seeded by ``noise_seed``, divided by the partition size (one full-batch DP-SGD step,
    sample rate 1). ``local``: ``epochs`` of DP-SGD with Opacus' ``DPOptimizer`` and Poisson
    ``DPDataLoader`` (sample rate ``1/len(loader)``), both driven by torch generators seeded from
    ``data_seed`` / ``noise_seed``, so every replica of the partition computes the same delta.
    """
    import copy

    from opacus import GradSampleModule
    from opacus.data_loader import DPDataLoader
    from opacus.optimizers import DPOptimizer
    from torch.utils.data import DataLoader, TensorDataset

    net = copy.deepcopy(model)
    set_flat_parameters(net, theta)
    xt = torch.as_tensor(x, dtype=torch.float64)
    yt = torch.as_tensor(y, dtype=torch.int64)
    gsm = GradSampleModule(net)
    params = [p for p in gsm.parameters() if p.requires_grad]
    if kind == "gradient":
        # mean-reduced, as GradSampleModule assumes (it scales grad_sample by the batch size):
        # grad_sample then holds each example's own gradient, which is what gets clipped
        loss = nn.functional.cross_entropy(gsm(xt), yt)
        loss.backward()
        zero_non_finite_samples(params)
        per_sample = torch.cat([p.grad_sample.reshape(len(yt), -1) for p in params], dim=1)
        norms = per_sample.norm(dim=1, keepdim=True)
        factor = torch.clamp(clip_norm / (norms + 1e-12), max=1.0)
        total = (per_sample * factor).sum(dim=0).detach().numpy()
        gen = np.random.Generator(np.random.PCG64(noise_seed))
        total = total + noise_multiplier * clip_norm * gen.standard_normal(total.size)
        gsm._close()
        return total / len(yt)
    if kind != "local":
        raise ValueError(f"update={kind!r}; expected 'gradient' or 'local'")
    data_gen = torch.Generator().manual_seed(int(data_seed % 2**63))
    noise_gen = torch.Generator().manual_seed(int(noise_seed % 2**63))
    base = DataLoader(TensorDataset(xt, yt), batch_size=batch_size)
    loader = DPDataLoader.from_data_loader(base, generator=data_gen)
    opt = DPOptimizer(
        torch.optim.SGD(params, lr=lr),
        noise_multiplier=noise_multiplier,
        max_grad_norm=clip_norm,
        expected_batch_size=batch_size,
        generator=noise_gen,
    )
    for _ in range(epochs):
        for xb, yb in loader:
            opt.zero_grad(set_to_none=True)
            # an empty Poisson batch is a step too: its backward gives Opacus empty per-sample
            # gradients, so the step adds only the noise, as DP-SGD defines it
            nn.functional.cross_entropy(gsm(xb), yb).backward()
            zero_non_finite_samples(params)
            opt.step()
    gsm._close()
    return flat_parameters(net) - theta


def zero_non_finite_samples(params: Sequence[torch.nn.Parameter]) -> None:
    """Set to zero, in place, every example's per-sample gradient (Opacus ``grad_sample``)
    that has a non-finite entry in any parameter, before DP-SGD clips them: zero is within the
    clip norm, while a NaN would pass through the clipping and the noise, and a server choosing
    a model on which one record's gradient overflows would read its membership exactly."""
    samples = [p.grad_sample for p in params
               if isinstance(getattr(p, "grad_sample", None), torch.Tensor)]
    if not samples or samples[0].shape[0] == 0:  # an empty Poisson batch: nothing to clip
        return
    finite = torch.stack([torch.isfinite(g.reshape(g.shape[0], -1)).all(dim=1)
                          for g in samples]).all(dim=0)
    if bool(finite.all()):
        return
    for g in samples:
        g[~finite] = 0.0


def dp_sgd_steps(size: int, *, kind: str, epochs: int, batch_size: int) -> tuple[float, int]:
    """``(sample_rate, steps per round)`` of :func:`dp_sgd_update` on a partition of ``size``."""
    if kind == "gradient":
        return 1.0, 1
    batches = -(-size // batch_size)
    return 1.0 / batches, epochs * batches
