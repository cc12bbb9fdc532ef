"""What a node insists on, whatever the server asks: its DP policy and its replay memory.

Everything here comes from the node's own configuration (``context.node_config``: deployment
``flower-supernode --node-config "..."``, simulation: the federation's options), never from
the instruction or the run config, which the server controls.

Node config keys:

* ``dp-required``: ``"none"`` (default: no requirement), ``"central"``, ``"partition"`` or
  ``"sample"``. The DP mode this node insists on. ``central`` accepts a ``central`` or
  ``partition`` instruction (both clip each partition's update; ``partition`` also adds noise
  the server cannot remove); ``partition`` accepts only ``partition``; ``sample`` only
  ``sample``. Any other instruction (in particular ``dp='none'``) is refused.
* ``dp-min-noise-multiplier``: a number ``>= 0`` (default 0). A positive value refuses
  ``dp='none'`` and any instruction whose ``noise-multiplier`` is below it (for ``dp='sample'``
  also a run-config ``noise-multiplier`` below it, the value the app's DP-SGD may read).
* ``dp-state-file``: a file in which the node remembers the ``(nonce, round)`` pairs it has
  answered, across restarts (one line per answered round; locked while read and appended).

Replays: a train instruction whose ``(nonce, round)`` this node has already answered is
refused, not computed, whatever else it asks (another ``noise-multiplier``, ``lr``, ``dp``):
the partition noise and the app's RNG are keyed by ``(key, nonce, round, partition)``, so two
answers with identical keyed noise let the server difference the noise away. Identical
retries are refused too (no reply is stored to be served again). The guard is on whenever
the node has partition keys (its computation then holds secret randomness) or a
``dp-state-file``; without keys every seed is public and a replay reveals nothing the server
cannot compute itself. Without ``dp-state-file`` the memory lasts as long as the mod object
(one process): Flower's deployment engine runs each message in a fresh ClientApp process, so
deployed nodes with keys need ``dp-state-file`` (the mod warns once per process otherwise).
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .protocol import Instruction

__all__ = ["ACCEPTED_MODES", "NodePolicy", "PolicyError", "ReplayGuard"]

#: ``dp-required`` -> the instruction ``dp`` modes that satisfy it.
ACCEPTED_MODES: dict[str, tuple[str, ...]] = {
    "none": ("none", "partition", "central", "sample"),
    "central": ("central", "partition"),
    "partition": ("partition",),
    "sample": ("sample",),
}


class PolicyError(ValueError):
    """An instruction this node refuses (the message names the field and the node's policy)."""


@dataclass(frozen=True)
class NodePolicy:
    """The node's DP requirements (node config ``dp-required``, ``dp-min-noise-multiplier``)."""

    dp_required: str = "none"
    min_noise_multiplier: float = 0.0

    @classmethod
    def from_node_config(cls, node_config: Mapping[str, Any]) -> NodePolicy:
        required = node_config.get("dp-required", "none")
        if required in ("", None):
            required = "none"
        if required not in ACCEPTED_MODES:
            raise ValueError(
                f"node config dp-required={required!r}; expected one of {tuple(ACCEPTED_MODES)}"
            )
        floor = node_config.get("dp-min-noise-multiplier", 0.0)
        if isinstance(floor, str):
            try:
                floor = float(floor)
            except ValueError:
                pass
        if isinstance(floor, bool) or not isinstance(floor, (int, float)) or not (
            math.isfinite(floor) and floor >= 0
        ):
            raise ValueError(
                f"node config dp-min-noise-multiplier={floor!r}; expected a finite number >= 0"
            )
        return cls(str(required), float(floor))

    @property
    def active(self) -> bool:
        return self.dp_required != "none" or self.min_noise_multiplier > 0

    def check(self, instruction: Instruction, run_config: Mapping[str, Any]) -> None:
        """Raise :class:`PolicyError` if ``instruction`` asks for less privacy than this node
        insists on."""
        mode = instruction.dp
        if mode not in ACCEPTED_MODES[self.dp_required]:
            raise PolicyError(
                f"dp={mode!r} refused: this node's policy is dp-required="
                f"{self.dp_required!r} (accepts dp in {ACCEPTED_MODES[self.dp_required]})"
            )
        floor = self.min_noise_multiplier
        if floor <= 0:
            return
        if mode == "none":
            raise PolicyError(
                f"dp='none' refused: this node's policy is dp-min-noise-multiplier={floor:g} "
                "(a DP mode with at least that noise)"
            )
        if instruction.noise_multiplier < floor:
            raise PolicyError(
                f"noise-multiplier={instruction.noise_multiplier:g} refused: this node's "
                f"policy is dp-min-noise-multiplier={floor:g}"
            )
        if mode == "sample" and "noise-multiplier" in run_config:
            app_sigma = run_config["noise-multiplier"]
            try:
                app_sigma = float(app_sigma)
            except (TypeError, ValueError):
                app_sigma = math.nan
            if not app_sigma >= floor:
                raise PolicyError(
                    f"run config noise-multiplier={run_config['noise-multiplier']!r} (the "
                    f"app's DP-SGD noise) refused: this node's policy is "
                    f"dp-min-noise-multiplier={floor:g}"
                )


class ReplayGuard:
    """The ``(nonce, round)`` pairs each node has answered: in memory, and in the node's
    ``dp-state-file`` when it has one. :meth:`claim` before computing, :meth:`release` if the
    computation failed before anything was sent."""

    def __init__(self) -> None:
        self._answered: set[tuple[Any, ...]] = set()
        self._lock = threading.Lock()

    # Flower's simulation engine pickles the ClientApp (and this guard in its mod) for its Ray
    # actors: a copy keeps what was answered and gets a lock of its own
    def __getstate__(self) -> dict[str, Any]:
        return {"_answered": set(self._answered)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._answered = set(state["_answered"])
        self._lock = threading.Lock()

    @staticmethod
    def _file_label(node_config: Mapping[str, Any], node_id: int) -> str:
        if "partition-id" in node_config:
            return f"partition={node_config['partition-id']}/{node_config.get('num-partitions')}"
        return f"node={node_id}"

    def claim(self, node_id: int, node_config: Mapping[str, Any], nonce: str, rnd: int) -> None:
        """Record ``(nonce, round)`` as answered by this node, or raise :class:`PolicyError`
        if it already was."""
        memory_key = (int(node_id), nonce, int(rnd))
        why = (f"round={rnd} with nonce={nonce!r} was already answered by this node: a second "
               "instruction for an answered (nonce, round) is refused, whatever it asks (its "
               "keyed noise would repeat)")
        with self._lock:
            if memory_key in self._answered:
                raise PolicyError(why)
            path = node_config.get("dp-state-file")
            if path:
                entry = {"node": self._file_label(node_config, node_id), "nonce": nonce,
                         "round": int(rnd)}
                if not _file_claim(Path(str(path)), entry):
                    raise PolicyError(f"{why} (recorded in dp-state-file {path})")
            self._answered.add(memory_key)

    def release(self, node_id: int, node_config: Mapping[str, Any], nonce: str, rnd: int) -> None:
        """Forget a claim whose computation failed before any reply was sent."""
        with self._lock:
            self._answered.discard((int(node_id), nonce, int(rnd)))
            path = node_config.get("dp-state-file")
            if path:
                entry = {"node": self._file_label(node_config, node_id), "nonce": nonce,
                         "round": int(rnd)}
                _file_release(Path(str(path)), entry)


def _entries(handle: Any) -> list[dict]:
    handle.seek(0)
    out = []
    text = handle.read()
    if text and not text.endswith("\n"):  # a torn last line: never glue the next entry to it
        handle.write("\n")
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:  # a torn line from a crash mid-write: ignore it
            continue
    return out


def _file_claim(path: Path, entry: dict) -> bool:
    """Append ``entry`` under an exclusive lock unless it is there already (then False)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    with os.fdopen(fd, "r+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            if entry in _entries(handle):
                return False
            handle.seek(0, os.SEEK_END)
            handle.write(json.dumps(entry, sort_keys=True) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
            return True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _file_release(path: Path, entry: dict) -> None:
    if not path.exists():
        return
    with open(path, "r+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            kept = [e for e in _entries(handle) if e != entry]
            handle.seek(0)
            handle.truncate()
            handle.write("".join(json.dumps(e, sort_keys=True) + "\n" for e in kept))
            handle.flush()
            os.fsync(handle.fileno())
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
