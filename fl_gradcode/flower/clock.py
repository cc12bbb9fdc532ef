"""Round clocks: who is busy, when a round ends, how much (virtual or real) time it took.

One stopping rule for both clocks: a round ends at the first set of valid replies that
``decodable`` accepts (a decodable set, or ``min_replies`` replies for approximate codes), or at
the straggler deadline, where it decodes approximately from what arrived.

* :class:`VirtualClock`: every reply carries a virtual arrival time (compute + sampled latency);
  the round ends at the earliest decodable prefix in arrival order, or at the deadline. Each
  worker is busy until its own arrival; a worker that never answers (error, crash) is busy until
  the deadline, so a round with no valid reply still moves the clock and frees everyone. A
  worker sent work while still busy (``queued`` in :meth:`VirtualClock.start_round`) starts it
  when its current job ends, as a Flower SuperNode runs messages one after the other: its
  arrival is ``busy_until - round_start`` later than its own compute and latency. With
  ``stop_at_deadline`` (the server's ``stop_late_work``) a worker whose reply would arrive after
  the deadline stops there: it never replies and is busy only until the deadline (or until its
  earlier job ends, if that is later: the message had expired before it could start). With
  ``stop_at_end`` (``stop_late_work="decode"``) every worker still at work when the round ends
  (its first decodable set of replies, or its deadline) stops then, as a server able to cancel
  its messages would have it: no worker is busy when the next round starts.
* :class:`WallClock`: real time; busy workers are those whose earlier message is still
  unanswered (the grid knows them).

Both answer the same questions behind :class:`Clock` (who is busy, how to wait for a free
member, which busy members can take queued work, when a reply arrives, how long the grid waits,
what a worker is told about stopping), so that the strategy and its code policy never ask which
timing mode they run under. :data:`CLOCKS` is the one list of timing modes (the ``timing``
keyword, the instruction's ``timing`` field): a clock registered there answers every question
of :class:`Clock`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .options import TimingOptions

__all__ = ["CLOCKS", "Clock", "RoundWindow", "TimingDefault", "VirtualClock", "WallClock",
           "clock_class", "job_start", "make_clock", "timing_value"]

Decodable = Callable[[list[int]], bool]


class TimingDefault:
    """The default of a timing keyword outside the option layer (a clock's or a rival's
    ``measured_compute``, ``compute_cost_s``, ``upload_bandwidth``, ``latency``): the field of
    the same name of :class:`~fl_gradcode.flower.options.TimingOptions`, the one declaration,
    read when a value is built (:func:`timing_value`). Not read at import: the option layer
    imports this module, and a client process importing it must not import the option layer.
    """

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"TimingOptions.{self.name}"


def timing_value(value: Any) -> Any:
    """``value``, or the timing option's default when it is a :class:`TimingDefault`."""
    if not isinstance(value, TimingDefault):
        return value
    from .options import TimingOptions  # deferred: see TimingDefault

    return getattr(TimingOptions, value.name)


# typed Any: each stands for a value of its keyword's type
MEASURED_COMPUTE: Any = TimingDefault("measured_compute")
COMPUTE_COST_S: Any = TimingDefault("compute_cost_s")
UPLOAD_BANDWIDTH: Any = TimingDefault("upload_bandwidth")
LATENCY: Any = TimingDefault("latency")


@dataclass
class RoundWindow:
    """Which replies a round decodes from and when (clock time) it ended."""

    used: list[int]
    end: float
    late: list[int] = field(default_factory=list)  # valid replies that arrived after the end
    stopped: list[int] = field(default_factory=list)  # stopped at the deadline: never replied
    #: stopped worker -> clock time at which its work stopped (it is free from then on)
    stopped_at: dict[int, float] = field(default_factory=dict)


class Clock(Protocol):
    """What the strategy asks of a round clock (:class:`VirtualClock`, :class:`WallClock`).

    ``straggler_timeout`` is the current round's deadline (seconds from its start), set by
    :meth:`start_round`; ``now`` and ``round_start`` are clock times; ``last_duration`` is the
    length of the last finished round (``None`` before the first)."""

    timing: str
    now: float
    round_start: float
    straggler_timeout: float
    stop_at_deadline: bool
    #: work still running when the round ends (decode or deadline) stops then
    stop_at_end: bool
    #: replies' values are checked as they arrive (else in the decoding pass)
    checks_values_on_arrival: bool
    #: the grid returns a round early, at the first decodable set of replies
    returns_early: bool
    #: a reply's arrival is the clock's model (recorded for every reply sent), not observed
    models_arrivals: bool
    #: worker -> seconds its queued work waits behind an earlier job (this round)
    backlog: Mapping[int, float]
    last_duration: float | None

    @staticmethod
    def busy_mode(requested: str) -> str:
        """The ``busy`` mode (``"skip"``, ``"queue"``, ``"fit"``) rounds under this clock run
        when ``requested`` is asked for."""
        ...

    def queueable(self, nodes: Iterable[int], within_s: float = math.inf) -> set[int]:
        """Those of ``nodes`` that can be sent work queued behind their current job, and whose
        current job (as the clock knows it) ends within ``within_s`` seconds from now."""
        ...

    def busy_members(self, cohort: Iterable[int], grid: Any) -> set[int]: ...
    def wait_for_free(self, cohort: Iterable[int], grid: Any, timeout: float) -> None: ...
    def start_round(self, queued: Mapping[int, int] | None = None,
                    deadline: float | None = None) -> None: ...
    def window(self, arrivals: Mapping[int, float], decodable: Decodable, num_sent: int,
               failures: Mapping[int, float] | None = None) -> RoundWindow: ...
    def finish_round(self, sent_nodes: Iterable[int], arrivals_by_node: Mapping[int, float],
                     end: float, answered: Iterable[int] = ()) -> None: ...
    def arrival(self, compute_s: float, payload_bytes: int, load: Callable[[], float],
                delay: Callable[[float], float]) -> float: ...
    def instruction_delay(self, delay: Callable[[], float]) -> float: ...
    def stop_after_s(self, round_number: int) -> float: ...
    def grid_limit_s(self, round_number: int, timeouts: Any, timeout: float | None,
                     sent: Iterable[Any]) -> float: ...
    def first_reply_deadline_s(self, round_number: int | None,
                               straggler_timeout: float) -> float | None: ...


class VirtualClock:
    """Virtual time: honest at 100+ clients on 2 cores (arrivals come from the latency model,
    not from how a thread pool scheduled the clients).

    A reply arrives ``compute + compute_cost_s * load + delay + bytes / upload_bandwidth``
    seconds after its round started (compute: the mod's measured seconds when
    ``measured_compute``), plus the wait of work queued behind an earlier job. The three
    charges default to ``GradientCoding``'s (:class:`TimingDefault`)."""

    timing = "virtual"
    #: a reply's arrival is the clock's model, so every reply sent has one
    models_arrivals = True
    checks_values_on_arrival = True
    returns_early = False

    def __init__(self, straggler_timeout: float, stop_at_deadline: bool | str = False, *,
                 measured_compute: bool = MEASURED_COMPUTE,
                 compute_cost_s: float = COMPUTE_COST_S,
                 upload_bandwidth: float | None = UPLOAD_BANDWIDTH) -> None:
        self.straggler_timeout = float(straggler_timeout)
        self.measured_compute = timing_value(measured_compute)
        self.compute_cost_s = float(timing_value(compute_cost_s))
        self.upload_bandwidth = timing_value(upload_bandwidth)
        self.now = 0.0
        self.round_start = 0.0
        self.busy_until: dict[int, float] = {}  # node -> virtual time
        self.backlog: dict[int, float] = {}  # worker -> seconds its queued work waits
        self._node_backlog: dict[int, float] = {}  # the same, by node
        self.last_duration: float | None = None  # length of the last finished round
        # work still running at the deadline is abandoned ("decode": at the round's end)
        self.stop_at_deadline = bool(stop_at_deadline)
        self.stop_at_end = stop_at_deadline == "decode"

    @staticmethod
    def busy_mode(requested: str) -> str:
        """Any mode: a busy member's work can be queued (it starts when its job ends)."""
        return requested

    def busy(self, nodes: Iterable[int]) -> set[int]:
        return {n for n in nodes if self.busy_until.get(n, 0.0) > self.now}

    def busy_members(self, cohort: Iterable[int], grid: Any) -> set[int]:
        """Members still busy with earlier work at ``now``."""
        return self.busy(cohort)

    def queueable(self, nodes: Iterable[int], within_s: float = math.inf) -> set[int]:
        """Those of ``nodes`` whose work so far ends (``busy_until``: a simulator's knowledge)
        less than ``within_s`` seconds from now; every node can take queued work."""
        return {n for n in nodes if self.busy_until.get(n, 0.0) - self.now < within_s}

    def wait_for_free(self, cohort: Iterable[int], grid: Any, timeout: float) -> None:
        self.wait_for_any_free(cohort)

    def arrival(self, compute_s: float, payload_bytes: int, load: Callable[[], float],
                delay: Callable[[float], float]) -> float:
        """Seconds from the round's start until a reply arrives (before any queueing)."""
        units = load()
        compute = compute_s if self.measured_compute else 0.0
        transfer = 0.0
        if self.upload_bandwidth is not None:
            transfer = payload_bytes / self.upload_bandwidth
        return compute + self.compute_cost_s * units + delay(units) + transfer

    def instruction_delay(self, delay: Callable[[], float]) -> float:
        """The delay a worker sleeps (none: virtual delays are added by the server)."""
        return 0.0

    def stop_after_s(self, round_number: int) -> float:
        """What the instruction says about stopping (nothing: the clock models it)."""
        return 0.0

    def grid_limit_s(self, round_number: int, timeouts: Any, timeout: float | None,
                     sent: Iterable[Any]) -> float:
        """Wall-clock seconds the grid waits: every reply, up to ``round_timeout``."""
        limit = timeouts.round_timeout
        return min(limit, timeout) if timeout else limit

    def first_reply_deadline_s(self, round_number: int | None,
                               straggler_timeout: float) -> float | None:
        return None

    #: a node silent for this many times the longest real gap between the round's replies
    #: (and at least ``straggler_timeout`` seconds) is taken for hung
    HANG_FACTOR = 10.0

    def hang_after_s(self, longest_gap_s: float) -> float:
        """Real seconds without any reply after which the nodes still silent are stragglers:
        ``max(straggler_timeout, HANG_FACTOR * longest_gap_s)``, ``longest_gap_s`` the longest
        real wait between the round's start and its replies so far, or between two of them.
        Virtual arrivals do not depend on how long the grid waits, except for a node that
        hangs: without this bound every round would wait ``round_timeout`` for it. With
        ``measured_compute`` a node computing longer than ``straggler_timeout`` is a straggler
        anyway (its virtual arrival is past the deadline)."""
        return max(self.straggler_timeout, self.HANG_FACTOR * float(longest_gap_s))

    def wait_for_any_free(self, nodes: Iterable[int]) -> None:
        """All ``nodes`` busy: jump to the first moment one is free (never burn a round)."""
        times = [self.busy_until.get(n, 0.0) for n in nodes]
        if times:
            self.now = max(self.now, min(times))

    def start_round(self, queued: Mapping[int, int] | None = None,
                    deadline: float | None = None) -> None:
        """Start a round now. ``queued``: worker -> node of the workers sent work while still
        busy; each starts it when its current job ends (``backlog[worker]`` seconds).
        ``deadline``: the round's deadline in seconds from now (default: unchanged)."""
        if deadline is not None:
            self.straggler_timeout = float(deadline)
        self.round_start = self.now
        self._node_backlog = {
            node: max(self.busy_until.get(node, 0.0) - self.now, 0.0)
            for node in (queued or {}).values()
        }
        self.backlog = {w: self._node_backlog[node] for w, node in (queued or {}).items()}

    def window(
        self, arrivals: Mapping[int, float], decodable: Decodable, num_sent: int,
        failures: Mapping[int, float] | None = None,
    ) -> RoundWindow:
        """``arrivals``: worker -> seconds of its own work (compute and latency), valid replies
        only; a queued worker's reply arrives ``backlog[worker]`` seconds later.
        ``failures``: worker -> seconds after its job's start at which the server hears it
        will never reply (its device went off; a queued worker's ``backlog[worker]`` seconds
        later too): once every worker sent work has replied or been heard of, the round needs
        no deadline and ends then, decoded or not."""
        arrivals = {w: t + self.backlog.get(w, 0.0) for w, t in arrivals.items()}
        failures = {w: t + self.backlog.get(w, 0.0) for w, t in (failures or {}).items()}
        deadline = self.straggler_timeout
        stopped: list[int] = []
        if self.stop_at_deadline:  # stopped at the deadline: never replies
            stopped = sorted(w for w, t in arrivals.items() if t > deadline)
            arrivals = {w: t for w, t in arrivals.items() if t <= deadline}
        stopped_at = {w: self.round_start + self._stopped_job(self.backlog.get(w, 0.0))
                      for w in stopped}
        order = sorted(arrivals, key=lambda w: (arrivals[w], w))
        prefix: list[int] = []
        for worker in order:
            if arrivals[worker] > deadline:
                break
            prefix.append(worker)
            if decodable(prefix):
                end = arrivals[worker]
                late = order[len(prefix) :]
                if self.stop_at_end:  # those still at work stop now: they never reply
                    stopped = sorted([*stopped, *(w for w in late if arrivals[w] > end)])
                    stopped_at = {w: self.round_start + max(self.backlog.get(w, 0.0), end)
                                  for w in stopped}
                    late = [w for w in late if arrivals[w] <= end]  # done as it ended
                return RoundWindow(prefix, self.round_start + end, late, stopped, stopped_at)
        if (prefix or failures) and len(prefix) + len(failures) == num_sent:
            # everyone replied or was heard of, still not decodable
            end = min(max([arrivals[w] for w in prefix[-1:]] + list(failures.values())),
                      deadline)
        else:
            end = deadline
        return RoundWindow(prefix, self.round_start + end, order[len(prefix) :], stopped,
                           stopped_at)

    def _stopped_job(self, wait: float) -> float:
        """Seconds from the round's start until the work of a worker stopped at the deadline
        ends: the deadline, or the end of its earlier job if that is later (the message had
        expired before it could start)."""
        return max(wait, self.straggler_timeout)

    def finish_round(
        self,
        sent_nodes: Iterable[int],
        arrivals_by_node: Mapping[int, float],
        end: float,
        answered: Iterable[int] = (),
    ) -> None:
        """Busy-until for every node sent work (its valid reply's arrival, ``arrivals_by_node``
        as in :meth:`window` plus its backlog; the round's end if it answered with a rejected or
        error reply; the deadline if it never answered; never before its earlier job ends;
        with ``stop_at_end`` never after the round's end); the clock moves to the round's
        end."""
        answered = set(answered)
        for node in sent_nodes:
            if node in arrivals_by_node:
                wait = self._node_backlog.get(node, 0.0)
                job = wait + max(arrivals_by_node[node], 0.0)
                if self.stop_at_end and self.round_start + job > end:
                    job = max(wait, end - self.round_start)
                elif self.stop_at_deadline and job > self.straggler_timeout:
                    job = self._stopped_job(wait)
                until = self.round_start + job
            elif node in answered or self.stop_at_end:
                until = end
            else:
                until = self.round_start + self.straggler_timeout
            self.busy_until[node] = max(until, self.busy_until.get(node, 0.0))
        self.last_duration = end - self.round_start
        self.now = max(self.now, end)


class WallClock:
    """Real time; the grid tracks unanswered (busy) nodes. With ``stop_at_deadline`` the
    workers are told to stop at the round's deadline (from round 2: round 1's deadline counts
    from its first reply)."""

    timing = "wallclock"
    #: arrivals are not modelled (the replies came when they came): none is recorded
    models_arrivals = False
    checks_values_on_arrival = False  # checked in the decoding pass, off the critical path
    returns_early = True

    def __init__(self, straggler_timeout: float, stop_at_deadline: bool = False,
                 **_unused: Any) -> None:
        self.straggler_timeout = float(straggler_timeout)
        self.stop_at_deadline = bool(stop_at_deadline)
        self.stop_at_end = False  # a message a node is running cannot be cancelled
        self.now = 0.0
        self.round_start = 0.0
        self.backlog: dict[int, float] = {}  # never queued: always empty
        self.last_duration: float | None = None  # length of the last finished round
        self._t0 = time.monotonic()

    @staticmethod
    def busy_mode(requested: str) -> str:
        """``"skip"`` whatever is requested: the grid waits for a busy member's earlier reply
        (queueing work behind it is not implemented)."""
        return "skip"

    def busy_members(self, cohort: Iterable[int], grid: Any) -> set[int]:
        """Members whose earlier message is still unanswered (the grid knows them)."""
        # imported here: the grid imports the protocol, which reads this module's CLOCKS
        from .grid import EarlyReturnGrid

        if isinstance(grid, EarlyReturnGrid):
            return grid.busy_nodes() & set(cohort)
        return set()

    def queueable(self, nodes: Iterable[int], within_s: float = math.inf) -> set[int]:
        """None: work is never queued on a busy member (see :meth:`busy_mode`)."""
        return set()

    def wait_for_free(self, cohort: Iterable[int], grid: Any, timeout: float) -> None:
        from .grid import EarlyReturnGrid

        if isinstance(grid, EarlyReturnGrid):
            grid.wait_until_free(set(cohort), timeout)

    def arrival(self, compute_s: float, payload_bytes: int, load: Callable[[], float],
                delay: Callable[[float], float]) -> float:
        """Real arrivals are not modelled: every valid reply the grid returned counts."""
        return 0.0

    def instruction_delay(self, delay: Callable[[], float]) -> float:
        """The simulated delay the worker sleeps."""
        return delay()

    def stop_after_s(self, round_number: int) -> float:
        """Seconds after its message was created at which a worker stops (0: never)."""
        if self.stop_at_deadline and round_number > 1:
            return self.straggler_timeout
        return 0.0

    def grid_limit_s(self, round_number: int, timeouts: Any, timeout: float | None,
                     sent: Iterable[Any]) -> float:
        """Wall-clock seconds the grid waits: the deadline (round 1: at least the start-up
        ``warmup_timeout``); when workers stop at the deadline, counted from the creation of
        the ``sent`` messages, so that no worker stops before the server stops waiting for
        it."""
        if round_number == 1:
            limit = max(timeouts.straggler_timeout, timeouts.warmup_timeout)
        else:
            limit = self.straggler_timeout
        limit = min(limit, timeout) if timeout else limit
        sent = list(sent)
        if self.stop_at_deadline and round_number > 1 and sent:
            created = min(float(msg.metadata.created_at) for msg in sent)
            limit = max(limit - max(time.time() - created, 0.0), 0.0)
        return limit

    def first_reply_deadline_s(self, round_number: int | None,
                               straggler_timeout: float) -> float | None:
        """Round 1: the straggler deadline counts from the first reply (start-up)."""
        return straggler_timeout if round_number == 1 else None

    def start_round(self, queued: Mapping[int, int] | None = None,
                    deadline: float | None = None) -> None:
        """Start a round now. Work is never queued on busy nodes in wallclock timing (the grid
        still waits for their earlier replies): ``queued`` must be empty."""
        if queued:
            raise ValueError("wallclock timing does not queue work on busy nodes")
        if deadline is not None:
            self.straggler_timeout = float(deadline)
        self.round_start = time.monotonic() - self._t0
        self.now = self.round_start

    def window(
        self, arrivals: Mapping[int, float], decodable: Decodable, num_sent: int,
        failures: Mapping[int, float] | None = None,
    ) -> RoundWindow:
        """Every valid reply the grid returned is used (it returned at the first decodable
        set or at the deadline; in real time a node gone off is the grid's error reply, so
        ``failures`` is not read)."""
        used = sorted(arrivals, key=lambda w: (arrivals[w], w))
        return RoundWindow(used, time.monotonic() - self._t0)

    def finish_round(
        self,
        sent_nodes: Iterable[int],
        arrivals_by_node: Mapping[int, float],
        end: float,
        answered: Iterable[int] = (),
    ) -> None:
        self.last_duration = end - self.round_start
        self.now = end


#: The timing modes and their clocks: the one list of timing modes (options, the instruction's
#: ``timing`` field and the run config's ``timing`` key read it).
CLOCKS: dict[str, type[VirtualClock] | type[WallClock]] = {
    "virtual": VirtualClock, "wallclock": WallClock}


def job_start(clock: Clock, worker: int) -> float:
    """Clock time at which ``worker``'s job of the current round starts: the round's start,
    or, for work queued behind an earlier job, that job's end (``backlog[worker]`` later)."""
    return clock.round_start + clock.backlog.get(worker, 0.0)


def clock_class(timing: str) -> type[VirtualClock] | type[WallClock]:
    """The clock class of a timing mode (a key of :data:`CLOCKS`)."""
    if timing not in CLOCKS:
        raise ValueError(f"timing={timing!r}; expected one of {sorted(CLOCKS)}")
    return CLOCKS[timing]


def make_clock(timing: TimingOptions, straggler_timeout: float) -> VirtualClock | WallClock:
    """The clock of the timing group's mode (a key of :data:`CLOCKS`), stopping work at the
    deadline with its ``stop_late_work``; a virtual clock charges its ``measured_compute``,
    ``compute_cost_s`` and ``upload_bandwidth``."""
    clock = clock_class(timing.mode)
    if not straggler_timeout > 0:
        raise ValueError(f"straggler_timeout={straggler_timeout!r} must be > 0 seconds")
    return clock(straggler_timeout, timing.stop_late_work,
                 measured_compute=timing.measured_compute, compute_cost_s=timing.compute_cost_s,
                 upload_bandwidth=timing.upload_bandwidth)
