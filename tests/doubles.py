"""Test doubles shared by several test files: user strategies in the shapes the composition
contract names (a pass-through wrapper, in-place state, a median, an overridden ``start``), and
the world of an ``EarlyReturnGrid`` (a fake ``time`` for its module, a scripted inner grid, a
recording round owner).

A double used by one file stays in that file; one used by more lives here (or, for rounds of
``GradientCoding`` on in-process nodes, in ``tests/flower/harness.py``).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from flwr.app import Array, ArrayRecord
from flwr.serverapp.strategy import FedAvg, Strategy


# ================================================================ user strategies
class PassThrough(Strategy):
    """A wrapper in the style of Flower's DP wrappers: composition, no ``start`` override."""

    def __init__(self, inner: Strategy):
        self.inner = inner

    def configure_train(self, *args):
        return self.inner.configure_train(*args)

    def aggregate_train(self, *args):
        return self.inner.aggregate_train(*args)

    def configure_evaluate(self, *args):
        return self.inner.configure_evaluate(*args)

    def aggregate_evaluate(self, *args):
        return self.inner.aggregate_evaluate(*args)

    def summary(self):
        self.inner.summary()


class MomentumInPlace(FedAvg):
    """FedAvg with server momentum whose buffer it updates in place, and a list of the rounds
    it aggregated: state that ``aggregate_train`` changes without rebinding an attribute."""

    def __init__(self, theta: dict[str, np.ndarray], beta: float = 0.5, **kwargs):
        super().__init__(**kwargs)
        self.beta = beta
        self.velocity = {k: np.zeros(v.shape, dtype=np.float64) for k, v in theta.items()}
        self.rounds: list[int] = []

    def aggregate_train(self, server_round, replies):
        arrays, metrics = super().aggregate_train(server_round, list(replies))
        self.rounds.append(server_round)
        for key, buffer in self.velocity.items():
            buffer *= self.beta
            buffer += arrays[key].numpy()
        return arrays, metrics


class MedianFedAvg(FedAvg):
    """An unknown user strategy: a coordinate-wise median of the replies."""

    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        if not replies:
            return None, None
        out = {}
        for name in replies[0].content["arrays"].keys():
            stack = np.stack([r.content["arrays"][name].numpy() for r in replies])
            out[name] = Array(np.median(stack, axis=0))
        return ArrayRecord(out), None


class CheckpointingFedAvg(FedAvg):
    """A user strategy overriding ``start`` (its hooks do not run under GradientCoding)."""

    def start(self, *args, **kwargs):  # e.g. saves checkpoints / results.json
        return super().start(*args, **kwargs)


# ================================================================ EarlyReturnGrid's world
class GridTime:
    """Stands in for the ``time`` module of ``fl_gradcode.flower.grid`` (``install``): a
    monotonic and a wall clock that only ``sleep`` (recorded in ``sleeps``) and ``advance``
    move; ``at(x)`` moves them to ``x`` seconds after ``start``."""

    def __init__(self, start: float = 100.0, wall: float = 50_000.0) -> None:
        self.start = self.mono = start
        self.wall = wall
        self.sleeps: list[float] = []

    @property
    def now(self) -> float:
        return self.mono

    def monotonic(self) -> float:
        return self.mono

    def time(self) -> float:
        return self.wall

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += seconds

    def at(self, seconds_after_start: float) -> None:
        self.advance(self.start + seconds_after_start - self.mono)

    def install(self, monkeypatch) -> GridTime:
        import fl_gradcode.flower.grid as grid_module

        monkeypatch.setattr(grid_module, "time", SimpleNamespace(
            monotonic=self.monotonic, time=self.time, sleep=self.sleep))
        return self


class ScriptedGrid:
    """An inner grid that accepts every message (under ``ids`` in turn if given, else each
    message's own id) and answers on a script: ``schedule`` is a list of ``(time, reply)``, a
    reply pullable once ``clock`` has reached its time (no script: a silent grid, which needs
    no clock). ``pulls`` lists the clock's time at every pull."""

    def __init__(self, clock: GridTime | None = None, schedule=(),
                 ids: list[str] | None = None) -> None:
        self.clock = clock
        self.schedule = list(schedule)
        self.ids = None if ids is None else list(ids)
        self.pulls: list[float] = []

    def push_messages(self, messages):
        if self.ids is not None:
            return [self.ids.pop(0) for _ in messages]
        return [m.metadata.message_id for m in messages]

    def pull_messages(self, ids):
        if self.clock is None:
            self.pulls.append(None)
            return []
        self.pulls.append(self.clock.now)
        out = [reply for t, reply in self.schedule if t <= self.clock.now]
        self.schedule = [(t, reply) for t, reply in self.schedule if t > self.clock.now]
        return out


class RoundOwner:
    """The strategy side of an ``EarlyReturnGrid`` (its round owner), never ready early: its
    deadline is ``deadline`` seconds (the caller's timeout if shorter); it records the
    callers' timeouts, the replies (``seen``), late replies (``late``), unsent messages and
    the sizes of the batches it is asked to order. ``round_timeout`` (if given) bounds how
    long an abandoned message is waited for."""

    def __init__(self, deadline: float = 600.0, *, round_timeout: float | None = None) -> None:
        self.deadline = deadline
        if round_timeout is not None:
            self.round_timeout = round_timeout
        self.timeouts: list[float | None] = []
        self.seen: list = []
        self.late: list = []
        self.unsent: list = []
        self.prioritized: list[int] = []

    def deadline_s(self, timeout):
        self.timeouts.append(timeout)
        return min(self.deadline, timeout) if timeout else self.deadline

    def first_reply_deadline_s(self):
        return None

    def on_reply(self, reply):
        self.seen.append(reply)

    def ready(self):
        return False

    def on_late_reply(self, reply):
        self.late.append(reply)

    def on_unsent(self, messages):
        self.unsent.extend(messages)

    def prioritize(self, replies):
        self.prioritized.append(len(replies))
        return replies
