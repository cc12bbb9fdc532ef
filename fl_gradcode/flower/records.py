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
* **Flower's lines.** The inner strategy's ``aggregate_train`` sees ONE reply (the decoded
  average) and would log "Received 1 results and 0 failures" every round, which reads as if one
  client answered: :func:`quiet_inner_aggregation` drops that line for the inner call only.
"""

from __future__ import annotations

import contextlib
import logging
import re
import traceback
from collections.abc import Iterator, Mapping, Sequence
from logging import WARNING
from typing import Any

__all__ = [
    "CLIENT_GROUPS",
    "MAX_TRACEBACK_CHARS",
    "METRIC_PREFIX",
    "TRACEBACK_MARKER",
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
    Ray task error's text), its first line and the exception line it ends with."""
    text = str(text)
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
    last = lines[-1].rstrip("'>\"")
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
    an identity) and its node id."""
    partitions: dict[str, list[Any]] = {}
    nodes: dict[str, list[int]] = {}
    for name in CLIENT_GROUPS:
        if name == "rejected":
            members = [int(node) for node in rejected_nodes]
        else:
            members = [int(cohort[w]) for w in groups.get(name, ())]
        nodes[name] = members
        partitions[name] = [_partition_id(partition_of.get(node)) for node in members]
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
