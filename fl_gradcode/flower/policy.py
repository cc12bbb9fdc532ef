"""The code policy of :class:`~fl_gradcode.flower.GradientCoding`: which code each round uses,
and which busy members get work queued behind their current job.

* :class:`FixedCodePolicy`: one registry code (or a given :class:`~fl_gradcode.codes.GradientCode`)
  per cohort size; with ``busy="fit"`` the busy members it queues are decided from the
  estimated latencies (:class:`~fl_gradcode.adaptive.SingleCode`).
* :class:`AdaptiveCodePolicy` (``s="auto"``): the tolerance of a nested placement chosen every
  round by :func:`~fl_gradcode.adaptive.choose_s` (Tandon et al., ICML 2017,
  https://arxiv.org/abs/1612.03301, for the codes; heterogeneity-aware assignment after Wang,
  Cheng, Ramamoorthy, ICDCS 2019, https://arxiv.org/abs/1901.09339).

Both learn from a :class:`~fl_gradcode.flower.latency_book.LatencyBook`: one latency
estimator over every node ever sampled, the work each node has not returned, replies that
arrive after their round, and the ``latency_state`` file. A scheme of one's own (an oracle
that knows the best ``s`` in hindsight, a policy that forgets) is a subclass passed as
``GradientCoding(code_policy=...)`` (an instance, or the class: then built with the
strategy's options); :meth:`AdaptiveCodePolicy.candidates` and
:meth:`FixedCodePolicy.estimator` are the documented points to override.

A policy reads its options from the strategy's groups (:class:`~.options.Options`, passed as
``options=``); built on its own, from ``GradientCoding``'s flat keywords, it builds the groups
with :meth:`~.options.Options.from_keywords`. Either way it declares no default and applies no
option rule of its own (``busy``'s resolution, ``auto_deadline`` implying ``stop_late_work``,
``s="auto"``'s ``s``: the rules are the groups').
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from logging import WARNING
from typing import Any, Protocol, runtime_checkable

import numpy as np
from flwr.common.logger import log

from .. import adaptive
from ..adaptive import Decision, SingleCode, code_loads
from ..codes import GradientCode, NestedPlacement
from ..codes.cohort import code_for_cohort
from .approximate_rounds import ApproximateRounds
from .latency_book import LatencyBook, read_latency_state
from .options import BUSY_MODES, Options
from .protocol import Identity
from .settle import placement_refusal

__all__ = ["BUSY_MODES", "AdaptiveCodePolicy", "CodePolicy", "FixedCodePolicy", "LatencyBook",
           "is_policy_factory", "make_code_policy", "read_latency_state",
           "resolve_code_policy"]


class PolicyHost(Protocol):
    """What a policy reads of the strategy it plans for (read each time: replaced freely)."""

    clock: Any
    identities: Mapping[int, Identity]


@runtime_checkable
class CodePolicy(Protocol):
    """Plans each round's code for a cohort and its busy members, learns from the round's
    arrivals, saves what it learnt. ``decision`` is the last plan's
    :class:`~fl_gradcode.adaptive.Decision` (``None``: a fixed code that decides nothing)."""

    decision: Decision | None
    estimating: bool  # whether it learns latencies (observe, save_state do something)
    busy: str  # what a busy member does: "skip", "queue" or "fit"
    adaptive: bool  # whether the code's tolerance changes between rounds

    @property
    def outstanding(self) -> dict[int, list[list[Any]]]:
        """Node -> its jobs not known to be done, ``[sent at, units, reply arrival or None,
        deadline]`` (the strategy appends what it sends)."""
        ...

    def bind(self, host: PolicyHost) -> None: ...

    def plan(self, cohort: list[int], busy_nodes: set[int]) -> GradientCode: ...

    def queued(self, busy_nodes: set[int], cohort: list[int]) -> set[int]: ...

    def code_for(self, n: int) -> GradientCode: ...

    def record_sent(self, state: Any, queued: set[int]) -> None: ...

    def excluded_workers(self) -> tuple[int, ...]: ...

    def expected_round_s(self) -> float | None: ...

    def observe(self, state: Any, arrivals: Mapping[int, float], window: Any) -> None: ...

    def save_state(self) -> None: ...


class FixedCodePolicy:
    """One code per cohort size; busy members skipped, queued, or (``busy="fit"``) queued
    when the estimated latencies say they can start in time.

    ``options``: the strategy's option groups (:class:`~.options.Options`); without them, the
    keywords are :class:`~fl_gradcode.flower.GradientCoding`'s (same names, same defaults,
    same rules: :meth:`~.options.Options.from_keywords`), e.g. ``FixedCodePolicy(code="frc",
    s=1)``. How the run measures time (``timing``, ``measured_compute``, ``compute_cost_s``)
    is written with the ``latency_state`` file and compared when it is read.
    """

    adaptive = False

    def __init__(self, *, options: Options | None = None, **keywords: Any) -> None:
        if options is None:
            options = Options.from_keywords(**self._keywords(keywords))
        elif keywords:
            raise TypeError(f"{type(self).__name__}: give options= or GradientCoding's keywords "
                            f"({sorted(keywords)}), not both")
        if options.code.adaptive != self.adaptive:
            s = "'auto'" if options.code.adaptive else options.code.s
            use = "AdaptiveCodePolicy" if options.code.adaptive else "FixedCodePolicy"
            raise ValueError(f"{type(self).__name__} cannot plan s={s}: use {use} (or a "
                             "subclass) as the code policy")
        self.options = options
        timing = options.timing
        self.book = LatencyBook(seed=self.seed, latency_state=options.adaptive.latency_state,
                                meta={"timing": timing.mode,
                                      "measured_compute": timing.measured_compute,
                                      "compute_cost_s": timing.compute_cost_s})
        self.decision: Decision | None = None
        self._codes: dict[int, GradientCode] = {}
        self._host: PolicyHost | None = None

    @staticmethod
    def _keywords(keywords: dict[str, Any]) -> dict[str, Any]:
        """The keywords :meth:`~.options.Options.from_keywords` builds this policy's options
        from (:class:`AdaptiveCodePolicy`: with ``s="auto"``)."""
        return keywords

    # ------------------------------------------------------------------ the options
    # read from the groups (never declared or resolved here)
    @property
    def code_spec(self) -> str | GradientCode:
        """The ``code`` keyword: a registry name or a ``GradientCode``."""
        return self.options.code.code

    @property
    def s(self) -> int:
        """The fixed tolerance (``s="auto"``: the placement's ``s_max``, 1 when ``None``)."""
        return self.options.code.s

    @property
    def s_max(self) -> int | None:
        return self.options.adaptive.s_max

    @property
    def code_options(self) -> dict[str, Any]:
        """``make_code``'s extra keyword arguments (``m``, a fixed nested placement's
        ``s_max`` included)."""
        return self.options.code_options

    @property
    def seed(self) -> int:
        return self.options.seed

    @property
    def busy(self) -> str:
        """``"skip"``, ``"queue"`` or ``"fit"``: the resolved ``busy``."""
        return self.options.timing.busy

    @property
    def stop_late_work(self) -> bool:
        """Work stops at the round's deadline (also implied by ``auto_deadline``)."""
        return self.options.timing.stop_late_work

    @property
    def straggler_timeout(self) -> float:
        return self.options.deadline.straggler_timeout

    @property
    def estimating(self) -> bool:
        """The latency estimator runs (``s="auto"``, or ``busy="fit"``)."""
        return self.options.estimating

    @property
    def margin(self) -> float:
        """The robust choice's margin (``auto_margin``; a fixed code has one candidate)."""
        return self.options.adaptive.auto_margin

    @property
    def exclude_slow(self) -> float | None:
        """Slowness factor from which ``s="auto"`` may exclude a client (``None``: never)."""
        return self.options.adaptive.exclude_slow

    # ------------------------------------------------------------------ the host
    def bind(self, host: PolicyHost) -> None:
        """Plan for ``host`` (its ``clock`` and ``identities`` are read when needed)."""
        self._host = host

    @property
    def clock(self) -> Any:
        if self._host is None:
            raise RuntimeError("the policy is not bound to a strategy (bind(host) first)")
        return self._host.clock

    @property
    def outstanding(self) -> dict[int, list[list[Any]]]:
        """Node -> its jobs not known to be done (:class:`LatencyBook`)."""
        return self.book.outstanding

    def partition_key(self, node: int) -> str:
        """A node's name in the ``latency_state`` file: its data partition as ``"id/of"``."""
        identity = None if self._host is None else self._host.identities.get(node)
        if identity is None:
            return f"node:{node}"
        return f"{identity.partition_id}/{identity.num_partitions}"

    # ------------------------------------------------------------------ planning
    def code_for(self, n: int) -> GradientCode:
        """The code for a cohort of ``n`` clients, one partition per member (built once per
        size; a size the code cannot take gets the nearest code that can, with a WARNING:
        :func:`~fl_gradcode.flower.membership.code_for_cohort`)."""
        if isinstance(self.code_spec, GradientCode) and self.code_spec.n == n:
            return self.code_spec
        if n not in self._codes:
            options = dict(self.code_options)
            if self.code_spec == "ignore-stragglers":
                options.setdefault("rescale", True)
            code, why = code_for_cohort(self.code_spec, n, self.s, self.seed, options)
            if why is not None:  # once per cohort size: the code is kept for that size
                log(WARNING, "%s", why)
            self._codes[n] = code
        return self._codes[n]

    def estimator(self, n: int, cohort: list[int]) -> Any:
        """The latency estimator seen through this cohort (``n`` members)."""
        return self.book.view(cohort, self.clock.now, self.partition_key)

    def plan(self, cohort: list[int], busy_nodes: set[int]) -> GradientCode:
        """A fixed code; with ``busy="fit"`` also whom to queue, decided as for ``s="auto"``
        (:class:`~fl_gradcode.adaptive.SingleCode`: the code is the only candidate)."""
        n = len(cohort)
        code = self.code_for(n)
        if self.busy == "fit":
            self.decision = self.decide(
                SingleCode(code), self.estimator(n, cohort), busy_nodes, cohort, [code.s]
            )
        return code

    def decide(self, placement: Any, estimator: Any, busy_nodes: set[int], cohort: list[int],
               candidates: list[int]) -> Decision:
        """:func:`~fl_gradcode.adaptive.choose_s` over ``candidates``, the busy clients priced
        from what the server knows (``busy="fit"`` queues those expected to start in time)."""
        busy_until, pending, limit = self.busy_inputs(placement, busy_nodes, cohort)
        # skip: busy clients never reply this round (only codes decodable without them
        # finish); queue / fit: those expected to finish in time get queued work, the rest skip
        return adaptive.choose_s(  # (looked up per call: a test may wrap it)
            placement, estimator, busy_until=busy_until, pending=pending, now=self.clock.now,
            candidates=candidates, busy="skip" if self.busy == "skip" else "fit",
            # work stopped at the round's end leaves no backlog for the next round
            margin=self.margin, lookahead=not self.clock.stop_at_end,
            rng=np.random.default_rng([self.seed, estimator.next_round_id]),
            exclude_slower_than=self.exclude_slow,
            pending_limit=None if pending is None or not self.stop_late_work else limit,
            deadline=self.options.deadline.straggler_timeout,
        )

    def busy_inputs(self, placement: Any, busy_nodes: set[int], cohort: list[int]
                    ) -> tuple[Any, Any, np.ndarray]:
        """``(busy_until, pending, limit)``: what :func:`~fl_gradcode.adaptive.choose_s` is
        told of the busy members (``pending``: the work each has not returned, under a clock
        that queues work on the cohort; else ``busy_until``: free at the straggler deadline;
        ``limit``: seconds until a member's work stops at its deadline)."""
        n, now = placement.n, self.clock.now
        busy_until = pending = None
        limit = np.full(n, np.inf)
        if self.clock.queueable(cohort):
            # what a server knows of a busy client: when it was sent the work it has not
            # returned, and how much (not when the reply will arrive: that is the simulator's)
            elapsed, units = np.full(n, np.nan), np.zeros(n)
            for w, node in enumerate(cohort):
                if node in busy_nodes:
                    elapsed[w], units[w] = self.book.pending_work(node, now,
                                                                  placement.s_max + 1.0)
                    jobs = self.outstanding.get(node)
                    if self.stop_late_work and jobs:  # its work stops at its deadline
                        limit[w] = max(max(job[3] for job in jobs) - now, 0.0)
            pending = (elapsed, units)
        else:
            busy_until = np.array(
                [now + self.straggler_timeout if node in busy_nodes else 0.0 for node in cohort]
            )
        return busy_until, pending, limit

    def queued(self, busy_nodes: set[int], cohort: list[int]) -> set[int]:
        """Busy members that get work queued behind their current job (``busy="queue"`` or
        ``"fit"``)."""
        clock = self.clock
        if self.busy == "skip":
            return set()
        if self.estimating and self.decision is not None:
            skip = {cohort[w] for w in self.decision.skip}
            return clock.queueable(node for node in busy_nodes if node not in skip)
        limit = self.straggler_timeout
        if clock.last_duration is not None:
            limit = min(limit, clock.last_duration)
        return clock.queueable(busy_nodes, limit)

    def excluded_workers(self) -> tuple[int, ...]:
        """Workers the last plan excluded (``s="auto"``'s heterogeneity-aware assignment):
        nothing to compute, nothing sent. (A fixed code's empty rows, e.g. bgc's, are still
        sent: their replies count.)"""
        return self.decision.excluded if self.adaptive and self.decision is not None else ()

    def expected_round_s(self) -> float | None:
        """The predicted time of the round's code (``auto``, or a fixed code with
        ``busy="fit"``); ``None`` for other fixed codes, before any observation (no estimate:
        ``choose_s`` starts at ``s_max`` unpriced) and when the prediction is not finite (no
        candidate predicted to decode)."""
        if self.decision is None or not self.estimating:
            return None
        value = self.decision.expected_time
        return value if math.isfinite(value) else None

    # ------------------------------------------------------------------ learning
    def record_sent(self, state: Any, queued: set[int]) -> None:
        """Remember the jobs sent this round (busy members are priced from them): per node
        ``[sent at, units, reply arrival (None: not yet), deadline (work stops)]``, behind its
        unfinished jobs when ``queued``."""
        clock = self.clock
        if not self.estimating:
            return
        units = code_loads(state.code, 1.0)
        tracked = clock.queueable(state.cohort[worker] for worker in state.sent)
        for worker in state.sent:
            node = state.cohort[worker]
            if node not in tracked:  # no later work queues behind it
                continue
            self.book.add_job(node, clock.now, float(units[worker]),
                              clock.now + clock.straggler_timeout, behind=node in queued)

    def waited(self, state: Any, duration: float) -> np.ndarray:
        """Per worker, seconds from the round's start until its work could start, from the
        server's records: work queued behind earlier jobs starts when the last of their
        replies arrived (a node runs its messages in order). A predecessor not back by the
        round's end, or never back (an error, no answer), leaves the start unknown: the
        whole round (the estimator takes no information from that worker this round)."""
        start = self.clock.round_start
        end = start + duration
        waited = np.zeros(state.code.n)
        for w in state.sent:
            jobs = self.outstanding.get(state.cohort[w], [])
            before = [job[2] for job in jobs[:-1]]  # the last job is this round's
            if not before:
                continue
            if any(arrival is None or arrival > end for arrival in before):
                waited[w] = duration
            else:
                waited[w] = max(max(before) - start, 0.0)
        return waited

    def observe(self, state: Any, arrivals: Mapping[int, float], window: Any) -> None:
        """Feed the round to the latency estimator: replies in time are observed, the others
        censored at the round's end (late ones observed when the clock passes them)."""
        estimator = self.book.estimator
        if not self.estimating or estimator is None:
            return
        clock = self.clock
        # the estimator's index of each worker (every member was registered this round)
        index = [self.book.node_index[node] for node in state.cohort]
        duration = max(window.end - clock.round_start, 1e-9)
        elapsed = np.full(estimator.n, np.nan)
        loads = np.zeros(estimator.n)
        sent_loads = code_loads(state.code, 1.0)
        for w in state.sent:
            loads[index[w]] = sent_loads[w]
        backlog = clock.backlog
        late = []
        for w, t in arrivals.items():
            t = t + backlog.get(w, 0.0)  # the arrival: queued work runs after the earlier job
            # stopped at the deadline (the clock's decision): free when the clock frees it
            stopped = w in window.stopped
            end = window.stopped_at[w] if stopped else clock.round_start + t
            jobs = self.outstanding.get(state.cohort[w])
            if w in state.sent and jobs:  # this round's job: known done once it arrives
                jobs[-1][2] = end
            if w in state.sent:
                if t <= duration:
                    elapsed[index[w]] = t
                elif stopped and clock.stop_at_end:
                    continue  # stopped at the round's end: censored there by the update
                elif stopped:  # censored at the deadline
                    late.append((index[w], end, clock.straggler_timeout, True))
                else:
                    late.append((index[w], end, t, False))
        busy = np.zeros(estimator.n)
        busy[index] = self.waited(state, duration)
        rid = estimator.update(elapsed, loads, duration, busy=busy)
        for i, end, seen, stopped in late:
            self.book.late.append((end, rid, i, seen, stopped))

    def save_state(self) -> None:
        """Write what was learnt to the ``latency_state`` file (if any)."""
        if self.estimating:
            self.book.save()


class AdaptiveCodePolicy(FixedCodePolicy):
    """``s="auto"``: each round the tolerance of a nested placement
    (:class:`~fl_gradcode.codes.NestedPlacement`, ``s_max`` default ``max(1, n // 4)``)
    predicted fastest by :func:`~fl_gradcode.adaptive.choose_s`, within a trust region: ``s``
    falls at most to half the last round's (the load exponent is extrapolated beyond the
    loads seen so far). ``busy=None``: ``"queue"``. ``auto_approximate=True``: a round may
    instead decode what arrived by a deadline when that is cheaper per unit of progress
    (:class:`~fl_gradcode.flower.approximate_rounds.ApproximateRounds`).

    Extension point: :meth:`candidates` (the tolerances considered this round).
    """

    adaptive = True

    def __init__(self, *, options: Options | None = None, **keywords: Any) -> None:
        super().__init__(options=options, **keywords)
        self.placements: dict[int, NestedPlacement] = {}
        self.last_s: dict[int, int] = {}  # cohort size -> the last round's s
        self._verifiable: dict[tuple[int, int], tuple[int, ...]] = {}
        # approximate rounds (auto_approximate): priced after the exact choice
        self.approximate = (ApproximateRounds(self.seed)
                            if self.options.adaptive.auto_approximate else None)

    @staticmethod
    def _keywords(keywords: dict[str, Any]) -> dict[str, Any]:
        return {"s": "auto", **keywords}

    def placement(self, n: int) -> NestedPlacement:
        """The nested placement for a cohort of ``n`` (built once per size)."""
        if n not in self.placements:
            s_max = min(self.s_max if self.s_max is not None else max(1, n // 4), n - 1)
            if self.s_max is not None and self.s_max > s_max:  # said once per cohort size
                log(WARNING, "s_max=%d cannot be tolerated with a cohort of %d (at most %d): "
                    "s='auto' chooses s in 0..%d for cohorts of %d", self.s_max, n, s_max,
                    s_max, n)
            self.placements[n] = NestedPlacement(n, s_max, seed=self.seed)
        return self.placements[n]

    def candidates(self, placement: NestedPlacement, estimator: Any) -> list[int]:
        """The tolerances considered this round: the trust region (``s`` falls at most to
        half the last round's of this cohort size; every ``s`` before any observation)."""
        last = self.last_s.get(placement.n, 0) if estimator.has_data else 0
        return [c for c in self.tolerances(placement) if c >= last // 2]

    def tolerances(self, placement: NestedPlacement) -> tuple[int, ...]:
        """Every tolerance a round may run: the stable ones (with ``verify=True``, those
        :meth:`verifiable`)."""
        if self.options.integrity.verify:
            return self.verifiable(placement)
        return placement.stable_values

    def verifiable(self, placement: NestedPlacement) -> tuple[int, ...]:
        """``verify=True``: the stable tolerances whose code ``verify`` can settle (every
        block a repetition group of ``s + 1`` or more replicas:
        :func:`~fl_gradcode.flower.settle.placement_refusal`), and ``s = 0`` (applied
        unverified, warned). Another ``s`` would leave its blocks out of every round."""
        key = (placement.n, placement.s_max)
        if key not in self._verifiable:
            self._verifiable[key] = tuple(
                s for s in placement.stable_values
                if s == 0 or placement_refusal(placement.code(s)) is None)
            if self._verifiable[key] == (0,):  # said once per cohort size
                log(WARNING, "verify=True with s='auto': no s in 1..%d gives repetition "
                    "groups for a cohort of %d, so its rounds run at s=0 (unverified, waiting "
                    "for every client); an s_max s with (s + 1) dividing the cohort gives one",
                    placement.s_max, placement.n)
        return self._verifiable[key]

    def plan(self, cohort: list[int], busy_nodes: set[int]) -> GradientCode:
        """This round's code from the nested placement and the estimator."""
        n = len(cohort)
        placement = self.placement(n)
        estimator = self.estimator(n, cohort)
        candidates = self.candidates(placement, estimator)
        self.decision = self.decide(placement, estimator, busy_nodes, cohort, candidates)
        if self.approximate is not None:
            inputs = (*self.busy_inputs(placement, busy_nodes, cohort), self.clock.now)
            self.decision = self.approximate.revise(
                self.decision, placement, estimator, inputs, candidates,
                self.options.deadline.max_decode_error, list(self.tolerances(placement)))
        self.last_s[n] = self.decision.s
        if self.decision.excluded:
            return placement.code_excluding(self.decision.s, self.decision.excluded)
        return placement.code(self.decision.s)

    def after_decode(self, state: Any, decode: str, used: list[int],
                     window_used: list[int], max_decode_error: float) -> None:
        """After the round's decoding (``auto_approximate``): count approximate rounds and
        measure, in exact ones, the errors of decoding fewer replies."""
        if self.approximate is not None:
            self.approximate.after_round(self.decision, state, decode, used, window_used,
                                         max_decode_error)


def make_code_policy(*, factory: Callable[..., CodePolicy] | None = None,
                     options: Options | None = None, **keywords: Any) -> CodePolicy:
    """The policy the options describe (``options``, else built from ``GradientCoding``'s
    ``keywords``): :class:`AdaptiveCodePolicy` for ``s="auto"``, else
    :class:`FixedCodePolicy`. ``factory``: a subclass (or any callable taking ``options=``)
    used instead, called with ``options=`` the groups."""
    if options is None:
        options = Options.from_keywords(**keywords)
    elif keywords:
        raise TypeError(f"make_code_policy: give options= or GradientCoding's keywords "
                        f"({sorted(keywords)}), not both")
    make = factory or (AdaptiveCodePolicy if options.code.adaptive else FixedCodePolicy)
    return make(options=options)


def resolve_code_policy(given: CodePolicy | Callable[..., CodePolicy] | None,
                        options: Options | None = None, **keywords: Any) -> CodePolicy:
    """``GradientCoding(code_policy=given)``'s policy: ``given`` when it is a policy instance
    (its ``adaptive``, ``busy`` and ``estimating`` then decide the rounds), else
    :func:`make_code_policy` of the strategy's ``options`` (or flat ``keywords``), built by
    ``given`` when it is a policy class or factory (a subclass of :class:`AdaptiveCodePolicy`
    for ``s="auto"``, of :class:`FixedCodePolicy` otherwise, or any callable taking
    ``options=``)."""
    if given is not None and not is_policy_factory(given):
        own = getattr(given, "options", None)
        if (options is not None and options.integrity.verify and isinstance(own, Options)
                and not own.integrity.verify):
            raise ValueError(f"code_policy: a {type(given).__name__} built without "
                             "verify=True, for a strategy that verifies: it would choose codes "
                             "verify cannot settle; build it with verify=True (or pass its "
                             "class)")
        return given
    return make_code_policy(factory=given, options=options, **keywords)


def is_policy_factory(value: Any) -> bool:
    """Whether ``value`` is a policy class or factory (called with the keywords), not a
    policy instance."""
    return isinstance(value, type) or (callable(value) and not hasattr(value, "plan"))
