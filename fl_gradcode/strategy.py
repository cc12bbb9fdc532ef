"""The Flower layer: a gradient-coding strategy whose rounds end at the first decodable set.

``GradientCoding`` is a Message-API strategy (``flwr.serverapp.strategy.Strategy``). Each round
it sends every idle client its own message (global arrays, assigned partitions and encoding
coefficients), ends the round the moment the replies form a decodable set, decodes the
(size-weighted) sum of partition updates, and feeds it to a server optimizer.

Early return lives in :class:`EarlyReturnGrid`, a wrapper around Flower's ``Grid``:
``Strategy.start`` only ever calls ``grid.send_and_receive``, and Flower's wrapper strategies
(e.g. the DP wrappers) hold our strategy by composition and call the base ``start``, which
would bypass an overridden ``start``. Passing ``strategy.wrap_grid(grid)`` to any wrapper's
``start`` keeps early return; our own ``start`` wraps the grid itself.

Two timing modes:

* ``wallclock``: clients really sleep their sampled delay; the grid returns as soon as the
  replies decode, or at the straggler deadline; unanswered clients stay busy (not sent new work)
  until their late reply arrives and is dropped.
* ``virtual``: clients report measured compute time plus sampled delay; the server orders the
  replies by virtual arrival, decodes from the earliest decodable prefix (or approximately at the
  virtual deadline), tracks each client's virtual busy-until time and accumulates virtual time.

References:
    Tandon, Lei, Dimakis, Karampatziakis, "Gradient Coding", ICML 2017 (the round protocol).
    ``shared/docs/flower.md`` sections 2-4 (measured Flower behaviour this design relies on).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp.strategy import Strategy

from .codes import GradientCode
from .privacy import DPConfig, PrivacyAccountant, decoded_noise_variance
from .results import RoundRecorder

__all__ = [
    "EarlyReturnGrid",
    "GradientCoding",
    "ServerOptimizer",
    "flatten",
    "to_array_record",
    "unflatten",
]

UPDATE_KINDS = ("gradient", "local")
TIMINGS = ("virtual", "wallclock")
SERVER_OPTIMIZERS = ("sgd", "momentum", "adam")


def flatten(arrays: ArrayRecord) -> tuple[np.ndarray, list[tuple[str, tuple[int, ...]]]]:
    """An ArrayRecord as one float64 vector plus the ``(name, shape)`` layout to undo it."""
    layout, parts = [], []
    for name, arr in arrays.items():
        a = arr.numpy()
        layout.append((name, tuple(a.shape)))
        parts.append(np.asarray(a, dtype=np.float64).reshape(-1))
    flat = np.concatenate(parts) if parts else np.zeros(0)
    return flat, layout


def unflatten(flat: np.ndarray, layout: list[tuple[str, tuple[int, ...]]]) -> dict[str, np.ndarray]:
    """Inverse of :func:`flatten` (as a ``{name: array}`` dict)."""
    out, start = {}, 0
    for name, shape in layout:
        size = int(np.prod(shape)) if shape else 1
        out[name] = flat[start : start + size].reshape(shape).copy()
        start += size
    if start != flat.size:
        raise ValueError(f"vector of {flat.size} values does not fill the layout ({start})")
    return out


def to_array_record(arrays: Mapping[str, np.ndarray]) -> ArrayRecord:
    """``{name: ndarray}`` as a Flower ArrayRecord (keys kept in order)."""
    return ArrayRecord({name: Array(np.asarray(a)) for name, a in arrays.items()})


class ServerOptimizer:
    """Applies a decoded pseudo-gradient with a torch optimizer (SGD, SGD+momentum, Adam).

    ``step(theta, g)`` returns the new parameters; the optimizer state persists across rounds.
    """

    def __init__(self, name: str = "sgd", lr: float = 1.0, momentum: float = 0.9) -> None:
        if name not in SERVER_OPTIMIZERS:
            raise ValueError(f"server-optimizer={name!r}; expected one of {SERVER_OPTIMIZERS}")
        if not (math.isfinite(lr) and lr > 0):
            raise ValueError(f"lr={lr!r} must be a positive finite number")
        self.name, self.lr, self.momentum = name, float(lr), float(momentum)
        self._param: torch.nn.Parameter | None = None
        self._opt: torch.optim.Optimizer | None = None

    def step(self, theta: np.ndarray, pseudo_gradient: np.ndarray) -> np.ndarray:
        if self._param is None or self._param.numel() != theta.size:
            self._param = torch.nn.Parameter(torch.tensor(theta, dtype=torch.float64))
            if self.name == "adam":
                self._opt = torch.optim.Adam([self._param], lr=self.lr)
            else:
                momentum = self.momentum if self.name == "momentum" else 0.0
                self._opt = torch.optim.SGD([self._param], lr=self.lr, momentum=momentum)
        with torch.no_grad():
            self._param.copy_(torch.as_tensor(theta, dtype=torch.float64))
        self._param.grad = torch.tensor(pseudo_gradient, dtype=torch.float64)
        self._opt.step()
        return self._param.detach().numpy().copy()


class _Rejected(Exception):
    """A reply that must not be decoded; the message says why."""


class EarlyReturnGrid:
    """Delegating wrapper of a Flower ``Grid`` whose TRAIN rounds return early.

    ``send_and_receive`` pushes the messages and polls; a TRAIN round returns when
    ``strategy.ready(replies)`` holds or the strategy's deadline passes. Unanswered messages
    are remembered; their replies are pulled in later rounds and handed to
    ``strategy.on_late_reply`` (and freed from the link state). Every other message type keeps
    Flower's semantics. ``busy_nodes()`` lists nodes still holding unanswered work.
    """

    def __init__(self, grid: Any, strategy: GradientCoding, poll_interval: float = 0.02) -> None:
        self._grid = grid
        self._strategy = strategy
        self.poll_interval = poll_interval
        self.abandoned: dict[str, int] = {}  # message id -> destination node

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)

    def busy_nodes(self) -> set[int]:
        return set(self.abandoned.values())

    def collect_late(self) -> None:
        """Pull replies to earlier rounds that have arrived (frees their nodes)."""
        if not self.abandoned:
            return
        for reply in self._grid.pull_messages(list(self.abandoned)):
            self._drop_if_late(reply)

    def _drop_if_late(self, reply: Message) -> bool:
        """Hand a reply to an abandoned message to the strategy; ``False`` if it is not one."""
        rid = reply.metadata.reply_to_message_id
        if rid not in self.abandoned:
            return False
        del self.abandoned[rid]
        self._strategy.on_late_reply(reply)
        return True

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None):
        msgs = list(messages)
        if not msgs or not msgs[0].metadata.message_type.startswith("train"):
            self.collect_late()
            return self._grid.send_and_receive(msgs, timeout=timeout)
        ids = list(self._grid.push_messages(msgs))
        pending = {mid: m.metadata.dst_node_id for mid, m in zip(ids, msgs, strict=True) if mid}
        t_end = time.monotonic() + self._strategy.deadline_s(timeout)
        # round 1 (actor start-up): the straggler deadline counts from the first reply
        from_first = self._strategy.deadline_from_first_reply()
        replies: list[Message] = []
        while True:
            asked = [*pending, *self.abandoned]
            for reply in self._grid.pull_messages(asked) if asked else []:
                rid = reply.metadata.reply_to_message_id
                if rid in pending:
                    del pending[rid]
                    replies.append(reply)
                else:
                    self._drop_if_late(reply)
            if from_first and replies:
                t_end = min(t_end, time.monotonic() + self._strategy.straggler_timeout)
                from_first = False
            if not pending or self._strategy.ready(replies) or time.monotonic() >= t_end:
                break
            time.sleep(self.poll_interval)
        self.abandoned.update(pending)
        return replies


@dataclass
class _RoundState:
    number: int
    sent: dict[int, int]  # worker -> node id
    busy: list[int]
    wall_start: float
    virtual_start: float
    rejected: list[tuple[int, str]] = field(default_factory=list)


class GradientCoding(Strategy):
    """Gradient-coded federated rounds that end at the first decodable set of replies.

    Args:
        code: the gradient code; its ``n`` is the number of clients (SuperNodes) and its
            ``weights`` the partition weights (e.g. partition sizes / total).
        update: ``"gradient"`` (each partition's mean gradient at the global model; the server
            steps along the decoded weighted sum) or ``"local"`` (each partition's model delta
            after ``local_epochs`` of seeded minibatch SGD; the decoded size-weighted sum is
            FedAvg over partitions, applied as pseudo-gradient ``-delta``).
        lr: server step size (``gradient``) / client SGD step (``local``).
        server_optimizer: ``"sgd"``, ``"momentum"`` or ``"adam"``.
        server_lr: server step on the FedAvg delta in ``local`` mode (default 1.0 = FedAvg).
        timing: ``"virtual"`` or ``"wallclock"`` (see the module docstring).
        straggler_timeout: seconds (wall or virtual) after which the round decodes
            approximately from what arrived.
        max_decode_error: quality bar: an approximate decoding with a larger
            ``||B_F^T a - 1||^2 / k`` (weighted) is not applied and the round is skipped.
        client_config: extra keys sent to every client in its ConfigRecord (dataset, ...).
        evaluate_fn: centralized evaluation ``f(round, ArrayRecord) -> MetricRecord | None``,
            called after each round's update (its ``accuracy``/``loss`` go into the record).
        recorder: where to write ``rounds.jsonl`` and ``final_model.npz``.
        round_timeout: wall-clock limit of a virtual-timing round (the simulation must finish).
        dp: public DP parameters (``fl_gradcode.privacy.DPConfig``); clients apply the
            per-partition mechanism, the server adds noise after decoding in ``central`` mode.
        accountant: Opacus-backed accountant; one step per round in which work was sent.
            With ``dp.target_epsilon`` a round that would exceed the budget is not run: no
            message is sent, the last model within budget is kept and the round is recorded
            with ``stopped``.
        min_replies: also end the round (decoding approximately) once this many valid replies
            are in; the policy of approximate codes and of ignore-stragglers ("the fastest
            ``n - s``"). ``None``: only a decodable set or the deadline ends a round.
        warmup_timeout: longest wait for the first reply of round 1 in wallclock mode (actor
            start-up); the straggler deadline of round 1 then counts from that first reply.
    """

    def __init__(
        self,
        code: GradientCode,
        *,
        update: str = "gradient",
        lr: float = 0.5,
        server_optimizer: str = "sgd",
        server_lr: float = 1.0,
        momentum: float = 0.9,
        timing: str = "virtual",
        straggler_timeout: float = 10.0,
        max_decode_error: float = 0.5,
        client_config: Mapping[str, Any] | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
        recorder: RoundRecorder | None = None,
        round_timeout: float = 600.0,
        warmup_timeout: float = 120.0,
        min_replies: int | None = None,
        num_rounds: int | None = None,
        dp: DPConfig | None = None,
        accountant: PrivacyAccountant | None = None,
        seed: int = 0,
    ) -> None:
        if not isinstance(code, GradientCode):
            raise ValueError(f"code must be a GradientCode; got {type(code).__name__}")
        if hasattr(code, "message_length"):
            raise ValueError(
                f"code {code.name!r} sends 1/m-length replies; the strategy supports codes whose "
                "reply is sum_j B[i,j] w_j u_j (all other registry codes)"
            )
        if update not in UPDATE_KINDS:
            raise ValueError(f"update={update!r}; expected one of {UPDATE_KINDS}")
        if timing not in TIMINGS:
            raise ValueError(f"timing={timing!r}; expected one of {TIMINGS}")
        if not straggler_timeout > 0:
            raise ValueError(f"straggler-timeout={straggler_timeout!r} must be > 0 seconds")
        self.code = code
        self.update = update
        self.lr = float(lr)
        self.timing = timing
        self.straggler_timeout = float(straggler_timeout)
        self.max_decode_error = float(max_decode_error)
        self.client_config = dict(client_config or {})
        self.evaluate_fn = evaluate_fn
        self.recorder = recorder
        self.round_timeout = float(round_timeout)
        self.warmup_timeout = float(warmup_timeout)
        self.num_rounds = num_rounds
        if min_replies is not None and not 1 <= min_replies <= code.n:
            raise ValueError(f"min-replies={min_replies!r} must be in 1..n={code.n}")
        self.min_replies = min_replies
        self.dp = dp or DPConfig()
        self.accountant = accountant
        self.seed = int(seed)
        self.stopped = False
        step = self.lr if update == "gradient" else float(server_lr)
        self.optimizer = ServerOptimizer(server_optimizer, step, momentum)
        self.node_of_worker: dict[int, int] = {}
        self.worker_of_node: dict[int, int] = {}
        self.busy_until = np.zeros(code.n)  # virtual time each worker is busy until
        self.virtual_clock = 0.0
        self.history: list[dict[str, Any]] = []
        self._round: _RoundState | None = None
        self._grid: Any = None
        self._late_since_last_round = 0
        self._layout: list[tuple[str, tuple[int, ...]]] | None = None
        self._theta: np.ndarray | None = None

    # ------------------------------------------------------------------ grid plumbing
    def wrap_grid(self, grid: Any) -> EarlyReturnGrid:
        """The grid to pass to ``start`` (of this strategy or of any wrapper around it)."""
        if isinstance(grid, EarlyReturnGrid):
            return grid
        return EarlyReturnGrid(grid, self)

    def start(self, grid: Any, initial_arrays: ArrayRecord, *args: Any, **kwargs: Any):
        """Flower's ``start`` with the grid wrapped for early return."""
        return super().start(self.wrap_grid(grid), initial_arrays, *args, **kwargs)

    def deadline_from_first_reply(self) -> bool:
        """Wallclock round 1: count the straggler deadline from the first reply, since the first
        replies can be delayed by actor or process start-up (``warmup_timeout`` bounds the wait)."""
        return self.timing == "wallclock" and self._round is not None and self._round.number == 1

    def deadline_s(self, timeout: float | None) -> float:
        """Wall-clock deadline of the current TRAIN round, used by :class:`EarlyReturnGrid`."""
        if self.timing == "virtual":
            limit = self.round_timeout
        elif self._round is not None and self._round.number == 1:
            limit = max(self.straggler_timeout, self.warmup_timeout)
        else:
            limit = self.straggler_timeout
        return min(limit, timeout) if timeout else limit

    def ready(self, replies: list[Message]) -> bool:
        """Wallclock early return: the valid replies so far form a decodable set."""
        if self.timing != "wallclock" or self._round is None:
            return False
        workers = []
        for reply in replies:
            try:
                workers.append(self._validate(reply, self._round)[0])
            except _Rejected:
                continue
        if len(set(workers)) != len(workers):
            return False
        if self.min_replies is not None and len(workers) >= self.min_replies:
            return True
        return self.code.is_decodable(workers)

    def on_late_reply(self, reply: Message) -> None:
        """A reply to an earlier round's message: counted and dropped, never decoded."""
        self._late_since_last_round += 1
        node = reply.metadata.src_node_id
        log(
            INFO,
            "dropped late reply from node %s (worker %s) to round %s",
            node,
            self.worker_of_node.get(node, "?"),
            reply.metadata.group_id,
        )

    # ------------------------------------------------------------------ worker identity
    def _assign_workers(self, grid: Any) -> None:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) < self.code.n:
            raise RuntimeError(
                f"the code needs n={self.code.n} clients but only {len(nodes)} SuperNodes are "
                "connected; start more SuperNodes or build the code for fewer clients"
            )
        queries = [
            Message(
                RecordDict({"config": ConfigRecord({"query": "worker-index"})}),
                dst_node_id=node,
                message_type="query",
            )
            for node in nodes
        ]
        claimed: dict[int, int] = {}
        for reply in grid.send_and_receive(queries, timeout=self.warmup_timeout):
            if reply.has_error() or "meta" not in reply.content.metric_records:
                continue
            worker = reply.content.metric_records["meta"].get("worker")
            if isinstance(worker, int) and 0 <= worker < self.code.n:
                claimed[reply.metadata.src_node_id] = worker
        workers = list(claimed.values())
        if len(claimed) == self.code.n and len(set(workers)) == self.code.n:
            self.worker_of_node = dict(claimed)
        else:
            log(
                WARNING,
                "SuperNodes did not report distinct worker indices 0..%d (got %s); "
                "assigning workers by sorted node id",
                self.code.n - 1,
                sorted(workers),
            )
            self.worker_of_node = {node: w for w, node in enumerate(nodes[: self.code.n])}
        self.node_of_worker = {w: node for node, w in self.worker_of_node.items()}

    # ------------------------------------------------------------------ Strategy API
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Any
    ) -> Iterable[Message]:
        if not self.node_of_worker:
            self._assign_workers(grid)
            if self.evaluate_fn is not None and not self.history:
                self.evaluate_fn(0, arrays)
        self._theta, self._layout = flatten(arrays)
        if self.stopped or (self.accountant is not None and not self.accountant.can_run_round()):
            if not self.stopped:
                log(
                    INFO,
                    "round %d would exceed target-epsilon=%.3g (epsilon now %.3f): training "
                    "stops; the last model within budget is kept",
                    server_round,
                    self.dp.target_epsilon,
                    self.accountant.epsilon,
                )
            self.stopped = True
            self._round = _RoundState(server_round, {}, [], time.monotonic(), self.virtual_clock)
            return []
        if self.timing == "virtual":
            busy = [w for w in range(self.code.n) if self.busy_until[w] > self.virtual_clock]
        else:
            busy_nodes: set[int] = set()
            if isinstance(grid, EarlyReturnGrid):
                grid.collect_late()  # a client whose late reply is in is free again
                busy_nodes = grid.busy_nodes()
            busy = sorted(self.worker_of_node[n] for n in busy_nodes if n in self.worker_of_node)
        messages, sent = [], {}
        for worker in range(self.code.n):
            if worker in busy:
                continue
            parts = list(self.code.assignment(worker))
            cfg = ConfigRecord(
                {
                    **self.client_config,
                    **dict(config),
                    "server-round": server_round,
                    "worker": worker,
                    "partitions": parts if parts else [-1],
                    "coefficients": [float(c) for c in self.code.encoding_coefficients(worker)]
                    if parts
                    else [0.0],
                    "num-partitions": self.code.k,
                    "update": self.update,
                    "lr": self.lr,
                    "timing": self.timing,
                    "dp": self.dp.mode,
                    "clip-norm": self.dp.clip_norm,
                    "noise-multiplier": self.dp.noise_multiplier,
                    "dp-noise": self.dp.noise,
                }
            )
            node = self.node_of_worker[worker]
            content = RecordDict({"arrays": arrays, "config": cfg})
            messages.append(
                Message(content, dst_node_id=node, message_type="train", group_id=str(server_round))
            )
            sent[worker] = node
        self._round = _RoundState(
            server_round, sent, busy, time.monotonic(), self.virtual_clock
        )
        self._grid = grid
        return messages

    def _validate(self, reply: Message, state: _RoundState) -> tuple[int, np.ndarray, float]:
        node = reply.metadata.src_node_id
        if reply.has_error():
            raise _Rejected(f"error reply (code {reply.error.code}: {reply.error.reason})")
        if node not in self.worker_of_node:
            raise _Rejected("unknown sender")
        worker = self.worker_of_node[node]
        if reply.metadata.group_id != str(state.number):
            raise _Rejected(f"reply to round {reply.metadata.group_id!r}, not {state.number}")
        if worker not in state.sent:
            raise _Rejected("sender was not sent work this round")
        content = reply.content
        if "coded" not in content.array_records or "meta" not in content.metric_records:
            raise _Rejected("reply lacks the 'coded' ArrayRecord or the 'meta' MetricRecord")
        record = content.array_records["coded"]
        if list(record.keys()) != ["update"]:
            raise _Rejected(f"'coded' must hold exactly one array 'update'; got {list(record)}")
        vec = record["update"].numpy()
        if vec.dtype.kind not in "fi":
            raise _Rejected(f"update dtype {vec.dtype} is not real numeric")
        expected = (self._theta.size,)
        if vec.shape != expected:
            raise _Rejected(f"update shape {vec.shape}; expected {expected}")
        if not np.all(np.isfinite(vec)):
            raise _Rejected("update contains NaN or Inf")
        meta = content.metric_records["meta"]
        if meta.get("worker") != worker:
            raise _Rejected(f"claims worker {meta.get('worker')!r} but node is worker {worker}")
        if meta.get("server-round") != state.number:
            raise _Rejected(f"computed for round {meta.get('server-round')!r}")
        virtual_s = float(meta.get("virtual-s", 0.0))
        if not (math.isfinite(virtual_s) and virtual_s >= 0):
            raise _Rejected(f"virtual-s={virtual_s!r} is not a non-negative time")
        return worker, vec.astype(np.float64), virtual_s

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        state = self._round
        if state is None or state.number != server_round or self._theta is None:
            raise RuntimeError(f"aggregate_train({server_round}) without configure_train")
        wall_s = time.monotonic() - state.wall_start
        valid: dict[int, tuple[np.ndarray, float]] = {}
        answered: set[int] = set()
        for reply in replies:
            node = reply.metadata.src_node_id
            if node in self.worker_of_node:
                answered.add(self.worker_of_node[node])
            try:
                worker, vec, virtual_s = self._validate(reply, state)
                if worker in valid:
                    raise _Rejected("duplicate sender")
            except _Rejected as why:
                state.rejected.append((node, str(why)))
                log(
                    WARNING,
                    "round %d: rejected reply from node %s (worker %s): %s",
                    server_round,
                    node,
                    self.worker_of_node.get(node, "?"),
                    why,
                )
                continue
            valid[worker] = (vec, virtual_s)

        late = self._late_since_last_round
        self._late_since_last_round = 0
        used, virtual_end = self._choose_replies(valid, state)
        if self.timing == "virtual":
            late += len(set(valid) - set(used))
            for worker, (_, virtual_s) in valid.items():
                self.busy_until[worker] = state.virtual_start + virtual_s
            for worker in set(state.sent) - answered:  # no reply at all: busy until the deadline
                self.busy_until[worker] = state.virtual_start + self.straggler_timeout
            self.virtual_clock = virtual_end
        else:
            self.virtual_clock += wall_s
            virtual_end = self.virtual_clock

        decoding = self.code.decoding(used)
        decode = "exact" if decoding.exact else "approx"
        if not used or (not decoding.exact and decoding.error > self.max_decode_error):
            decode = "skipped"
        theta = self._theta
        noise_var = None
        if self.dp.enabled and state.sent:
            noise_var = self._decoded_noise_variance(decoding)
        if decode != "skipped":
            total = self.code.decode({w: valid[w][0] for w in used}, approximate=True)
            if self.dp.mode == "central":
                total += self._central_noise(decoding, server_round, theta.size)
            pseudo = total if self.update == "gradient" else -total
            new_theta = self.optimizer.step(theta, pseudo)
            if np.all(np.isfinite(new_theta)):
                theta = new_theta
            else:
                log(WARNING, "round %d: update made the model non-finite; kept it", server_round)
                decode = "skipped"
        arrays = to_array_record(unflatten(theta, self._layout))
        if self.accountant is not None and state.sent:
            self.accountant.step()  # the round released noisy updates, used or not
        row = {
            "round": server_round,
            "decode": decode,
            "clients_used": sorted(used),
            "stragglers": sorted(set(range(self.code.n)) - set(used)),
            "busy": state.busy,
            "late_dropped": late,
            "rejected": len(state.rejected),
            "rejected_reasons": [reason for _, reason in state.rejected],
            "decode_error": float(decoding.error) if used else 1.0,
            "virtual_s": float(virtual_end),
            "round_virtual_s": float(virtual_end - state.virtual_start),
            "wall_s": float(wall_s),
            "accuracy": None,
            "loss": None,
            "epsilon": None if self.accountant is None else self.accountant.epsilon,
            "noise_variance": noise_var,
            "stopped": self.stopped,
        }
        if self.evaluate_fn is not None:
            res = self.evaluate_fn(server_round, arrays)
            if res is not None:
                row["accuracy"] = res.get("accuracy")
                row["loss"] = res.get("loss")
        self.history.append(row)
        if self.recorder is not None:
            self.recorder.record(row)
            self.recorder.save_model(unflatten(theta, self._layout))
        self._log_progress(row)
        metrics = MetricRecord(
            {
                "decoded": int(decode != "skipped"),
                "exact": int(decode == "exact"),
                "clients-used": len(used),
                "stragglers": len(row["stragglers"]),
                "late-dropped": late,
                "rejected": row["rejected"],
                "decode-error": row["decode_error"],
                "virtual-s": row["virtual_s"],
                "wall-s": row["wall_s"],
                **({"accuracy": row["accuracy"]} if row["accuracy"] is not None else {}),
                **({"loss": row["loss"]} if row["loss"] is not None else {}),
                **({"epsilon": row["epsilon"]} if row["epsilon"] is not None else {}),
                "stopped": int(self.stopped),
            }
        )
        return arrays, metrics

    def _decoded_noise_variance(self, decoding) -> float:
        """Per-coordinate variance of the DP noise in the decoded sum (before the step)."""
        std = self.dp.noise_multiplier * self.dp.clip_norm
        if self.dp.mode == "central":
            return float(self._central_std(decoding) ** 2)
        if self.dp.mode != "partition":
            return float("nan")  # record-level noise lives inside local training
        return decoded_noise_variance(
            self.code.B,
            self.code.weights,
            decoding.coefficients,
            decoding.alpha,
            std,
            self.dp.noise,
        )

    def _central_std(self, decoding) -> float:
        """Noise std so that every partition's contribution ``alpha_j w_j clip(u_j)`` (norm
        ``<= |alpha_j| w_j C``) is covered by ``noise_multiplier`` times its sensitivity."""
        scale = float(np.max(np.abs(decoding.alpha) * self.code.weights))
        return self.dp.noise_multiplier * self.dp.clip_norm * scale

    def _central_noise(self, decoding, server_round: int, dim: int) -> np.ndarray:
        gen = np.random.Generator(np.random.PCG64([self.seed, server_round, 0xC0DE]))
        return self._central_std(decoding) * gen.standard_normal(dim)

    def _choose_replies(
        self, valid: Mapping[int, tuple[np.ndarray, float]], state: _RoundState
    ) -> tuple[list[int], float]:
        """Which replies to decode from, and the virtual time the round ends."""
        if self.timing == "wallclock" or not state.sent:
            return sorted(valid), state.virtual_start
        order = sorted(valid, key=lambda w: (valid[w][1], w))
        deadline = state.virtual_start + self.straggler_timeout
        prefix: list[int] = []
        for worker in order:
            arrival = state.virtual_start + valid[worker][1]
            if arrival > deadline:
                break
            prefix.append(worker)
            if self.code.is_decodable(prefix) or (
                self.min_replies is not None and len(prefix) >= self.min_replies
            ):
                return prefix, arrival
        if len(prefix) == len(state.sent) and prefix:  # everyone replied, still not decodable
            return prefix, state.virtual_start + valid[prefix[-1]][1]
        return prefix, deadline

    def _log_progress(self, row: Mapping[str, Any]) -> None:
        total = f"/{self.num_rounds}" if self.num_rounds else ""
        acc = "" if row["accuracy"] is None else f" | acc {row['accuracy']:.3f}"
        loss = "" if row["loss"] is None else f" loss {row['loss']:.3f}"
        log(
            INFO,
            "[round %d%s] %-7s from %2d/%d replies (%d stragglers, %d busy, %d late, %d rejected,"
            " err %.2g)%s%s | virtual %.2f s, wall %.2f s",
            row["round"],
            total,
            row["decode"],
            len(row["clients_used"]),
            self.code.n,
            len(row["stragglers"]),
            len(row["busy"]),
            row["late_dropped"],
            row["rejected"],
            row["decode_error"],
            acc,
            loss,
            row["virtual_s"],
            row["wall_s"],
        )

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Any
    ) -> Iterable[Message]:
        """No federated evaluation: the model is evaluated centrally (``evaluate_fn``)."""
        return []

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> None:
        return None

    def summary(self) -> None:
        log(
            INFO,
            "\t├── GradientCoding: code %s (n=%d, k=%d, s=%d, load %d), update=%s, timing=%s, "
            "straggler-timeout=%.1f s, server optimizer %s",
            self.code.name,
            self.code.n,
            self.code.k,
            self.code.s,
            self.code.load,
            self.update,
            self.timing,
            self.straggler_timeout,
            self.optimizer.name,
        )
