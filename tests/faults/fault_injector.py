"""The ``Injector`` of ``tests/faults/fault_injection.py``: one scenario's faults injected from
outside the plug-in, and the record of the ones actually injected.

It builds the ClientApp (the numpy train handler, with the app faults: an ``Error`` reply, an
exception, NaN values), the OUTER client mod around the real ``gradient_coding_mod`` (the
rewritten replies of ``fault_replies``, the edge kinds of ``fault_kinds``, the compute seconds
of virtual time) and the ``InProcessGrid`` (crashes, duplicated replies, unknown or spoofed
senders, wallclock delays, each node's config and DP state file).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    Context,
    Error,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp

from fl_gradcode.flower import gradient_coding_mod
from fl_gradcode.flower.protocol import (
    OP_IDENTIFY,
    OP_TRAIN,
    PROTOCOL_KEY,
    parse_instruction,
)
from fl_gradcode.flower.testing import InProcessGrid
from tests.faults import fault_kinds as edges
from tests.faults import fault_replies as replies
from tests.faults.fault_kinds import EDGE_FORGING
from tests.faults.fault_scenarios import (
    LR,
    MOD_FAULTS,
    Scenario,
    num_examples,
    rng_for,
    target,
)

META_KEY = PROTOCOL_KEY + "-meta"
UNKNOWN_NODE = 999_999_937


class InjectedFault(RuntimeError):
    """The exception the faulty app (or outer mod) raises."""


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
        self.claimed: set[int] = set()  # nodes whose node config carries a false identity
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
                self.claimed.add(node)
            return config

        return InProcessGrid(
            self.app(), scn.n, node_ids=self.node_ids, delay=delay, crash=crash,
            duplicate=duplicate, src_node_id=src_node_id, node_config=node_config,
        )
