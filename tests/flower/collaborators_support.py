"""Round parts for the tests of GradientCoding's collaborators on their own
(``test_collaborators*.py``), shared by several of them: round 1's plan and state on a cohort,
one partition per member, without a Flower run (``make_plan``, ``make_state``), a reply double
with what the collector reads of it (``StubReply``, ``late_reply``), a ``RoundVerifier`` with
the default deadlines (``make_verifier``) and the log lines ``caplog`` captured
(``log_messages``)."""

from __future__ import annotations

from types import SimpleNamespace

from fl_gradcode.flower.collector import Arrivals
from fl_gradcode.flower.deadline_policy import DeadlinePolicy
from fl_gradcode.flower.dispatch import Requests
from fl_gradcode.flower.options import DeadlineOptions, IntegrityOptions
from fl_gradcode.flower.protocol import STOPPED_CODE, Identity
from fl_gradcode.flower.quarantine import Quarantine
from fl_gradcode.flower.round_state import RoundPlan, RoundState
from fl_gradcode.flower.verifier import RoundVerifier


def make_verifier(verify=False, tolerance=1e-5, quarantine=None):
    return RoundVerifier(IntegrityOptions(verify=verify, verify_tolerance=tolerance),
                         DeadlinePolicy(DeadlineOptions(), False), quarantine or Quarantine())


def make_plan(code, cohort, *, probe=None, reply_layout=None, dtypes=None, busy=(),
              wire="float64"):
    """Round 1's plan (what the opener builds) on ``cohort``, one partition per member."""
    return RoundPlan(number=1, code=code, cohort=tuple(cohort),
                     partitions=tuple(Identity(j, len(cohort)) for j in range(len(cohort))),
                     busy=tuple(busy), excluded=(), quarantined=(), layout={},
                     reply_layout=reply_layout or {}, dtypes=dtypes or {}, theta={},
                     array_key="arrays", wire=wire, wall_start=0.0, probe=probe)


def make_state(code, cohort, *, sent=None, valid=None, collector=None, **plan):
    """Round 1's state: ``sent`` (worker -> message), the ``valid`` replies arrived; opened
    by ``collector`` when given (its round in progress)."""
    requests = Requests(dict(sent or {}))
    if collector is not None:
        state = collector.open(make_plan(code, cohort, **plan), requests)
    else:
        state = RoundState(make_plan(code, cohort, **plan), requests, Arrivals(code))
    for worker, reply in (valid or {}).items():
        state.arrivals.accept(worker, reply)
    return state


class StubReply:
    """What the collector reads of a reply (no Flower run needed)."""

    def __init__(self, group: str, stopped: bool, node: int = 7) -> None:
        self.metadata = SimpleNamespace(src_node_id=node, dst_node_id=node, group_id=group)
        self.error = SimpleNamespace(code=STOPPED_CODE if stopped else 0, reason="stopped")
        self.content = {}

    def has_error(self) -> bool:
        return self.error.code == STOPPED_CODE


def late_reply(group: str, stopped: bool) -> StubReply:
    return StubReply(group, stopped)


def log_messages(caplog):
    return [r.getMessage() for r in caplog.records]
