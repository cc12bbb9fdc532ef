"""Warnings a client mod gives once: the mod instance owns what it has said.

Each warning is attributed to the code that called the mod (the first frame outside the mod's
own modules), wherever in the mod it was raised.
"""

from __future__ import annotations

import inspect
import os
import warnings

__all__ = ["Notices"]

_CLIENT = os.path.dirname(os.path.abspath(__file__))
_FLOWER = os.path.dirname(_CLIENT)
#: the mod's own modules: a warning names the first frame outside them
_OWN_FILES = frozenset(os.path.join(_FLOWER, name) for name in ("mod.py", "mod_order.py"))


def _own(filename: str) -> bool:
    path = os.path.abspath(filename)
    return path in _OWN_FILES or os.path.dirname(path) == _CLIENT


def _caller_stacklevel() -> int:
    """The ``stacklevel`` that names the mod's caller, for a ``warnings.warn`` made by the
    function that called this one."""
    frame = inspect.currentframe()
    frame = frame.f_back if frame is not None else None  # the function that warns
    level = 1
    while frame is not None and _own(frame.f_code.co_filename):
        frame = frame.f_back
        level += 1
    return level


class Notices:
    """The warnings one mod instance has given (each ``kind`` once per instance)."""

    def __init__(self) -> None:
        self.given: set[str] = set()

    def once(self, kind: str, text: str) -> None:
        """Warn ``text`` (a ``UserWarning``) unless this instance already gave ``kind``."""
        if kind in self.given:
            return
        self.given.add(kind)
        warnings.warn(text, UserWarning, stacklevel=_caller_stacklevel())
