"""Targeted scenarios of the fault suite for its tests (``tests/faults/test_fault_injection.py``,
``tests/faults/test_fault_edges.py``): a ``Scenario`` with one planned fault (``scenario``), run
and checked free of violations (``run``) or sound under the edge invariants (``assert_sound``),
a round's model compared with the numpy FedAvg oracle (``assert_equals_oracle``), a seed whose
latencies make a worker arrive first (``seed_where_first``), and the warning filter the tests
share (``pytestmark``).
"""

from __future__ import annotations

import numpy as np
import pytest

from fl_gradcode.latency import Pareto, client_delay
from tests.faults import fault_injection as fi

pytestmark = [
    pytest.mark.filterwarnings("ignore:gradient_coding_mod. no partition key:UserWarning"),
]


def scenario(kind=None, *, at=(1, 0), round_kind=None, rounds=2, code="frc", n=6, s=1,
             verify=False, timing="virtual", variant=None, seed=5, timeout=1e6):
    scn = fi.Scenario(index=-1, seed=seed, n=n, code=code, s=s, timing=timing, verify=verify,
                      rounds=rounds, straggler_timeout=timeout if timing == "virtual" else 0.25)
    if kind is not None:
        scn.node_faults[at] = kind
        if variant is not None:
            scn.variants[at] = variant
    if round_kind is not None:
        scn.round_faults[at[0]] = round_kind
    return scn


def run(scn):
    out = fi.run_scenario(scn)
    assert out.violations == [], out.violations
    assert not out.crashed
    return out


def assert_equals_oracle(out, server_round):
    got = fi.flat_model(out.models[server_round])
    expected = fi.flat_model(fi.oracle(out.models[server_round - 1], out.scenario.n))
    assert np.linalg.norm(got - expected) <= 1e-9 * np.linalg.norm(expected)


def seed_where_first(worker: int, server_round: int, n: int = 6, start: int = 0) -> int:
    """A scenario seed (from ``start`` on) whose Pareto latencies make ``worker`` arrive first
    in the round."""
    model = Pareto(scale=1.0, shape=1.5)
    for seed in range(start, start + 10_000):
        times = [client_delay(model, worker=w, round_index=server_round, load=1.0, seed=seed)
                 for w in range(n)]
        if int(np.argmin(times)) == worker:
            return seed
    raise AssertionError("no such seed")


def assert_sound(out):
    """The edge invariants: no violation, the run not ended by a node, nothing wrong applied
    as verified."""
    assert not out.ended_by_node_failure, out.violations
    assert out.wrong_verified == 0, out.violations
    assert out.violations == [], out.violations
