"""The registry's code options checked before any cohort size is known.

:func:`check_options` refuses, naming it, an option value that no cohort size could take
(``load=0``, ``max_amplification=0.5``, ``draws=0``, a negative weight, ``s_max < s``, ...):
a strategy building a code each round can then refuse it once, when it is built, instead of
falling back to another code every round. What depends on the cohort size (``load <= n``,
one weight per partition, ``(s + 1) | n`` for ``frc``) is left to the constructors.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from numbers import Integral, Real
from typing import Any

import numpy as np

from .checks import as_int, check_weights
from .nested import LAYOUTS

__all__ = ["CODE_OPTIONS", "CodeOptionError", "check_options"]


class CodeOptionError(ValueError):
    """An option no cohort size could take: the user's to fix, never a reason to build
    another code instead."""


def _integer(low: int, none: bool = False) -> Callable[[str, Any], None]:
    def check(name: str, value: Any) -> None:
        if value is None and none:
            return
        if isinstance(value, bool) or not isinstance(value, Integral) or value < low:
            raise ValueError(f"{name}={value!r} must be an integer >= {low}"
                             + (" or None" if none else ""))
    return check


def _at_least_one(none: bool = False) -> Callable[[str, Any], None]:
    def check(name: str, value: Any) -> None:  # inf: no bound; NaN fails the comparison
        if value is None and none:
            return
        if isinstance(value, bool) or not isinstance(value, Real) or not value >= 1:
            raise ValueError(f"{name}={value!r} must be a number >= 1"
                             + (" or None" if none else ""))
    return check


def _flag(name: str, value: Any) -> None:
    if not (isinstance(value, (bool, np.bool_))
            or (isinstance(value, Integral) and value in (0, 1))):
        raise ValueError(f"{name}={value!r} must be True or False")


def _layout(name: str, value: Any) -> None:
    if value not in LAYOUTS:
        raise ValueError(f"{name}={value!r}; expected one of {LAYOUTS}")


def _weights(name: str, value: Any) -> None:
    if value is None:
        return
    try:
        w = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name}={value!r} must be positive finite numbers") from exc
    if w.ndim != 1:
        raise ValueError(f"{name} must be a list of numbers, one per partition")
    check_weights(w, w.shape[0])  # the constructors' rule, at the length given


_CHECKS: dict[str, Callable[[str, Any], None]] = {
    "weights": _weights,
    "rescale": _flag,
    "draws": _integer(1),
    "max_amplification": _at_least_one(),
    "max_relative_amplification": _at_least_one(none=True),
    "max_load_overhead": _at_least_one(),
    "load": _integer(1, none=True),
    "m": _integer(1),
    "dim": _integer(1, none=True),
    "own_partitions": _flag,
    "s_max": _integer(0, none=True),
    "layout": _layout,
}

#: The options each registry code takes (besides ``n``, ``s`` and the seed).
CODE_OPTIONS: dict[str, tuple[str, ...]] = {
    "uncoded": ("weights",),
    "ignore-stragglers": ("rescale", "weights"),
    "frc": ("weights",),
    "crc": ("draws", "weights"),
    "grouped-rs": ("max_amplification", "max_relative_amplification", "max_load_overhead",
                   "weights"),
    "bgc": ("load", "weights"),
    "expander": ("load", "weights"),
    "comm-efficient": ("m", "draws", "dim", "own_partitions", "weights"),
    "nested": ("s_max", "layout", "max_amplification", "weights"),
}


def check_options(name: str, s: Any, options: Mapping[str, Any]) -> None:
    """:class:`CodeOptionError` naming the first option of code ``name`` (a registry name)
    that is not one it takes, or whose value no cohort size could take; the nested code's
    ``s_max`` must also be at least ``s``. A name the registry does not know is left to
    :func:`~fl_gradcode.codes.make_code`."""
    if name not in CODE_OPTIONS:
        return
    takes = CODE_OPTIONS[name]
    for key, value in options.items():
        if key not in takes:
            raise CodeOptionError(f"invalid option for code {name!r}: {key}={value!r}; it "
                                  f"takes {', '.join(takes)}")
        try:
            _CHECKS[key](key, value)
        except ValueError as exc:
            raise CodeOptionError(f"code {name!r}: {exc}") from None
    if name == "nested" and options.get("s_max") is not None:
        s = as_int(s, "s")
        if options["s_max"] < s:
            raise CodeOptionError(f"s_max={options['s_max']!r} must be >= s={s} (the nested "
                                  "code's most tolerated stragglers)")
