"""A registry code for a cohort size: the code asked for, or the nearest code that takes the
size and why (:class:`Fallback`, a string that also carries its parts).

A round codes its cohort members' own data, so every code built here has one partition per
member (``k = n``). Fractional repetition (Tandon et al., ICML 2017) needs ``(s + 1) | n``;
the grouped Reed-Solomon code (Halbawi et al., ISIT 2018) is exact for every ``s < n`` with
the same load and is the first fallback for an exact code.
"""

from __future__ import annotations

from typing import Any

from . import available_codes, make_code
from .base import GradientCode
from .option_checks import CodeOptionError

__all__ = ["EXACT_FALLBACK", "Fallback", "code_for_cohort"]


class Fallback(str):
    """Why :func:`code_for_cohort` built another code than the one asked for.

    The text (``"REASON; using CODE with s=S for cohorts of N"``, as logged) is the string
    itself; its parts are attributes, so a caller rewording it need not parse it:
    ``reason`` (why the code asked for was not built), ``code`` (what was built, as shown,
    e.g. ``"grouped-rs (without its float32 error budget)"``), ``s`` and ``n``.
    """

    reason: str
    code: str
    s: int
    n: int

    def __new__(cls, reason: str, code: str, s: int, n: int) -> Fallback:
        self = super().__new__(cls, f"{reason}; using {code} with s={s} for cohorts of {n}")
        self.reason, self.code, self.s, self.n = reason, code, int(s), int(n)
        return self

    def __reduce__(self) -> tuple[Any, ...]:  # pickles (Ray) with its parts
        return (Fallback, (self.reason, self.code, self.s, self.n))


#: Codes that are exact for every ``(n, s)`` with ``s < n``, used when ``frc`` (which needs
#: ``(s+1) | n``) cannot take a cohort size: same tolerance ``s``, same load ``s + 1``.
EXACT_FALLBACK = "grouped-rs"


def _build(name: str, n: int, s: int, seed: int, options: dict[str, Any]) -> GradientCode:
    """``make_code`` for a cohort whose clients hold their own data: a code with one partition
    per client (``k = n``). comm-efficient is built with ``own_partitions`` (its groups own
    their members' partitions: the same code when ``s + m`` divides ``n``); any other code
    with ``k != n`` raises ``ValueError`` (its ``k`` partitions would be the data split
    another way than the clients')."""
    if name == "comm-efficient":  # (an own_partitions=False given is kept, and refused below)
        options = {"own_partitions": True, **options}
    code = make_code(name, n=n, s=s, seed=seed, **options)
    if code.k != n:
        raise ValueError(f"it has k={code.k} partitions, not one per client")
    return code


def code_for_cohort(
    spec: str | GradientCode, n: int, s: int, seed: int, options: dict[str, Any]
) -> tuple[GradientCode, Fallback | None]:
    """``(code, why)``: the code ``spec`` for a cohort of ``n`` with ``s`` stragglers, or the
    nearest code that takes ``n`` and why it was chosen (``None``: ``spec`` itself).

    Every code returned has one partition per member (``k = n``): a round codes the
    members' own data. comm-efficient whose ``s + m`` does not divide ``n`` keeps its ``s``
    and ``m`` with groups that own their members' partitions (some groups larger:
    ``CommunicationEfficientCode(own_partitions=True)``). In order, the first that builds
    with ``k = n``: ``spec`` with ``s``; for an exact code (``frc``, ``crc``, ``grouped-rs``)
    or a ``GradientCode`` built for another size, ``grouped-rs`` with ``s`` (exact for every
    ``n``, the same tolerance and load; if it has ``k < n``, without its float32 budget),
    the nested code with ``s``, then comm-efficient with ``m = 1`` and ``s`` (fractional
    repetition in groups of ``s + 1`` or more, exact for every ``s < n``); ``spec`` with the
    largest smaller ``s`` it takes;
    ``uncoded`` (``s = 0``). An ``s`` of ``n`` or more is first capped at ``n - 1`` (the most
    a cohort of ``n`` can lose and still reply), which ``why`` says. A ``GradientCode``
    whose ``n`` is the cohort size is used as is (the strategy refuses one with ``k != n``).
    """
    if isinstance(spec, GradientCode):
        if spec.n == n:
            return spec, None
        name = spec.name if spec.name in available_codes() else EXACT_FALLBACK
        why = f"the code was built for n={spec.n} clients but the cohort has {n}"
        kept = {"m": spec.m} if name == "comm-efficient" else {}  # its reply length
        return _first_buildable(name, n, min(spec.s, n - 1), seed, kept, why, exact=True)
    if spec not in available_codes():  # a bad name is the user's to fix, for any cohort
        raise ValueError(f"unknown code {spec!r}; expected one of {available_codes()}")
    capped = (f"s={int(s)} stragglers cannot be tolerated with a cohort of {n} (at most "
              f"{n - 1})" if int(s) >= n else None)
    s = min(int(s), n - 1)
    try:
        code = _build(spec, n, s, seed, options)
    except ValueError as exc:
        if isinstance(exc, CodeOptionError) or isinstance(exc.__cause__, TypeError):
            raise  # an option no cohort could take, or one the code does not take
        why = f"code={spec!r} with s={s} cannot take a cohort of {n} ({exc})"
        if capped is not None:
            why = f"{capped}; {why}"
        exact = spec in ("frc", "crc", EXACT_FALLBACK)
        return _first_buildable(spec, n, s, seed, options, why, exact=exact, tried_spec=True)
    if capped is not None:
        return code, Fallback(capped, spec, s, n)
    return code, None


def _first_buildable(
    name: str, n: int, s: int, seed: int, options: dict[str, Any], why: str, *,
    exact: bool, tried_spec: bool = False,
) -> tuple[GradientCode, Fallback]:
    candidates: list[tuple[str, int, dict[str, Any]]] = []
    if not tried_spec:
        candidates.append((name, s, options))
    if exact and name != EXACT_FALLBACK:
        candidates.append((EXACT_FALLBACK, s, {}))
    if exact:  # the same tolerance, one partition per client: grouped-rs without its float32
        # budget (replies in float64), the nested code (spare clients raise the load), then
        # fractional repetition in groups of s + 1 or more (every s < n; load up to n)
        candidates.append((EXACT_FALLBACK, s, {"max_relative_amplification": None}))
        candidates.append(("nested", s, {}))
        candidates.append(("comm-efficient", s, {"m": 1}))
    candidates += [(name, smaller, options) for smaller in range(s - 1, -1, -1)]
    candidates.append(("uncoded", 0, {}))
    for cand, cand_s, opts in candidates:
        try:
            code = _build(cand, n, cand_s, seed, opts)
        except ValueError:
            continue
        shown = f"{cand} with m=1" if cand != name and opts.get("m") == 1 else cand
        if "max_relative_amplification" in opts:
            shown += " (without its float32 error budget)"
        return code, Fallback(why, shown, cand_s, n)
    raise ValueError(f"{why}; no fallback code takes a cohort of {n}")  # pragma: no cover
