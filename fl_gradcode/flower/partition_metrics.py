"""The app's train metrics, one copy per partition, for the inner strategy's metric aggregation.

A coded reply's ``metric.<name>`` values are coded like its arrays (``sum_j B_ij n_j m_j``) and
decode to the example-weighted mean of the partitions' metrics: what FedAvg's default
``train_metrics_aggr_fn`` computes, but not what any other aggregator computes (a max, e.g.
the largest epsilon of Opacus' example, a count, a median). So the mod also sends each
partition's own metrics (``partition-metric.<name>``: one value per partition the worker
computed, aligned with ``partition-sizes``; not under ``dp='partition'`` and ``'central'``,
which withhold the app's metrics; under ``dp='sample'`` they leave the node un-noised),
and the server calls the inner strategy's ``train_metrics_aggr_fn`` on one record per
partition (that partition's metrics and weight) while the arrays it aggregates are the decoded
average (:func:`per_partition_metrics`). A list-valued metric (``MetricRecord``
holds lists of numbers) travels this way only (``partition-metric-list.<k>.<name>``): it is not
coded, so it is missing where the inner strategy aggregates the decoded record instead.

"Verified": a partition's copy is taken from the round's used replies; replicas of a partition
compute it from the same seed, so they agree, and when they do not the value most of them
report is used, with a WARNING naming the partition. With no majority (one replica against
another) no version is taken: the partition is left out of the metric aggregation, and when
every partition is so, the inner strategy aggregates the decoded ``metric.*`` record instead.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from logging import WARNING
from typing import Any

from flwr.app import Message, MetricRecord, RecordDict
from flwr.common.logger import log

from .finite import finite_number
from .protocol import PROTOCOL_KEY, RejectedReply

__all__ = ["PREFIX", "attach", "collect", "per_partition_metrics", "read", "records"]

#: Meta key prefix of the per-partition metrics in a coded reply.
PREFIX = "partition-metric."
#: Meta key prefix of a list-valued metric of one partition: ``partition-metric-list.<k>.<name>``
#: (``k``: the partition's place in ``partition-sizes``).
LIST_PREFIX = "partition-metric-list."

Metrics = dict[str, float | list[float]]

_META = PROTOCOL_KEY + "-meta"


def attach(reply: Message, per_partition: Sequence[Mapping[str, float | list[float]]]
           ) -> Message:
    """Add each partition's own metrics (those every partition reports) to ``reply``'s meta
    record: a number as one list per metric aligned with ``partition-sizes``, a list of
    numbers as one list per partition and metric (:data:`LIST_PREFIX`); returns ``reply``."""
    if not per_partition or reply.has_error():
        return reply
    names = set.intersection(*(set(m) for m in per_partition))
    meta = reply.content[_META]
    for name in sorted(names):
        values = [m[name] for m in per_partition]
        if all(isinstance(v, list) for v in values):
            for j, value in enumerate(values):
                meta[f"{LIST_PREFIX}{j}.{name}"] = [float(x) for x in value]
        elif not any(isinstance(v, list) for v in values):
            meta[PREFIX + name] = [float(v) for v in values]
    return reply


def read(reply: Message, count: int) -> list[Metrics] | None:
    """The per-partition metrics of a coded reply (one dict per partition it computed, in
    ``partition-sizes`` order), ``None`` when it carries none. Raises
    :class:`~fl_gradcode.flower.protocol.RejectedReply` for a malformed list."""
    meta = reply.content.get(_META)
    if not isinstance(meta, MetricRecord):
        return None
    keys = [key for key in meta.keys() if key.startswith((PREFIX, LIST_PREFIX))]
    if not keys:
        return None
    out: list[Metrics] = [{} for _ in range(count)]
    lists: set[str] = set()
    for key in keys:
        values = meta[key]
        if key.startswith(PREFIX):
            if (not isinstance(values, list) or len(values) != count
                    or not all(finite_number(v) for v in values)):
                raise RejectedReply(f"{key}={values!r} is not a list of {count} finite "
                                    "numbers (one per partition)")
            for j, value in enumerate(values):
                out[j][key[len(PREFIX):]] = float(value)
            continue
        place, _, name = key[len(LIST_PREFIX):].partition(".")
        if not (place.isdigit() and int(place) < count and name):
            raise RejectedReply(f"{key}: expected {LIST_PREFIX}<k>.<name> with k below "
                                f"{count} (the partitions this reply computed)")
        if (not isinstance(values, list) or not values
                or not all(finite_number(v) for v in values)):
            raise RejectedReply(f"{key}={values!r} is not a list of finite numbers")
        out[int(place)][name] = [float(v) for v in values]
        lists.add(name)
    for name in sorted(lists):
        if not all(isinstance(metrics.get(name), list) for metrics in out):
            raise RejectedReply(f"{LIST_PREFIX}<k>.{name}: expected one list of numbers per "
                                f"partition ({count}), or a number per partition")
    return out


def collect(code: Any, replies: Mapping[int, Any], used: Sequence[int],
            sizes: Mapping[int, float], round_number: int
            ) -> list[tuple[int, dict[str, Any], float]] | None:
    """``(partition, metrics, weight)`` for each code partition a used reply computed, from the
    replies' ``extra["partition_metrics"]`` (:func:`read`); ``None`` when no used reply carries
    per-partition metrics. The weight is the partition's checked size (``sizes``), else the
    reply's own; a partition of no example is left out (it weighs nothing, and a weighted
    mean over nothing but such partitions would divide by zero)."""
    copies: dict[int, list[tuple[int, tuple[tuple[str, float], ...], float]]] = {}
    for worker in sorted(used):
        reply = replies[worker]
        metrics = reply.extra.get("partition_metrics")
        if metrics is None:
            continue
        for j, own, size in zip(code.assignment(worker), metrics, reply.sizes, strict=True):
            copies.setdefault(int(j), []).append((worker, _hashable(own), size))
    if not copies:
        return None
    out, undecided = [], []
    for j in sorted(copies):
        votes = Counter(values for _, values, _ in copies[j])
        ranked = votes.most_common()
        values, count = ranked[0]
        if len(ranked) > 1 and ranked[1][1] == count:  # no majority: no version is taken
            undecided.append(j)
            continue
        if len(votes) > 1:
            log(WARNING, "round %d: the replicas of partition %d report different train "
                "metrics (%d versions); the inner strategy's metric aggregation gets the one "
                "%d of %d replicas report", round_number, j, len(votes), votes[values],
                len(copies[j]))
        size = next(size for _, v, size in copies[j] if v == values)
        weight = float(sizes.get(j, size))
        if not weight > 0:  # a partition of no example weighs nothing in a weighted mean
            continue
        out.append((j, dict(values), weight))
    if undecided:
        log(WARNING, "round %d: the replicas of partitions %s report different train metrics "
            "and no majority: %s", round_number, undecided,
            "the inner strategy's metric aggregation goes without them" if out else
            "the inner strategy aggregates the decoded metrics instead")
    return _common_layout(out, round_number) or None


def _common_layout(parts: list[tuple[int, dict[str, Any], float]], round_number: int
                   ) -> list[tuple[int, dict[str, Any], float]]:
    """``parts`` without the metrics Flower's metric average cannot take: one a partition
    lacks, or a number in one and a list in another, or lists of different lengths."""
    def layout(value: Any) -> int | None:
        return None if value is None else len(value) if isinstance(value, tuple) else -1

    names = {name for _, metrics, _ in parts for name in metrics}
    bad = sorted(name for name in names
                 if len({layout(metrics.get(name)) for _, metrics, _ in parts}) > 1)
    if not bad:
        return parts
    log(WARNING, "round %d: train metrics %s are not laid out alike in every partition (a "
        "list's length, a number or a list, or missing): left out of the metric aggregation",
        round_number, bad)
    return [(j, {k: v for k, v in metrics.items() if k not in bad}, weight)
            for j, metrics, weight in parts]


def records(parts: Sequence[tuple[int, dict[str, Any], float]],
            weight_key: str) -> list[RecordDict]:
    """One ``RecordDict`` per partition: its metrics and its weight under ``weight_key``."""
    return [RecordDict({"metrics": MetricRecord({
        **{k: list(v) if isinstance(v, tuple) else v for k, v in metrics.items()},
        weight_key: weight})}) for _, metrics, weight in parts]


def _hashable(metrics: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """A partition's metrics as a sorted tuple, lists as tuples (replicas vote on it)."""
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v)
                        for k, v in metrics.items()))


def _chain(strategy: Any, limit: int = 8) -> list[Any]:
    """``strategy`` and those it wraps (``.strategy`` / ``.inner``)."""
    chain = [strategy]
    while len(chain) < limit:
        nxt = getattr(chain[-1], "strategy", None) or getattr(chain[-1], "inner", None)
        if nxt is None or any(nxt is s for s in chain):
            break
        chain.append(nxt)
    return chain


@contextlib.contextmanager
def per_partition_metrics(inner: Any, parts: list[RecordDict] | None) -> Iterator[None]:
    """Within the block, every ``train_metrics_aggr_fn`` of ``inner`` (and of the strategies it
    wraps) aggregates ``parts`` (one record per partition) instead of the records it is given
    (the one decoded reply). ``parts=None``: unchanged."""
    if parts is None:
        yield
        return
    saved = []
    for member in _chain(inner):
        fn = member.__dict__.get("train_metrics_aggr_fn") if hasattr(member, "__dict__") else None
        if not callable(fn):
            continue

        def shim(_records: list[RecordDict], weighting_key: str, _fn: Any = fn) -> Any:
            return _fn(parts, weighting_key)

        saved.append((member, fn))
        member.train_metrics_aggr_fn = shim
    try:
        yield
    finally:
        for member, fn in saved:
            member.train_metrics_aggr_fn = fn
