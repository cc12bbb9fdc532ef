"""``make_code``'s options from ``GradientCoding``'s keywords (the rule of
:meth:`~fl_gradcode.flower.options.Options.from_keywords` for ``code_options``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["code_options"]


def code_options(code: Any, s: int, s_max: int | None, auto: bool,
                 code_options: Mapping[str, Any] | None, m: int | None) -> dict[str, Any]:
    """``make_code``'s options: the user's, with a fixed nested placement's ``s_max`` and the
    communication-efficient ``m`` from their keywords (a contradicting entry is refused)."""
    options = dict(code_options or {})
    keywords = {}
    if code == "nested" and s_max is not None and not auto:
        keywords["s_max"] = s_max
    if m is not None:
        keywords["m"] = m
    for name, value in keywords.items():
        if name in options and options[name] != value:
            raise ValueError(f"code_options[{name!r}]={options[name]!r} contradicts "
                             f"{name}={value!r}; give one of them")
        options[name] = value
    return options
