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
  earlier job ends, if that is later: the message had expired before it could start).
* :class:`WallClock`: real time; busy workers are those whose earlier message is still
  unanswered (the grid knows them).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

__all__ = ["RoundWindow", "VirtualClock", "WallClock", "make_clock"]

Decodable = Callable[[list[int]], bool]


@dataclass
class RoundWindow:
    """Which replies a round decodes from and when (clock time) it ended."""

    used: list[int]
    end: float
    late: list[int] = field(default_factory=list)  # valid replies that arrived after the end
    stopped: list[int] = field(default_factory=list)  # stopped at the deadline: never replied


class VirtualClock:
    """Virtual time: honest at 100+ clients on 2 cores (arrivals come from the latency model,
    not from how a thread pool scheduled the clients)."""

    timing = "virtual"

    def __init__(self, straggler_timeout: float) -> None:
        self.straggler_timeout = float(straggler_timeout)
        self.now = 0.0
        self.round_start = 0.0
        self.busy_until: dict[int, float] = {}  # node -> virtual time
        self.backlog: dict[int, float] = {}  # worker -> seconds its queued work waits
        self._node_backlog: dict[int, float] = {}  # the same, by node
        self.last_duration: float | None = None  # length of the last finished round
        self.stop_at_deadline = False  # work still running at the deadline is abandoned

    def busy(self, nodes: Iterable[int]) -> set[int]:
        return {n for n in nodes if self.busy_until.get(n, 0.0) > self.now}

    def wait_for_any_free(self, nodes: Iterable[int]) -> None:
        """All ``nodes`` busy: jump to the first moment one is free (never burn a round)."""
        times = [self.busy_until.get(n, 0.0) for n in nodes]
        if times:
            self.now = max(self.now, min(times))

    def start_round(self, queued: Mapping[int, int] | None = None) -> None:
        """Start a round now. ``queued``: worker -> node of the workers sent work while still
        busy; each starts it when its current job ends (``backlog[worker]`` seconds)."""
        self.round_start = self.now
        self._node_backlog = {
            node: max(self.busy_until.get(node, 0.0) - self.now, 0.0)
            for node in (queued or {}).values()
        }
        self.backlog = {w: self._node_backlog[node] for w, node in (queued or {}).items()}

    def window(
        self, arrivals: Mapping[int, float], decodable: Decodable, num_sent: int
    ) -> RoundWindow:
        """``arrivals``: worker -> seconds of its own work (compute and latency), valid replies
        only; a queued worker's reply arrives ``backlog[worker]`` seconds later."""
        arrivals = {w: t + self.backlog.get(w, 0.0) for w, t in arrivals.items()}
        deadline = self.straggler_timeout
        stopped: list[int] = []
        if self.stop_at_deadline:  # stopped at the deadline: never replies
            stopped = sorted(w for w, t in arrivals.items() if t > deadline)
            arrivals = {w: t for w, t in arrivals.items() if t <= deadline}
        order = sorted(arrivals, key=lambda w: (arrivals[w], w))
        prefix: list[int] = []
        for worker in order:
            if arrivals[worker] > deadline:
                break
            prefix.append(worker)
            if decodable(prefix):
                end = arrivals[worker]
                return RoundWindow(prefix, self.round_start + end, order[len(prefix) :],
                                   stopped)
        if prefix and len(prefix) == num_sent:  # everyone replied, still not decodable
            end = arrivals[prefix[-1]]
        else:
            end = deadline
        return RoundWindow(prefix, self.round_start + end, order[len(prefix) :], stopped)

    def finish_round(
        self,
        sent_nodes: Iterable[int],
        arrivals_by_node: Mapping[int, float],
        end: float,
        answered: Iterable[int] = (),
    ) -> None:
        """Busy-until for every node sent work (its valid reply's arrival, ``arrivals_by_node``
        as in :meth:`window` plus its backlog; the round's end if it answered with a rejected or
        error reply; the deadline if it never answered; never before its earlier job ends);
        the clock moves to the round's end."""
        answered = set(answered)
        for node in sent_nodes:
            if node in arrivals_by_node:
                wait = self._node_backlog.get(node, 0.0)
                job = wait + max(arrivals_by_node[node], 0.0)
                if self.stop_at_deadline and job > self.straggler_timeout:
                    job = max(wait, self.straggler_timeout)
                until = self.round_start + job
            elif node in answered:
                until = end
            else:
                until = self.round_start + self.straggler_timeout
            self.busy_until[node] = max(until, self.busy_until.get(node, 0.0))
        self.last_duration = end - self.round_start
        self.now = max(self.now, end)


class WallClock:
    """Real time; the grid tracks unanswered (busy) nodes."""

    timing = "wallclock"

    def __init__(self, straggler_timeout: float) -> None:
        self.straggler_timeout = float(straggler_timeout)
        self.now = 0.0
        self.round_start = 0.0
        self._t0 = time.monotonic()

    def start_round(self, queued: Mapping[int, int] | None = None) -> None:
        """Start a round now. Work is never queued on busy nodes in wallclock timing (the grid
        still waits for their earlier replies): ``queued`` must be empty."""
        if queued:
            raise ValueError("wallclock timing does not queue work on busy nodes")
        self.round_start = time.monotonic() - self._t0
        self.now = self.round_start

    def window(
        self, arrivals: Mapping[int, float], decodable: Decodable, num_sent: int
    ) -> RoundWindow:
        """Every valid reply the grid returned is used (it returned at the first decodable
        set or at the deadline)."""
        used = sorted(arrivals, key=lambda w: (arrivals[w], w))
        return RoundWindow(used, time.monotonic() - self._t0)

    def finish_round(
        self,
        sent_nodes: Iterable[int],
        arrivals_by_node: Mapping[int, float],
        end: float,
        answered: Iterable[int] = (),
    ) -> None:
        self.now = end


def make_clock(timing: str, straggler_timeout: float) -> VirtualClock | WallClock:
    """The clock of a timing mode (``"virtual"`` or ``"wallclock"``)."""
    clocks = {"virtual": VirtualClock, "wallclock": WallClock}
    if timing not in clocks:
        raise ValueError(f"timing={timing!r}; expected one of {sorted(clocks)}")
    if not straggler_timeout > 0:
        raise ValueError(f"straggler_timeout={straggler_timeout!r} must be > 0 seconds")
    return clocks[timing](straggler_timeout)
