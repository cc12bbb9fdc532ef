"""``rounds.jsonl``'s ``compute_s`` (the main job's "client compute" column) counts every
partition the clients computed, late work included: a reply that arrives after its round
returned early is dropped, but its compute was spent and is counted in the row of the round in
which it arrived."""

from __future__ import annotations

import time

import pytest
from flwr.app import Context, Message, MessageType

from fl_gradcode.flower import gradient_coding_mod
from fl_gradcode.flower.testing import InProcessGrid
from tests.apps.numpy_app import make_app
from tests.flower.harness import run

pytestmark = [pytest.mark.filterwarnings("ignore:gradient_coding_mod. no partition key"),
              # PartitionWork runs inside the coded computation on purpose (per partition)
              pytest.mark.filterwarnings("ignore:PartitionWork is listed after")]

WORK_S = 0.02  # what one partition's computation costs the app (a sleep)


class PartitionWork:
    """An inner mod (under the coding mod): each partition's train call sleeps ``WORK_S`` and
    records the seconds it took, measured here (the oracle, independent of the mod's own
    ``compute-s``)."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    def __call__(self, msg: Message, context: Context, call_next) -> Message:
        if msg.metadata.message_type != MessageType.TRAIN:
            return call_next(msg, context)
        t0 = time.perf_counter()
        time.sleep(WORK_S)
        reply = call_next(msg, context)
        self.seconds.append(time.perf_counter() - t0)
        return reply


def test_late_partitions_are_counted_in_the_client_compute():
    """Wall-clock timing, FRC n=4 s=1: worker 3's round-1 reply is held back until round 2 is
    sent (whatever the machine's load), so round 1 decodes without it and returns; the reply
    is pulled during a later round as late. Its two partitions were computed: the rows'
    compute_s over the run must include them."""
    work = PartitionWork()
    grid = InProcessGrid(make_app(gradient_coding_mod, work), 4,
                         hold=lambda worker, rnd: 2 if (worker, rnd) == (3, 1) else None)
    result = run(4, code="frc", s=1, rounds=4, timing="wallclock", grid=grid,
                 straggler_timeout=30.0)
    rows = result.rows
    assert sum(r["late_dropped"] for r in rows) >= 1  # the scenario happened
    assert len(work.seconds) == sum(2 * (4 - len(r["busy"]) - len(r["excluded"]))
                                    for r in rows)  # every sent worker computed 2 partitions
    counted = sum(r["compute_s"] for r in rows)
    computed = sum(work.seconds)  # every partition, late ones included
    # the mod's compute-s wraps the app call (a little more than the app's own seconds)
    assert counted >= computed - 1e-9
    assert counted <= computed + 0.005 * len(work.seconds)
