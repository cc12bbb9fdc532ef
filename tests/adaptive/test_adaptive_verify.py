"""``s="auto"`` with ``verify=True``: only tolerances whose blocks ``verify`` can settle are
chosen, so no round leaves its blocks out (a round at another ``s`` was skipped whole)."""

from __future__ import annotations

import numpy as np
import pytest

from fl_gradcode.codes import NestedPlacement
from fl_gradcode.flower.policy import AdaptiveCodePolicy
from fl_gradcode.latency import PersistentSlow, ShiftedExponential
from tests.adaptive.support import run


def _repetition_groups(code) -> bool:
    """Every block: all its clients compute one nonzero combination of its partitions, and
    it has at least ``s + 1`` clients (an independent reading of the code's matrix)."""
    B = np.asarray(code.B)
    for clients, parts in code.blocks:
        rows = [tuple(B[c, p] for p in parts) for c in clients]
        if len(set(rows)) != 1 or not any(rows[0]) or len(clients) < code.s + 1:
            return False
    return True


class _NoData:
    has_data = False


@pytest.mark.parametrize(("n", "s_max"), [(12, 3), (20, 4), (13, 3)])
def test_auto_with_verify_considers_only_the_tolerances_verify_can_settle(n, s_max):
    placement = NestedPlacement(n, s_max, seed=0)
    expected = [s for s in placement.stable_values
                if s == 0 or _repetition_groups(placement.code(s))]
    policy = AdaptiveCodePolicy(code="frc", s="auto", s_max=s_max, verify=True, seed=0)
    assert policy.candidates(policy.placement(n), _NoData()) == expected
    plain = AdaptiveCodePolicy(code="frc", s="auto", s_max=s_max, seed=0)
    assert plain.candidates(plain.placement(n), _NoData()) == list(placement.stable_values)


def test_no_auto_round_under_verify_is_skipped_or_left_out_with_honest_clients():
    """Two persistently slow clients of 12: auto would choose s = 2, whose nested blocks are
    not repetition groups, so verify settled nothing and the round was skipped."""
    latency = PersistentSlow(base=ShiftedExponential(shift=1.0, rate=2.0), p=0.0,
                             slowdown=10.0, slow=(3, 8))
    strategy, _ = run(latency, rounds=8, verify=True, code="frc")
    settled = [s for s in range(4) if s == 0 or _repetition_groups(
        NestedPlacement(12, 3, seed=0).code(s))]
    assert [r["decode"] for r in strategy.history] == ["exact"] * 8
    assert all(r["verified"] == "verified" and not r["unsettled"] for r in strategy.history)
    assert {r["s"] for r in strategy.history} <= set(settled)


def test_excluding_slow_clients_is_refused_with_verify():
    """The groups left when a client is excluded compute different combinations, which
    verify cannot settle (checked on the placement, independently of the refusal)."""
    assert not _repetition_groups(NestedPlacement(20, 4, seed=0).code_excluding(1, [3]))
    with pytest.raises(ValueError, match=r"exclude_slow=4.0 with verify=True"):
        AdaptiveCodePolicy(code="frc", s="auto", s_max=3, verify=True, exclude_slow=4.0)
    AdaptiveCodePolicy(code="frc", s="auto", s_max=3, exclude_slow=4.0)  # without: taken


def test_approximate_rounds_are_refused_with_verify():
    """An approximate round ends before a block's s + 1 replicas have all arrived; verify
    settles a block only when s + 1 agree, so such rounds were mostly skipped."""
    with pytest.raises(ValueError, match=r"auto_approximate=True with verify=True"):
        AdaptiveCodePolicy(code="frc", s="auto", s_max=3, verify=True, auto_approximate=True)
    AdaptiveCodePolicy(code="frc", s="auto", s_max=3, auto_approximate=True)


def test_a_policy_instance_built_without_verify_is_refused_by_a_verifying_strategy():
    from flwr.serverapp.strategy import FedAvg

    from fl_gradcode.flower import GradientCoding

    unverified = AdaptiveCodePolicy(code="frc", s="auto", s_max=3)
    with pytest.raises(ValueError, match=r"built without verify=True, for a strategy that "):
        GradientCoding(FedAvg(), code="frc", s="auto", s_max=3, verify=True,
                       code_policy=unverified)
    GradientCoding(FedAvg(), code="frc", s="auto", s_max=3, verify=True,
                   code_policy=AdaptiveCodePolicy(code="frc", s="auto", s_max=3, verify=True))


def test_a_cohort_with_no_verifiable_tolerance_is_said_once(flwr_log):
    import logging

    policy = AdaptiveCodePolicy(code="frc", s="auto", s_max=3, verify=True, seed=0)
    placement = policy.placement(7)
    assert not any(_repetition_groups(placement.code(s)) for s in (1, 2, 3))
    assert policy.candidates(placement, _NoData()) == [0]
    policy.candidates(placement, _NoData())
    said = [line for level, line in flwr_log
            if level == logging.WARNING and "for a cohort of 7" in line]
    assert len(said) == 1 and "no s in 1..3 gives repetition groups" in said[0]
