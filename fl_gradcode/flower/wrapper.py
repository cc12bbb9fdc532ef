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

The strategy assembles single-purpose collaborators: the option groups
(:mod:`~fl_gradcode.flower.options`), the clock (:mod:`~fl_gradcode.flower.clock`: arrival,
busy members, waiting), the deadline policy (:mod:`~fl_gradcode.flower.deadline_policy`), the
reply collector (:mod:`~fl_gradcode.flower.collector`: the grid's callbacks), the round state
(:mod:`~fl_gradcode.flower.round_state`) and the round log (:class:`~.records.RoundLog`).

References:
    Tandon, Lei, Dimakis, Karampatziakis, "Gradient Coding: Avoiding Stragglers in Distributed
    Learning", ICML 2017, https://arxiv.org/abs/1612.03301.
    McMahan, Moore, Ramage, Hampson, Agüera y Arcas, "Communication-Efficient Learning of Deep
    Networks from Decentralized Data", AISTATS 2017, https://arxiv.org/abs/1602.05629 (FedAvg).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
import weakref
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp.strategy import FedAvg, Result, Strategy

from ..codes import GradientCode
from ..latency import LatencyModel
from ..privacy import (
    DPConfig,
    PrivacyAccountant,
    ServerNoise,
    independent_noise_multiplier,
    make_mechanism,
)
from ..results import RoundRecorder
from . import compat, protocol
from .clock import make_clock
from .closer import RoundCloser
from .collector import ReplyCollector
from .deadline_policy import DeadlinePolicy
from .dispatch import Dispatcher
from .grid import EarlyReturnGrid
from .membership import Membership
from .opener import RoundOpener
from .options import Options
from .policy import CodePolicy, is_policy_factory, make_code_policy
from .protocol import Identity
from .quarantine import Quarantine
from .records import RoundLog, RoundOutcome, quiet_inner_aggregation
from .reports import (
    MISSING_KEYS_HELP,
    agree_sizes,
    central_noise_scale,
    missing_keys,
    outlying_sizes,
)
from .round_state import RoundState as _Round
from .round_state import partition_key as _key
from .workload import Workload

__all__ = ["GradientCoding"]


class GradientCoding(Strategy):
    """Gradient-coded rounds around any Flower strategy.

    ``strategy``: the inner strategy (FedAvg, FedAdam, ...); it samples the cohort, builds the
    train content and applies its own aggregation to the decoded example-weighted average.
    Refused (:mod:`~fl_gradcode.flower.compat`, ``docs/works_with.md``): strategies that
    aggregate individual replies (Krum, FedMedian, ...; an unknown ``aggregate_train`` is
    checked once, on copies, at the first aggregation), Flower's DP wrappers (inside or
    outside), legacy ``flwr.server.strategy`` strategies.

    Every other keyword is an option (same names and defaults as ever), grouped and checked
    by :meth:`~fl_gradcode.flower.options.Options.from_keywords`; each group's docstring
    documents its keywords, the module's docstring the rules between them:
    :class:`~.options.CodeOptions` (``code``, ``s``, ``seed``, ``code_options``, ``m``),
    :class:`~.options.AdaptiveOptions` (``s_max``, ``auto_margin``, ``exclude_slow``,
    ``latency_state``), :class:`~.options.TimingOptions` (``timing``, ``latency``,
    ``measured_compute``, ``compute_cost_s``, ``upload_bandwidth``, ``busy``,
    ``stop_late_work``), :class:`~.options.DeadlineOptions` (``straggler_timeout``,
    ``auto_deadline``, ``max_decode_error``, ``min_replies``, ``round_timeout``,
    ``warmup_timeout``), :class:`~.options.IntegrityOptions` (``verify``,
    ``verify_tolerance``), :class:`~.options.WireOptions` (``wire``, ``sparse_decoding``),
    :class:`~.options.PrivacyOptions` (``dp``, ``accountant``, ``server_noise``,
    ``dp_run_nonce``). Records: ``results_dir`` (``rounds.jsonl``, ``final_model.npz``,
    ``config.json``, ``debug.log``: ``docs/records-and-logs.md``), ``run_config`` (written to
    ``config.json``), ``evaluate_fn`` (also accepted by ``start``; its ``accuracy`` and
    ``loss`` go into ``rounds.jsonl``).

    ``code_policy`` (:mod:`~fl_gradcode.flower.policy`): which code each round uses and whom
    to queue. ``None`` (default): built from the keywords above
    (:func:`~fl_gradcode.flower.policy.make_code_policy`). A class (a subclass of
    :class:`~fl_gradcode.flower.policy.AdaptiveCodePolicy` for ``s="auto"``, of
    ``FixedCodePolicy`` otherwise, or any callable taking the same keywords) is built with
    them: how a scheme of one's own plugs in. A policy instance is used as given (its
    ``adaptive``, ``busy`` and ``estimating`` then decide the rounds).

    Each option keeps its flat name as a read-only attribute (``strategy.timing``,
    ``strategy.busy_mode`` for the resolved ``busy``, ...).
    """

    #: auto_deadline: factor of the next deadline after each missed one (RFC 6298, 5.5)
    DEADLINE_BACKOFF = DeadlinePolicy.BACKOFF

    def __init__(
        self,
        strategy: Strategy,
        code: str | GradientCode = "grouped-rs",
        s: int | str = 1,
        *,
        s_max: int | None = None, auto_margin: float = 0.1, exclude_slow: float | None = None,
        latency_state: str | os.PathLike[str] | None = None,
        timing: str = "virtual", latency: LatencyModel | None = None,
        measured_compute: bool = True, compute_cost_s: float = 0.0,
        upload_bandwidth: float | None = None, busy: str | None = None,
        stop_late_work: bool = False,
        straggler_timeout: float = 10.0, auto_deadline: float | None = None,
        max_decode_error: float = 0.5, min_replies: int | None = None,
        round_timeout: float = 600.0, warmup_timeout: float = 120.0,
        verify: bool = False, verify_tolerance: float = 1e-5,
        wire: str = "auto", m: int | None = None, sparse_decoding: bool = True,
        code_options: dict[str, Any] | None = None,
        dp: DPConfig | None = None, accountant: PrivacyAccountant | None = None,
        server_noise: ServerNoise | None = None, dp_run_nonce: str = "",
        seed: int = 0, results_dir: str | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
        run_config: dict[str, Any] | None = None,
        code_policy: CodePolicy | Callable[..., CodePolicy] | None = None,
    ) -> None:
        # refuse what coding cannot make exact (per-client aggregators, DP wrappers, legacy
        # strategies); an unknown aggregation is checked once on the first round
        self._check_inner = compat.check_inner_strategy(strategy, GradientCoding)
        self._fingerprints = compat.ReplyFingerprints()
        options = self.options = Options.from_keywords(
            code=code, s=s, s_max=s_max, auto_margin=auto_margin, exclude_slow=exclude_slow,
            timing=timing, latency=latency, seed=seed, straggler_timeout=straggler_timeout,
            max_decode_error=max_decode_error, min_replies=min_replies,
            round_timeout=round_timeout, warmup_timeout=warmup_timeout,
            measured_compute=measured_compute, compute_cost_s=compute_cost_s,
            upload_bandwidth=upload_bandwidth, dp=dp, accountant=accountant,
            server_noise=server_noise, dp_run_nonce=dp_run_nonce, code_options=code_options,
            wire=wire, m=m, verify=verify, verify_tolerance=verify_tolerance,
            sparse_decoding=sparse_decoding, busy=busy, latency_state=latency_state,
            stop_late_work=stop_late_work, auto_deadline=auto_deadline)
        self.inner, self.code_spec, self.evaluate_fn = strategy, code, evaluate_fn
        self.dp, self.accountant = options.privacy.dp, options.privacy.accountant
        self.server_noise, self.nonce = options.privacy.server_noise, options.privacy.nonce
        self.mechanism = make_mechanism(self.dp)
        t = options.timing
        self.clock = make_clock(t.mode, options.deadline.straggler_timeout, t.stop_late_work,
                                measured_compute=t.measured_compute,
                                compute_cost_s=t.compute_cost_s,
                                upload_bandwidth=t.upload_bandwidth)
        self.code_policy = self._build_policy(code_policy)
        self.deadlines = DeadlinePolicy(options.deadline, self.code_policy.estimating)
        self._quarantine = Quarantine()
        self.collector = ReplyCollector(self.clock, self.deadlines, options.integrity,
                                        self._quarantine, self._fingerprints)
        # per code object, weakly: codes built per round come and go
        self._amplification: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.recorder = (RoundRecorder(results_dir, options.describe(type(strategy).__name__,
                                                                     run_config))
                         if results_dir else None)
        self.membership = Membership(options.deadline.warmup_timeout, self.nonce)
        self.identities: dict[int, Identity] = self.membership.claims
        self.round_log = RoundLog(self.recorder, self.membership, self.clock, options.code.s)
        self.round_log.waits_for_evaluation = evaluate_fn is not None
        self.history: list[dict[str, Any]] = self.round_log.history
        self.partition_sizes: dict[tuple[int, int], float] = {}  # checked sizes only
        self.workload = Workload(self.identities, self.partition_sizes, self.latency, self.seed)
        self.dispatcher = Dispatcher(seed=self.seed, nonce=self.nonce, dp=self.dp,
                                     clock=self.clock, workload=self.workload, inner=strategy,
                                     chunk_coefficients=_chunk_coefficients)
        self.opener = RoundOpener(
            policy=self.code_policy, clock=self.clock, deadlines=self.deadlines,
            quarantine=self._quarantine, workload=self.workload, collector=self.collector,
            wire_for=self.wire_for, reply_layout=_reply_layout,
            code_options=self.code_options, round_timeout=options.deadline.round_timeout,
            arrays_key=getattr(strategy, "arrayrecord_key", "arrays"))
        self.closer = RoundCloser(clock=self.clock, policy=self.code_policy,
                                  workload=self.workload, decodable=self.collector.decodable)
        self._confirmed_sizes: dict[tuple[int, int], float] = {}  # by >= 2 agreeing replicas
        self.stopped = False
        self._wrapped_grid: EarlyReturnGrid | None = None
        self.code_policy.bind(self)

    def _build_policy(self, given: CodePolicy | Callable[..., CodePolicy] | None) -> CodePolicy:
        """The code policy: ``given`` (an instance), or built from the options (by ``given``
        when it is a policy class or factory)."""
        if given is not None and not is_policy_factory(given):
            return given
        return make_code_policy(
            factory=given, code=self.code_spec, s="auto" if self.adaptive else self.s,
            s_max=self.s_max, auto_margin=self.auto_margin, exclude_slow=self.exclude_slow,
            code_options=self.code_options, seed=self.seed, busy=self.busy_mode,
            stop_late_work=self.stop_late_work,
            straggler_timeout=self.straggler_timeout, latency_state=self.latency_state,
            timing=self.timing, measured_compute=self.measured_compute,
            compute_cost_s=self.compute_cost_s)

    def __getattr__(self, name: str) -> Any:
        # only for names not found: an option by its flat name, else Flower's legacy server
        # loop (initialize_parameters, ...)
        options = self.__dict__.get("options")
        if options is not None:
            with contextlib.suppress(AttributeError):
                return options.get(name)
        raise compat.legacy_attribute_error(self, name)

    @property
    def _round(self) -> _Round | None:
        """The round in progress (held by the reply collector)."""
        return self.collector.state

    @_round.setter
    def _round(self, state: _Round | None) -> None:
        self.collector.state = state

    def code_for(self, n: int) -> GradientCode:
        """The code for a cohort of ``n`` clients (:meth:`~.policy.FixedCodePolicy.code_for`)."""
        return self.code_policy.code_for(n)

    def wire_for(self, code: GradientCode) -> str:
        """The reply dtype for ``code`` (``"model"`` or ``"float64"``)."""
        if self.wire != "auto":
            return self.wire
        if code not in self._amplification:
            self._amplification[code] = error_amplification(code, seed=self.seed)
        return "model" if self._amplification[code] <= 8.0 else "float64"

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
        self.evaluate_fn = evaluate_fn or self.evaluate_fn
        try:
            result = super().start(
                self.wrap_grid(grid), initial_arrays, num_rounds=num_rounds, timeout=timeout,
                train_config=train_config, evaluate_config=evaluate_config,
                evaluate_fn=self.round_log.evaluating(self.evaluate_fn),
            )
            if len(result.arrays) == 0 and len(initial_arrays) > 0:
                # Flower's Result holds an empty model when no round applied one: the model
                # the federation holds is the initial one, so that is what is returned
                log(WARNING, "no round applied an update (see rounds.jsonl): the returned "
                    "model is the initial one")
                result.arrays = initial_arrays
            return result
        finally:
            self.round_log.flush(None)
            if self._wrapped_grid is not None:
                self._wrapped_grid.collect_late()

    # the grid's callbacks (EarlyReturnGrid): answered by the deadline policy and the collector
    def deadline_s(self, timeout: float | None) -> float:
        """Wall-clock limit of the current coded round (used by the grid)."""
        state = self._round
        return self.deadlines.grid_deadline_s(
            self.clock, None if state is None else state.number,
            () if state is None else state.sent.values(), timeout)

    def first_reply_deadline_s(self) -> float | None:
        """Wallclock round 1: the straggler deadline counts from the first reply (start-up)."""
        state = self._round
        return self.deadlines.first_reply_deadline_s(self.clock,
                                                     None if state is None else state.number)

    def on_unsent(self, messages: list[Message]) -> None:
        """Messages the grid refused: those workers are stragglers of this round, not busy."""
        self.collector.on_unsent(messages)

    def on_reply(self, reply: Message) -> None:
        """Validate a reply of the current round once, as it arrives."""
        self.collector.on_reply(reply)

    def prioritize(self, replies: list[Message]) -> list[Message]:
        """Order a batch of replies so that a decodable set is validated first."""
        return self.collector.prioritize(replies)

    def ready(self) -> bool:
        """Early return: the valid replies so far satisfy the stopping rule."""
        return self.collector.ready()

    def on_late_reply(self, reply: Message) -> None:
        """A reply to an earlier round: counted and dropped, never decoded."""
        self.collector.on_late_reply(reply)

    # ------------------------------------------------------------------ Strategy API
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Any
    ) -> Iterable[Message]:
        """Sample with the inner strategy; send each idle member its coded instruction."""
        compat.check_caller(self)  # an outer Flower DP wrapper cannot compose
        self.round_log.flush(None)
        self._round = None
        if not self._within_budget(server_round):
            return []
        inner_msgs = list(self.inner.configure_train(server_round, arrays, config, grid))
        if not inner_msgs:
            return []
        content_of = {m.metadata.dst_node_id: m.content for m in inner_msgs}
        inner = grid.inner if isinstance(grid, EarlyReturnGrid) else grid
        cohort = self.membership.admit(inner, list(content_of), server_round)
        if not cohort:  # nobody passed the handshake: the round is idle, the run goes on
            return []
        opened = self.opener.open(server_round, grid, cohort, inner_msgs[0].content)
        state = opened.state
        messages = [self.dispatcher.message(state, worker, node, content_of[node])
                    for worker, node in enumerate(cohort) if node not in opened.idle]
        self.code_policy.record_sent(state, set(opened.queued))
        self._round = state
        return messages

    def _within_budget(self, server_round: int) -> bool:
        """The accountant allows this round (once refused, training stays stopped)."""
        if self.stopped or (self.accountant is not None and not self.accountant.can_run_round()):
            if not self.stopped:
                log(INFO, "round %d would exceed target-epsilon: training stops", server_round)
            self.stopped = True
        return not self.stopped

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Validate -> select -> cross-check -> decode -> privatise -> inner strategy ->
        record."""
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
        window = self.closer.close(state)
        used, verdict = self.collector.cross_check(state, sorted(window.used))
        outcome, arrays_out, inner_metrics = self._decode(state, used, verdict)
        if self.accountant is not None and state.sent:
            # the round released noisy updates, used or not; at its code's multiplier
            self.accountant.step(self._round_noise_multiplier(state))
        self.deadlines.after_round(outcome.decode, self.clock.straggler_timeout)
        late, stopped_late = self.collector.take_late()
        row = self._record(server_round, **self.round_log.coded_fields(
            state, outcome, self.identities, late_dropped=late + len(window.late),
            stopped_at_deadline=len(state.stopped) + stopped_late,
            expected_round_s=self.code_policy.expected_round_s(),
            round_virtual_s=float(window.end - self.clock.round_start),
            round_deadline_s=self.clock.straggler_timeout, wall_s=float(wall_s)))
        if not state.valid and missing_keys(reason for _, reason in state.rejected):
            self.round_log.flush(None)  # the round's row first: then the run ends here
            raise RuntimeError(
                f"round {server_round}: every reply was refused because the clients have no "
                f"DP partition keys (dp={self.dp.mode!r}); nothing can be trained. "
                + MISSING_KEYS_HELP)
        if arrays_out is not None and self.recorder is not None:
            self.recorder.save_model({k: v.numpy() for k, v in arrays_out.items()})
        return arrays_out, RoundLog.metrics(row, inner_metrics)

    def _decode(self, state: _Round, used: list[int],
                verdict: Any) -> tuple[RoundOutcome, ArrayRecord | None, MetricRecord | None]:
        """The round's outcome (``"exact"``, ``"approx"`` or ``"skipped"``: not decodable,
        above ``max_decode_error``, or withheld by the integrity checks), the arrays and
        metrics of the inner strategy's aggregation of the decoded average."""
        decoding = self._decoding(state, used)
        self.collector.check_applied(state, used, decoding, verdict)
        decode = self._decode_status(decoding)
        if self.collector.withholds(state, verdict, decode):
            decode = "skipped"
        result = None if decode == "skipped" else self._decode_and_apply(state, used, decoding)
        bad = [] if result is not None or decode == "skipped" else (
            self._reject_non_finite(state, used))
        if bad:  # replies whose values were not read on arrival: drop them, decode again
            used = [w for w in used if w not in bad]
            decoding = self._decoding(state, used)
            decode = self._decode_status(decoding)
            result = None if decode == "skipped" else self._decode_and_apply(state, used,
                                                                             decoding)
        arrays, metrics, count, noise_std = result or (None,) * 4
        outcome = RoundOutcome(
            "skipped" if result is None else decode, used,
            0 if result is None else _replies_read(decoding, used),
            float(decoding.error) if decoding is not None else 1.0, verdict, count, noise_std)
        return outcome, arrays, metrics

    def _decode_status(self, decoding: Any) -> str:
        """``"exact"``, ``"approx"`` (within ``max_decode_error``) or ``"skipped"``."""
        if decoding is not None and (decoding.exact or decoding.error <= self.max_decode_error):
            return "exact" if decoding.exact else "approx"
        return "skipped"

    def _decoding(self, state: _Round, used: list[int]) -> Any:
        """The round's decoding of ``used``: the sparse exact one when enabled."""
        if not used:
            return None
        if self.sparse_decoding and not _is_chunked(state.code):
            return state.code.sparse_decoding(used)
        return state.code.decoding(used)

    def _reject_non_finite(self, state: _Round, used: list[int]) -> list[int]:
        """Workers among ``used`` whose replies hold NaN/Inf (read now, if not on arrival)."""
        bad = []
        for w in used:
            names = protocol.non_finite_arrays(state.valid[w])
            if names:
                bad.append(w)
                del state.valid[w]
                _reject(state, state.cohort[w], w, f"array {names[0]!r} contains NaN or Inf")
        return bad

    def _decode_and_apply(self, state: _Round, used: list[int], decoding: Any):
        """Decode the example-weighted average, privatise, hand it to the inner strategy.

        One pass per array: ``acc = sum_i a_i r_i`` in place into one buffer in the reply dtype
        (the replies are zero-copy views; no per-reply copies), then ``acc / count + theta``.
        """
        if _is_chunked(state.code):
            return self._decode_chunked(state, used, decoding)
        coefficients = np.asarray(decoding.coefficients, dtype=np.float64)[used]
        replies = [state.valid[w] for w in used]
        count = float(sum(a * r.num_examples for a, r in zip(coefficients, replies, strict=True)))
        if not (math.isfinite(count) and count > 0):
            log(WARNING, "round %d: decoded example count %r; round skipped", state.number, count)
            return None
        noise_std, noise = None, None
        if self.dp.mode == "central":
            noise_std = self._central_noise_std(state, decoding, used, count)
            if noise_std is None:
                return None
            dim = sum(v.size for v in state.theta.values())
            noise = self.server_noise.draw(dim, noise_std, state.number, self.nonce)
        offsets, start = {}, 0
        for name, theta in state.theta.items():
            offsets[name] = start
            start += theta.size

        def finish(name: str) -> Array | None:
            theta = state.theta[name]
            views = [r.arrays[name].reshape(-1) for r in replies]
            dtype = np.result_type(*(v.dtype for v in views)) if views else np.dtype(np.float64)
            part = None if noise is None else noise[offsets[name] : offsets[name] + theta.size]
            acc = _combine(coefficients, views, dtype, scale=1.0 / count,
                           offset=theta.reshape(-1), noise=part)
            if acc is None:
                return None
            # serialised here, per array: the float buffer is freed before the next one
            return Array(_cast(acc.reshape(theta.shape), state.dtypes[name]))

        # arrays are independent and numpy releases the GIL: one thread per core
        names = list(state.theta)
        if len(names) > 1 and start >= 1 << 20:
            with ThreadPoolExecutor(max_workers=min(len(names), os.cpu_count() or 1)) as pool:
                results = list(pool.map(finish, names))
        else:
            results = [finish(name) for name in names]
        if any(r is None for r in results):
            log(WARNING, "round %d: decoded model not finite; round skipped", state.number)
            return None
        new = dict(zip(names, results, strict=True))
        metric_names = set.intersection(*(set(r.metrics) for r in replies)) if replies else set()
        metrics = {
            k: float(sum(a * r.metrics[k] for a, r in zip(coefficients, replies, strict=True)))
            / count
            for k in sorted(metric_names)
        }
        return self._apply_inner(state, used, new, metrics, count, noise_std)

    def _decode_chunked(self, state: _Round, used: list[int], decoding: Any):
        """Communication-efficient codes: rebuild ``[sum_j n_j dtheta_j..., sum_j n_j]`` from
        the ``1/m``-length replies (``m x |F|`` decoder), then the average."""
        coefficients = np.asarray(decoding.coefficients, dtype=np.float64)[:, used]
        m = coefficients.shape[0]
        replies = [state.valid[w].arrays[protocol.CHUNK_KEY] for w in used]
        chunks = np.zeros((m, replies[0].size)) if replies else np.zeros((m, 0))
        for i, r in enumerate(replies):
            for u in range(m):
                if coefficients[u, i] != 0.0:
                    chunks[u] += coefficients[u, i] * r
        full = chunks.reshape(-1)
        dim = sum(v.size for v in state.theta.values())
        count = float(full[dim])
        if not (math.isfinite(count) and count > 0):
            log(WARNING, "round %d: decoded example count %r; round skipped", state.number, count)
            return None
        noise_std = None
        if self.dp.mode == "central":
            noise_std = self._central_noise_std(state, decoding, used, count)
            if noise_std is None:
                return None
            full[:dim] += count * self.server_noise.draw(dim, noise_std, state.number, self.nonce)
        new, start = {}, 0
        for name, theta in state.theta.items():
            value = full[start : start + theta.size].reshape(theta.shape) / count + theta
            start += theta.size
            if not np.isfinite(value).all():
                log(WARNING, "round %d: decoded model not finite; round skipped", state.number)
                return None
            new[name] = Array(_cast(value, state.dtypes[name]))
        return self._apply_inner(state, used, new, {}, count, noise_std)

    def _apply_inner(self, state, used, new, metrics, count, noise_std):
        """Hand the decoded average to the inner strategy as ONE valid reply."""
        weight_key = getattr(self.inner, "weighted_by_key", "num-examples")
        content = RecordDict(
            {
                state.array_key: ArrayRecord(new),
                "metrics": MetricRecord({**metrics, weight_key: count}),
            }
        )
        if type(self.inner) is FedAvg:
            # FedAvg's weighted average of one reply is that reply (weight 1.0): skip the
            # copy through Array.numpy(); its metric aggregation still runs
            arrays_out = content[state.array_key]
            inner_metrics = self.inner.train_metrics_aggr_fn([content], weight_key)
            return arrays_out, inner_metrics, count, noise_std
        reply = Message(content, reply_to=state.sent[used[0]])
        with quiet_inner_aggregation():  # "Received 1 results": the one decoded reply
            arrays_out, inner_metrics = self.inner.aggregate_train(state.number, [reply])
        if arrays_out is None:
            return None
        for arr in arrays_out.values():
            if not np.isfinite(protocol.array_view(arr)).all():
                log(WARNING, "round %d: inner strategy produced a non-finite model; kept the "
                    "previous one", state.number)
                return None
        return arrays_out, inner_metrics, count, noise_std

    def _central_noise_std(self, state: _Round, decoding: Any, used: list[int],
                           count: float) -> float | None:
        """Std of the trusted server's noise on the decoded average delta: ``sigma C`` times
        the largest weight one partition has in it, ``max_j |alpha_j| n_j / count``
        (:func:`~fl_gradcode.flower.reports.central_noise_scale`), from the sizes every used
        reply reported consistently with its ``num-examples`` and its partition's other
        replicas (never below ``sigma C / k``). ``None`` (the round is not released): no such
        sizes."""
        # the replicas' sizes were cross-checked once (_check_sizes): those of used's partitions
        held = {int(j) for w in used for j in state.code.assignment(w)}
        agreed = {j: n for j, n in state.sizes.items() if j in held}
        try:
            scale = central_noise_scale(decoding, agreed, count)
        except ValueError as exc:
            log(WARNING, "round %d: central DP noise cannot be sized (%s); round skipped",
                state.number, exc)
            return None
        return self.mechanism.server_noise_std(scale)

    def _check_sizes(self, state: _Round) -> None:
        """Cross-check the replicas' ``partition-sizes`` (each already consistent with its
        reply's ``num-examples``): outvoted replies are excluded as rejected; the agreed
        sizes become ``partition_sizes`` (and, confirmed by two or more replicas, decide
        later ties)."""
        confirmed = {j: self._confirmed_sizes[_key(p)] for j, p in enumerate(state.partitions)
                     if _key(p) in self._confirmed_sizes}
        agreed, excluded, confirmed_now = agree_sizes(
            state.code, {w: r.sizes for w, r in state.valid.items()}, confirmed)
        for worker, reason in sorted(excluded.items()):
            del state.valid[worker]
            _reject(state, state.cohort[worker], worker, reason)
        self._quarantine.offend(state.number, [state.cohort[w] for w in sorted(excluded)],
                                "partition sizes the other replicas contradict")
        if excluded:
            state.tracker = None  # rebuilt from the remaining replies
        state.sizes = agreed
        for j, size in agreed.items():
            self.partition_sizes[_key(state.partitions[j])] = size
        for j, size in confirmed_now.items():
            self._confirmed_sizes[_key(state.partitions[j])] = size
        for j, size, median in outlying_sizes(agreed):
            log(WARNING, "round %d: partition %s reports %g examples, %.3g times the median "
                "(%g); no replica contradicts it", state.number, _key(state.partitions[j]),
                size, size / median, median)

    def _round_noise_multiplier(self, state: _Round) -> float | None:
        """The noise multiplier the round is accounted at: with ``dp-noise=independent`` under
        ``partition`` DP, the round's code's effective one (the server can average a
        partition's replicas: :func:`~fl_gradcode.privacy.independent_noise_multiplier`);
        ``None`` (the accountant's own) otherwise."""
        if self.dp.mode == "partition" and self.dp.noise == "independent":
            return independent_noise_multiplier(
                np.asarray(state.code.B, dtype=np.float64), self.dp.noise_multiplier)
        return None

    def _record_idle(self, server_round: int) -> MetricRecord:
        """A round in which nothing was sent (budget exhausted or an empty cohort)."""
        late, stopped_late = self.collector.take_late()
        row = self._record(server_round, late_dropped=late, stopped_at_deadline=stopped_late)
        return RoundLog.metrics(row, None)

    def _record(self, server_round: int, **fields: Any) -> dict[str, Any]:
        """The round's row (:meth:`~.records.RoundLog.record`)."""
        epsilon = None if self.accountant is None else self.accountant.epsilon
        return self.round_log.record(server_round, epsilon=epsilon, stopped=self.stopped,
                                     **fields)

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
        log(INFO, "\t├── GradientCoding(%s): code %s, s=%d, timing=%s, straggler_timeout=%.1f s, "
            "dp=%s", type(self.inner).__name__, self.options.code.name, self.s, self.timing,
            self.straggler_timeout, self.dp.mode)
        self.inner.summary()


_BLOCK = 1 << 15  # elements per cache block of the decoder


def _combine(
    coefficients: np.ndarray,
    views: list[np.ndarray],
    dtype: np.dtype,
    *,
    scale: float = 1.0,
    offset: np.ndarray | None = None,
    noise: np.ndarray | None = None,
) -> np.ndarray | None:
    """``scale * sum_i a_i v_i + noise + offset`` into one new buffer of ``dtype``, or ``None``
    when the result is not finite.

    Block by block, so that the running sum stays in cache while every reply with a nonzero
    coefficient streams through once: one read per reply, one write of the result, the
    scaling, noise, offset and finiteness check done on the block while it is in cache.
    """
    dtype = np.dtype(dtype)
    size = offset.size if offset is not None else (views[0].size if views else 0)
    acc = np.empty(size, dtype=dtype)
    tmp = np.empty(min(size, _BLOCK), dtype=dtype)
    terms = [(dtype.type(a), v) for a, v in zip(coefficients, views, strict=True) if a != 0.0]
    factor = dtype.type(scale)
    for start in range(0, size, _BLOCK):
        end = min(start + _BLOCK, size)
        block, scratch = acc[start:end], tmp[: end - start]
        if not terms:
            block.fill(0)
        for i, (a, v) in enumerate(terms):
            if i == 0:
                np.multiply(v[start:end], a, out=block)
            elif a == 1.0:  # FRC-like decoders are 0/1
                block += v[start:end]
            else:
                np.multiply(v[start:end], a, out=scratch)
                block += scratch
        if factor != 1.0:
            block *= factor
        if noise is not None:
            block += noise[start:end]
        if offset is not None:
            block += offset[start:end]
        if not np.isfinite(block).all():
            return None
    return acc


def _is_chunked(code: GradientCode) -> bool:
    return hasattr(code, "message_length") and getattr(code, "m", 1) > 1


def _chunk_coefficients(code: GradientCode, worker: int) -> tuple[float, ...]:
    if not _is_chunked(code):
        return ()
    gamma = code.gammas[code._group[worker]]
    return tuple(float(c) for c in gamma[:, code._position[worker]])


def _reply_layout(code: GradientCode, theta: dict[str, np.ndarray]) -> dict[str, tuple]:
    if not _is_chunked(code):
        return {name: tuple(a.shape) for name, a in theta.items()}
    dim = sum(a.size for a in theta.values())
    return {protocol.CHUNK_KEY: (code.message_length(dim + 1),)}


def error_amplification(code: GradientCode, seed: int = 0, samples: int = 24) -> float:
    """How much the decoder amplifies rounding errors of the replies, relative to the decoded
    sum: ``max_F sum_i |a_i| ||B_i||_1 / k`` over decodable sets ``F`` (all clients, random
    ``(n-s)``-subsets, contiguous straggler bursts). 1 for uncoded and FRC (0/1 decoding)."""
    rng = np.random.default_rng(seed)
    n, s = code.n, min(code.s, code.n - 1)
    row_l1 = np.abs(code.B).sum(axis=1)
    sets = [list(range(n))]
    sets += [sorted(rng.choice(n, size=n - s, replace=False).tolist()) for _ in range(samples)]
    sets += [[i for i in range(n) if (i - start) % n >= s] for start in range(0, n, max(1, n // 8))]
    worst = 0.0
    for received in sets:
        decoding = code.decoding(received)
        a = np.abs(np.asarray(decoding.coefficients, dtype=np.float64))
        if a.ndim == 2:  # communication-efficient: one decoder row per chunk
            a = a.sum(axis=0)
        worst = max(worst, float(np.sum(a * row_l1)) / code.k)
    return worst


def _replies_read(decoding: Any, used: list[int]) -> int:
    """How many of the ``used`` replies the decoder reads (nonzero coefficients)."""
    a = np.asarray(decoding.coefficients)
    column = np.any(a != 0, axis=0) if a.ndim == 2 else a != 0
    return int(np.count_nonzero(column[used]))


def _reject(state: _Round, node: int, worker: int | None, reason: str) -> None:
    """Count a rejected reply (:meth:`~.round_state.RoundState.reject`)."""
    state.reject(node, worker, reason)


def _cast(value: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if np.issubdtype(dtype, np.integer):
        return np.rint(value).astype(dtype)
    return value.astype(dtype, copy=False)
