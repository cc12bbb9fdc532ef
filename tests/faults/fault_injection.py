"""Seeded fault-injection suite over the public API: ``gradient_coding_mod`` + ``GradientCoding``
+ ``InProcessGrid``, against an independent numpy FedAvg oracle.

A scenario is ``(seed, n, code, s, timing, verify, rounds)`` plus faults drawn per
``(round, node)`` and per round. Faults are injected from outside the plug-in:

* inside the app (the ClientApp's train handler): an ``Error`` reply, an exception, NaN values;
* by an OUTER client mod around the real mod (``ClientApp(mods=[fault_mod,
  gradient_coding_mod])``) that rewrites the coded reply: Inf, wrong shape, wrong dtype (int /
  bool arrays), missing records, corrupt or truncated ``.npy`` bytes, metrics of the wrong type,
  a verbatim replay of an earlier round's reply, a forged worker claim, and the value forgeries
  (finite but wrong: 1e30 scaling, a scaled reply, an honestly computed reply for forged
  coefficients, an earlier round's arrays relabelled as this round's); it also reports the
  compute seconds (deterministic in virtual time; beyond the straggler deadline in an all-slow
  or all-busy round);
* by the grid (``InProcessGrid`` options): a crash mid-round (no reply, ever), a duplicated
  reply, a reply whose sender id is unknown or another node's; in wallclock scenarios the
  grid's per-reply delays (short Pareto delays; all-slow and all-busy rounds).

Invariants checked in every scenario (each failure is listed as a violation): the server never
raises; every round's model is finite, with the initial arrays' shapes and dtypes; exactly one
history row and one ``rounds.jsonl`` row per round, ``decode`` in {exact, approx, skipped}; an
approx round has ``decode_error <= max_decode_error``; a skipped round keeps the model bit for bit;
an exact round's model equals the oracle's FedAvg over all partitions of the previous round's
model (1e-6 relative) -- unless a value forgery was decoded in a scenario without redundancy to
catch it (``verify=False`` or ``s = 0``: then only finiteness); a reply the protocol must reject
is never decoded, and (virtual timing, every reply validated) every such fault appears among the
round's rejection reasons with the expected reason and no honest reply is rejected; an
all-slow / all-busy round decodes nothing; after an all-busy round the next round waits until a
node is free (virtual timing) rather than being spent on nothing; the integrity check never
excludes an honest reply as inconsistent; ``final_model.npz`` is the last decoded model.

Edge faults (``tests/faults/fault_kinds.py``, drawn from their own stream on top of the above,
on by default on the command line, ``run_suite(edge_faults=True)``): forgers that know
everything public, blind sparse forgers, overflow, partition-size forgery, handshake failures
(also of a node first sampled in a later round), identity clashes and ``(0, 1)`` claims,
replayed instructions sent to the client mod, lost wallclock replies. Their invariants: no run
ends by a node's failure (``runs_ended_by_node_failure``), a round recorded ``verified`` never
has a model off the oracle (``wrong_models_applied_as_verified``), the oracle averages the
partitions present in the round, a replayed instruction is refused, a lost reply's node is
free again within ``fault_kinds.EXPIRY_BOUND_S``. The replies the outer mod rewrites and their
expected rejection reasons are in ``tests/faults/fault_replies.py``.

Run: ``python -m tests.faults.fault_injection [--full] [--scenarios N] [--seed S] [--out PATH]
[--no-edge-faults]`` (default: a fast slice of 40 scenarios; ``--full``: 500 scenarios and
``results/fault_injection.json``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import platform
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Error,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp

from fl_gradcode.flower import GradientCoding, gradient_coding_mod
from fl_gradcode.flower.integrity import verify_refusal
from fl_gradcode.flower.membership import code_for_cohort
from fl_gradcode.flower.protocol import (
    OP_IDENTIFY,
    OP_TRAIN,
    PROTOCOL_KEY,
    parse_instruction,
)
from fl_gradcode.flower.testing import InProcessGrid, set_task_identity
from fl_gradcode.latency import Pareto
from fl_gradcode.results import read_rounds
from tests.faults import fault_kinds as edges
from tests.faults import fault_replies as replies
from tests.faults.fault_kinds import EDGE_FAULTS, EDGE_FORGING

ROOT = Path(__file__).resolve().parents[2]
META_KEY = PROTOCOL_KEY + "-meta"
SHAPES = {"w": (3, 4), "b": (4,)}
LR = 0.5
FAST_SCENARIOS = 40
FULL_SCENARIOS = 500
RTOL = 1e-6

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

UNKNOWN_NODE = 999_999_937


class InjectedFault(RuntimeError):
    """The exception the faulty app (or outer mod) raises."""


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


# ------------------------------------------------------------------ the app and the oracle
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


def _round_of(msg: Message) -> int:
    group = msg.metadata.group_id
    return int(group) if group.isdigit() else 0


class Injector:
    """The faults of one scenario, and a record of the ones actually injected."""

    def __init__(self, scn: Scenario, node_ids: list[int]) -> None:
        self.scn = scn
        self.node_ids = node_ids
        self.index_of = {nid: i for i, nid in enumerate(node_ids)}
        self.injected: set[tuple[str, int, int]] = set()  # (kind, round, node)
        self.honest: dict[int, dict[int, tuple[dict, dict]]] = {}  # node -> round -> content
        self.workers: dict[tuple[int, int], int] = {}  # (round, node) -> worker instructed
        self.current_round = 0  # the server's round (told by the inner strategy)
        self.round_starts: dict[int, float] = {}  # round -> time.monotonic() at its start
        self.replays: list[tuple[int, int, bool, str]] = []  # (round, node, refused, detail)
        # (round, node, kind, outcome, detail) of the DP attacks (fault_kinds.DP_ATTACKS)
        self.dp_attacks: list[tuple[int, int, str, str, str]] = []
        self.state_dir: Path | None = None
        self.key_file = ""
        self._train = None

    def kind(self, server_round: int, node: int) -> str | None:
        return self.scn.node_faults.get((server_round, node))

    def variant(self, server_round: int, node: int) -> int:
        """Which form of the fault: from the plan, else drawn from the seed (0..3)."""
        drawn = int(rng_for(self.scn, server_round, node, 6).integers(4))
        return self.scn.variants.get((server_round, node), drawn)

    # -------------------------------------------------------------- the app
    def app(self) -> ClientApp:
        app = ClientApp(mods=[self.fault_mod, gradient_coding_mod])

        @app.train()
        def train(msg: Message, context: Context) -> Message:
            pid = int(context.node_config["partition-id"])
            num = int(context.node_config["num-partitions"])
            split = None if num == self.scn.n else num  # a false num-partitions claim
            server_round, node = _round_of(msg), self.index_of[context.node_id]
            kind = self.kind(server_round, node)
            if kind == "error":
                self.injected.add((kind, server_round, node))
                return Message(Error(code=4242, reason="injected error reply"), reply_to=msg)
            if kind == "exception" and self.variant(server_round, node) % 2 == 0:
                self.injected.add((kind, server_round, node))
                raise InjectedFault("injected exception in the app")
            new, loss = {}, 0.0
            for name, arr in msg.content["arrays"].items():
                theta = arr.numpy()
                new[name] = theta - LR * (theta - target(pid, name, split))
                loss += float(np.mean(np.abs(theta - target(pid, name, split))))
            if kind == "nan":
                self.injected.add((kind, server_round, node))
                new["w"] = new["w"].copy()
                new["w"].flat[pid % new["w"].size] = np.nan
            metrics = MetricRecord({"num-examples": num_examples(pid), "train_loss": loss})
            arrays = ArrayRecord({name: Array(v) for name, v in new.items()})
            return Message(RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)

        self._train = train
        return app

    # -------------------------------------------------------------- the outer mod
    def fault_mod(self, msg: Message, context: Context, call_next) -> Message:
        if msg.metadata.message_type != MessageType.TRAIN or not msg.has_content():
            return call_next(msg, context)
        instruction = parse_instruction(msg.content)
        if instruction is not None and instruction.op == OP_IDENTIFY:
            node, r = self.index_of[context.node_id], self.current_round
            if self.kind(r, node) in ("handshake-error", "dead-from-start"):
                self.injected.add((self.kind(r, node), r, node))
                return edges.handshake_failure(msg, self.variant(r, node))
        if instruction is None or instruction.op != OP_TRAIN:
            return call_next(msg, context)
        r, node = instruction.round, self.index_of[context.node_id]
        self.workers[(r, node)] = instruction.worker
        kind = self.kind(r, node)
        rng = rng_for(self.scn, r, node, 2)
        if kind == "forged-consistent":  # an honest computation of forged coefficients
            self.injected.add((kind, r, node))
            reply = replies.forged_coefficients(msg, context, call_next, rng)
        else:
            reply = call_next(msg, context)
        if kind == "replayed-nonce":  # straight to the node's mod: the server never sees it
            self.injected.add((kind, r, node))
            refused, detail = edges.replay(msg, context, self._train, gradient_coding_mod)
            self.replays.append((r, node, refused, detail))
        if kind in edges.DP_ATTACKS:  # straight to fresh mods of the node with a DP policy
            self.injected.add((kind, r, node))
            outcome, detail = edges.dp_attack(
                kind, self.variant(r, node), msg, context, self._train,
                lambda theta, clip: self._raw_update(instruction, theta, clip),
                self.key_file, self.state_dir)
            self.dp_attacks.append((r, node, kind, outcome, detail))
        if kind == "exception" and (kind, r, node) not in self.injected:
            self.injected.add((kind, r, node))  # raised outside the mod: a ClientApp exception
            raise InjectedFault("injected exception in the outer mod")
        if reply.has_error():
            return reply
        arrays = {k: v.numpy() for k, v in reply.content.array_records[PROTOCOL_KEY].items()}
        meta = dict(reply.content.metric_records[META_KEY])
        if self.scn.timing == "virtual":  # deterministic arrivals: compute-s from the plan
            meta["compute-s"] = self._compute_s(r)
        if kind != "forged-consistent":
            self.honest.setdefault(node, {})[r] = (
                {k: v.copy() for k, v in arrays.items()}, dict(meta)
            )
        if kind in MOD_FAULTS or kind in ("huge", "scaled", "replay-forged"):
            forged = replies.rewrite(kind, self.variant(r, node), rng, arrays, meta,
                                     self.honest.get(node, {}), r, node, self.scn.n)
            if forged is not None:
                self.injected.add((kind, r, node))
                return Message(forged, reply_to=msg)
        if kind in edges.COALITION_FORGING:
            edge = edges.coalition_forge(kind, self.scn, arrays, meta, instruction, node)
            if edge is not None:
                self.injected.add((kind, r, node))
                arrays, meta = edge
        if kind in EDGE_FORGING:
            edge = edges.forge(kind, self.variant(r, node), rng, arrays, meta, instruction)
            if edge is not None:
                self.injected.add((kind, r, node))
                arrays, meta = edge
        return Message(replies.content(arrays, meta), reply_to=msg)

    def _raw_update(self, instruction: Any, theta: dict[str, np.ndarray],
                    clip: float | None) -> dict[str, np.ndarray]:
        """The numpy oracle's coded update of ``instruction`` from ``theta``:
        ``sum_j c_j n_j clip(theta_j - theta)`` (``clip=None``: unclipped)."""
        out = {k: np.zeros(np.shape(v)) for k, v in theta.items()}
        for pid, num, coef in zip(instruction.partition_ids, instruction.num_partitions,
                                  instruction.coefficients, strict=True):
            split = None if num == self.scn.n else num
            delta = {k: -LR * (np.asarray(v, np.float64) - target(pid, k, split))
                     for k, v in theta.items()}
            norm = float(np.sqrt(sum(np.sum(d**2) for d in delta.values())))
            scale = 1.0 if clip is None or norm <= clip else clip / norm
            for k, d in delta.items():
                out[k] += coef * num_examples(pid) * scale * d
        return out

    def _compute_s(self, server_round: int) -> float:
        scn, kind = self.scn, self.scn.round_faults.get(server_round)
        if kind is None:
            return 0.0
        rng = rng_for(scn, server_round, 10_000, 3)
        factor = rng.uniform(1.05, 1.5) if kind == "all-slow" else rng.uniform(2.5, 4.0)
        self.injected.add((kind, server_round, -1))
        return float(scn.straggler_timeout * factor)

    # -------------------------------------------------------------- grid-level faults
    def grid(self) -> InProcessGrid:
        scn = self.scn

        def crash(node: int, server_round: int) -> bool:
            if server_round == 0:  # the handshake (group "identify"), in the server's round
                r = self.current_round
                if self.kind(r, node) == "handshake-silent":
                    self.injected.add(("handshake-silent", r, node))
                    return True
                return False
            return self.kind(server_round, node) in ("crash", "lost-reply")

        def duplicate(node: int, server_round: int) -> bool:
            return self.kind(server_round, node) == "duplicate"

        def src_node_id(node: int, server_round: int) -> int | None:
            kind = self.kind(server_round, node)
            if kind == "unknown-sender":
                return UNKNOWN_NODE
            if kind == "spoofed-sender":
                other = (node + 1 + rng_for(scn, server_round, node, 4).integers(scn.n - 1)) % scn.n
                # a node in this round's cohort (not one an identity fault may leave out)
                left_out = {*scn.claims, *(v for v, _ in scn.claims.values()),
                            *(i for i, first in scn.joins.items() if first >= server_round),
                            *(i for (_, i), k in scn.node_faults.items()
                              if k in edges.MEMBERSHIP_FAULTS)}
                candidates = [i for i in range(scn.n) if i not in left_out and i != node]
                if not candidates:  # every other node may be left out: no one to spoof
                    return None
                while other not in candidates:
                    other = (other + 1) % scn.n
                return self.node_ids[int(other)]
            return None

        delay = None
        if scn.timing == "wallclock":

            def delay(node: int, server_round: int) -> float:
                rng = rng_for(scn, server_round, node, 5)
                kind = scn.round_faults.get(server_round)
                if kind is not None:
                    self.injected.add((kind, server_round, -1))
                    low, high = (1.6, 2.0) if kind == "all-slow" else (3.0, 4.0)
                    return float(scn.straggler_timeout * rng.uniform(low, high))
                return float(min(0.01 + 0.02 * rng.pareto(1.5), 0.2))

        # every node remembers the (nonce, round) pairs it answered (node config
        # dp-state-file), as a deployed node defending its privacy does: a replay is refused
        state_dir = Path(tempfile.mkdtemp(prefix="fault-injection-state-"))
        self.state_dir = state_dir
        # the DP attacks' nodes hold a key file (a master key from the scenario's seed)
        self.key_file = str(state_dir / "dp-keys.json")
        master = np.random.default_rng([scn.seed, 0xD9]).bytes(32).hex()
        Path(self.key_file).write_text(json.dumps({"master": master}))

        def node_config(node: int) -> dict[str, Any]:
            config: dict[str, Any] = {"dp-state-file": str(state_dir / f"node{node}.jsonl")}
            if node in scn.claims:
                pid, num = scn.claims[node]
                config.update({"partition-id": pid, "num-partitions": num})
            return config

        return InProcessGrid(
            self.app(), scn.n, node_ids=self.node_ids, delay=delay, crash=crash,
            duplicate=duplicate, src_node_id=src_node_id, node_config=node_config,
        )


# ------------------------------------------------------------------ one scenario
@dataclass
class Outcome:
    scenario: Scenario
    rows: list[dict[str, Any]] = field(default_factory=list)
    models: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)
    injected: set[tuple[str, int, int]] = field(default_factory=set)
    violations: list[str] = field(default_factory=list)
    crashed: bool = False
    corrupted: int = 0  # rounds whose model is not finite or an exact round off the oracle
    compared: int = 0  # exact rounds compared with the oracle
    not_compared: int = 0  # exact rounds with a decoded value forgery and no redundancy
    honest_excluded: int = 0  # honest replies the integrity check excluded as inconsistent
    # honest nodes punished: quarantined under verify=True with no injected fault, or
    # quarantined / excluded for their identity under membership faults
    honest_punished: int = 0
    max_rel_error: float = 0.0
    matched: Counter = field(default_factory=Counter)  # faults matched to a rejection reason
    forger_outcomes: Counter = field(default_factory=Counter)
    wall_s: float = 0.0
    final_model: dict[str, np.ndarray] | None = None  # results_dir/final_model.npz
    grid_injected: list[tuple[str, int, int]] = field(default_factory=list)  # InProcessGrid's
    # edge faults
    ended_by_node_failure: bool = False  # the server raised, or fewer rounds than planned
    wrong_verified: int = 0  # exact/approx rounds recorded "verified" off the oracle
    workers: dict[tuple[int, int], int] = field(default_factory=dict)  # (round, node) -> worker
    round_starts: dict[int, float] = field(default_factory=dict)
    replays: list[tuple[int, int, bool, str]] = field(default_factory=list)
    dp_attacks: list[tuple[int, int, str, str, str]] = field(default_factory=list)
    edge_outcomes: Counter = field(default_factory=Counter)  # "<kind>: <what happened>"
    refused: str | None = None  # GradientCoding refused the configuration (this message)
    exact_missing: int = 0  # exact rounds with a partition missing


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """No Flower INFO/WARNING logs and no public-seed warning while scenarios run."""
    logger = logging.getLogger("flwr")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="gradient_coding_mod: no partition key")
        try:
            yield
        finally:
            logger.setLevel(level)


def node_ids_for(n: int) -> list[int]:
    return [100_000 + 7919 * (i + 1) for i in range(n)]


def _strategy(scn: Scenario, injector: Injector, tmp: str) -> GradientCoding | str:
    """The scenario's strategy, or the message with which its configuration was refused."""
    virtual = scn.timing == "virtual"
    try:
        return GradientCoding(
            edges.LateJoinFedAvg(injector, fraction_evaluate=0.0, min_available_nodes=scn.n,
                                 min_train_nodes=scn.n),
            code=scn.code,
            s=scn.s,
            timing=scn.timing,
            latency=Pareto(scale=1.0, shape=1.5) if virtual else None,
            seed=scn.seed,
            results_dir=tmp,
            straggler_timeout=scn.straggler_timeout,
            max_decode_error=scn.max_decode_error,
            round_timeout=0.25 if virtual else 2.0,
            warmup_timeout=1.0,
            verify=scn.verify,
            wire="float64",
            roster={nid: i for i, nid in enumerate(injector.node_ids)} if scn.roster else None,
            num_partitions=scn.n if scn.num_partitions else None,
        )
    except (ValueError, TypeError) as exc:
        return f"{type(exc).__name__}: {exc}"


def run_scenario(scn: Scenario) -> Outcome:
    """Run one scenario and check every invariant."""
    set_task_identity()
    outcome = Outcome(scn)
    injector = Injector(scn, node_ids_for(scn.n))
    grid = injector.grid()
    theta0 = initial_model(scn.shapes())
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, quiet():
        strategy = _strategy(scn, injector, tmp)
        if isinstance(strategy, str):  # the configuration was refused with a message
            outcome.refused = strategy
            return outcome

        def evaluate_fn(server_round: int, arrays: ArrayRecord) -> None:
            outcome.models[server_round] = {k: v.numpy().copy() for k, v in arrays.items()}
            if scn.round_gap_s and 1 <= server_round < scn.rounds:
                time.sleep(scn.round_gap_s)  # the federation idles between rounds

        try:
            strategy.start(
                grid=grid,
                initial_arrays=ArrayRecord({k: Array(v) for k, v in theta0.items()}),
                num_rounds=scn.rounds,
                train_config=ConfigRecord({}),
                evaluate_fn=evaluate_fn,
            )
        except Exception:
            outcome.crashed = True
            outcome.violations.append(f"the server raised:\n{traceback.format_exc()}")
        outcome.wall_s = time.perf_counter() - t0
        outcome.rows = list(strategy.history)
        try:
            file_rows = read_rounds(tmp)
        except Exception as exc:
            file_rows = []
            outcome.violations.append(f"rounds.jsonl unreadable: {exc!r}")
        saved = Path(tmp) / "final_model.npz"
        if saved.exists():
            with np.load(saved) as npz:
                outcome.final_model = {k: npz[k] for k in npz.files}
    outcome.grid_injected = list(grid.injected)
    for what, node, server_round in grid.injected:
        kind = injector.kind(server_round, node)
        if what == "crash" and kind != "lost-reply":
            kind = "crash"
        if kind is not None and server_round > 0:
            injector.injected.add((kind, server_round, node))
    for node in scn.claims:  # claimed in the handshake of round 1
        injector.injected.add((scn.node_faults[(1, node)], 1, node))
    outcome.injected = set(injector.injected)
    outcome.workers = dict(injector.workers)
    outcome.round_starts = dict(injector.round_starts)
    outcome.replays = list(injector.replays)
    outcome.dp_attacks = list(injector.dp_attacks)
    outcome.ended_by_node_failure = outcome.crashed or len(outcome.rows) < scn.rounds
    if not outcome.crashed:
        check(outcome, file_rows, theta0)
    return outcome


def _finite(model: dict[str, np.ndarray]) -> bool:
    return all(np.isfinite(v).all() for v in model.values())


def flat_model(model: dict[str, np.ndarray]) -> np.ndarray:
    """A model's arrays (those of ``ALL_SHAPES`` it has, in that order) as one float64 vector."""
    keys = [k for k in ALL_SHAPES if k in model]
    return np.concatenate([np.asarray(model[k], dtype=np.float64).ravel() for k in keys])


def _oracle_error(scn: Scenario, prev: dict, model: dict, server_round: int) -> float:
    """The relative error of ``model`` to the nearest oracle of the round (the partitions
    present; see ``fault_kinds.partition_sets``)."""
    got = flat_model(model)
    sets = edges.partition_sets(scn, server_round)
    # a code with k partitions for a cohort of another size re-splits the data into the
    # app's partitions 0..k-1 (Workload.partitions): that is the round's set
    code, _ = code_for_cohort(scn.code, len(sets[0]), scn.s, scn.seed, {})
    split = None
    if code.k != len(sets[0]):
        sets, split = [tuple(range(code.k))], (None if code.k == scn.n else code.k)
    return min(
        edges.relative_error(got, flat_model(oracle(prev, scn.n, parts, split)))
        for parts in sets
    )


def check(out: Outcome, file_rows: list[dict[str, Any]], theta0: dict[str, np.ndarray]) -> None:
    """Every invariant of one finished scenario; failures go to ``out.violations``."""
    scn, rows, models = out.scenario, out.rows, out.models
    bad = out.violations.append
    if scn.verify:  # verify=True blames only on evidence no coalition of <= s can fabricate
        faulty = ({node for *_, node in out.injected} | {node for _, node, _ in out.grid_injected}
                  | set(scn.claims) | set(scn.joins))
        index = {nid: i for i, nid in enumerate(node_ids_for(scn.n))}
        punished = sorted({index.get(q, -1) for row in rows for q in row.get("quarantined") or []}
                          - faulty)
        if punished:
            out.honest_punished += len(punished)
            bad(f"honest node(s) {punished} quarantined under verify=True")
    if [r.get("round") for r in rows] != list(range(1, scn.rounds + 1)):
        bad(f"history rounds {[r.get('round') for r in rows]} != 1..{scn.rounds}")
    if [(r.get("round"), r.get("decode")) for r in file_rows] != [
        (r.get("round"), r.get("decode")) for r in rows
    ]:
        bad(f"rounds.jsonl rows {[(r.get('round'), r.get('decode')) for r in file_rows]} differ "
            "from the history")
    if sorted(models) != list(range(scn.rounds + 1)):
        bad(f"evaluate_fn saw rounds {sorted(models)}")
        return
    for r in range(1, scn.rounds + 1):
        model, prev = models[r], models[r - 1]
        if set(model) != set(theta0) or any(
            model[k].shape != theta0[k].shape or model[k].dtype != theta0[k].dtype for k in theta0
        ):
            layout = {k: (v.shape, str(v.dtype)) for k, v in model.items()}
            bad(f"round {r}: model layout changed: {layout}")
            out.corrupted += 1
            continue
        if not _finite(model):
            bad(f"round {r}: model not finite")
            out.corrupted += 1
        if r - 1 >= len(rows):
            continue
        row = rows[r - 1]
        decode = row.get("decode")
        used = set(row.get("clients_used") or [])
        # (kind, worker): the worker index the node was instructed as (its node index if it
        # was sent nothing; the same when every node is in the cohort in partition order)
        faults = [(k, out.workers.get((q, node), node)) for (k, q, node) in out.injected if q == r]
        if decode not in ("exact", "approx", "skipped"):
            bad(f"round {r}: decode={decode!r}")
        if not used <= set(range(scn.n)) or used & set(row.get("stragglers") or []):
            bad(f"round {r}: clients_used {sorted(used)} / stragglers {row.get('stragglers')}")
        if decode != "skipped" and not used:
            bad(f"round {r}: {decode} from no reply")
        if decode == "approx" and not row["decode_error"] <= scn.max_decode_error + 1e-12:
            bad(f"round {r}: approx with decode_error {row['decode_error']} > "
                f"{scn.max_decode_error}")
        if decode == "skipped" and not all(np.array_equal(model[k], prev[k]) for k in model):
            bad(f"round {r}: skipped but the model changed")
        # faults the protocol must reject are never decoded
        for kind, node in faults:
            if kind in REJECTED or kind in ("crash", "lost-reply"):
                if (node in used and kind in ("nan", "inf") and scn.timing == "wallclock"
                        and _finite(model)):
                    # wallclock values are read in the decoding pass only: a reply the sparse
                    # decoder does not read (coefficient 0) is listed in clients_used unread,
                    # and cannot reach the model (finite; an exact round matches the oracle)
                    out.edge_outcomes[f"{kind}: listed in clients_used, not read"] += 1
                elif node in used:
                    bad(f"round {r}: node {node} with fault {kind!r} was decoded")
        # value forgeries
        forged = [node for kind, node in faults if kind in FORGING]
        changing = [node for kind, node in faults
                    if kind in FORGING and kind not in edges.MODEL_NEUTRAL]
        protected = scn.verify and int(row.get("s", 0)) >= 1
        for kind, node in faults:
            if kind not in FORGING:
                continue
            if node in (row.get("inconsistent") or []):
                what = "excluded as inconsistent"
            elif node not in used:
                what = "not decoded"
            elif decode == "skipped":
                what = "round skipped"
            else:
                what = "decoded" + (" (verified)" if protected else "")
            if kind in VALUE_FORGING:
                out.forger_outcomes[what] += 1
            else:
                out.edge_outcomes[f"{kind}: {what}"] += 1
        honest = sorted(set(row.get("inconsistent") or []) - set(forged))
        if honest:  # redundancy must only ever exclude a reply that is actually wrong
            out.honest_excluded += len(honest)
            bad(f"round {r}: honest node(s) {honest} excluded as inconsistent (decode {decode}, "
                f"used {sorted(used)}, value forgers {sorted(forged)}, verified "
                f"{row.get('verified')})")
        verified = row.get("verified") == "verified"
        if decode == "exact":
            if any(node in used for node in changing) and not (protected or verified):
                out.not_compared += 1  # (a round recorded verified is always compared)
            elif _finite(prev) and _finite(model):
                rel = _oracle_error(scn, prev, model, r)
                out.compared += 1
                out.max_rel_error = max(out.max_rel_error, rel)
                if not rel <= RTOL:
                    out.corrupted += 1
                    out.wrong_verified += verified
                    bad(f"round {r}: exact model differs from the oracle (relative {rel:.3g}; "
                        f"used {sorted(used)}, faults {sorted(faults)}, verified "
                        f"{row.get('verified')}{edges.describe_run_faults(scn)})")
        elif decode == "approx" and verified and _finite(prev) and _finite(model):
            # an approx update weighs the partitions' updates differently from the oracle,
            # but it is a combination of them
            before = flat_model(prev)
            if not any(
                edges.in_span(flat_model(model) - before, np.stack(
                    [flat_model(oracle(prev, scn.n, (j,))) - before for j in parts]), 1e-6)
                for parts in edges.partition_sets(scn, r)
            ):
                out.wrong_verified += 1
                bad(f"round {r}: approx round recorded verified is not a combination of the "
                    f"partitions' updates (faults {sorted(faults)}"
                    f"{edges.describe_run_faults(scn)})")
        # all-slow / all-busy rounds decode nothing; the next round does not start all-busy
        round_kind = scn.round_faults.get(r)
        if round_kind is not None and (round_kind, r, -1) in out.injected:
            if decode != "skipped" or used:
                bad(f"round {r}: {round_kind} round decoded {decode} from {sorted(used)}")
        if scn.timing == "virtual" and scn.round_faults.get(r - 1) == "all-busy":
            if len(row.get("busy") or []) >= scn.n:
                bad(f"round {r}: every node busy after an all-busy round (nothing sent)")
        # virtual timing: every reply is validated; rejections are exactly the injected faults
        if scn.timing == "virtual":
            must = [kind for kind, _ in faults if kind in REJECTED]
            reasons = list(row.get("rejected_reasons") or [])
            # a reply delivered twice: the copy is rejected as a duplicate sender, counted
            for _ in range(sum(kind == "duplicate" for kind, _ in faults)):
                if "duplicate sender" in reasons:
                    reasons.remove("duplicate sender")
            # a value forgery whose num-examples contradicts its partition sizes and the
            # round's coefficients (forged coefficients, a replay from another worker index)
            # may be caught on arrival: rejected, never decoded
            # or by the replicas' sizes (a replay from another worker index reports other
            # partitions' sizes): with s = 1 the tie excludes its honest twin too
            for _ in range(sum(kind in VALUE_FORGING for kind, _ in faults)):
                caught = [x for x in reasons if x.startswith("partition-sizes=")
                          and "do not add up to num-examples" in x]
                if caught:
                    reasons.remove(caught[0])
                    continue
                caught = [x for x in reasons if x.startswith("partition-sizes: ")
                          and "disagrees with the other replicas" in x]
                for x in caught[:2] if len(caught) == 2 and "tie" in caught[0] else caught[:1]:
                    reasons.remove(x)
            got = replies.match(must, reasons)
            # an edge fault may be rejected (with a reason of the fix's wording) or not
            may = sum(kind in EDGE_FORGING + edges.COALITION_FORGING or kind in edges.RUN_FAULTS
                      for kind, _ in faults)
            may += len(scn.claims) * (r > 1)  # a false claimant may be refused every round
            # a forged partition size against one honest replica (s = 1) is a tie nothing
            # resolves: both replicas are excluded
            may += sum(kind.startswith("size-forgery") for kind, _ in faults)
            if got != len(must) or not len(must) <= len(reasons) <= len(must) + may:
                bad(f"round {r}: rejections {reasons} do not match the injected faults {must}")
            else:
                out.matched.update(must)
    for r, node, refused, detail in out.replays:
        out.edge_outcomes["replayed-nonce: " + ("refused" if refused else "answered")] += 1
        if not refused:
            bad(f"round {r}: [client defence] node {node} answered a replayed instruction (its "
                f"round's nonce and round again, another noise-multiplier): {detail}")
    for r, node, kind, what, detail in out.dp_attacks:
        out.edge_outcomes[f"{kind}: {what}"] += 1
        if what == "raw":
            bad(f"round {r}: [client defence] node {node} with a DP policy made a raw release "
                f"under {kind}: {detail}")
    for violation in edges.expiry_violations(scn, rows, out.round_starts):
        bad(violation)
    out.exact_missing, punished_members, membership = edges.membership_counts(
        scn, rows, node_ids_for(scn.n))
    out.honest_punished += punished_members
    for violation in membership:
        bad(violation)


    decoded = [row["round"] for row in rows if row.get("decode") != "skipped"]
    if decoded and decoded[-1] in models:
        last = models[decoded[-1]]
        if out.final_model is None or any(
            not np.array_equal(out.final_model.get(k), last[k]) for k in last
        ):
            bad(f"final_model.npz is not the model of round {decoded[-1]}")


# ------------------------------------------------------------------ the suite
def run_suite(
    num: int = FAST_SCENARIOS, seed: int = 0, progress: bool = False, edge_faults: bool = False
) -> dict[str, Any]:
    """Run ``num`` scenarios of suite ``seed`` (``edge_faults``: with the kinds of
    ``fault_kinds`` too); the counts (and every violation)."""
    t0 = time.perf_counter()
    faults, decodes, mix = Counter(), Counter(), Counter()
    matched, forgers, edge_outcomes = Counter(), Counter(), Counter()
    refused: list[str] = []
    totals = Counter()
    violations: list[str] = []
    slowest = (0.0, "")
    max_rel = 0.0
    for index in range(num):
        scn = make_scenario(seed, index, edge_faults)
        out = run_scenario(scn)
        mix[f"code={scn.code}"] += 1
        mix[f"timing={scn.timing}"] += 1
        mix[f"verify={scn.verify}"] += 1
        mix[f"n={scn.n}"] += 1
        mix[f"s={scn.s}"] += 1
        faults.update(kind for kind, _, _ in out.injected)
        decodes.update(row.get("decode") for row in out.rows)
        matched.update(out.matched)
        forgers.update(out.forger_outcomes)
        edge_outcomes.update(out.edge_outcomes)
        totals["wrong_verified"] += out.wrong_verified
        totals["ended"] += int(out.ended_by_node_failure)
        totals["raw_dp"] += sum(what == "raw" for _, _, _, what, _ in out.dp_attacks)
        if out.refused is not None:
            refused.append(f"{scn.describe()}: {out.refused}")
        totals["rounds"] += len(out.rows)
        totals["crashes"] += int(out.crashed)
        totals["corrupted_models"] += out.corrupted
        totals["exact_compared"] += out.compared
        totals["exact_not_compared"] += out.not_compared
        totals["rejected_replies"] += sum(int(r.get("rejected", 0)) for r in out.rows)
        totals["late_dropped"] += sum(int(r.get("late_dropped", 0)) for r in out.rows)
        totals["excluded_inconsistent"] += sum(len(r.get("inconsistent") or []) for r in out.rows)
        totals["honest_excluded"] += out.honest_excluded
        totals["exact_missing"] += out.exact_missing
        totals["honest_punished"] += out.honest_punished
        max_rel = max(max_rel, out.max_rel_error)
        violations.extend(f"{scn.describe()}: {v}" for v in out.violations)
        if out.wall_s > slowest[0]:
            slowest = (out.wall_s, scn.describe())
        if progress and (index + 1) % 50 == 0:
            print(f"  {index + 1}/{num} scenarios, {len(violations)} violations, "
                  f"{time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    return {
        "scenarios": num,
        "seed": seed,
        "rounds": totals["rounds"],
        "faults_injected": {k: faults.get(k, 0) for k in ALL_FAULTS + EDGE_FAULTS},
        "faults_injected_total": sum(faults.values()),
        "rejections_matched": {k: matched.get(k, 0) for k in REJECTED},
        "value_forgeries": dict(sorted(forgers.items())),
        "decode": {k: decodes.get(k, 0) for k in ("exact", "approx", "skipped")},
        "exact_rounds_compared_with_oracle": totals["exact_compared"],
        "exact_rounds_not_compared": totals["exact_not_compared"],
        "max_relative_error": max_rel,
        "rejected_replies": totals["rejected_replies"],
        "late_dropped": totals["late_dropped"],
        "excluded_inconsistent": totals["excluded_inconsistent"],
        "honest_excluded_as_inconsistent": totals["honest_excluded"],
        "crashes": totals["crashes"],
        "corrupted_models": totals["corrupted_models"],
        "edge_faults": edge_faults,
        "wrong_models_applied_as_verified": totals["wrong_verified"],
        "runs_ended_by_node_failure": totals["ended"],
        "exact_rounds_with_partition_missing": totals["exact_missing"],
        "honest_nodes_punished": totals["honest_punished"],
        "raw_releases_by_dp_nodes": totals["raw_dp"],
        "edge_fault_outcomes": dict(sorted(edge_outcomes.items())),
        "configurations_refused": refused,
        "invariant_violations": violations,
        "mix": dict(sorted(mix.items())),
        "runtime_s": round(time.perf_counter() - t0, 2),
        "slowest_scenario": {"wall_s": round(slowest[0], 2), "scenario": slowest[1]},
    }


def report(result: dict[str, Any]) -> str:
    lines = [
        f"scenarios: {result['scenarios']} (seed {result['seed']}), rounds: {result['rounds']}",
        f"faults injected: {result['faults_injected_total']}",
        *(f"  {k:<20} {v}" for k, v in result["faults_injected"].items()),
        "rejected with the expected reason (virtual timing): "
        + ", ".join(f"{k} {v}" for k, v in result["rejections_matched"].items()),
        "value forgeries: " + ", ".join(f"{k} {v}" for k, v in result["value_forgeries"].items()),
        "rounds: " + ", ".join(f"{k} {v}" for k, v in result["decode"].items()),
        f"exact rounds compared with the oracle: {result['exact_rounds_compared_with_oracle']} "
        f"(max relative error {result['max_relative_error']:.1e}; "
        f"{result['exact_rounds_not_compared']} not compared: a value forgery decoded without "
        "redundancy)",
        f"rejected replies: {result['rejected_replies']}, late dropped: "
        f"{result['late_dropped']}, excluded as inconsistent: {result['excluded_inconsistent']} "
        f"(honest replies among them: {result['honest_excluded_as_inconsistent']})",
        "mix: " + ", ".join(f"{k} {v}" for k, v in result["mix"].items()),
        f"crashes: {result['crashes']}",
        f"corrupted models: {result['corrupted_models']}",
        f"edge faults: {result['edge_faults']}; wrong models applied as verified: "
        f"{result['wrong_models_applied_as_verified']}; runs ended by a node's failure: "
        f"{result['runs_ended_by_node_failure']}; raw releases by nodes with a DP policy: "
        f"{result['raw_releases_by_dp_nodes']}",
        *(f"  {k:<40} {v}" for k, v in result["edge_fault_outcomes"].items()),
        f"configurations refused: {len(result['configurations_refused'])}",
        *(f"  - {v}" for v in result["configurations_refused"]),
        f"invariant violations: {len(result['invariant_violations'])}",
        *(f"  - {v}" for v in result["invariant_violations"]),
        f"runtime: {result['runtime_s']:.1f} s (slowest scenario "
        f"{result['slowest_scenario']['wall_s']} s)",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help=f"{FULL_SCENARIOS} scenarios")
    parser.add_argument("--scenarios", type=int, default=None, help="number of scenarios")
    parser.add_argument("--seed", type=int, default=0, help="suite seed")
    parser.add_argument("--no-edge-faults", action="store_true",
                        help="without the fault kinds of tests/faults/fault_kinds.py")
    parser.add_argument("--out", default=None, help="JSON output (default with --full: "
                        "results/fault_injection.json)")
    args = parser.parse_args(argv)
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:  # pragma: no cover
        pass
    num = args.scenarios or (FULL_SCENARIOS if args.full else FAST_SCENARIOS)
    result = run_suite(num, args.seed, progress=True, edge_faults=not args.no_edge_faults)
    print(report(result))
    out = args.out or (str(ROOT / "results" / "fault_injection.json") if args.full else None)
    if out:
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        saved = {**result, "machine": {"python": platform.python_version(),
                                       "cpu": platform.machine()}}
        path.write_text(json.dumps(saved, indent=2) + "\n")
        print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
