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

With ``key_of`` (the server's: a node's claimed data partition), offences and quarantines follow
what ``key_of`` names rather than the node id: a node that re-registers under a new node id and
claims the same partition is still held, and its record is not cleared.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from logging import WARNING

from flwr.common.logger import log

__all__ = ["Quarantine"]


class Quarantine:
    """Offences and quarantines per node id (or per ``key_of(node)``)."""

    def __init__(self, offences: int = 2, window: int = 10, rounds: int = 5, *,
                 key_of: Callable[[int], Hashable] | None = None) -> None:
        for name, value in (("offences", offences), ("window", window), ("rounds", rounds)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"quarantine {name}={value!r} must be an integer >= 1")
        self.offences = offences
        self.window = window
        self.rounds = rounds
        self.key_of = key_of
        self._offences: dict[Hashable, list[int]] = {}  # key -> rounds of its recent offences
        self._until: dict[Hashable, int] = {}  # key -> last round of its quarantine
        self._times: dict[Hashable, int] = {}  # key -> quarantines so far

    def _key(self, node: int) -> Hashable:
        return node if self.key_of is None else self.key_of(node)

    def held(self, server_round: int, nodes: Iterable[int]) -> set[int]:
        """The ``nodes`` in quarantine in ``server_round``."""
        return {n for n in nodes if self._until.get(self._key(n), 0) >= server_round}

    def offend(self, server_round: int, nodes: Iterable[int], why: str) -> list[int]:
        """Record one offence of each node in ``server_round`` (at most one per node and
        round: a duplicated reply is not a second offence); the nodes it puts in
        quarantine (from the next round), logged with their ids."""
        started = []
        seen: set[Hashable] = set()
        for node in sorted(set(nodes)):
            key = self._key(node)
            if key in seen:  # two nodes of one key: one offence
                continue
            seen.add(key)
            recent = [r for r in self._offences.get(key, []) if r > server_round - self.window]
            if recent and recent[-1] == server_round:  # one offence per round (a duplicate)
                continue
            recent.append(server_round)
            self._offences[key] = recent
            if len(recent) < self.offences:
                continue
            times = self._times.get(key, 0)
            length = self.rounds * 2**times
            self._times[key] = times + 1
            self._until[key] = server_round + length
            self._offences[key] = []
            started.append(node)
            log(WARNING, "round %d: node %s%s quarantined for rounds %d-%d (%d offences in %d "
                "rounds: %s); it is sent no work", server_round, node,
                "" if key == node else f" ({_name(key)})", server_round + 1,
                server_round + length, len(recent), self.window, why)
        return started


def _name(key: Hashable) -> str:
    """A quarantine key in the log: ``partition 3/6`` for a claimed partition."""
    if isinstance(key, tuple) and len(key) == 3 and key[0] == "partition":
        return f"partition {key[1]}/{key[2]}"
    return str(key)
