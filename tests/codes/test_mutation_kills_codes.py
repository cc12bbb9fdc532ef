"""Code behaviours pinned down after mutation testing (``experiments/mutation.py``): the
communication-efficient code's condition number is that of its generator's received columns,
and a nested placement lists one code per tolerance.

Expected values are derived by hand or computed here with numpy on the code's matrices, never
by the code path under test.
"""

from __future__ import annotations

import numpy as np

from fl_gradcode.codes import NestedPlacement, make_code


def test_comm_efficient_condition_number_is_that_of_the_received_generator_columns():
    """One group of six members (n=6, s=2, m=2: load 4, a Gaussian 2 x 6 generator): the
    condition number of a received set is ``cond(Gamma[:, T])``; with fewer than m = 2 replies
    the group's system is singular."""
    code = make_code("comm-efficient", 6, 2, m=2)
    (gamma,) = code.gammas
    assert gamma.shape == (2, 6)
    for received in ([0, 3], [1, 2, 5], list(range(6))):
        assert code.condition_number(received) == np.linalg.cond(gamma[:, received])
    assert code.condition_number([4]) == float("inf")


def test_nested_placement_lists_a_code_for_every_tolerance_up_to_s_max():
    placement = NestedPlacement(8, 3)
    codes = placement.codes()
    assert sorted(codes) == [0, 1, 2, 3]
    assert [codes[s].s for s in range(4)] == [0, 1, 2, 3]
