"""Checks of ``GradientCoding``'s scalar keywords: a value of the wrong kind is refused by name,
never coerced into another setting (``bool("false")`` is ``True``, ``int(1.7)`` is 1)."""

from __future__ import annotations

import difflib
import numbers
from typing import Any

import numpy as np

from ..codes import GradientCode, available_codes
from .finite import finite_number

__all__ = ["check_code", "check_fixed_s", "check_latency", "finite", "flag", "number",
           "whole"]


def number(value: Any) -> bool:
    """An int or a float, not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_code(code: Any) -> None:
    """A registry name or a :class:`~fl_gradcode.codes.GradientCode` with one partition per
    client (``k = n``: a round codes the clients' own data), else ``TypeError`` /
    ``ValueError``."""
    if not isinstance(code, (str, GradientCode)):
        raise TypeError(f"code must be a registry name or a GradientCode; got {code!r}")
    if isinstance(code, str) and code not in available_codes():
        near = difflib.get_close_matches(code, available_codes(), n=1)
        raise ValueError(f"unknown code {code!r}; expected one of {available_codes()}"
                         + (f" (did you mean {near[0]!r}?)" if near else ""))
    if isinstance(code, GradientCode) and code.k != code.n:
        raise ValueError(
            f"code {code.name} has k={code.k} partitions for n={code.n} clients: a round codes "
            "each client's own data partition, so a code needs one per client (k = n); its "
            "k partitions would be the data split another way. Build one with k = n (e.g. "
            "CommunicationEfficientCode(..., own_partitions=True)), or pass the code's name "
            "and let the strategy build one")
    if isinstance(code, GradientCode) and not np.all(np.asarray(code.weights) == 1.0):
        raise ValueError(
            f"code {code.name} has partition weights {_shown(code.weights)}: the strategy "
            "decodes the example-weighted average sum_j n_j theta_j / sum_j n_j and counts "
            "the examples itself, so weights w_j would make it sum_j w_j n_j theta_j / "
            "sum_j w_j n_j while rounds say exact; build the code without weights=")


def _shown(values: Any) -> str:
    values = [float(v) for v in np.asarray(values).reshape(-1)]
    return repr(values[:6])[:-1] + (", ...]" if len(values) > 6 else "]")


def check_fixed_s(s: Any) -> None:
    """A fixed tolerance: an integer >= 0 (``"auto"`` is resolved before), else ``ValueError``."""
    if isinstance(s, bool) or not isinstance(s, int) or s < 0:
        raise ValueError(f"s={s!r} must be an integer >= 0 or 'auto'")


def flag(name: str, value: Any) -> bool:
    """``value`` as a bool: a bool (Python's or numpy's) or the integer 0 or 1."""
    if isinstance(value, (numbers.Integral, np.bool_)) and value in (0, 1):
        return bool(value)
    raise ValueError(f"{name}={value!r} must be True or False")


def finite(name: str, value: Any, low: float = 0.0) -> float:
    """``value`` as a float: a finite real number (not a bool) >= ``low``."""
    if finite_number(value) and value >= low:
        return float(value)
    raise ValueError(f"{name}={value!r} must be a finite number >= {low:g}")


def whole(name: str, value: Any, low: int | None = None, tail: str = "") -> int:
    """``value`` as an int: an integer (Python's or numpy's, not a bool) >= ``low``."""
    if (isinstance(value, numbers.Integral) and not isinstance(value, bool)
            and (low is None or value >= low)):
        return int(value)
    bound = "" if low is None else f" >= {low}"
    raise ValueError(f"{name}={value!r} must be an integer{bound}{tail}")


def check_latency(latency: Any) -> None:
    """``None`` or a latency model (an object with ``sample(size, rng, load)``), else
    ``TypeError`` naming the value and how to build one."""
    if latency is None or callable(getattr(latency, "sample", None)):
        return
    how = (f"fl_gradcode.latency.make_latency({latency!r}, ...)" if isinstance(latency, str)
           else "fl_gradcode.latency.make_latency(name, ...)")
    raise TypeError(f"latency={latency!r} is not a latency model (an object with "
                    f"sample(size, rng, load), such as fl_gradcode.latency.Pareto): build one "
                    f"with {how}, or pass None")
