"""Quarantine of repeat offenders: nodes the redundancy keeps contradicting get no work.

An *offence* is a round in which a node's reply was excluded as inconsistent with the other
replicas, or was part of a contradiction no single exclusion explains (with ``s = 1`` an
honest replica and a wrong one cannot be told apart: both are involved). ``offences``
offences within ``window`` rounds put the node in quarantine for ``rounds`` rounds, twice as
long at each further quarantine of the same node. A quarantined node stays in the round's
cohort (worker indices keep their meaning) but is sent no work: it is a straggler. A group
whose replicas keep contradicting each other then no longer blocks decoding: the round
decodes exactly when the code tolerates the missing replies, otherwise approximately from
the other groups (``decode="approx"``, within ``max_decode_error``), or is skipped.
"""

from __future__ import annotations

from collections.abc import Iterable
from logging import WARNING

from flwr.common.logger import log

__all__ = ["Quarantine"]


class Quarantine:
    """Offences and quarantines per node id."""

    def __init__(self, offences: int = 2, window: int = 10, rounds: int = 5) -> None:
        for name, value in (("offences", offences), ("window", window), ("rounds", rounds)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"quarantine {name}={value!r} must be an integer >= 1")
        self.offences = offences
        self.window = window
        self.rounds = rounds
        self._offences: dict[int, list[int]] = {}  # node -> rounds of its recent offences
        self._until: dict[int, int] = {}  # node -> last round of its quarantine
        self._times: dict[int, int] = {}  # node -> quarantines so far

    def held(self, server_round: int, nodes: Iterable[int]) -> set[int]:
        """The ``nodes`` in quarantine in ``server_round``."""
        return {n for n in nodes if self._until.get(n, 0) >= server_round}

    def offend(self, server_round: int, nodes: Iterable[int], why: str) -> list[int]:
        """Record one offence of each node in ``server_round``; the nodes it puts in
        quarantine (from the next round), logged with their ids."""
        started = []
        for node in sorted(set(nodes)):
            recent = [r for r in self._offences.get(node, []) if r > server_round - self.window]
            recent.append(server_round)
            self._offences[node] = recent
            if len(recent) < self.offences:
                continue
            times = self._times.get(node, 0)
            length = self.rounds * 2**times
            self._times[node] = times + 1
            self._until[node] = server_round + length
            self._offences[node] = []
            started.append(node)
            log(WARNING, "round %d: node %s quarantined for rounds %d-%d (%d offences in %d "
                "rounds: %s); it is sent no work", server_round, node, server_round + 1,
                server_round + length, len(recent), self.window, why)
        return started
