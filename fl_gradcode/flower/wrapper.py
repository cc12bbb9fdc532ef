"""``GradientCoding``: wrap any Flower strategy so its rounds end at the first decodable replies.

In the style of Flower's DP wrappers, :class:`GradientCoding` holds an inner Message-API strategy
(FedAvg, FedAvgM, FedProx, FedAdam, FedYogi, FedAdagrad, user subclasses). Each round:

1. the inner strategy's ``configure_train`` picks the cohort and the content (global arrays +
   its train config); the code is built over the round's partitions (every member's own data
   partition, replicated among the members; a partition no node can work on this round gets a
   placeholder worker, sent nothing: :mod:`~fl_gradcode.flower.membership`);
2. each idle member gets that content plus the protocol record (its partitions and
   coefficients); :func:`~fl_gradcode.flower.gradient_coding_mod` on the client calls the app
   once per partition and replies with one coded combination;
3. aggregation is a pipeline: validate (once per reply) -> select (the clock's stopping rule)
   -> decode ``sum_j n_j (theta_j - theta)`` and ``sum_j n_j`` -> privatise (central DP) ->
   the inner strategy's ``aggregate_train`` on ONE reply holding the example-weighted average
   ``sum_j n_j theta_j / sum_j n_j`` (so FedAvg returns exactly it, FedAdam/FedYogi/FedAvgM
   apply their own server optimizer) -> record.

The strategy assembles single-purpose collaborators (modules of :mod:`fl_gradcode.flower`):
the option groups (``options``), the code policy (``policy``: fixed or ``s="auto"``), the clock
(``clock``: arrival, busy members, waiting), the deadline policy (``deadline_policy``), the
round opener (``opener``) and dispatcher (``dispatch``), the reply collector (``collector``:
the grid's callbacks), the verifier (``verifier``: integrity), the round closer (``closer``),
the aggregator (``aggregator``) over the one decoder path (``decoder``, ``privatiser``), the
round state (``round_state``: one owner per fact) and the round log (``records.RoundLog``).

References:
    Tandon, Lei, Dimakis, Karampatziakis, "Gradient Coding: Avoiding Stragglers in Distributed
    Learning", ICML 2017, https://arxiv.org/abs/1612.03301.
    McMahan, Moore, Ramage, Hampson, Agüera y Arcas, "Communication-Efficient Learning of Deep
    Networks from Decentralized Data", AISTATS 2017, https://arxiv.org/abs/1602.05629 (FedAvg).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping
from logging import INFO, WARNING
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp.strategy import Result, Strategy

from ..codes import GradientCode
from ..latency import DeviceTrace, LatencyModel
from ..privacy import DPConfig, PrivacyAccountant, ServerNoise, make_mechanism
from ..results import RoundRecorder
from . import compat
from .aggregator import RoundAggregator
from .clock import make_clock
from .closer import RoundCloser
from .collector import ReplyCollector
from .deadline import evaluate_replies
from .deadline_policy import DeadlinePolicy
from .decoder import Decoder
from .decoder import error_amplification as error_amplification  # re-exported
from .dispatch import Dispatcher
from .grid import EarlyReturnGrid
from .membership import Membership, missing_fields
from .opener import RoundOpener
from .option_attributes import OptionAttributes
from .options import (
    STOP_LATE_WORK,
    AdaptiveOptions,
    CodeOptions,
    DeadlineOptions,
    IntegrityOptions,
    Options,
    PrivacyOptions,
    TimingOptions,
    WireOptions,
)
from .policy import CodePolicy, resolve_code_policy
from .privatiser import Privatiser
from .protocol import Identity
from .quarantine import Quarantine
from .records import RoundLog
from .reports import untrainable, untrainable_round
from .roster import load_roster
from .round_state import RoundView
from .verifier import RoundVerifier
from .workload import Workload

__all__ = ["GradientCoding"]


class GradientCoding(OptionAttributes, Strategy):
    """Gradient-coded rounds around any Flower strategy.

    ``strategy``: the inner strategy (FedAvg, FedAdam, ...); it samples the cohort, builds the
    train content and applies its own aggregation to the decoded example-weighted average.
    Refused (:mod:`~fl_gradcode.flower.compat`, ``docs/works_with.md``): strategies that
    aggregate individual replies (Krum, FedMedian, ...; an unknown ``aggregate_train`` is
    checked once, on copies, at the first aggregation), Flower's DP wrappers outside it and
    inside it but for ``DifferentialPrivacyClientSideFixedClipping`` (exact inside, with
    ``fixedclipping_mod`` after ``gradient_coding_mod``), legacy ``flwr.server.strategy``
    strategies.

    Every other keyword is an option (same names and defaults as ever), grouped and checked
    by :meth:`~fl_gradcode.flower.options.Options.from_keywords`; each group's docstring
    documents its keywords and declares their defaults (the signature below reads them from
    the groups), the module's docstring the rules between them:
    :class:`~.options.CodeOptions` (``code``, ``s``, ``seed``, ``code_options``, ``m``),
    :class:`~.options.AdaptiveOptions` (``s_max``, ``auto_margin``, ``exclude_slow``,
    ``latency_state``, ``auto_approximate``), :class:`~.options.TimingOptions` (``timing``,
    ``latency``,
    ``measured_compute``, ``compute_cost_s``, ``upload_bandwidth``, ``busy``,
    ``stop_late_work``), :class:`~.options.DeadlineOptions` (``straggler_timeout``,
    ``auto_deadline``, ``max_decode_error``, ``min_replies``, ``round_timeout``,
    ``warmup_timeout``), :class:`~.options.IntegrityOptions` (``verify``,
    ``verify_tolerance``), :class:`~.options.WireOptions` (``wire``, ``sparse_decoding``),
    :class:`~.options.PrivacyOptions` (``dp``, ``accountant``, ``server_noise``,
    ``dp_run_nonce``). Records: ``results_dir`` (``rounds.jsonl``, ``final_model.npz``,
    ``config.json``, ``debug.log``: ``docs/records-and-logs.md``), ``run_config`` (written to
    ``config.json``), ``evaluate_fn`` (also accepted by ``start``; its ``accuracy`` and
    ``loss`` go into ``rounds.jsonl``). A second ``start`` continues the federation: the clock,
    busy clients, quarantine, identities and privacy spent go on from the first run's end, and
    ``history`` and ``rounds.jsonl`` go on with its rounds (numbered from 1 again).

    Membership (``docs/membership.md``): ``num_partitions``, the federation's number of data
    partitions (``None``: the roster's, else the value most nodes claim, never a tied vote);
    ``roster``, the operator's node id -> partition id mapping or JSON file
    (:mod:`~fl_gradcode.flower.roster`): with one, claims it does not state are refused.

    ``code_policy``: which code each round uses and whom to queue; ``None``: built from the
    options; a policy class or factory: called with ``options=`` (the groups); an instance:
    used as given (:func:`~fl_gradcode.flower.policy.resolve_code_policy`).

    Each option keeps its flat name as a read-only attribute (``strategy.timing``,
    ``strategy.busy_mode`` for the resolved ``busy``, ...:
    :mod:`~fl_gradcode.flower.option_attributes`); ``strategy.options`` holds the groups.
    """

    #: auto_deadline: factor of the next deadline after each missed one (RFC 6298, 5.5)
    DEADLINE_BACKOFF = DeadlinePolicy.BACKOFF

    def __init__(
        self,
        strategy: Strategy,
        code: str | GradientCode = CodeOptions.code,
        s: int | str = CodeOptions.s,
        *,
        s_max: int | None = AdaptiveOptions.s_max,
        auto_margin: float = AdaptiveOptions.auto_margin,
        exclude_slow: float | None = AdaptiveOptions.exclude_slow,
        auto_approximate: bool = AdaptiveOptions.auto_approximate,
        latency_state: str | os.PathLike[str] | None = AdaptiveOptions.latency_state,
        timing: str = TimingOptions.mode, latency: LatencyModel | None = TimingOptions.latency,
        measured_compute: bool = TimingOptions.measured_compute,
        compute_cost_s: float = TimingOptions.compute_cost_s,
        upload_bandwidth: float | None = TimingOptions.upload_bandwidth,
        busy: str | None = None,
        stop_late_work: bool | str = STOP_LATE_WORK,
        straggler_timeout: float = DeadlineOptions.straggler_timeout,
        auto_deadline: float | None = DeadlineOptions.auto_deadline,
        max_decode_error: float = DeadlineOptions.max_decode_error,
        min_replies: int | None = DeadlineOptions.min_replies,
        round_timeout: float = DeadlineOptions.round_timeout,
        warmup_timeout: float = DeadlineOptions.warmup_timeout,
        verify: bool = IntegrityOptions.verify,
        verify_tolerance: float = IntegrityOptions.verify_tolerance,
        wire: str = WireOptions.wire, m: int | None = None,
        sparse_decoding: bool = WireOptions.sparse_decoding,
        code_options: dict[str, Any] | None = None,
        dp: DPConfig | None = None,
        accountant: PrivacyAccountant | None = PrivacyOptions.accountant,
        server_noise: ServerNoise | None = None, dp_run_nonce: str = PrivacyOptions.nonce,
        seed: int = Options.seed, results_dir: str | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
        run_config: dict[str, Any] | None = None,
        code_policy: CodePolicy | Callable[..., CodePolicy] | None = None,
        num_partitions: int | None = None,
        roster: str | os.PathLike[str] | Mapping[Any, Any] | None = None,
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
            stop_late_work=stop_late_work, auto_deadline=auto_deadline,
            auto_approximate=auto_approximate)
        self.inner, self.evaluate_fn = strategy, evaluate_fn
        self.mechanism = make_mechanism(self.dp)
        t = options.timing
        if t.mode == "wallclock" and isinstance(t.latency, DeviceTrace):
            raise ValueError("latency=DeviceTrace (FedScale devices) with timing='wallclock': "
                             "a device that is off never replies (an infinite delay), which "
                             "only virtual timing models; use timing='virtual'")
        self.clock = make_clock(t, options.deadline.straggler_timeout)
        self.code_policy = resolve_code_policy(code_policy, options=options)
        self.deadlines = DeadlinePolicy(options.deadline, self.code_policy.estimating)
        self.membership = Membership(options.deadline.warmup_timeout, self.nonce,
                                     num_partitions=num_partitions, roster=load_roster(roster),
                                     seed=self.seed)
        self._quarantine = Quarantine(key_of=self.membership.claim_key)
        self.privatiser = Privatiser(self.dp, self.mechanism, self.server_noise, self.nonce)
        self.partition_sizes = self.privatiser.partition_sizes  # checked sizes only (read-only)
        self.verifier = RoundVerifier(options.integrity, self.deadlines, self._quarantine,
                                      self.privatiser)
        self.collector = ReplyCollector(self.clock, self.deadlines, options.integrity,
                                        self._quarantine, self._fingerprints, self.verifier)
        self.recorder = (RoundRecorder(results_dir, options.describe(type(strategy).__name__,
                                                                     run_config))
                         if results_dir else None)
        self.identities: dict[int, Identity] = self.membership.claims
        self.round_log = RoundLog(self.recorder, self.membership, self.clock, options.code.s)
        self.round_log.waits_for_evaluation = evaluate_fn is not None
        self.history: list[dict[str, Any]] = self.round_log.history
        self.decoder = Decoder(strategy, self.privatiser, wire=options.wire.wire,
                               sparse=options.wire.sparse_decoding, seed=self.seed)
        self.aggregator = RoundAggregator(decoder=self.decoder, verifier=self.verifier,
                                          max_decode_error=options.deadline.max_decode_error)
        self.workload = Workload(self.membership.roles, self.partition_sizes, self.latency,
                                 self.seed)
        self.dispatcher = Dispatcher(seed=self.seed, nonce=self.nonce, dp=self.dp,
                                     clock=self.clock, workload=self.workload, inner=strategy)
        self.opener = RoundOpener(
            policy=self.code_policy, clock=self.clock, deadlines=self.deadlines,
            quarantine=self._quarantine, workload=self.workload, verifier=self.verifier,
            wire_for=self.decoder.wire_for,
            code_options=self.code_options, round_timeout=options.deadline.round_timeout,
            arrays_key=getattr(strategy, "arrayrecord_key", "arrays"))
        self.closer = RoundCloser(clock=self.clock, policy=self.code_policy,
                                  workload=self.workload, verifier=self.verifier)
        self.stopped = False
        self._wrapped_grid: EarlyReturnGrid | None = None
        self.code_policy.bind(self)

    def __getattr__(self, name: str) -> Any:
        # names not found (options are attributes: OptionAttributes): a clear error for the
        # methods of Flower's legacy loop
        raise compat.legacy_attribute_error(self, name)

    @property
    def current_round(self) -> RoundView | None:
        """A read-only view of the coded round in progress or last configured (its ``number``,
        ``cohort`` of node ids by worker, ``code``, reply dtype ``wire``, the replies so far:
        :class:`~.round_state.RoundView`); ``None`` before the first coded round and after a
        round that was not configured (budget spent)."""
        state = self.collector.state
        return None if state is None else state.view()

    def code_for(self, n: int) -> GradientCode:
        """The code for a cohort of ``n`` clients (:meth:`~.policy.FixedCodePolicy.code_for`)."""
        return self.code_policy.code_for(n)

    def wire_for(self, code: GradientCode) -> str:
        """The reply dtype for ``code`` (``"model"`` or ``"float64"``)."""
        return self.decoder.wire_for(code)

    def wrap_grid(self, grid: Any) -> EarlyReturnGrid:
        """The grid to pass to ``start`` of any wrapper around this strategy."""
        if isinstance(grid, EarlyReturnGrid):
            return grid
        if self._wrapped_grid is None or self._wrapped_grid.inner is not grid:
            self._wrapped_grid = EarlyReturnGrid(grid, self.collector)  # its callbacks
        return self._wrapped_grid

    def start(self, grid: Any, initial_arrays: ArrayRecord, num_rounds: int = 3,
              timeout: float = 3600, train_config: ConfigRecord | None = None,
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
                    "model is the initial one%s", self._unverifiable_why())
                result.arrays = initial_arrays
            return result
        finally:
            self.round_log.flush(None)
            if self._wrapped_grid is not None:
                self._wrapped_grid.collect_late()

    def _unverifiable_why(self) -> str:
        """Why no round applied an update, when verify could check no cohort ("": not so)."""
        if not self.verifier.warned_placement or self.verifier.checked_a_cohort:
            return ""
        code = self.options.code
        divides = f"s + 1 = {code.s + 1}" if isinstance(code.s, int) else "s + 1"
        return (f": verify=True could check none of its cohorts (code={code.code!r}, "
                f"s={code.s!r}; the placement warning above says which block): give cohorts "
                f"that {divides} divides (an FRC placement), or verify=False")

    # the grid's callbacks: the grid calls the collector (``wrap_grid``); these answer code
    # that drives a round by hand
    def deadline_s(self, timeout: float | None) -> float:
        """Wall-clock limit of the current coded round (used by the grid)."""
        return self.collector.deadline_s(timeout)

    def first_reply_deadline_s(self) -> float | None:
        """Wallclock round 1: the straggler deadline counts from the first reply (start-up)."""
        return self.collector.first_reply_deadline_s()

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

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Any) -> Iterable[Message]:
        """Sample with the inner strategy; send each idle member its coded instruction."""
        compat.check_caller(self)  # an outer Flower DP wrapper cannot compose
        self.round_log.flush(None)
        self.collector.clear()
        if not self._within_budget(server_round):
            return []
        inner_msgs = list(self.inner.configure_train(server_round, arrays, config, grid))
        if not inner_msgs:
            return []
        compat.check_shared_content(self.inner, inner_msgs)
        content_of = {m.metadata.dst_node_id: m.content for m in inner_msgs}
        inner = grid.inner if isinstance(grid, EarlyReturnGrid) else grid
        cohort = self.membership.admit(inner, list(content_of), server_round)
        if not cohort:  # nobody passed the handshake: the round is idle, the run goes on
            return []
        absent = frozenset(node for node in cohort if node not in content_of)  # placeholders
        opened = self.opener.open(server_round, grid, cohort, inner_msgs[0].content, absent)
        requests = self.dispatcher.dispatch(opened.plan, content_of, opened.idle)
        state = self.collector.open(opened.plan, requests)
        self.code_policy.record_sent(state, set(opened.queued))
        return list(requests.messages.values())

    def _within_budget(self, server_round: int) -> bool:
        """The accountant allows this round (once refused, training stays stopped)."""
        if self.stopped or (self.accountant is not None and not self.accountant.can_run_round()):
            if not self.stopped:
                log(INFO, "round %d would exceed target-epsilon: training stops", server_round)
            self.stopped = True
        return not self.stopped

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """One phase after the other, each collaborator once: collect (the replies the grid
        did not validate) -> check sizes -> close the window -> cross-check -> decode,
        privatise, inner strategy -> record."""
        replies = list(replies)
        compat.check_caller(self)
        self._fingerprints.check(server_round, replies, compat.outer_name(self))
        state = self.collector.state
        if state is None or state.number != server_round:
            return None, self._record_idle(server_round)
        collected = self.collector.collect(replies)
        if self._check_inner and state.sent:  # once: an aggregation of the average only?
            compat.check_averaging(
                self.inner, server_round, next(iter(state.sent.values())), state.array_key,
                state.theta, getattr(self.inner, "weighted_by_key", "num-examples"),
                sorted({m for r in collected.state.valid.values() for m in r.metrics}))
            self._check_inner = False
        wall_s = time.monotonic() - state.plan.wall_start
        state = self.verifier.check_sizes(collected.state)
        state = self.closer.close(state)
        state = self.verifier.cross_check(state)
        state, arrays_out, inner_metrics = self.aggregator.decode(state)
        outcome, window = state.outcome, state.closing.window
        after_decode = getattr(self.code_policy, "after_decode", None)  # auto_approximate
        if after_decode is not None:
            after_decode(state, outcome.decode, list(outcome.used), list(window.used),
                         self.aggregator.max_decode_error)
        if self.accountant is not None and state.sent:
            # the round released noisy updates, used or not; at its code's multiplier
            self.accountant.step(self.privatiser.noise_multiplier(state.code, state.sizes))
        if not self.verifier.unsettled_placement:  # else skipped by placement, not by time
            self.deadlines.after_round(outcome.decode, self.clock.straggler_timeout)
        row = self._record(server_round, **self.round_log.coded_fields(
            state, outcome, self.membership.roles,
            late_dropped=collected.late + len(window.late),
            late_compute_s=collected.late_compute_s,
            stopped_at_deadline=len(state.stopped) + collected.stopped_late,
            expected_round_s=self.code_policy.expected_round_s(),
            round_virtual_s=float(window.end - self.clock.round_start),
            round_deadline_s=self.clock.straggler_timeout, wall_s=float(wall_s),
            arrivals_s={str(w): float(t) for w, t in sorted(state.closing.arrivals.items())},
            **missing_fields(state.code, list(state.partitions), outcome.used, outcome.decode,
                             self.partition_sizes)))
        if not state.valid and untrainable_round(self.dp.mode, range(len(state.cohort)),
                                                   state.rejections):
            self.round_log.flush(None)  # the round's row first: then the run ends here
            raise untrainable(server_round, self.dp.mode)
        if arrays_out is not None and self.recorder is not None:
            self.recorder.save_model({k: v.numpy() for k, v in arrays_out.items()})
        return arrays_out, RoundLog.metrics(row, inner_metrics)

    def _record_idle(self, server_round: int) -> MetricRecord:
        """A round in which nothing was sent (budget exhausted or an empty cohort)."""
        late, stopped_late = self.collector.take_late()
        row = self._record(server_round, late_dropped=late, stopped_at_deadline=stopped_late,
                           compute_s=self.collector.take_late_compute_s())
        return RoundLog.metrics(row, None)

    def _record(self, server_round: int, **fields: Any) -> dict[str, Any]:
        """The round's row (:meth:`~.records.RoundLog.record`)."""
        epsilon = None if self.accountant is None else self.accountant.epsilon
        return self.round_log.record(server_round, epsilon=epsilon, stopped=self.stopped,
                                     **fields)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Any) -> Iterable[Message]:
        """Federated evaluation as the inner strategy does it (each node on its own data)."""
        return self.inner.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int,
                           replies: Iterable[Message]) -> MetricRecord | None:
        valid = [r for r in replies if not r.has_error()]
        try:
            return self.inner.aggregate_evaluate(server_round, valid)
        except Exception as exc:  # a bad evaluate reply must not end the run
            # the inner strategy again on the replies Flower's metric average can take
            usable = evaluate_replies(valid, getattr(self.inner, "weighted_by_key",
                                                     "num-examples"))
            left_out = len(valid) - len(usable)
            if usable and left_out:
                log(WARNING, "round %d: left out %d of %d evaluate replies that Flower's "
                    "metric average cannot take (%s)", server_round, left_out, len(valid), exc)
                try:
                    return self.inner.aggregate_evaluate(server_round, usable)
                except Exception as again:
                    exc = again
            log(WARNING, "round %d: evaluation not aggregated: %s", server_round, exc)
            return None

    def summary(self) -> None:
        log(INFO, "\t├── GradientCoding(%s): code %s, s=%d, timing=%s, straggler_timeout=%.1f s, "
            "dp=%s", type(self.inner).__name__, self.options.code.name, self.s, self.timing,
            self.straggler_timeout, self.dp.mode)
        self.inner.summary()
