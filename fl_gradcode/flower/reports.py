"""What a client reports, checked before the server acts on it.

* **Partition sizes.** A coded reply carries ``num-examples`` (``sum_j B[i,j] n_j`` over the
  worker's assigned partitions) and the sizes ``n_j`` themselves (``partition-sizes``). The
  server uses the sizes for the central-DP noise scale and the simulated load; it trusts them
  only when they are

  1. consistent with the reply's own ``num-examples`` and the round's code coefficients
     (:func:`check_reply_sizes`, on arrival: a reply that fails is rejected), and
  2. the same at every replica of a partition (:func:`agree_sizes`, once the round's replies are
     in: a majority of the replicas decides; a tie is decided by a value an earlier round
     confirmed with two or more agreeing replicas, else every replica in the tie is excluded).

  With ``s = 0`` (or when the other replicas straggle) a partition has one holder and nothing
  can contradict its report: a client may then claim any size for its *own* partition, as long
  as it also reports the matching ``num-examples``. That only changes the weight and the noise
  of its own partition (whose data it holds anyway); the other partitions' sizes come from
  their own holders, and :func:`central_noise_scale` takes the largest weight over every
  partition, so a claim can raise the noise (a huge size, e.g. ``1e15``, floods the round with
  noise: flagged by :func:`outlying_sizes`) but never lower it below what the honest
  partitions need.

* **Rejection reasons** are client-supplied text: :func:`public_reason` makes them one line of
  at most :data:`MAX_REASON_CHARS` characters before they reach the log or ``rounds.jsonl``.

* **Missing DP keys.** :func:`missing_keys` tells a round in which every reply was refused
  because the clients have no partition keys; :data:`MISSING_KEYS_HELP` says what to do.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from ..privacy import KEY_FILE_ENV, KEYED_MODES
from .protocol import RejectedReply

__all__ = [
    "MAX_REASON_CHARS",
    "MISSING_KEYS_HELP",
    "agree_sizes",
    "central_noise_scale",
    "check_reply_sizes",
    "missing_keys",
    "outlying_sizes",
    "provably_wrong_sizes",
    "public_reason",
    "untrainable",
    "untrainable_round",
]

#: Longest rejection reason (characters) written to the log and ``rounds.jsonl``.
MAX_REASON_CHARS = 500

#: Relative tolerance of the size checks (the client computes the same float64 sums).
SIZE_RTOL = 1e-9

#: A partition reporting more than this many times the median size is flagged in the log.
OUTLIER_FACTOR = 100.0

# what the mod and NoiseKeys answer when a node has no (or not the right) partition key
_MISSING_KEY_MARKERS = ("needs partition keys on the client", "has no key for partition")

MISSING_KEYS_HELP = (
    "Create a key file with `python -m fl_gradcode.privacy keygen dp-keys.json` and give it "
    "to every client: in deployment `flower-supernode ... --node-config "
    "\"dp-key-file='/path/dp-keys.json'\"` (or per-partition keys: keygen --partitions 0,1 "
    f"...); in a simulation set the environment variable {KEY_FILE_ENV} where the simulated "
    "ClientApps run, e.g. `python -m fl_gradcode.privacy keygen \"$HOME/dp-keys.json\" && "
    f"{KEY_FILE_ENV}=\"$HOME/dp-keys.json\" flwr run . --run-config \"dp='partition'\"` "
    "(a local SuperLink already running without the variable must be stopped first), or "
    "`python -m server.launch --run-config \"dp='partition'\"`, which does all of this."
)


def public_reason(text: Any, limit: int = MAX_REASON_CHARS) -> str:
    """``text`` as one line of at most ``limit`` characters: control characters (newlines
    included) and Unicode line separators escaped (``\\n``, ``\\x1b``, ``\\u2028``), and what
    does not fit cut, with a note of how much was cut."""
    text = str(text)
    head = text[: limit + 1]  # escaping only lengthens: the rest can never be shown
    escaped = "".join(_escape(ch) for ch in head)
    if len(escaped) <= limit and len(head) == len(text):
        return escaped
    note = f"... [{len(text)} characters]"
    return (escaped[: max(limit - len(note), 0)] + note)[:limit]


def _escape(ch: str) -> str:
    code = ord(ch)
    if ch == "\n":
        return "\\n"
    if ch == "\r":
        return "\\r"
    if ch == "\t":
        return "\\t"
    if code < 0x20 or 0x7F <= code < 0xA0:
        return f"\\x{code:02x}"
    if code in (0x2028, 0x2029):
        return f"\\u{code:04x}"
    return ch


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= SIZE_RTOL * max(abs(a), abs(b), 1.0)


def _show(values: Sequence[float], most: int = 8) -> str:
    shown = ", ".join(f"{v:g}" for v in list(values)[:most])
    return f"[{shown}{', ...' if len(values) > most else ''}]"


def check_reply_sizes(code: Any, worker: int, sizes: Sequence[float],
                      num_examples: float) -> None:
    """Raise :class:`~fl_gradcode.flower.protocol.RejectedReply` unless ``sizes`` (the reply's
    ``partition-sizes``) has one entry per partition ``worker`` holds and
    ``sum_j B[worker, j] n_j == num_examples`` (relative :data:`SIZE_RTOL`)."""
    assigned = list(code.assignment(worker))
    if not assigned:  # nothing to compute: the mod reports [0] and 0 examples
        if any(x != 0 for x in sizes) or num_examples != 0:
            raise RejectedReply(
                f"partition-sizes={_show(sizes)} and num-examples={num_examples:g} from a "
                "worker with no partitions (expected [0] and 0)")
        return
    if len(sizes) != len(assigned):
        raise RejectedReply(
            f"partition-sizes={_show(sizes)} has {len(sizes)} entries; worker {worker} holds "
            f"{len(assigned)} partitions")
    coefficients = np.asarray(code.encoding_coefficients(worker), dtype=np.float64)
    expected = 0.0
    for c, n in zip(coefficients.tolist(), sizes, strict=True):  # the mod's order of summation
        expected += c * float(n)
    off = abs(expected - num_examples)
    # the usual case settles without the scale (it can only widen the bound; once
    # ``expected`` is finite every term is, and the scale is never NaN)
    if not (math.isfinite(expected) and (
            off <= SIZE_RTOL * max(abs(num_examples), 1.0) or off <= SIZE_RTOL * max(
                _scale(coefficients, sizes), abs(num_examples), 1.0))):
        raise RejectedReply(
            f"partition-sizes={_show(sizes)} do not add up to num-examples={num_examples:g}: "
            f"sum_j B[i,j] n_j = {expected:g} with coefficients "
            f"{_show([float(c) for c in coefficients])}")


def _scale(coefficients: np.ndarray, sizes: Sequence[float]) -> float:
    """``sum_j |B[i,j] w_j| n_j``: the size of the terms of a reply's example count."""
    return float(np.sum(np.abs(coefficients) * np.asarray(sizes, dtype=np.float64)))


def agree_sizes(
    code: Any,
    reported: Mapping[int, Sequence[float]],
    confirmed: Mapping[int, float] | None = None,
    bound: int | None = None,
) -> tuple[dict[int, float], dict[int, str], dict[int, float]]:
    """Cross-check the sizes the replicas of each partition report.

    ``reported``: worker -> its reply's ``partition-sizes`` (already consistent with its
    ``num-examples``); ``confirmed``: code partition -> a size an earlier round confirmed.
    Returns ``(agreed, excluded, confirmed_now)``: the agreed size of every partition some
    remaining reply holds; the workers whose report was outvoted (or in an undecidable tie),
    with a reason naming the values; and the partitions at least two replicas confirmed now.

    Per partition the majority of its replicas decides. A tie (e.g. ``s = 1``: the liar and its
    one honest twin) is decided, in order: by a worker that is on one side of the tie in
    several partitions while no other worker is in as many (one wrong reply explains every
    tie it is in: a worker holding several partitions, as in cyclic codes, that misreports
    them), then by a size an earlier round confirmed; otherwise every replica in the tie is
    excluded (nothing is applied on a size nobody can confirm).

    ``bound`` (``verify=True``: the round's ``s``, the largest coalition the check must
    withstand): only what such a coalition cannot fabricate is concluded. A report is outvoted
    only by at least ``bound + 1`` agreeing replicas (one of them is honest; such workers are
    :func:`provably_wrong_sizes`); any other disagreement leaves every replica of the
    partition out of the round, blaming none (no majority of fewer, no tie rule, no earlier
    confirmation: colluders could have produced each of them).
    """
    confirmed = dict(confirmed or {})
    holders: dict[int, list[tuple[int, float]]] = {}
    for worker, sizes in reported.items():
        for j, n in zip(code.assignment(worker), sizes, strict=False):
            holders.setdefault(int(j), []).append((worker, float(n)))
    excluded: dict[int, str] = {}

    def groups_of(j: int) -> list[list[tuple[int, float]]]:
        groups: list[list[tuple[int, float]]] = []
        for worker, n in holders[j]:
            if worker in excluded:
                continue
            for group in groups:
                if _close(group[0][1], n):
                    group.append((worker, n))
                    break
            else:
                groups.append([(worker, n)])
        groups.sort(key=len, reverse=True)
        return groups

    def claims(groups: list[list[tuple[int, float]]]) -> str:
        return "; ".join(f"workers {[w for w, _ in g]} report {g[0][1]:g}" for g in groups[:6])

    if bound is not None:  # one pass: only s + 1 agreeing replicas outvote anyone
        for j in sorted(holders):
            groups = groups_of(j)
            if len(groups) <= 1:
                continue
            big = [g for g in groups if len(g) >= bound + 1]
            for group in groups:
                if len(big) == 1 and group is big[0]:
                    continue
                for worker, n in group:
                    excluded.setdefault(worker, (
                        f"partition-sizes: n_{j}={n:g} contradicts {len(big[0])} agreeing "
                        f"replicas of partition {j} ({claims(groups)})") if len(big) == 1 else (
                        f"partition-sizes: the replicas of partition {j} disagree "
                        f"({claims(groups)}) and no s + 1 = {bound + 1} of them agree: all "
                        "left out, none blamed"))
    while bound is None:
        ties: dict[int, list[list[tuple[int, float]]]] = {}
        for j in sorted(holders):
            groups = groups_of(j)
            if len(groups) <= 1:
                continue
            if len(groups[0]) > len(groups[1]):  # a majority: the others are outvoted
                for group in groups[1:]:
                    for worker, n in group:
                        excluded.setdefault(
                            worker, f"partition-sizes: n_{j}={n:g} disagrees with the other "
                            f"replicas of partition {j} ({claims(groups)})")
            else:
                ties[j] = [g for g in groups if len(g) == len(groups[0])]
        if not ties:
            break
        involved = Counter(w for tied in ties.values() for g in tied for w, _ in g)
        most = max(involved.values())
        culprits = [w for w, c in involved.items() if c == most]
        if most >= 2 and len(culprits) == 1:  # one reply explains every tie it is in
            worker = culprits[0]
            parts = sorted(j for j, tied in ties.items()
                           if any(w == worker for g in tied for w, _ in g))
            excluded[worker] = (
                f"partition-sizes: worker {worker} disagrees with another replica in each of "
                f"partitions {parts} (no other worker disagrees in as many); "
                + "; ".join(f"partition {j}: {claims(ties[j])}" for j in parts[:4]))
            continue
        for j, tied in ties.items():
            known = confirmed.get(j)
            match = [g for g in tied if known is not None and _close(g[0][1], known)]
            keep = match[0] if len(match) == 1 else None
            for group in groups_of(j):
                if group is keep or (keep is not None and group[0][1] == keep[0][1]):
                    continue
                for worker, n in group:
                    excluded.setdefault(
                        worker,
                        f"partition-sizes: n_{j}={n:g} disagrees with the other replicas of "
                        f"partition {j} ({claims(tied)})"
                        + ("" if keep is not None
                           else ": no majority, every replica in the tie excluded"))
        break
    agreed: dict[int, float] = {}
    confirmed_now: dict[int, float] = {}
    for j, values in holders.items():
        kept = [n for w, n in values if w not in excluded]
        if kept:
            agreed[j] = max(kept)  # (equal up to rounding)
            if len(kept) >= 2:
                confirmed_now[j] = agreed[j]
    return agreed, excluded, confirmed_now


def provably_wrong_sizes(code: Any, reported: Mapping[int, Sequence[float]],
                         bound: int) -> set[int]:
    """The workers whose report of some partition's size contradicts at least ``bound + 1``
    replicas that agree with each other (and no other such group exists): against a
    coalition of at most ``bound`` nodes one of those replicas is honest, so the report is
    wrong whoever colludes."""
    holders: dict[int, list[tuple[int, float]]] = {}
    for worker, sizes in reported.items():
        for j, n in zip(code.assignment(worker), sizes, strict=False):
            holders.setdefault(int(j), []).append((worker, float(n)))
    wrong: set[int] = set()
    for values in holders.values():
        groups: list[list[tuple[int, float]]] = []
        for worker, n in values:
            for group in groups:
                if _close(group[0][1], n):
                    group.append((worker, n))
                    break
            else:
                groups.append([(worker, n)])
        big = [g for g in groups if len(g) >= bound + 1]
        if len(big) == 1:
            wrong |= {w for g in groups if g is not big[0] for w, _ in g}
    return wrong


def central_noise_scale(decoding: Any, sizes: Mapping[int, float], count: float) -> float:
    """The decoded average's sensitivity to one partition's clipped update, over ``C``:
    ``max_j |alpha_j| n_j / count``, with ``n_j`` the agreed (checked) sizes.

    Partition ``j`` enters the decoded average as ``alpha_j n_j clip(u_j) / count``, so
    removing its update (zeroing it, the add/remove adjacency Opacus' accountants assume)
    moves the average by at most ``|alpha_j| n_j C / count`` (replacing it: twice that). With
    checked sizes ``count = sum_j alpha_j n_j``, so the largest term is at least
    ``count / k``: the scale is never below ``1/k`` (``k`` partitions with a nonzero
    weight), whatever a client claims about its own partition. Anything else (no size for a
    partition the decoding weighs, a non-finite or non-positive result) raises ``ValueError``:
    the round must not be released with noise sized on a guess.
    """
    alpha = np.asarray(decoding.alpha, dtype=np.float64)
    weighed = [j for j in range(alpha.size) if alpha[j] != 0.0]
    missing = [j for j in weighed if j not in sizes]
    if missing:
        raise ValueError(f"no checked size for partitions {missing[:8]} the decoding weighs")
    terms = [abs(float(alpha[j])) * float(sizes[j]) for j in weighed]
    scale = max(terms, default=0.0) / count
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"central noise scale {scale!r} from sizes "
                         f"{_show([sizes[j] for j in weighed])} and count {count:g}")
    return scale


def outlying_sizes(sizes: Mapping[int, float]) -> list[tuple[int, float, float]]:
    """``(partition, size, median)`` of the partitions reporting more than
    :data:`OUTLIER_FACTOR` times the median size (with 3 or more partitions)."""
    if len(sizes) < 3:
        return []
    median = float(np.median(list(sizes.values())))
    if median <= 0:
        return []
    return [(j, n, median) for j, n in sorted(sizes.items()) if n > OUTLIER_FACTOR * median]


def missing_keys(reasons: Iterable[str]) -> bool:
    """Whether there is at least one reason and every one says a client lacks DP keys."""
    reasons = list(reasons)
    return bool(reasons) and all(
        any(marker in reason for marker in _MISSING_KEY_MARKERS) for reason in reasons)


def untrainable_round(dp_mode: str, workers: Iterable[int],
                      rejections: Iterable[Any]) -> bool:
    """Whether a round without a valid reply ends the run as untrainable: the run's ``dp``
    keys the clients' randomness and every one of the round's ``workers`` (the cohort's, sent
    work or not) was refused (``rejections``: objects with ``worker`` and ``reason``) saying
    it lacks partition keys. A reason is the client's text: one node's (the others late,
    busy or not yet heard of), or under a dp that needs no keys, never ends a run."""
    if dp_mode not in KEYED_MODES:
        return False
    rejections = list(rejections)
    if not missing_keys(r.reason for r in rejections):
        return False
    expected = set(workers)
    return bool(expected) and expected <= {r.worker for r in rejections}


def untrainable(server_round: int, dp_mode: str) -> RuntimeError:
    """The error that ends a run whose round had every reply refused for missing DP keys."""
    return RuntimeError(
        f"round {server_round}: every reply was refused because the clients have no DP "
        f"partition keys (dp={dp_mode!r}); nothing can be trained. " + MISSING_KEYS_HELP)
