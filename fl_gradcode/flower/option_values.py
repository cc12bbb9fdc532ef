"""Checks of ``GradientCoding``'s scalar keywords: a value of the wrong kind is refused by name,
never coerced into another setting (``bool("false")`` is ``True``, ``int(1.7)`` is 1)."""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

__all__ = ["finite", "flag", "whole"]


def flag(name: str, value: Any) -> bool:
    """``value`` as a bool: a bool (Python's or numpy's) or the integer 0 or 1."""
    if isinstance(value, (numbers.Integral, np.bool_)) and value in (0, 1):
        return bool(value)
    raise ValueError(f"{name}={value!r} must be True or False")


def finite(name: str, value: Any, low: float = 0.0) -> float:
    """``value`` as a float: a finite real number (not a bool) >= ``low``."""
    if (isinstance(value, numbers.Real) and not isinstance(value, bool)
            and math.isfinite(value) and value >= low):
        return float(value)
    raise ValueError(f"{name}={value!r} must be a finite number >= {low:g}")


def whole(name: str, value: Any, low: int | None = None, tail: str = "") -> int:
    """``value`` as an int: an integer (Python's or numpy's, not a bool) >= ``low``."""
    if (isinstance(value, numbers.Integral) and not isinstance(value, bool)
            and (low is None or value >= low)):
        return int(value)
    bound = "" if low is None else f" >= {low}"
    raise ValueError(f"{name}={value!r} must be an integer{bound}{tail}")
