"""``GradientCoding``: wrap any Flower strategy so its rounds end at the first decodable replies.

In the style of Flower's DP wrappers, :class:`GradientCoding` holds an inner Message-API strategy
(FedAvg, FedAvgM, FedProx, FedAdam, FedYogi, FedAdagrad, user subclasses). Each round:

1. the inner strategy's ``configure_train`` picks the cohort and the content (global arrays +
   its train config); the code is built over the cohort (``k`` = cohort size: every member's
   own data partition, replicated among the members);
2. each idle member gets that content plus the protocol record (its partitions and
   coefficients); :func:`~fl_gradcode.flower.gradient_coding_mod` on the client calls the app
   once per partition and replies with one coded combination;
3. aggregation is a pipeline: validate (once per reply) -> select (the clock's stopping rule)
   -> decode ``sum_j n_j (theta_j - theta)`` and ``sum_j n_j`` -> privatise (central DP) ->
   the inner strategy's ``aggregate_train`` on ONE reply holding the example-weighted average
   ``sum_j n_j theta_j / sum_j n_j`` (so FedAvg returns exactly it, FedAdam/FedYogi/FedAvgM
   apply their own server optimizer) -> record.

References:
    Tandon, Lei, Dimakis, Karampatziakis, "Gradient Coding: Avoiding Stragglers in Distributed
    Learning", ICML 2017, https://arxiv.org/abs/1612.03301.
    McMahan, Moore, Ramage, Hampson, Agüera y Arcas, "Communication-Efficient Learning of Deep
    Networks from Decentralized Data", AISTATS 2017, https://arxiv.org/abs/1602.05629 (FedAvg).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property
from logging import DEBUG, INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp.strategy import Result, Strategy

from ..codes import GradientCode
from ..latency import LatencyModel, client_delay
from ..privacy import (
    DPConfig,
    PrivacyAccountant,
    ServerNoise,
    make_mechanism,
)
from ..results import RoundRecorder
from . import compat, protocol
from .clock import VirtualClock, WallClock, make_clock
from .decoder import Decoder, ReplyLayout, instruction_chunks, replies_read, wire_dtypes
from .decoder import error_amplification as error_amplification  # re-exported
from .grid import EarlyReturnGrid
from .integrity import (
    Probe,
    Verdict,
    applied_disagreement,
    reply_sizes,
    round_probe,
    verify_refusal,
    verify_replies,
)
from .membership import Membership, code_for_cohort
from .privatiser import Privatiser
from .protocol import CodedReply, Identity, Instruction, RejectedReply
from .quarantine import Quarantine
from .records import (
    METRIC_PREFIX,
    client_names,
    empty_names,
    report_rejections,
    split_reason,
)
from .reports import (
    MISSING_KEYS_HELP,
    check_reply_sizes,
    missing_keys,
    public_reason,
)

__all__ = ["GradientCoding"]


@dataclass
class _Round:
    """Bookkeeping of the round in progress."""

    number: int
    code: GradientCode
    cohort: list[int]  # worker index -> node id
    partitions: list[Identity]  # code partition j -> the data partition it stands for
    sent: dict[int, Message]  # worker -> message sent
    busy: list[int]
    layout: dict[str, tuple[int, ...]]
    reply_layout: dict[str, tuple[int, ...]]
    dtypes: dict[str, np.dtype]
    theta: dict[str, np.ndarray]
    array_key: str
    wall_start: float
    valid: dict[int, CodedReply] = field(default_factory=dict)
    answered: set[int] = field(default_factory=set)  # workers with any reply (valid or not)
    rejected: list[tuple[int, str]] = field(default_factory=list)
    rejected_details: list[tuple[int | None, str, str | None]] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)  # message ids already parsed
    wire: str = "float64"
    probe: Any = None  # random projections for the integrity checks (None: not checked)
    bytes_up: int = 0  # payload bytes of every reply of this round
    stopped: list[int] = field(default_factory=list)  # workers stopped at the deadline
    bytes_down: int = 0  # payload bytes of every instruction of this round
    excluded: list[int] = field(default_factory=list)  # workers with nothing to compute
    tracker: Any = None  # exact decodability of the valid replies, updated per reply
    quarantined: list[int] = field(default_factory=list)  # nodes sent no work: quarantine
    sizes: dict[int, float] = field(default_factory=dict)  # code partition -> checked size

    @cached_property
    def worker_of(self) -> dict[int, int]:
        return {node: w for w, node in enumerate(self.cohort)}


class GradientCoding(Strategy):
    """Gradient-coded rounds around any Flower strategy.

    Parameters
    ----------
    strategy : Strategy
        The inner strategy (FedAvg, FedAdam, ...): it samples the cohort, builds the train
        content and applies its own aggregation to the decoded example-weighted average.
        Refused (:mod:`~fl_gradcode.flower.compat`, ``docs/works_with.md``): strategies that
        aggregate individual replies (Krum, FedMedian, ...; an unknown ``aggregate_train`` is
        checked once, on copies, at the first aggregation), Flower's DP wrappers (inside or
        outside), legacy ``flwr.server.strategy`` strategies.
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
        cohort (:class:`~fl_gradcode.adaptive.CohortView`).
    auto_margin : float
        With ``s="auto"``: relative slack in predicted round time traded for tolerance
        (default 0.1: a larger ``s`` predicted at most 10% slower is preferred). The model
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
    s_max : int, optional
        With ``s="auto"``: the largest tolerance (default ``max(1, n // 4)``). With
        ``code="nested"`` and a fixed ``s``: the placement's ``s_max`` (the code for ``s`` of
        the placement ``s="auto"`` would use; default ``s``).
    timing : {"virtual", "wallclock"}
        ``virtual``: the mod reports measured compute seconds, the server samples each worker's
        latency from ``latency`` and decodes at the earliest decodable prefix in virtual time;
        ``wallclock``: real time (with ``latency``, clients sleep the sampled delay).
    latency : LatencyModel, optional
        An ``fl_gradcode.latency`` model, sampled per (seed, round, worker), load-scaled where
        the model says so (load = the worker's examples over one client's share).
    seed : int
        Run seed: code draws, latency samples, public seeding of the app per partition.
    results_dir : str, optional
        Where to write ``rounds.jsonl``, ``final_model.npz``, ``config.json`` and
        ``debug.log`` (the tracebacks of rejected replies; ``docs/records-and-logs.md``).
    straggler_timeout : float
        Seconds (virtual or wall) after which a round decodes approximately from what arrived.
    stop_late_work : bool
        Workers stop at the round's deadline (``straggler_timeout`` after the round started,
        or ``auto_deadline``'s) instead of finishing work whose reply the server can no longer
        use: the instruction carries ``stop-after-s`` and the mod abandons the remaining
        partitions (or the simulated latency) and sends a short error reply; the virtual
        clock frees such a worker at the deadline instead of at the end of its job, so its
        next round's work is not queued behind stale work. A stopped worker's time is
        censored at the deadline instead of observed late. Wallclock round 1 is never
        stopped (its deadline counts from the first reply). Default ``False``: every job runs
        to its end.
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
    code_options : dict, optional
        Extra keyword arguments for ``make_code``.
    m : int, optional
        Communication-efficient codes (``code="comm-efficient"``): every reply is ``1/m`` of
        the model (load ``s + m`` partitions), decoded exactly from any ``n - s`` replies.
    verify : bool
        Integrity from redundancy (:mod:`fl_gradcode.flower.integrity`). Always: when more
        replies than a decodable set are in hand, they must agree; a reply the redundancy
        identifies as inconsistent (e.g. outvoted inside a repetition group) is excluded, and a
        contradiction nothing resolves skips the round. With ``verify=True`` a round also
        waits (up to the deadline) until every reply it decodes from has been cross-checked,
        and applies nothing that was not: dense probes over every coordinate and train metric,
        from server secrets fresh each round (a change of any coordinates whose weight in the
        decoding exceeds 20x ``verify_tolerance`` of the replies' size is caught with
        probability >= 1 - 1e-12).
        Refused (``ValueError``) for codes it cannot check: ``s=0``, ``uncoded``,
        ``ignore-stragglers``, approximate codes (``bgc``, ``expander``) and
        ``comm-efficient`` with ``m > 1``; with ``s="auto"`` a round that chooses ``s=0`` is
        applied unverified (warned once, ``verified`` null). A node whose replies are excluded
        or caught in unresolved contradictions twice within 10 rounds is quarantined (sent no
        work, a straggler) for 5 rounds, 10, 20, ... on repeats (``quarantined`` in
        ``rounds.jsonl``).
    verify_tolerance : float
        Largest relative disagreement between decodings taken as agreement (rounding).
    sparse_decoding : bool
        Exact rounds decode from as few of the replies in hand as the code allows
        (:meth:`~fl_gradcode.codes.GradientCode.sparse_decoding`: one reply per FRC group), so
        the server reads ``n/(s+1)`` replies instead of ``n - s``; ``replies_read`` in
        ``rounds.jsonl``. ``False``: the minimum-norm decoding, which reads every reply.
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
    wire : {"auto", "model", "float64"}
        Reply dtype: ``model`` sends each array in the global model's dtype (half of float64's
        bytes for float32 models); ``auto`` does so when the code's error amplification keeps
        float32 rounding below 1e-6 relative in the decoded result (``error_amplification``
        <= 8; FRC, uncoded and grouped codes whose groups are FRC are 1), else float64.
    evaluate_fn : callable, optional
        Also accepted by ``start`` (Flower's convention); its ``accuracy``/``loss`` go into
        ``rounds.jsonl``.
    """

    # auto_deadline: after a round that missed its predicted deadline, the next deadline is
    # this much longer, again after each miss in a row, back to the factor after an exact
    # round (exponential backoff of a retransmission timer: RFC 6298, section 5.5)
    DEADLINE_BACKOFF = 2.0

    def __init__(
        self,
        strategy: Strategy,
        code: str | GradientCode = "grouped-rs",
        s: int | str = 1,
        *,
        s_max: int | None = None,
        auto_margin: float = 0.1,
        exclude_slow: float | None = None,
        timing: str = "virtual",
        latency: LatencyModel | None = None,
        seed: int = 0,
        results_dir: str | None = None,
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
        code_options: dict[str, Any] | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
        run_config: dict[str, Any] | None = None,
        wire: str = "auto",
        m: int | None = None,
        verify: bool = False,
        verify_tolerance: float = 1e-5,
        sparse_decoding: bool = True,
        busy: str | None = None,
        latency_state: str | os.PathLike[str] | None = None,
        stop_late_work: bool = False,
        auto_deadline: float | None = None,
    ) -> None:
        # refuse what coding cannot make exact (per-client aggregators, DP wrappers, legacy
        # strategies); an unknown aggregation is checked once on the first round
        self._check_inner = compat.check_inner_strategy(strategy, GradientCoding)
        self._fingerprints = compat.ReplyFingerprints()
        if not isinstance(code, (str, GradientCode)):
            raise TypeError(f"code must be a registry name or a GradientCode; got {code!r}")
        self.adaptive = s == "auto"
        if self.adaptive:
            if s_max is not None and (isinstance(s_max, bool) or not isinstance(s_max, int)
                                      or s_max < 1):
                raise ValueError(f"s_max={s_max!r} must be an integer >= 1 (or None)")
            s = s_max if s_max is not None else 1
            if not (isinstance(auto_margin, (int, float)) and not isinstance(auto_margin, bool)
                    and 0 <= auto_margin < math.inf):
                raise ValueError(f"auto_margin={auto_margin!r} must be a number >= 0")
        elif isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise ValueError(f"s={s!r} must be an integer >= 0 or 'auto'")
        if auto_deadline is not None:
            if not (self.adaptive or busy == "fit"):
                raise ValueError(f"auto_deadline={auto_deadline!r} needs s='auto' or busy='fit' "
                                 f"(a prediction of the round's time; got s={s!r}, "
                                 f"busy={busy!r})")
            if not (isinstance(auto_deadline, (int, float)) and not isinstance(auto_deadline, bool)
                    and 1 <= auto_deadline < math.inf):
                raise ValueError(f"auto_deadline={auto_deadline!r} must be a factor >= 1 of the "
                                 "predicted round time (or None: the straggler_timeout only)")
            if timing != "virtual":  # wallclock: the estimator observes no latencies to predict
                raise ValueError(f"auto_deadline={auto_deadline!r} needs timing='virtual' (got "
                                 f"timing={timing!r}: wallclock rounds give the estimator no "
                                 "latencies to predict a deadline from)")
        if exclude_slow is not None:
            if not self.adaptive:
                raise ValueError(f"exclude_slow={exclude_slow!r} needs s='auto' (got s={s!r})")
            if not (isinstance(exclude_slow, (int, float)) and not isinstance(exclude_slow, bool)
                    and 1 < exclude_slow < math.inf):
                raise ValueError(f"exclude_slow={exclude_slow!r} must be a slowness factor > 1 "
                                 "(or None: never exclude)")
        if not (isinstance(max_decode_error, (int, float)) and max_decode_error >= 0):
            raise ValueError(f"max_decode_error={max_decode_error!r} must be >= 0")
        if min_replies is not None and (isinstance(min_replies, bool) or min_replies < 1):
            raise ValueError(f"min_replies={min_replies!r} must be >= 1 or None")
        for name, value in (("round_timeout", round_timeout), ("warmup_timeout", warmup_timeout)):
            if not value > 0:
                raise ValueError(f"{name}={value!r} must be > 0 seconds")
        if wire not in ("auto", "model", "float64"):
            raise ValueError(f"wire={wire!r}; expected 'auto', 'model' or 'float64'")
        if compute_cost_s < 0:
            raise ValueError(f"compute_cost_s={compute_cost_s!r} must be >= 0")
        if not isinstance(stop_late_work, bool):
            raise ValueError(f"stop_late_work={stop_late_work!r} must be True or False")
        if busy not in (None, "skip", "queue", "fit"):
            raise ValueError(f"busy={busy!r}; expected 'skip', 'queue', 'fit' or None")
        if busy is None:
            busy = "queue" if self.adaptive else "skip"
        # wallclock: the grid waits for a busy node's earlier reply; its work is not queued
        self.busy_mode = busy if timing == "virtual" else "skip"
        # the latency estimator runs for auto and for a fixed code queueing with busy="fit"
        self._estimating = self.adaptive or self.busy_mode == "fit"
        if code == "nested" and s_max is not None and not self.adaptive:
            code_options = {"s_max": s_max, **(code_options or {})}
        self.inner = strategy
        self.code_spec = code
        self.s = int(s)
        self.s_max = s_max
        self.auto_margin = float(auto_margin)
        self.exclude_slow = None if exclude_slow is None else float(exclude_slow)
        self._placements: dict[int, Any] = {}
        # one latency estimator over every node ever sampled (node id -> its index), seen
        # through each round's cohort: what is learnt about a node outlives the rounds it
        # is not sampled in
        self._latency: Any = None
        self._node_index: dict[int, int] = {}
        # the estimator's client names (data partitions), and the latency_state file's
        # clients not yet claimed by a node (name -> index)
        self._index_keys: list[str] = []
        self._unclaimed: dict[str, int] = {}
        self._file_clients = 0  # clients read from the file, until one is claimed
        # (arrival, estimator round id, node index, elapsed, stopped): replies after their
        # round ended (stopped: work abandoned at the deadline, censored there, not observed)
        self._late_observations: list[tuple[float, int, int, float, bool]] = []
        # node -> its jobs not known to be done: [sent at, units, reply arrival or None,
        # deadline (when its work stops, with stop_late_work)]
        self._outstanding: dict[int, list[list[Any]]] = {}
        self._decision: Any = None
        self._last_auto_s: dict[int, int] = {}  # cohort size -> auto's last s
        self.clock: VirtualClock | WallClock = make_clock(timing, straggler_timeout)
        self.auto_deadline = None if auto_deadline is None else float(auto_deadline)
        # a deadline before the work's end is only worth it if the work stops there
        self.stop_late_work = stop_late_work or self.auto_deadline is not None
        if isinstance(self.clock, VirtualClock):
            self.clock.stop_at_deadline = self.stop_late_work
        self.timing = timing
        self.latency = latency
        self.seed = int(seed)
        self.straggler_timeout = float(straggler_timeout)
        self.max_decode_error = float(max_decode_error)
        self.min_replies = min_replies
        self.round_timeout = float(round_timeout)
        self.warmup_timeout = float(warmup_timeout)
        self.measured_compute = bool(measured_compute)
        self.compute_cost_s = float(compute_cost_s)
        self.latency_state = None if latency_state is None else os.fspath(latency_state)
        self._warm_start = _read_latency_state(self.latency_state)
        if self._warm_start is not None:
            here, there = self._state_meta(), self._warm_start.get("meta", {})
            differ = {k: there[k] for k in here if k in there and there[k] != here[k]}
            if differ:
                log(WARNING, "latency_state=%r was written by a run with %s (this run: %s); "
                    "its times may not compare with this run's", self.latency_state, differ,
                    {k: here[k] for k in differ})
        if self.latency_state is not None and not self._estimating:
            log(WARNING, "latency_state=%r is read and written only with s='auto' or "
                "busy='fit' under virtual timing (the latency estimator does not run "
                "otherwise)", self.latency_state)
        if upload_bandwidth is not None and not (
            isinstance(upload_bandwidth, (int, float)) and upload_bandwidth > 0
            and math.isfinite(upload_bandwidth)
        ):
            raise ValueError(
                f"upload_bandwidth={upload_bandwidth!r} must be a positive number of bytes per "
                "second, or None (transfers take no time)"
            )
        self.upload_bandwidth = None if upload_bandwidth is None else float(upload_bandwidth)
        self.dp = dp or DPConfig()
        self.mechanism = make_mechanism(self.dp)
        self.accountant = accountant
        self.server_noise = server_noise or ServerNoise()
        self.nonce = dp_run_nonce or secrets.token_hex(16)
        self.code_options = dict(code_options or {})
        if m is not None:
            self.code_options["m"] = m
        self.wire = wire
        self.verify = bool(verify)
        self.verify_tolerance = float(verify_tolerance)
        refusal = verify_refusal(code, s, self.code_options) if self.verify else None
        if refusal is not None:
            raise ValueError(refusal)
        self._quarantine = Quarantine()
        self._warned_unverifiable = False
        self.sparse_decoding = bool(sparse_decoding)
        # per code object, weakly: codes built per round (auto's exclusions) come and go, and
        # an id() key could be reused by a later code
        self._amplification: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.evaluate_fn = evaluate_fn
        self.recorder = (
            RoundRecorder(results_dir, {**self._describe(run_config), "busy": self.busy_mode})
            if results_dir
            else None
        )
        self.membership = Membership(self.warmup_timeout, self.nonce)
        self.identities: dict[int, Identity] = self.membership.claims
        self.partition_sizes: dict[tuple[int, int], float] = {}  # checked sizes only
        self._confirmed_sizes: dict[tuple[int, int], float] = {}  # by >= 2 agreeing replicas
        self._decoder = Decoder(self.inner, Privatiser(self.dp, self.mechanism, self.server_noise, self.nonce, self.partition_sizes), wire=self.wire, sparse=self.sparse_decoding, seed=self.seed)  # noqa: E501
        self.history: list[dict[str, Any]] = []
        self.stopped = False
        self._codes: dict[int, GradientCode] = {}
        self._round: _Round | None = None
        self._pending_row: dict[str, Any] | None = None
        self._late = 0
        self._stopped_late = 0  # stop replies to earlier rounds, not yet in a row
        # auto_deadline: rounds in a row that did not decode exactly by a predicted deadline
        self._missed_deadlines = 0
        self._wrapped_grid: EarlyReturnGrid | None = None
        self._warned_repartition = False

    def __getattr__(self, name: str) -> Any:
        # only for names not found: Flower's legacy server loop (initialize_parameters, ...)
        raise compat.legacy_attribute_error(self, name)

    # ------------------------------------------------------------------ configuration
    def _describe(self, run_config: dict[str, Any] | None) -> dict[str, Any]:
        code = self.code_spec if isinstance(self.code_spec, str) else self.code_spec.name
        return {
            **(run_config or {}),
            "strategy": type(self.inner).__name__,
            "code": "nested (adaptive)" if self.adaptive else code,
            "s": "auto" if self.adaptive else self.s,
            "s_max": self.s_max,
            "exclude_slow": self.exclude_slow,
            "timing": self.timing,
            "latency": repr(self.latency),
            "seed": self.seed,
            "straggler_timeout": self.straggler_timeout,
            "stop_late_work": self.stop_late_work,
            "auto_deadline": self.auto_deadline,
            "max_decode_error": self.max_decode_error,
            "dp": self.dp.mode,
        }

    def _adaptive_code(self, n: int, busy_nodes: set[int], cohort: list[int]) -> GradientCode:
        """``s="auto"``: this round's code from the nested placement and the estimator."""
        from ..codes import NestedPlacement

        if n not in self._placements:
            s_max = min(self.s_max if self.s_max is not None else max(1, n // 4), n - 1)
            self._placements[n] = NestedPlacement(n, s_max, seed=self.seed)
        placement = self._placements[n]
        estimator = self._estimator(n, cohort)
        # trust region: s falls at most to half the last round's (the load exponent is
        # extrapolated beyond the loads seen so far), within one cohort size's placement
        last = self._last_auto_s.get(n, 0) if estimator.has_data else 0
        candidates = [c for c in placement.stable_values if c >= last // 2]
        self._decision = self._decide(placement, estimator, busy_nodes, cohort, candidates)
        self._last_auto_s[n] = self._decision.s
        if self._decision.excluded:
            return placement.code_excluding(self._decision.s, self._decision.excluded)
        return placement.code(self._decision.s)

    def _fixed_code(self, n: int, busy_nodes: set[int], cohort: list[int]) -> GradientCode:
        """A fixed code; with ``busy="fit"`` also whom to queue, decided as for ``s="auto"``
        (:class:`~fl_gradcode.adaptive.SingleCode`: the code is the only candidate)."""
        code = self.code_for(n)
        if self.busy_mode == "fit":
            from ..adaptive import SingleCode

            self._decision = self._decide(
                SingleCode(code), self._estimator(n, cohort), busy_nodes, cohort, [code.s]
            )
        return code

    def _estimator(self, n: int, cohort: list[int]) -> Any:
        """The latency estimator seen through this cohort (``n`` members), fed with the late
        and outstanding replies. Nodes seen for the first time join it with no record, or
        with their data partition's record from the ``latency_state`` file."""
        from ..adaptive import LatencyEstimator

        if self._latency is None and self._warm_start is not None:
            self._read_warm_start(LatencyEstimator)
        while len(self._index_keys) < len(self._node_index):  # indices set from outside
            self._index_keys.append(f"index:{len(self._index_keys)}")
        for node in cohort:
            if node not in self._node_index:
                key = self._partition_key(node)
                i = self._unclaimed.pop(key, None)
                if i is None:  # new (or a partition already claimed: a distinct name)
                    i = len(self._index_keys)
                    self._index_keys.append(key if key not in self._index_keys else f"{key}#{i}")
                self._node_index[node] = i
        if self._file_clients and len(self._unclaimed) == self._file_clients:
            self._file_clients = 0  # (warned once)
            log(WARNING, "none of the %d clients in %s is a data partition of this cohort "
                "(named 'id/num-partitions'): the file informs nothing yet",
                len(self._unclaimed), self.latency_state)
        if self._latency is None:
            self._latency = LatencyEstimator(len(self._index_keys), seed=self.seed)
        estimator = self._latency
        if len(self._index_keys) > estimator.n:
            estimator.grow(len(self._index_keys))
        now = self.clock.now
        for item in list(self._late_observations):
            arrival, rid, index, elapsed, stopped = item
            if arrival <= now:
                if stopped:  # abandoned at the deadline: only that it took longer is known
                    estimator.observe_pending(rid, index, elapsed)
                else:
                    estimator.observe_late(rid, index, elapsed)
                self._late_observations.remove(item)
            else:  # still outstanding: only that it has not arrived by now is known
                # (a job stopped before it could start began after its round: nothing yet)
                estimator.observe_pending(rid, index, max(now - (arrival - elapsed), 0.0))
        members = [self._node_index[node] for node in cohort]
        if members == list(range(estimator.n)):
            return estimator  # every node, in order: the estimator itself
        return estimator.view(members)

    def _read_warm_start(self, factory: Any) -> None:
        """Start the estimator from the ``latency_state`` file: its clients at reserved
        indices that nodes claim by data partition when first seen (in this cohort, a later
        one, or never: a record not claimed is kept and written back with the rest)."""
        state, self._warm_start = self._warm_start, None
        clients = list(state["clients"])
        if clients:
            self._latency = factory(len(clients), seed=self.seed)
            remembered = self._latency.import_rounds(state, clients)
            self._index_keys = clients
            self._unclaimed = {key: i for i, key in enumerate(clients)}
            self._file_clients = len(clients)
        else:
            remembered = 0
        log(INFO, "latency observations of %d rounds and %d clients read from %s",
            remembered, len(clients), self.latency_state)

    def _state_meta(self) -> dict[str, Any]:
        """How this run measures time (written with the ``latency_state`` file, compared when
        it is read: times from another clock or cost model are not comparable)."""
        return {"timing": self.timing, "measured_compute": self.measured_compute,
                "compute_cost_s": self.compute_cost_s}

    def _partition_key(self, node: int) -> str:
        """A node's name in the ``latency_state`` file: its data partition as ``"id/of"``
        (stable across runs, unlike node ids)."""
        identity = self.identities.get(node)
        return f"node:{node}" if identity is None else "{}/{}".format(*_key(identity))

    def _save_latency_state(self) -> None:
        """Write the estimator's rounds to ``latency_state`` (a temporary file, then renamed:
        a run killed mid-write leaves the previous file). Never ends a run: a failure warns."""
        if self.latency_state is None or self._latency is None:
            return
        tmp = f"{self.latency_state}.{os.getpid()}.tmp"
        try:
            # clients without work in any remembered round carry no information: left out,
            # so that names never claimed again (foreign, rejoined) leave once they age out
            state = self._latency.export_rounds(self._index_keys, self._state_meta(),
                                                informative_only=True)
            parent = os.path.dirname(os.path.abspath(self.latency_state))
            os.makedirs(parent, exist_ok=True)
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(state, fh)
            os.replace(tmp, self.latency_state)
        except Exception as exc:  # the run does not need the file: warn, go on
            log(WARNING, "could not write latency observations to %s: %s",
                self.latency_state, exc)
            with contextlib.suppress(OSError):
                os.remove(tmp)

    def _decide(self, placement: Any, estimator: Any, busy_nodes: set[int], cohort: list[int],
                candidates: list[int]) -> Any:
        """:func:`~fl_gradcode.adaptive.choose_s` over ``candidates``, the busy clients priced
        from what the server knows (``busy="fit"`` queues those expected to start in time)."""
        from ..adaptive import choose_s

        n, now = placement.n, self.clock.now
        busy_until = pending = None
        if isinstance(self.clock, VirtualClock):
            # what a server knows of a busy client: when it was sent the work it has not
            # returned, and how much (not when the reply will arrive: that is the simulator's)
            elapsed, units = np.full(n, np.nan), np.zeros(n)
            limit = np.full(n, np.inf)
            for w, node in enumerate(cohort):
                if node in busy_nodes:
                    elapsed[w], units[w] = self._pending_work(node, now, placement.s_max + 1.0)
                    jobs = self._outstanding.get(node)
                    if self.stop_late_work and jobs:  # its work stops at its deadline
                        limit[w] = max(max(job[3] for job in jobs) - now, 0.0)
            pending = (elapsed, units)
        else:
            busy_until = np.array(
                [now + self.straggler_timeout if node in busy_nodes else 0.0 for node in cohort]
            )
        # skip: busy clients never reply this round (only codes decodable without them
        # finish); queue / fit: those expected to finish in time get queued work, the rest skip
        return choose_s(
            placement, estimator, busy_until=busy_until, pending=pending, now=now,
            candidates=candidates, busy="skip" if self.busy_mode == "skip" else "fit",
            margin=self.auto_margin, lookahead=True,
            rng=np.random.default_rng([self.seed, estimator._next_index]),
            exclude_slower_than=self.exclude_slow if self.adaptive else None,
            pending_limit=None if pending is None or not self.stop_late_work else limit,
        )

    def _pending_work(self, node: int, now: float, unknown: float) -> tuple[float, float]:
        """``(seconds since its current job started, units not returned)`` of a busy node:
        jobs whose replies arrived by ``now`` are done; the oldest other job started when it
        was sent or when the reply before it arrived. A node with no record (work sent before
        a restart) counts as ``unknown`` units (a full share of the placement) started now."""
        jobs = self._outstanding.get(node, [])
        done = [job for job in jobs if job[2] is not None and job[2] <= now]
        left = [job for job in jobs if job[2] is None or job[2] > now]
        self._outstanding[node] = left
        if not left:
            return 0.0, float(unknown)
        start = max([left[0][0], *(job[2] for job in done)])
        return now - start, float(sum(job[1] for job in left))

    def _queued(self, busy_nodes: set[int], cohort: list[int]) -> set[int]:
        """Busy members that get work queued behind their current job (``busy="queue"`` or
        ``"fit"``)."""
        if self.busy_mode == "skip" or not isinstance(self.clock, VirtualClock):
            return set()
        if self._estimating and self._decision is not None:
            skip = {cohort[w] for w in self._decision.skip}
            return {node for node in busy_nodes if node not in skip}
        limit = self.straggler_timeout
        if self.clock.last_duration is not None:
            limit = min(limit, self.clock.last_duration)
        now = self.clock.now
        return {node for node in busy_nodes if self.clock.busy_until.get(node, 0.0) - now < limit}

    def code_for(self, n: int) -> GradientCode:
        """The code for a cohort of ``n`` clients (built once per size; a size the code cannot
        take gets the nearest code that can, with a WARNING:
        :func:`~fl_gradcode.flower.membership.code_for_cohort`)."""
        if isinstance(self.code_spec, GradientCode) and self.code_spec.n == n:
            return self.code_spec
        if n not in self._codes:
            s = min(self.s, n - 1)
            if s < self.s and isinstance(self.code_spec, str):
                log(
                    WARNING,
                    "s=%d stragglers cannot be tolerated with a cohort of %d; using s=%d",
                    self.s,
                    n,
                    s,
                )
            options = dict(self.code_options)
            if self.code_spec == "ignore-stragglers":
                options.setdefault("rescale", True)
            code, why = code_for_cohort(self.code_spec, n, s, self.seed, options)
            if why is not None:  # once per cohort size: the code is kept for that size
                log(WARNING, "%s", why)
            self._codes[n] = code
        return self._codes[n]

    def wire_for(self, code: GradientCode) -> str:
        """The reply dtype for ``code`` (``"model"`` or ``"float64"``)."""
        return self._decoder.wire_for(code)

    def _stopping_replies(self, code: GradientCode) -> int | None:
        if self.min_replies is not None:
            return min(self.min_replies, code.n)
        return None if code.is_exact else code.n - code.s

    # ------------------------------------------------------------------ grid plumbing
    def wrap_grid(self, grid: Any) -> EarlyReturnGrid:
        """The grid to pass to ``start`` of any wrapper around this strategy."""
        if isinstance(grid, EarlyReturnGrid):
            return grid
        if self._wrapped_grid is None or self._wrapped_grid.inner is not grid:
            self._wrapped_grid = EarlyReturnGrid(grid, self)
        return self._wrapped_grid

    def start(
        self,
        grid: Any,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
    ) -> Result:
        """Flower's ``start``, with the grid wrapped for early return and ``evaluate_fn``'s
        accuracy and loss recorded per round."""
        user_fn = evaluate_fn or self.evaluate_fn
        self.evaluate_fn = user_fn

        def evaluate_and_record(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
            res = user_fn(server_round, arrays) if user_fn is not None else None
            if server_round > 0:
                self._flush_row(res)
            return res

        try:
            result = super().start(
                self.wrap_grid(grid),
                initial_arrays,
                num_rounds=num_rounds,
                timeout=timeout,
                train_config=train_config,
                evaluate_config=evaluate_config,
                evaluate_fn=evaluate_and_record,
            )
            if len(result.arrays) == 0 and len(initial_arrays) > 0:
                # Flower's Result holds an empty model when no round applied one: the model
                # the federation holds is the initial one, so that is what is returned
                log(WARNING, "no round applied an update (see rounds.jsonl): the returned "
                    "model is the initial one")
                result.arrays = initial_arrays
            return result
        finally:
            self._flush_row(None)
            if self._wrapped_grid is not None:
                self._wrapped_grid.collect_late()

    def deadline_s(self, timeout: float | None) -> float:
        """Wall-clock limit of the current coded round (used by the grid)."""
        if self.timing == "virtual":
            limit = self.round_timeout
        elif self._round is not None and self._round.number == 1:
            limit = max(self.straggler_timeout, self.warmup_timeout)
        else:
            limit = self._deadline
        limit = min(limit, timeout) if timeout else limit
        state = self._round
        if (self.stop_late_work and self.timing == "wallclock" and state is not None
                and state.number > 1 and state.sent):
            # the workers stop the deadline after their message was created: count the
            # round's deadline from the same moment (not from the end of the push), so that no
            # worker stops before the server stops waiting for it
            created = min(float(msg.metadata.created_at) for msg in state.sent.values())
            limit = max(limit - max(time.time() - created, 0.0), 0.0)
        return limit

    @property
    def _deadline(self) -> float:
        """The current round's deadline (seconds from its start), as the clock holds it."""
        return self.clock.straggler_timeout

    def _round_deadline(self) -> float:
        """This round's deadline (seconds from its start): ``straggler_timeout``, or with
        ``auto_deadline`` that factor times the predicted time of this round's code (the one
        ``s="auto"`` chose, or the fixed code with ``busy="fit"``) when it has a finite
        prediction, if shorter."""
        limit = self.straggler_timeout
        if self.auto_deadline is not None and self._estimating and self._decision is not None:
            predicted = self._decision.expected_time
            if math.isfinite(predicted) and predicted > 0:
                backoff = self.DEADLINE_BACKOFF ** min(self._missed_deadlines, 30)
                limit = min(limit, self.auto_deadline * backoff * predicted)
        return limit

    def first_reply_deadline_s(self) -> float | None:
        """Wallclock round 1: the straggler deadline counts from the first reply (start-up)."""
        if self.timing == "wallclock" and self._round is not None and self._round.number == 1:
            return self.straggler_timeout
        return None

    def on_unsent(self, messages: list[Message]) -> None:
        """Messages the grid refused: those workers are stragglers of this round, not busy."""
        state = self._round
        for msg in messages:
            if state is not None:
                worker = state.worker_of.get(msg.metadata.dst_node_id)
                state.sent.pop(worker, None)
            log(WARNING, "message to node %s was not accepted by the grid: straggler",
                msg.metadata.dst_node_id)

    def on_reply(self, reply: Message) -> None:
        """Validate a reply of the current round once, as it arrives."""
        state = self._round
        if state is None:
            return
        mid = reply.metadata.message_id
        if mid and mid in state.seen:
            return
        if mid:
            state.seen.add(mid)
        reply_bytes = _payload_bytes(reply)
        state.bytes_up += reply_bytes
        node = reply.metadata.src_node_id
        worker = state.worker_of.get(node)
        if worker is None and reply.has_error():
            # an error reply the SuperLink writes for an unreachable node carries its own id:
            # it is the failure of the node whose message it answers
            for w, sent in state.sent.items():
                if sent.metadata.message_id and (
                        sent.metadata.message_id == reply.metadata.reply_to_message_id):
                    worker, node = w, state.cohort[w]
                    break
        if (reply.has_error() and reply.error.code == protocol.STOPPED_CODE
                and worker in state.sent and worker not in state.answered
                and reply.metadata.group_id == str(state.number)):
            state.answered.add(worker)  # a straggler that stopped at the deadline: not a fault
            state.stopped.append(worker)
            log(INFO, "round %d: node %s stopped at the deadline (%s)", state.number, node,
                public_reason(reply.error.reason))
            return
        try:
            if worker is None:
                raise RejectedReply("unknown sender")
            state.answered.add(worker)
            if worker not in state.sent:
                raise RejectedReply("sender was not sent work this round")
            if reply.metadata.group_id != str(state.number):
                raise RejectedReply(f"reply to round {reply.metadata.group_id!r}")
            if worker in state.valid:
                raise RejectedReply("duplicate sender")
            parsed = protocol.parse_reply(
                reply,
                worker=worker,
                round=state.number,
                layout=state.reply_layout,
                dtypes=_wire_dtypes(state),
                # wallclock: the values are checked in the decoding pass, off the critical path
                check_values=self.timing == "virtual",
            )
            try:
                check_reply_sizes(state.code, worker, parsed.sizes, parsed.num_examples)
            except RejectedReply:  # provably inconsistent with itself: an offence
                self._quarantine.offend(state.number, [node],
                                        "partition sizes that contradict its num-examples")
                raise
            if state.probe is not None:
                z, size = state.probe.measure(parsed.arrays, parsed.num_examples,
                                              parsed.metrics)
                parsed.extra["z"], parsed.extra["size"] = z, size
                if not (np.all(np.isfinite(z)) and (size is None or math.isfinite(size))):
                    raise RejectedReply("arrays contain NaN or Inf, or overflow float64")
        except RejectedReply as why:
            _reject(state, node, worker, str(why))
            return
        parsed.extra["bytes"] = reply_bytes
        state.valid[worker] = parsed
        self._fingerprints.record(state.number, reply)  # cached: must not change afterwards
        if state.tracker is not None:
            state.tracker.add(worker)

    def prioritize(self, replies: list[Message]) -> list[Message]:
        """Order a batch of replies pulled together so that a decodable set is validated first.

        Round-robin over the code's blocks still undecodable (the first reply of each such
        block, then the second, ...), then the rest in arrival order: when many replies arrive
        at once, the round can return after validating one reply per FRC group instead of all.
        """
        state = self._round
        if state is None or self.timing != "wallclock":
            return replies
        pending = _tracker(state).pending_blocks
        block_of = state.code.block_of
        seen: dict[int, int] = {}
        keys = []
        for index, reply in enumerate(replies):
            worker = state.worker_of.get(reply.metadata.src_node_id)
            block = block_of(worker) if worker is not None else -1
            if block in pending:
                seen[block] = seen.get(block, 0) + 1
                keys.append((0, seen[block], index))
            else:
                keys.append((1, 0, index))
        return [replies[i] for *_, i in sorted(keys)]

    def ready(self) -> bool:
        """Wallclock early return: the valid replies so far satisfy the stopping rule.

        Exact decodability is tracked per reply (only the new reply's block is re-solved);
        the full rule (``min_replies``, ``verify``) runs once the valid replies decode.
        """
        state = self._round
        if self.timing != "wallclock" or state is None:
            return False
        enough = self._stopping_replies(state.code)
        if enough is not None and len(state.valid) >= enough:
            return True
        if not _tracker(state).decodable:
            return False
        if not self.verify or state.probe is None:
            return True
        return self._decodable(state.code)(sorted(state.valid))

    def _decodable(self, code: GradientCode) -> Callable[[list[int]], bool]:
        enough = self._stopping_replies(code)
        state = self._round

        def rule(workers: list[int]) -> bool:
            if enough is not None and len(workers) >= enough:
                return True
            if not (workers and code.is_decodable(workers)):
                return False
            if not self.verify or state is None or state.probe is None:
                return True
            verdict = self._verdict(state, workers)
            kept = [w for w in workers if w not in verdict.excluded]
            return verdict.status == "verified" and code.is_decodable(kept)

        return rule

    def _verdict(self, state: _Round, workers: list[int]) -> Verdict:
        z = {w: state.valid[w].extra["z"] for w in workers}
        return verify_replies(state.code, z, workers, self.verify_tolerance,
                              _sizes(state, workers), cache=state.probe.verdicts)

    def _probe_for(self, code: GradientCode, state: _Round) -> Probe | None:
        """The round's probe (:func:`~fl_gradcode.flower.integrity.round_probe`)."""
        probe = round_probe(code, state.reply_layout, self.verify, self.code_options)
        if self.verify and probe is None and not self._warned_unverifiable:
            log(WARNING, "verify=True: round %d uses s=0 (no redundancy): such rounds are "
                "applied unverified (verified=None in rounds.jsonl)", state.number)
            self._warned_unverifiable = True
        return probe

    def on_late_reply(self, reply: Message) -> None:
        """A reply to an earlier round: counted and dropped, never decoded."""
        if reply.has_error() and reply.error.code == protocol.STOPPED_CODE:
            self._stopped_late += 1
            log(INFO, "node %s stopped its work on round %s at the deadline",
                reply.metadata.src_node_id, reply.metadata.group_id)
            return
        self._late += 1
        log(
            INFO,
            "dropped late reply from node %s to round %s",
            reply.metadata.src_node_id,
            reply.metadata.group_id,
        )

    # ------------------------------------------------------------------ identities
    def _identify(self, grid: Any, nodes: list[int], server_round: int) -> list[int]:
        """This round's members among the sampled ``nodes`` (sorted by partition id): those
        that passed the handshake with an identity consistent with the federation's
        (:class:`~fl_gradcode.flower.membership.Membership`); the others are stragglers."""
        inner = grid.inner if isinstance(grid, EarlyReturnGrid) else grid
        return self.membership.admit(inner, nodes, server_round)

    # ------------------------------------------------------------------ Strategy API
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Any
    ) -> Iterable[Message]:
        """Sample with the inner strategy; send each idle member its coded instruction."""
        compat.check_caller(self)  # an outer Flower DP wrapper cannot compose
        self._flush_row(None)
        self._round = None
        if self.stopped or (self.accountant is not None and not self.accountant.can_run_round()):
            if not self.stopped:
                log(INFO, "round %d would exceed target-epsilon: training stops", server_round)
            self.stopped = True
            return []
        inner_msgs = list(self.inner.configure_train(server_round, arrays, config, grid))
        if not inner_msgs:
            return []
        content_of = {m.metadata.dst_node_id: m.content for m in inner_msgs}
        cohort = self._identify(grid, list(content_of), server_round)
        if not cohort:  # nobody passed the handshake: the round is idle, the run goes on
            return []
        held = self._quarantine.held(server_round, cohort)  # stragglers: no work
        if isinstance(grid, EarlyReturnGrid):
            grid.collect_late()
        busy_nodes = self._busy(grid, cohort)
        if self.adaptive:
            code = self._adaptive_code(len(cohort), busy_nodes, cohort)
        else:
            code = self._fixed_code(len(cohort), busy_nodes, cohort)
        partitions = self._partitions(code, cohort)
        array_key = self._array_key(inner_msgs[0].content)
        global_arrays = inner_msgs[0].content.array_records[array_key]
        theta = {name: protocol.array_view(arr) for name, arr in global_arrays.items()}
        # excluded by auto (heterogeneity-aware assignment): nothing to compute, nothing sent.
        # (Other codes' empty rows, e.g. bgc's, are still sent: their replies count.)
        excluded_workers: tuple[int, ...] = ()
        if self.adaptive and self._decision is not None:
            excluded_workers = self._decision.excluded
        excluded = {cohort[w] for w in excluded_workers}
        queued = self._queued(busy_nodes, cohort) - excluded
        if busy_nodes | excluded >= set(cohort) and not queued:  # never spend a round on nothing
            if isinstance(self.clock, VirtualClock):
                self.clock.wait_for_any_free(cohort)
            elif isinstance(grid, EarlyReturnGrid):
                grid.wait_until_free(set(cohort), self.round_timeout)
            busy_nodes = self._busy(grid, cohort)
            queued = self._queued(busy_nodes, cohort) - excluded
        queued, busy_nodes = queued - held, busy_nodes | held  # quarantined: no work
        queued_workers = {w: node for w, node in enumerate(cohort) if node in queued}
        busy_nodes = busy_nodes - queued - excluded  # busy and given no work this round
        self.clock.straggler_timeout = self._round_deadline()
        self.clock.start_round(queued_workers)
        state = _Round(
            number=server_round,
            code=code,
            cohort=cohort,
            partitions=partitions,
            sent={},
            busy=sorted(w for w, node in enumerate(cohort) if node in busy_nodes),
            excluded=sorted(excluded_workers),
            layout={name: tuple(a.shape) for name, a in theta.items()},
            reply_layout=_reply_layout(code, theta),
            dtypes={name: a.dtype for name, a in theta.items()},
            theta=theta,  # zero-copy views of the global arrays, model dtype
            array_key=array_key,
            wall_start=time.monotonic(),
        )
        weight_key = getattr(self.inner, "weighted_by_key", "num-examples")
        wire = self.wire_for(code)
        state.wire = wire
        state.quarantined = sorted(held)
        state.probe = self._probe_for(code, state)
        messages = []
        unit_loads = None
        if self._estimating and isinstance(self.clock, VirtualClock):
            from ..adaptive import code_loads

            unit_loads = code_loads(code, 1.0)
        # wallclock: the mod stops at the deadline (virtual timing: the clock models it)
        stop_after_s = 0.0
        if self.stop_late_work and self.timing == "wallclock" and server_round > 1:
            stop_after_s = self._deadline
        for worker, node in enumerate(cohort):
            if node in busy_nodes or node in excluded:
                continue
            assigned = list(code.assignment(worker))
            coefs = code.encoding_coefficients(worker)
            delay = 0.0
            if self.timing == "wallclock" and self.latency is not None:
                delay = self._delay(node, server_round, self._load(code, worker, partitions))
            instruction = Instruction(
                op=protocol.OP_TRAIN,
                round=server_round,
                worker=worker,
                seed=self.seed,
                nonce=self.nonce,
                partition_ids=tuple(partitions[j].partition_id for j in assigned),
                num_partitions=tuple(partitions[j].num_partitions for j in assigned),
                coefficients=tuple(float(c) for c in coefs),
                dp=self.dp.mode,
                clip_norm=self.dp.clip_norm,
                noise_multiplier=self.dp.noise_multiplier,
                dp_noise=self.dp.noise,
                timing=self.timing,
                delay_s=delay,
                weight_key=weight_key,
                wire=wire,
                chunk_coefficients=_chunk_coefficients(code, worker),
                stop_after_s=stop_after_s,
            )
            msg = protocol.instruction_message(
                content_of[node], instruction, node, str(server_round)
            )
            state.sent[worker] = msg
            state.bytes_down += _payload_bytes(msg)
            if unit_loads is not None:  # queued behind its unfinished jobs, or alone
                # [sent at, units, reply arrival (None: not yet), deadline (work stops)]
                job = [self.clock.now, float(unit_loads[worker]), None,
                       self.clock.now + self._deadline]
                jobs = self._outstanding.get(node, []) if node in queued else []
                self._outstanding[node] = [*jobs, job]
            messages.append(msg)
        self._round = state
        return messages

    def _array_key(self, content: RecordDict) -> str:
        key = getattr(self.inner, "arrayrecord_key", "arrays")
        if key in content.array_records:
            return key
        if len(content.array_records) == 1:
            return next(iter(content.array_records))
        raise ValueError(f"the inner strategy's train content has no ArrayRecord {key!r}")

    def _partitions(self, code: GradientCode, cohort: list[int]) -> list[Identity]:
        """Code partition j -> the data partition it stands for: cohort member j's own, or
        (if the code has fewer partitions than clients) the app's partition j of k."""
        if code.k == len(cohort):
            return [self.identities[node] for node in cohort]
        if not self._warned_repartition:
            self._warned_repartition = True
            log(
                WARNING,
                "code %s has k=%d partitions for %d clients: the app's data is split into "
                "k partitions (partition-id=j, num-partitions=k)",
                code.name,
                code.k,
                len(cohort),
            )
        return [Identity(j, code.k) for j in range(code.k)]

    def _busy(self, grid: Any, cohort: list[int]) -> set[int]:
        if isinstance(self.clock, VirtualClock):
            return self.clock.busy(cohort)
        if isinstance(grid, EarlyReturnGrid):
            return grid.busy_nodes() & set(cohort)
        return set()

    def _load(self, code: GradientCode, worker: int, partitions: list[Identity]) -> float:
        """The worker's examples over one client's share (partitions if sizes are unknown)."""
        assigned = code.assignment(worker)
        known = [self.partition_sizes.get(_key(p)) for p in partitions]
        sizes = [x for x in known if x is not None]
        if not sizes:
            return float(len(assigned)) * code.n / code.k
        mean = float(np.mean(sizes))
        total = sum(x if x is not None else mean for x in known)
        share = total / code.n
        if share <= 0:
            return float(len(assigned)) * code.n / code.k
        mine = sum(known[j] if known[j] is not None else mean for j in assigned)
        return float(mine / share)

    def _delay(self, node: int, server_round: int, load: float) -> float:
        """The simulated delay of ``node``: keyed by its partition id, so that a node keeps
        its latency profile (persistently slow, its trace worker) whichever cohort samples it
        and wherever it sits in the cohort (the worker index when every node is sampled and
        the partition ids are ``0..n-1``, as in simulation: the same delays as before)."""
        if self.latency is None:
            return 0.0
        identity = self.identities.get(node)
        key = identity.partition_id if identity is not None else node
        return client_delay(
            self.latency, worker=key, round_index=server_round, load=load, seed=self.seed
        )

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Validate -> select -> decode -> privatise -> inner strategy -> record."""
        replies = list(replies)
        compat.check_caller(self)
        self._fingerprints.check(server_round, replies, compat.outer_name(self))
        state = self._round
        if state is None or state.number != server_round:
            return None, self._record_idle(server_round)
        if self._check_inner and state.sent:  # once: an aggregation of the average only?
            compat.check_averaging(self.inner, server_round, next(iter(state.sent.values())),
                                   state.array_key, state.theta,
                                   getattr(self.inner, "weighted_by_key", "num-examples"))
            self._check_inner = False
        for reply in replies:
            self.on_reply(reply)
        wall_s = time.monotonic() - state.wall_start
        self._check_sizes(state)
        arrivals = {w: self._arrival(state, w, r) for w, r in state.valid.items()}
        window = self.clock.window(arrivals, self._decodable(state.code), len(state.sent))
        for w in window.stopped:  # virtual timing: stopped at the deadline, never replied
            state.bytes_up -= int(state.valid[w].extra.get("bytes", 0))
            state.stopped.append(w)
        arrivals_by_node = {state.cohort[w]: t for w, t in arrivals.items()}
        self.clock.finish_round(
            [state.cohort[w] for w in state.sent],
            arrivals_by_node,
            window.end,
            answered=[state.cohort[w] for w in state.answered],
        )
        if self._estimating:
            self._observe(state, arrivals, window)
            self._save_latency_state()
        late = self._late + len(window.late)
        self._late = 0
        stopped = len(state.stopped) + self._stopped_late
        self._stopped_late = 0
        used = sorted(window.used)
        verdict = None
        if state.probe is not None and len(used) > 1:
            verdict = self._verdict(state, used)
            used = [w for w in used if w not in verdict.excluded]
            for w in verdict.excluded:
                log(WARNING, "round %d: worker %d (node %s) contradicts the other replicas; "
                    "excluded", server_round, w, state.cohort[w])
            self._quarantine.offend(server_round, [state.cohort[w] for w in verdict.excluded],
                                    "excluded as inconsistent")
            # an unlocatable contradiction is an offence of those involved only when they are
            # few enough to be one replica group (FRC twins with s = 1); a contradiction
            # spread over a cyclic code's whole block says nothing about who is wrong
            if len(verdict.involved) <= state.code.s + 1:
                self._quarantine.offend(server_round,
                                        [state.cohort[w] for w in verdict.involved],
                                        "in a contradiction no single exclusion explains")
        decoding = self._decoding(state, used)
        if (verdict is not None and verdict.status == "verified" and decoding is not None
                and not _is_chunked(state.code)):
            z = {w: state.valid[w].extra["z"] for w in used}
            off = applied_disagreement(state.code, z, used, decoding.coefficients,
                                       _sizes(state, used))
            if not off <= self.verify_tolerance:  # NaN/inf included: never agreement
                verdict.status, verdict.unresolved = "contradicted", True
                verdict.disagreement = max(verdict.disagreement, off)
        decode = "skipped"
        if decoding is not None and (decoding.exact or decoding.error <= self.max_decode_error):
            decode = "exact" if decoding.exact else "approx"
        if verdict is not None and verdict.unresolved:
            log(WARNING, "round %d: replies disagree (relative %.3g) and no single reply explains "
                "it; nothing is applied", server_round, verdict.disagreement)
            decode = "skipped"
        elif self.verify and state.probe is not None and decode != "skipped" and (
            verdict is None or verdict.status != "verified"
        ):
            log(WARNING, "round %d: verify=True and the replies could not all be cross-checked "
                "before the deadline; nothing is applied", server_round)
            decode = "skipped"
        arrays_out, inner_metrics, num_examples, noise_std = None, None, None, None
        if decode != "skipped":
            outcome = self._decode_and_apply(state, used, decoding)
            bad = [] if outcome is not None else self._reject_non_finite(state, used)
            if bad:  # replies whose values were not read on arrival: drop them, decode again
                used = [w for w in used if w not in bad]
                decoding = self._decoding(state, used)
                ok = decoding is not None and (
                    decoding.exact or decoding.error <= self.max_decode_error
                )
                decode = ("exact" if decoding.exact else "approx") if ok else "skipped"
                outcome = self._decode_and_apply(state, used, decoding) if ok else None
            if outcome is None:
                decode = "skipped"
            else:
                arrays_out, inner_metrics, num_examples, noise_std = outcome
        if self.accountant is not None and state.sent:
            # the round released noisy updates, used or not; at its code's multiplier
            self.accountant.step(self._round_noise_multiplier(state))
        if decode == "exact":
            self._missed_deadlines = 0
        elif self._deadline < self.straggler_timeout:  # a predicted deadline was missed
            self._missed_deadlines += 1
        row = self._record(
            server_round,
            decode=decode,
            s=state.code.s,
            clients_used=used,
            replies_read=0 if decode == "skipped" else _replies_read(decoding, used),
            stragglers=sorted(set(range(state.code.n)) - set(used)),
            busy=state.busy,
            excluded=state.excluded,
            late_dropped=late,
            stopped_at_deadline=stopped,
            rejected=len(state.rejected),
            rejected_reasons=[reason for _, reason in state.rejected],
            decode_error=float(decoding.error) if decoding is not None else 1.0,
            num_examples=num_examples,
            expected_round_s=self._expected_round_s(),
            wire=state.wire,
            verified=None if verdict is None else verdict.status,
            quarantined=state.quarantined,
            inconsistent=[] if verdict is None else verdict.excluded,
            disagreement=None if verdict is None else verdict.disagreement,
            bytes_up=state.bytes_up,
            bytes_down=state.bytes_down,
            # measured client compute of the valid replies (the mod's compute-s)
            compute_s=float(sum(r.compute_s for r in state.valid.values())),
            round_virtual_s=float(window.end - self.clock.round_start),
            round_deadline_s=self._deadline,
            wall_s=float(wall_s),
            central_noise_std=noise_std,
            **self._names(state, used, verdict),
        )
        if not state.valid and missing_keys(reason for _, reason in state.rejected):
            self._flush_row(None)  # the round's row first: then the run ends here
            raise RuntimeError(
                f"round {server_round}: every reply was refused because the clients have no "
                f"DP partition keys (dp={self.dp.mode!r}); nothing can be trained. "
                + MISSING_KEYS_HELP)
        if arrays_out is not None and self.recorder is not None:
            self.recorder.save_model({k: v.numpy() for k, v in arrays_out.items()})
        return arrays_out, self._metrics(row, inner_metrics)

    def _observe(self, state: _Round, arrivals: dict[int, float], window: Any) -> None:
        """Feed the round to the latency estimator: replies in time are observed, the others
        censored at the round's end (late ones observed when the clock passes them)."""
        from ..adaptive import code_loads

        estimator = self._latency
        if estimator is None:
            return
        # the estimator's index of each worker (every member was registered this round)
        index = [self._node_index[node] for node in state.cohort]
        duration = max(window.end - self.clock.round_start, 1e-9)
        elapsed = np.full(estimator.n, np.nan)
        loads = np.zeros(estimator.n)
        sent_loads = code_loads(state.code, 1.0)
        for w in state.sent:
            loads[index[w]] = sent_loads[w]
        backlog = self.clock.backlog if isinstance(self.clock, VirtualClock) else {}
        late = []
        for w, t in arrivals.items():
            t = t + backlog.get(w, 0.0)  # the arrival: queued work runs after the earlier job
            # stopped at the deadline (the clock's decision): free when the clock frees it
            stopped = w in window.stopped
            end = self.clock.busy_until[state.cohort[w]] if stopped else self.clock.round_start + t
            jobs = self._outstanding.get(state.cohort[w])
            if w in state.sent and jobs:  # this round's job: known done once it arrives
                jobs[-1][2] = end
            if w in state.sent:
                if t <= duration:
                    elapsed[index[w]] = t
                elif stopped:  # censored at the deadline
                    late.append((index[w], end, self.clock.straggler_timeout, True))
                else:
                    late.append((index[w], end, t, False))
        busy = np.zeros(estimator.n)
        busy[index] = self._waited(state, duration)
        rid = estimator.update(elapsed, loads, duration, busy=busy)
        for i, end, seen, stopped in late:
            self._late_observations.append((end, rid, i, seen, stopped))

    def _waited(self, state: _Round, duration: float) -> np.ndarray:
        """Per worker, seconds from the round's start until its work could start, from the
        server's records: work queued behind earlier jobs starts when the last of their
        replies arrived (a node runs its messages in order). A predecessor not back by the
        round's end, or never back (an error, no answer), leaves the start unknown: the
        whole round (the estimator takes no information from that worker this round)."""
        end = self.clock.round_start + duration
        waited = np.zeros(state.code.n)
        for w in state.sent:
            jobs = self._outstanding.get(state.cohort[w], [])
            before = [job[2] for job in jobs[:-1]]  # the last job is this round's
            if not before:
                continue
            if any(arrival is None or arrival > end for arrival in before):
                waited[w] = duration
            else:
                waited[w] = max(max(before) - self.clock.round_start, 0.0)
        return waited

    def _arrival(self, state: _Round, worker: int, reply: CodedReply) -> float:
        if isinstance(self.clock, WallClock):
            return 0.0
        load = self._load(state.code, worker, state.partitions)
        compute = reply.compute_s if self.measured_compute else 0.0
        transfer = 0.0
        if self.upload_bandwidth is not None:
            transfer = reply.extra.get("bytes", 0) / self.upload_bandwidth
        return (compute + self.compute_cost_s * load
                + self._delay(state.cohort[worker], state.number, load)
                + transfer)

    def _decoding(self, state: _Round, used: list[int]) -> Any:
        """The round's decoding of ``used``: the sparse exact one when enabled."""
        return self._decoder.decoding(state.code, used)

    def _reject_non_finite(self, state: _Round, used: list[int]) -> list[int]:
        """Workers among ``used`` whose replies hold NaN/Inf (read now, if not on arrival)."""
        bad = self._decoder.non_finite(state.valid, used)
        for w, reason in bad.items():
            del state.valid[w]
            _reject(state, state.cohort[w], w, reason)
        return list(bad)

    def _decode_and_apply(self, state: _Round, used: list[int], decoding: Any):
        """Decode the example-weighted average, privatise, hand it to the inner strategy."""
        decoded = self._decoder.decode(state.code, state.valid, used, decoding, state.theta,
                                       state.dtypes, round_number=state.number,
                                       sizes=state.sizes)
        if decoded is None:
            return None
        return self._decoder.apply(decoded, round_number=state.number,
                                   array_key=state.array_key, reply_to=state.sent[used[0]])

    def _check_sizes(self, state: _Round) -> None:
        """Cross-check the replicas' ``partition-sizes``: outvoted replies are excluded as
        rejected (an offence); the agreed sizes are the round's."""
        agreed, excluded = self._decoder.privatiser.check_sizes(
            state.code, state.partitions, {w: r.sizes for w, r in state.valid.items()},
            state.number)
        for worker, reason in sorted(excluded.items()):
            del state.valid[worker]
            _reject(state, state.cohort[worker], worker, reason)
        self._quarantine.offend(state.number, [state.cohort[w] for w in sorted(excluded)],
                                "partition sizes the other replicas contradict")
        if excluded:
            state.tracker = None  # rebuilt from the remaining replies
        state.sizes = agreed

    def _round_noise_multiplier(self, state: _Round) -> float | None:
        """The noise multiplier the round is accounted at (``None``: the accountant's)."""
        return self._decoder.privatiser.noise_multiplier(state.code)

    def _metrics(self, row: dict[str, Any], inner: MetricRecord | None) -> MetricRecord:
        ours = {
            "decoded": int(row["decode"] != "skipped"),
            "exact": int(row["decode"] == "exact"),
            "s": int(row["s"]),
            "clients_used": len(row["clients_used"]),
            "stragglers": len(row["stragglers"]),
            "busy": len(row["busy"]),
            "late_dropped": int(row["late_dropped"]),
            "rejected": int(row["rejected"]),
            "decode_error": float(row["decode_error"]),
            "virtual_s": float(row["virtual_s"]),
            "wall_s": float(row["wall_s"]),
            "stopped": int(self.stopped),
        }
        if row["epsilon"] is not None and math.isfinite(row["epsilon"]):
            ours["epsilon"] = float(row["epsilon"])
        # ours under one namespace: the app's own metrics (the inner strategy's) stay as they are
        merged = dict(inner.items()) if inner is not None else {}
        merged.update({METRIC_PREFIX + key: value for key, value in ours.items()})
        return MetricRecord(merged)

    def _record_idle(self, server_round: int) -> MetricRecord:
        """A round in which nothing was sent (budget exhausted or an empty cohort)."""
        row = self._record(server_round, late_dropped=self._late,
                           stopped_at_deadline=self._stopped_late)
        self._late, self._stopped_late = 0, 0
        return self._metrics(row, None)

    def _expected_round_s(self) -> float | None:
        """The predicted time of the round's code (``auto``, or a fixed code with
        ``busy="fit"``); ``None`` for other fixed codes, before any observation (no estimate:
        ``choose_s`` starts at ``s_max`` unpriced) and when the prediction is not finite (no
        candidate predicted to decode)."""
        if self._decision is None or not self._estimating:
            return None
        value = self._decision.expected_time
        return value if math.isfinite(value) else None

    def _record(self, server_round: int, **fields: Any) -> dict[str, Any]:
        """The round's row for ``rounds.jsonl`` (every key, defaults for a round that decoded
        nothing), written now or after ``evaluate_fn`` adds accuracy and loss."""
        row = {
            "round": server_round,
            "decode": "skipped",
            "s": self.s,
            "clients_used": [],
            "replies_read": 0,
            "stragglers": [],
            "busy": [],
            "excluded": [],
            "late_dropped": 0,
            "stopped_at_deadline": 0,
            "rejected": 0,
            "rejected_reasons": [],
            "decode_error": 1.0,
            "num_examples": None,
            "expected_round_s": None,
            "wire": None,
            "verified": None,
            "quarantined": [],
            "inconsistent": [],
            "disagreement": None,
            "bytes_up": 0,
            "bytes_down": 0,
            "compute_s": 0.0,
            "virtual_s": float(self.clock.now),
            "round_virtual_s": 0.0,
            "round_deadline_s": None,  # nothing sent: no deadline
            "wall_s": 0.0,
            "accuracy": None,
            "loss": None,
            "epsilon": None if self.accountant is None else self.accountant.epsilon,
            "central_noise_std": None,
            "stopped": self.stopped,
            "unidentified": [],  # sampled nodes whose handshake failed this round
            "identity_rejected": [],  # sampled nodes excluded for their identity claims
            "partitions": empty_names(),  # per group of clients: their data partition ids
            "nodes": empty_names(),  # ... and their node ids
            **self.membership.row_fields(server_round),
            **fields,
        }
        self._pending_row = row
        if self.evaluate_fn is None:
            self._flush_row(None)
        return row

    def _names(self, state: _Round, used: list[int], verdict: Any) -> dict[str, Any]:
        """The row's ``partitions`` and ``nodes`` (every group of clients named by data
        partition and node id), after logging each rejected reply on one line (and its
        traceback in ``debug.log``)."""
        report_rejections(state.number, state.rejected, state.rejected_details,
                          self.identities, self.recorder)
        groups = {
            "used": used,
            "stragglers": sorted(set(range(state.code.n)) - set(used)),
            "busy": state.busy,
            "excluded": state.excluded,
            "inconsistent": [] if verdict is None else verdict.excluded,
            "stopped": sorted(set(state.stopped)),
        }
        partitions, nodes = client_names(state.cohort, self.identities, groups,
                                         [node for node, _ in state.rejected])
        return {"partitions": partitions, "nodes": nodes}

    def _flush_row(self, evaluation: MetricRecord | None) -> None:
        row, self._pending_row = self._pending_row, None
        if row is None:
            return
        if evaluation is not None:
            for key in ("accuracy", "loss"):
                if key in evaluation:
                    row[key] = float(evaluation[key])
        self.history.append(row)
        if self.recorder is not None:
            self.recorder.record(row)
        log(
            INFO,
            "[round %d] %-7s from %d replies (s=%d, %d stragglers, %d busy,%s %d late, "
            "%d rejected, err %.2g)%s | virtual %.2f s, wall %.2f s",
            row["round"],
            row["decode"],
            len(row["clients_used"]),
            row["s"],
            len(row["stragglers"]),
            len(row["busy"]),
            f" {len(row['excluded'])} excluded," if row["excluded"] else "",
            row["late_dropped"],
            row["rejected"],
            row["decode_error"],
            "" if row["accuracy"] is None else f" | acc {row['accuracy']:.3f}",
            row["virtual_s"],
            row["wall_s"],
        )

    # ------------------------------------------------------------------ evaluation
    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Any
    ) -> Iterable[Message]:
        """Federated evaluation as the inner strategy does it (each node on its own data)."""
        return self.inner.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        valid = [r for r in replies if not r.has_error()]
        try:
            return self.inner.aggregate_evaluate(server_round, valid)
        except Exception as exc:  # a bad evaluate reply must not end the run
            log(WARNING, "round %d: evaluation not aggregated: %s", server_round, exc)
            return None

    def summary(self) -> None:
        code = self.code_spec if isinstance(self.code_spec, str) else self.code_spec.name
        log(
            INFO,
            "\t├── GradientCoding(%s): code %s, s=%d, timing=%s, straggler_timeout=%.1f s, "
            "dp=%s",
            type(self.inner).__name__,
            code,
            self.s,
            self.timing,
            self.straggler_timeout,
            self.dp.mode,
        )
        self.inner.summary()


def _sizes(state: _Round, workers: list[int]) -> dict[int, float] | None:
    return reply_sizes({w: state.valid[w].extra for w in workers})


def _wire_dtypes(state: _Round) -> dict[str, np.dtype]:
    """The dtype every reply array must have in this round (the instruction's ``wire``)."""
    return wire_dtypes(state.code, state.dtypes, state.wire)


def _is_chunked(code: GradientCode) -> bool:
    return code.chunks > 1


def _chunk_coefficients(code: GradientCode, worker: int) -> tuple[float, ...]:
    return instruction_chunks(code, worker)


def _reply_layout(code: GradientCode, theta: dict[str, np.ndarray]) -> dict[str, tuple]:
    return ReplyLayout.of(code, theta).arrays


def _tracker(state: _Round) -> Any:
    """The round's decodability tracker, built on first use from the valid replies so far."""
    if state.tracker is None:
        state.tracker = state.code.tracker()
        for worker in state.valid:
            state.tracker.add(worker)
    return state.tracker


def _replies_read(decoding: Any, used: list[int]) -> int:
    """How many of the ``used`` replies the decoder reads (nonzero coefficients)."""
    return replies_read(decoding, used)


def _reject(state: _Round, node: int, worker: int | None, reason: str) -> None:
    """Count a rejected reply with its public reason (one line of at most
    ``MAX_REASON_CHARS`` characters: the text may come from the client), and say so in the
    log."""
    summary, detail = split_reason(reason)
    reason = public_reason(summary)
    state.rejected.append((node, reason))
    # (worker, reason, traceback): logged with the partition when the round is recorded
    state.rejected_details.append((worker, reason, detail))
    log(DEBUG, "round %d: rejected reply from node %s (worker %s): %s", state.number, node,
        "?" if worker is None else worker, reason)


def _payload_bytes(msg: Message) -> int:
    """Bytes of the arrays a message carries (what dominates its size on the wire)."""
    if msg.has_error():
        return 0
    try:
        return sum(
            len(arr.data)
            for rec in msg.content.values()
            if isinstance(rec, ArrayRecord)
            for arr in rec.values()
        )
    except Exception:  # a malformed message is counted as empty, rejected elsewhere
        return 0


def _read_latency_state(path: str | None) -> dict[str, Any] | None:
    """The latency observations saved at ``path`` (``None``: no path, or no file yet),
    validated now so that a bad file stops the run before its first round."""
    if path is None or not os.path.exists(path):
        return None
    from ..adaptive import LatencyEstimator

    try:
        with open(path, encoding="utf-8") as fh:
            state = json.load(fh)
        LatencyEstimator.validate_state(state)
    except (OSError, ValueError, OverflowError, RecursionError) as exc:
        raise ValueError(f"latency_state={path!r} is not a file of latency observations "
                         f"written by GradientCoding: {exc}") from exc
    return state


def _key(identity: Identity) -> tuple[int, int]:
    return (identity.partition_id, identity.num_partitions)
