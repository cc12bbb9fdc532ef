"""One check, shared by the server and the client side: is a value a finite real number?

Light on purpose (no numpy, no codes): the client mod imports it through the protocol."""

from __future__ import annotations

import math
import numbers
from typing import Any

__all__ = ["finite_number"]


def finite_number(value: Any) -> bool:
    """A real number (not a bool) whose float is finite: not NaN or Inf, and not an int past
    float's range (``10**400``, which Flower's records hold in process)."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False
