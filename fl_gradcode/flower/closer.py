"""Closing a coded round's window: which replies the round decodes from, and when it ended.

:class:`RoundCloser` times each valid reply with the clock's model (compute, load, delay and
transfer in virtual time; every reply the grid returned under wallclock timing), lets the
clock pick the window (the first decodable set, or the deadline: the stopping rule of
gradient coding, Tandon, Lei, Dimakis, Karampatziakis, ICML 2017,
https://arxiv.org/abs/1612.03301), moves the clock on, and feeds the round to the code
policy's latency estimate.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .clock import Clock, RoundWindow
from .policy import CodePolicy
from .protocol import CodedReply
from .round_state import RoundState
from .workload import Workload

__all__ = ["RoundCloser"]


class RoundCloser:
    """Ends a round's window on the clock (one job: the end of a round's timing).

    ``decodable(code)``: the stopping rule, a test of a set of workers (the reply
    collector's :meth:`~fl_gradcode.flower.collector.ReplyCollector.decodable`)."""

    def __init__(self, *, clock: Clock, policy: CodePolicy, workload: Workload,
                 decodable: Callable[[Any], Callable[[list[int]], bool]]) -> None:
        self.clock, self.policy, self.workload = clock, policy, workload
        self.decodable = decodable

    def arrival(self, state: RoundState, worker: int, reply: CodedReply) -> float:
        """Seconds from the round's start until ``worker``'s reply arrives (the clock's
        model: compute, load, delay and transfer in virtual time)."""
        return self.clock.arrival(
            reply.compute_s, reply.extra.get("bytes", 0),
            lambda: self.workload.load(state.code, worker, state.partitions),
            lambda load: self.workload.delay(state.cohort[worker], state.number, load))

    def close(self, state: RoundState) -> RoundWindow:
        """The clock's window of the round (the replies it decodes from, its end); the
        workers it stopped at the deadline recorded on ``state``; the clock moved on; the
        code policy fed and its state saved."""
        timed = {w: self.arrival(state, w, r) for w, r in state.valid.items()}
        # an infinite delay (a device off, e.g. latency=fedscale) never arrives: no reply
        arrivals = {w: t for w, t in timed.items() if math.isfinite(t)}
        window = self.clock.window(arrivals, self.decodable(state.code), len(state.sent))
        for w in timed.keys() - arrivals.keys():  # its bytes never travelled
            state.bytes_up -= int(state.valid[w].extra.get("bytes", 0))
        for w in window.stopped:  # virtual timing: stopped at the deadline, never replied
            state.bytes_up -= int(state.valid[w].extra.get("bytes", 0))
            state.stopped.append(w)
        self.clock.finish_round(
            [state.cohort[w] for w in state.sent],
            {state.cohort[w]: t for w, t in arrivals.items()},
            window.end,
            answered=[state.cohort[w] for w in state.answered],
        )
        self.policy.observe(state, arrivals, window)
        self.policy.save_state()
        return window
