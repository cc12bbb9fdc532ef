"""``make_code``'s options from ``GradientCoding``'s keywords (the rule of
:meth:`~fl_gradcode.flower.options.Options.from_keywords` for ``code_options``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..codes import GradientCode, check_options
from .option_values import whole

__all__ = ["AUTO_CODE_NAMES", "code_options", "fixed_s"]

#: The code names ``s="auto"`` takes: the exact codes. Whichever is named, every round runs
#: the exact code of the nested placement for the ``s`` chosen (the same objective: the exact
#: sum from any ``n - s`` replies). An approximate code, ``uncoded`` or a reply of ``1/m`` of
#: the model would not run, so those are refused.
AUTO_CODE_NAMES = ("nested", "grouped-rs", "frc", "crc")


def code_options(code: Any, s: int, s_max: int | None, auto: bool,
                 code_options: Mapping[str, Any] | None, m: int | None) -> dict[str, Any]:
    """``make_code``'s options: the user's, with a fixed nested placement's ``s_max`` and the
    communication-efficient ``m`` from their keywords (a contradicting entry is refused; an
    ``m`` that is not an integer >= 1 too, an option no cohort size could take or the code
    does not take (:func:`~fl_gradcode.codes.check_options`); with ``s="auto"``, whose
    nested placement they would not reach, any ``code_options``, any ``m`` and a code other
    than :data:`AUTO_CODE_NAMES`, naming it)."""
    if auto:
        _check_auto(code, m)
    elif isinstance(code, GradientCode):
        own_m = getattr(code, "m", None) or 1  # its reply is 1/m of the model
        given = {k: v for k, v in (("m", m), ("code_options", code_options), ("s_max", s_max))
                 if v is not None and v != {} and not (k == "m" and v == own_m)}
        if given:
            raise ValueError(f"{given!r} with a {type(code).__name__} object: the code is "
                             "built already, so they would not be used; build it with them "
                             "(make_code(name, n, s, ...)) or pass its registry name")
    options = dict(code_options or {})
    if "weights" in options:
        raise ValueError("code_options['weights']: the strategy decodes the example-weighted "
                         "average sum_j n_j theta_j / sum_j n_j and counts the examples "
                         "itself; weights w_j would make it sum_j w_j n_j theta_j / "
                         "sum_j w_j n_j while rounds say exact (and sit on cohort positions, "
                         "not data partitions, when cohorts are sampled); remove them")
    if auto and options:
        raise ValueError(f"code_options={options!r} with s='auto': the data are placed once "
                         "for s_max by the nested placement (NestedPlacement), which these "
                         "options would not reach; remove them, or give a fixed s")
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
    if "m" in options:  # a bad reply length is the user's to fix, not a fallback code
        options["m"] = whole("m", options["m"], low=1, tail=" (every reply is 1/m of the "
                             "model; code='comm-efficient')")
    if isinstance(code, str) and not auto:  # refused now, not by a fallback every round
        check_options(code, s, options)
    return options


def fixed_s(code: Any, s: int, default: int) -> int:
    """The tolerance of a fixed code: a code object's own ``s`` (an ``s`` other than the
    keyword's ``default`` must equal it); ``code="uncoded"``'s, 0 (the same rule: its rounds
    need every reply, so an ``s`` it would not tolerate is refused); else ``s``."""
    if code == "uncoded":
        if int(s) not in (0, default):
            raise ValueError(f"s={s!r} with code='uncoded': it tolerates no straggler (every "
                             "round needs every reply), so its rounds would not be the ones "
                             "asked for; give s=0, or a code that tolerates s (e.g. "
                             "code='grouped-rs')")
        return 0
    if not isinstance(code, GradientCode) or int(s) == int(code.s):
        return int(s)
    if int(s) != default:
        raise ValueError(f"s={s!r} contradicts the {type(code).__name__} object's s={code.s}: "
                         "the object's own s is the tolerance; omit s, or build the code "
                         "with it")
    return int(code.s)


def _check_auto(code: Any, m: int | None) -> None:
    """Refuse what ``s="auto"`` would silently not run: a code that is not exact (or a code
    object, whose own placement would be replaced), or a reply length."""
    name = code if isinstance(code, str) else f"a {type(code).__name__} object"
    if not isinstance(code, str) or code not in AUTO_CODE_NAMES:
        raise ValueError(f"code={code!r} with s='auto': s='auto' places the data once for "
                         "s_max with the nested placement (NestedPlacement) and runs its "
                         f"exact codes, so {name} would not run; give a fixed s (an integer) "
                         f"to run it, or an exact code name {AUTO_CODE_NAMES} with s='auto'")
    if m is not None and m != 1:
        raise ValueError(f"m={m!r} with s='auto': the nested placement's replies are whole "
                         "models, so m would not be used; m is for code='comm-efficient' "
                         "with a fixed s (an integer)")
