"""Who takes part in a coded round: the handshake, identity cross-checks, and codes per cohort.

:class:`Membership` asks each sampled node for its data partition (the ``identify`` handshake
answered by :func:`~fl_gradcode.flower.gradient_coding_mod`) and decides which sampled nodes a
round's code is built over. A node that cannot take part is a straggler of that round, never
the end of the run:

* **Handshake failures** (no reply within the timeout, an error reply, a reply without a
  well-formed identity): the node gets no work this round and is asked again whenever it is
  sampled. A node is waited for ``warmup_timeout`` the first time it is asked (start-up);
  after a failure, later handshakes wait at most :attr:`Membership.RETRY_TIMEOUT_S` (5 s,
  never more than ``warmup_timeout``) for it, so a dead node costs a bounded few seconds in
  the rounds it is sampled in, not ``warmup_timeout`` each time.
* **Rounds are about partitions.** The round's workers are one per partition of the round
  (every partition ``0..num-partitions-1`` when the round samples every connected node, else
  the sampled nodes' partitions). A partition whose holder is unidentified, dead, contested
  or excluded gets a placeholder worker (:func:`placeholder`) that is sent nothing: a
  straggler from the start, so the partition is computed by its other replicas and the round
  decodes exactly when the code tolerates the placeholders, never by shrinking the objective.
  In a sampled round, a sampled node without a usable claim stands for its roster partition,
  or for a partition nobody claims (drawn from the seed).
* **Identity claims** are cross-checked over every node that answered. The federation's
  ``num-partitions`` is the server's (``num_partitions``), else the roster's, else the value
  most claims state; a tied vote accepts no claim. A claim of another ``num-partitions`` is
  excluded (a lone ``(0, 1)`` claimant among nodes claiming 12 would otherwise make its
  replicas train "partition 0 of 1"). Two nodes claiming one partition: neither is used (no
  first-come or lowest-id rule an impostor could win); the partition's other replicas compute
  it. With a roster (:mod:`~fl_gradcode.flower.roster`), a claim the roster does not state is
  excluded. A claim outside ``0 <= partition-id < num-partitions`` is excluded too. Excluded
  nodes are named in a WARNING (once per node and reason) and listed per round in
  ``rounds.jsonl`` (``identity_rejected``); nodes whose handshake failed are listed in
  ``unidentified``.
* **The run ends** only when no decodable set can ever form: no node has ever passed the
  handshake, every node the grid lists has been asked and failed, and the last
  :attr:`Membership.PATIENCE` (3) rounds' handshakes all failed. The error names the nodes
  and their reasons. Once one node has been accepted, membership never ends the run.

:func:`code_for_cohort` (from :mod:`fl_gradcode.codes.cohort`) builds a registry code for a
cohort size, falling back (with one WARNING per cohort size) when the code cannot take that
size.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from logging import WARNING
from typing import Any

import numpy as np
from flwr.app import RecordDict
from flwr.common.logger import log

from ..codes import GradientCode
from ..codes.cohort import code_for_cohort
from . import compat, protocol
from .protocol import Identity, Instruction, RejectedReply
from .roster import Roster
from .senders import answering_node

__all__ = ["Membership", "code_for_cohort", "federation_size", "judge_claims",
           "placeholder"]

_HINT = (
    "Does every ClientApp run gradient_coding_mod as its FIRST mod "
    "(ClientApp(mods=[gradient_coding_mod, ...]): a mod listed before it sees the protocol's "
    "messages) and have 'partition-id' and 'num-partitions' in its node config?"
)


class Membership:
    """The handshake and identity cross-checks of a :class:`GradientCoding` run.

    Parameters
    ----------
    warmup_timeout : float
        Seconds to wait for a node's first handshake reply.
    seed : int
        The run's seed (``GradientCoding``'s ``seed``; no default here: the caller passes the
        option's value): the draw of the partitions nobody claims.
    """

    #: Seconds a handshake waits for nodes whose earlier handshake failed (at most
    #: ``warmup_timeout``).
    RETRY_TIMEOUT_S = 5.0
    #: Rounds in a row whose handshakes all failed, with no node ever accepted and every
    #: listed node asked, after which the run ends.
    PATIENCE = 3

    def __init__(self, warmup_timeout: float, nonce: str = "handshake", *,
                 num_partitions: int | None = None, roster: Roster | None = None,
                 seed: int) -> None:
        self.warmup_timeout = float(warmup_timeout)
        # carried by the handshake: Flower's ConfigRecord.count_bytes (e.g. in an outer
        # message_size_mod) fails on an empty string
        self.nonce = nonce or "handshake"
        if num_partitions is not None and (isinstance(num_partitions, bool) or
                                           not isinstance(num_partitions, int) or
                                           num_partitions < 1):
            raise ValueError(f"num_partitions={num_partitions!r} must be an integer >= 1 (the "
                             "federation's number of data partitions) or None (from the "
                             "roster, else the nodes' claims)")
        if roster is not None and num_partitions is not None and \
                roster.num_partitions != num_partitions:
            raise ValueError(f"num_partitions={num_partitions} but the roster has "
                             f"{roster.num_partitions} partitions; give one of them")
        self.configured = num_partitions
        self.roster = roster
        self.seed = int(seed)
        self.claims: dict[int, Identity] = {}  # node -> well-formed claim (while connected)
        self.invalid: dict[int, str] = {}  # node -> why its claim is out of range
        self.failed: dict[int, str] = {}  # node -> why its last handshake failed
        self.placeholders: dict[int, Identity] = {}  # this round's placeholder workers
        #: node -> the partition it works on: claims and this round's placeholders
        self.roles: Mapping[int, Identity] = _Roles(self.claims, self.placeholders)
        self._handshakes = 0
        self._warned: set[tuple[int, str]] = set()
        self._hinted: set[int] = set()  # nodes whose first handshake failure was explained
        self._tie_warned = ""
        self._last_missing: list[int] = []
        self.accepted_ever = False
        self._failed_rounds = 0
        self.round: int | None = None
        self.unidentified: list[int] = []
        self.identity_rejected: list[int] = []
        self.idle_partitions: list[int] = []  # the partitions of an idle round

    # ------------------------------------------------------------------ the handshake
    def timeout_for(self, nodes: list[int]) -> float:
        """``warmup_timeout`` if a node is asked for the first time, else the retry timeout."""
        if any(node not in self.failed for node in nodes):
            return self.warmup_timeout
        return min(self.warmup_timeout, self.RETRY_TIMEOUT_S)

    def handshake(self, grid: Any, nodes: list[int]) -> None:
        """Ask the nodes among ``nodes`` with no claim yet for their identity (one request
        each); record claims, out-of-range claims and failures."""
        ask = [n for n in nodes if n not in self.claims and n not in self.invalid]
        if not ask:
            return
        self._handshakes += 1
        msgs = [
            protocol.instruction_message(
                RecordDict(), Instruction(op=protocol.OP_IDENTIFY, nonce=self.nonce), node,
                "identify",
            )
            for node in ask
        ]
        reasons = {node: f"no reply within {self.timeout_for(ask):g} s" for node in ask}
        new: list[int] = []
        try:
            replies = list(grid.send_and_receive(msgs, timeout=self.timeout_for(ask)))
        except Exception as exc:  # a grid failure is a failed handshake, not the end of the run
            replies = []
            reasons = {node: f"handshake not delivered ({type(exc).__name__}: {exc})"
                       for node in ask}
        # the node a reply answers for: its sender (an error reply the SuperLink writes for
        # an unreachable node: the destination of the message it answers); a sender that
        # answers another node's message does not speak for that node
        for reply in replies:
            node = answering_node(reply, msgs)
            if node not in reasons or node in self.claims or node in self.invalid:
                continue  # not asked, or answered twice: the first answer stands
            try:
                self.claims[node] = protocol.parse_identity(reply)
                new.append(node)
            except RejectedReply as why:
                claim = _raw_claim(reply)
                if claim is not None:  # well-formed numbers, out of range: a claim, rejected
                    self.invalid[node] = (f"partition-id={claim[0]} is not in 0..{claim[1] - 1} "
                                          f"(num-partitions={claim[1]})")
                else:  # an error reply names its cause (a mod-order problem, ...)
                    reasons[node] = _short(compat.explain_error_reply(reply)
                                           if reply.has_error() else str(why), 900)
        for node in new:
            self.failed.pop(node, None)
        for node in ask:
            if node not in self.claims and node not in self.invalid:
                self.failed[node] = reasons[node]
            else:
                self.failed.pop(node, None)

    # ------------------------------------------------------------------ cross-checks
    def federation_size(self) -> tuple[int | None, str]:
        """``(num-partitions, where it comes from)``: :func:`federation_size` of the claims,
        with the server's ``num_partitions`` and the roster."""
        return federation_size(self.claims, self.configured, self.roster)

    def num_partitions(self) -> int | None:
        """The federation's ``num-partitions`` (:meth:`federation_size`)."""
        return self.federation_size()[0]

    def _judge(self) -> tuple[dict[int, str], set[int]]:
        """``(node -> why its identity is not used, partitions with conflicting claims)``
        (:func:`judge_claims`; claims out of range were refused at the handshake)."""
        return judge_claims(self.claims, self.configured, self.roster, self.invalid)

    def verdicts(self) -> dict[int, str]:
        """Node -> why its identity is excluded, over every node that answered."""
        return self._judge()[0]

    def admit(self, grid: Any, nodes: list[int], server_round: int) -> list[int]:
        """The round's workers, one per partition of the round (sorted by partition id): the
        partition's holder among the sampled ``nodes``, or a placeholder (a negative id,
        :func:`placeholder`, sent nothing: a straggler from the start) when its holder is
        unidentified, contested or not sampled in a round over the whole federation. Records
        ``unidentified`` / ``identity_rejected`` for the round; ``[]`` when no sampled node can
        work. Raises ``RuntimeError`` when no decodable set can ever form."""
        self._forget_departed(grid, nodes)
        self.handshake(grid, nodes)
        excluded, contested = self._judge()
        k, source = self.federation_size()
        self.round = server_round
        self.unidentified = sorted(n for n in nodes if n in self.failed)
        self.identity_rejected = sorted(n for n in nodes if n in excluded)
        self._warn(server_round, excluded, k, source)
        owner = {self.claims[n].partition_id: n for n in self.claims if n not in excluded}
        parts = self._round_partitions(grid, nodes, k, owner, contested, excluded,
                                       server_round)
        slots = [owner[p] if owner.get(p) in nodes else placeholder(p) for p in parts]
        self.placeholders.clear()
        self.placeholders.update({placeholder(p): Identity(p, k) for p in parts
                                  if placeholder(p) in slots and k is not None})
        members = [n for n in slots if n >= 0]
        self.idle_partitions: list[int] = []
        missing = sorted(self.placeholders[n].partition_id for n in slots if n < 0)
        if members and missing and missing != self._last_missing:
            log(WARNING, "round %d: partition(s) %s of %s have no usable holder this round "
                "(dead, unidentified or contested): their other replicas compute them",
                server_round, missing, k)
        self._last_missing = missing if members else self._last_missing
        if members:
            self.accepted_ever = True
            self._failed_rounds = 0
            return slots
        self.idle_partitions = parts
        self._failed_rounds += 1
        self._give_up(grid, server_round)
        return []

    def _round_partitions(self, grid: Any, nodes: list[int], k: int | None,
                          owner: dict[int, int], contested: set[int], excluded: dict[int, str],
                          server_round: int) -> list[int]:
        """The partitions of the round: every partition when the round samples every
        connected node, else those of the sampled nodes (a sampled node without a usable claim
        stands for its roster partition, or for a partition nobody claims, drawn from the
        seed)."""
        if k is None:
            return []
        try:
            listed = set(grid.get_node_ids())
        except Exception:  # the grid cannot say: the round is a sample
            listed = set()
        if listed and listed <= set(nodes):
            return list(range(k))
        parts: set[int] = set()
        stand_ins = []
        for node in sorted(nodes):
            claim = self.claims.get(node)
            if claim is not None and node not in excluded:
                parts.add(claim.partition_id)
            elif claim is not None and claim.num_partitions == k and \
                    claim.partition_id in contested and claim.partition_id not in parts:
                parts.add(claim.partition_id)  # one claimant of it: the others stand in
            elif self.roster is not None:
                pid = self.roster.partition_of(node)
                if pid is not None and pid < k:
                    parts.add(pid)
            elif node in self.failed or node in excluded:
                stand_ins.append(node)
        pool = [p for p in range(k) if p not in owner and p not in contested and p not in parts]
        if stand_ins and pool:
            rng = np.random.default_rng([self.seed, server_round])
            take = min(len(stand_ins), len(pool))
            parts.update(int(p) for p in rng.choice(pool, size=take, replace=False))
        return sorted(parts)

    def _warn(self, server_round: int, excluded: dict[int, str], k: int | None,
              source: str) -> None:
        if self.unidentified:
            first_time = [n for n in self.unidentified if n not in self._hinted]
            self._hinted.update(first_time)
            log(WARNING, "round %d: %d node(s) did not pass the gradient-coding handshake and "
                "get no work this round (asked again when next sampled): %s%s", server_round,
                len(self.unidentified),
                "; ".join(f"node {n}: {self.failed[n]}" for n in self.unidentified[:10]),
                f". {_HINT}" if first_time else "")
        if k is None and self.claims and self._tie_warned != source:
            self._tie_warned = source
            log(WARNING, "round %d: %s: no identity claim is accepted this round (set the "
                "federation's num-partitions on the server, or give a roster)", server_round,
                source)
        for node in self.identity_rejected:
            if (node, excluded[node]) not in self._warned:
                self._warned.add((node, excluded[node]))
                log(WARNING, "round %d: node %s excluded: its identity %s", server_round, node,
                    excluded[node])

    def claim_key(self, node: int) -> tuple[Any, ...]:
        """What the quarantine follows: the node's claimed partition when it has a claim (a
        node re-registering under a new id keeps its partition's record), else its id."""
        claim = self.claims.get(node)
        if claim is None:
            return ("node", node)
        return ("partition", claim.partition_id, claim.num_partitions)

    def _forget_departed(self, grid: Any, nodes: list[int]) -> None:
        """Nodes that left the federation (no longer listed by the grid) give up their claims:
        a SuperNode restarted under a new node id then takes its partition back instead of
        clashing with its own former self."""
        try:
            listed = set(grid.get_node_ids()) | set(nodes)
        except Exception:  # the grid cannot say who is connected: keep every claim
            return
        for node in [n for n in self.claims if n not in listed]:
            log(WARNING, "node %s (partition-id=%d) left the federation: its claim is released",
                node, self.claims[node].partition_id)
            del self.claims[node]
        for book in (self.invalid, self.failed):
            for node in [n for n in book if n not in listed]:
                del book[node]

    def _give_up(self, grid: Any, server_round: int) -> None:
        """End the run when no decodable set can ever form (see the module docstring)."""
        if self.accepted_ever or self._failed_rounds < self.PATIENCE:
            return
        try:
            listed = set(grid.get_node_ids())
        except Exception:  # the grid cannot say: nodes never asked may exist
            return
        if not listed or listed - set(self.failed) - set(self.invalid):
            return  # some listed node was never asked (or answered): it may yet pass
        details = "; ".join(f"node {n}: {why}"
                            for n, why in sorted({**self.failed, **self.invalid}.items())[:5])
        raise RuntimeError(
            f"no node passed the gradient-coding handshake in {self._failed_rounds} rounds in a "
            f"row (up to round {server_round}) and every one of the {len(listed)} connected "
            f"nodes has failed it, so no decodable set can form ({details}). {_HINT}"
        )

    def row_fields(self, server_round: int) -> dict[str, Any]:
        """``unidentified`` and ``identity_rejected`` of ``server_round`` for its row (and,
        for a round no sampled node could work in, its partitions as missing)."""
        if self.round != server_round:
            return {}
        fields: dict[str, Any] = {"unidentified": list(self.unidentified),
                                  "identity_rejected": list(self.identity_rejected)}
        if self.idle_partitions:
            fields.update(missing_partitions=list(self.idle_partitions), missing_weight=1.0)
        return fields


def federation_size(claims: Mapping[int, Identity], configured: int | None = None,
                    roster: Roster | None = None) -> tuple[int | None, str]:
    """``(num-partitions, where it comes from)``: ``configured`` (the server's), else the
    roster's, else the value most ``claims`` state; ``None`` before any claim or when the vote
    is tied (Sybils that tie it do not win it)."""
    if configured is not None:
        return configured, "configured on the server"
    if roster is not None:
        return roster.num_partitions, "from the roster"
    if not claims:
        return None, "no claim yet"
    votes = Counter(c.num_partitions for c in claims.values())
    ranked = votes.most_common()
    if len(ranked) > 1 and ranked[0][1] == ranked[1][1]:
        tied = sorted(k for k, v in ranked if v == ranked[0][1])
        return None, (f"the num-partitions claims are tied ({ranked[0][1]} nodes each for "
                      f"{', '.join(map(str, tied))})")
    return ranked[0][0], f"{ranked[0][1]} of {len(claims)} nodes claim {ranked[0][0]}"


def judge_claims(claims: Mapping[int, Identity], configured: int | None = None,
                 roster: Roster | None = None, invalid: Mapping[int, str] | None = None
                 ) -> tuple[dict[int, str], set[int]]:
    """``(node -> why its identity claim is not used, partitions with conflicting claims)``:
    ``invalid``'s nodes as they are; with a roster, a claim it does not state; a claim of
    another ``num-partitions`` than :func:`federation_size`'s (every claim while the vote is
    tied); both claimants of one partition (no first-come or lowest-id rule an impostor could
    win)."""
    out = dict(invalid or {})
    k, source = federation_size(claims, configured, roster)
    claimants: dict[int, list[int]] = {}
    for node in sorted(claims):
        claim = claims[node]
        if roster is not None:
            pid = roster.partition_of(node)
            if pid is None:
                out[node] = (f"claims partition-id={claim.partition_id} of "
                             f"{claim.num_partitions} and is not in the roster")
                continue
            if (claim.partition_id, claim.num_partitions) != (pid, roster.num_partitions):
                out[node] = (f"claims partition-id={claim.partition_id} of "
                             f"{claim.num_partitions}, the roster gives it partition {pid} "
                             f"of {roster.num_partitions}")
                continue
        if k is None:
            out[node] = (f"claims num-partitions={claim.num_partitions}; {source}: no claim "
                         "is accepted while the vote is tied")
        elif claim.num_partitions != k:
            out[node] = (f"claims num-partitions={claim.num_partitions}, the federation has "
                         f"{k} ({source})")
        else:
            claimants.setdefault(claim.partition_id, []).append(node)
    contested = set()
    for pid, nodes in claimants.items():
        if len(nodes) > 1:
            contested.add(pid)
            for node in nodes:
                others = ", ".join(str(n) for n in nodes if n != node)
                out[node] = (f"claims partition-id={pid} of {k}, as does node {others}: "
                             "conflicting claims, neither is used (the partition's other "
                             "replicas compute it)")
    return out, contested


def placeholder(partition_id: int) -> int:
    """The worker id standing for partition ``partition_id`` when no node can work on it this
    round (negative: never a Flower node id; sent nothing)."""
    return -1 - int(partition_id)


class _Roles(Mapping[int, Identity]):
    """Node -> partition: the claims, then the round's placeholders (read live)."""

    def __init__(self, claims: Mapping[int, Identity],
                 placeholders: Mapping[int, Identity]) -> None:
        self._claims, self._placeholders = claims, placeholders

    def __getitem__(self, node: int) -> Identity:
        if node in self._placeholders:
            return self._placeholders[node]
        return self._claims[node]

    def __iter__(self) -> Iterator[int]:
        yield from self._claims
        yield from (n for n in self._placeholders if n not in self._claims)

    def __len__(self) -> int:
        return len(self._claims) + sum(n not in self._claims for n in self._placeholders)


def _short(text: str, limit: int = 300) -> str:
    """A client-supplied reason as one line of at most ``limit`` characters (for the log)."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _raw_claim(reply: Any) -> tuple[int, int] | None:
    """``(partition-id, num-partitions)`` of an identify reply holding two integers that
    :func:`~fl_gradcode.flower.protocol.parse_identity` refused (out of range), else ``None``."""
    try:
        rec = reply.content.metric_records[protocol.PROTOCOL_KEY]
        pid, num = rec["partition-id"], rec["num-partitions"]
    except Exception:
        return None
    if isinstance(pid, bool) or isinstance(num, bool):
        return None
    if isinstance(pid, int) and isinstance(num, int):
        return int(pid), int(num)
    return None


def covered_partitions(code: GradientCode, used: list[int], decode: str) -> set[int]:
    """The code's partitions (indices) a round's update covered: every one of an exact
    round, none of a skipped one, else those a used reply computed and the applied decoding
    weighs (``alpha`` not 0: a ``comm-efficient`` group with fewer than ``m`` replies is
    left out of the decoding although its replies computed its partitions)."""
    if decode == "exact":
        return set(range(code.k))
    if decode == "skipped" or not used:
        return set()
    alpha = code.decoding(used).alpha
    return {int(j) for w in used for j in code.assignment(w) if abs(float(alpha[j])) > 1e-12}


def missing_fields(code: GradientCode, partitions: list[Identity], used: list[int],
                   decode: str, sizes: Mapping[tuple[int, int], float]) -> dict[str, Any]:
    """A coded round's ``missing_partitions`` (data partition ids no used reply computed;
    every partition of a skipped round, none of an exact one) and ``missing_weight`` (their
    share of the round's examples when every size is known, else of its partitions)."""
    if decode == "exact":
        return {"missing_partitions": [], "missing_weight": 0.0}
    covered = covered_partitions(code, used, decode)
    gone = [j for j in range(len(partitions)) if j not in covered]
    known = [sizes.get((p.partition_id, p.num_partitions)) for p in partitions]
    if known and all(x is not None for x in known) and sum(known) > 0:  # type: ignore[arg-type]
        weight = sum(known[j] for j in gone) / sum(known)  # type: ignore[misc]
    else:
        weight = len(gone) / max(len(partitions), 1)
    return {"missing_partitions": sorted(partitions[j].partition_id for j in gone),
            "missing_weight": float(weight)}
