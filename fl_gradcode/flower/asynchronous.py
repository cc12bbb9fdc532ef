"""Buffered asynchronous aggregation over replicated partitions: FedBuff that never starves
the slow clients' data.

FedBuff (Nguyen et al., *Federated Learning with Buffered Asynchronous Aggregation*, AISTATS
2022, https://arxiv.org/abs/2106.06639) applies a server step every ``K`` arrivals, so a
persistently slow client's data enters the model rarely and stale: in the benchmark's
persistent regime FedBuff reached its target on the fast clients' data alone. Gradient coding
places every partition on ``s + 1`` clients (the cyclic repetition placement of Tandon et al.,
*Gradient Coding*, ICML 2017, Sec. 4: the client of partition ``p`` holds ``p, ..., p + s``
mod ``N``) so that a synchronous round needs none of ``s`` stragglers. Asynchronously no
decodable set is needed: each job is ONE partition the client holds (the coding mod's
instruction with one partition and coefficient 1), the one served least so far (its jobs in
flight or used; a job that brought no update, such as a device gone off, is not counted;
ties: the client's own, then the next in the cycle), so a slow
client's partitions are computed by its fast neighbours as often as any other partition
while every job is one partition's work, as a FedBuff job is. With ``s = 0`` it is FedBuff.

``replicate_below`` (``theta`` in ``[0, 1]``) makes the replication react to what is observed: a
client computes another held partition than its own only while that partition's jobs are fewer
than ``theta`` times its own partition's (then the least served of those). ``theta = 1`` is the
least-served rule above; ``theta = 0`` is FedBuff, whatever ``s``. In between, a persistently
slow client's partitions fall behind and are served by its neighbours at about ``theta`` times
a fast client's rate, while mild transient stragglers leave every count near the others and
the clients compute their own partitions, as FedBuff's do. A one-off straggle long enough to
put a client's own count ``1 - theta`` behind its neighbour's trips the bar as well: a bar near
1 replicates under transient stragglers too.

``replicate_margin`` (``z >= 0``, default 0: the bar alone) asks the gap to be more than chance
as well: the neighbour's partition counts as behind only while its own partition's jobs lead
it by more than ``z`` standard deviations of that lead under equal rates
(``own - theirs > z * sqrt(own + theirs)``, two counts of one rate). A persistently slow
client's lead grows in proportion to the jobs, so it passes once the counts are about
``2 z^2``; a transient straggle's lead grows about as their square root and rarely does. It
reads speed, not need: where the slow clients' data does not matter, replication still
starts, later.

``need_ratio`` (``rho > 0``, default infinite: off) reads need instead: a neighbour's partition
whose last update (its model delta, whoever computed it) was more than ``rho`` times as large
as the client's own partition's last update is served up to the own partition's count, as if
the bar were 1; the others up to ``replicate_below`` times it. A partition whose data the model
already fits sends small updates; one holding what the others lack sends large ones until it
is fitted, so the replication is meant to follow the partition's value, not only its service.
One update's norm is a noisy reading of it (and the last to arrive, possibly a stale one, is
the one kept): on non-IID data many partitions cross a small ``rho`` by chance. Sampling
in proportion to the update norm is the variance-optimal client sampling of Chen, Horváth and
Richtárik, *Optimal Client Sampling for Federated Learning*, TMLR 2022,
https://arxiv.org/abs/2010.13723; here the norm only switches a neighbour's bar. Served as
much, a needed partition's updates shrink and its bar falls back, so its service swings;
``need_latch=True`` keeps the bar 1 for the rest of the run once a partition has been seen to
be needed (read when a holder is sent a job), so every chance crossing lasts too.

``need_reference="era"`` (default ``"own"``: the comparison above) reads need against the
federation instead of one neighbour, and over more than one update: each update's norm is
divided by the median norm of the updates computed, before it arrived, from the models of the
same server step or the :data:`ERA_STEPS` before (any partition's; at least three of them),
so a stale update is compared with the updates of its own era, when every partition's
updates were larger; a partition is needed once the geometric mean of its last
:data:`ERA_READINGS` such ratios (at least two) exceeds ``need_ratio``. A partition's need is
then read from its own data against everyone's, not from one neighbour's last reply; it still
takes a few of its updates to read, so a partition whose data is needed from the start is
served at ``replicate_below`` until then. A reading needs at least three earlier arrivals in
its era (and a positive median and norm): where ``K`` is small few updates of a three-step
era arrive before a later one, and the rule rarely reads. ``need_reference="cohort"`` makes
the era an update's own step and the ``ceil(concurrency / K)`` before it (about one update of
each client in flight; no wider than ``"era"``'s where ``K`` is at least half the
concurrency), and ``need_prior=True`` serves a partition with fewer than two readings as if
needed (the bar 1, not latched): its first updates come at a fast partition's rate, and it
falls to ``replicate_below`` once read and not needed.

``lag_level`` (``L`` in ``(0, 1]``, default ``None``: off) reads need from the model instead
of the updates, so that it does not depend on the service it steers: after each server step
the ``evaluate_fn`` returns the recall of each class on the server's held-out data
(:data:`CLASS_RECALL_KEY`; the initial model's evaluation must hold them but is not read: its
recalls are where an untrained model's guesses fall); once the median class's recall is at
least ``L`` while some class's best recall so far is below :data:`LAG_FLOOR`, every held
partition gets the bar 1 for the rest of the run (``s = 1``'s least-served rule, with
``replicate_margin`` as set): the model has learnt most classes and never one, so that
class's examples are not reaching it, as when only persistently slow clients hold it. Before
that the bar is ``replicate_below`` (0: FedBuff; 1 is refused: the switch would change
nothing). A switch late in a run, after the slow partitions have been served little, brings a
burst: their neighbours compute them until each has as many jobs as its holder's own
partition, so for a while most jobs compute the slow clients' data. It is wrong where a class
is never learnt for another reason (too few examples of it anywhere, a model that cannot fit
it: replication then costs its compute and buys nothing), where the slow clients' data is
needed without a class missing (skewed features, quantity skew: it stays FedBuff-like), where
the median never reaches ``L`` (a hard task: it never switches), and where the held-out data
does not represent the classes the federation should learn.

Everything else is :class:`~fl_gradcode.rivals.FedBuff`'s: which idle client gets a free slot
(seeded, uniformly), the virtual clock (a job's latency is drawn for the client's own device,
its load is the computed partition's size over the mean), staleness weights, the server step.
The ClientApp needs :func:`~fl_gradcode.flower.gradient_coding_mod` (the partitions a client
may compute are the ones its data loader serves for ``partition-id``, as in the coded rounds).
Before the first job every node is asked for its partition (the coded rounds' handshake); a
node that does not answer gets no job, nor does one whose claim the coded rounds would refuse
(another ``num-partitions`` than most claims state, every claim on a tied vote, both claimants
of one partition), and a partition none of the used nodes holds is never computed (a warning
names how many).
"""

from __future__ import annotations

import math
import secrets
import statistics
from collections import deque
from collections.abc import Callable, Mapping
from logging import WARNING
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result

from ..rivals.fedbuff import FedBuff
from . import protocol
from .deadline import reply_bytes
from .membership import judge_claims
from .protocol import Instruction, RejectedReply
from .senders import answering_node

__all__ = ["AUTO_LAG_LEVEL", "AUTO_NEED_LATCH", "AUTO_NEED_PRIOR", "AUTO_NEED_RATIO",
           "AUTO_NEED_REFERENCE", "AUTO_REPLICATE_BELOW", "AUTO_REPLICATE_MARGIN", "AUTO_S",
           "CLASS_RECALL_KEY", "ERA_READINGS", "ERA_STEPS", "LAG_FLOOR", "NEED_REFERENCES",
           "ReplicatedFedBuff", "auto_keywords", "cyclic_placement"]

#: what an asynchronous run with ``s="auto"`` runs: the placement ``s = 1`` and the rule whose
#: development reading ranked first by ``experiments/grid.toml``'s amendments 24 to 32 (one
#: rule for every cell; ``experiments.async_bar.auto_rule``): amendment 32's class reading
#: (the bar 0, FedBuff, until the median class recall is 0.9 with a class never learnt, then
#: the least-served held partition for good), whose development worst ratio to the best
#: fixed ``s`` was below the fixed ``s = 1``'s (amendment 30), itself below every
#: update-norm rule's (amendments 24 to 29)
AUTO_S = 1
AUTO_REPLICATE_BELOW = 0.0
AUTO_REPLICATE_MARGIN = 0.0
AUTO_NEED_RATIO = math.inf
AUTO_NEED_LATCH = False
AUTO_NEED_REFERENCE = "own"
AUTO_NEED_PRIOR = False
AUTO_LAG_LEVEL: float | None = 0.9


def auto_keywords() -> dict[str, Any]:
    """:class:`ReplicatedFedBuff`'s keywords of ``s="auto"`` (the ``AUTO_*`` constants): what
    an asynchronous run with ``s="auto"`` runs, FedBuff's own settings aside."""
    return {"s": AUTO_S, "replicate_below": AUTO_REPLICATE_BELOW,
            "replicate_margin": AUTO_REPLICATE_MARGIN, "need_ratio": AUTO_NEED_RATIO,
            "need_latch": AUTO_NEED_LATCH, "need_reference": AUTO_NEED_REFERENCE,
            "need_prior": AUTO_NEED_PRIOR, "lag_level": AUTO_LAG_LEVEL}


#: the ``evaluate_fn`` metric ``lag_level`` reads: the recall of each class on the server's
#: held-out data (a list of floats, one per class; ``nan`` for a class it has no example of)
CLASS_RECALL_KEY = "class-recall"

#: ``lag_level``: a class whose best recall so far is below this has never been learnt
LAG_FLOOR = 0.1

#: ``need_reference="era"``: an update is compared with the updates computed from the models of
#: its own server step and this many before it
ERA_STEPS = 2
#: ``need_reference="era"``: a partition's need is the geometric mean of its last this many
#: ratios (once it has two)
ERA_READINGS = 3
#: what a neighbour's update norm is compared with (module docstring)
NEED_REFERENCES = ("own", "era", "cohort")

#: the dtype replies are sent in (the instruction's default wire, float64)
_WIRE = np.dtype(np.float64)


def _recalls(metrics: MetricRecord | None) -> list[float] | None:
    """The class recalls of an evaluation's metrics (:data:`CLASS_RECALL_KEY`, a list of
    numbers); ``None`` when absent or not a list of numbers."""
    if metrics is None or CLASS_RECALL_KEY not in metrics:
        return None
    value = metrics[CLASS_RECALL_KEY]
    if not isinstance(value, list) or not value or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in value):
        return None
    return [float(x) for x in value]


def cyclic_placement(partition: int, num_partitions: int, s: int) -> tuple[int, ...]:
    """The partitions the client of ``partition`` holds under cyclic repetition with ``s``
    extra copies: ``partition, partition + 1, ..., partition + s`` (mod ``num_partitions``;
    at most ``num_partitions`` distinct)."""
    if not 0 <= partition < num_partitions:
        raise ValueError(f"partition={partition!r} is not in 0..{num_partitions - 1}")
    if isinstance(s, bool) or not isinstance(s, int) or s < 0:
        raise ValueError(f"s={s!r} must be an integer >= 0")
    return tuple((partition + t) % num_partitions for t in range(min(s, num_partitions - 1) + 1))


class ReplicatedFedBuff(FedBuff):
    """FedBuff whose clients each hold ``s + 1`` partitions (cyclic repetition) and compute,
    in each job, the one held partition served least so far (module docstring).

    Parameters
    ----------
    s : int
        Extra copies of each partition (``>= 0``; 0: FedBuff).
    replicate_below : float
        ``theta`` in ``[0, 1]`` (default 1: the least served held partition, always): another
        held partition than the client's own is computed only while its jobs are fewer than
        ``theta`` times the own partition's (module docstring); 0 is FedBuff.
    replicate_margin : float
        ``z >= 0`` (default 0: the bar alone): and only while the own partition's jobs lead
        its jobs by more than ``z`` times the square root of their sum (module docstring).
    need_ratio : float
        ``rho > 0`` (default ``inf``: off): a held partition whose need reading exceeds
        ``rho`` (by ``need_reference``: its last update's norm over the own partition's
        last, or its recent updates' over their era's) is served up to the own partition's
        count (the bar 1 for it; module docstring).
    need_latch : bool
        ``True``: a partition once seen to be needed keeps the bar 1 for the rest of the run
        (default ``False``: it is read at each job).
    need_reference : str
        ``"own"`` (default): a neighbour's last update norm against the own partition's last;
        ``"era"``: a partition's recent updates against the median of the updates computed
        from models of the same era (its own step and the :data:`ERA_STEPS` before);
        ``"cohort"``: the same over its own step and the ``ceil(concurrency / buffer_size)``
        before (module docstring). Both need a finite ``need_ratio``.
    need_prior : bool
        ``True`` (with ``"cohort"``): a partition read fewer than twice is served as if
        needed (default ``False``: at ``replicate_below``).
    lag_level : float, optional
        ``L`` in ``(0, 1]`` (default ``None``: off): once an evaluation's median class recall
        is at least ``L`` while a class's best recall so far is below :data:`LAG_FLOOR`,
        every held partition gets the bar 1 for the rest of the run (module docstring). Needs
        ``s >= 1``, ``replicate_below < 1`` (at 1 every partition already has the bar 1) and
        an ``evaluate_fn`` whose metrics hold :data:`CLASS_RECALL_KEY`. The evaluation of the
        initial model (step 0) must hold it but is not read; a later one without it is
        skipped, with a warning once per run.
    identify_timeout : float, optional
        Seconds the identification handshake waits for the nodes' answers (default:
        ``start``'s ``timeout``); a node that has not answered by then gets no job.
    **fedbuff : Any
        :class:`~fl_gradcode.rivals.FedBuff`'s arguments (``buffer_size``, ``concurrency``,
        ``server_lr``, ``latency``, ``seed``, ``partition_sizes``, ...).
    """

    def __init__(self, *, s: int, replicate_below: float = 1.0, replicate_margin: float = 0.0,
                 need_ratio: float = math.inf, need_latch: bool = False,
                 need_reference: str = "own", need_prior: bool = False,
                 lag_level: float | None = None,
                 identify_timeout: float | None = None, **fedbuff: Any) -> None:
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise ValueError(f"s={s!r} must be an integer >= 0 (extra copies of a partition)")
        if (isinstance(replicate_below, bool) or not isinstance(replicate_below, (int, float))
                or not 0.0 <= replicate_below <= 1.0):
            raise ValueError(f"replicate_below={replicate_below!r} must be a number in [0, 1] "
                             "(0: FedBuff, each client its own partition; 1: the least served)")
        if (isinstance(replicate_margin, bool)
                or not isinstance(replicate_margin, (int, float))
                or not (math.isfinite(replicate_margin) and replicate_margin >= 0)):
            raise ValueError(f"replicate_margin={replicate_margin!r} must be a finite number "
                             ">= 0 (standard deviations of the lead; 0: the bar alone)")
        if (isinstance(need_ratio, bool) or not isinstance(need_ratio, (int, float))
                or not need_ratio > 0):
            raise ValueError(f"need_ratio={need_ratio!r} must be a number > 0 (how many times "
                             "the own partition's last update norm a neighbour's must exceed "
                             "to be served as much; inf: off)")
        if not isinstance(need_latch, bool):
            raise ValueError(f"need_latch={need_latch!r} must be True or False")
        if need_reference not in NEED_REFERENCES:
            raise ValueError(f"need_reference={need_reference!r} must be one of "
                             f"{', '.join(map(repr, NEED_REFERENCES))}")
        if not isinstance(need_prior, bool) or (need_prior and need_reference != "cohort"):
            raise ValueError(f"need_prior={need_prior!r} must be True or False, and True only "
                             "with need_reference 'cohort' (it counts the readings of an era "
                             "that fills; a three-step era rarely does where K is small, and "
                             "the prior would then hold the bar 1 for good)")
        if (need_reference != "own" or need_prior) and math.isinf(need_ratio):
            raise ValueError(f"need_reference={need_reference!r}, need_prior={need_prior!r} "
                             "without a finite need_ratio: they say how need is read; set "
                             "need_ratio or leave them at 'own', False")
        if lag_level is not None and (isinstance(lag_level, bool)
                                      or not isinstance(lag_level, (int, float))
                                      or not 0.0 < lag_level <= 1.0):
            raise ValueError(f"lag_level={lag_level!r} must be a number in (0, 1] (the median "
                             "class recall at which a class never learnt switches every "
                             "partition to the bar 1) or None (off)")
        if lag_level is not None and s == 0:
            raise ValueError(f"lag_level={lag_level!r} with s=0: there is no other partition "
                             "to serve; set s >= 1 or leave lag_level None")
        if lag_level is not None and replicate_below == 1.0:
            raise ValueError(f"lag_level={lag_level!r} with replicate_below=1: every held "
                             "partition has the bar 1 from the start, so the switch would "
                             "change nothing; set replicate_below below 1 (0: FedBuff until "
                             "it switches) or leave lag_level None")
        if identify_timeout is not None and not (math.isfinite(identify_timeout)
                                                 and identify_timeout > 0):
            raise ValueError(f"identify_timeout={identify_timeout!r} must be > 0 seconds or "
                             "None (start's timeout)")
        self.identify_timeout = identify_timeout
        super().__init__(**fedbuff)
        self.s = s
        self.replicate_below = float(replicate_below)
        self.replicate_margin = float(replicate_margin)
        self.need_ratio = float(need_ratio)
        self.need_latch = need_latch
        self.need_reference = need_reference
        self.need_prior = need_prior
        self.lag_level = None if lag_level is None else float(lag_level)
        self.best_recall: list[float] = []  # each class's best recall so far
        self.lagged_at: float | None = None  # virtual time the class reading switched, if it did
        self.era_steps = ERA_STEPS  # the steps before an update's own that make its era
        self.norms: dict[int, float] = {}  # partition -> its last update's norm
        self.era: dict[int, list[float]] = {}  # server step -> norms of updates computed from it
        self.readings: dict[int, deque[float]] = {}  # partition -> its last log ratios to era
        self.needed: set[int] = set()  # partitions latched at the bar 1
        self.identities: dict[int, protocol.Identity] = {}
        self.refused_claims: dict[int, str] = {}  # node -> why its identity is not used
        self.served: dict[int, int] = {}  # partition -> jobs sent for it
        self._nonce = ""

    #: its clients run gradient_coding_mod, which sleeps an instructed delay (wallclock)
    sleeps_latency = True

    # ------------------------------------------------------------------ the handshake
    def _identify(self, grid: Grid, timeout: float) -> list[int]:
        """Ask every node for its partition; the nodes that answered (sorted)."""
        nodes = sorted(grid.get_node_ids())
        msgs = [protocol.instruction_message(
            RecordDict(), Instruction(op=protocol.OP_IDENTIFY, nonce=self._nonce), node,
            "identify") for node in nodes]
        wait = timeout if self.identify_timeout is None else self.identify_timeout
        replies = list(grid.send_and_receive(msgs, timeout=wait)) if msgs else []
        self.identities = {}
        for reply in replies:
            node = answering_node(reply, msgs)
            if node in self.identities or node not in nodes:
                continue
            try:
                self.identities[node] = protocol.parse_identity(reply)
            except RejectedReply as why:
                log(WARNING, "ReplicatedFedBuff: node %s gets no job: %s", node, why)
        refused = self.refused_claims = judge_claims(self.identities)[0]
        for node, why in sorted(refused.items()):
            log(WARNING, "ReplicatedFedBuff: node %s gets no job: %s", node, why)
            del self.identities[node]
        silent = len(nodes) - len(self.identities) - len(refused)
        if silent:
            log(WARNING, "ReplicatedFedBuff: %d of %d nodes did not identify; they get no job",
                silent, len(nodes))
        held = {j for ident in self.identities.values()
                for j in cyclic_placement(ident.partition_id, ident.num_partitions, self.s)}
        counts = {ident.num_partitions for ident in self.identities.values()}
        missing = sum(counts) - len(held) if len(counts) == 1 else 0
        if missing:
            log(WARNING, "ReplicatedFedBuff: %d partitions are held by no node whose identity "
                "is used; they are never computed", missing)
        return sorted(self.identities)

    def _nodes(self, grid: Grid, timeout: float) -> list[int]:
        """The nodes whose identity is used (the handshake comes before the first job)."""
        self._nonce = secrets.token_hex(8)
        self.served = {}
        self.norms = {}
        self.era = {}
        self.readings = {}
        self.needed = set()
        answered = self._identify(grid, timeout)
        if not answered and self.refused_claims:
            raise ValueError(f"ReplicatedFedBuff: every node's identity claim was refused or "
                             f"missing ({len(self.refused_claims)} refused, the others silent "
                             "or malformed; the warnings above say why): no node can be given "
                             "a job")
        if not answered:
            raise ValueError("ReplicatedFedBuff: no node identified its partition (does the "
                             "ClientApp have gradient_coding_mod?)")
        if self.need_reference == "cohort":
            inflight = min(self.concurrency or len(answered), len(answered))
            self.era_steps = math.ceil(inflight / self.buffer_size)
        return answered

    # ------------------------------------------------------------------ the class reading
    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3,
              timeout: float = 3600, train_config: ConfigRecord | None = None,
              evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None
              ) -> Result:
        """:meth:`FedBuff.start`; with ``lag_level``, the class recalls of the evaluation after
        each server step are read. The first evaluation, of the initial model (step 0), must
        hold them (refused before any job), but is not read: an untrained model's recall of a
        class is where its guesses fall, not what it has learnt."""
        self.best_recall, self.lagged_at, self.unread_warned = [], None, False
        if self.lag_level is not None:
            if evaluate_fn is None:
                raise ValueError(f"lag_level={self.lag_level!r} reads the server's evaluation: "
                                 f"pass an evaluate_fn whose metrics hold {CLASS_RECALL_KEY!r} "
                                 "(the recall of each class), or leave lag_level None")
            evaluate_fn = self._reading(evaluate_fn)
        return super().start(grid, initial_arrays, num_rounds, timeout, train_config,
                             evaluate_config, evaluate_fn)

    def _reading(self, evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None]
                 ) -> Callable[[int, ArrayRecord], MetricRecord | None]:
        def evaluate(step: int, arrays: ArrayRecord) -> MetricRecord | None:
            metrics = evaluate_fn(step, arrays)
            recall = _recalls(metrics)
            if step == 0:
                if recall is None or not any(math.isfinite(r) for r in recall):
                    got = None if metrics is None else metrics.get(CLASS_RECALL_KEY)
                    raise ValueError(
                        f"lag_level={self.lag_level!r}: the evaluate_fn's metrics of step 0 "
                        f"hold no {CLASS_RECALL_KEY!r} with a number in it (got {got!r}; "
                        "expected a list of each class's recall, one number per class, nan "
                        "for a class the held-out data has no example of): return it, or "
                        "leave lag_level None")
                self.best_recall = [-math.inf] * len(recall)  # the classes read from now on
                return metrics
            if recall is None:
                if not self.unread_warned:
                    self.unread_warned = True
                    got = None if metrics is None else metrics.get(CLASS_RECALL_KEY)
                    log(WARNING, "ReplicatedFedBuff: lag_level=%r: the evaluation of server "
                        "step %d holds no %r list of numbers (got %r); it is not read (nor "
                        "any later one without it; this warning is given once per run)",
                        self.lag_level, step, CLASS_RECALL_KEY, got)
                return metrics
            self.observe(recall)
            return metrics
        return evaluate

    def observe(self, recall: list[float]) -> None:
        """Take in one evaluation's class recalls (``nan``: a class the held-out data has no
        example of, not read); switch when the median is at least ``lag_level`` while a
        class's best so far is below :data:`LAG_FLOOR`. A run's readings must all have as
        many classes as its first."""
        if not self.best_recall:
            self.best_recall = [-math.inf] * len(recall)
        elif len(self.best_recall) != len(recall):
            raise ValueError(f"lag_level={self.lag_level!r}: an evaluation gave "
                             f"{len(recall)} class recalls where the run's first gave "
                             f"{len(self.best_recall)}; the evaluate_fn must return one per "
                             "class, every step")
        self.best_recall = [max(b, r) if math.isfinite(r) else b
                            for b, r in zip(self.best_recall, recall, strict=True)]
        seen = [r for r in recall if math.isfinite(r)]
        if (self.lagged_at is None and self.lag_level is not None and seen
                and statistics.median(seen) >= self.lag_level
                and any(math.isfinite(b) and b < LAG_FLOOR for b in self.best_recall)):
            self.lagged_at = self.now

    def _step_facts(self) -> dict[str, Any]:
        """With ``lag_level``: ``lagged_at``, the virtual time the class reading switched
        every partition to the bar 1 (``None``: not yet)."""
        return {"lagged_at": self.lagged_at} if self.lag_level is not None else {}

    # ------------------------------------------------------------------ one job
    def choose(self, node: int) -> int:
        """The partition ``node`` computes next: of the held partitions whose jobs so far, in
        flight or used, are fewer than its bar times its own partition's (``replicate_below``;
        1 for a partition read as needed, :meth:`_bar`)
        and trail them by more than ``replicate_margin`` times the square root of the two
        counts' sum (a job that brought no update is not counted: its partition goes to another
        holder), the one with the fewest; none: its own. Ties: the earliest in its cycle."""
        ident = self.identities[node]
        held = cyclic_placement(ident.partition_id, ident.num_partitions, self.s)
        own = self.served.get(held[0], 0)
        z = self.replicate_margin
        behind = [j for j in held[1:] if self.served.get(j, 0) < self._bar(j, held[0]) * own
                  and own - self.served.get(j, 0) > z * math.sqrt(own + self.served.get(j, 0))]
        return min(behind, key=lambda j: (self.served.get(j, 0), held.index(j)),
                   default=held[0])

    def _bar(self, j: int, own: int) -> float:
        """Partition ``j``'s bar for the client of partition ``own``: 1 when it is needed (its
        last update more than ``need_ratio`` times as large as ``own``'s, or its recent updates
        as large against their era's, by ``need_reference``) or, with ``need_prior``, not yet
        read twice; else ``replicate_below``."""
        if j in self.needed or self.lagged_at is not None:
            return 1.0
        if self.need_reference != "own":
            ratios = self.readings.get(j, ())
            if self.need_prior and len(ratios) < 2:  # a finite need_ratio: __init__
                return 1.0
            needed = len(ratios) >= 2 and math.exp(statistics.fmean(ratios)) > self.need_ratio
        else:
            mine, theirs = self.norms.get(own), self.norms.get(j)
            needed = mine is not None and theirs is not None and theirs > self.need_ratio * mine
        if needed:
            if self.need_latch:
                self.needed.add(j)
            return 1.0
        return self.replicate_below

    def _settled(self, partition: int, delta: Mapping[str, np.ndarray] | None,
                 sent_version: int = 0) -> None:
        if delta is None:
            self.served[partition] -= 1
        elif math.isfinite(self.need_ratio):
            norm = math.sqrt(sum(float(np.sum(np.square(v))) for v in delta.values()))
            if not math.isfinite(norm):
                return
            self.norms[partition] = norm
            if self.need_reference != "own":
                pool = [x for step in range(sent_version - self.era_steps, sent_version + 1)
                        for x in self.era.get(step, ())]
                middle = statistics.median(pool) if len(pool) >= 3 else 0.0
                ratio = norm / middle if middle > 0 else 0.0
                if ratio > 0 and math.isfinite(ratio):  # no reading of a zero or overflowed one
                    self.readings.setdefault(partition, deque(maxlen=ERA_READINGS)).append(
                        math.log(ratio))
                self.era.setdefault(sent_version, []).append(norm)

    def _message(self, node: int, job: int, arrays: ArrayRecord, train_config: ConfigRecord,
                 regime_round: int) -> tuple[Message, int]:
        ident = self.identities[node]
        part = self.choose(node)
        self.served[part] = self.served.get(part, 0) + 1
        config = ConfigRecord({**dict(train_config), "server-round": job})
        instruction = Instruction(
            op=protocol.OP_TRAIN, round=job, worker=ident.partition_id, seed=self.seed,
            nonce=self._nonce, partition_ids=(part,), num_partitions=(ident.num_partitions,),
            coefficients=(1.0,), weight_key=self.weighted_by_key, timing=self.timing,
            delay_s=self.wall_delay(ident.partition_id, job, self.load(part), regime_round))
        msg = protocol.instruction_message(
            RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config}),
            instruction, node, str(job))
        return msg, part

    def _read(self, reply: Message | None, node: int, job: int, part: int,
              sent: Mapping[str, np.ndarray]
              ) -> tuple[dict[str, np.ndarray] | None, int, int, float, int, int, str]:
        ident = self.identities[node]
        if reply is None:
            return None, ident.partition_id, part, 0.0, 0, 0, "no reply"
        try:
            coded = protocol.parse_reply(reply, worker=ident.partition_id, round=job,
                                         layout={k: v.shape for k, v in sent.items()},
                                         dtypes=dict.fromkeys(sent, _WIRE))
        except RejectedReply as exc:
            return None, ident.partition_id, part, 0.0, 0, 0, str(exc)
        weight = float(coded.num_examples)
        if not (math.isfinite(weight) and weight > 0):
            return (None, ident.partition_id, part, float(coded.compute_s), 0, 0,
                    f"malformed reply: num-examples={weight!r}, expected > 0")
        # the reply is n_j (theta_j - theta): the partition's model delta times its examples
        with np.errstate(over="ignore", invalid="ignore"):
            delta = {k: np.asarray(v, dtype=np.float64) / weight
                     for k, v in coded.arrays.items()}
        if not all(np.isfinite(v).all() for v in delta.values()):
            return (None, ident.partition_id, part, float(coded.compute_s), 0, 0,
                    f"malformed reply: its arrays over num-examples={weight!r} are not "
                    "finite")
        return (delta, ident.partition_id, part, float(coded.compute_s), round(weight),
                reply_bytes(reply), "")

