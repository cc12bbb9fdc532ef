"""The main job's asynchronous mode (run-config ``asynchronous=true``): FedBuff over
partitions each held by ``s + 1`` clients (:class:`fl_gradcode.flower.asynchronous.
ReplicatedFedBuff`; ``s = 0`` is FedBuff) on the same data, model, seeds and latency draws as
the synchronous coded job, in virtual or wallclock timing.

``s="auto"`` runs the placement ``s = 1`` with the replication rule picked on development seeds
(the ``AUTO_*`` constants of :mod:`fl_gradcode.flower.asynchronous`): the class reading, each
client computing its own partition (FedBuff) until the server's evaluation shows the median
class recall at 0.9 while a class has never reached 0.1, then the held partition served least
so far for the rest of the run; the rules tried and what they estimate are in
docs/adaptive.md.

What it cannot honour is refused, naming the key, never dropped: DP (it applies none), a server
optimiser other than plain SGD, a ``replicate-below``, ``replicate-margin``, ``need-ratio``,
``need-latch``, ``need-reference``, ``need-prior`` or ``lag-level`` beside ``s="auto"`` (which
sets its own), a ``lag-level`` outside ``[0, 1]``,
a bar outside ``[0, 1]``, a negative margin or need ratio, a latch or a reference without a
need ratio, an unknown reference, a prior without an era's reference, a replication key that
would change nothing (``ineffective_rule``), a rival, and
every key of synchronous coded rounds set away from its default (the code, its deadline and
decoding rules); in wallclock timing, the charges modelled in virtual time only
(``virtual-compute``, ``partition-cost-s``, ``upload-bandwidth``) away from their defaults. The
main job's client faults (``slow-workers``, ``nan-workers``) act on its jobs (each is the
coding mod's instruction), their indices being the clients' partition ids (``0 .. n - 1``; in
coded rounds, positions in the round's cohort): a slow client's delay is slept in wallclock
timing and charged as compute under ``virtual-compute=measured`` (else refused), a NaN reply is
dropped."""

from __future__ import annotations

import math
import random
from logging import INFO
from typing import Any

from flwr.common.logger import log

from fl_gradcode.config import DEFAULTS
from fl_gradcode.flower.asynchronous import (
    AUTO_LAG_LEVEL,
    AUTO_NEED_LATCH,
    AUTO_NEED_PRIOR,
    AUTO_NEED_RATIO,
    AUTO_NEED_REFERENCE,
    AUTO_REPLICATE_BELOW,
    AUTO_REPLICATE_MARGIN,
    AUTO_S,
    NEED_REFERENCES,
    ReplicatedFedBuff,
)
from fl_gradcode.rivals.fedbuff import buffer_size

__all__ = ["ASYNCHRONOUS_KEYS", "AUTO_KEYS", "DEFAULT_BUFFER_FRACTION", "SYNCHRONOUS_KEYS",
           "async_refusal", "build_async", "ineffective_rule", "lag_key", "need_key",
           "replication", "run_buffer"]

#: keys of synchronous coded rounds that an asynchronous run does not read: each must keep
#: its default (``s`` is read: the extra copies of a partition)
SYNCHRONOUS_KEYS = ("code", "s-max", "auto-margin", "exclude-slow", "latency-state", "roster",
                    "busy", "m", "straggler-timeout", "stop-late-work", "auto-deadline",
                    "auto-approximate", "max-decode-error", "min-replies", "verify",
                    "verify-tolerance", "momentum")


def need_key(ratio: float) -> float:
    """The run config's ``need-ratio`` of a class's ``need_ratio`` (off: 0, not infinity)."""
    return 0.0 if math.isinf(ratio) else float(ratio)


def lag_key(level: float | None) -> float:
    """The run config's ``lag-level`` of a class's ``lag_level`` (off: 0, not None)."""
    return 0.0 if level is None else float(level)


#: the replication keys an integer ``s`` reads, each with the value ``s="auto"`` sets it to
AUTO_KEYS: dict[str, Any] = {
    "replicate-below": AUTO_REPLICATE_BELOW, "replicate-margin": AUTO_REPLICATE_MARGIN,
    "need-ratio": need_key(AUTO_NEED_RATIO), "need-latch": AUTO_NEED_LATCH,
    "need-reference": AUTO_NEED_REFERENCE, "need-prior": AUTO_NEED_PRIOR,
    "lag-level": lag_key(AUTO_LAG_LEVEL)}
#: keys only an asynchronous run reads: each must keep its default in synchronous rounds
ASYNCHRONOUS_KEYS = ("buffer-size", *AUTO_KEYS)


def async_refusal(cfg: dict[str, Any]) -> str | None:
    """Why an asynchronous run cannot run with the merged run config ``cfg`` (``None``: it
    can); the reason starts with the offending ``key=value``."""
    plain = "asynchronous=true runs FedBuff over replicated partitions"
    s, bar, z = cfg["s"], cfg["replicate-below"], cfg["replicate-margin"]
    if s == "auto":
        for name, own in AUTO_KEYS.items():
            if cfg[name] != DEFAULTS[name]:
                return (f"{name}={cfg[name]!r} with s='auto', which sets its own ({own!r}); "
                        f"set an integer s to choose {name}, or leave it unset")
    elif isinstance(s, bool) or not (isinstance(s, int) or str(s).isdigit()):
        return (f"s={s!r}: {plain}; it needs an integer s >= 0 (the extra copies of each "
                "partition; 0: FedBuff itself) or 'auto'")
    if (isinstance(bar, bool) or not isinstance(bar, (int, float))
            or not 0.0 <= float(bar) <= 1.0):
        return (f"replicate-below={bar!r}: expected a number in [0, 1] (0: each client its "
                "own partition, FedBuff; 1: the least served held partition)")
    if (isinstance(z, bool) or not isinstance(z, (int, float))
            or not (math.isfinite(z) and z >= 0)):
        return (f"replicate-margin={z!r}: expected a finite number >= 0 (standard deviations "
                "of the lead; 0: the bar alone)")
    need = cfg["need-ratio"]
    if (isinstance(need, bool) or not isinstance(need, (int, float))
            or not (math.isfinite(need) and need >= 0)):
        return (f"need-ratio={need!r}: expected a finite number >= 0 (how many times the own "
                "partition's last update a neighbour's must exceed; 0: off)")
    if not isinstance(cfg["need-latch"], bool):
        return f"need-latch={cfg['need-latch']!r}: expected true or false"
    if cfg["need-latch"] and not need:
        return ("need-latch=True without need-ratio: the latch holds a partition the need "
                "ratio found needed; set need-ratio > 0 or leave need-latch unset")
    reference = cfg["need-reference"]
    if reference not in NEED_REFERENCES:
        return (f"need-reference={reference!r}: expected one of "
                f"{', '.join(map(repr, NEED_REFERENCES))} (what a neighbour's update is "
                "compared with)")
    if reference != DEFAULTS["need-reference"] and not need:
        return (f"need-reference={reference!r} without need-ratio: it says what the need "
                "ratio compares; set need-ratio > 0 or leave need-reference unset")
    if not isinstance(cfg["need-prior"], bool):
        return f"need-prior={cfg['need-prior']!r}: expected true or false"
    if cfg["need-prior"] and reference != "cohort":
        return (f"need-prior=True with need-reference={reference!r}: the prior counts the "
                "readings of an era that fills (a three-step era rarely does where K is "
                "small, and the prior would then hold the bar 1 for good); set "
                "need-reference='cohort' or leave need-prior unset")
    lag = cfg["lag-level"]
    if (isinstance(lag, bool) or not isinstance(lag, (int, float))
            or not (math.isfinite(lag) and 0.0 <= lag <= 1.0)):
        return (f"lag-level={lag!r}: expected a number in [0, 1] (the median class recall at "
                "which a class never learnt switches every partition to the bar 1; 0: off)")
    idle = ineffective_rule(cfg)
    if idle is not None:
        return idle
    if str(cfg["rival"]):
        return f"rival={cfg['rival']!r}: {plain}, not a rival; leave rival unset"
    if str(cfg["dp"]) != "none":
        return f"dp={cfg['dp']!r}: {plain}, which applies no DP; run it with dp='none'"
    if str(cfg["server-optimizer"]) != "sgd":
        return (f"server-optimizer={cfg['server-optimizer']!r}: {plain}, whose server step is "
                "plain SGD (server-lr); use server-optimizer='sgd'")
    buffer = cfg["buffer-size"]
    if isinstance(buffer, bool) or not isinstance(buffer, int) or buffer < 0:
        return (f"buffer-size={buffer!r}: expected an integer >= 1 (updates per server step), "
                "or 0 for a quarter of the cohort")
    if str(cfg["timing"]) == "wallclock":
        for name in ("virtual-compute", "partition-cost-s", "upload-bandwidth"):
            if cfg[name] != DEFAULTS[name]:
                return (f"{name}={cfg[name]!r} with timing='wallclock': a charge modelled in "
                        "virtual time only (in real time compute and uploads take what they "
                        f"take); leave it at its default ({DEFAULTS[name]!r})")
    warmup = float(cfg["warmup-timeout"])
    if not (math.isfinite(warmup) and warmup > 0):
        return (f"warmup-timeout={cfg['warmup-timeout']!r}: the identification handshake's "
                "wait must be > 0 seconds")
    for name in SYNCHRONOUS_KEYS:
        if cfg[name] != DEFAULTS[name]:
            return (f"{name}={cfg[name]!r}: a key of synchronous coded rounds; {plain}, which "
                    f"does not read it; leave it at its default ({DEFAULTS[name]!r})")
    return None


def ineffective_rule(cfg: dict[str, Any]) -> str | None:
    """Why a replication key set with an integer ``s`` would change nothing (``None``: each
    one set acts): every one with ``s = 0`` (no client holds a neighbour's partition), a need
    ratio beside the bar 1 (already as much as the own partition), a margin beside the bar 0
    without a need ratio or a class reading (nothing to hold back: either lifts the bar to 1
    for a partition, and the margin acts from then on)."""
    if cfg["s"] == "auto":
        return None
    if int(cfg["s"]) == 0:
        for name in AUTO_KEYS:
            if cfg[name] != DEFAULTS[name]:
                return (f"{name}={cfg[name]!r} with s=0: no client holds a neighbour's "
                        "partition, so it would change nothing; set s >= 1 or leave it unset")
    if cfg["need-ratio"] and float(cfg["replicate-below"]) >= 1.0:
        return (f"need-ratio={cfg['need-ratio']!r} with replicate-below=1: a neighbour's "
                "partition is already served as much as the own one, so it would change "
                "nothing; set replicate-below < 1 or leave need-ratio unset")
    if cfg["lag-level"] and float(cfg["replicate-below"]) >= 1.0:
        return (f"lag-level={cfg['lag-level']!r} with replicate-below=1: every partition is "
                "already served as much as the own one, so it would change nothing; set "
                "replicate-below < 1 or leave lag-level unset")
    if (cfg["replicate-margin"] and float(cfg["replicate-below"]) == 0.0
            and not cfg["need-ratio"] and not cfg["lag-level"]):
        return (f"replicate-margin={cfg['replicate-margin']!r} with replicate-below=0: no "
                "neighbour's partition is served, so it would change nothing; set "
                "replicate-below > 0 or leave replicate-margin unset")
    return None


def replication(cfg: dict[str, Any]
                ) -> tuple[int, float, float, float, bool, str, bool, float | None]:
    """``(s, replicate_below, replicate_margin, need_ratio, need_latch, need_reference,
    need_prior, lag_level)`` an asynchronous run
    of ``cfg`` runs (``s="auto"``: the placement and rules picked on development seeds; a
    ``need-ratio`` of 0 is the class's ``inf``, off; a ``lag-level`` of 0 its ``None``)."""
    if cfg["s"] == "auto":
        return (AUTO_S, AUTO_REPLICATE_BELOW, AUTO_REPLICATE_MARGIN, AUTO_NEED_RATIO,
                AUTO_NEED_LATCH, AUTO_NEED_REFERENCE, AUTO_NEED_PRIOR, AUTO_LAG_LEVEL)
    need, lag = float(cfg["need-ratio"]), float(cfg["lag-level"])
    return (int(cfg["s"]), float(cfg["replicate-below"]), float(cfg["replicate-margin"]),
            need if need > 0 else math.inf, bool(cfg["need-latch"]), str(cfg["need-reference"]),
            bool(cfg["need-prior"]), lag if lag > 0 else None)


#: ``buffer-size = 0``: this fraction of the cohort (the benchmark's a-priori K)
DEFAULT_BUFFER_FRACTION = 0.25


def run_buffer(cfg: dict[str, Any], cohort: int) -> int:
    """The ``K`` of an asynchronous run of the merged run config ``cfg`` with ``cohort``
    clients in flight: ``buffer-size``, or at 0 :data:`DEFAULT_BUFFER_FRACTION` of the
    cohort (at least 1)."""
    return int(cfg["buffer-size"]) or buffer_size(DEFAULT_BUFFER_FRACTION, cohort)


def build_async(cfg: dict[str, Any], n: int):
    """``(strategy, initial arrays, evaluate_fn, train_config, server steps)`` of the
    asynchronous run of the merged run config ``cfg`` over ``n`` clients: the cohort
    (``fraction-train`` of ``n``) in flight, ``buffer-size`` updates per server step, as many
    steps as take ``num-rounds`` times the cohort updates."""
    from server.app import (
        RIVAL_KEYWORDS,
        check_dp_keys,
        check_fault_delay,
        check_fault_workers,
        check_slow_classes,
        check_training,
        cohort_size,
        model_and_evaluation,
        run_partitions,
        strategy_keywords,
    )

    refusal = async_refusal(cfg)
    if refusal is not None:
        raise ValueError(refusal)
    check_training(cfg)
    check_dp_keys(cfg)
    check_slow_classes(cfg)
    check_fault_delay(cfg)
    check_fault_workers(cfg, n, asynchronous=True)
    random.seed(int(cfg["seed"]))
    data, index = run_partitions(cfg, n)
    sizes = [len(p) for p in index]
    cohort = cohort_size(cfg, n)
    k = run_buffer(cfg, cohort)
    steps = math.ceil(int(cfg["num-rounds"]) * cohort / k)
    # the rivals' timing keywords, from the same keys as the coded rounds'; the modelled
    # charges are virtual time's (real compute and uploads take what they take)
    keywords = strategy_keywords(cfg, n, only=RIVAL_KEYWORDS)
    if str(cfg["timing"]) == "wallclock":
        keywords.update(compute_cost_s=0.0, upload_bandwidth=None)
    s, bar, z, need, latch, reference, prior, lag = replication(cfg)
    strategy = ReplicatedFedBuff(
        s=s, replicate_below=bar, replicate_margin=z, need_ratio=need, need_latch=latch,
        need_reference=reference, need_prior=prior, lag_level=lag,
        buffer_size=k, concurrency=cohort, server_lr=float(cfg["server-lr"]),
        partition_sizes=sizes, **keywords,
        run_config={**cfg, "num-clients": n, "partition-sizes": sizes, "s": s,
                    "replicate-below": bar, "replicate-margin": z,
                    "need-ratio": need_key(need), "need-latch": latch,
                    "need-reference": reference, "need-prior": prior,
                    "lag-level": lag_key(lag), "s-asked": cfg["s"],
                    "buffer-size": k, "server-steps": steps},
        timing=str(cfg["timing"]), identify_timeout=float(cfg["warmup-timeout"]))
    initial, evaluate_fn, train_config = model_and_evaluation(cfg, data, lag is not None)
    served = ("each job the held partition served least so far" if bar >= 1.0 else
              f"a neighbour's served below {bar:g} times a client's own" if bar > 0 else
              "each client its own partition")
    if lag is not None:
        served += (f" until the median class recall is {lag:g} with a class never learnt, "
                   "then the held partition served least so far")
    placement = ("FedBuff itself (s = 0: each client its own partition)" if s == 0 else
                 f"FedBuff over partitions held by s + 1 = {s + 1} clients ({served}"
                 f"{', s=auto' if cfg['s'] == 'auto' else ''})")
    log(INFO, "fl-gradcode asynchronous: %d clients, %d in flight, %s, a server step every "
        "%d updates, %d steps (%s timing)", n, cohort, placement, k, steps, cfg["timing"])
    return strategy, initial, evaluate_fn, train_config, steps
