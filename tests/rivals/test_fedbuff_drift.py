"""FedBuff under a regime that drifts at a round: the change comes when the federation has
sent as many jobs as a synchronous run of cohorts of ``concurrency`` by that round, not at
each client's own ``round``-th job (which, with many clients and few in flight, a client
may never reach)."""

from __future__ import annotations

import pytest

from fl_gradcode.latency import Drift, client_delay
from fl_gradcode.rivals import FedBuff
from tests.flower.harness import FixedArrivals
from tests.rivals.test_rivals import _start

pytestmark = pytest.mark.filterwarnings("ignore:fraction_evaluate")

N, SLOTS, FAST, SLOW = 6, 2, 1.0, 10.0


def _drift(at_round):
    rows = range(1, 9)
    return Drift(before=FixedArrivals({r: [FAST] * N for r in rows}),
                 after=FixedArrivals({r: [SLOW] * N for r in rows}), at_round=at_round)


def test_a_drift_changes_fedbuffs_regime_when_the_federation_reaches_its_round():
    """Two slots, one update per step, every job FAST before round 2 and SLOW from it.
    Jobs 1-2 (round 1) arrive at FAST; each arrival frees its slot and the next job is sent:
    jobs 3-4 are round 2's, SLOW, though each goes to a client on its first or second job
    (six clients share two slots), and arrive at FAST + SLOW; jobs 5-6 (round 3) then at
    FAST + 2 SLOW."""
    strategy = FedBuff(buffer_size=1, concurrency=SLOTS, latency=_drift(2),
                       measured_compute=False)
    _start(strategy, N, 6)
    times = [row["virtual_s"] for row in strategy.history]
    assert times == pytest.approx([FAST, FAST, FAST + SLOW, FAST + SLOW,
                                   FAST + 2 * SLOW, FAST + 2 * SLOW])


def test_without_a_regime_round_the_draw_is_the_rounds_own():
    model = _drift(2)
    kw = {"worker": 0, "load": 1.0, "seed": 0}
    assert client_delay(model, round_index=1, **kw) == FAST
    assert client_delay(model, round_index=2, **kw) == SLOW
    assert client_delay(model, round_index=1, regime_round=2, **kw) == SLOW
    assert client_delay(model, round_index=3, regime_round=1, **kw) == FAST
