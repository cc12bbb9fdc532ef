"""Straggler latency models and the order statistics that set a round's length (no Flower import).

A round that waits for the ``k``-th of ``n`` replies lasts the ``k``-th order statistic
``T_(k:n)`` of the clients' times. Whether coding pays depends on how a client's time scales with
its load ``L`` (the fraction of the data it computes): gradient coding raises ``L`` from ``1/n``
to ``(s+1)/n``, MDS-coded matrix multiplication only to ``1/k``.

Every model here has ``sample(size, rng, load)`` and a ``load_scaled`` flag: a load-scaled
model's whole time is multiplied by ``load`` (compute-bound clients, Lee et al.'s
shifted exponential ``T = L (shift + Exp(rate))``); a load-independent model ignores it
(delays that do not shrink with the work, e.g. network or queueing).

References:
    Lee, Lam, Pedarsani, Papailiopoulos, Ramchandran, "Speeding Up Distributed Machine Learning
    Using Codes", IEEE T-IT 2018, https://arxiv.org/abs/1512.02673 (shifted-exponential model,
    MDS speedup ``Theta(log n)``).
    David, Nagaraja, "Order Statistics", 3rd ed., Wiley 2003 (exponential and Pareto order
    statistics).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol

import numpy as np
from scipy.special import gammaln

from .devices import DeviceTrace, generate_fedscale, load_fedscale

__all__ = [
    "LATENCY_MODELS",
    "LATENCY_PARAMETERS",
    "SCHEMES",
    "Bimodal",
    "DeviceTrace",
    "Exponential",
    "LatencyModel",
    "NoLatency",
    "Pareto",
    "PersistentSlow",
    "ShiftedExponential",
    "TraceReplay",
    "back_on",
    "client_delay",
    "client_times",
    "expected_coded_round_time",
    "expected_round_time",
    "failure_notice",
    "harmonic",
    "make_latency",
    "optimal_s",
    "persistent_seed",
    "persistent_slow",
    "round_times",
]


def harmonic(n: int) -> float:
    """``H_n = sum_{i=1}^n 1/i`` (``H_0 = 0``)."""
    return float(np.sum(1.0 / np.arange(1, n + 1))) if n > 0 else 0.0


def _positive(value: float, name: str) -> float:
    if not (isinstance(value, (int, float, np.floating)) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name}={value!r} must be a positive finite number")
    return float(value)


class LatencyModel(Protocol):
    """What the simulator and the theory need from a latency model."""

    load_scaled: bool

    def sample(
        self, size: int | tuple[int, ...], rng: np.random.Generator, load: float = 1.0
    ) -> np.ndarray: ...


@dataclass(frozen=True)
class Exponential:
    """``T ~ Exp(rate)`` (mean ``1/rate``), times ``load`` if ``load_scaled``."""

    rate: float = 1.0
    load_scaled: bool = False

    def __post_init__(self) -> None:
        _positive(self.rate, "rate")

    def sample(self, size, rng: np.random.Generator, load: float = 1.0) -> np.ndarray:
        t = rng.exponential(1.0 / self.rate, size=size)
        return t * load if self.load_scaled else t


@dataclass(frozen=True)
class ShiftedExponential:
    """``T = shift + Exp(rate)``, all of it times ``load`` when ``load_scaled`` (the default):
    a client with load ``L`` takes ``L * (shift + Exp(rate))`` (Lee et al. 2018)."""

    shift: float = 1.0
    rate: float = 1.0
    load_scaled: bool = True

    def __post_init__(self) -> None:
        _positive(self.shift, "shift")
        _positive(self.rate, "rate")

    def sample(self, size, rng: np.random.Generator, load: float = 1.0) -> np.ndarray:
        t = self.shift + rng.exponential(1.0 / self.rate, size=size)
        return t * load if self.load_scaled else t


@dataclass(frozen=True)
class Pareto:
    """Heavy-tailed ``T ~ Pareto(scale, shape)``: ``P(T > t) = (scale/t)^shape`` for t >= scale."""

    scale: float = 1.0
    shape: float = 2.0
    load_scaled: bool = False

    def __post_init__(self) -> None:
        _positive(self.scale, "scale")
        _positive(self.shape, "shape")

    def sample(self, size, rng: np.random.Generator, load: float = 1.0) -> np.ndarray:
        t = self.scale * (1.0 + rng.pareto(self.shape, size=size))
        return t * load if self.load_scaled else t


@dataclass(frozen=True)
class _SlowFraction:
    """A base model some of whose clients are slowed by ``slowdown`` (fraction ``p``)."""

    base: ShiftedExponential | Exponential | Pareto = ShiftedExponential()
    p: float = 0.1
    slowdown: float = 10.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.p <= 1.0:
            raise ValueError(f"p={self.p!r} must be a probability in [0, 1]")
        _positive(self.slowdown, "slowdown")

    @property
    def load_scaled(self) -> bool:
        return self.base.load_scaled


@dataclass(frozen=True)
class Bimodal(_SlowFraction):
    """Each client is slow with probability ``p``: its time from ``base`` is multiplied by
    ``slowdown`` (transient straggling, redrawn every round)."""

    p: float = 0.05

    def sample(self, size, rng: np.random.Generator, load: float = 1.0) -> np.ndarray:
        t = self.base.sample(size, rng, load)
        slow = rng.random(size=np.shape(t)) < self.p
        return np.where(slow, t * self.slowdown, t)


def expected_round_time(
    model: LatencyModel,
    n: int,
    wait_for: int,
    load: float = 1.0,
    *,
    samples: int = 20000,
    seed: int = 0,
) -> float:
    """``E[T_(wait_for : n)]``: the expected time of the ``wait_for``-th of ``n`` iid arrivals.

    Closed forms: exponential ``(H_n - H_{n-k})/rate``; shifted exponential
    ``shift + (H_n - H_{n-k})/rate``; Pareto
    ``scale * Gamma(n+1) Gamma(n-k+1-1/shape) / (Gamma(n-k+1) Gamma(n+1-1/shape))``
    (``inf`` when ``shape (n-k+1) <= 1``); each times ``load`` when the model is load-scaled.
    Other models fall back to Monte Carlo with ``samples`` rounds (seeded).
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n={n!r} must be a positive integer")
    if isinstance(wait_for, bool) or not isinstance(wait_for, (int, np.integer)):
        raise ValueError(f"wait_for={wait_for!r} must be an integer")
    if not 1 <= wait_for <= n:
        raise ValueError(f"wait_for={wait_for} must satisfy 1 <= wait_for <= n={n}")
    load = _positive(load, "load")
    k = int(wait_for)
    one_regime(model)
    factor = load if model.load_scaled else 1.0
    if isinstance(model, Exponential):
        return factor * (harmonic(n) - harmonic(n - k)) / model.rate
    if isinstance(model, ShiftedExponential):
        return factor * (model.shift + (harmonic(n) - harmonic(n - k)) / model.rate)
    if isinstance(model, Pareto):
        a = model.shape
        if a * (n - k + 1) <= 1:
            return math.inf
        j = n - k + 1
        log = gammaln(n + 1) + gammaln(j - 1 / a) - gammaln(j) - gammaln(n + 1 - 1 / a)
        return factor * model.scale * math.exp(log)
    rng = np.random.default_rng(seed)
    times = np.sort(model.sample((samples, n), rng, load), axis=1)
    return float(np.mean(times[:, k - 1]))


@dataclass(frozen=True)
class NoLatency:
    """Every client replies at once (only the measured compute time counts)."""

    load_scaled: bool = False

    def sample(self, size, rng: np.random.Generator, load: float = 1.0) -> np.ndarray:
        return np.zeros(size)


@dataclass(frozen=True)
class PersistentSlow(_SlowFraction):
    """A fixed set of clients is slow in every round (heterogeneous hardware).

    Client ``w`` is slow iff a draw seeded by ``(seed, w)`` falls below ``p``, or ``w`` is
    listed in ``slow``; a slow client's time from ``base`` is multiplied by ``slowdown``.
    """

    slow: tuple[int, ...] = ()
    seed: int = 0

    def is_slow(self, worker: int) -> bool:
        if worker in self.slow:
            return True
        return bool(np.random.default_rng([self.seed, worker, 7]).random() < self.p)

    def sample(self, size, rng: np.random.Generator, load: float = 1.0) -> np.ndarray:
        """Rows of clients ``0..n-1`` (the last axis): column ``w`` is slowed iff
        :meth:`is_slow` ``(w)``, in every row."""
        t = self.base.sample(size, rng, load)
        n = np.shape(t)[-1]
        slow = np.array([self.is_slow(w) for w in range(n)])
        return np.where(slow, t * self.slowdown, t)


def persistent_seed(latency_seed: int, seed: int) -> int:
    """The seed that picks a federation's persistently slow clients: ``latency_seed``
    (run-config ``latency-seed``), or the run's ``seed`` when it is negative."""
    return int(seed) if int(latency_seed) < 0 else int(latency_seed)


@lru_cache(maxsize=64)
def persistent_slow(p: float, latency_seed: int, seed: int, n: int) -> tuple[int, ...]:
    """The clients among ``0..n-1`` that ``latency=persistent`` (:class:`PersistentSlow`,
    fraction ``p``, picked by :func:`persistent_seed`) slows in every round (drawn once per
    process: every client's train call asks)."""
    model = PersistentSlow(p=float(p), seed=persistent_seed(latency_seed, seed))
    return tuple(w for w in range(int(n)) if model.is_slow(w))


class TraceReplay:
    """Replay measured per-worker reply times: client ``w`` in round ``r`` takes the time of
    trace worker ``w mod W`` in trace round ``r mod R``, times ``load`` if ``load_scaled``.

    The bundled traces (``fl_gradcode/traces/*.csv``, columns ``round, worker, arrival_s``) are
    AWS Lambda delay profiles for 256 workers from Krishnan, Ebrahimi, Khisti, "Sequential
    Gradient Coding for Straggler Mitigation", ICLR 2023 (``mamaj/Sequential-Gradient-Coding-2``).
    """

    def __init__(self, name_or_path: str, *, load_scaled: bool = False) -> None:
        from pathlib import Path

        path = Path(name_or_path)
        if not path.suffix:
            path = Path(__file__).parent / "traces" / f"{name_or_path}.csv"
        if not path.is_file():
            available = sorted(p.stem for p in (Path(__file__).parent / "traces").glob("*.csv"))
            raise ValueError(f"trace {name_or_path!r} not found; bundled traces: {available}")
        data = np.loadtxt(path, delimiter=",", skiprows=1)
        rounds = data[:, 0].astype(int)
        workers = data[:, 1].astype(int)
        table = np.full((rounds.max() + 1, workers.max() + 1), np.nan)
        table[rounds, workers] = data[:, 2]
        if np.isnan(table).any():
            raise ValueError(f"trace {path} does not give every (round, worker) a time")
        self.name = path.stem
        self.table = table
        self.load_scaled = load_scaled

    def time(self, worker: int, round_index: int, load: float = 1.0) -> float:
        R, W = self.table.shape
        t = float(self.table[round_index % R, worker % W])
        return t * load if self.load_scaled else t

    def sample(self, size, rng: np.random.Generator, load: float = 1.0) -> np.ndarray:
        """Rows of the trace in random order (a random round, workers in trace order)."""
        shape = (size,) if isinstance(size, int) else tuple(size)
        n = shape[-1]
        rows = rng.integers(0, self.table.shape[0], size=shape[:-1])
        t = self.table[rows][..., np.arange(n) % self.table.shape[1]]
        return t * load if self.load_scaled else t


@dataclass(frozen=True)
class Drift:
    """A latency regime that changes at round ``at_round`` (``before`` until then, ``after``
    from then on): e.g. heavy-tailed Pareto delays giving way to load-scaled straggling."""

    before: LatencyModel
    after: LatencyModel
    at_round: int

    def at(self, round_index: int) -> LatencyModel:
        return self.before if round_index < self.at_round else self.after

    def sample(self, size, rng: np.random.Generator, load: float = 1.0) -> np.ndarray:
        return self.before.sample(size, rng, load)


def one_regime(model: LatencyModel) -> None:
    """Refuse a :class:`Drift` where one round's distribution is asked for: its rounds follow
    two regimes (``sample`` draws the first, as a prior for the run's start)."""
    if isinstance(model, Drift):
        raise ValueError(
            f"latency drift changes regime at round {model.at_round}: a round time of one "
            "distribution is not defined; ask for each regime (its .before, its .after)")


def client_delay(
    model: LatencyModel, *, worker: int, round_index: int, load: float, seed: int,
    start_s: float | None = None, regime_round: int | None = None,
) -> float:
    """The delay of one client in one round, reproducible from ``(seed, round, worker)``.

    Every replica and every rerun with the same seed sees the same delay; persistent models
    keep the same clients slow in every round; traces are replayed by (round, worker);
    FedScale-format devices (:class:`DeviceTrace`) give ``inf`` while off, read at clock time
    ``start_s`` (the round's or the job's start; ``None``: ``round_index`` times their
    ``round_s``). ``regime_round``: the round whose regime a :class:`Drift` applies (default
    ``round_index``; an asynchronous run's draw of a client's ``j``-th job is round ``j``'s,
    while the federation is in another round).
    """
    if isinstance(model, Drift):
        model = model.at(round_index if regime_round is None else regime_round)
    if isinstance(model, DeviceTrace):
        return model.time(worker, round_index, load, start_s=start_s)
    if isinstance(model, TraceReplay):
        return model.time(worker, round_index, load)
    rng = np.random.default_rng([seed, round_index, worker])
    if isinstance(model, PersistentSlow):
        t = float(model.base.sample(1, rng, load)[0])
        return t * model.slowdown if model.is_slow(worker) else t
    return float(model.sample(1, rng, load)[0])


def failure_notice(
    model: LatencyModel, *, worker: int, round_index: int, load: float, seed: int,
    start_s: float | None = None, regime_round: int | None = None,
) -> float:
    """Seconds from a round's start until the server hears that a client whose delay is
    ``inf`` will never reply: what the model's ``unavailable_notice(worker, round_index,
    load)`` says (``inf`` when the client replies; FedScale-format devices: a minute after the
    device went off, as Flower's SuperLink reports a node that missed its heartbeats);
    ``inf`` when the model has no such notice (a reply that never comes is then waited for
    until a deadline). ``seed`` and ``start_s``: as :func:`client_delay`'s (no model with a
    notice draws; ``regime_round`` as :func:`client_delay`'s)."""
    if isinstance(model, Drift):
        model = model.at(round_index if regime_round is None else regime_round)
    if isinstance(model, DeviceTrace):
        return float(model.unavailable_notice(worker, round_index, load, start_s=start_s))
    notice = getattr(model, "unavailable_notice", None)
    return math.inf if notice is None else float(notice(worker, round_index, load))


def back_on(model: LatencyModel, *, worker: int, at_s: float) -> float:
    """Seconds from clock time ``at_s`` until a client the model reported off can take work
    again: when its FedScale-format device (:class:`DeviceTrace`) is on next; 0 for every
    other model (they say nothing of availability over time)."""
    if isinstance(model, DeviceTrace):
        return float(model.back_on(worker, at_s))
    return 0.0


LATENCY_MODELS = (
    "none",
    "exponential",
    "shifted-exponential",
    "pareto",
    "bimodal",
    "persistent",
    "trace",
    "drift",
    "fedscale",
)


#: The :func:`make_latency` arguments each model reads (the others are ignored by it).
LATENCY_PARAMETERS: dict[str, tuple[str, ...]] = {
    "none": (),
    "exponential": ("rate",),
    "shifted-exponential": ("scale", "rate"),
    "pareto": ("scale", "shape"),
    "bimodal": ("scale", "rate", "p", "slowdown"),
    "persistent": ("scale", "rate", "p", "slowdown", "seed"),
    "trace": ("trace",),
    "drift": ("scale", "shape", "rate", "p", "slowdown", "drift_round"),
    "fedscale": ("device_trace", "round_s", "seed"),
}


def make_latency(
    name: str,
    *,
    scale: float = 1.0,
    rate: float = 1.0,
    shape: float = 2.0,
    p: float = 0.1,
    slowdown: float = 10.0,
    trace: str = "canada",
    seed: int = 0,
    drift_round: int = 15,
    device_trace: str = "generated",
    round_s: float = 60.0,
    samples_per_load: float = 1.0,
    model_bytes: float = 0.0,
    num_devices: int = 256,
) -> LatencyModel:
    """Latency model by run-config name (``LATENCY_MODELS``), in seconds per unit of load.

    ``scale`` is the deterministic part (the shift, or the Pareto scale), ``rate`` the rate of
    the exponential part; ``bimodal``/``persistent`` slow a fraction ``p`` by ``slowdown``
    on top of a load-scaled shifted exponential. ``fedscale``: FedScale-format devices
    (:class:`~fl_gradcode.devices.DeviceTrace`): ``device_trace`` is ``"generated"``
    (``num_devices`` drawn by :func:`~fl_gradcode.devices.generate_fedscale` from ``seed``) or
    the path of FedScale's pickles; a task of load ``L`` processes ``L * samples_per_load``
    samples and uploads ``model_bytes``; round ``r`` starts at ``r * round_s`` on the devices'
    availability cycle.
    """
    base = ShiftedExponential(shift=scale, rate=rate)
    models = {
        "none": lambda: NoLatency(),
        "exponential": lambda: Exponential(rate=rate),
        "shifted-exponential": lambda: base,
        "pareto": lambda: Pareto(scale=scale, shape=shape),
        "bimodal": lambda: Bimodal(base=base, p=p, slowdown=slowdown),
        "persistent": lambda: PersistentSlow(base=base, p=p, slowdown=slowdown, seed=seed),
        "trace": lambda: TraceReplay(trace),
        # Pareto(scale, shape) until drift_round, then load-scaled bimodal straggling
        "drift": lambda: Drift(
            Pareto(scale=scale, shape=shape), Bimodal(base=base, p=p, slowdown=slowdown),
            drift_round,
        ),
    }
    if name not in models and name != "fedscale":
        raise ValueError(f"latency={name!r}; expected one of {list(LATENCY_MODELS)}")
    if name == "fedscale":
        if device_trace == "generated":
            capacity, behave = generate_fedscale(num_devices, seed)
        else:
            capacity, behave = load_fedscale(device_trace)
        return DeviceTrace(capacity, behave, samples_per_load=samples_per_load,
                           model_bytes=model_bytes, round_s=round_s, name=device_trace)
    return models[name]()


# ---------------------------------------------------------------------------- round-time theory
SCHEMES = ("uncoded", "ignore-stragglers", "mds", "frc")


def client_times(
    model: LatencyModel,
    n: int,
    load: int,
    *,
    partition_cost: float = 0.0,
    samples: int = 10000,
    rng: np.random.Generator,
) -> np.ndarray:
    """``samples x n`` client times ``partition_cost * load + delay(load)`` (load in partitions,
    so a coded client computing ``s+1`` partitions pays ``s+1`` times the compute; a
    :class:`Drift` draws its first regime)."""
    return partition_cost * load + model.sample((samples, n), rng, float(load))


def round_times(
    model: LatencyModel,
    n: int,
    s: int,
    scheme: str,
    *,
    partition_cost: float = 0.0,
    samples: int = 10000,
    seed: int = 0,
) -> np.ndarray:
    """Monte Carlo round times of a scheme with ``n`` clients tolerating ``s`` stragglers.

    ``uncoded``: load 1, wait for all ``n``. ``ignore-stragglers``: load 1, the fastest
    ``n - s`` (approximate). ``mds``: load ``s+1``, the ``(n-s)``-th arrival (any exact code
    that decodes from any ``n - s``, e.g. ``grouped-rs``, ``crc``). ``frc``: load ``s+1``, the
    first time every group of ``s+1`` has a reply (needs ``(s+1) | n``).
    """
    if scheme not in SCHEMES:
        raise ValueError(f"scheme={scheme!r}; expected one of {SCHEMES}")
    if not 0 <= s < n:
        raise ValueError(f"s={s} must satisfy 0 <= s < n={n}")
    one_regime(model)
    rng = np.random.default_rng(seed)
    load = 1 if scheme in ("uncoded", "ignore-stragglers") else s + 1
    t = client_times(model, n, load, partition_cost=partition_cost, samples=samples, rng=rng)
    if scheme == "uncoded":
        return t.max(axis=1)
    if scheme == "frc":
        if n % (s + 1):
            raise ValueError(f"FRC needs (s+1) | n; got n={n}, s={s}")
        return t.reshape(samples, n // (s + 1), s + 1).min(axis=2).max(axis=1)
    return np.partition(t, n - s - 1, axis=1)[:, n - s - 1]


def expected_coded_round_time(
    model: LatencyModel, n: int, s: int, *, partition_cost: float = 0.0, **mc
) -> float:
    """``E[T]`` of an exact code decoding from any ``n - s`` at load ``s+1`` partitions: closed
    form for (shifted) exponential and Pareto delays without compute cost, else Monte Carlo."""
    closed = isinstance(model, (Exponential, ShiftedExponential, Pareto))
    if closed and partition_cost == 0.0:
        return expected_round_time(model, n, n - s, load=float(s + 1))
    return float(np.mean(round_times(model, n, s, "mds", partition_cost=partition_cost, **mc)))


def optimal_s(
    model: LatencyModel,
    n: int,
    *,
    partition_cost: float = 0.0,
    candidates: list[int] | None = None,
    **mc,
) -> tuple[int, float]:
    """The tolerance ``s`` minimising the expected round time of an exact code (``s = 0`` is
    uncoded), and that time. Coding pays iff the result has ``s > 0``."""
    candidates = list(range(n)) if candidates is None else candidates
    times = [
        expected_coded_round_time(model, n, s, partition_cost=partition_cost, **mc)
        for s in candidates
    ]
    best = int(np.argmin(times))
    return candidates[best], float(times[best])
