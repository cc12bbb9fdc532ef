"""A node's memory of what it has answered and released: the ``(nonce, round)`` pairs (replay
guard) and the release ledger its budget is checked against (node config ``dp-state-file``,
``dp-max-releases``, ``dp-max-epsilon``; :mod:`~fl_gradcode.flower.client_policy` says what
each key means). In memory, and in the node's ``dp-state-file`` when it has one: one JSON
line per answered round, appended under an exclusive lock.

ε is composed per partition as Opacus' RDP accountant composes Sampled Gaussian Mechanisms
(Mironov, Talwar, Zhang, "Rényi Differential Privacy of the Sampled Gaussian Mechanism",
2019): a ``dp='partition'`` release is one Gaussian mechanism at sample rate 1; a
``dp='sample'`` release is the app's DP-SGD, which the app reports per partition (its sample
rate and steps, :data:`~fl_gradcode.privacy.SAMPLE_RATE_METRIC`,
:data:`~fl_gradcode.privacy.STEPS_METRIC`), accounted after the app ran and before the reply
leaves the node.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..privacy import SAMPLE_RATE_METRIC, STEPS_METRIC, gaussian_epsilon, sgm_epsilon

if TYPE_CHECKING:
    from .client_policy import NodePolicy

__all__ = ["PolicyError", "Release", "ReplayGuard", "ledger_epsilon"]


class PolicyError(ValueError):
    """An instruction this node refuses (the message names the field and the node's policy)."""


class ReplayGuard:
    """The ``(nonce, round)`` pairs each node has answered and its release ledger: in memory,
    and in the node's ``dp-state-file`` when it has one. :meth:`claim` before computing,
    :meth:`release` if the computation failed before anything was sent."""

    def __init__(self) -> None:
        self._answered: set[tuple[Any, ...]] = set()
        # without a dp-state-file, for a node with a budget: this process's releases, per node
        # (by _process_key, as _answered is)
        self._ledger: dict[Any, list[dict]] = {}
        self._lock = threading.Lock()

    # Flower's simulation engine ships the ClientApp (and so the mod holding this guard) to
    # its Ray actors by pickling it: a lock cannot be pickled, each copy gets its own
    def __getstate__(self) -> dict[str, Any]:
        with self._lock:
            return {"_answered": set(self._answered),
                    "_ledger": {k: list(v) for k, v in self._ledger.items()}}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._answered = set(state["_answered"])
        self._ledger = {k: list(v) for k, v in state.get("_ledger", {}).items()}
        self._lock = threading.Lock()

    @staticmethod
    def _file_label(node_config: Mapping[str, Any], node_id: int) -> str:
        """Whose lines of the state file these are: the node's partition when its node config
        names one, else the node owning the file (``node``). Never the SuperLink's
        ``node_id``, which the server assigns anew at every registration: a restarted or
        re-registered node would start a fresh ledger and answer replays again."""
        if "partition-id" in node_config:
            return f"partition={node_config['partition-id']}/{node_config.get('num-partitions')}"
        return NODE_LABEL

    @staticmethod
    def _process_key(node_config: Mapping[str, Any], node_id: int) -> Any:
        """The in-process key of a node's answered rounds and release ledger: its partition
        when its node config names one (a node re-registered under a new ``node_id`` keeps
        them), else the ``node_id`` (the only name of a node among several in one process)."""
        if "partition-id" in node_config:
            return ("partition", str(node_config["partition-id"]),
                    str(node_config.get("num-partitions")))
        return int(node_id)

    def claim(self, node_id: int, node_config: Mapping[str, Any], nonce: str, rnd: int,
              release: Release | None = None, policy: NodePolicy | None = None) -> None:
        """Record ``(nonce, round)`` as answered by this node, or raise :class:`PolicyError`
        if it already was. With ``release``: also record it in the node's ledger, or raise
        :class:`PolicyError` if it would exceed ``policy``'s budget (``dp-max-releases``,
        ``dp-max-epsilon``)."""
        memory_key = (self._process_key(node_config, node_id), nonce, int(rnd))
        why = (f"round={rnd} with nonce={nonce!r} was already answered by this node: a second "
               "instruction for an answered (nonce, round) is refused, whatever it asks (its "
               "keyed noise would repeat)")
        if policy is None:
            from .client_policy import NodePolicy

            policy = NodePolicy()
        with self._lock:
            if memory_key in self._answered:
                raise PolicyError(why)
            path = node_config.get("dp-state-file")
            if path:
                entry = {"node": self._file_label(node_config, node_id), "nonce": nonce,
                         "round": int(rnd)}
                where = f" (ledger in dp-state-file {path})"

                def extend(previous: list[dict]) -> dict:
                    return _ledger_entry(entry, release, policy, previous, where)

                if not _file_claim(_state_path(path), entry, extend):
                    raise PolicyError(f"{why} (recorded in dp-state-file {path})")
            elif release is not None and policy.budgeted:
                entry = {"node": NODE_LABEL, "nonce": nonce, "round": int(rnd)}
                mine = self._ledger.setdefault(self._process_key(node_config, node_id), [])
                mine.append(_ledger_entry(entry, release, policy, mine,
                                          " (ledger in this process only: no dp-state-file)"))
            self._answered.add(memory_key)

    def release(self, node_id: int, node_config: Mapping[str, Any], nonce: str, rnd: int) -> None:
        """Forget a claim whose computation failed before any reply was sent."""
        with self._lock:
            self._answered.discard((self._process_key(node_config, node_id), nonce, int(rnd)))
            path = node_config.get("dp-state-file")
            if path:
                entry = {"node": self._file_label(node_config, node_id), "nonce": nonce,
                         "round": int(rnd)}
                _file_release(_state_path(path), entry)
            elif self._process_key(node_config, node_id) in self._ledger:
                mine = self._process_key(node_config, node_id)
                key = {"node": NODE_LABEL, "nonce": nonce, "round": int(rnd)}
                self._ledger[mine] = [e for e in self._ledger[mine] if not _same_round(e, key)]

    def account(self, node_id: int, node_config: Mapping[str, Any], nonce: str, rnd: int,
                reported: Mapping[int, Mapping[str, Any]], policy: NodePolicy) -> None:
        """Complete a claimed ``dp='sample'`` release once the app has run, before its reply
        leaves the node: each partition's DP-SGD as the app reported it (``reported``:
        partition -> its reply metrics, :data:`~fl_gradcode.privacy.SAMPLE_RATE_METRIC` and
        :data:`~fl_gradcode.privacy.STEPS_METRIC`) and its ε composed with the partition's
        earlier releases; :class:`PolicyError` past ``dp-max-epsilon``, or under it when the
        app reported no steps. Nothing to do for a claim with no ledger entry."""
        with self._lock:
            path = node_config.get("dp-state-file")
            if path:
                key = {"node": self._file_label(node_config, node_id), "nonce": nonce,
                       "round": int(rnd)}
                where = f" (ledger in dp-state-file {path})"
                _file_update(_state_path(path), key, lambda entries: _accounted(
                    entries, key, reported, policy, where, required=True), required=True)
            elif self._process_key(node_config, node_id) in self._ledger:
                mine = self._process_key(node_config, node_id)
                key = {"node": NODE_LABEL, "nonce": nonce, "round": int(rnd)}
                self._ledger[mine] = _accounted(
                    self._ledger[mine], key, reported, policy,
                    " (ledger in this process only: no dp-state-file)")


@dataclass(frozen=True)
class Release:
    """What one answered instruction releases: its partitions, its ``dp`` mode and
    ``noise-multiplier`` (the ledger's entry)."""

    partitions: tuple[int, ...]
    dp: str
    noise_multiplier: float
    #: how many partitions each of ``partitions`` is one of (the data's cut)
    num_partitions: tuple[int, ...]
    #: the run-config values the app splits its data by (:meth:`NodePolicy.data_cut`)
    cut: tuple[tuple[str, str], ...] = ()

    @property
    def accountable(self) -> bool:
        """Whether the node can know its ε: ``dp='partition'`` (the noise the node adds
        itself, one Gaussian mechanism) and ``dp='sample'`` (the app's DP-SGD, accounted from
        the steps the app reports, :meth:`ReplayGuard.account`)."""
        return self.dp in ("partition", "sample")


#: The state-file label of a node whose node config names no partition: the file is its own.
NODE_LABEL = "node"


def _owner(label: Any) -> Any:
    """Whose line a state-file label names: lines labelled by the SuperLink's ``node_id``
    (``node=ID``, written before labels were the node's own) are the file owner's."""
    return NODE_LABEL if isinstance(label, str) and label.startswith("node=") else label


def _same_owner(entry: Mapping[str, Any], key: Mapping[str, Any]) -> bool:
    return _owner(entry.get("node")) == _owner(key["node"])


def _same_round(entry: Mapping[str, Any], key: Mapping[str, Any]) -> bool:
    return _same_owner(entry, key) and all(entry.get(k) == key[k] for k in ("nonce", "round"))


def ledger_epsilon(multipliers: list[float], delta: float) -> float:
    """ε at ``delta`` of releases, each a Gaussian mechanism of noise multiplier
    ``multipliers[k]`` on the same partition (sample rate 1), composed as Opacus' RDP
    accountant composes them (:func:`fl_gradcode.privacy.gaussian_epsilon`: the project's
    accountant's ε, without importing torch); ``inf`` if one is 0."""
    return gaussian_epsilon(multipliers, delta)


def _ledger_entry(entry: dict, release: Release | None, policy: NodePolicy,
                  previous: list[dict], where: str) -> dict:
    """``entry`` extended with ``release`` (partitions, mode, sigma, each partition's ε), or
    :class:`PolicyError` if it would exceed ``policy``'s budget given the node's ``previous``
    ledger entries."""
    if release is None:
        return entry
    mine = [e for e in previous if _same_owner(e, entry)
            and isinstance(e.get("partitions"), list)]
    cut = set(release.num_partitions)
    earlier = {n for e in mine if isinstance(e.get("num-partitions"), list)
               for n in e["num-partitions"]}
    if policy.budgeted and cut and (len(cut) > 1 or (earlier and cut != earlier)):
        # the budget counts releases per partition id: partition j of another count holds
        # other records, which it would count as a fresh partition
        raise PolicyError(
            f"num-partitions={sorted(cut)} refused: this node's budget counts releases per "
            "partition, so its data must keep one cut"
            + (f" (its earlier releases: {sorted(earlier)} partitions)" if earlier else "")
            + f"{where}")
    if policy.budgeted and release.cut:
        _check_same_cut(dict(release.cut), mine, where)
    for j in release.partitions:
        count = sum(j in e["partitions"] for e in mine)
        if policy.max_releases and count >= policy.max_releases:
            raise PolicyError(
                f"partition {j} refused: this node has released it {count} times and its "
                f"budget dp-max-releases={policy.max_releases} is spent{where}")
    if policy.max_epsilon > 0 and not (release.accountable and release.noise_multiplier > 0):
        raise PolicyError(
            f"dp={release.dp!r} with noise-multiplier={release.noise_multiplier:g} refused: "
            f"this node's budget dp-max-epsilon={policy.max_epsilon:g} counts only noise the "
            "node adds itself or its app's DP-SGD (dp='partition' or 'sample', "
            "noise-multiplier > 0); this release's ε would be infinite")
    epsilons: dict[str, float | None] = {}
    if release.dp == "partition":
        for j in release.partitions:
            eps = sgm_epsilon([*_history(mine, j), (release.noise_multiplier, 1.0, 1)],
                              policy.delta)
            _check_epsilon(j, eps, policy, where)
            epsilons[str(j)] = eps if math.isfinite(eps) else None
    out = {**entry, "partitions": [int(j) for j in release.partitions], "dp": release.dp,
           "noise-multiplier": float(release.noise_multiplier)}
    if release.num_partitions:
        out["num-partitions"] = sorted(cut)
    if release.cut:
        out["cut"] = dict(release.cut)
    if release.dp == "partition":
        out["epsilon"] = epsilons
    if release.dp == "sample":
        out["sample"] = PENDING  # the app's steps are known once it has run
    return out


#: A ``dp='sample'`` ledger entry's ``sample`` while its app runs: nothing released yet.
PENDING = "pending"


def _history(mine: list[dict], j: int) -> list[tuple[float, float, int]]:
    """Partition ``j``'s earlier releases as Sampled Gaussian Mechanisms ``(sigma, q,
    steps)``: ``dp='partition'`` one step at ``q = 1``; ``dp='sample'`` the DP-SGD its app
    reported (a pending one, never sent, none); any other, or a ``dp='sample'`` release
    whose steps were not reported, noise 0 (ε infinite)."""
    out = []
    for e in mine:
        if j not in e["partitions"]:
            continue
        sigma = float(e.get("noise-multiplier", 0.0))
        sample = e.get("sample")
        if e.get("dp") == "partition":
            out.append((sigma, 1.0, 1))
        elif e.get("dp") == "sample" and sample == PENDING:
            continue
        elif e.get("dp") == "sample" and isinstance(sample, dict) and str(j) in sample:
            q, steps = sample[str(j)]
            out.append((sigma, float(q), int(steps)))
        else:
            out.append((0.0, 1.0, 1))
    return out


def _check_epsilon(j: int, eps: float, policy: NodePolicy, where: str) -> None:
    if policy.max_epsilon > 0 and not eps <= policy.max_epsilon:
        raise PolicyError(
            f"partition {j} refused: this release would bring its ε to {eps:.4g} "
            f"(delta={policy.delta:g}), over this node's budget "
            f"dp-max-epsilon={policy.max_epsilon:g}{where}")


def _reported_steps(j: int, metrics: Mapping[str, Any]) -> tuple[float, int] | None:
    """The app's ``(sample rate, steps)`` for partition ``j``, ``None`` when it reported
    neither, or :class:`PolicyError` naming a bad value."""
    q, steps = metrics.get(SAMPLE_RATE_METRIC), metrics.get(STEPS_METRIC)
    if q is None and steps is None:
        return None
    try:
        q, count = float(q), float(steps)
    except (TypeError, ValueError):
        q = count = math.nan
    if not (0 < q <= 1 and 0 <= count < math.inf and count == int(count)):
        raise PolicyError(
            f"the app reported {SAMPLE_RATE_METRIC}={metrics.get(SAMPLE_RATE_METRIC)!r}, "
            f"{STEPS_METRIC}={metrics.get(STEPS_METRIC)!r} for partition {j}; expected a "
            "sample rate in (0, 1] and a whole number of steps >= 0 (its DP-SGD)")
    return q, int(count)


def _accounted(entries: list[dict], key: Mapping[str, Any],
               reported: Mapping[int, Mapping[str, Any]], policy: NodePolicy,
               where: str, required: bool = False) -> list[dict]:
    """``entries`` with the pending ``dp='sample'`` entry of ``key`` completed from the app's
    ``reported`` metrics (:meth:`ReplayGuard.account`). ``required``: the claim wrote an
    entry (a state file's), so its absence is a :class:`PolicyError` (fail closed)."""
    index = next((i for i, e in enumerate(entries)
                  if isinstance(e, dict) and _same_round(e, key)), None)
    if index is None and required:
        raise PolicyError(f"dp='sample' refused: this round's ledger entry is gone, so its "
                          f"release cannot be accounted{where}")
    if index is None or entries[index].get("sample") != PENDING:
        return entries
    entry = entries[index]
    mine = [e for i, e in enumerate(entries) if i != index and isinstance(e, dict)
            and _same_owner(e, key) and isinstance(e.get("partitions"), list)]
    steps = {int(j): _reported_steps(int(j), reported.get(int(j), {}))
             for j in entry["partitions"]}
    missing = sorted(j for j, s in steps.items() if s is None)
    if missing and policy.max_epsilon > 0:
        raise PolicyError(
            f"dp='sample' refused: the app reported no {SAMPLE_RATE_METRIC} and "
            f"{STEPS_METRIC} for partition {missing[0]}, so its ε is unknown; this node's "
            f"budget dp-max-epsilon={policy.max_epsilon:g} needs them in the app's reply "
            f"metrics{where}")
    sigma = float(entry.get("noise-multiplier", 0.0))
    epsilons: dict[str, float | None] = {}
    if not missing:
        for j, (q, count) in steps.items():
            eps = sgm_epsilon([*_history(mine, j), (sigma, q, count)], policy.delta)
            _check_epsilon(j, eps, policy, where)
            epsilons[str(j)] = eps if math.isfinite(eps) else None
    done = {**entry, "sample": None if missing else
            {str(j): [q, count] for j, (q, count) in steps.items()}}
    if not missing:
        done["epsilon"] = epsilons
    return [*entries[:index], done, *entries[index + 1:]]


def _check_same_cut(cut: dict[str, str], mine: list[dict], where: str) -> None:
    """:class:`PolicyError` if an earlier release of this node was under other values of a
    run-config key the app splits its data by (the first key that differs is named)."""
    for entry in mine:
        earlier = entry.get("cut")
        if not isinstance(earlier, dict):
            continue  # a ledger line written before cuts were recorded
        for key, value in cut.items():
            if key in earlier and earlier[key] != value:
                raise PolicyError(
                    f"run config {key}={value} refused (or the train config's, which the app "
                    "may read over it): this node's budget counts releases "
                    "per partition, so its data must keep one cut (its earlier releases: "
                    f"{key}={earlier[key]}; node config dp-cut-keys names the run-config keys "
                    f"the app splits its data by){where}")


def _entries(text: str) -> list[dict]:
    """The state file's entries (a torn line from a crash mid-write is ignored)."""
    out = []
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            out.append(entry)
    return out


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on the state file ``path``, held on a lock file beside it (the
    ledger itself is replaced whole by :func:`_file_update`, so it cannot hold the lock)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _file_claim(path: Path, entry: dict, extend: Any = None) -> bool:
    """Append ``extend(entries)`` (default: ``entry``) under the lock unless an entry of the
    same node, nonce and round is there already (then False). ``extend`` sees the file's
    entries and may raise (a spent budget): nothing is written then."""
    with _locked(path):
        created = not path.exists()
        text = "" if created else path.read_text()
        previous = _entries(text)
        if any(_same_round(e, entry) for e in previous):
            return False
        full = entry if extend is None else extend(previous)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a") as handle:
            # after a torn last line, never glue this entry to it
            torn = "\n" if text and not text.endswith("\n") else ""
            handle.write(torn + json.dumps(full, sort_keys=True) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        if created:
            _sync_directory(path)
        return True


def _file_release(path: Path, entry: dict) -> None:
    _file_update(path, entry, lambda entries: [e for e in entries
                                               if not _same_round(e, entry)])


def _file_update(path: Path, entry: Mapping[str, Any],
                 change: Callable[[list[dict]], list[dict]], required: bool = False) -> None:
    """Replace the file by ``change(its entries)`` under the lock (``change`` may raise:
    nothing is written then). The new ledger is written beside it, synced, then renamed over
    it: a failed write (a full disk, a kill) leaves the old ledger whole. A missing file:
    nothing to do, or with ``required`` a :class:`PolicyError` (fail closed)."""
    with _locked(path):
        if not path.exists():
            if required:
                raise PolicyError(f"dp='sample' refused: dp-state-file {path} is gone, so "
                                  "this release cannot be accounted")
            return
        kept = change(_entries(path.read_text()))
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write("".join(json.dumps(e, sort_keys=True) + "\n" for e in kept))
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        _sync_directory(path)


def _state_path(path: Any) -> Path:
    """The node's ``dp-state-file`` with its links resolved: the ledger is replaced whole by
    renaming over it, which over a symbolic link would replace the link (the link's target,
    say on a persistent volume, would keep a stale ledger) and lock another name."""
    return Path(str(path)).resolve()


def _sync_directory(path: Path) -> None:
    """Make the creation or replacement of ``path`` durable (its directory's entry)."""
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
