"""The fault kinds at the plug-in's edges, for ``tests/faults/fault_injection.py``.

Drawn from their own random stream (``[suite seed, index, 0xED6E5]``), on top of a scenario's
other faults, when the suite runs with ``edges=True`` (the default of the command line); the
other faults of a scenario are the same with and without them.

Per ``(round, node)``:

* ``public-forger``: a forger that knows everything public -- the run seed, the round, the
  nonce, the code and its coefficients (all in the instruction), the model's layout. It
  rebuilds the sample of coordinates an integrity probe seeded from public values would read
  (seeded from ``(seed, round, 0x5EED)``, 2,048 coordinates split over the arrays, at least 64
  per array) and perturbs only coordinates outside it, keeping the example count;
* ``sparse-forger``: a blind forger: a few coordinates (1 to 4) of the reply times a large
  factor (1e3 to 1e6, either sign);
* ``overflow``: the reply times 1e160 (finite; its squares overflow);
* ``size-forgery``: ``partition-sizes`` in the reply's meta record set to 0 or 1e15 (even /
  odd variant), nothing else changed (the model must not change);
  ``size-forgery-consistent``: the same with ``num-examples`` made consistent with the forged
  sizes and the coefficients (a finite value forgery of the example count);
* ``replayed-nonce`` (a client defence): after the node answered its instruction, the same
  instruction (same nonce and round) is sent again straight to the node's
  ``gradient_coding_mod`` with another noise multiplier; the mod must refuse it (an error
  reply or an exception), whatever the server does;
* ``dp-off-config`` (a client defence): the node's instruction is sent again, as
  ``dp='sample'`` at ``noise-multiplier=1``, to a fresh ``gradient_coding_mod`` of the node
  with a DP policy (node config ``dp-required='sample'`` or ``dp-min-noise-multiplier=1``, a
  key file, its own ``dp-state-file``), the app doing its own noise when its config says
  ``dp='sample'`` (as the project's ClientApp's DP-SGD does), and a server train config that
  says ``dp='none'``, or ``dp='sample'`` at ``noise-multiplier=0``, or nothing about DP; the
  reply must be refused or noised, never the raw update (numpy: ``sum_j c_j n_j (theta_j -
  theta)``);
* ``dp-model-split`` (a client defence): the instruction is sent as ``dp='partition'``
  (``noise-multiplier=1``, ``clip-norm=1``) to two fresh replicas of the node with
  ``dp-required='partition'`` (one ``(nonce, round)``), one given the round's model and one
  the model moved by about 1e-3: the difference of their releases must keep noise (with
  identical keyed noise it is the exact difference of the clipped updates);
* ``lost-reply``: the grid loses the reply (never delivered); under wallclock timing the node
  must be free (not ``busy``) again in every round that starts at least
  :data:`EXPIRY_BOUND_S` seconds after the round whose reply was lost.

Per run (at most one per scenario):

* ``handshake-error`` / ``handshake-silent``: the node answers the ``identify`` instruction of
  its first round with an error reply (or an exception) / not at all. When that round is later
  than 1 the node joins late: it is not in the cohort before (the inner strategy does not
  sample it). It answers normally from the next round on;
* ``identity-clash``: the node claims another node's ``partition-id``;
* ``claims-0-of-1``: the node claims ``partition-id=0``, ``num-partitions=1``.

Membership faults (at most one per scenario, none with a run fault above; own stream
``[suite seed, index, 0x3E3B]``):

* ``dead-from-start``: 1 to ``s + 1`` nodes whose app fails every message from the first one
  (the handshake of round 1 included): their partitions have to be covered by replicas;
* ``impostor-roster``: a node claims another node's partition; the strategy has the
  operator's roster (node id -> partition), which refuses the claim;
* ``sybil-tie``: half the nodes (``n`` even) claim another ``num-partitions``; the strategy is
  configured with ``num_partitions=n``.

Their invariants (``fault_kinds.membership_counts``): 0 rounds recorded ``exact`` with a
partition missing (``exact_rounds_with_partition_missing``), 0 honest nodes quarantined or
excluded for their identity (``honest_nodes_punished``; the victim of an impostor without a
roster is excluded with it by design: both are stragglers of the contested partition).

Coalitions (drawn from their own stream ``[suite seed, index, 0xC011]``, when ``s >= 1`` and
no other forger is planned): ``s-colluders``: ``s`` workers forge, every round, a
consistent-but-wrong codeword that isolates an honest victim (they solve
``B[honest - victim] u = 0`` on the code matrix rebuilt from public values); in a repetition
code they sit in one group with the victim, in a cyclic one they share no partition;
``size-vote-framing``: the same workers report their partitions' sizes rotated (sum unchanged).

Invariants added (in ``fault_invariants.check``): with ``verify=True`` no node without an
injected fault is quarantined (``honest_nodes_punished``); no run ends because of a node's
failure; a round recorded ``exact`` or ``approx`` with ``verified == "verified"`` has the
oracle's model (``wrong_models_applied_as_verified`` counts the rounds that do not); the
model of an exact round is the oracle's FedAvg over the partitions of that round (every
partition when every node is sampled, whoever failed its handshake or made a false claim); a
replayed instruction is refused; a lost reply's node is free again in time; a node with a DP
policy makes no raw
release (``raw_releases_by_dp_nodes``: 0).
"""

from __future__ import annotations

import copy
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Error, Message, RecordDict
from flwr.serverapp.strategy import FedAvg

EDGE_FORGING = ("public-forger", "sparse-forger", "overflow", "size-forgery",
                "size-forgery-consistent")
#: Forgeries that leave the model's values alone (a decoded one must give the oracle's model).
MODEL_NEUTRAL = ("size-forgery", "size-vote-framing")
#: Server-side attacks on a node's DP policy, sent straight to the node's mod.
DP_ATTACKS = ("dp-off-config", "dp-model-split")
EDGE_NODE_FAULTS = (*EDGE_FORGING, "replayed-nonce", "lost-reply", *DP_ATTACKS)
HANDSHAKE_FAULTS = ("handshake-error", "handshake-silent")
IDENTITY_FAULTS = ("identity-clash", "claims-0-of-1")
RUN_FAULTS = HANDSHAKE_FAULTS + IDENTITY_FAULTS
#: Membership faults (drawn from their own stream: the other draws are unchanged).
MEMBERSHIP_FAULTS = ("dead-from-start", "impostor-roster", "sybil-tie")
MEMBERSHIP_RATE = 0.2
#: Coalitions (drawn from their own stream, per run, when no other forger is planned): ``s``
#: colluders forging a consistent-but-wrong codeword (:func:`coalition_forge`), or reporting
#: their partitions' sizes rotated to frame an honest replica in the size vote.
COALITION_FORGING = ("s-colluders", "size-vote-framing")
EDGE_FAULTS = EDGE_NODE_FAULTS + RUN_FAULTS + MEMBERSHIP_FAULTS + COALITION_FORGING
#: Kinds the client (``gradient_coding_mod``) must defend against by itself.
CLIENT_DEFENCES = ("replayed-nonce", *DP_ATTACKS)
#: Noise parameters of the DP attacks; the model move of ``dp-model-split``.
DP_SIGMA, DP_CLIP, DP_MOVE = 1.0, 1.0, 1e-3

#: The model of a scenario with a forger that needs coordinates a 2,048-coordinate sample
#: misses: one more array of 4,096 values.
WIDE_ARRAY = ("e", (4096,))
PROBE_SALT = 0x5EED
PROBE_SAMPLE = 2048
PROBE_PER_ARRAY_MIN = 64
#: Seconds after which an abandoned wallclock message must have expired (its node free).
EXPIRY_BOUND_S = 5.0
#: Wall-clock pause between rounds of a scenario with a lost wallclock reply (so that the
#: expiry bound is crossed within the scenario's rounds).
LOST_REPLY_GAP_S = 2.0


# ------------------------------------------------------------------ drawing
def add_edge_faults(scn: Any, rng: np.random.Generator, budget: Callable[[int], int]) -> None:
    """Add the edge faults to scenario ``scn`` (``budget(r)``: how many more value forgers
    round ``r`` may take)."""
    n, rounds = scn.n, scn.rounds
    if rng.random() < 0.25:
        kind = str(rng.choice(RUN_FAULTS))
        node = int(rng.integers(n))
        if kind in HANDSHAKE_FAULTS:
            first = int(rng.integers(1, rounds))  # a round follows in which it answers
            scn.joins[node] = first
            for r in range(1, first + 1):
                scn.node_faults.pop((r, node), None)
            scn.node_faults[(first, node)] = kind
        else:
            victim = int((node + 1 + rng.integers(n - 1)) % n)
            scn.claims[node] = (victim, n) if kind == "identity-clash" else (0, 1)
            for r in range(1, rounds + 1):
                scn.node_faults.pop((r, node), None)
            scn.node_faults[(1, node)] = kind
    rate = float(rng.uniform(0.03, 0.12))
    lost_first = (scn.timing == "wallclock" and rounds == 4 and not scn.joins and not scn.claims
                  and rng.random() < 0.3)
    for r in range(1, rounds + 1):
        for node in range(n):
            if (r, node) in scn.node_faults or node in scn.claims:
                continue
            if scn.joins.get(node, 1) >= r and node in scn.joins:
                continue
            if lost_first and r == 1 and node == 0:
                scn.node_faults[(r, node)] = "lost-reply"
                scn.round_gap_s = LOST_REPLY_GAP_S
                continue
            if rng.random() >= rate:
                continue
            kind = str(rng.choice([k for k in EDGE_NODE_FAULTS if k != "lost-reply"]))
            if kind in EDGE_FORGING and budget(r) <= 0:
                continue  # redundancy detects at most s forgers per round
            scn.node_faults[(r, node)] = kind
    scn.wide = any(k in ("public-forger", "sparse-forger") for k in scn.node_faults.values())


class LateJoinFedAvg(FedAvg):
    """FedAvg that leaves out the nodes that have not joined yet (``scn.joins``: node -> first
    round) and tells ``injector`` the round and when it started."""

    def __init__(self, injector: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._injector = injector

    def configure_train(self, server_round, arrays, config, grid):
        inj = self._injector
        inj.current_round = server_round
        inj.round_starts[server_round] = time.monotonic()
        messages = list(super().configure_train(server_round, arrays, config, grid))
        return [m for m in messages
                if inj.scn.joins.get(inj.index_of[m.metadata.dst_node_id], 1) <= server_round]


# ------------------------------------------------------------------ forgeries
def probe_sample(layout: dict[str, tuple[int, ...]], seed: int, server_round: int) -> dict:
    """The coordinates a probe seeded from public values reads, rebuilt from public values
    only (the run seed and the round, both in the instruction; the model's layout)."""
    rng = np.random.default_rng([seed, server_round, PROBE_SALT])
    per_array = max(PROBE_PER_ARRAY_MIN, PROBE_SAMPLE // max(1, len(layout)))
    index = {}
    for name, shape in layout.items():
        size = int(np.prod(shape)) if shape else 1
        take = min(size, per_array)
        index[name] = np.sort(rng.choice(size, size=take, replace=False))
        rng.standard_normal((4, take))  # the probe's weights: drawn, not needed
    return index


def forge(kind: str, variant: int, rng: np.random.Generator, arrays: dict[str, np.ndarray],
          meta: dict[str, Any], instruction: Any) -> tuple[dict, dict] | None:
    """``(arrays, meta)`` of a reply under edge forgery ``kind`` (``None``: not applicable)."""
    arrays = {k: np.array(v, dtype=v.dtype, copy=True) for k, v in arrays.items()}
    meta = dict(meta)
    if kind == "public-forger":
        layout = {k: tuple(v.shape) for k, v in arrays.items()}
        sampled = probe_sample(layout, instruction.seed, instruction.round)
        changed = False
        for name, arr in arrays.items():
            free = np.setdiff1d(np.arange(arr.size), sampled[name])
            if free.size == 0:
                continue
            flat = arr.reshape(-1)
            scale = max(float(np.max(np.abs(flat))), 1.0)
            flat[free] += scale * rng.uniform(0.5, 2.0) * rng.choice([-1.0, 1.0], free.size)
            changed = True
        return (arrays, meta) if changed else None
    if kind == "sparse-forger":
        sizes = {k: v.size for k, v in arrays.items()}
        total = sum(sizes.values())
        for flat_index in rng.choice(total, size=int(rng.integers(1, 5)), replace=False):
            for name, size in sizes.items():
                if flat_index < size:
                    arr = arrays[name].reshape(-1)
                    value = arr[flat_index] if arr[flat_index] != 0 else 1.0
                    arr[flat_index] = value * 10 ** rng.uniform(3, 6) * rng.choice([-1, 1])
                    break
                flat_index -= size
        return arrays, meta
    if kind == "overflow":
        return {k: v * 1e160 for k, v in arrays.items()}, meta
    if kind in ("size-forgery", "size-forgery-consistent"):
        forged = 0.0 if variant % 2 == 0 else 1e15
        sizes = list(meta.get("partition-sizes", [0.0]))
        meta["partition-sizes"] = [forged] * len(sizes)
        if kind == "size-forgery-consistent":
            meta["num-examples"] = float(sum(c * forged for c in instruction.coefficients))
        return arrays, meta
    raise AssertionError(kind)


# ------------------------------------------------------------------ coalitions
def add_coalition(scn: Any, rng: np.random.Generator, forging: tuple[str, ...]) -> None:
    """With probability 0.8, when ``s >= 1`` and no forger (``forging``) is planned: ``s``
    colluders and a victim, forging every round their slot is free. In a repetition code the
    colluders are the first ``s`` workers of the first group and the victim its last replica;
    otherwise workers ``i (s + 1)`` (sharing no partition in a cyclic code when ``n`` has room)
    and the first other worker as the victim."""
    if scn.s < 1 or rng.random() >= 0.8 or any(k in forging for k in scn.node_faults.values()):
        return
    if not scn.verify:  # verify=False promises nothing against colluders (docs/integrity.md)
        return
    kind = str(rng.choice(COALITION_FORGING))
    if scn.code in ("frc", "comm-efficient"):
        colluders, victim = tuple(range(scn.s)), scn.s
    else:
        colluders = tuple(i * (scn.s + 1) % scn.n for i in range(scn.s))  # disjoint if room
        victim = min(set(range(scn.n)) - set(colluders))
    if victim >= scn.n or any(node in scn.claims or node in scn.joins for node in colluders):
        return
    scn.coalition = (colluders, victim)
    for r in range(1, scn.rounds + 1):
        for node in colluders:
            scn.node_faults.setdefault((r, node), kind)


def coalition_forge(kind: str, scn: Any, arrays: dict[str, np.ndarray], meta: dict[str, Any],
                    instruction: Any, node: int) -> tuple[dict, dict] | None:
    """The colluders' reply (``None``: this node is not where the plan assumed). ``s-colluders``:
    ``u`` with ``B[h] u = 0`` for the honest rows but the victim's and ``1^T u = 1`` (least
    squares on ``B`` rebuilt from public values); every colluder adds ``(B[w] u) d`` (``d`` from
    the round's public seed): the replies are a consistent codeword of a wrong sum except at the
    victim. ``size-vote-framing``: its partitions' sizes rotated (their sum unchanged)."""
    from fl_gradcode.codes import make_code

    colluders, victim = scn.coalition
    if instruction.worker != node or node not in colluders:
        return None
    arrays = {k: np.array(v, dtype=v.dtype, copy=True) for k, v in arrays.items()}
    meta = dict(meta)
    if kind == "size-vote-framing":
        sizes = list(meta.get("partition-sizes", []))
        if len(sizes) < 2 or len(set(sizes)) < 2:
            return None
        meta["partition-sizes"] = sizes[1:] + sizes[:1]
        return arrays, meta
    try:
        code = make_code(scn.code, n=scn.n, s=scn.s, seed=instruction.seed)
    except ValueError:
        return None
    B = np.asarray(code.B, dtype=np.float64)
    if code.chunks != 1 or B.shape[0] != scn.n:
        return None
    honest = [h for h in range(scn.n) if h not in colluders and h != victim]
    A = np.vstack([B[honest], np.ones((1, B.shape[1]))])
    rhs = np.zeros(A.shape[0])
    rhs[-1] = 1.0
    u = np.linalg.lstsq(A, rhs, rcond=None)[0]
    if not np.allclose(A @ u, rhs, atol=1e-9):
        return None
    weight = float(B[node] @ u)
    rng = np.random.default_rng([instruction.seed, instruction.round, 0xC011])
    for name in sorted(arrays):
        arr = arrays[name]
        arr += (weight * rng.standard_normal(arr.shape)).astype(arr.dtype)
    return arrays, meta


# ------------------------------------------------------------------ the client defence
def replay(msg: Message, context: Context, train: Callable[[Message, Context], Message],
           mod: Callable[..., Message]) -> tuple[bool, str]:
    """Send an already answered instruction again, with another noise multiplier, straight
    to ``mod`` (the node's ``gradient_coding_mod``, its own context): ``(refused, detail)``."""
    from fl_gradcode.flower.protocol import PROTOCOL_KEY
    from fl_gradcode.flower.records import split_reason

    again = copy.deepcopy(msg)
    again.metadata.__dict__["_message_id"] = str(uuid.uuid4())
    records = {k: v for k, v in again.content.items() if k != PROTOCOL_KEY}
    rec = ConfigRecord(dict(again.content.config_records[PROTOCOL_KEY]))
    sigma = float(rec.get("noise-multiplier", 0.0))
    rec["noise-multiplier"] = 0.0 if sigma > 0 else 1.0
    records[PROTOCOL_KEY] = rec
    again.content = RecordDict(records)
    try:
        reply = mod(again, context, train)
    except Exception as exc:  # refused by raising
        return True, f"{type(exc).__name__}: {exc}"[:200]
    if reply.has_error():
        reason = split_reason(reply.error.reason)[0]  # without the client's traceback
        return True, f"error reply {reply.error.code}: {reason}"[:200]
    return False, "answered"


def noisy_app(train: Callable[[Message, Context], Message]) -> Callable[..., Message]:
    """``train`` plus its own Gaussian noise ``sigma C z`` (numpy's global RNG, which the mod
    seeds) when its config (run config updated with the train config) says ``dp='sample'``:
    an app doing its own DP-SGD noise from its config, as the project's ClientApp does."""

    def app(msg: Message, context: Context) -> Message:
        reply = train(msg, context)
        cfg = dict(context.run_config)
        if "config" in msg.content.config_records:
            cfg.update(dict(msg.content.config_records["config"]))
        if reply.has_error() or str(cfg.get("dp", "none")) != "sample":
            return reply
        scale = float(cfg.get("noise-multiplier", 1.0)) * float(cfg.get("clip-norm", 1.0))
        noisy = {k: v.numpy() + scale * np.random.standard_normal(v.numpy().shape)  # noqa: NPY002
                 for k, v in reply.content["arrays"].items()}
        records = dict(reply.content.items())
        records["arrays"] = ArrayRecord({k: Array(v) for k, v in noisy.items()})
        return Message(RecordDict(records), reply_to=msg)

    return app


def _dp_message(msg: Message, dp: str, config: dict[str, Any] | None,
                arrays: dict[str, np.ndarray] | None = None) -> Message:
    """A copy of ``msg`` asking for ``dp`` at ``DP_SIGMA``/``DP_CLIP``; ``config``: DP keys
    added to the train config (``None``: as the server sent it); ``arrays``: another model."""
    from fl_gradcode.flower.protocol import PROTOCOL_KEY

    again = copy.deepcopy(msg)
    again.metadata.__dict__["_message_id"] = str(uuid.uuid4())
    records = dict(again.content.items())
    rec = ConfigRecord(dict(again.content.config_records[PROTOCOL_KEY]))
    rec.update({"dp": dp, "noise-multiplier": DP_SIGMA, "clip-norm": DP_CLIP})
    records[PROTOCOL_KEY] = rec
    train_config = dict(records["config"]) if "config" in records else {}
    records["config"] = ConfigRecord({**train_config, **(config or {})})
    if arrays is not None:
        records["arrays"] = ArrayRecord({k: Array(v) for k, v in arrays.items()})
    again.content = RecordDict(records)
    return again


def _flat(arrays: dict[str, np.ndarray]) -> np.ndarray:
    return np.concatenate([np.asarray(arrays[k], np.float64).ravel() for k in sorted(arrays)])


def _coded(reply: Message) -> np.ndarray:
    from fl_gradcode.flower.protocol import PROTOCOL_KEY

    rec = reply.content.array_records[PROTOCOL_KEY]
    return _flat({k: rec[k].numpy() for k in rec})


def dp_attack(kind: str, variant: int, msg: Message, context: Context,
              train: Callable[[Message, Context], Message],
              raw_update: Callable[[dict, float | None], dict], key_file: str,
              state_dir: Path) -> tuple[str, str]:
    """Run DP attack ``kind`` on the node of ``context``: ``(outcome, detail)``, outcome one of
    ``refused``, ``noised``, ``raw`` (the invariant's violation) or ``not applicable`` (the
    raw update is zero: no partition with a non-zero coefficient). ``raw_update(theta,
    clip)``: the numpy oracle's ``sum_j c_j n_j clip(theta_j - theta)`` of the instruction."""
    from fl_gradcode.flower.mod import make_gradient_coding_mod

    theta = {k: v.numpy() for k, v in msg.content["arrays"].items()}
    if not np.any(_flat(raw_update(theta, None))):
        return "not applicable", "no partition with a non-zero coefficient"
    # a model an earlier, uncaught value forgery blew up (s = 0 or verify=False: only
    # finiteness is promised) cannot hold unit noise or the split's move: nothing to measure
    resolution = max(float(np.finfo(v.dtype).eps * np.abs(v).max()) if v.size else 0.0
                     for v in theta.values())
    if resolution > 1e-3 * min(DP_SIGMA * DP_CLIP, DP_MOVE):
        return "not applicable", f"model too large to hold the noise (resolution {resolution:.3g})"
    tag = f"{kind}-{uuid.uuid4().hex[:8]}"
    node_config = {**dict(context.node_config), "dp-key-file": key_file}
    if kind == "dp-off-config":
        policy = ({"dp-required": "sample"} if variant % 2 == 0
                  else {"dp-min-noise-multiplier": DP_SIGMA})
        config = ({"dp": "none"}, {"dp": "sample", "noise-multiplier": 0.0}, {})[variant % 3]
        ctx = Context(run_id=context.run_id, node_id=context.node_id, state=RecordDict(),
                      node_config={**node_config, **policy,
                                   "dp-state-file": str(state_dir / f"{tag}.jsonl")},
                      run_config=context.run_config)
        reply = make_gradient_coding_mod()(_dp_message(msg, "sample", config), ctx,
                                           noisy_app(train))
        what = f"policy {policy}, train config {config or 'without dp keys'}"
        if reply.has_error():
            return "refused", what
        raw = _flat(raw_update(theta, None))
        err = float(np.linalg.norm(_coded(reply) - raw) / np.linalg.norm(raw))
        return ("raw" if err < 1e-6 else "noised"), f"{what}: relative distance {err:.3g}"
    moved = {k: v + DP_MOVE * np.cos(np.arange(v.size)).reshape(v.shape)
             for k, v in theta.items()}
    noises = []
    for i, model in enumerate((theta, moved)):
        ctx = Context(run_id=context.run_id, node_id=context.node_id, state=RecordDict(),
                      node_config={**node_config, "dp-required": "partition",
                                   "dp-state-file": str(state_dir / f"{tag}-{i}.jsonl")},
                      run_config=context.run_config)
        reply = make_gradient_coding_mod()(_dp_message(msg, "partition", None, model), ctx,
                                           train)
        if reply.has_error():
            return "refused", f"replica {i}: {reply.error.reason[:120]}"
        noises.append(_coded(reply) - _flat(raw_update(model, DP_CLIP)))
    left = float(np.linalg.norm(noises[0] - noises[1]))
    scale = max(float(np.linalg.norm(noises[0])), 1e-300)
    detail = f"the difference of the two releases keeps {left / scale:.3g} of one's noise"
    return ("raw" if left < 1e-6 * scale else "noised"), detail


def handshake_failure(msg: Message, variant: int) -> Message:
    """The reply (or exception) of a node failing its handshake."""
    if variant % 2:
        raise RuntimeError("injected handshake failure (the node is still starting)")
    return Message(Error(code=4243, reason="injected handshake error reply"), reply_to=msg)


# ------------------------------------------------------------------ the oracle's partitions
def partition_sets(scn: Any, server_round: int) -> list[tuple[int, ...]]:
    """The sets of partitions an exact round's model may average. Rounds are about
    partitions: a round that samples every node (no node still to join) averages every
    partition, whoever failed its handshake, made a false claim or is dead (their partitions
    are computed by their replicas); a round that samples the nodes present so far averages
    theirs."""
    present = tuple(node for node in range(scn.n) if scn.joins.get(node, 1) <= server_round)
    return [present]


def round_partitions(scn: Any, server_round: int) -> int:
    """How many partitions round ``server_round`` has (:func:`partition_sets`)."""
    return len(partition_sets(scn, server_round)[0])


# ------------------------------------------------------------------ membership faults
def add_membership_faults(scn: Any, rng: np.random.Generator) -> None:
    """At most one membership fault per scenario, from its own stream (none when the
    scenario already has a run-level fault): nodes dead from the first message, an impostor
    refused by the operator's roster, or Sybils tying the ``num-partitions`` vote against a
    server that knows the federation's size."""
    if scn.joins or scn.claims or rng.random() >= MEMBERSHIP_RATE:
        return
    n, kind = scn.n, str(rng.choice(MEMBERSHIP_FAULTS))
    if kind == "dead-from-start":
        # up to s + 1 dead nodes: within the tolerance rounds stay exact, beyond it they
        # must not be recorded exact
        count = int(rng.integers(1, min(scn.s + 1, n - 1) + 1))
        for node in sorted(int(x) for x in rng.choice(n, size=count, replace=False)):
            for r in range(1, scn.rounds + 1):
                scn.node_faults[(r, node)] = kind
        return
    if kind == "impostor-roster":
        node = int(rng.integers(n))
        victim = int((node + 1 + rng.integers(n - 1)) % n)
        scn.claims[node] = (victim, n)
        scn.roster = True
    else:  # sybil-tie: half the nodes claim another num-partitions (n even only)
        if n % 2 or n < 4:
            return
        other = n // 2
        for i, node in enumerate(sorted(int(x) for x in rng.choice(n, size=n // 2,
                                                                   replace=False))):
            scn.claims[node] = (i % other, other)
        scn.num_partitions = True
    for node in scn.claims:
        for r in range(1, scn.rounds + 1):
            scn.node_faults.pop((r, node), None)
        scn.node_faults[(1, node)] = kind


def membership_counts(scn: Any, rows: list[dict[str, Any]],
                      node_ids: list[int]) -> tuple[int, int, list[str]]:
    """``(exact rounds with a partition missing, honest nodes punished, violations)``: an
    exact round must hold every partition of the round (none missing, one worker per
    partition); an honest node (no membership fault of its own) is never quarantined, and
    never excluded for its identity unless an impostor without a roster clashes with it (then
    both claimants are stragglers by design)."""
    index = {nid: i for i, nid in enumerate(node_ids)}
    faulty = {node for (_, node), kind in scn.node_faults.items() if kind in MEMBERSHIP_FAULTS}
    faulty |= set(scn.claims)
    clashed = set()
    if not getattr(scn, "roster", False):
        clashed = {pid for pid, num in scn.claims.values() if num == scn.n}
    missing, punished, bad = 0, set(), []
    for row in rows:
        r = int(row.get("round", 0))
        if row.get("decode") == "exact":
            workers = len(row.get("clients_used") or []) + len(row.get("stragglers") or [])
            if row.get("missing_partitions") or workers < round_partitions(scn, r):
                missing += 1
                bad.append(f"round {r}: exact with a partition missing ({workers} workers for "
                           f"{round_partitions(scn, r)} partitions, missing "
                           f"{row.get('missing_partitions')})")
        if not (faulty or scn.claims):
            continue  # no membership fault: the count is about those scenarios
        # quarantine: only verify=True promises no honest node is quarantined (the
        # verify=False heuristics may quarantine an honest twin; docs/integrity.md)
        for node in (row.get("quarantined") or []) if scn.verify else []:
            if index.get(node) is not None and index[node] not in faulty:
                punished.add(index[node])
        for node in row.get("identity_rejected") or []:
            i = index.get(node)
            if i is not None and i not in faulty and i not in clashed:
                punished.add(i)
    bad += [f"honest node {i} quarantined or excluded" for i in sorted(punished)]
    return missing, len(punished), bad


def expiry_violations(scn: Any, rows: list[dict], starts: dict[int, float]) -> list[str]:
    """Lost wallclock replies whose node is still busy :data:`EXPIRY_BOUND_S` seconds later."""
    if scn.timing != "wallclock":
        return []
    bad = []
    for (r, node), kind in sorted(scn.node_faults.items()):
        if kind != "lost-reply" or r not in starts:
            continue
        for row in rows:
            q = int(row.get("round", 0))
            if q > r and q in starts and starts[q] - starts[r] >= EXPIRY_BOUND_S:
                if node in (row.get("busy") or []):
                    bad.append(
                        f"round {q}: node {node} still busy {starts[q] - starts[r]:.1f} s after "
                        f"its round-{r} reply was lost (bound {EXPIRY_BOUND_S} s)"
                    )
    return bad


def in_span(update: np.ndarray, partition_updates: np.ndarray, rtol: float) -> bool:
    """Whether ``update`` is a linear combination of the rows of ``partition_updates`` (the
    honest partitions' updates): what an approx round's update is, whatever its decoding
    weights; a forgery outside their span (a sparse or public-knowledge forger, a reply made
    of other data) is not."""
    norm = float(np.linalg.norm(update))
    if norm == 0:
        return True
    beta, *_ = np.linalg.lstsq(partition_updates.T, update, rcond=None)
    return float(np.linalg.norm(partition_updates.T @ beta - update)) <= rtol * norm


def relative_error(got: np.ndarray, expected: np.ndarray) -> float:
    """``|got - expected| / |expected|``, overflow-safe (values up to 1e308)."""
    scale = max(float(np.max(np.abs(expected))), 1e-300)
    diff = float(np.linalg.norm((got - expected) / scale))
    return diff / max(float(np.linalg.norm(expected / scale)), 1e-300)


def describe_run_faults(scn: Any) -> str:
    """The scenario's run-level edge faults, for a violation's text."""
    joins = f", joins {scn.joins}" if scn.joins else ""
    return joins + (f", identity claims {scn.claims}" if scn.claims else "")
