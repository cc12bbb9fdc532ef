"""Closing a coded round's window: which replies the round decodes from, and when it ended.

:class:`RoundCloser` times each valid reply with the clock's model (compute, load, delay and
transfer in virtual time; every reply the grid returned under wallclock timing), lets the
clock pick the window (the first decodable set, or the deadline: the stopping rule of
gradient coding, Tandon, Lei, Dimakis, Karampatziakis, ICML 2017,
https://arxiv.org/abs/1612.03301), moves the clock on, and feeds the round to the code
policy's latency estimate.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass

from .clock import Clock, RoundWindow, job_start
from .policy import CodePolicy
from .protocol import CodedReply
from .round_state import RoundState
from .verifier import RoundVerifier
from .workload import Workload

__all__ = ["Closing", "RoundCloser"]


@dataclass(frozen=True)
class Closing:
    """How a round's window closed (owner: the closer): the clock's ``window`` (the replies
    it decodes from, its end), the workers it ``stopped`` at the deadline, and the payload
    bytes of the valid replies that never travelled (``untravelled_bytes``: stopped, or an
    infinite delay). ``arrivals``: each valid reply's arrival (seconds from the round's start,
    before any queueing; a reply after the window's end too: in virtual time every job sent is
    computed), by worker; a reply that never arrives (an infinite delay) has none."""

    window: RoundWindow
    stopped: tuple[int, ...] = ()
    untravelled_bytes: int = 0
    arrivals: Mapping[int, float] = dataclasses.field(default_factory=dict)


class RoundCloser:
    """Ends a round's window on the clock (one job: the end of a round's timing).

    ``verifier``: the stopping rule, a test of a set of workers
    (:meth:`~fl_gradcode.flower.verifier.RoundVerifier.stopping_rule`)."""

    def __init__(self, *, clock: Clock, policy: CodePolicy, workload: Workload,
                 verifier: RoundVerifier) -> None:
        self.clock, self.policy, self.workload = clock, policy, workload
        self.verifier = verifier

    def arrival(self, state: RoundState, worker: int, reply: CodedReply) -> float:
        """Seconds from the round's start until ``worker``'s reply arrives (the clock's
        model: compute, load, delay and transfer in virtual time)."""
        partitions = list(state.partitions)
        return self.clock.arrival(
            reply.compute_s, reply.extra.get("bytes", 0),
            lambda: self.workload.load(state.code, worker, partitions),
            lambda load: self.workload.delay(state.cohort[worker], state.number, load,
                                             job_start(self.clock, worker)))

    def failure_notice(self, state: RoundState, worker: int) -> float:
        """Seconds from its job's start until the server hears that ``worker``, whose reply
        never arrives, is off (``inf``: never; the round then waits for its deadline)."""
        load = self.workload.load(state.code, worker, list(state.partitions))
        return self.workload.failure_notice(state.cohort[worker], state.number, load,
                                            job_start(self.clock, worker))

    def close(self, state: RoundState) -> RoundState:
        """The round with its :class:`Closing`: the clock's window (the replies it decodes
        from, its end) and the workers it stopped at the deadline; the clock moved on; the
        code policy fed and its state saved."""
        valid = state.valid
        timed = {w: self.arrival(state, w, r) for w, r in valid.items()}
        # an infinite delay (a device off, e.g. latency=fedscale) never arrives: no reply;
        # the server hears of it when the latency model says (Flower's NODE_UNAVAILABLE)
        arrivals = {w: t for w, t in timed.items() if math.isfinite(t)}
        failures = {w: self.failure_notice(state, w) for w in timed.keys() - arrivals.keys()}
        failures = {w: t for w, t in failures.items() if math.isfinite(t)}
        sent = state.sent
        window = self.clock.window(arrivals, self.verifier.stopping_rule(state, state.code),
                                   len(sent), failures)
        untravelled = sum(int(valid[w].extra.get("bytes", 0))
                          for w in [*(timed.keys() - arrivals.keys()), *window.stopped])
        closing = Closing(window, tuple(window.stopped), untravelled,
                          dict(arrivals) if self.clock.models_arrivals else {})
        self.clock.finish_round(
            [state.cohort[w] for w in sent],
            # a worker heard of is free from then on (its message errored), as if it replied
            {state.cohort[w]: t for w, t in {**arrivals, **failures}.items()},
            window.end,
            answered=[state.cohort[w] for w in state.answered],
        )
        closed = dataclasses.replace(state, closing=closing)
        self.policy.observe(closed, arrivals, window)
        self.policy.save_state()
        return closed
