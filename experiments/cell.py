"""What every method of one cell of ``python -m experiments.compare`` shares (:class:`Cell`:
the merged run config, the scale, the target and the rivals' rules of ``experiments/grid.toml``),
and the rules that stop a coded method's late work when its round ends (:data:`STOP_RULES`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fl_gradcode.config import merge_config
from fl_gradcode.rivals.fedbuff import buffer_size

__all__ = ["STOP_RULES", "Cell", "stop_rule"]

#: The grid rules that stop a coded method's late work when its round ends (``stop-late-work
#: = "decode"``): rule -> (whose late work, who runs with a ``--set`` once it is off).
STOP_RULES = {"auto_stop_at_decode": ("auto's", "auto"),
              "codes_stop_at_decode": ("the fixed codes'", "them")}


def stop_rule(method: str) -> str | None:
    """The rule of :data:`STOP_RULES` that governs ``method``'s late work: auto's for
    ``auto`` and ``auto-approximate``, the codes' for ``CODE:s``; ``None`` for a rival."""
    if method in ("auto", "auto-approximate"):
        return "auto_stop_at_decode"
    return "codes_stop_at_decode" if ":" in method else None



@dataclass(frozen=True)
class Cell:
    """What every method of one comparison shares: the merged run config (seed aside), the
    number of nodes, the cohort, the rounds, the target accuracy and the rivals' rules
    (``[rules]`` of ``experiments/grid.toml``, their one place: ``registry.grid_cell``)."""

    run_config: Mapping[str, Any]
    n: int
    cohort: int
    rounds: int
    target: float
    overcommit: float
    fedbuff_buffer_fraction: float
    fedbuff_server_lr: float
    fedbuff_staleness_exponent: float
    #: 1: the deadline rivals and first-k stop a dropped client's work when its round ends
    rivals_stop_dropped_work: float
    #: 1: auto and auto-approximate stop a client's late work when their round ends
    #: (``stop-late-work = "decode"``); 0: at the round's deadline
    auto_stop_at_decode: float
    #: 1: FedBuff's server lr and buffer are tuned on the development seeds
    #: (``experiments.fedbuff_tuning``); 0: the two values above
    fedbuff_tune: float
    #: 1: first-k's over-commitment is tuned on the development seeds
    #: (``experiments.first_k_tuning``); 0: ``overcommit`` as it is
    first_k_tune: float = 0.0
    #: 1: the fixed codes (``CODE:s``) stop a client's late work when their round ends, as
    #: auto's do (``stop-late-work = "decode"``); 0: at the round's deadline (the default, as
    #: runs before the grid file's amendment 19)
    codes_stop_at_decode: float = 0.0
    #: how many times deadline-best's grid grows past an edge pick (0: the grid only)
    deadline_grid_extend: float = 0.0
    #: 1: each fixed code stops waiting at the stated deadline rule applied to its own client
    #: times (its runs on the development seeds whose deadline never binds); 0: at the
    #: cell's stated deadline, read from wait-for-all's (as runs before the grid file's
    #: amendment 21)
    codes_own_deadline: float = 0.0

    def __post_init__(self) -> None:
        self.check_stop_rules(("auto",))

    def check_stop_rules(self, methods: Sequence[str]) -> None:
        """A ``ValueError`` where a ``--set stop-late-work`` contradicts the rule that stops
        the late work of auto or of one of ``methods`` at the round's end
        (:func:`stop_rule`), or where a fixed code of ``methods`` would read its own
        deadline (``codes_own_deadline``) from runs whose late work is not stopped."""
        given = self.run_config.get("stop-late-work")
        if given not in (None, "decode"):
            for rule in dict.fromkeys(stop_rule(m) for m in ("auto", *methods)):
                if rule is not None and getattr(self, rule):
                    whose, them = STOP_RULES[rule]
                    raise ValueError(f"--set stop-late-work={given!r} contradicts the rule "
                                     f"{rule} ({whose} late work stops at the round's end): "
                                     f"add --rule {rule}=0 to run {them} with the value set")
        if (self.codes_own_deadline and any(stop_rule(m) == "codes_stop_at_decode"
                                            for m in methods)
                and not self.stops_at_decode("codes_stop_at_decode")):
            # else a client still computing after a round gets no work in the next one
            # (busy = skip), and the slow clients' times go missing from what the rule reads
            raise ValueError("the rule codes_own_deadline reads each fixed code's client "
                             "times from runs where every client gets work each round: it "
                             "needs codes_stop_at_decode=1 (or --set stop-late-work=decode); "
                             "add --rule codes_own_deadline=0 to run the codes at the stated "
                             "deadline")

    def stops_at_decode(self, rule: str) -> bool:
        """The late work of the methods ``rule`` governs (:data:`STOP_RULES`) stops at the
        round's end: by the rule, or by a ``--set``."""
        return bool(getattr(self, rule)) or self.run_config.get("stop-late-work") == "decode"

    @property
    def auto_stops_at_decode(self) -> bool:
        """auto's late work stops at the round's end: by the rule, or by a ``--set``."""
        return self.stops_at_decode("auto_stop_at_decode")

    def config(self, seed: int, **extra: Any) -> dict[str, Any]:
        """The run config of one run: the cell's keys, ``seed``, the rounds, the cohort as
        ``fraction-train`` (Flower samples ``int(n * fraction)``: +0.5 guards the rounding)
        and ``extra``; unknown keys and wrong types are refused by ``merge_config``."""
        fraction = 1.0 if self.cohort >= self.n else (self.cohort + 0.5) / self.n
        return merge_config({**self.run_config, "seed": int(seed), "num-rounds": self.rounds,
                             "fraction-train": fraction, "timing": "virtual",
                             "num-clients": self.n, "results-dir": "", **extra})

    @property
    def private(self) -> bool:
        """Whether the cell's runs apply DP (run-config ``dp`` other than ``none``): its
        plain Flower rivals cannot, and its wait-for-all is the wrapper with the identity
        code (``uncoded:0``, no deadline), which applies the same DP."""
        return str(self.config(0)["dp"]) != "none"

    def first_k(self) -> int:
        """``K`` of first-k: the cohort when ``ceil(c K)`` nodes exist, else ``floor(n / c)``."""
        if math.ceil(self.overcommit * self.cohort - 1e-9) <= self.n:
            return self.cohort
        return max(1, int(self.n / self.overcommit + 1e-9))

    def fedbuff_buffer(self) -> int:
        return buffer_size(self.fedbuff_buffer_fraction, self.cohort)

    def fedbuff_steps(self) -> int:
        """Server steps with as many client updates as ``rounds`` synchronous rounds: the
        fewest steps of ``K`` updates that take ``rounds * cohort`` updates (fewer than ``K``
        more where ``K`` does not divide it; ``rounds * ceil(cohort / K)`` gave up to
        ``rounds * (K - 1)`` more)."""
        return math.ceil(self.rounds * self.cohort / self.fedbuff_buffer() - 1e-9)
