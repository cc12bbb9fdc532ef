"""Shared plumbing of the experiment scripts: output paths, JSON, progress, figures."""

from __future__ import annotations

import json
import platform
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # make `server` / `clients` importable when run as a script
    sys.path.insert(0, str(ROOT))

T = TypeVar("T")


def progress(items: Iterable[T], description: str, total: int | None = None) -> Iterator[T]:
    """A progress bar on stderr (rich), silent when stderr is not a terminal."""
    from rich.progress import track

    items = list(items) if total is None else items
    yield from track(items, description=description, total=total, transient=True,
                     disable=not sys.stderr.isatty())


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, float) and not np.isfinite(value):
        return None
    return value


def save(result: dict, out: str | Path, figure=None) -> Path:
    """Write ``out.json`` (with machine info) and ``out.png`` if a figure is given."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {**result, "machine": {"python": platform.python_version(),
                                    "cpu": platform.machine()}}
    out.with_suffix(".json").write_text(json.dumps(_jsonable(result), indent=2))
    if figure is not None:
        save_figure(figure, out.with_suffix(".png"))
    print(f"wrote {out.with_suffix('.json')}" + (" and .png" if figure is not None else ""))
    return out


def save_figure(figure, path: str | Path) -> Path:
    """Write a figure as every experiment's figures are written (120 dpi, tight) and close it."""
    import matplotlib.pyplot as plt

    figure.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(figure)
    return Path(path)


def quiet_flower() -> None:
    """Hide Flower's per-round INFO logs (thousands of lines in in-process runs)."""
    import logging

    logging.getLogger("flwr").setLevel(logging.WARNING)
    logging.getLogger().setLevel(logging.WARNING)


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
