"""Whether an inner strategy's aggregation depends on the replies only through their
example-weighted average: checked once, at the first aggregation, on copies of the strategy.

Coding hands the inner strategy ONE reply holding the decoded average (and its metric
aggregation one record per partition: :mod:`~fl_gradcode.flower.partition_metrics`). A
strategy that filters, weights or summarises individual replies (by their arrays, or by the
app's metrics, e.g. dropping a client whose train loss is over a threshold) computes something
else from that one reply; :func:`check_averaging` refuses it (McMahan et al., "Communication-
Efficient Learning of Deep Networks from Decentralized Data", AISTATS 2017, for the average
FedAvg computes).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from logging import WARNING
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log

from . import partition_metrics

__all__ = ["check_averaging"]

#: Metric values of the synthetic replies, one per reply: spread over orders of magnitude, so
#: that a threshold on any metric the app reports drops some replies and not others.
PROBE_METRIC_VALUES = (0.0, 0.5, 1e3, 1e6)


def check_averaging(
    inner: Any,
    server_round: int,
    reply_to: Message,
    array_key: str,
    theta: dict[str, np.ndarray],
    weight_key: str,
    metric_names: Sequence[str] = (),
) -> None:
    """Refuse an inner strategy whose aggregation is not a function of the weighted average.

    On two copies of ``inner`` (its own state untouched): ``aggregate_train`` of four replies
    with unequal weights, and of ONE reply holding their weighted average with their total
    weight. A strategy that coding serves exactly gives the same model for both (FedAvg: the
    average; a server optimizer: its step from the average); an aggregator over individual
    replies (a median, a trimmed mean, a selection) does not. Each synthetic reply also carries
    the app's ``metric_names`` at values spread over orders of magnitude
    (:data:`PROBE_METRIC_VALUES`; the one reply: their weighted average, its metric aggregation
    fed one record per reply, as the wrapper feeds it one per partition): a selection by a
    metric changes the model, and metrics summarised per reply in ``aggregate_train`` change
    its metrics. Raises ``ValueError``.
    """
    from .compat import CODED_ALTERNATIVE, is_client_side_fixed

    while is_client_side_fixed(inner):  # its noise aside, it aggregates as it wraps
        inner = inner.strategy
    rng = np.random.default_rng(20240601)
    weights = [1.0, 2.0, 3.0, 10.0]
    scale = {k: max(1.0, float(np.max(np.abs(v)))) if v.size else 1.0 for k, v in theta.items()}
    floats = {k for k, v in theta.items() if np.asarray(v).dtype.kind == "f"}
    members = []
    for i, _ in enumerate(weights):
        spread = 10.0 if i == len(weights) - 1 else 1.0  # one far-off reply
        members.append({
            k: (v + spread * scale[k] * rng.standard_normal(v.shape)).astype(v.dtype)
            if k in floats else v
            for k, v in theta.items()
        })
    total = sum(weights)
    average = {
        k: (sum(w * m[k].astype(np.float64) for w, m in zip(weights, members, strict=True))
            / total).astype(theta[k].dtype) if k in floats else theta[k]
        for k in theta
    }

    names = [m for m in metric_names if m != weight_key]
    values = [{m: PROBE_METRIC_VALUES[i] for m in names} for i in range(len(weights))]
    mean = {m: sum(w * v[m] for w, v in zip(weights, values, strict=True)) / total
            for m in names}

    def reply(arrays: dict[str, np.ndarray], weight: float, metrics: dict) -> Message:
        content = RecordDict({
            array_key: ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in arrays.items()}),
            "metrics": MetricRecord({**metrics, weight_key: weight}),
        })
        return Message(content, reply_to=reply_to)

    try:
        many_copy, one_copy, again = (copy.deepcopy(inner) for _ in range(3))
    except Exception as exc:  # cannot check without touching the user's strategy: say so
        log(WARNING, "could not check that %s's aggregation depends only on the weighted "
            "average of the replies (it cannot be copied: %s); coding hands it one decoded "
            "reply, which is exact only if it does", type(inner).__name__, exc)
        return
    name = type(inner).__name__
    try:
        many, many_metrics = many_copy.aggregate_train(
            server_round, [reply(m, w, v) for m, w, v in zip(members, weights, values,
                                                               strict=True)])
        parts = [RecordDict({"metrics": MetricRecord({**v, weight_key: w})})
                 for w, v in zip(weights, values, strict=True)]

        def aggregate_one(strategy: Any) -> tuple[Any, Any]:
            with partition_metrics.per_partition_metrics(strategy, parts):
                return strategy.aggregate_train(server_round, [reply(average, total, mean)])

        one, one_metrics = aggregate_one(one_copy)
        _, again_metrics = aggregate_one(again)  # the same call again
    except Exception as exc:
        raise ValueError(
            f"{name}.aggregate_train failed on synthetic replies ({type(exc).__name__}: {exc}); "
            "GradientCoding hands the inner strategy ONE reply holding the decoded average, "
            f"so it must aggregate replies with {array_key!r} arrays and a {weight_key!r} "
            "weight. " + CODED_ALTERNATIVE
        ) from exc
    if one is None:
        raise ValueError(
            f"{name}.aggregate_train returns no model for one reply, and GradientCoding hands "
            "the inner strategy ONE reply holding the decoded example-weighted average. "
            + CODED_ALTERNATIVE
        )
    if many is None or not _close(many, one):
        raise ValueError(
            f"{name}.aggregate_train does not depend on the replies only through their "
            "example-weighted average (on four replies it returns another model than on one "
            "reply holding their weighted average): it aggregates individual replies, which "
            "coding never delivers (the inner strategy receives ONE decoded reply). Server "
            "optimizers on the average (FedAvgM, FedAdam, FedYogi, FedAdagrad) compose; "
            "robust or per-client aggregators do not. " + CODED_ALTERNATIVE
        )
    # a metric that differs between two identical calls (a timing) summarises no reply
    unstable = {k for k in dict(one_metrics or {})
                if not _same_metrics({k: one_metrics[k]}, {k: dict(again_metrics or {}).get(k)})}
    if not _same_metrics(many_metrics, one_metrics, ignore=unstable):
        raise ValueError(
            f"{name}.aggregate_train returns other metrics for four replies than for one "
            "reply holding their weighted average (with its metric aggregation fed one "
            "record per reply, as GradientCoding feeds it one per partition): it summarises "
            "individual replies itself, which coding never delivers. Compute the metric in "
            "train_metrics_aggr_fn (it receives one record per partition), or in the "
            "ClientApp. " + CODED_ALTERNATIVE
        )


def _same_metrics(a: Any, b: Any, ignore: set[str] | frozenset[str] = frozenset()) -> bool:
    a = {k: v for k, v in dict(a or {}).items() if k not in ignore}
    b = {k: v for k, v in dict(b or {}).items() if k not in ignore}
    if a.keys() != b.keys():
        return False
    try:
        return all(np.allclose(np.asarray(a[k], dtype=np.float64),
                               np.asarray(b[k], dtype=np.float64), rtol=1e-6, atol=1e-9)
                   for k in a)
    except (TypeError, ValueError):  # values of other shapes or kinds
        return False


def _close(a: ArrayRecord, b: ArrayRecord) -> bool:
    if list(a.keys()) != list(b.keys()):
        return False
    for key in a.keys():
        x = np.asarray(a[key].numpy(), dtype=np.float64)
        y = np.asarray(b[key].numpy(), dtype=np.float64)
        finite = y[np.isfinite(y)]
        scale = max(1.0, float(np.max(np.abs(finite)))) if finite.size else 1.0
        # (non-finite results are judged later by the wrapper's finiteness guard)
        if x.shape != y.shape or not np.allclose(x, y, rtol=1e-5, atol=1e-6 * scale,
                                                 equal_nan=True):
            return False
    return True
