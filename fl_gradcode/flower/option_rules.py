"""The rules of ``GradientCoding``'s options that span groups, each written once.

:meth:`~fl_gradcode.flower.options.Options.from_keywords` maps the flat keywords onto the
groups; every check or default that reads more than one group is here:

* ``s="auto"``: the code is the nested placement; the fixed ``s`` the wrapper reports is
  ``s_max`` (1 when ``s_max`` is ``None``); ``exclude_slow`` needs it.
* ``busy=None``: ``"queue"`` with ``s="auto"``, ``"skip"`` otherwise (always ``"skip"``
  under wallclock timing: the grid waits for busy members' earlier replies); ``"queue"`` or
  ``"fit"`` asked for under wallclock timing is refused.
* ``stop_late_work="auto"``: on for ``s="auto"`` with busy clients given queued work;
  ``auto_deadline`` (needs ``s="auto"`` or ``busy="fit"``, and virtual timing) implies it;
  ``"decode"`` (virtual timing only) stops work at the round's end, decode or deadline.
* ``auto_approximate`` needs virtual timing.
* ``code="nested"`` with a fixed ``s`` and ``s_max``: the placement's ``s_max`` enters the
  code's options; ``m`` enters them as ``m`` (:mod:`~fl_gradcode.flower.code_options`). A
  ``code_options`` entry that contradicts either keyword is refused.
* ``verify=True`` is refused for codes it cannot check
  (:func:`~fl_gradcode.flower.integrity.verify_refusal`) and, under ``s="auto"``, with the
  options whose rounds it cannot settle (:func:`~fl_gradcode.flower.settle.auto_refusal`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .clock import clock_class
from .integrity import verify_refusal
from .option_values import number
from .settle import auto_refusal

__all__ = ["BUSY_MODES", "check_adaptive_keywords", "refuse_unverifiable", "resolve_busy",
           "resolve_s", "resolve_stop_late_work"]

BUSY_MODES = ("skip", "queue", "fit")


def resolve_s(auto: bool, s: Any, s_max: int | None) -> Any:
    """The fixed ``s`` an ``s="auto"`` run reports: ``s_max``, 1 when it is ``None``."""
    if auto:
        return s_max if s_max is not None else 1
    return s


def resolve_busy(busy: str | None, adaptive: bool, timing: str) -> str:
    """``busy`` checked and resolved by the module docstring's rule; then what the ``timing``
    mode's clock runs (wallclock: no queue: :meth:`~fl_gradcode.flower.clock.Clock.busy_mode`).
    A mode asked for explicitly that the clock would not run is refused, never replaced."""
    if busy not in (None, *BUSY_MODES):
        raise ValueError(f"busy={busy!r}; expected 'skip', 'queue', 'fit' or None")
    runs = clock_class(timing).busy_mode(busy or ("queue" if adaptive else "skip"))
    if busy is not None and runs != busy:
        raise ValueError(f"busy={busy!r} with timing={timing!r}: {timing} rounds run "
                         f"busy={runs!r} (the grid waits for a busy member's earlier reply; "
                         "work is not queued behind it); give busy='skip', leave busy unset, "
                         "or use timing='virtual'")
    return runs


def check_adaptive_keywords(*, auto: bool, s: Any, busy: str | None, timing: str,
                            auto_deadline: float | None, exclude_slow: float | None,
                            auto_approximate: bool) -> None:
    """Refuse ``auto_deadline``, ``exclude_slow`` and ``auto_approximate`` where nothing
    would honour them (``busy`` as given, before :func:`resolve_busy`)."""
    if auto_deadline is not None:
        if not (auto or busy == "fit"):
            raise ValueError(f"auto_deadline={auto_deadline!r} needs s='auto' or busy='fit' "
                             f"(a prediction of the round's time; got s={s!r}, "
                             f"busy={busy!r})")
        if timing != "virtual" and number(auto_deadline) and auto_deadline >= 1:
            raise ValueError(f"auto_deadline={auto_deadline!r} needs timing='virtual' (got "
                             f"timing={timing!r}: wallclock rounds give the estimator no "
                             "latencies to predict a deadline from)")
    if exclude_slow is not None and not auto:
        raise ValueError(f"exclude_slow={exclude_slow!r} needs s='auto' (got s={s!r})")
    if auto_approximate and timing != "virtual":
        raise ValueError(f"auto_approximate=True needs timing='virtual' (got timing="
                         f"{timing!r}: a round's deadline is planned from the predicted "
                         "reply times)")


def resolve_stop_late_work(stop_late_work: bool | str, *, auto: bool, busy: str,
                           auto_deadline: float | None) -> bool | str:
    """``stop_late_work`` by the module docstring's rule (``busy`` resolved)."""
    if stop_late_work is False and auto_deadline is not None:
        raise ValueError(f"stop_late_work=False contradicts auto_deadline={auto_deadline!r}"
                         " (its work stops at its deadline); give one of them")
    if stop_late_work == "auto":  # queued work behind stale work snowballs at deadlines
        stop_late_work = auto and busy in ("queue", "fit")
    if isinstance(stop_late_work, bool):
        return stop_late_work or auto_deadline is not None
    return stop_late_work


def refuse_unverifiable(*, verify: bool, code: Any, s: Any, options: Mapping[str, Any],
                        auto: bool, exclude_slow: float | None,
                        auto_approximate: bool) -> None:
    """``verify=True`` with a code or ``s="auto"`` options it cannot check: refused."""
    if not verify:
        return
    refusal = verify_refusal(code, s, options) or (
        auto_refusal(exclude_slow, auto_approximate) if auto else None)
    if refusal is not None:
        raise ValueError(refusal)
