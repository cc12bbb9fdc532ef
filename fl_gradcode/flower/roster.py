"""The operator's roster: which authenticated node holds which data partition.

Without a roster, the server only has the nodes' own claims (the ``identify`` handshake), and
a claim is not proof: any node can claim any partition. A roster is the operator's statement,
made outside the federation, of which node identity holds which partition. The identity is
the node id the SuperLink assigns; with Flower's SuperNode authentication enabled the SuperLink
binds a node id to the node's key pair, so a node id in the roster is one no other node can
answer for. (In simulation, node ids are the simulation's.)

Formats (a mapping, or a path to a JSON file holding one):

* ``{node_id: partition_id, ...}``: ``num-partitions`` is the number of entries;
* ``{"num-partitions": K, "nodes": {node_id: partition_id, ...}}``: ``K`` partitions, of
  which the roster may list only some (the others have no known holder).

JSON object keys are strings: ``"123": 0`` names node 123. Two nodes holding one partition, a
partition id outside ``0..K-1`` or a non-integer entry are refused with an error naming it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Roster", "load_roster"]


@dataclass(frozen=True)
class Roster:
    """``holder``: node id -> its partition id; ``num_partitions``: the federation's."""

    holder: Mapping[int, int]
    num_partitions: int

    def partition_of(self, node: int) -> int | None:
        """The node's partition in the roster (``None``: the node is not in it)."""
        return self.holder.get(node)


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool):
        raise ValueError(f"roster: {what}={value!r} must be an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    raise ValueError(f"roster: {what}={value!r} must be an integer")


def load_roster(roster: str | os.PathLike[str] | Mapping[Any, Any] | None) -> Roster | None:
    """The roster given as ``GradientCoding(roster=...)`` (a mapping or a JSON file's path;
    ``None`` or ``""``: none)."""
    if roster is None or (isinstance(roster, str) and not roster):
        return None
    if isinstance(roster, (str, os.PathLike)):
        path = Path(roster).expanduser()
        try:
            data = json.loads(path.read_text())
        except OSError as exc:
            raise ValueError(f"roster={str(roster)!r}: cannot read it ({exc})") from exc
        except json.JSONDecodeError as exc:
            raise ValueError(f"roster={str(roster)!r} is not JSON ({exc})") from exc
    elif isinstance(roster, Mapping):
        data = roster
    else:
        raise ValueError(f"roster={roster!r}: expected a mapping of node id -> partition id, "
                         "or the path of a JSON file holding one")
    if not isinstance(data, Mapping):
        raise ValueError("roster: expected a JSON object of node id -> partition id")
    if "nodes" in data or "num-partitions" in data:
        unknown = set(data) - {"nodes", "num-partitions"}
        if unknown:
            raise ValueError(f"roster: unknown key(s) {sorted(map(str, unknown))}; expected "
                             "'num-partitions' and 'nodes'")
        nodes = data.get("nodes", {})
        if not isinstance(nodes, Mapping):
            raise ValueError("roster: 'nodes' must map node ids to partition ids")
        num = data.get("num-partitions")
    else:
        nodes, num = data, None
    holder: dict[int, int] = {}
    spelled: dict[int, Any] = {}
    for node, pid in nodes.items():
        node_id = _int(node, "node id")
        if node_id in spelled:
            raise ValueError(f"roster: node ids {spelled[node_id]!r} and {node!r} are both node "
                             f"{node_id}; a roster names each node once")
        spelled[node_id] = node
        holder[node_id] = _int(pid, f"partition of node {node}")
    k = len(holder) if num is None else _int(num, "num-partitions")
    if k < 1:
        raise ValueError(f"roster: num-partitions={k} must be >= 1")
    seen: dict[int, int] = {}
    for node, pid in sorted(holder.items()):
        if not 0 <= pid < k:
            raise ValueError(f"roster: node {node} holds partition {pid}, not in 0..{k - 1} "
                             f"(num-partitions={k})")
        if pid in seen:
            raise ValueError(f"roster: nodes {seen[pid]} and {node} both hold partition {pid}; "
                             "a roster names one holder per partition")
        seen[pid] = node
    return Roster(holder=dict(holder), num_partitions=k)
