"""Gradient codes (numpy/scipy only): exact, approximate and communication-efficient.

>>> from fl_gradcode.codes import make_code, available_codes
>>> code = make_code("grouped-rs", n=10, s=3)
>>> code.is_exact, code.load
(True, 4)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .amplification import sampled_amplification
from .approximate import BernoulliCode, ExpanderCode
from .base import DecodabilityTracker, Decoding, GradientCode, NotDecodableError, check_n_s
from .comm_efficient import CommunicationEfficientCode
from .nested import NestedGroupCode, NestedPlacement, nested_code
from .option_checks import CODE_OPTIONS, CodeOptionError, check_options
from .patterns import bursts, straggler_patterns
from .repetition import (
    CyclicRepetitionCode,
    FractionalRepetitionCode,
    IgnoreStragglers,
    UncodedCode,
    frc_expected_error,
)
from .stable import GroupedReedSolomonCode

__all__ = [
    "CODE_OPTIONS",
    "BernoulliCode",
    "CodeOptionError",
    "CommunicationEfficientCode",
    "CyclicRepetitionCode",
    "DecodabilityTracker",
    "Decoding",
    "ExpanderCode",
    "FractionalRepetitionCode",
    "GradientCode",
    "GroupedReedSolomonCode",
    "IgnoreStragglers",
    "NestedGroupCode",
    "NestedPlacement",
    "NotDecodableError",
    "UncodedCode",
    "available_codes",
    "bursts",
    "check_options",
    "frc_expected_error",
    "make_code",
    "sampled_amplification",
    "straggler_patterns",
]

# name -> (factory(n, s, seed, **options), uses the seed)
_REGISTRY: dict[str, Callable[..., GradientCode]] = {
    "uncoded": lambda n, s, seed, **o: UncodedCode(n, **o),
    "ignore-stragglers": lambda n, s, seed, **o: IgnoreStragglers(n, s, **o),
    "frc": lambda n, s, seed, **o: FractionalRepetitionCode(n, s, **o),
    "crc": lambda n, s, seed, **o: CyclicRepetitionCode(n, s, seed=seed, **o),
    "grouped-rs": lambda n, s, seed, **o: GroupedReedSolomonCode(n, s, **o),
    "bgc": lambda n, s, seed, **o: BernoulliCode(n, s, seed=seed, **o),
    "expander": lambda n, s, seed, **o: ExpanderCode(n, s, seed=seed, **o),
    "comm-efficient": lambda n, s, seed, **o: CommunicationEfficientCode(n, s, seed=seed, **o),
    "nested": lambda n, s, seed, **o: nested_code(n, s, seed, **o),
}


def available_codes() -> list[str]:
    """Registry names accepted by :func:`make_code`."""
    return list(_REGISTRY)


def make_code(name: str, n: int, s: int, seed: int = 0, **options: Any) -> GradientCode:
    """Build a gradient code by registry name.

    Args:
        name: one of :func:`available_codes`.
        n: number of clients.
        s: number of stragglers to tolerate (``0 <= s < n``).
        seed: seed of every random choice of the construction.
        **options: code-specific options (e.g. ``weights`` for all codes, ``rescale`` for
            ``ignore-stragglers``, ``load`` for ``bgc``/``expander``, ``m`` for
            ``comm-efficient``, ``draws`` for ``crc``, ``s_max``/``layout`` for ``nested``).

    Raises:
        ValueError: unknown name or invalid parameters (the message names the value);
            :class:`CodeOptionError` for an option no cohort size could take.
    """
    if name not in _REGISTRY:
        raise ValueError(f"unknown code {name!r}; expected one of {available_codes()}")
    n, s = check_n_s(n, s)
    check_options(name, s, options)
    try:
        return _REGISTRY[name](n, s, seed, **options)
    except TypeError as exc:  # unexpected keyword: report it as a bad value
        raise ValueError(f"invalid option for code {name!r}: {exc}") from exc
