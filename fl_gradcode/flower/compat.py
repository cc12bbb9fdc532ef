"""What composes with :class:`~fl_gradcode.flower.GradientCoding`, and clear errors for the rest.

Coding is exact for an inner strategy whose aggregation depends on the replies only through
their example-weighted average ``sum_i n_i theta_i / sum_i n_i`` and total weight: the wrapper
decodes that average from any decodable set of coded replies and hands the inner strategy ONE
reply holding it. FedAvg and FedProx return it; FedAvgM, FedAdam, FedYogi and FedAdagrad apply
their server optimizer to it (a legitimate transformation of the average). Everything else is
refused before it can silently change what the user's strategy means:

* aggregators over individual replies (Krum, MultiKrum, Bulyan, FedMedian, FedTrimmedAvg,
  FedXgb*, QFedAvg and their subclasses): over one decoded reply a robust aggregator is FedAvg;
* any other inner strategy whose ``aggregate_train`` is not one of the above, checked once at
  the first aggregation on copies of it: several replies must give what their weighted average
  as one reply gives (:func:`check_averaging`);
* Flower's DP strategy wrappers, inside (at construction) or outside (at the first
  ``configure_train``/``aggregate_train``, from the caller), with a reason true for each:
  inside, the server-side ones clip the decoded average once and the adaptive client-side one
  counts one decoded norm bit; outside, they clip coded combinations (not updates), read coded
  replies as clients and skip a round for any error reply. Flower's client-side FIXED clipping
  wrapper is exact INSIDE ``GradientCoding`` with ``fixedclipping_mod`` inside
  ``gradient_coding_mod`` (Flower's own mechanism: each partition clipped before coding, its
  noise added once to the decoded average), and refused outside;
* legacy ``flwr.server.strategy`` strategies and workflows (``DefaultWorkflow``,
  ``SecAggPlusWorkflow``, ``LegacyContext``): decoding needs each coded reply, and SecAgg+
  reveals only their sum, which is not a decodable set;
* a reply modified after the wrapper cached it (another wrapper's ``aggregate_train``
  replacing its records or arrays): :class:`ReplyFingerprints`.

Privacy that composes: clients clip each partition's update before coding (this library's
``dp=DPConfig(mode="central" | "partition", ...)``, whose mod clips every partition, or Flower's
``fixedclipping_mod`` placed INSIDE ``gradient_coding_mod``), and the noise is this library's,
calibrated to the decoded average's sensitivity.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import re
import sys
from collections.abc import Iterator, Sequence
from logging import WARNING
from typing import Any

from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import strategy as fl

from .averaging import check_averaging  # re-exported: part of what composes

__all__ = [
    "AVERAGING_AGGREGATIONS",
    "PER_CLIENT_AGGREGATORS",
    "CompositionError",
    "ReplyFingerprints",
    "check_averaging",
    "check_caller",
    "check_inner_strategy",
    "client_side_dp_count",
    "explain_error_reply",
    "legacy_attribute_error",
]

#: Flower's Message-API strategies that aggregate individual replies (refused as inner).
PER_CLIENT_AGGREGATORS: tuple[type, ...] = tuple(
    getattr(fl, name)
    for name in ("Krum", "MultiKrum", "Bulyan", "FedMedian", "FedTrimmedAvg", "FedXgbBagging",
                 "FedXgbCyclic", "QFedAvg")
    if hasattr(fl, name)
)

#: ``aggregate_train`` implementations whose result depends on the replies only through their
#: weighted average (FedAvg's; FedAvgM's and FedOpt's server optimizers applied to it).
AVERAGING_AGGREGATIONS: frozenset[Any] = frozenset(
    getattr(fl, name).aggregate_train
    for name in ("FedAvg", "FedAvgM", "FedAdam", "FedYogi", "FedAdagrad")
    if hasattr(fl, name)
)

def _dp_bases() -> tuple[type, ...]:
    """Flower's DP strategy wrappers' base classes (fixed and adaptive clipping)."""
    found = []
    for module, name in (
        ("flwr.serverapp.strategy.dp_fixed_clipping", "DifferentialPrivacyFixedClippingBase"),
        ("flwr.serverapp.strategy.dp_adaptive_clipping", "DifferentialPrivacyAdaptiveBase"),
    ):
        try:
            found.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):  # pragma: no cover - another Flower version
            continue
    return tuple(found)


_DP_BASES = _dp_bases()

CODED_ALTERNATIVE = (
    "For robustness to faulty or malicious clients use the coded alternative: "
    "GradientCoding(FedAvg(...), code=..., s=..., verify=True) (integrity from redundancy: "
    "replicas of each partition must agree, an outvoted reply is excluded, a contradiction "
    "skips the round)."
)

_DP_RECIPES = (
    "Use one of the recipes that compose with coding: (1) this library's DP, "
    "GradientCoding(strategy, dp=DPConfig(mode='central', clip_norm=C, noise_multiplier=sigma)) "
    "(clients clip every partition's update before coding, the server adds noise once to the "
    "decoded average with std sigma*C*max_j n_j/sum_j n_j) or DPConfig(mode='partition', ...) "
    "(noise on the clients, no trusted server); (2) Flower's fixedclipping_mod INSIDE "
    "gradient_coding_mod, ClientApp(mods=[gradient_coding_mod, fixedclipping_mod]) with "
    "'clipping_norm' in the train config, which clips each partition's update before coding, "
    "with the noise from dp=DPConfig(mode='central', ...) as in (1); or (3) Flower's "
    "DifferentialPrivacyClientSideFixedClipping INSIDE GradientCoding with that mod order "
    "(Flower's own noise sigma*C/num_sampled_clients on the decoded average)."
)

_LEGACY = (
    "GradientCoding is a Message-API strategy (flwr.serverapp.strategy): it cannot run under "
    "Flower's legacy API (flwr.server.strategy, ServerConfig/LegacyContext, DefaultWorkflow, "
    "SecAggPlusWorkflow): decoding needs each coded reply, and SecAgg+ reveals only the sum of "
    "the replies, which is not a decodable set. Run it from a ServerApp main with "
    "strategy.start(grid=grid, initial_arrays=..., num_rounds=...), and for privacy use this "
    "library's dp=DPConfig(mode='partition' | 'central', ...)."
)

#: Names Flower's legacy server loop calls on its strategy (never defined by GradientCoding).
_LEGACY_METHODS = frozenset({"initialize_parameters", "configure_fit", "aggregate_fit",
                             "evaluate"})


class CompositionError(RuntimeError):
    """A composition with Flower that coding cannot make exact (raised mid-run)."""


def _name(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def _wrapped_chain(strategy: Any, limit: int = 8) -> list[Any]:
    """``strategy`` and the strategies it wraps by composition (``.strategy``/``.inner``)."""
    chain = [strategy]
    while len(chain) < limit:
        inner = getattr(chain[-1], "strategy", None)
        if not isinstance(inner, fl.Strategy):
            inner = getattr(chain[-1], "inner", None)
        if not isinstance(inner, fl.Strategy) or any(inner is s for s in chain):
            break
        chain.append(inner)
    return chain


def is_client_side_fixed(strategy: Any) -> bool:
    """Flower's ``DifferentialPrivacyClientSideFixedClipping`` (or a subclass)."""
    cls = getattr(fl, "DifferentialPrivacyClientSideFixedClipping", None)
    return cls is not None and isinstance(strategy, cls)


#: Why Flower's client-side fixed-clipping wrapper is exact INSIDE GradientCoding.
_CLIENT_SIDE_FIXED = (
    "GradientCoding(DifferentialPrivacyClientSideFixedClipping(strategy, noise_multiplier=sigma, "
    "clipping_norm=C, num_sampled_clients=N)) with ClientApp(mods=[gradient_coding_mod, "
    "fixedclipping_mod]) is Flower's own mechanism: the wrapper puts 'clipping_norm' in the "
    "train config, fixedclipping_mod clips each partition's update before coding, the inner "
    "strategy aggregates the decoded average of the clipped updates (what it aggregates "
    "uncoded) and the wrapper adds its noise sigma*C/N to it once"
)


class _DropOneClientLine(logging.Filter):
    """Drops Flower's DP wrappers' "clients returning parameters (1) differs from the number
    of sampled clients" line: under coding the inner strategy always gets one decoded reply."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str)
                    and "number of clients returning parameters" in record.msg)


@contextlib.contextmanager
def client_side_dp_count(inner: Any, partitions: int | None,
                         round_number: int) -> Iterator[None]:
    """Around the inner aggregation of a round: Flower's client-side fixed-clipping wrapper
    (if ``inner`` is or wraps one) would warn that ONE reply differs from its
    ``num_sampled_clients``; the line is dropped, and a WARNING is logged instead when the
    decoded average holds another number of ``partitions`` (an approximate round)."""
    wrapper = next((m for m in _wrapped_chain(inner) if is_client_side_fixed(m)), None)
    if wrapper is None:
        yield
        return
    expected = int(getattr(wrapper, "num_sampled_clients", 0))
    if partitions is not None and partitions != expected:
        log(WARNING, "round %d: the decoded average holds %d partitions, not the %d "
            "(num_sampled_clients) %s calibrates its noise for: this could weaken its "
            "differential privacy guarantee", round_number, partitions, expected,
            type(wrapper).__name__)
    logger, quiet = logging.getLogger("flwr"), _DropOneClientLine()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def _dp_inside_reason(member: Any) -> str:
    """Why Flower's DP wrapper ``member`` inside GradientCoding cannot be exact (true for it)."""
    name = type(member).__name__
    if "ServerSide" in name:
        return (
            f"{name} inside GradientCoding would clip the decoded average once (not each "
            "client's update: individual updates never reach the server) and add noise "
            "calibrated to num_sampled_clients updates each clipped at the clipping norm, "
            "which no client clipped: the decoded average's sensitivity is not bounded by it."
        )
    return (
        f"{name} inside GradientCoding would adapt its clipping norm from the fraction of "
        "replies whose update norm was under it (each reply's norm bit), but it receives ONE "
        "decoded reply whose bit is the example-weighted average of the partitions' bits, "
        "counted as one client: the norm would not follow the quantile it targets, and its "
        "noise on that count is for one reply."
    )


def _legacy_strategy_error(strategy: Any) -> TypeError | None:
    try:
        from flwr.server.strategy import Strategy as LegacyStrategy
    except ImportError:  # pragma: no cover - Flower without the legacy API
        return None
    if not isinstance(strategy, LegacyStrategy):
        return None
    name = type(strategy).__name__
    same = f"flwr.serverapp.strategy.{name}" if hasattr(fl, name) else (
        "a flwr.serverapp.strategy.Strategy (e.g. flwr.serverapp.strategy.FedAvg)")
    return TypeError(
        f"strategy={_name(strategy)} is a legacy flwr.server.strategy strategy; GradientCoding "
        f"wraps Message-API strategies: use {same}. " + _LEGACY
    )


def check_inner_strategy(strategy: Any, wrapper_type: type) -> bool:
    """Refuse an inner strategy coding cannot make exact; warn if its ``start`` is skipped.

    Returns ``True`` when the strategy's aggregation is not a known averaging one, so that
    :func:`check_averaging` must run once on its first aggregation.
    """
    legacy = _legacy_strategy_error(strategy)
    if legacy is not None:
        raise legacy
    if not isinstance(strategy, fl.Strategy):
        raise TypeError(
            f"strategy must be a flwr.serverapp.strategy.Strategy (e.g. "
            f"flwr.serverapp.strategy.FedAvg(...)); got {_name(strategy)}"
        )
    for member in _wrapped_chain(strategy):
        if isinstance(member, wrapper_type):
            raise TypeError(
                f"strategy={type(strategy).__name__} is (or wraps) a GradientCoding: the inner "
                "strategy would receive one decoded reply and code it again. Wrap the plain "
                "strategy once: GradientCoding(FedAvg(...), code=..., s=...)."
            )
        if _DP_BASES and isinstance(member, _DP_BASES):
            if is_client_side_fixed(member):
                continue  # exact: see _CLIENT_SIDE_FIXED
            raise TypeError(_dp_inside_reason(member) + " " + _DP_RECIPES)
        if isinstance(member, PER_CLIENT_AGGREGATORS):
            raise ValueError(
                f"{type(member).__name__} aggregates individual clients' replies, but under "
                "GradientCoding the inner strategy receives ONE reply holding the decoded "
                "example-weighted average (individual updates never reach the server, only "
                f"coded combinations of them): {type(member).__name__} over one reply is "
                "FedAvg, or no model at all. " + CODED_ALTERNATIVE
            )
    if type(strategy).start is not fl.Strategy.start:
        log(WARNING, "%s overrides start(); under GradientCoding it does not run "
            "(GradientCoding.start runs Flower's Strategy.start loop with the coded rounds): "
            "its own hooks (checkpoints, result files, experiment tracking) are skipped. Put "
            "them in an evaluate_fn passed to GradientCoding.start, or in the ServerApp "
            "after start returns.", type(strategy).__name__)
    while is_client_side_fixed(strategy):  # its noise aside, it aggregates as it wraps
        strategy = strategy.strategy
    hooks = overridden_aggregation_hooks(strategy)
    if hooks:
        raise ValueError(
            f"{type(strategy).__name__} overrides {', '.join(hooks)}, which Flower's "
            f"aggregate_train calls on the clients' replies; under GradientCoding it would run "
            "on ONE reply holding the decoded average instead (a per-client check or filter "
            "there would silently train another model). Filter in the ClientApp (a client "
            "that should not count sends no update), or drop the override. "
            + CODED_ALTERNATIVE)
    return type(strategy).aggregate_train not in AVERAGING_AGGREGATIONS


def check_shared_content(strategy: Any, messages: Sequence[Message]) -> None:
    """Refuse a round whose inner ``configure_train`` gave nodes different contents (a
    per-node ``lr``, say): every replica of a partition must train it under the same settings
    for its coded combinations to decode, and a node's reply covers others' partitions."""
    first = messages[0]
    for other in messages[1:]:
        diff = _content_difference(first.content, other.content)
        if diff is not None:
            raise ValueError(
                f"{type(strategy).__name__}.configure_train sends nodes different train "
                f"contents ({diff}: node {first.metadata.dst_node_id} vs node "
                f"{other.metadata.dst_node_id}); under GradientCoding each partition is "
                "trained by several nodes, whose replies decode only if every replica trains "
                "it under the same settings. Send every node the same content (per-node "
                "settings belong in the node config or the ClientApp).")


def _content_difference(a: RecordDict, b: RecordDict) -> str | None:
    """What differs between two train contents (``None``: nothing)."""
    if a is b:
        return None
    if list(a.keys()) != list(b.keys()):
        return f"records {list(a.keys())} vs {list(b.keys())}"
    for key in a.keys():
        x, y = a[key], b[key]
        if isinstance(x, ArrayRecord) and isinstance(y, ArrayRecord):
            if list(x.keys()) != list(y.keys()) or any(
                    x[k] is not y[k] and x[k].data != y[k].data for k in x.keys()):
                return f"the arrays of {key!r}"
        elif dict(x) != dict(y):
            changed = sorted(k for k in set(dict(x)) | set(dict(y))
                             if dict(x).get(k) != dict(y).get(k))
            return f"{key!r} keys {changed}"
    return None


def overridden_aggregation_hooks(strategy: Any) -> list[str]:
    """The methods that the ``aggregate_train`` of ``strategy``'s nearest Flower class calls
    (``self.name(...)``, followed into what those call) and that ``strategy``'s own class
    overrides: Flower's averaging runs them on every client's reply."""
    cls = type(strategy)
    base = next((c for c in cls.__mro__ if c.__module__.startswith("flwr.")), None)
    if base is None or base.aggregate_train is not cls.aggregate_train:
        return []
    names: set[str] = set()
    todo = ["aggregate_train"]
    while todo:
        name = todo.pop()
        for klass in base.__mro__:
            fn = klass.__dict__.get(name)
            try:
                source = inspect.getsource(fn) if callable(fn) else ""
            except (OSError, TypeError):  # pragma: no cover - sources not installed
                source = ""
            for called in re.findall(r"self\.(\w+)\(", source):
                if called not in names:
                    names.add(called)
                    todo.append(called)
    return sorted(n for n in names
                  if n in dir(base) and getattr(cls, n, None) is not getattr(base, n, None)
                  and _takes_replies(getattr(base, n)))


def _takes_replies(method: Any) -> bool:
    """Whether a Flower strategy method is handed the replies (a parameter named for them),
    not the aggregate they were averaged into (FedOpt's ``_compute_deltat_and_mt``)."""
    try:
        names = inspect.signature(method).parameters
    except (TypeError, ValueError):  # pragma: no cover - not introspectable: assume it does
        return True
    return any(word in name for name in names for word in ("repl", "message", "content"))


def legacy_attribute_error(owner: Any, name: str) -> AttributeError:
    """The ``AttributeError`` for ``owner.name``: a clear one for the legacy API's calls."""
    if name in _LEGACY_METHODS:
        return AttributeError(f"{type(owner).__name__}.{name} does not exist. " + _LEGACY)
    return AttributeError(f"{type(owner).__name__!r} object has no attribute {name!r}")


def _callers(coded: Any, depth: int, frames: int) -> Iterator[Any]:
    """The ``self`` of each of up to ``frames`` frames from ``depth`` above the caller of the
    function asking, other than ``coded`` (the strategies calling it, innermost first)."""
    try:
        frame = sys._getframe(depth + 1)
    except ValueError:
        return
    for _ in range(frames):
        if frame is None:
            return
        caller = frame.f_locals.get("self")
        if caller is not None and caller is not coded:
            yield caller
        frame = frame.f_back


def check_caller(coded: Any, depth: int = 2, frames: int = 6) -> None:
    """Refuse a Flower DP wrapper calling ``coded`` (``DPWrapper(GradientCoding(...))``).

    Looks at the strategies calling this one (the ``self`` of up to ``frames`` frames above
    the caller): Flower's wrappers hold their strategy by composition, so the outer DP wrapper
    is a caller whose wrapped chain reaches ``coded``.
    """
    if not _DP_BASES:
        return
    for caller in _callers(coded, depth, frames):
        if not (isinstance(caller, _DP_BASES) and any(s is coded for s in _wrapped_chain(caller))):
            continue
        if is_client_side_fixed(caller):
            raise CompositionError(
                f"{type(caller).__name__}(GradientCoding(...)) sees the coded replies: it skips "
                "aggregation for the whole round when any of them is an error reply (a "
                "straggler stopped at its deadline, a crashed node: what coding tolerates) and "
                "counts coded replies as clients. The same wrapper is exact INSIDE: "
                + _CLIENT_SIDE_FIXED + "."
            )
        if "ServerSide" not in type(caller).__name__:  # client-side adaptive clipping
            raise CompositionError(
                f"{type(caller).__name__}(GradientCoding(...)) cannot be exact: it reads each "
                "coded reply as one client's (a coded reply combines several partitions: its "
                "norm bit is no client's, so the clipping norm would not follow the quantile "
                "it targets) and skips the whole round when any reply is an error (a "
                "straggler stopped at its deadline, a crashed node), which coding tolerates: "
                "no DP guarantee. " + _DP_RECIPES
            )
        raise CompositionError(
            f"{type(caller).__name__}(GradientCoding(...)) cannot be exact: an outer DP "
            "wrapper clips the coded replies (linear combinations of several partitions' "
            "updates, not updates), which the decoder never reads back, and adds noise "
            "calibrated to one client per reply to an average in which each partition has "
            "a weight n_j/sum_j n_j: no DP guarantee. " + _DP_RECIPES
        )


class ReplyFingerprints:
    """The identity of each reply's records as the wrapper cached it, checked again when the
    replies reach ``aggregate_train`` (cheap: object identities and a small metrics copy)."""

    def __init__(self) -> None:
        self._round: int | None = None
        self._seen: dict[str, tuple[Any, ...]] = {}

    @staticmethod
    def _take(reply: Message) -> tuple[Any, ...]:
        """``(content, arrays, metrics)``: the content's identity, each array record's key,
        identity, items and data identities, each metric record's key, identity and a copy.

        Read from the content's own items filtered by type (what ``array_records`` and
        ``metric_records`` hold, in the same order) without those properties, which build a
        synced dict and write every record back into the content on each call."""
        content = reply.content
        arrays, metrics = [], []
        for key, rec in content.items():
            if isinstance(rec, ArrayRecord):
                arrays.append((key, rec, tuple(rec.items()),
                               tuple(arr.data for arr in rec.values())))
            elif isinstance(rec, MetricRecord):
                metrics.append((key, rec, dict(rec)))
        return (content, tuple(arrays), tuple(metrics))

    def record(self, server_round: int, reply: Message) -> None:
        """Remember ``reply`` as cached in ``server_round``."""
        if self._round != server_round:
            self._round, self._seen = server_round, {}
        mid = reply.metadata.message_id
        if mid and not reply.has_error():
            self._seen[mid] = (reply.metadata.reply_to_message_id, reply.metadata.src_node_id,
                               self._take(reply))

    def check(self, server_round: int, replies: list[Message], outer: str | None) -> None:
        """Raise :class:`CompositionError` if a reply cached in this round was modified."""
        if self._round != server_round:
            return
        who = f"the outer strategy {outer}" if outer else "a strategy wrapping it"
        answered = {reply.metadata.reply_to_message_id for reply in replies}
        present = {reply.metadata.message_id for reply in replies}
        dropped = sorted(str(node) for mid, (rid, node, _) in self._seen.items()
                         if mid not in present and rid not in answered)
        if dropped:
            raise CompositionError(
                f"round {server_round}: the replies from node(s) {', '.join(dropped)} were "
                f"cached by GradientCoding but removed before its aggregate_train (by {who}): "
                "GradientCoding decodes each coded reply as it arrives, so a filter applied "
                "afterwards would be silently ignored. Only wrappers that pass replies through "
                "unchanged compose with it; to exclude faulty clients use verify=True."
            )
        for reply in replies:
            cached = self._seen.get(reply.metadata.message_id)
            if cached is None:
                continue
            if reply.has_error() or not _same(cached[2], self._take(reply)):
                raise CompositionError(
                    f"round {server_round}: the reply from node {reply.metadata.src_node_id} "
                    f"was modified after GradientCoding cached it (by {who}, e.g. in its "
                    "aggregate_train): GradientCoding validates and decodes each coded reply "
                    "as it arrives, so a change made afterwards would be silently ignored. "
                    "Only wrappers that pass replies through unchanged compose with it; "
                    "clipping and noise belong in the coded pipeline. " + _DP_RECIPES
                )


def _same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    if a[0] is not b[0] or len(a[1]) != len(b[1]) or len(a[2]) != len(b[2]):
        return False
    for (k1, r1, items1, data1), (k2, r2, items2, data2) in zip(a[1], b[1], strict=True):
        if k1 != k2 or r1 is not r2 or len(items1) != len(items2) or len(data1) != len(data2):
            return False
        if any(x[0] != y[0] or x[1] is not y[1] for x, y in zip(items1, items2, strict=True)):
            return False
        if any(x is not y for x, y in zip(data1, data2, strict=True)):
            return False
    for (k1, r1, m1), (k2, r2, m2) in zip(a[2], b[2], strict=True):
        if k1 != k2 or r1 is not r2 or m1 != m2:
            return False
    return True


def outer_name(coded: Any, depth: int = 2, frames: int = 6) -> str | None:
    """The class of the strategy calling ``coded`` (an outer wrapper), if any."""
    for caller in _callers(coded, depth, frames):  # (a loop: a generator adds a frame)
        if isinstance(caller, fl.Strategy):
            return type(caller).__name__
    return None


def explain_error_reply(reply: Message) -> str:
    """One line for an error reply to a coded message (handshake or train), naming what is
    wrong: the mod's own errors as they are; a Flower mod placed before
    ``gradient_coding_mod`` as a mod-order problem; anything else as an error from outside the
    mod (the mod missing, or an outer mod failing)."""
    from . import protocol
    from .mod import MOD_ERROR_CODE
    from .reasons import raising_function
    from .records import split_reason

    if not reply.has_error():
        return "not an error reply"
    code = int(reply.error.code)
    # the reason's first part ("Type: message"), without the traceback a client may append
    reason = " ".join(split_reason(reply.error.reason)[0].split())[:300]
    head = f"error reply (code {code}: {reason})"
    if "secagg" in reason.lower():  # secaggplus_mod / secagg_mod, in either order
        return (
            f"{head}: secaggplus_mod (or secagg_mod) runs only under Flower's "
            "SecAggPlusWorkflow, which cannot run coded rounds (decoding needs each coded "
            "reply; SecAgg+ reveals only their sum, which is not a decodable set): remove it "
            "from the ClientApp's mods, and for privacy use this library's "
            "dp=DPConfig(mode='partition' | 'central', ...)"
        )
    if code in (MOD_ERROR_CODE, protocol.STOPPED_CODE):
        return head
    mods = ("fixedclipping_mod", "adaptiveclipping_mod", "LocalDpMod", "arrays_size_mod",
            "message_size_mod")
    named = next((m for m in mods if m in reason), None)
    if code == 6 or named is not None:  # Flower's ErrorCode.MOD_FAILED_PRECONDITION
        mod = named or "a client mod"
        return (
            f"{head}: {mod} rejected the coded message before gradient_coding_mod saw it. "
            "Mods listed before gradient_coding_mod wrap it and see the coded protocol "
            "messages, not the app's: put gradient_coding_mod first, e.g. "
            f"ClientApp(mods=[gradient_coding_mod, {named or 'your_mod'}]) (each partition's "
            "update then passes through the mod before coding)"
        )
    raiser = raising_function(reply.error.reason)
    if raiser is not None and "mod" in raiser.lower():
        return (
            f"{head}: {raiser} (a client mod listed before gradient_coding_mod) failed on the "
            "coded protocol message: mods listed before gradient_coding_mod see the protocol's "
            "messages (the identify handshake carries no 'arrays' or 'config' record), not the "
            f"app's. Move it after: ClientApp(mods=[gradient_coding_mod, {raiser}]) (it then "
            "runs once per partition on each partition's train message: see 'Client mods' in "
            "docs/works_with.md), or make it pass on messages it does not understand "
            "(return call_next(msg, context))"
        )
    where = f" ({raiser} raised it)" if raiser else ""
    return (
        f"{head}: this error did not come from gradient_coding_mod (its errors have code "
        f"{MOD_ERROR_CODE}){where}. Either a client mod listed BEFORE gradient_coding_mod "
        "failed on the coded protocol message (such mods see the protocol's messages, e.g. "
        "the identify handshake, which carries no 'arrays' or 'config' record): move it after, "
        "ClientApp(mods=[gradient_coding_mod, your_mod]), or make it pass on messages it does "
        "not understand; or the ClientApp does not run gradient_coding_mod: add it as the "
        "first mod, ClientApp(mods=[gradient_coding_mod, ...])"
    )

