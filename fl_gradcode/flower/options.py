"""``GradientCoding``'s options as frozen, self-validating groups.

Each group checks its own fields when it is built (a bad value is named in the error, with the
keyword a user passed); the rules that span groups live in one place,
:meth:`Options.from_keywords`, which maps ``GradientCoding``'s flat keywords onto the groups and
resolves the defaults that depend on other options:

* ``s="auto"``: the code is the nested placement; the fixed ``s`` the wrapper reports is
  ``s_max`` (1 when ``s_max`` is ``None``); ``exclude_slow`` needs it.
* ``busy=None``: ``"queue"`` with ``s="auto"``, ``"skip"`` otherwise; under wallclock timing
  busy members are always skipped (the grid waits for their earlier replies; queueing is not
  implemented there), so ``busy`` resolves to ``"skip"``.
* ``auto_deadline`` needs a prediction of the round's time (``s="auto"`` or ``busy="fit"``)
  and virtual timing, and implies ``stop_late_work`` (a deadline before the work's end is only
  worth it if the work stops there).
* ``code="nested"`` with a fixed ``s`` and ``s_max``: the placement's ``s_max`` enters the
  code's options; ``m`` enters them as ``m``. A ``code_options`` entry that contradicts either
  keyword is refused (it used to win silently over the keyword).
* ``verify=True`` is refused for codes it cannot check
  (:func:`~fl_gradcode.flower.integrity.verify_refusal`).

The groups are plain values in the style of :mod:`fl_gradcode.latency` (frozen dataclasses that
validate themselves); the collaborators of ``GradientCoding`` each take the group they need.
"""

from __future__ import annotations

import math
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from logging import WARNING
from typing import Any

from flwr.common.logger import log

from ..codes import GradientCode
from ..latency import LatencyModel
from ..privacy import DPConfig, PrivacyAccountant, ServerNoise
from .integrity import verify_refusal

__all__ = [
    "AdaptiveOptions",
    "CodeOptions",
    "DeadlineOptions",
    "IntegrityOptions",
    "Options",
    "PrivacyOptions",
    "TimingOptions",
    "WireOptions",
]

TIMINGS = ("virtual", "wallclock")
BUSY_MODES = ("skip", "queue", "fit")
WIRES = ("auto", "model", "float64")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class CodeOptions:
    """Which code every round uses.

    ``code``: a registry name or a ``GradientCode``; ``s``: stragglers tolerated (with
    ``adaptive``, the placement's ``s_max``); ``adaptive``: ``s="auto"``; ``options``: extra
    keyword arguments of ``make_code`` (``m`` and a nested placement's ``s_max`` included).
    """

    code: str | GradientCode = "grouped-rs"
    s: int = 1
    adaptive: bool = False
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.code, (str, GradientCode)):
            raise TypeError(f"code must be a registry name or a GradientCode; got {self.code!r}")
        if isinstance(self.s, bool) or not isinstance(self.s, int) or self.s < 0:
            raise ValueError(f"s={self.s!r} must be an integer >= 0 or 'auto'")
        object.__setattr__(self, "options", dict(self.options))

    @property
    def name(self) -> str:
        """The code's registry name."""
        return self.code if isinstance(self.code, str) else self.code.name


@dataclass(frozen=True)
class AdaptiveOptions:
    """``s="auto"`` (:mod:`fl_gradcode.adaptive`): ``s_max`` the largest tolerance (``None``:
    ``max(1, n // 4)``), ``auto_margin`` the relative slack in predicted round time traded for
    tolerance, ``exclude_slow`` the slowness factor from which a client may be left out of a
    round (``None``: never), ``latency_state`` the file of latency observations that outlives
    the run (read at start, written after every round)."""

    enabled: bool = False
    s_max: int | None = None
    auto_margin: float = 0.1
    exclude_slow: float | None = None
    latency_state: str | None = None

    def __post_init__(self) -> None:
        if self.enabled and self.s_max is not None and (
                isinstance(self.s_max, bool) or not isinstance(self.s_max, int)
                or self.s_max < 1):
            raise ValueError(f"s_max={self.s_max!r} must be an integer >= 1 (or None)")
        if self.enabled and not (_number(self.auto_margin) and 0 <= self.auto_margin < math.inf):
            raise ValueError(f"auto_margin={self.auto_margin!r} must be a number >= 0")
        if self.exclude_slow is not None and self.enabled and not (
                _number(self.exclude_slow) and 1 < self.exclude_slow < math.inf):
            raise ValueError(f"exclude_slow={self.exclude_slow!r} must be a slowness factor > 1 "
                             "(or None: never exclude)")
        object.__setattr__(self, "auto_margin", float(self.auto_margin))
        if self.exclude_slow is not None and self.enabled:
            object.__setattr__(self, "exclude_slow", float(self.exclude_slow))
        if self.latency_state is not None:
            object.__setattr__(self, "latency_state", os.fspath(self.latency_state))


@dataclass(frozen=True)
class TimingOptions:
    """How a round's time is measured: ``mode`` ``"virtual"`` (arrivals from ``latency``, the
    mod's measured compute when ``measured_compute``, ``compute_cost_s`` per unit of load and
    payload bytes over ``upload_bandwidth``) or ``"wallclock"`` (real time); ``busy``: what a
    member still busy with earlier work gets (resolved: never ``None``; always ``"skip"``
    under wallclock); ``stop_late_work``: work stops at the round's deadline (resolved: true
    with ``auto_deadline``)."""

    mode: str = "virtual"
    latency: LatencyModel | None = None
    measured_compute: bool = True
    compute_cost_s: float = 0.0
    upload_bandwidth: float | None = None
    busy: str = "skip"
    stop_late_work: bool = False

    def __post_init__(self) -> None:
        if self.mode not in TIMINGS:
            raise ValueError(f"timing={self.mode!r}; expected one of {sorted(TIMINGS)}")
        if self.compute_cost_s < 0:
            raise ValueError(f"compute_cost_s={self.compute_cost_s!r} must be >= 0")
        if not isinstance(self.stop_late_work, bool):
            raise ValueError(f"stop_late_work={self.stop_late_work!r} must be True or False")
        if self.busy not in BUSY_MODES:
            raise ValueError(f"busy={self.busy!r}; expected 'skip', 'queue', 'fit' or None")
        if self.mode == "wallclock" and self.busy != "skip":
            raise ValueError(f"busy={self.busy!r} with timing='wallclock': wallclock rounds "
                             "always skip busy members")
        if self.upload_bandwidth is not None and not (
                _number(self.upload_bandwidth) and self.upload_bandwidth > 0
                and math.isfinite(self.upload_bandwidth)):
            raise ValueError(
                f"upload_bandwidth={self.upload_bandwidth!r} must be a positive number of bytes "
                "per second, or None (transfers take no time)")
        object.__setattr__(self, "measured_compute", bool(self.measured_compute))
        object.__setattr__(self, "compute_cost_s", float(self.compute_cost_s))
        if self.upload_bandwidth is not None:
            object.__setattr__(self, "upload_bandwidth", float(self.upload_bandwidth))


@dataclass(frozen=True)
class DeadlineOptions:
    """When a round ends: ``straggler_timeout`` (seconds, virtual or wall, after which it
    decodes from what arrived), ``auto_deadline`` (a factor >= 1 of the predicted round time,
    or ``None``), ``max_decode_error`` (an approximate decoding above it is not applied),
    ``min_replies`` (also end at this many valid replies), ``round_timeout`` and
    ``warmup_timeout`` (wall-clock limits of a round and of the first replies)."""

    straggler_timeout: float = 10.0
    round_timeout: float = 600.0
    warmup_timeout: float = 120.0
    auto_deadline: float | None = None
    max_decode_error: float = 0.5
    min_replies: int | None = None

    def __post_init__(self) -> None:
        if self.auto_deadline is not None and not (
                _number(self.auto_deadline) and 1 <= self.auto_deadline < math.inf):
            raise ValueError(f"auto_deadline={self.auto_deadline!r} must be a factor >= 1 of the "
                             "predicted round time (or None: the straggler_timeout only)")
        if not (_number(self.max_decode_error) and self.max_decode_error >= 0):
            raise ValueError(f"max_decode_error={self.max_decode_error!r} must be >= 0")
        if self.min_replies is not None and (isinstance(self.min_replies, bool)
                                             or self.min_replies < 1):
            raise ValueError(f"min_replies={self.min_replies!r} must be >= 1 or None")
        for name in ("round_timeout", "warmup_timeout", "straggler_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)!r} must be > 0 seconds")
        for name in ("straggler_timeout", "round_timeout", "warmup_timeout", "max_decode_error"):
            object.__setattr__(self, name, float(getattr(self, name)))
        if self.auto_deadline is not None:
            object.__setattr__(self, "auto_deadline", float(self.auto_deadline))


@dataclass(frozen=True)
class IntegrityOptions:
    """Integrity from redundancy (:mod:`fl_gradcode.flower.integrity`): ``verify`` waits until
    every reply decoded from is cross-checked; ``verify_tolerance`` is the largest relative
    disagreement taken as agreement."""

    verify: bool = False
    verify_tolerance: float = 1e-5

    def __post_init__(self) -> None:
        object.__setattr__(self, "verify", bool(self.verify))
        object.__setattr__(self, "verify_tolerance", float(self.verify_tolerance))


@dataclass(frozen=True)
class WireOptions:
    """What a reply carries: ``wire`` its dtype (``"auto"``, ``"model"``, ``"float64"``),
    ``sparse_decoding`` whether exact rounds read as few replies as the code allows."""

    wire: str = "auto"
    sparse_decoding: bool = True

    def __post_init__(self) -> None:
        if self.wire not in WIRES:
            raise ValueError(f"wire={self.wire!r}; expected 'auto', 'model' or 'float64'")
        object.__setattr__(self, "sparse_decoding", bool(self.sparse_decoding))


@dataclass(frozen=True)
class PrivacyOptions:
    """Differential privacy: ``dp`` the mechanism's configuration, ``accountant`` (one step per
    round that sent work), ``server_noise`` the central-DP noise source, ``nonce`` the per-run
    nonce of every keyed seed (from ``dp_run_nonce``; fresh per run when empty)."""

    dp: DPConfig = field(default_factory=DPConfig)
    accountant: PrivacyAccountant | None = None
    server_noise: ServerNoise = field(default_factory=ServerNoise)
    nonce: str = ""

    def __post_init__(self) -> None:
        if not self.nonce:
            object.__setattr__(self, "nonce", secrets.token_hex(16))


#: Flat keyword (or attribute) name -> (group, field) it maps onto.
FLAT_NAMES: dict[str, tuple[str, str]] = {
    "code_spec": ("code", "code"), "s": ("code", "s"), "adaptive": ("code", "adaptive"),
    "s_max": ("adaptive", "s_max"), "auto_margin": ("adaptive", "auto_margin"),
    "exclude_slow": ("adaptive", "exclude_slow"),
    "latency_state": ("adaptive", "latency_state"),
    "timing": ("timing", "mode"), "latency": ("timing", "latency"),
    "measured_compute": ("timing", "measured_compute"),
    "compute_cost_s": ("timing", "compute_cost_s"),
    "upload_bandwidth": ("timing", "upload_bandwidth"), "busy_mode": ("timing", "busy"),
    "stop_late_work": ("timing", "stop_late_work"),
    "straggler_timeout": ("deadline", "straggler_timeout"),
    "round_timeout": ("deadline", "round_timeout"),
    "warmup_timeout": ("deadline", "warmup_timeout"),
    "auto_deadline": ("deadline", "auto_deadline"),
    "max_decode_error": ("deadline", "max_decode_error"),
    "min_replies": ("deadline", "min_replies"),
    "verify": ("integrity", "verify"), "verify_tolerance": ("integrity", "verify_tolerance"),
    "wire": ("wire", "wire"), "sparse_decoding": ("wire", "sparse_decoding"),
    "dp": ("privacy", "dp"), "accountant": ("privacy", "accountant"),
    "server_noise": ("privacy", "server_noise"), "nonce": ("privacy", "nonce"),
}


@dataclass(frozen=True)
class Options:
    """Every option of ``GradientCoding``, by group; build it with :meth:`from_keywords`."""

    code: CodeOptions
    adaptive: AdaptiveOptions
    timing: TimingOptions
    deadline: DeadlineOptions
    integrity: IntegrityOptions
    wire: WireOptions
    privacy: PrivacyOptions
    seed: int = 0

    @property
    def estimating(self) -> bool:
        """The latency estimator runs: ``s="auto"``, or a fixed code queueing with
        ``busy="fit"``."""
        return self.code.adaptive or self.timing.busy == "fit"

    @property
    def code_options(self) -> dict[str, Any]:
        """``make_code``'s extra keyword arguments (a copy)."""
        return dict(self.code.options)

    def describe(self, strategy: str, run_config: Mapping[str, Any] | None) -> dict[str, Any]:
        """The run's ``config.json``: ``run_config`` and the options that shape its rounds
        (``strategy``: the inner strategy's name)."""
        auto = self.code.adaptive
        return {
            **(run_config or {}),
            "strategy": strategy,
            "code": "nested (adaptive)" if auto else self.code.name,
            "s": "auto" if auto else self.code.s,
            "s_max": self.adaptive.s_max,
            "exclude_slow": self.adaptive.exclude_slow,
            "timing": self.timing.mode,
            "latency": repr(self.timing.latency),
            "seed": self.seed,
            "straggler_timeout": self.deadline.straggler_timeout,
            "stop_late_work": self.timing.stop_late_work,
            "auto_deadline": self.deadline.auto_deadline,
            "max_decode_error": self.deadline.max_decode_error,
            "dp": self.privacy.dp.mode,
            "busy": self.timing.busy,
        }

    def get(self, name: str) -> Any:
        """The value behind a flat keyword name (:data:`FLAT_NAMES`); ``AttributeError`` for
        another name."""
        if name == "seed":
            return self.seed
        if name == "code_options":
            return self.code_options
        if name not in FLAT_NAMES:
            raise AttributeError(name)
        group, attr = FLAT_NAMES[name]
        return getattr(getattr(self, group), attr)

    @classmethod
    def from_keywords(
        cls,
        *,
        code: str | GradientCode = "grouped-rs",
        s: int | str = 1,
        s_max: int | None = None,
        auto_margin: float = 0.1,
        exclude_slow: float | None = None,
        timing: str = "virtual",
        latency: LatencyModel | None = None,
        seed: int = 0,
        straggler_timeout: float = 10.0,
        max_decode_error: float = 0.5,
        min_replies: int | None = None,
        round_timeout: float = 600.0,
        warmup_timeout: float = 120.0,
        measured_compute: bool = True,
        compute_cost_s: float = 0.0,
        upload_bandwidth: float | None = None,
        dp: DPConfig | None = None,
        accountant: PrivacyAccountant | None = None,
        server_noise: ServerNoise | None = None,
        dp_run_nonce: str = "",
        code_options: Mapping[str, Any] | None = None,
        wire: str = "auto",
        m: int | None = None,
        verify: bool = False,
        verify_tolerance: float = 1e-5,
        sparse_decoding: bool = True,
        busy: str | None = None,
        latency_state: str | os.PathLike[str] | None = None,
        stop_late_work: bool = False,
        auto_deadline: float | None = None,
    ) -> Options:
        """The groups from ``GradientCoding``'s flat keywords (same names, same defaults),
        with every rule that spans groups (the module docstring lists them)."""
        if not isinstance(code, (str, GradientCode)):
            raise TypeError(f"code must be a registry name or a GradientCode; got {code!r}")
        auto = s == "auto"
        adaptive = AdaptiveOptions(auto, s_max, auto_margin, exclude_slow, latency_state)
        if auto:
            s = s_max if s_max is not None else 1
        elif isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise ValueError(f"s={s!r} must be an integer >= 0 or 'auto'")
        if auto_deadline is not None:
            if not (auto or busy == "fit"):
                raise ValueError(f"auto_deadline={auto_deadline!r} needs s='auto' or busy='fit' "
                                 f"(a prediction of the round's time; got s={s!r}, "
                                 f"busy={busy!r})")
            if timing != "virtual" and _number(auto_deadline) and auto_deadline >= 1:
                raise ValueError(f"auto_deadline={auto_deadline!r} needs timing='virtual' (got "
                                 f"timing={timing!r}: wallclock rounds give the estimator no "
                                 "latencies to predict a deadline from)")
        if exclude_slow is not None and not auto:
            raise ValueError(f"exclude_slow={exclude_slow!r} needs s='auto' (got s={s!r})")
        deadline = DeadlineOptions(straggler_timeout, round_timeout, warmup_timeout,
                                   auto_deadline, max_decode_error, min_replies)
        if busy not in (None, *BUSY_MODES):
            raise ValueError(f"busy={busy!r}; expected 'skip', 'queue', 'fit' or None")
        if busy is None:
            busy = "queue" if auto else "skip"
        timing_options = TimingOptions(
            timing, latency, measured_compute, compute_cost_s, upload_bandwidth,
            busy=busy if timing == "virtual" else "skip",
            stop_late_work=(stop_late_work or auto_deadline is not None)
            if isinstance(stop_late_work, bool) else stop_late_work,
        )
        options = _code_options(code, s, s_max, auto, code_options, m)
        integrity = IntegrityOptions(verify, verify_tolerance)
        refusal = verify_refusal(code, s, options) if integrity.verify else None
        if refusal is not None:
            raise ValueError(refusal)
        built = cls(
            code=CodeOptions(code, int(s), auto, options),
            adaptive=adaptive,
            timing=timing_options,
            deadline=deadline,
            integrity=integrity,
            wire=WireOptions(wire, sparse_decoding),
            privacy=PrivacyOptions(dp or DPConfig(), accountant, server_noise or ServerNoise(),
                                   dp_run_nonce),
            seed=int(seed),
        )
        if adaptive.latency_state is not None and not built.estimating:
            log(WARNING, "latency_state=%r is read and written only with s='auto' or "
                "busy='fit' under virtual timing (the latency estimator does not run "
                "otherwise)", adaptive.latency_state)
        return built


def _code_options(code: Any, s: int, s_max: int | None, auto: bool,
                  code_options: Mapping[str, Any] | None, m: int | None) -> dict[str, Any]:
    """``make_code``'s options: the user's, with a fixed nested placement's ``s_max`` and the
    communication-efficient ``m`` from their keywords (a contradicting entry is refused)."""
    options = dict(code_options or {})
    keywords = {}
    if code == "nested" and s_max is not None and not auto:
        keywords["s_max"] = s_max
    if m is not None:
        keywords["m"] = m
    for name, value in keywords.items():
        if name in options and options[name] != value:
            raise ValueError(f"code_options[{name!r}]={options[name]!r} contradicts "
                             f"{name}={value!r}; give one of them")
        options[name] = value
    return options
