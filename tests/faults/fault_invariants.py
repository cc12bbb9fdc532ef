"""One scenario of ``tests/faults/fault_injection.py`` run and checked: the ``Outcome`` record,
``run_scenario`` (``GradientCoding`` on the ``Injector``'s ``InProcessGrid``, Flower's logs kept
quiet) and ``check``, every invariant the suite's docstring lists (each failure goes to
``Outcome.violations``).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord

from fl_gradcode.flower import GradientCoding
from fl_gradcode.flower.membership import code_for_cohort
from fl_gradcode.flower.testing import set_task_identity
from fl_gradcode.latency import Pareto
from fl_gradcode.results import read_rounds
from tests.faults import fault_kinds as edges
from tests.faults import fault_replies as replies
from tests.faults.fault_injector import Injector
from tests.faults.fault_kinds import EDGE_FORGING
from tests.faults.fault_scenarios import (
    FORGING,
    REJECTED,
    VALUE_FORGING,
    Scenario,
    flat_model,
    initial_model,
    node_ids_for,
    oracle,
)

RTOL = 1e-6


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
    """Run one scenario and check every invariant (its nodes' state files removed after)."""
    set_task_identity()
    injector = Injector(scn, node_ids_for(scn.n))
    grid = injector.grid()
    try:
        return _checked_run(scn, injector, grid)
    finally:
        if injector.state_dir is not None:
            shutil.rmtree(injector.state_dir, ignore_errors=True)


def _checked_run(scn: Scenario, injector: Injector, grid: Any) -> Outcome:
    outcome = Outcome(scn)
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
    for node in injector.claimed:  # claimed in the handshake of round 1
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

