"""Device traces in FedScale's format: per-device speed, bandwidth and availability (no Flower).

FedScale (Lai, Dai, Zhu, Madhyastha, Chowdhury, "FedScale: Benchmarking Model and System
Performance of Federated Learning at Scale", ICML 2022, https://arxiv.org/abs/2105.11367)
describes a federation's devices with two pickled dicts:

* ``client_device_capacity``: ``{client_id: {"computation": ms_per_sample,
  "communication": kbps}}``: a device's inference latency per sample (milliseconds) and its
  network bandwidth (kilobits per second);
* ``client_behave_trace``: ``{client_id: {"active": [t, ...], "inactive": [t, ...],
  "finish_time": T, ...}}``: the device is available from ``active[i]`` to ``inactive[i]``
  seconds into a cycle of ``T`` seconds that repeats (time ``t`` is read as ``t mod T``).

A device's time for a task (as FedScale charges it) is compute plus upload::

    compute_s = compute_factor * samples * ms_per_sample / 1000     (compute_factor = 3:
                the forward pass is the measured inference, backward about twice that)
    upload_s  = model_bytes * 8 / 1000 / kbps

and a device that is off at the task's start, or goes off before it finishes, never replies
(infinite delay: a straggler for that round). The server hears of it
:data:`UNAVAILABLE_NOTICE_S` seconds after the device went off
(:meth:`DeviceTrace.unavailable_notice`): a round that waits for every reply ends then.

:func:`generate_fedscale` draws such dicts from a stated, seeded fit (:data:`FIT`), so runs need
no data files; :func:`load_fedscale` reads FedScale's own pickles when a user has them.
"""

from __future__ import annotations

import bisect
import math
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "BEHAVE_FILE",
    "CAPACITY_FILE",
    "FIT",
    "UNAVAILABLE_NOTICE_S",
    "DeviceTrace",
    "generate_fedscale",
    "load_fedscale",
    "save_fedscale",
]

#: FedScale's file names for the two pickles.
CAPACITY_FILE = "client_device_capacity"
BEHAVE_FILE = "client_behave_trace"

#: Seconds from a device going off until the server hears that its client will not reply:
#: Flower's SuperLink answers a message to a node with an error (``NODE_UNAVAILABLE``) once
#: the node has missed its heartbeats for ``HEARTBEAT_PATIENCE`` (2) times its interval
#: (``HEARTBEAT_DEFAULT_INTERVAL``, 30 s): the latest it can hear of it.
UNAVAILABLE_NOTICE_S = 60.0

#: A time this fraction of itself (or of the cycle) before a period's start reads as that
#: start: a clock's ``now + back_on(now)`` lands on it up to floating-point rounding.
_SNAP = 1e-12

#: The generator's fit (all log-normals given by their median and the sigma of the log).
#:
#: * ``computation`` (ms per sample): median 50, sigma 0.6. The sigma is FedScale's own default
#:   spread of device speed (``tail_skew=0.6`` of its log-normal completion-time option, after
#:   the PAPAYA production measurements); the median puts a small CNN's 3x-inference training
#:   at ~0.15 s per sample, and FedScale's published example entry (162 ms) at the 97th
#:   percentile, a slow phone.
#: * ``communication`` (kbps): median 5,000, sigma 1.0: mobile uplinks spread over about an
#:   order of magnitude either side (the example entry, 5,648 kbps, sits at the median).
#: * availability: alternating on/off periods with exponential lengths, mean on 1,200 s and
#:   mean off 300 s (each device on 80% of the time, so about a fifth of the federation is off
#:   at any moment: the main job's "a fifth of the clients are stragglers" regime), over a
#:   cycle of ``finish_time`` = 86,400 s (one day) that then repeats, every device starting
#:   at a uniformly random phase of its on/off process.
#:
#: These are chosen values, stated so that a reader can judge them; they are not fitted to
#: FedScale's data files (which this project does not ship).
FIT: dict[str, float] = {
    "computation_median_ms": 50.0,
    "computation_sigma": 0.6,
    "communication_median_kbps": 5000.0,
    "communication_sigma": 1.0,
    "mean_on_s": 1200.0,
    "mean_off_s": 300.0,
    "finish_time_s": 86400.0,
}


def generate_fedscale(
    num_clients: int, seed: int, fit: Mapping[str, float] | None = None
) -> tuple[dict[int, dict[str, float]], dict[int, dict[str, Any]]]:
    """``(client_device_capacity, client_behave_trace)`` for clients ``1..num_clients`` drawn
    from :data:`FIT` (or ``fit``), reproducible from ``seed``.

    Device ``c`` draws from a generator seeded by ``(seed, c)``, so the first devices are the
    same whatever ``num_clients`` is.
    """
    if isinstance(num_clients, bool) or not isinstance(num_clients, (int, np.integer)) \
            or num_clients < 1:
        raise ValueError(f"num_clients={num_clients!r} must be a positive integer")
    p = {**FIT, **(fit or {})}
    capacity: dict[int, dict[str, float]] = {}
    behave: dict[int, dict[str, Any]] = {}
    horizon = float(p["finish_time_s"])
    for c in range(1, int(num_clients) + 1):
        rng = np.random.default_rng([int(seed), c])
        z_compute, z_network = rng.standard_normal(2)
        capacity[c] = {
            "computation": round(float(p["computation_median_ms"]
                                       * math.exp(p["computation_sigma"] * z_compute)), 3),
            "communication": round(float(p["communication_median_kbps"]
                                         * math.exp(p["communication_sigma"] * z_network)), 3),
        }
        on = rng.random() < p["mean_on_s"] / (p["mean_on_s"] + p["mean_off_s"])
        t = 0.0
        active: list[float] = []
        inactive: list[float] = []
        # a random phase: the first period is a residual (memoryless) period of its kind
        while t < horizon:
            length = rng.exponential(p["mean_on_s"] if on else p["mean_off_s"])
            end = min(t + length, horizon)
            if on:
                active.append(round(t, 1))
                inactive.append(round(end, 1))
            t, on = end, not on
        behave[c] = {"active": active, "inactive": inactive, "finish_time": horizon}
    return capacity, behave


def _check(capacity: Any, behave: Any, where: str) -> None:
    if not isinstance(capacity, Mapping) or not capacity:
        raise ValueError(f"{where}: {CAPACITY_FILE} must be a non-empty dict "
                         "{client_id: {'computation': ms_per_sample, 'communication': kbps}}")
    for cid, entry in capacity.items():
        ok = isinstance(entry, Mapping) and all(
            isinstance(entry.get(k), (int, float)) and math.isfinite(entry[k]) and entry[k] > 0
            for k in ("computation", "communication"))
        if not ok:
            raise ValueError(f"{where}: client {cid!r} of {CAPACITY_FILE} needs positive "
                             f"'computation' (ms/sample) and 'communication' (kbps); got {entry!r}")
    if behave is None:
        return
    if not isinstance(behave, Mapping):
        raise ValueError(f"{where}: {BEHAVE_FILE} must be a dict {{client_id: {{'active': [...], "
                         "'inactive': [...], 'finish_time': T}}}}")
    for cid, entry in behave.items():
        ok = (isinstance(entry, Mapping) and "finish_time" in entry
              and len(entry.get("active", ())) == len(entry.get("inactive", ()))
              and float(entry["finish_time"]) > 0)
        if not ok:
            raise ValueError(f"{where}: client {cid!r} of {BEHAVE_FILE} needs 'active' and "
                             "'inactive' lists of equal length and a positive 'finish_time'")


def save_fedscale(directory: str | Path, capacity: Mapping, behave: Mapping | None) -> Path:
    """Write the dicts as FedScale's two pickles (:data:`CAPACITY_FILE`, :data:`BEHAVE_FILE`)
    into ``directory``; returns it."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / CAPACITY_FILE, "wb") as fh:
        pickle.dump(dict(capacity), fh, protocol=4)
    if behave is not None:
        with open(out / BEHAVE_FILE, "wb") as fh:
            pickle.dump(dict(behave), fh, protocol=4)
    return out


def load_fedscale(path: str | Path) -> tuple[dict, dict | None]:
    """``(capacity, behave)`` from FedScale's pickles: ``path`` is a directory holding
    :data:`CAPACITY_FILE` (and, optionally, :data:`BEHAVE_FILE`: without it every device is
    always available), or the capacity pickle itself (its behaviour file read from the same
    directory if there). Pickles run code when loaded: load only files you trust."""
    p = Path(path).expanduser()
    capacity_path = p / CAPACITY_FILE if p.is_dir() else p
    if not capacity_path.is_file():
        raise ValueError(f"no FedScale device file at {capacity_path}: give a directory holding "
                         f"{CAPACITY_FILE!r} (and optionally {BEHAVE_FILE!r}) or that file")
    behave_path = capacity_path.parent / BEHAVE_FILE
    with open(capacity_path, "rb") as fh:
        capacity = pickle.load(fh)
    behave = None
    if behave_path.is_file():
        with open(behave_path, "rb") as fh:
            behave = pickle.load(fh)
    _check(capacity, behave, str(p))
    return capacity, behave


class DeviceTrace:
    """Latency model replaying FedScale-format devices (see the module docstring).

    Client ``w`` is device ``ids[w mod D]`` (``ids``: the capacity dict's keys, sorted). A
    task starts at ``start_s`` seconds on the device's availability cycle: the virtual time
    at which the round (or an asynchronous job) starts, when the caller keeps a clock, so
    that every method's clients see the devices go on and off at the same times; without
    one (``start_s=None``: drawing rounds for the order-statistic theory), round ``r``
    starts at ``r * round_s``. A task of load ``L`` processes ``L * samples_per_load``
    samples and uploads ``model_bytes``, taking :meth:`duration` seconds; if the device is off
    at the start or goes off before the end, the delay is ``inf`` (it never replies), and the
    server hears so ``notice_s`` seconds after the device went off
    (:meth:`unavailable_notice`); :meth:`back_on` says when it can take work again. Devices
    missing from the behaviour dict (or no behaviour dict) are always available.
    """

    load_scaled = True

    def __init__(
        self,
        capacity: Mapping[Any, Mapping[str, float]],
        behave: Mapping[Any, Mapping[str, Any]] | None = None,
        *,
        samples_per_load: float = 1.0,
        model_bytes: float = 0.0,
        round_s: float = 60.0,
        compute_factor: float = 3.0,
        notice_s: float = UNAVAILABLE_NOTICE_S,
        name: str = "fedscale",
    ) -> None:
        _check(capacity, behave, name)
        for label, value in (("samples_per_load", samples_per_load),
                             ("model_bytes", model_bytes), ("round_s", round_s),
                             ("compute_factor", compute_factor), ("notice_s", notice_s)):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{label}={value!r} must be a finite number >= 0")
        self.ids = sorted(capacity)
        self.ms_per_sample = np.array([float(capacity[c]["computation"]) for c in self.ids])
        self.kbps = np.array([float(capacity[c]["communication"]) for c in self.ids])
        self.behave = {c: behave[c] for c in self.ids if behave is not None and c in behave}
        self.samples_per_load = float(samples_per_load)
        self.model_bytes = float(model_bytes)
        self.round_s = float(round_s)
        self.compute_factor = float(compute_factor)
        self.notice_s = float(notice_s)
        self.name = name

    def __repr__(self) -> str:
        return (f"DeviceTrace({self.name!r}, devices={len(self.ids)}, samples_per_load="
                f"{self.samples_per_load:g}, model_bytes={self.model_bytes:g}, "
                f"round_s={self.round_s:g})")

    def duration(self, worker: int, load: float = 1.0) -> float:
        """Compute plus upload seconds of client ``worker`` at ``load`` (ignoring availability)."""
        d = worker % len(self.ids)
        compute = self.compute_factor * load * self.samples_per_load * self.ms_per_sample[d] / 1e3
        upload = self.model_bytes * 8.0 / 1e3 / self.kbps[d]
        return float(compute + upload)

    def available(self, worker: int, start: float, length: float) -> bool:
        """Whether client ``worker``'s device is on throughout ``[start, start + length]``
        (cycle time: ``start mod finish_time``)."""
        return self.goes_off(worker, start, length) == math.inf

    def goes_off(self, worker: int, start: float, length: float) -> float:
        """Seconds from ``start`` until client ``worker``'s device goes off, if it does before
        ``start + length``: ``<= 0`` when it is off at ``start`` (since when), ``inf`` when it
        stays on throughout (as :meth:`available` reads the cycle)."""
        trace = self.behave.get(self.ids[worker % len(self.ids)])
        if trace is None:
            return math.inf
        finish = float(trace["finish_time"])
        active, inactive = trace["active"], trace["inactive"]
        t = start % finish
        i = bisect.bisect_right(active, t + _SNAP * max(finish, abs(start))) - 1
        if i >= 0 and t < float(active[i]):  # a rounding error before a period's start
            t = float(active[i])
        if i >= 0 and t <= float(inactive[i]):  # on at the start
            end = float(inactive[i])
            return end - t if t + length > end else math.inf
        if i >= 0:  # off since this period's end
            return float(inactive[i]) - t
        # before the cycle's first period: off since the previous cycle's last one ended
        return (float(inactive[-1]) - finish - t) if len(inactive) else -math.inf

    def cycle_time(self, round_index: int, start_s: float | None = None) -> float:
        """Where a task starts on the availability cycle: ``start_s`` (a clock's time) when
        given, else ``round_index * round_s``."""
        if start_s is None:
            return round_index * self.round_s
        if not math.isfinite(start_s) or start_s < 0:
            raise ValueError(f"start_s={start_s!r} must be a finite time >= 0")
        return float(start_s)

    def unavailable_notice(self, worker: int, round_index: int, load: float = 1.0,
                           start_s: float | None = None) -> float:
        """Seconds from the task's start (:meth:`cycle_time`) until the server hears that
        client ``worker`` will not reply (its device goes off, or is off): ``notice_s`` after
        the device went off, at once if that was earlier; ``inf`` when the client replies."""
        off = self.goes_off(worker, self.cycle_time(round_index, start_s),
                            self.duration(worker, load))
        return math.inf if off == math.inf else max(0.0, off + self.notice_s)

    def time(self, worker: int, round_index: int, load: float = 1.0,
             start_s: float | None = None) -> float:
        """The delay of client ``worker``'s task of round ``round_index`` starting at
        :meth:`cycle_time` (``inf`` when off)."""
        length = self.duration(worker, load)
        start = self.cycle_time(round_index, start_s)
        return length if self.available(worker, start, length) else math.inf

    def back_on(self, worker: int, at_s: float) -> float:
        """Seconds from cycle time ``at_s`` until client ``worker``'s device is on (0 when it
        is on then; the next period's start, in this cycle or the next; ``inf`` for a device
        with no period on)."""
        trace = self.behave.get(self.ids[worker % len(self.ids)])
        if trace is None:
            return 0.0
        if not len(trace["active"]):  # never on
            return math.inf
        if self.goes_off(worker, at_s, 0.0) > 0:
            return 0.0
        finish = float(trace["finish_time"])
        t = at_s % finish
        starts = [float(a) for a in trace["active"]]
        i = bisect.bisect_right(starts, t)
        return starts[i] - t if i < len(starts) else finish - t + starts[0]

    def sample(self, size, rng: np.random.Generator, load: float = 1.0) -> np.ndarray:
        """Rows of a random round each (clients ``0..n-1`` along the last axis)."""
        shape = (size,) if isinstance(size, int) else tuple(size)
        rounds = rng.integers(0, 2**31, size=shape[:-1])
        out = np.empty(shape)
        for idx in np.ndindex(*shape[:-1]):
            r = int(rounds[idx])
            out[idx] = [self.time(w, r, load) for w in range(shape[-1])]
        return out


if __name__ == "__main__":  # regenerate the bundled trace: python -m fl_gradcode.devices
    target = Path(__file__).parent / "traces" / "fedscale-generated"
    save_fedscale(target, *generate_fedscale(100, seed=0))
    print(f"wrote {target}")
