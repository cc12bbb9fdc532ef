"""``GradientCoding``'s options as frozen, self-validating groups.

Each group checks its own fields when it is built (a bad value is named in the error, with the
keyword a user passed). :meth:`Options.from_keywords` maps ``GradientCoding``'s flat keywords
onto the groups; the rules that span groups (``s="auto"``'s tolerance, ``busy``'s and
``stop_late_work``'s defaults, what ``auto_deadline``, ``exclude_slow``, ``auto_approximate``
and ``verify`` need) are written once, in :mod:`~fl_gradcode.flower.option_rules`, whose
docstring lists them.

The groups are plain values (frozen dataclasses); the collaborators take the groups they need.
Each option's default is declared once: as its group's field, or, where a run-config key sets
the keyword to the same default, as that key's default
(:data:`~fl_gradcode.config.keys.KEYWORD_DEFAULTS`); ``GradientCoding``'s and
:meth:`Options.from_keywords`' signatures read it from the group (a test parses the package
for a default declared twice). A keyword whose default is ``None`` means "not given": what it
resolves to is one of those rules.
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
from ..config.keys import KEYWORD_DEFAULTS as _KEYED
from ..latency import LatencyModel
from ..privacy import DPConfig, PrivacyAccountant, ServerNoise
from .clock import CLOCKS, clock_class
from .code_options import code_options as _code_options
from .code_options import fixed_s
from .option_rules import (
    BUSY_MODES,
    check_adaptive_keywords,
    refuse_unverifiable,
    resolve_busy,
    resolve_s,
    resolve_stop_late_work,
)
from .option_values import check_code, check_fixed_s, check_latency, finite, flag, whole
from .option_values import number as _number

STOP_LATE_WORK: bool | str = _KEYED["stop_late_work"]

__all__ = ["STOP_LATE_WORK", "AdaptiveOptions", "CodeOptions", "DeadlineOptions",
           "IntegrityOptions", "Options", "PrivacyOptions", "TimingOptions", "WireOptions",
           "check_code", "check_fixed_s", "resolve_busy"]

TIMINGS = tuple(CLOCKS)
WIRES = ("auto", "model", "float64")


@dataclass(frozen=True)
class CodeOptions:
    """Which code every round uses (the fields hold the resolved values: with ``s="auto"``,
    ``s`` is the placement's ``s_max`` and ``adaptive`` is true; ``options`` includes ``m``
    and a fixed nested placement's ``s_max``).

    Parameters (``GradientCoding``'s keywords)
    ------------------------------------------
    code : str or GradientCode
        A registry name (``fl_gradcode.codes.available_codes()``; built over each cohort with
        ``n`` = cohort size) or a ``GradientCode`` whose ``n`` equals the cohort size.
    s : int or "auto"
        Stragglers tolerated (for a registry name; clamped to ``n - 1``). ``"auto"``: chosen
        every round from the observed latencies (:mod:`fl_gradcode.adaptive`): data placed
        once for ``s_max`` (:class:`~fl_gradcode.codes.NestedPlacement`), a censored latency
        estimator (late replies observed late, unanswered ones censored at the round's end),
        and the ``s`` in ``0..s_max`` (0 = uncoded on the same placement) minimising the
        expected time of this round and the next (the backlog this round's work leaves), busy
        clients included; among candidates predicted within ``auto_margin`` of the fastest,
        the most tolerant; falling at most to half the last round's ``s`` per round. When the
        inner strategy samples a different cohort each round (``fraction_train < 1``), one
        estimator covers every node seen so far and each decision looks at it through the
        cohort (:class:`~fl_gradcode.adaptive.CohortView`). ``code`` must then name an exact
        code (:data:`~fl_gradcode.flower.code_options.AUTO_CODE_NAMES`; the placement's code
        runs whichever is named); another name, a code object, ``m`` or ``code_options`` is
        refused, as it would not run.
    seed : int
        Run seed: code draws, latency samples, public seeding of the app per partition.
    code_options : dict, optional
        Extra keyword arguments for ``make_code`` (an entry contradicting ``m`` or a fixed
        nested placement's ``s_max`` is refused, as is one the code does not take or whose
        value no cohort size could take: ``fl_gradcode.codes.CODE_OPTIONS``).
    m : int, optional
        Communication-efficient codes (``code="comm-efficient"``): every reply is ``1/m`` of
        the model (load ``s + m`` partitions), decoded exactly from any ``n - s`` replies;
        an integer >= 1 (refused with another code name).
    """

    code: str | GradientCode = _KEYED["code"]
    s: int = 1
    adaptive: bool = False
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_code(self.code)
        check_fixed_s(self.s)
        object.__setattr__(self, "options", dict(self.options))

    @property
    def name(self) -> str:
        """The code's registry name."""
        return self.code if isinstance(self.code, str) else self.code.name


@dataclass(frozen=True)
class AdaptiveOptions:
    """``s="auto"`` (:mod:`fl_gradcode.adaptive`; ``enabled``: ``s="auto"``).

    Parameters (``GradientCoding``'s keywords)
    ------------------------------------------
    s_max : int, optional
        With ``s="auto"``: the largest tolerance (default ``max(1, n // 4)``). With
        ``code="nested"`` and a fixed ``s``: the placement's ``s_max`` (the code for ``s`` of
        the placement ``s="auto"`` would use; default ``s``).
    auto_margin : float
        With ``s="auto"``: relative slack in predicted round time traded for tolerance
        (default: the key table's ``auto-margin``; a larger ``s`` predicted at most that
        fraction slower is preferred). The model
        treats stragglers as independent; rare correlated ones (several slow clients in one
        group, as in measured traces) then cost far more than the slack. ``0``: the pure
        expected-time minimiser.
    exclude_slow : float, optional
        With ``s="auto"``: heterogeneity-aware assignment. Clients whose estimated slowness
        factor (:meth:`~fl_gradcode.adaptive.LatencyEstimator.slowness`: 1 typical, 10 ten
        times slower per unit of work) is at least this may be excluded for a round: they are
        sent nothing and the other clients of their super-block share their partitions
        (:meth:`~fl_gradcode.codes.NestedPlacement.code_excluding`), when that is predicted
        faster for the chosen ``s``; the round stays exact. ``None`` (default): never. An
        excluded client is not observed while excluded; its estimate decays towards typical
        with the estimator's forgetting (half-life 20 rounds), which brings it back.
    latency_state : str or path, optional
        A JSON file of latency observations that outlives the run (with ``s="auto"`` or
        ``busy="fit"``): if it exists when the strategy is built, its rounds (another run's
        observations of the same clients, matched by data partition) warm-start the
        estimator, so that the first round is chosen from them instead of at ``s_max``; after
        every round the estimator's rounds are written back to it (atomically). A federation
        that trains many models pays the round at ``s_max`` once. ``None`` (default): no file.
    auto_approximate : bool
        With ``s="auto"``: rounds may also decode what arrived by a deadline, when that is
        cheaper per unit of progress, the error measured in exact rounds (docs/adaptive.md).
    """

    enabled: bool = False
    s_max: int | None = None
    auto_margin: float = _KEYED["auto_margin"]
    exclude_slow: float | None = _KEYED["exclude_slow"]
    latency_state: str | None = _KEYED["latency_state"]
    auto_approximate: bool = _KEYED["auto_approximate"]

    def __post_init__(self) -> None:
        if self.s_max is not None and (  # checked with a fixed s too: never silently unused
                isinstance(self.s_max, bool) or not isinstance(self.s_max, int)
                or self.s_max < 1):
            raise ValueError(f"s_max={self.s_max!r} must be an integer >= 1 (or None)")
        if not (_number(self.auto_margin) and 0 <= self.auto_margin < math.inf):
            raise ValueError(f"auto_margin={self.auto_margin!r} must be a number >= 0")
        if self.exclude_slow is not None and self.enabled and not (
                _number(self.exclude_slow) and 1 < self.exclude_slow < math.inf):
            raise ValueError(f"exclude_slow={self.exclude_slow!r} must be a slowness factor > 1 "
                             "(or None: never exclude)")
        if not isinstance(self.auto_approximate, bool) or self.auto_approximate > self.enabled:
            raise ValueError(f"auto_approximate={self.auto_approximate!r} must be True (with "
                             "s='auto') or False")
        object.__setattr__(self, "auto_margin", float(self.auto_margin))
        if self.exclude_slow is not None and self.enabled:
            object.__setattr__(self, "exclude_slow", float(self.exclude_slow))
        if self.latency_state is not None:
            object.__setattr__(self, "latency_state", os.fspath(self.latency_state))


@dataclass(frozen=True)
class TimingOptions:
    """How a round's time is measured (``mode``: the ``timing`` keyword; ``busy`` and
    ``stop_late_work`` hold the resolved values).

    Parameters (``GradientCoding``'s keywords)
    ------------------------------------------
    timing : {"virtual", "wallclock"}
        ``virtual``: the mod reports measured compute seconds, the server samples each worker's
        latency from ``latency`` and decodes at the earliest decodable prefix in virtual time;
        ``wallclock``: real time (with ``latency``, clients sleep the sampled delay).
    latency : LatencyModel, optional
        An ``fl_gradcode.latency`` model, sampled per (seed, round, worker), load-scaled where
        the model says so (load = the worker's examples over one client's share).
    measured_compute : bool
        Add the mod's measured compute time to virtual arrivals.
    compute_cost_s : float
        Modelled compute seconds per unit of load added to every arrival (``s+1`` partitions
        cost ``s+1`` units).
    upload_bandwidth : float, optional
        Virtual timing: each client's upload rate in bytes per second; a reply then arrives
        ``payload bytes / upload_bandwidth`` later (time = compute + delay + bytes/bandwidth),
        so shorter replies (``code="comm-efficient"``, float32 wire) arrive sooner. ``None``:
        transfers take no time.
    busy : {"skip", "queue", "fit"}, optional
        What a member still busy with an earlier round's work gets (virtual timing).
        ``skip``: no work this round (it is a straggler; ``busy`` in ``rounds.jsonl`` lists
        these). ``queue``: work queued behind its current job, as a Flower SuperNode runs
        messages one after the other; its reply arrives after its current job ends plus its
        own time. To bound the backlog a busy member is queued only if its current job ends in
        time: with ``s="auto"`` before the round's expected end
        (:func:`~fl_gradcode.adaptive.choose_s` with ``busy="fit"``), with a fixed code within
        the last round's duration and the deadline, read from the virtual clock (a
        simulator's knowledge: when the pending reply will arrive). ``fit``: queued as with
        ``s="auto"``, from what a server knows (the latency estimator and the work the member
        has not returned), also for a fixed code; with ``s="auto"`` the same as ``queue``.
        Default: ``queue`` with ``s="auto"``, ``skip`` otherwise (the behaviour of earlier
        versions). Wallclock timing always skips busy members (the grid waits for their
        earlier replies; queueing there is not implemented).
    stop_late_work : bool
        Workers stop at the round's deadline (``straggler_timeout`` after the round started,
        or ``auto_deadline``'s) instead of finishing work whose reply the server can no longer
        use: the instruction carries ``stop-after-s`` and the mod abandons the remaining
        partitions (or the simulated latency) and sends a short error reply; the virtual
        clock frees such a worker at the deadline instead of at the end of its job, so its
        next round's work is not queued behind stale work. A stopped worker's time is
        censored at the deadline instead of observed late. Wallclock round 1 is never
        stopped (its deadline counts from the first reply). ``"auto"``: see the module doc.
        ``"decode"``: work stops at the round's end (decode or deadline, as first-k's dropped
        clients stop at its K-th arrival), censored there; virtual timing only (a Flower
        server cannot cancel a message a node is running).
    """

    mode: str = _KEYED["timing"]
    latency: LatencyModel | None = None
    measured_compute: bool = True
    compute_cost_s: float = 0.0
    upload_bandwidth: float | None = _KEYED["upload_bandwidth"]
    busy: str = "skip"
    stop_late_work: bool | str = False  # resolved: GradientCoding's may be "auto" ("decode")

    def __post_init__(self) -> None:
        if self.mode not in TIMINGS:
            raise ValueError(f"timing={self.mode!r}; expected one of {sorted(TIMINGS)}")
        check_latency(self.latency)
        if not (isinstance(self.stop_late_work, bool)
                or (self.stop_late_work == "decode" and self.mode == "virtual")):
            raise ValueError(f"stop_late_work={self.stop_late_work!r} must be True or False "
                             f"(or 'auto'), or 'decode' with timing='virtual' (timing="
                             f"{self.mode!r})")
        if self.busy not in BUSY_MODES:
            raise ValueError(f"busy={self.busy!r}; expected 'skip', 'queue', 'fit' or None")
        if clock_class(self.mode).busy_mode(self.busy) != self.busy:
            raise ValueError(f"busy={self.busy!r} with timing={self.mode!r}: {self.mode} rounds "
                             "always skip busy members")
        if self.upload_bandwidth is not None and not (
                _number(self.upload_bandwidth) and self.upload_bandwidth > 0
                and math.isfinite(self.upload_bandwidth)):
            raise ValueError(
                f"upload_bandwidth={self.upload_bandwidth!r} must be a positive number of bytes "
                "per second, or None (transfers take no time)")
        for name, check in (("measured_compute", flag), ("compute_cost_s", finite)):
            object.__setattr__(self, name, check(name, getattr(self, name)))
        if self.upload_bandwidth is not None:
            object.__setattr__(self, "upload_bandwidth", float(self.upload_bandwidth))


@dataclass(frozen=True)
class DeadlineOptions:
    """When a round ends.

    Parameters (``GradientCoding``'s keywords)
    ------------------------------------------
    straggler_timeout : float
        Seconds (virtual or wall) after which a round decodes approximately from what arrived.
    auto_deadline : float, optional
        With ``s="auto"`` (or a fixed code with ``busy="fit"``, whose estimator predicts its
        round time too) and virtual timing: each round's deadline is this factor (>= 1)
        times the round time predicted for the round's code (when finite; never beyond
        ``straggler_timeout``; round 1 has only ``straggler_timeout`` unless a
        ``latency_state`` file gives it a prediction), and work stops there (implies
        ``stop_late_work``). A round that has not decoded by then decodes by least squares
        from what arrived (``approx``, or ``skipped`` above ``max_decode_error``), like any
        deadline, and still counts for the privacy accountant (its noisy updates were
        released); after such a miss the next deadline is ``DEADLINE_BACKOFF`` (2) times
        longer, again after each miss in a row, until a round decodes exactly (exponential
        backoff, as a retransmission timer: RFC 6298). In exchange no client stays busy
        for long with work no round can use, which under load-scaled straggling is most of
        the time lost. ``rounds.jsonl`` records ``round_deadline_s``. ``None`` (default):
        ``straggler_timeout`` only.
    max_decode_error : float
        An approximate decoding with a larger ``||B_F^T a - 1||^2 / k`` is not applied.
    min_replies : int, optional
        Also end a round at this many valid replies (approximate codes, ignore-stragglers).
        Default: ``n - s`` for approximate codes, none for exact codes.
    round_timeout : float
        Wall-clock limit of one round (virtual timing waits for every reply up to this).
    warmup_timeout : float
        Wall-clock limit of the first replies (actor or process start-up).
    """

    straggler_timeout: float = 10.0
    round_timeout: float = _KEYED["round_timeout"]
    warmup_timeout: float = _KEYED["warmup_timeout"]
    auto_deadline: float | None = _KEYED["auto_deadline"]
    max_decode_error: float = _KEYED["max_decode_error"]
    min_replies: int | None = None

    def __post_init__(self) -> None:
        if self.auto_deadline is not None and not (
                _number(self.auto_deadline) and 1 <= self.auto_deadline < math.inf):
            raise ValueError(f"auto_deadline={self.auto_deadline!r} must be a factor >= 1 of the "
                             "predicted round time (or None: the straggler_timeout only)")
        if not (_number(self.max_decode_error) and self.max_decode_error >= 0):
            raise ValueError(f"max_decode_error={self.max_decode_error!r} must be >= 0")
        if self.min_replies is not None:
            object.__setattr__(self, "min_replies",
                               whole("min_replies", self.min_replies, 1, " or None"))
        for name in ("round_timeout", "warmup_timeout", "straggler_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)!r} must be > 0 seconds")
        for name in ("straggler_timeout", "round_timeout", "warmup_timeout", "max_decode_error"):
            object.__setattr__(self, name, float(getattr(self, name)))
        if self.auto_deadline is not None:
            object.__setattr__(self, "auto_deadline", float(self.auto_deadline))


@dataclass(frozen=True)
class IntegrityOptions:
    """Integrity from redundancy (:mod:`fl_gradcode.flower.integrity`).

    Parameters (``GradientCoding``'s keywords)
    ------------------------------------------
    verify : bool
        ``False``: spare replies in hand must agree; a reply the redundancy identifies as
        inconsistent (e.g. outvoted in a repetition group) is excluded (best effort: colluders
        can steer it). ``True`` (:mod:`~fl_gradcode.flower.settle`): only blocks whose ``s + 1``
        replicas agree on dense secret probes (every coordinate and train metric, fresh keys
        each round) are decoded; a block that cannot be settled is left out (``approx``,
        ``unsettled`` in ``rounds.jsonl``): up to ``s`` colluders can neither get a forged
        model applied as verified nor an honest node blamed (``docs/integrity.md``). Refused
        (``ValueError``) for codes without repetition groups and codes it cannot check
        (:func:`~fl_gradcode.flower.integrity.verify_refusal`); ``s="auto"`` chooses only an
        ``s`` it settles (``s=0``: applied unverified, warned, ``verified`` null). Offences (with
        ``verify=True`` only provable ones: error replies, self-contradicting sizes, a reply
        ``s + 1`` agreeing replicas contradict) twice within 10 rounds quarantine a node (sent
        no work) for 5 rounds, 10, 20, ... on repeats (``quarantined`` in ``rounds.jsonl``).
    verify_tolerance : float
        Largest relative disagreement between decodings taken as agreement (rounding).
    """

    verify: bool = _KEYED["verify"]
    verify_tolerance: float = _KEYED["verify_tolerance"]

    def __post_init__(self) -> None:
        object.__setattr__(self, "verify", flag("verify", self.verify))
        object.__setattr__(self, "verify_tolerance",
                           finite("verify_tolerance", self.verify_tolerance))


@dataclass(frozen=True)
class WireOptions:
    """What a reply carries.

    Parameters (``GradientCoding``'s keywords)
    ------------------------------------------
    wire : {"auto", "model", "float64"}
        Reply dtype: ``model`` sends each array in the global model's dtype (half of float64's
        bytes for float32 models); ``auto`` does so when the code's rounding amplification
        (its bound ``rounding_amplification``, else sampled) is <= 8, keeping float32 rounding
        below 1e-6 relative in the decoded result, else float64. Only grouped-rs has the
        bound; for the other codes the sample of straggler sets can miss a worse one (e.g.
        comm-efficient sets that amplify more than 8): ``float64`` guarantees the precision.
    sparse_decoding : bool
        Exact rounds decode from as few of the replies in hand as the code allows
        (:meth:`~fl_gradcode.codes.GradientCode.sparse_decoding`: one reply per FRC group), so
        the server reads ``n/(s+1)`` replies instead of ``n - s``; ``replies_read`` in
        ``rounds.jsonl``. ``False``: the minimum-norm decoding, which reads every reply.
    """

    wire: str = "auto"
    sparse_decoding: bool = True

    def __post_init__(self) -> None:
        if self.wire not in WIRES:
            raise ValueError(f"wire={self.wire!r}; expected 'auto', 'model' or 'float64'")
        object.__setattr__(self, "sparse_decoding", flag("sparse_decoding", self.sparse_decoding))


@dataclass(frozen=True)
class PrivacyOptions:
    """Differential privacy (``nonce``: from ``dp_run_nonce``, fresh per run when empty).

    Parameters (``GradientCoding``'s keywords)
    ------------------------------------------
    dp : DPConfig, optional
        ``partition`` (clients clip and add keyed replica-identical noise), ``central`` (clients
        clip, the server adds noise from :class:`~fl_gradcode.privacy.ServerNoise`), ``sample``
        (noise inside the app: only accounted here).
    accountant : PrivacyAccountant, optional
        One step per round in which work was sent; with ``dp.target_epsilon`` a round that
        would exceed the budget is not run.
    server_noise : ServerNoise, optional
        The central-DP noise source (default: OS randomness).
    dp_run_nonce : str
        Pins the per-run nonce that enters every keyed seed (default: fresh per run). Pinning
        reuses the app's and the partition noise across runs with the same key: only for
        experiments that compare runs on identical noise.
    """

    dp: DPConfig = field(default_factory=DPConfig)
    accountant: PrivacyAccountant | None = None
    server_noise: ServerNoise = field(default_factory=ServerNoise)
    nonce: str = _KEYED["dp_run_nonce"]

    def __post_init__(self) -> None:
        if not self.nonce:
            object.__setattr__(self, "nonce", secrets.token_hex(16))
        own = getattr(self.accountant, "config", None)  # the DPConfig an accountant counts
        own = own if isinstance(own, DPConfig) else self.dp
        if self.dp.noise == "independent" and self.dp.mode in ("central", "sample"):
            raise ValueError(f"dp-noise='independent' with dp={self.dp.mode!r}: independent "
                             "noise per replica is a mode of dp='partition' only (the noise of "
                             f"dp={self.dp.mode!r} is not drawn per replica); use "
                             "dp-noise='identical' or dp='partition'")
        if self.accountant is not None and (not self.dp.enabled or own != self.dp):
            raise ValueError(f"accountant={self.accountant!r} with dp={self.dp!r}: its epsilon "
                             "would be false (no noise is added, or it counts another DPConfig:"
                             f" {own!r}); pass the dp it counts, or drop the accountant")


#: Flat keyword (or attribute) name -> (group, field) it maps onto.
FLAT_NAMES: dict[str, tuple[str, str]] = {
    "code_spec": ("code", "code"), "adaptive": ("code", "adaptive"),
    "timing": ("timing", "mode"), "busy_mode": ("timing", "busy"),
    **{name: (group, name) for group, names in (
        ("code", "s"), ("adaptive", "s_max auto_margin exclude_slow latency_state "
                                    "auto_approximate"),
        ("timing", "latency measured_compute compute_cost_s upload_bandwidth stop_late_work"),
        ("deadline", "straggler_timeout round_timeout warmup_timeout auto_deadline "
                     "max_decode_error min_replies"),
        ("integrity", "verify verify_tolerance"), ("wire", "wire sparse_decoding"),
        ("privacy", "dp accountant server_noise nonce"),
    ) for name in names.split()},
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
    seed: int = _KEYED["seed"]

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
        cls, *,
        code: str | GradientCode = CodeOptions.code, s: int | str = CodeOptions.s,
        s_max: int | None = AdaptiveOptions.s_max,
        auto_margin: float = AdaptiveOptions.auto_margin,
        exclude_slow: float | None = AdaptiveOptions.exclude_slow,
        timing: str = TimingOptions.mode, latency: LatencyModel | None = TimingOptions.latency,
        seed: int = seed,  # the field above
        straggler_timeout: float = DeadlineOptions.straggler_timeout,
        max_decode_error: float = DeadlineOptions.max_decode_error,
        min_replies: int | None = DeadlineOptions.min_replies,
        round_timeout: float = DeadlineOptions.round_timeout,
        warmup_timeout: float = DeadlineOptions.warmup_timeout,
        measured_compute: bool = TimingOptions.measured_compute,
        compute_cost_s: float = TimingOptions.compute_cost_s,
        upload_bandwidth: float | None = TimingOptions.upload_bandwidth,
        dp: DPConfig | None = None,
        accountant: PrivacyAccountant | None = PrivacyOptions.accountant,
        server_noise: ServerNoise | None = None, dp_run_nonce: str = PrivacyOptions.nonce,
        code_options: Mapping[str, Any] | None = None, wire: str = WireOptions.wire,
        m: int | None = None, verify: bool = IntegrityOptions.verify,
        verify_tolerance: float = IntegrityOptions.verify_tolerance,
        sparse_decoding: bool = WireOptions.sparse_decoding, busy: str | None = None,
        latency_state: str | os.PathLike[str] | None = AdaptiveOptions.latency_state,
        stop_late_work: bool | str = STOP_LATE_WORK,
        auto_deadline: float | None = DeadlineOptions.auto_deadline,
        auto_approximate: bool = AdaptiveOptions.auto_approximate,
    ) -> Options:
        """The groups from ``GradientCoding``'s flat keywords (same names, same defaults),
        with every rule that spans groups (:mod:`~fl_gradcode.flower.option_rules`)."""
        check_code(code)
        auto = s == "auto"
        adaptive = AdaptiveOptions(auto, s_max, auto_margin, exclude_slow, latency_state,
                                   auto_approximate)
        if not auto:
            check_fixed_s(s)
            s = fixed_s(code, s, CodeOptions.s)
        s = resolve_s(auto, s, s_max)
        check_adaptive_keywords(auto=auto, s=s, busy=busy, timing=timing,
                                auto_deadline=auto_deadline, exclude_slow=exclude_slow,
                                auto_approximate=adaptive.auto_approximate)
        deadline = DeadlineOptions(straggler_timeout, round_timeout, warmup_timeout,
                                   auto_deadline, max_decode_error, min_replies)
        busy = resolve_busy(busy, auto, timing)
        timing_options = TimingOptions(
            timing, latency, measured_compute, compute_cost_s, upload_bandwidth, busy=busy,
            stop_late_work=resolve_stop_late_work(stop_late_work, auto=auto, busy=busy,
                                                  auto_deadline=auto_deadline))
        options = _code_options(code, s, s_max, auto, code_options, m)
        integrity = IntegrityOptions(verify, verify_tolerance)
        refuse_unverifiable(verify=integrity.verify, code=code, s=s, options=options,
                            auto=auto, exclude_slow=exclude_slow,
                            auto_approximate=adaptive.auto_approximate)
        built = cls(
            code=CodeOptions(code, int(s), auto, options),
            adaptive=adaptive,
            timing=timing_options,
            deadline=deadline,
            integrity=integrity,
            wire=WireOptions(wire, sparse_decoding),
            privacy=PrivacyOptions(dp or DPConfig(), accountant, server_noise or ServerNoise(),
                                   dp_run_nonce),
            seed=whole("seed", seed),
        )
        if adaptive.latency_state is not None and not built.estimating:
            log(WARNING, "latency_state=%r is read and written only with s='auto' or "
                "busy='fit' under virtual timing (the latency estimator does not run "
                "otherwise)", adaptive.latency_state)
        return built

