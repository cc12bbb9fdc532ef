"""What every renderer shares: the block registry, the JSON loader, Markdown tables."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results"
BLOCK = re.compile(
    r"(?P<open><!-- generated:(?P<name>[\w-]+) -->\n)(?P<body>.*?)"
    r"(?P<close><!-- /generated:(?P=name) -->)", re.S)

RENDERERS: dict[str, Callable[[], str | None]] = {}


def block(name: str):
    """Register ``fn`` as the renderer of the blocks named ``name`` (``None``: keep the body)."""
    def register(fn: Callable[[], str | None]) -> Callable[[], str | None]:
        RENDERERS[name] = fn
        return fn
    return register


@functools.cache
def load(name: str) -> dict:
    """The parsed ``results/NAME`` (read once per process)."""
    return json.loads((RESULTS / name).read_text())


def table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def command(recorded: str) -> str:
    """A run command from a JSON, in its current form: the experiments run as modules of the
    ``experiments`` package (``python -m experiments.X``); older results recorded the script
    path (``python experiments/X.py``)."""
    return re.sub(r"\bpython experiments/(\w+)\.py\b", r"python -m experiments.\1", recorded)


def num(value: float | None, fmt: str = ".2f") -> str:
    """``value`` formatted, ``-`` for a missing one."""
    return "-" if value is None else format(value, fmt)


def ci(pair: list[float] | None) -> str:
    """A confidence interval as `` [lo, hi]`` (empty when there is none)."""
    return "" if not pair else f" [{pair[0]:.2f}, {pair[1]:.2f}]"

