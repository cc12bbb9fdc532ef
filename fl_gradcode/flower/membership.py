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
* **Identity claims** are cross-checked over every node that answered: the federation's
  ``num-partitions`` is the value most nodes claim (re-evaluated as nodes answer; a tie goes
  to the value claimed first), and a claim of another ``num-partitions`` is excluded (a lone
  ``(0, 1)`` claimant among nodes claiming 12 would otherwise make its replicas train
  "partition 0 of 1"). Two nodes claiming one partition: the earliest claimant keeps it (claims
  of one handshake in node-id order) and later claimants are excluded. Neither is provably
  honest, but keeping one loses no data when the clash is a misconfiguration (both would
  compute the same partition), keeps a partition's owner stable across rounds, and gives a
  late impostor no way to knock an honest node out; excluding both would drop a partition's
  data for every clash. A claim outside ``0 <= partition-id < num-partitions`` is excluded
  too. Excluded nodes are named in a WARNING (once per node and reason) and listed per round
  in ``rounds.jsonl`` (``identity_rejected``); nodes whose handshake failed are listed in
  ``unidentified``.
* **The run ends** only when no decodable set can ever form: no node has ever passed the
  handshake, every node the grid lists has been asked and failed, and the last
  :attr:`Membership.PATIENCE` (3) rounds' handshakes all failed. The error names the nodes
  and their reasons. Once one node has been accepted, a cohort of it alone decodes (``n = 1``),
  so membership never ends the run after that.

:func:`code_for_cohort` builds a registry code for a cohort size, falling back (with one
WARNING per cohort size) when the code cannot take that size.
"""

from __future__ import annotations

from collections import Counter
from logging import WARNING
from typing import Any

from flwr.app import RecordDict
from flwr.common.logger import log

from ..codes import GradientCode, available_codes, make_code
from . import compat, protocol
from .protocol import Identity, Instruction, RejectedReply

__all__ = ["Membership", "code_for_cohort"]

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
    """

    #: Seconds a handshake waits for nodes whose earlier handshake failed (at most
    #: ``warmup_timeout``).
    RETRY_TIMEOUT_S = 5.0
    #: Rounds in a row whose handshakes all failed, with no node ever accepted and every
    #: listed node asked, after which the run ends.
    PATIENCE = 3

    def __init__(self, warmup_timeout: float, nonce: str = "handshake") -> None:
        self.warmup_timeout = float(warmup_timeout)
        # carried by the handshake: Flower's ConfigRecord.count_bytes (e.g. in an outer
        # message_size_mod) fails on an empty string
        self.nonce = nonce or "handshake"
        self.claims: dict[int, Identity] = {}  # node -> well-formed claim (kept for good)
        self._order: dict[int, tuple[int, int]] = {}  # node -> (handshake number, node id)
        self.invalid: dict[int, str] = {}  # node -> why its claim is out of range
        self.failed: dict[int, str] = {}  # node -> why its last handshake failed
        self._handshakes = 0
        self._warned: set[tuple[int, str]] = set()
        self._hinted: set[int] = set()  # nodes whose first handshake failure was explained
        self.accepted_ever = False
        self._failed_rounds = 0
        self.round: int | None = None
        self.unidentified: list[int] = []
        self.identity_rejected: list[int] = []

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
        # the node a reply answers: the destination of the message it replies to (an error
        # reply the SuperLink writes for an unreachable node carries the SuperLink's id)
        asked = {m.metadata.message_id: m.metadata.dst_node_id for m in msgs
                 if m.metadata.message_id}
        for reply in replies:
            node = asked.get(reply.metadata.reply_to_message_id, reply.metadata.src_node_id)
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
        for node in sorted(new):
            self._order[node] = (self._handshakes, node)
            self.failed.pop(node, None)
        for node in ask:
            if node not in self.claims and node not in self.invalid:
                self.failed[node] = reasons[node]
            else:
                self.failed.pop(node, None)

    # ------------------------------------------------------------------ cross-checks
    def num_partitions(self) -> int | None:
        """The federation's ``num-partitions``: the value most claims state (a tie: the value
        claimed first); ``None`` before any claim."""
        if not self.claims:
            return None
        votes = Counter(c.num_partitions for c in self.claims.values())
        first: dict[int, tuple[int, int]] = {}
        for node, claim in self.claims.items():
            key = self._order.get(node, (0, node))
            if claim.num_partitions not in first or key < first[claim.num_partitions]:
                first[claim.num_partitions] = key
        return min(votes, key=lambda k: (-votes[k], first[k]))

    def verdicts(self) -> dict[int, str]:
        """Node -> why its identity is excluded, over every node that answered."""
        out = dict(self.invalid)
        k = self.num_partitions()
        if k is None:
            return out
        votes = sum(c.num_partitions == k for c in self.claims.values())
        owner: dict[int, int] = {}
        for node in sorted(self.claims, key=lambda n: self._order.get(n, (0, n))):
            claim = self.claims[node]
            if claim.num_partitions != k:
                out[node] = (f"claims num-partitions={claim.num_partitions}, the federation has "
                             f"{k} ({votes} of {len(self.claims)} nodes claim {k})")
            elif claim.partition_id in owner:
                out[node] = (f"claims partition-id={claim.partition_id} of {k}, already claimed "
                             f"by node {owner[claim.partition_id]}")
            else:
                owner[claim.partition_id] = node
        return out

    def admit(self, grid: Any, nodes: list[int], server_round: int) -> list[int]:
        """The members of this round among the sampled ``nodes``: handshake, cross-check,
        record ``unidentified`` / ``identity_rejected`` for the round; sorted by partition id
        then node id. Raises ``RuntimeError`` when no decodable set can ever form."""
        self._forget_departed(grid, nodes)
        self.handshake(grid, nodes)
        excluded = self.verdicts()
        members = [n for n in nodes if n in self.claims and n not in excluded]
        self.round = server_round
        self.unidentified = sorted(n for n in nodes if n in self.failed)
        self.identity_rejected = sorted(n for n in nodes if n in excluded)
        if self.unidentified:
            first_time = [n for n in self.unidentified if n not in self._hinted]
            self._hinted.update(first_time)
            log(WARNING, "round %d: %d node(s) did not pass the gradient-coding handshake and "
                "get no work this round (asked again when next sampled): %s%s", server_round,
                len(self.unidentified),
                "; ".join(f"node {n}: {self.failed[n]}" for n in self.unidentified[:10]),
                f". {_HINT}" if first_time else "")
        for node in self.identity_rejected:
            if (node, excluded[node]) not in self._warned:
                self._warned.add((node, excluded[node]))
                log(WARNING, "round %d: node %s excluded: its identity %s", server_round, node,
                    excluded[node])
        if members:
            self.accepted_ever = True
            self._failed_rounds = 0
        else:
            self._failed_rounds += 1
            self._give_up(grid, server_round)
        return sorted(members, key=lambda n: (self.claims[n].partition_id, n))

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
            self._order.pop(node, None)
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

    def row_fields(self, server_round: int) -> dict[str, list[int]]:
        """``unidentified`` and ``identity_rejected`` of ``server_round`` for its row."""
        if self.round != server_round:
            return {}
        return {"unidentified": list(self.unidentified),
                "identity_rejected": list(self.identity_rejected)}


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


# ---------------------------------------------------------------------------- codes per size
#: Codes that are exact for every ``(n, s)`` with ``s < n``, used when ``frc`` (which needs
#: ``(s+1) | n``) cannot take a cohort size: same tolerance ``s``, same load ``s + 1``.
EXACT_FALLBACK = "grouped-rs"


def code_for_cohort(
    spec: str | GradientCode, n: int, s: int, seed: int, options: dict[str, Any]
) -> tuple[GradientCode, str | None]:
    """``(code, why)``: the code ``spec`` for a cohort of ``n`` with ``s`` stragglers, or the
    nearest code that takes ``n`` and why it was chosen (``None``: ``spec`` itself).

    In order, the first that builds: ``spec`` with ``s``; for an exact code (``frc``,
    ``crc``) or a ``GradientCode`` built for another size, ``grouped-rs`` with ``s`` (exact for
    every ``n``, the same tolerance and load); ``spec`` with the largest smaller ``s`` it takes;
    ``uncoded`` (``s = 0``). A ``GradientCode`` whose ``n`` is the cohort size is used as is.
    """
    s = min(int(s), n - 1)
    if isinstance(spec, GradientCode):
        if spec.n == n:
            return spec, None
        name = spec.name if spec.name in available_codes() else EXACT_FALLBACK
        why = f"the code was built for n={spec.n} clients but the cohort has {n}"
        return _first_buildable(name, n, min(spec.s, n - 1), seed, {}, why, exact=True)
    if spec not in available_codes():  # a bad name is the user's to fix, for any cohort
        raise ValueError(f"unknown code {spec!r}; expected one of {available_codes()}")
    try:
        return make_code(spec, n=n, s=s, seed=seed, **options), None
    except ValueError as exc:
        if isinstance(exc.__cause__, TypeError):  # an option the code does not take
            raise
        why = f"code={spec!r} with s={s} cannot take a cohort of {n} ({exc})"
        exact = spec in ("frc", "crc")
        return _first_buildable(spec, n, s, seed, options, why, exact=exact, tried_spec=True)


def _first_buildable(
    name: str, n: int, s: int, seed: int, options: dict[str, Any], why: str, *,
    exact: bool, tried_spec: bool = False,
) -> tuple[GradientCode, str]:
    candidates: list[tuple[str, int, dict[str, Any]]] = []
    if not tried_spec:
        candidates.append((name, s, {}))
    if exact:
        candidates.append((EXACT_FALLBACK, s, {}))
    candidates += [(name, smaller, options) for smaller in range(s - 1, -1, -1)]
    candidates.append(("uncoded", 0, {}))
    for cand, cand_s, opts in candidates:
        try:
            code = make_code(cand, n=n, s=cand_s, seed=seed, **opts)
        except ValueError:
            continue
        return code, f"{why}; using {cand} with s={cand_s} for cohorts of {n}"
    raise ValueError(f"{why}; no fallback code takes a cohort of {n}")  # pragma: no cover
