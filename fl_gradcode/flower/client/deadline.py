"""Where a worker's job stops at its round's deadline, and wallclock timing's latency.

An instruction with ``stop-after-s > 0`` (the server's ``stop_late_work``) is abandoned once
that many seconds have passed since the message was created: before each partition, after the
last one and before the simulated latency (a partition already running is never cut short).
The worker's wall clock is compared with the message's creation time, as Flower's message TTL
does.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from flwr.app import Message

from ..protocol import Instruction

__all__ = ["Stopped", "WorkDeadline"]


class Stopped(Exception):
    """The round's deadline passed: the server can no longer use this worker's reply."""


class WorkDeadline:
    """The deadline of one job (``None``: the instruction never stops); ``now``: the wall
    clock compared with the message's creation time."""

    def __init__(self, msg: Message, instruction: Instruction,
                 now: Callable[[], float] = time.time) -> None:
        self.instruction = instruction
        self.now = now
        self.at: float | None = None
        if instruction.stop_after_s > 0:
            self.at = float(msg.metadata.created_at) + instruction.stop_after_s

    def _passed(self) -> bool:
        return self.at is not None and self.now() >= self.at

    def before_partition(self, index: int, total: int) -> None:
        """Raise :class:`Stopped` if the deadline has passed before partition ``index``."""
        if self._passed():
            raise Stopped(f"stopped after {index} of {total} partitions: the round's deadline "
                          f"(stop-after-s={self.instruction.stop_after_s:g} s after the "
                          "message was created) has passed")

    def before_reply(self, total: int) -> None:
        """Raise :class:`Stopped` if the last partition ended after the deadline."""
        if self._passed():
            raise Stopped(f"stopped after {total} of {total} partitions, before replying: the "
                          f"round's deadline (stop-after-s={self.instruction.stop_after_s:g} s) "
                          "passed during the last one")

    def simulated_latency(self, total: int) -> None:
        """Wallclock timing: sleep the instructed ``delay-s`` before replying; if it outlasts
        the deadline, sleep until the deadline and raise :class:`Stopped`. (Virtual timing
        adds its delays on the server: nothing to sleep.)"""
        instruction = self.instruction
        if instruction.timing != "wallclock" or instruction.delay_s <= 0:
            return
        if self.at is not None and self.now() + instruction.delay_s > self.at:
            time.sleep(max(self.at - self.now(), 0.0))  # the simulated latency outlasts it
            raise Stopped(f"stopped after {total} of {total} partitions, before replying: the "
                          f"round's deadline (stop-after-s={instruction.stop_after_s:g} s) "
                          "passed during the simulated latency")
        time.sleep(instruction.delay_s)
