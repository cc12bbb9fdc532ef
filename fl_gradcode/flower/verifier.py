"""The one owner of a round's integrity: what its replicas prove, and what may be applied.

:class:`RoundVerifier` builds each round's secret probe
(:func:`~fl_gradcode.flower.integrity.round_probe`), cross-checks the replicas' partition sizes
(:meth:`~RoundVerifier.check_sizes`: outvoted replies are offences, contested ones left out),
answers the stopping rule (a decodable set; with ``verify``, one whose blocks settled:
:mod:`~fl_gradcode.flower.settle`), cross-checks the replies the clock's window used
(:meth:`~RoundVerifier.cross_check`: :func:`~fl_gradcode.flower.integrity.verify_replies`, or
:func:`~fl_gradcode.flower.settle.settle_replies` with ``verify``) and clears the decoding
actually applied (:meth:`~RoundVerifier.clearance`). Offences go to the quarantine.

The decodability is gradient coding's (Tandon, Lei, Dimakis, Karampatziakis, "Gradient Coding",
ICML 2017, https://arxiv.org/abs/1612.03301); groups of replicas and their agreement follow
DRACO (Chen, Wang, Charles, Papailiopoulos, ICML 2018, https://arxiv.org/abs/1803.09877).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from logging import WARNING
from types import MappingProxyType
from typing import Any

from flwr.common.logger import log

from ..codes import Decoding, GradientCode
from ..privacy import DPConfig, ServerNoise
from .blas import serial_blas
from .deadline_policy import DeadlinePolicy
from .integrity import (
    Probe,
    Verdict,
    applied_disagreement,
    reply_sizes,
    round_probe,
    verify_replies,
)
from .options import IntegrityOptions
from .privatiser import Privatiser
from .quarantine import Quarantine
from .reports import provably_wrong_sizes
from .round_state import Rejection, RoundState, is_chunked, rejection
from .settle import placement_refusal, settle_replies

__all__ = ["RoundVerifier", "SizeCheck", "Verification"]


@dataclass(frozen=True)
class SizeCheck:
    """The replicas' partition sizes cross-checked (owner: the verifier): ``sizes``, the agreed
    size of each code partition; ``dropped``, the workers whose replies leave the round (the
    outvoted ones, rejected in ``rejections``, and the contested ones, ``left_out``)."""

    sizes: Mapping[int, float]
    dropped: frozenset[int] = frozenset()
    left_out: tuple[int, ...] = ()
    rejections: tuple[Rejection, ...] = ()


@dataclass(frozen=True)
class Verification:
    """The cross-check of the window's replies (owner: the verifier): the ``used`` replies it
    kept, its ``verdict`` (``None``: not cross-checked)."""

    used: tuple[int, ...]
    verdict: Verdict | None


class RoundVerifier:
    """What a round's replicas prove (one job: integrity; module docstring).

    ``integrity``: ``verify`` and ``verify_tolerance``; ``deadlines``: the replies that end a
    round (``min_replies``); ``quarantine``: where offences go; ``privatiser``: keeps the
    checked partition sizes (``None``: a privatiser of its own, without noise)."""

    def __init__(self, integrity: IntegrityOptions, deadlines: DeadlinePolicy,
                 quarantine: Quarantine, privatiser: Privatiser | None = None) -> None:
        self.integrity, self.deadlines, self.quarantine = integrity, deadlines, quarantine
        self.privatiser = privatiser if privatiser is not None else Privatiser(
            DPConfig(), None, ServerNoise(), "")
        self.warned_unverifiable = False
        self.warned_placement = False
        #: the round last opened has blocks verify never settles (its code's placement)
        self.unsettled_placement = False
        #: some round's blocks could all be settled
        self.checked_a_cohort = False

    @property
    def verify(self) -> bool:
        return self.integrity.verify

    # ------------------------------------------------------------------ opening
    def probe_for(self, round_number: int, code: GradientCode,
                  reply_layout: Mapping[str, tuple[int, ...]],
                  code_options: Mapping[str, Any]) -> Probe | None:
        """The round's integrity probe (:func:`~fl_gradcode.flower.integrity.round_probe`;
        ``None``: not checked). With ``verify``, a round without redundancy is warned once."""
        verify = self.integrity.verify
        probe = round_probe(code, dict(reply_layout), verify, dict(code_options))
        if verify and probe is None and not self.warned_unverifiable:
            log(WARNING, "verify=True: round %d uses s=0 (no redundancy): such rounds are "
                "applied unverified (verified=None in rounds.jsonl)", round_number)
            self.warned_unverifiable = True
        why = placement_refusal(code) if verify and probe is not None else None
        self.unsettled_placement = why is not None
        if why is None and probe is not None:
            self.checked_a_cohort = True
        if why is not None and not self.warned_placement:
            log(WARNING, "verify=True: round %d uses code %s for %d clients and %s: such "
                "blocks are never settled and are left out of the decoding (choose a cohort "
                "size that s + 1 divides)", round_number, code.name, code.n, why)
            self.warned_placement = True
        return probe

    # ------------------------------------------------------------------ the stopping rule
    def stopping_rule(self, state: RoundState | None, code: GradientCode
                      ) -> Callable[[list[int]], bool]:
        """The stopping rule of ``state``'s round: ``min_replies`` (or ``n - s`` for
        approximate codes) valid replies, or a decodable set (with ``verify``: one the
        cross-check verified)."""
        enough = self.deadlines.stopping_replies(code)

        def check(workers: list[int]) -> bool:
            if enough is not None and len(workers) >= enough:
                return True
            if not self.integrity.verify or state is None or state.probe is None:
                return bool(workers) and code.is_decodable(workers)
            return bool(workers) and self.settled(state, workers)

        def rule(workers: list[int]) -> bool:
            with serial_blas():
                return check(workers)

        return rule

    def settled(self, state: RoundState, workers: list[int]) -> bool:
        """``verify=True``'s stopping rule: some block settled, and every block that still
        can has (:mod:`~fl_gradcode.flower.settle`): ``s + 1`` of its workers were sent work
        and not rejected, and some of them are still to come."""
        verdict = self.verdict(state, workers)
        if verdict.status != "verified":
            return False
        done = set(workers) - set(verdict.unsettled) - set(verdict.excluded)
        sent, answered, valid = state.sent, state.answered, state.valid
        for clients, _ in state.code.blocks:
            possible = [w for w in clients if w in sent
                        and not (w in answered and w not in valid)]
            if (len(possible) >= state.code.s + 1 and not done.intersection(clients)
                    and not set(possible) <= set(workers)):
                return False
        return True

    def verdict(self, state: RoundState, workers: list[int]) -> Verdict:
        """The integrity cross-check of ``workers``' replies (cached per round)."""
        assert state.probe is not None, "a round without a probe is not cross-checked"
        valid = state.valid
        z = {w: valid[w].extra["z"] for w in workers}
        sizes = reply_sizes({w: valid[w].extra for w in workers})
        check = settle_replies if self.integrity.verify else verify_replies
        return check(state.code, z, workers, self.integrity.verify_tolerance,
                     sizes, cache=state.probe.verdicts)

    # ------------------------------------------------------------------ the phases
    def check_sizes(self, state: RoundState) -> RoundState:
        """Cross-check the replicas' ``partition-sizes``: outvoted replies are rejected (an
        offence); the agreed sizes are the round's. With ``verify``, only ``s + 1`` agreeing
        replicas outvote a report, and only such a provably wrong report is an offence."""
        valid = state.valid
        reported = {w: r.sizes for w, r in valid.items()}
        bound = state.code.s if self.integrity.verify else None
        agreed, excluded = self.privatiser.check_sizes(
            state.code, list(state.partitions), reported, state.number, bound=bound)
        offenders = sorted(excluded) if bound is None else sorted(
            set(excluded) & provably_wrong_sizes(state.code, reported, bound))
        rejections, left_out = [], []
        for worker, reason in sorted(excluded.items()):
            if worker in offenders:
                rejections.append(rejection(state.number, state.cohort[worker], worker, reason))
            else:  # contested, not provably wrong: left out of the round like its group
                left_out.append(worker)
                log(WARNING, "round %d: worker %d (node %s) left out: %s", state.number,
                    worker, state.cohort[worker], reason)
        self.quarantine.offend(state.number, [state.cohort[w] for w in offenders],
                               "partition sizes the other replicas contradict")
        check = SizeCheck(MappingProxyType(dict(agreed)), frozenset(excluded), tuple(left_out),
                          tuple(rejections))
        return dataclasses.replace(state, sizes_check=check)

    def cross_check(self, state: RoundState) -> RoundState:
        """The replies of the clock's window left after the integrity cross-check excluded the
        inconsistent ones (their nodes, and those of an unresolved contradiction few enough
        to be one replica group, offend the quarantine), and its verdict (``None``: not
        checked)."""
        assert state.closing is not None, "the cross-check follows the round's window"
        used = sorted(state.closing.window.used)
        verdict = None
        if state.probe is not None and len(used) > int(not self.integrity.verify):
            with serial_blas():
                verdict = self.verdict(state, used)
            if self.integrity.verify:
                used, verdict = self._settle(state, used, verdict)
            else:
                used = self._exclude(state, used, verdict)
                verdict = dataclasses.replace(verdict, proven=False)
        return dataclasses.replace(state, verification=Verification(tuple(used), verdict))

    def _exclude(self, state: RoundState, used: list[int], verdict: Verdict) -> list[int]:
        """``verify=False``: the replies the heuristics did not exclude."""
        used = [w for w in used if w not in verdict.excluded]
        for w in verdict.excluded:
            log(WARNING, "round %d: worker %d (node %s) contradicts the other replicas; "
                "excluded", state.number, w, state.cohort[w])
        self.quarantine.offend(state.number, [state.cohort[w] for w in verdict.excluded],
                               "excluded as inconsistent")
        # an unlocatable contradiction is an offence of those involved only when they are
        # few enough to be one replica group (FRC twins with s = 1); a contradiction
        # spread over a cyclic code's whole block says nothing about who is wrong
        if len(verdict.involved) <= state.code.s + 1:
            self.quarantine.offend(state.number, [state.cohort[w] for w in verdict.involved],
                                   "in a contradiction no single exclusion explains")
        return used

    def _settle(self, state: RoundState, used: list[int],
                verdict: Verdict) -> tuple[list[int], Verdict]:
        """``verify=True``: the replies of the settled blocks; provably wrong replies are
        offences, unsettled blocks are left out and nobody in them is blamed."""
        for w in verdict.excluded:
            log(WARNING, "round %d: worker %d (node %s) contradicts s + 1 = %d agreeing "
                "replicas; excluded", state.number, w, state.cohort[w], state.code.s + 1)
        self.quarantine.offend(state.number, [state.cohort[w] for w in verdict.excluded],
                               "contradicted by s + 1 agreeing replicas")
        if verdict.unsettled:
            log(WARNING, "round %d: workers %s: no s + 1 = %d agreeing replicas settle their "
                "group (disagreement %.3g, or replies missing); left out of the decoding, "
                "nobody blamed", state.number, verdict.unsettled, state.code.s + 1,
                verdict.disagreement)
        drop = set(verdict.excluded) | set(verdict.unsettled)
        verdict = dataclasses.replace(
            verdict, unsettled=sorted(set(verdict.unsettled) | set(state.left_out)))
        return [w for w in used if w not in drop], verdict

    def clearance(self, state: RoundState, used: list[int], decoding: Decoding | None,
                  verdict: Verdict | None, decode: str) -> tuple[Verdict | None, bool]:
        """``(verdict, withheld)`` for the decoding about to be applied: a verified round's
        decoding must agree with the replicas too
        (:func:`~fl_gradcode.flower.integrity.applied_disagreement`; if not, the verdict
        becomes an unresolved contradiction); nothing may be applied (``withheld``) when the
        replies contradict each other unresolved, or with ``verify`` a decodable round's
        replies were not all cross-checked in time."""
        if (verdict is not None and verdict.status == "verified" and decoding is not None
                and not is_chunked(state.code)):
            valid = state.valid
            z = {w: valid[w].extra["z"] for w in used}
            sizes = reply_sizes({w: valid[w].extra for w in used})
            with serial_blas():
                off = applied_disagreement(state.code, z, used, decoding.coefficients, sizes)
            if not off <= self.integrity.verify_tolerance:  # NaN/inf: never agreement
                verdict = dataclasses.replace(verdict, status="contradicted", unresolved=True,
                                              disagreement=max(verdict.disagreement, off))
        if verdict is not None and verdict.unresolved:
            log(WARNING, "round %d: replies disagree (relative %.3g) and no single reply "
                "explains it; nothing is applied", state.number, verdict.disagreement)
            return verdict, True
        if self.integrity.verify and state.probe is not None and decode != "skipped" and (
                verdict is None or verdict.status != "verified"):
            log(WARNING, "round %d: verify=True and the replies could not all be cross-checked "
                "before the deadline; nothing is applied", state.number)
            return verdict, True
        return verdict, False
