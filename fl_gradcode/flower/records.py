"""What a round's records and logs say about its clients, readably.

* **Names.** ``rounds.jsonl`` lists clients by their position in the round's cohort
  (``clients_used``, ``stragglers``, ...), which changes from round to round when the inner
  strategy samples (``fraction_train < 1``). :func:`client_names` gives the same lists as data
  partition ids (from each node's handshake identity) and as node ids: the row's ``partitions``
  and ``nodes``.
* **Metrics.** :data:`METRIC_PREFIX`: the wrapper's statistics in Flower's ``Result`` live under
  ``gc/`` (``gc/exact``, ``gc/decoded``, ...), beside the app's own metrics, which are left as
  the inner strategy aggregated them.
* **Rejections.** A client's error reply carries ``"Type: message"`` and, after
  :data:`TRACEBACK_MARKER`, the app's traceback (:func:`error_reason`, capped at
  :data:`MAX_TRACEBACK_CHARS`). The server logs one line per rejected reply
  (:func:`split_reason`'s summary) and appends the full text to ``debug.log`` in the results
  directory (:func:`debug_entry`).
* **Rows.** :class:`RoundLog` writes one row per round (:data:`ROW_DEFAULTS`: every key, with
  the value of a round that decoded nothing), after ``evaluate_fn`` adds accuracy and loss, to
  ``rounds.jsonl`` and the run's history, logs the round's line and gives Flower its metrics.
* **Flower's lines.** The inner strategy's ``aggregate_train`` sees ONE reply (the decoded
  average) and would log "Received 1 results and 0 failures" every round, which reads as if one
  client answered: :func:`quiet_inner_aggregation` drops that line for the inner call only.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import traceback
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from logging import INFO, WARNING
from typing import TYPE_CHECKING, Any

from flwr.app import MetricRecord

from .reasons import strip_ansi, unwrap

if TYPE_CHECKING:  # the round state imports this module
    from .integrity import Verdict
    from .round_state import Rejection, RoundState

__all__ = [
    "CLIENT_GROUPS",
    "MAX_TRACEBACK_CHARS",
    "METRIC_PREFIX",
    "ROW_DEFAULTS",
    "TRACEBACK_MARKER",
    "RoundLog",
    "client_names",
    "debug_entry",
    "empty_names",
    "error_reason",
    "quiet_inner_aggregation",
    "report_rejections",
    "split_reason",
]

#: Prefix of the wrapper's statistics in Flower's ``Result.train_metrics_clientapp``.
METRIC_PREFIX = "gc/"

#: The groups of clients ``partitions`` and ``nodes`` name in every ``rounds.jsonl`` row.
CLIENT_GROUPS = ("used", "stragglers", "busy", "rejected", "excluded", "inconsistent", "stopped")

#: Separates an error reply's one-line reason from the traceback that follows it.
TRACEBACK_MARKER = "\n--- traceback ---\n"

#: Longest traceback (characters) an error reply carries: its end is kept (the raising frame).
MAX_TRACEBACK_CHARS = 20_000

_LOG = logging.getLogger("flwr")

# control characters other than newline and tab (terminal escapes in a client's text)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\u2028\u2029]")


def error_reason(exc: BaseException, limit: int = MAX_TRACEBACK_CHARS) -> str:
    """The reason of an error reply for ``exc`` (call inside its ``except`` block):
    ``"Type: message"``, then :data:`TRACEBACK_MARKER` and the traceback's last ``limit``
    characters."""
    head = f"{type(exc).__name__}: {exc}"
    text = traceback.format_exc()
    if not text or text.startswith("NoneType: None"):
        return head
    if len(text) > limit:
        text = f"[{len(text) - limit} characters cut]\n" + text[-limit:]
    return head + TRACEBACK_MARKER + text


def split_reason(text: Any) -> tuple[str, str | None]:
    """``(summary, traceback or None)`` of a rejection reason: the part before
    :data:`TRACEBACK_MARKER`; for a reason holding a Python traceback in another form (e.g. a
    Ray task error's text), its first line and the exception line it ends with; terminal
    escapes stripped, a Flower/Ray error repr as its ``Type: message`` (the full text, escapes
    stripped, is the traceback part)."""
    text = strip_ansi(str(text))
    line = unwrap(text)
    if line != text:
        return line, text
    if TRACEBACK_MARKER in text:
        head, tail = text.split(TRACEBACK_MARKER, 1)
        # a wrapping "error reply (code 5400: <reason>)": its closing parenthesis ends the tail
        tail = tail.rstrip()
        unclosed = head.count("(") - head.count(")")
        closing = len(tail) - len(tail.rstrip(")"))
        moved = min(max(unclosed, 0), closing)
        if moved:
            head, tail = head + ")" * moved, tail[:-moved]
        return head, tail
    if "Traceback (most recent call last)" not in text:
        return text, None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first = lines[0]
    last = lines[-1]
    if text.lstrip().startswith("<") and last.endswith(("'>", '">')):
        last = last[:-2]  # the closing quote and bracket of a Ray error's repr
    if first.startswith("Traceback"):
        return last, text
    return f"{first} ... {last}", text


def debug_entry(server_round: int, node: int | None, partition: Any, worker: int | None,
                reason: str, detail: str | None) -> str:
    """One ``debug.log`` entry: a header naming the round, node, partition and worker, the
    reason and the traceback (control characters other than newlines and tabs escaped)."""
    body = reason if detail is None else f"{reason}\n{detail}"
    body = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 256
                        else f"\\u{ord(m.group()):04x}", body)
    return (f"=== round {server_round}: rejected reply from node {node} (partition "
            f"{'?' if partition is None else partition}, worker "
            f"{'?' if worker is None else worker}) ===\n{body.rstrip()}\n\n")


def report_rejections(
    server_round: int,
    rejected: Sequence[tuple[int, str]],
    details: Sequence[tuple[int | None, str, str | None]],
    identities: Mapping[int, Any],
    recorder: Any,
) -> None:
    """One WARNING line per rejected reply of the round (round, partition, node, worker and
    the one-line reason); with a ``recorder``, the reason and the reply's traceback appended
    to its ``debug.log`` (without one, a traceback is logged at DEBUG level).
    ``rejected``: ``(node, reason)``; ``details``: ``(worker, reason, traceback or None)`` of
    the same replies."""
    for (node, _), (worker, reason, detail) in zip(rejected, details, strict=True):
        identity = identities.get(node)
        partition = (None if identity is None
                     else f"{identity.partition_id}/{identity.num_partitions}")
        _LOG.log(WARNING, "round %d: rejected reply from partition %s (node %s, worker %s): %s",
                 server_round, "?" if partition is None else partition, node,
                 "?" if worker is None else worker, reason)
        entry = debug_entry(server_round, node, partition, worker, reason, detail)
        if recorder is not None:
            recorder.debug(entry)
        elif detail is not None:  # no results directory: the traceback at DEBUG level
            _LOG.debug("%s", entry.rstrip())


def client_names(
    cohort: Sequence[int],
    partition_of: Mapping[int, Any],
    groups: Mapping[str, Sequence[int]],
    rejected_nodes: Sequence[int],
) -> tuple[dict[str, list[Any]], dict[str, list[int]]]:
    """``(partitions, nodes)``: for each group of cohort positions in ``groups`` (and the
    nodes of the rejected replies, one entry per reply, in the order of
    ``rejected_reasons``), the data partition id of each client (``None`` for a node without
    an identity) and its node id (``None`` for a placeholder: a partition no node worked on)."""
    partitions: dict[str, list[Any]] = {}
    nodes: dict[str, list[int]] = {}
    for name in CLIENT_GROUPS:
        if name == "rejected":
            ids = [int(node) for node in rejected_nodes]
        else:
            ids = [int(cohort[w]) for w in groups.get(name, ())]
        # a placeholder worker (a negative id: no node could work on its partition) is None
        nodes[name] = [node if node >= 0 else None for node in ids]  # type: ignore[misc]
        partitions[name] = [_partition_id(partition_of.get(node)) for node in ids]
    return partitions, nodes


def empty_names() -> dict[str, list[Any]]:
    """Every group, empty (a round in which nothing was sent)."""
    return {name: [] for name in CLIENT_GROUPS}


def _partition_id(identity: Any) -> int | None:
    return None if identity is None else int(identity.partition_id)


class _DropReceived(logging.Filter):
    """Drops Flower's "aggregate_train: Received N results and M failures" line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and "Received %s results and %s failures"
                    in record.msg)


@contextlib.contextmanager
def quiet_inner_aggregation() -> Iterator[None]:
    """Within the block, Flower's "Received N results" line is not logged (the inner strategy
    aggregates one decoded reply; the wrapper's own round line says how many replies it read)."""
    logger = logging.getLogger("flwr")
    quiet = _DropReceived()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


#: A ``rounds.jsonl`` row's keys in order, with the values of a round that decoded nothing
#: (``s``, ``virtual_s``, ``epsilon``, ``stopped``, the membership fields, ``partitions`` and
#: ``nodes`` are filled per run and round by :meth:`RoundLog.record`).
ROW_DEFAULTS: dict[str, Any] = {
    "round": None, "decode": "skipped", "s": None, "clients_used": [], "replies_read": 0,
    "stragglers": [], "busy": [], "excluded": [], "late_dropped": 0, "stopped_at_deadline": 0,
    "rejected": 0, "rejected_reasons": [], "decode_error": 1.0, "num_examples": None,
    "expected_round_s": None, "wire": None, "verified": None, "cross_check": None,
    "quarantined": [],
    "inconsistent": [], "disagreement": None,
    "unsettled": [],  # verify=True: workers of groups left out (no s + 1 agreeing replicas)
    "bytes_up": 0, "bytes_down": 0, "compute_s": 0.0,
    "virtual_s": 0.0, "round_virtual_s": 0.0,
    "round_deadline_s": None,  # nothing sent: no deadline
    # each valid reply's arrival (s after the round's start, before any queueing), by worker
    "arrivals_s": {},
    "wall_s": 0.0, "accuracy": None, "loss": None, "epsilon": None, "central_noise_std": None,
    "stopped": False,
    "unidentified": [],  # sampled nodes whose handshake failed this round
    "identity_rejected": [],  # sampled nodes excluded for their identity claims
    "missing_partitions": [],  # partitions of the round no used reply computed
    "missing_weight": None,  # their share of the round's examples (or partitions)
}


@dataclass(frozen=True)
class RoundOutcome:
    """What the aggregation of a coded round decided: ``decode`` (``"exact"``, ``"approx"``
    or ``"skipped"``) from the ``used`` replies, of which the decoder read ``replies_read``,
    with ``decode_error``; the integrity ``verdict`` (``None``: not cross-checked); the
    decoded ``num_examples`` and the central DP noise's std (``None``: nothing applied);
    ``dropped``: the replies the decoder found not finite (rejected, decoded without)."""

    decode: str
    used: list[int]
    replies_read: int
    decode_error: float
    verdict: Verdict | None = None
    num_examples: float | None = None
    central_noise_std: float | None = None
    dropped: tuple[Rejection, ...] = ()


class RoundLog:
    """The rounds' rows: built by :meth:`record`, completed with the evaluation and written by
    :meth:`flush` (to ``history``, the ``recorder``'s ``rounds.jsonl`` and one INFO line).

    ``membership`` adds its per-round fields (``row_fields``); ``clock`` gives ``virtual_s``;
    ``s`` is the default ``s`` of an idle round. With
    ``waits_for_evaluation`` a row is written at the next :meth:`flush` (after
    ``evaluate_fn``), else at once.
    """

    def __init__(self, recorder: Any, membership: Any, clock: Any, s: int) -> None:
        self.recorder = recorder
        self.membership = membership
        self.clock = clock
        self.s = s
        self.waits_for_evaluation = False
        self.history: list[dict[str, Any]] = []
        self.pending: dict[str, Any] | None = None

    def evaluating(self, evaluate_fn: Any) -> Any:
        """``evaluate_fn`` (Flower's ``(server_round, arrays) -> MetricRecord | None``, or
        ``None``) wrapped so that each round's row is written with its accuracy and loss;
        rows wait for it from now on when there is one. ``None`` stays ``None`` (rows are
        written as rounds end; Flower then logs no global evaluation)."""
        self.waits_for_evaluation = evaluate_fn is not None
        if evaluate_fn is None:
            return None

        def evaluate_and_record(server_round: int, arrays: Any) -> Any:
            res = evaluate_fn(server_round, arrays)
            if server_round > 0:
                self.flush(res)
            return res

        return evaluate_and_record

    def record(self, server_round: int, **fields: Any) -> dict[str, Any]:
        """The round's row (every key, defaults for a round that decoded nothing, ``fields``
        in their place), written now or after ``evaluate_fn`` adds accuracy and loss."""
        row = {
            **{key: type(value)(value) if isinstance(value, (list, dict)) else value
               for key, value in ROW_DEFAULTS.items()},
            "round": server_round,
            "s": self.s,
            "virtual_s": float(self.clock.now),
            "partitions": empty_names(),  # per group of clients: their data partition ids
            "nodes": empty_names(),  # ... and their node ids
            **self.membership.row_fields(server_round),
            **fields,
        }
        self.pending = row
        if not self.waits_for_evaluation:
            self.flush(None)
        return row

    def coded_fields(self, state: RoundState, outcome: RoundOutcome,
                     identities: Mapping[int, Any], late_compute_s: float = 0.0,
                     **timing: Any) -> dict[str, Any]:
        """The row fields of a coded round from its state and ``outcome`` (``timing``: the
        clock's and the counters' fields, passed through; ``late_compute_s``: the client
        compute of late replies dropped since the last row), after logging each rejected
        reply."""
        used, verdict = outcome.used, outcome.verdict
        # verify=True's verdict (the theorem's) is `verified`; verify=False's heuristic one
        # (sampled projections) is `cross_check`
        proven = verdict is not None and getattr(verdict, "proven", True)
        return {
            "decode": outcome.decode, "s": state.code.s, "clients_used": used,
            "replies_read": outcome.replies_read,
            "stragglers": sorted(set(range(state.code.n)) - set(used)),
            "busy": list(state.busy),
            "excluded": list(state.excluded), "rejected": len(state.rejected),
            "rejected_reasons": [reason for _, reason in state.rejected],
            "decode_error": outcome.decode_error, "num_examples": outcome.num_examples,
            "wire": state.wire,
            "verified": verdict.status if proven else None,
            "cross_check": verdict.status if verdict is not None and not proven else None,
            "quarantined": list(state.quarantined),
            "inconsistent": [] if verdict is None else verdict.excluded,
            "disagreement": None if verdict is None else verdict.disagreement,
            "unsettled": [] if verdict is None else list(getattr(verdict, "unsettled", [])),
            "bytes_up": state.bytes_up, "bytes_down": state.bytes_down,
            # measured client compute of every reply received (the mod's compute-s): the
            # round's valid replies and the late ones dropped since the last row
            "compute_s": float(sum(r.compute_s for r in state.valid.values()))
            + float(late_compute_s),
            "central_noise_std": outcome.central_noise_std,
            **timing,
            **self.names(state, used, verdict, identities),
        }

    def names(self, state: RoundState, used: list[int], verdict: Verdict | None,
              identities: Mapping[int, Any]) -> dict[str, Any]:
        """The row's ``partitions`` and ``nodes`` (every group of clients named by data
        partition and node id), after logging each rejected reply on one line (and its
        traceback in ``debug.log``)."""
        report_rejections(state.number, state.rejected, state.rejected_details,
                          identities, self.recorder)
        groups = {
            "used": used,
            "stragglers": sorted(set(range(state.code.n)) - set(used)),
            "busy": list(state.busy),
            "excluded": list(state.excluded),
            "inconsistent": [] if verdict is None else verdict.excluded,
            "stopped": sorted(set(state.stopped)),
        }
        partitions, nodes = client_names(state.cohort, identities, groups,
                                         [node for node, _ in state.rejected])
        return {"partitions": partitions, "nodes": nodes}

    def flush(self, evaluation: Mapping[str, Any] | None) -> None:
        """Write the pending row (with ``evaluation``'s accuracy and loss), if any."""
        row, self.pending = self.pending, None
        if row is None:
            return
        if evaluation is not None:
            for key in ("accuracy", "loss"):
                if key in evaluation:
                    row[key] = float(evaluation[key])
        self.history.append(row)
        if self.recorder is not None:
            self.recorder.record(row)
        _LOG.log(
            INFO,
            "[round %d] %-7s from %d replies (s=%d, %d stragglers, %d busy,%s %d late, "
            "%d rejected, err %.2g)%s | virtual %.2f s, wall %.2f s",
            row["round"], row["decode"], len(row["clients_used"]), row["s"],
            len(row["stragglers"]), len(row["busy"]),
            f" {len(row['excluded'])} excluded," if row["excluded"] else "",
            row["late_dropped"], row["rejected"], row["decode_error"],
            "" if row["accuracy"] is None else f" | acc {row['accuracy']:.3f}",
            row["virtual_s"], row["wall_s"],
        )

    @staticmethod
    def metrics(row: Mapping[str, Any], inner: MetricRecord | None) -> MetricRecord:
        """Flower's train metrics of the round: the inner strategy's, and the row's statistics
        under :data:`METRIC_PREFIX`."""
        ours = {
            "decoded": int(row["decode"] != "skipped"),
            "exact": int(row["decode"] == "exact"),
            "s": int(row["s"]),
            "clients_used": len(row["clients_used"]),
            "stragglers": len(row["stragglers"]),
            "busy": len(row["busy"]),
            "late_dropped": int(row["late_dropped"]),
            "rejected": int(row["rejected"]),
            "decode_error": float(row["decode_error"]),
            "virtual_s": float(row["virtual_s"]),
            "wall_s": float(row["wall_s"]),
            "stopped": int(row["stopped"]),
        }
        if row["epsilon"] is not None and math.isfinite(row["epsilon"]):
            ours["epsilon"] = float(row["epsilon"])
        # ours under one namespace: the app's own metrics (the inner strategy's) stay as they are
        merged = dict(inner.items()) if inner is not None else {}
        merged.update({METRIC_PREFIX + key: value for key, value in ours.items()})
        return MetricRecord(merged)
