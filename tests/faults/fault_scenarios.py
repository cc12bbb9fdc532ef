"""The scenarios of ``tests/faults/fault_injection.py``: the fault kinds, the ``Scenario`` plan
drawn from the suite seed (``make_scenario``), and the independent numpy FedAvg oracle the
invariants compare with (the partitions' optima, example counts and initial model, ``oracle``,
``flat_model``), with the seeded stream of each fault draw (``rng_for``) and the scenario's node
ids (``node_ids_for``).

A scenario is a pure function of ``(suite seed, index)``; with ``edge_faults`` the kinds of
``tests/faults/fault_kinds.py`` are drawn from their own streams on top (the other faults are
the same).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np

from fl_gradcode.flower.integrity import verify_refusal
from tests.faults import fault_kinds as edges
from tests.faults import fault_replies as replies
from tests.faults.fault_kinds import EDGE_FORGING

SHAPES = {"w": (3, 4), "b": (4,)}
LR = 0.5

CODES = ("frc", "grouped-rs", "crc", "expander", "ignore-stragglers", "uncoded")
SIZES = (5, 6, 8, 9)

# ------------------------------------------------------------------ fault kinds
APP_FAULTS = ("error", "exception", "nan")  # inside the app (exception: app or outer mod)
MOD_FAULTS = (
    "inf",
    "wrong-shape",
    "wrong-dtype",
    "missing-records",
    "corrupt-bytes",
    "wrong-metric-type",
    "replay",
    "forged-worker",
)
VALUE_FORGING = ("huge", "scaled", "forged-consistent", "replay-forged")
#: Every forging kind the invariants treat as a value forgery (coalitions included).
FORGING = VALUE_FORGING + EDGE_FORGING + edges.COALITION_FORGING
GRID_FAULTS = ("crash", "duplicate", "unknown-sender", "spoofed-sender")
NODE_FAULTS = APP_FAULTS + MOD_FAULTS + VALUE_FORGING + GRID_FAULTS
ROUND_FAULTS = ("all-slow", "all-busy")
ALL_FAULTS = NODE_FAULTS + ROUND_FAULTS

REASONS = replies.REASONS
REJECTED = tuple(REASONS)  # never decoded


# ------------------------------------------------------------------ scenarios
@dataclass
class Scenario:
    index: int
    seed: int
    n: int
    code: str
    s: int
    timing: str  # "virtual" or "wallclock"
    verify: bool
    rounds: int
    straggler_timeout: float
    max_decode_error: float = 0.5
    node_faults: dict[tuple[int, int], str] = field(default_factory=dict)  # (round, node)
    round_faults: dict[int, str] = field(default_factory=dict)
    variants: dict[tuple[int, int], int] = field(default_factory=dict)  # (round, node) -> form
    # edge faults (fault_kinds): late joiners (node -> first round), false identity claims
    # (node -> (partition-id, num-partitions)), a wider model, a pause between rounds
    joins: dict[int, int] = field(default_factory=dict)
    claims: dict[int, tuple[int, int]] = field(default_factory=dict)
    wide: bool = False
    round_gap_s: float = 0.0
    # membership faults: the strategy gets the operator's roster / num_partitions=n
    roster: bool = False
    num_partitions: bool = False
    coalition: tuple[tuple[int, ...], int] | None = None  # (colluders, victim)

    def describe(self) -> str:
        return (
            f"scenario #{self.index} (seed={self.seed}, n={self.n}, code={self.code}, s={self.s}, "
            f"timing={self.timing}, verify={self.verify}, rounds={self.rounds})"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index, "seed": self.seed, "n": self.n, "code": self.code, "s": self.s,
            "timing": self.timing, "verify": self.verify, "rounds": self.rounds,
            "straggler_timeout": self.straggler_timeout,
            "max_decode_error": self.max_decode_error,
            "node_faults": {f"{r},{i}": k for (r, i), k in sorted(self.node_faults.items())},
            "round_faults": {str(r): k for r, k in sorted(self.round_faults.items())},
            **({"joins": {str(k): v for k, v in sorted(self.joins.items())}} if self.joins else {}),
            **({"claims": {str(k): list(v) for k, v in sorted(self.claims.items())}}
               if self.claims else {}),
            **({"wide": True} if self.wide else {}),
            **({"roster": True} if self.roster else {}),
            **({"num_partitions": True} if self.num_partitions else {}),
            **({"coalition": [list(self.coalition[0]), self.coalition[1]]}
               if self.coalition else {}),
        }

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """The model's arrays and shapes (a wider model for forgers that need unprobed
        coordinates)."""
        return {**SHAPES, edges.WIDE_ARRAY[0]: edges.WIDE_ARRAY[1]} if self.wide else SHAPES


def frc_s_values(n: int) -> list[int]:
    return [s for s in range(5) if s < n and n % (s + 1) == 0]


def make_scenario(suite_seed: int, index: int, edge_faults: bool = False) -> Scenario:
    """Scenario ``index`` of the suite with seed ``suite_seed`` (a pure function of both);
    ``edge_faults``: with the fault kinds of ``fault_kinds`` too, drawn from their own stream
    (the other faults are the same)."""
    rng = np.random.default_rng([suite_seed, index, 0xFA17])
    n = int(rng.choice(SIZES))
    code = str(rng.choice(CODES))
    if code == "frc":
        s = int(rng.choice([s for s in frc_s_values(n) if s > 0] or [0]))
    else:
        s = int(rng.choice([0, 1, 1, 2, 2, 3]))
    if code == "uncoded":  # it tolerates none (a larger s is refused); drawn all the same
        s = 0
    timing = "wallclock" if rng.random() < 0.1 else "virtual"
    rounds = int(rng.choice([3, 4]))
    scn = Scenario(
        index=index,
        seed=int(rng.integers(2**31 - 1)),
        n=n,
        code=code,
        s=s,
        timing=timing,
        # (drawn for every code, so the stream is unchanged; codes verify refuses get False)
        verify=bool(rng.random() < 0.5) and verify_refusal(code, s, {}) is None,
        rounds=rounds,
        straggler_timeout=0.25 if timing == "wallclock" else float(rng.choice([5.0, 10.0, 20.0])),
        max_decode_error=float(rng.choice([0.2, 0.5])),
    )
    rate = float(rng.uniform(0.02, 0.2))
    max_forgers = max(1, s)
    for r in range(1, rounds + 1):
        # wallclock round 1 has the start-up deadline: no all-slow / all-busy there
        if rng.random() < 0.1 and (timing == "virtual" or r > 1):
            scn.round_faults[r] = str(rng.choice(ROUND_FAULTS))
        forgers, replays = 0, 0
        for node in range(n):
            if rng.random() >= rate:
                continue
            kind = str(rng.choice(NODE_FAULTS))
            if kind in VALUE_FORGING:
                # redundancy detects generic forgeries by at most s replies; identical ones
                # (replays) can outvote an honest replica: at most one per round
                if forgers >= max_forgers or (kind == "replay-forged" and replays >= 1):
                    kind = str(rng.choice([k for k in NODE_FAULTS if k not in VALUE_FORGING]))
                else:
                    forgers += 1
                    replays += kind == "replay-forged"
            scn.node_faults[(r, node)] = kind
    if edge_faults:

        def budget(r: int) -> int:
            forging = VALUE_FORGING + EDGE_FORGING
            return max_forgers - sum(
                k in forging for (q, _), k in scn.node_faults.items() if q == r
            )

        edges.add_edge_faults(scn, np.random.default_rng([suite_seed, index, 0xED6E5]), budget)
        edges.add_membership_faults(scn, np.random.default_rng([suite_seed, index, 0x3E3B]))
        edges.add_coalition(scn, np.random.default_rng([suite_seed, index, 0xC011]),
                            VALUE_FORGING + EDGE_FORGING)
    return scn


# ------------------------------------------------------------------ the oracle
ALL_SHAPES = {**SHAPES, edges.WIDE_ARRAY[0]: edges.WIDE_ARRAY[1]}


@cache
def target(pid: int, name: str, num: int | None = None) -> np.ndarray:
    """Partition ``pid``'s optimum; ``num``: of another split than the federation's (a
    partition of a false ``num-partitions`` claim holds other data)."""
    seed = [11, pid, list(ALL_SHAPES).index(name)] + ([] if num is None else [num, 0xC1A1])
    arr = np.random.default_rng(seed).standard_normal(ALL_SHAPES[name])
    arr.setflags(write=False)
    return arr


def num_examples(pid: int) -> int:
    return 10 + 3 * pid


def initial_model(shapes: dict[str, tuple[int, ...]] = SHAPES) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {name: rng.standard_normal(shape) for name, shape in shapes.items()}


def oracle(
    theta: dict[str, np.ndarray], n: int, partitions: tuple[int, ...] | None = None,
    split: int | None = None,
) -> dict[str, np.ndarray]:
    """Plain numpy FedAvg over all ``n`` partitions (or ``partitions``): ``sum_j n_j theta_j /
    sum_j n_j`` with ``theta_j = theta - LR (theta - target_j)`` (independent of the mod, codes
    and wrapper); ``split``: the data split into that many partitions instead of ``n``."""
    parts = list(range(n)) if partitions is None else list(partitions)
    sizes = np.array([num_examples(j) for j in parts], dtype=np.float64)
    out = {}
    for name, th in theta.items():
        th = np.asarray(th, dtype=np.float64)
        models = np.stack([th - LR * (th - target(j, name, split)) for j in parts])
        out[name] = np.tensordot(sizes, models, axes=1) / sizes.sum()
    return out


def rng_for(scn: Scenario, server_round: int, node: int, salt: int) -> np.random.Generator:
    """The seeded stream of one fault draw: scenario seed, round, node and a salt per use."""
    return np.random.default_rng([scn.seed, server_round, node, salt])


def node_ids_for(n: int) -> list[int]:
    return [100_000 + 7919 * (i + 1) for i in range(n)]


def flat_model(model: dict[str, np.ndarray]) -> np.ndarray:
    """A model's arrays (those of ``ALL_SHAPES`` it has, in that order) as one float64 vector."""
    keys = [k for k in ALL_SHAPES if k in model]
    return np.concatenate([np.asarray(model[k], dtype=np.float64).ravel() for k in keys])
