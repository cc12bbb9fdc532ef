"""One owner per fact of a round, and a round that reads top to bottom.

* The walk: a real round through :class:`~fl_gradcode.flower.testing.InProcessGrid`, every
  public method of the round's collaborators wrapped to log its calls. ``aggregate_train``
  calls each collaborator once per phase (collect -> check sizes -> close -> cross-check ->
  decode -> record), never going back to the collector; ``configure_train`` opens, dispatches
  and starts collecting; the grid's callbacks reach the collector, not the strategy.
* The owners: a scan of the package's source. Each part of the round state is built (or, for
  the arrivals, updated) in its owner's module only.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
from pathlib import Path

import pytest
from flwr.app import ConfigRecord
from flwr.serverapp.strategy import FedAvg

from fl_gradcode.flower import GradientCoding, gradient_coding_mod
from fl_gradcode.flower.testing import InProcessGrid
from tests.apps.numpy_app import LR, initial_arrays, make_app

FLOWER = Path(__file__).resolve().parents[2] / "fl_gradcode" / "flower"
PACKAGE = FLOWER.parent

COLLABORATORS = ("collector", "verifier", "closer", "aggregator", "round_log", "opener",
                 "dispatcher")


class _Trace:
    """Every public method call of the strategy's collaborators, with its nesting depth."""

    def __init__(self, strategy: GradientCoding) -> None:
        self.calls: list[tuple[int, str, str]] = []
        self.depth = 0
        for name in COLLABORATORS:
            target = getattr(strategy, name)
            for attr in dir(type(target)):
                if attr.startswith("_") or not callable(getattr(type(target), attr, None)):
                    continue
                setattr(target, attr, self._wrap(name, attr, getattr(target, attr)))

    def _wrap(self, owner: str, name: str, method):
        @functools.wraps(method)
        def traced(*args, **kwargs):
            self.calls.append((self.depth, owner, name))
            self.depth += 1
            try:
                return method(*args, **kwargs)
            finally:
                self.depth -= 1

        return traced

    def top(self) -> list[tuple[str, str]]:
        return [(owner, name) for depth, owner, name in self.calls if depth == 0]

    def nested(self, owner: str, name: str) -> list[tuple[str, str]]:
        """The calls ``owner.name`` makes to the other collaborators (one level down)."""
        out, inside = [], False
        for depth, o, n in self.calls:
            if depth == 0:
                inside = (o, n) == (owner, name)
            elif inside and depth == 1 and o != owner:
                out.append((o, n))
        return out


@pytest.mark.parametrize("verify", [False, True])
def test_one_round_visits_each_collaborator_once_per_phase(verify):
    grid = InProcessGrid(make_app(gradient_coding_mod), 6)
    strategy = GradientCoding(FedAvg(fraction_evaluate=0.0), code="frc", s=2,
                              timing="wallclock", seed=0, verify=verify)
    wrapped = strategy.wrap_grid(grid)
    trace = _Trace(strategy)
    grid_calls: list[str] = []
    for name in ("on_reply", "ready", "prioritize", "on_unsent", "deadline_s"):
        setattr(strategy, name, lambda *a, _n=name, **k: grid_calls.append(_n))

    messages = list(strategy.configure_train(1, initial_arrays(), ConfigRecord({"lr": LR}),
                                             wrapped))
    assert trace.top() == [("round_log", "flush"),  # the last round's row, if it waited
                           ("collector", "clear"), ("opener", "open"),
                           ("dispatcher", "dispatch"), ("collector", "open")]

    trace.calls.clear()
    replies = wrapped.send_and_receive(messages, timeout=30)
    callbacks = {name for _, owner, name in trace.calls if owner == "collector"}
    assert {"deadline_s", "on_reply", "ready"} <= callbacks  # the grid asks the collector
    assert grid_calls == []  # ... and never the strategy

    trace.calls.clear()
    strategy.aggregate_train(1, replies)
    assert trace.top() == [
        ("collector", "collect"),  # collect: the replies the grid did not validate
        ("verifier", "check_sizes"),  # settle the partition sizes
        ("closer", "close"),  # the clock's window
        ("verifier", "cross_check"),  # verify the window's replies
        ("aggregator", "decode"),  # decode, privatise, inner strategy
        ("round_log", "coded_fields"), ("round_log", "record"),  # record the row
    ]
    assert trace.nested("aggregator", "decode") == [("verifier", "clearance")]
    assert trace.nested("closer", "close") == [("verifier", "stopping_rule")]
    assert strategy.history[0]["decode"] == "exact"
    # the replicas agree: a proof with verify=True; without it, the heuristic cross-check
    row = strategy.history[0]
    assert (row["verified"], row["cross_check"]) == (
        ("verified", None) if verify else (None, "verified"))
    view = strategy.current_round  # the public view: who was asked, what arrived
    assert view.number == 1 and view.sent == tuple(range(6)) and view.rejected == ()
    assert view.valid == tuple(range(6)) and view.worker_of(view.cohort[4]) == 4


# =============================================================================== owners
#: part of the round -> the one module that builds it
BUILT_BY = {
    "RoundPlan": "opener.py", "Requests": "dispatch.py", "Arrivals": "collector.py",
    "RoundState": "collector.py", "SizeCheck": "verifier.py", "Verification": "verifier.py",
    "Closing": "closer.py", "RoundOutcome": "aggregator.py",
}
#: a phase's part of the round state -> the one module that fills it in
FILLED_BY = {"sizes_check": "verifier.py", "verification": "verifier.py",
             "closing": "closer.py", "outcome": "aggregator.py"}
#: the modules of a round (only the round state's own module sets derived fields)
ROUND_MODULES = {"opener.py", "dispatch.py", "collector.py", "verifier.py", "closer.py",
                 "aggregator.py", "records.py", "wrapper.py", "policy.py"}
#: the arrivals' writes: the collector's alone
ARRIVAL_WRITES = {"receive", "answer", "stop", "accept", "reject", "refuse_message"}


def _sources():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path, ast.parse(path.read_text())


def _name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def test_each_part_of_the_round_is_built_and_filled_in_by_its_owner_only():
    wrong = []
    for path, tree in _sources():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = _name(node.func)
            where = f"{path.relative_to(PACKAGE)}:{node.lineno}"
            if name in BUILT_BY and path.name != BUILT_BY[name]:
                wrong.append(f"{name}(...) at {where}")
            if name == "replace":
                for keyword in node.keywords:
                    owner = FILLED_BY.get(keyword.arg or "")
                    if owner is not None and path.name != owner:
                        wrong.append(f"replace({keyword.arg}=...) at {where}")
            if name in ARRIVAL_WRITES and path.name != "collector.py" and isinstance(
                    node.func, ast.Attribute) and "arrivals" in ast.unparse(node.func.value):
                wrong.append(f"arrivals.{name}(...) at {where}")
            if name == "__setattr__" and path.name in ROUND_MODULES:
                wrong.append(f"__setattr__ at {where}")
    assert wrong == []


def test_the_round_state_and_its_parts_are_read_only():
    from fl_gradcode.flower.closer import Closing
    from fl_gradcode.flower.collector import Arrivals
    from fl_gradcode.flower.dispatch import Requests
    from fl_gradcode.flower.records import RoundOutcome
    from fl_gradcode.flower.round_state import RoundPlan, RoundState, RoundView
    from fl_gradcode.flower.verifier import SizeCheck, Verification

    for part in (RoundPlan, Requests, SizeCheck, Verification, Closing, RoundOutcome,
                 RoundState, RoundView):
        assert dataclasses.is_dataclass(part) and part.__dataclass_params__.frozen, part
    # the arrivals: only properties outside (their state is private to the collector module)
    public = [name for name in vars(Arrivals) if not name.startswith("_")]
    data = [name for name in public if not callable(getattr(Arrivals, name))
            and not isinstance(getattr(Arrivals, name), property)]
    assert data == []
    # no module writes a field of the round state or of a part (no such attribute target)
    fields = {f.name for part in (RoundPlan, RoundState) for f in dataclasses.fields(part)}
    fields |= {name for name in vars(RoundState) if isinstance(getattr(RoundState, name),
                                                               property)}
    writes = []
    for path, tree in _sources():
        for node in ast.walk(tree):
            targets = (node.targets if isinstance(node, ast.Assign | ast.Delete)
                       else [node.target] if isinstance(node, ast.AugAssign) else [])
            for target in targets:
                while isinstance(target, ast.Subscript):
                    target = target.value
                if (isinstance(target, ast.Attribute) and target.attr in fields
                        and "state" in ast.unparse(target.value)):
                    writes.append(f"{ast.unparse(target)} at {path.name}:{node.lineno}")
    assert writes == []
