"""One results writer: ``config.json``, ``rounds.jsonl``, ``final_model.npz`` and ``debug.log``
(details for a person debugging the run: the tracebacks of rejected replies) in a directory."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["ROUND_FIELDS", "RoundRecorder", "read_rounds"]

# Flower's logger (no Flower import: results are written by experiments without Flower too)
_LOG = logging.getLogger("flwr")

#: Keys every line of ``rounds.jsonl`` has.
ROUND_FIELDS = (
    "round",
    "decode",
    "clients_used",
    "stragglers",
    "late_dropped",
    "rejected",
    "decode_error",
    "virtual_s",
    "wall_s",
    "accuracy",
    "loss",
)


def _jsonable(value: Any) -> Any:
    """Plain JSON values; ``nan`` and infinities become ``null`` (they are not JSON, and
    strict parsers such as ``JSON.parse`` or ``jq`` reject the ``NaN`` Python would write)."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class RoundRecorder:
    """Writes a run's config once, one JSON object per round, and the latest model.

    A write that fails (disk full, permissions, a value JSON cannot hold) is logged as a
    warning and the run goes on: results are a record of the run, not a reason to end it.
    ``rounds.jsonl`` never holds a partial line: each row is one ``write`` of the whole line,
    and a write that fails midway is cut back to the previous end of the file.
    """

    def __init__(self, directory: str | Path, config: Mapping[str, Any]) -> None:
        self.directory = Path(directory)
        self._rounds = self.directory / "rounds.jsonl"
        self.failures = 0  # writes that failed (each warned)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._rounds.write_text("")
        except OSError as exc:
            self._warn(f"cannot create {self._rounds}", exc)
        try:
            text = json.dumps(_jsonable(config), indent=2, sort_keys=True, allow_nan=False)
            _replace(self.directory / "config.json", text.encode())
        except (OSError, TypeError, ValueError) as exc:
            self._warn(f"cannot write {self.directory / 'config.json'}", exc)

    def _warn(self, what: str, exc: BaseException) -> None:
        self.failures += 1
        _LOG.warning("%s: %s: %s (the run goes on; this result is not saved)", what,
                     type(exc).__name__, exc)

    def restart(self) -> bool:
        """Empty ``rounds.jsonl`` for a run that starts again from its first row (``config.json``
        stays); ``False`` (and a warning) if it could not be emptied."""
        try:
            self._rounds.write_text("")
        except OSError as exc:
            self._warn(f"cannot empty {self._rounds}", exc)
            return False
        return True

    def record(self, row: Mapping[str, Any]) -> bool:
        """Append ``row`` as one line; ``False`` (and a warning) if it could not be written."""
        missing = [k for k in ROUND_FIELDS if k not in row]
        if missing:
            raise ValueError(f"round record lacks {missing}")
        try:
            line = (json.dumps(_jsonable(row), sort_keys=True, allow_nan=False) + "\n").encode()
            _append_line(self._rounds, line)
        except (OSError, TypeError, ValueError) as exc:
            self._warn(f"cannot append round {row.get('round')!r} to {self._rounds}", exc)
            return False
        return True

    def debug(self, text: str) -> bool:
        """Append ``text`` to ``debug.log`` (created on first use); ``False`` (and a warning)
        if it could not be written."""
        path = self.directory / "debug.log"
        try:
            _append_line(path, text.encode("utf-8", errors="replace"))
        except OSError as exc:
            self._warn(f"cannot append to {path}", exc)
            return False
        return True

    def save_model(self, arrays: Mapping[str, np.ndarray]) -> bool:
        """Replace ``final_model.npz`` (a temporary file, then renamed: a failed write leaves
        the previous model); ``False`` (and a warning) if it could not be written."""
        path = self.directory / "final_model.npz"
        tmp = path.with_suffix(".tmp.npz")
        try:
            np.savez(tmp, **{k: np.asarray(v) for k, v in arrays.items()})
            tmp.replace(path)
        except (OSError, TypeError, ValueError) as exc:
            self._warn(f"cannot write {path}", exc)
            with contextlib.suppress(OSError):
                tmp.unlink()
            return False
        return True


def _append_line(path: Path, data: bytes) -> None:
    """Append ``data`` with one ``os.write`` (repeated only if the OS wrote part of it); on a
    failure the file is cut back to its size before, so no partial line stays."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        before = os.fstat(fd).st_size
        try:
            done = 0
            while done < len(data):
                written = os.write(fd, data[done:])
                if written <= 0:
                    raise OSError(f"wrote {done} of {len(data)} bytes")
                done += written
        except BaseException:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, before)
            raise
    finally:
        os.close(fd)


def _replace(path: Path, data: bytes) -> None:
    """Write ``path`` through a temporary file renamed over it (all or nothing)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_bytes(data)
        tmp.replace(path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def read_rounds(directory: str | Path) -> list[dict[str, Any]]:
    """The rows of ``rounds.jsonl``."""
    text = (Path(directory) / "rounds.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]
