"""``arrivals_s`` of a coded round's row: under virtual timing every valid reply's modelled
arrival, those after the round's end included; under wallclock timing none (the server
does not model arrivals there, so it records no times it did not see)."""

from __future__ import annotations

from fl_gradcode.latency import ShiftedExponential
from tests.flower.harness import run


def test_a_virtual_round_records_every_reply_sent_and_a_wallclock_round_none():
    latency = ShiftedExponential(1.0, 2.0)
    # late work runs on: a client still busy is sent nothing (busy = skip), so no arrival
    kept = run(6, code="frc", s=1, rounds=2, latency=latency)
    assert any(r["busy"] for r in kept.rows)
    for row in kept.rows:
        assert sorted(map(int, row["arrivals_s"])) == sorted(set(range(6)) - set(row["busy"]))
    # late work stopped when the round ends: every client is sent work, every reply timed
    free = run(6, code="frc", s=1, rounds=2, latency=latency, stop_late_work="decode")
    for row in free.rows:
        assert sorted(map(int, row["arrivals_s"])) == list(range(6))
        assert all(t > 0 for t in row["arrivals_s"].values())
    # frc with s = 1 decodes from one of each pair: some reply came after the round ended
    assert any(max(r["arrivals_s"].values()) > r["round_virtual_s"] for r in free.rows)
    wallclock = run(6, code="frc", s=1, rounds=2, timing="wallclock")
    assert [r["arrivals_s"] for r in wallclock.rows] == [{}, {}]
