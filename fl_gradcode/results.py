"""One results writer: ``config.json``, ``rounds.jsonl`` and ``final_model.npz`` in a directory."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["ROUND_FIELDS", "RoundRecorder", "read_rounds"]

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
    """Writes a run's config once, one JSON object per round, and the latest model."""

    def __init__(self, directory: str | Path, config: Mapping[str, Any]) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "config.json").write_text(
            json.dumps(_jsonable(config), indent=2, sort_keys=True, allow_nan=False)
        )
        self._rounds = self.directory / "rounds.jsonl"
        self._rounds.write_text("")

    def record(self, row: Mapping[str, Any]) -> None:
        missing = [k for k in ROUND_FIELDS if k not in row]
        if missing:
            raise ValueError(f"round record lacks {missing}")
        with self._rounds.open("a") as fh:
            fh.write(json.dumps(_jsonable(row), sort_keys=True, allow_nan=False) + "\n")

    def save_model(self, arrays: Mapping[str, np.ndarray]) -> None:
        path = self.directory / "final_model.npz"
        tmp = path.with_suffix(".tmp.npz")
        np.savez(tmp, **{k: np.asarray(v) for k, v in arrays.items()})
        tmp.replace(path)


def read_rounds(directory: str | Path) -> list[dict[str, Any]]:
    """The rows of ``rounds.jsonl``."""
    text = (Path(directory) / "rounds.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]
