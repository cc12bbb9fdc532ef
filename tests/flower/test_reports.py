"""What the server reports about replies: public reasons, size checks, the noise scale."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fl_gradcode.flower.protocol import RejectedReply
from fl_gradcode.flower.reports import (
    MISSING_KEYS_HELP,
    SIZE_RTOL,
    central_noise_scale,
    check_reply_sizes,
    missing_keys,
    outlying_sizes,
    public_reason,
    untrainable,
)


class _Code:
    """A stand-in code: worker -> its partitions and encoding coefficients."""

    def __init__(self, rows: dict[int, dict[int, float]]) -> None:
        self.rows = rows

    def assignment(self, worker: int) -> list[int]:
        return sorted(self.rows[worker])

    def encoding_coefficients(self, worker: int) -> list[float]:
        return [self.rows[worker][j] for j in self.assignment(worker)]


# ======== found by mutation testing ==============================================================
@pytest.mark.mutation_found("reports")
def test_public_reason_escapes_c1_controls_and_cuts_with_a_note():
    assert public_reason("a\x7fb\x9fc\xa0d") == "a\\x7fb\\x9fc\xa0d"
    assert public_reason("x" * 10, limit=10) == "x" * 10
    cut = public_reason("abcdefghijklmnopqrstuvwxyz", limit=24)
    assert cut == "abcde... [26 characters]"
    # escaping lengthens: a text that fits only unescaped is cut too
    assert public_reason("\n" * 20, limit=25) == "\\n\\n\\n... [20 characters]"
    assert public_reason(12) == "12"


@pytest.mark.mutation_found("reports")
def test_check_reply_sizes_accepts_the_weighted_sum_and_names_what_is_wrong():
    code = _Code({0: {1: 2.0, 3: -0.5}, 1: {}})
    check_reply_sizes(code, 0, [10.0, 4.0], 18.0)  # 2 * 10 - 0.5 * 4
    check_reply_sizes(code, 0, [10.0, 4.0], 18.0 * (1 + 1e-10))  # within the tolerance
    with pytest.raises(RejectedReply) as info:
        check_reply_sizes(code, 0, [10.0, 4.0], 19.0)
    assert str(info.value) == ("partition-sizes=[10, 4] do not add up to num-examples=19: "
                               "sum_j B[i,j] n_j = 18 with coefficients [2, -0.5]")
    with pytest.raises(RejectedReply) as info:
        check_reply_sizes(code, 0, [10.0], 20.0)
    assert str(info.value) == ("partition-sizes=[10] has 1 entries; worker 0 holds 2 "
                               "partitions")
    check_reply_sizes(code, 1, [0], 0)  # a worker without partitions reports [0] and 0
    with pytest.raises(RejectedReply) as info:
        check_reply_sizes(code, 1, [0], 3)
    assert str(info.value) == ("partition-sizes=[0] and num-examples=3 from a worker with no "
                               "partitions (expected [0] and 0)")
    with pytest.raises(RejectedReply):
        check_reply_sizes(code, 1, [2], 0)
    with pytest.raises(RejectedReply, match="do not add up"):
        check_reply_sizes(code, 0, [float("inf"), 4.0], float("inf"))


@pytest.mark.mutation_found("reports")
def test_size_lists_are_shown_up_to_eight_values():
    code = _Code({0: {j: 1.0 for j in range(10)}})
    with pytest.raises(RejectedReply) as info:
        check_reply_sizes(code, 0, list(range(9)), 1.0)
    assert str(info.value).startswith("partition-sizes=[0, 1, 2, 3, 4, 5, 6, 7, ...] has 9 ")


@pytest.mark.mutation_found("reports")
def test_the_central_noise_scale_is_the_largest_weighted_size_over_the_count():
    decoding = SimpleNamespace(alpha=np.array([0.5, 0.0, -2.0]))
    assert central_noise_scale(decoding, {0: 10.0, 2: 3.0}, 4.0) == pytest.approx(6.0 / 4.0)
    with pytest.raises(ValueError) as info:
        central_noise_scale(decoding, {0: 10.0, 1: 5.0}, 4.0)
    assert str(info.value) == "no checked size for partitions [2] the decoding weighs"
    with pytest.raises(ValueError) as info:
        central_noise_scale(decoding, {0: 0.0, 2: 0.0}, 4.0)
    assert str(info.value) == "central noise scale 0.0 from sizes [0, 0] and count 4"
    with pytest.raises(ValueError, match="central noise scale inf"):
        central_noise_scale(decoding, {0: float("inf"), 2: 1.0}, 1.0)


@pytest.mark.mutation_found("reports")
def test_outlying_sizes_are_more_than_a_hundred_times_the_median_of_three_or_more():
    assert outlying_sizes({0: 1.0, 1: 1.0}) == []
    assert outlying_sizes({0: 1.0, 1: 100.0, 2: 100.1, 3: 1.0, 4: 1.0}) == [(2, 100.1, 1.0)]
    assert outlying_sizes({0: 0.0, 1: 0.0, 2: 5.0}) == []


@pytest.mark.mutation_found("reports")
def test_missing_keys_needs_a_reason_and_every_reason_to_say_so():
    assert missing_keys([]) is False
    assert missing_keys(["x needs partition keys on the client",
                         "node has no key for partition 3"]) is True
    assert missing_keys(["x needs partition keys on the client", "other"]) is False
    assert missing_keys(iter(["has no key for partition 1"])) is True


@pytest.mark.mutation_found("reports")
def test_an_untrainable_round_says_why_and_what_to_do():
    err = untrainable(4, "partition")
    assert isinstance(err, RuntimeError)
    assert str(err) == ("round 4: every reply was refused because the clients have no DP "
                        "partition keys (dp='partition'); nothing can be trained. "
                        + MISSING_KEYS_HELP)
    assert "FL_GRADCODE_DP_KEY_FILE" in MISSING_KEYS_HELP


@pytest.mark.mutation_found("reports")
def test_replicas_agree_within_a_relative_tolerance_of_the_larger_size():
    from fl_gradcode.flower.reports import agree_sizes

    code = _Code({0: {0: 1.0}, 1: {0: 1.0}, 2: {1: 1.0}, 3: {1: 1.0}})
    big = 1e6
    agreed, excluded, confirmed = agree_sizes(
        code, {0: [big], 1: [big * (1 + 5e-10)], 2: [3.0], 3: [3.0]})
    assert excluded == {} and agreed == {0: big * (1 + 5e-10), 1: 3.0}
    assert confirmed == agreed


@pytest.mark.mutation_found("reports")
def test_the_noise_scale_names_at_most_eight_missing_partitions_and_refuses_no_weight():
    many = SimpleNamespace(alpha=np.ones(10))
    with pytest.raises(ValueError) as info:
        central_noise_scale(many, {0: 1.0}, 1.0)
    assert str(info.value) == ("no checked size for partitions [1, 2, 3, 4, 5, 6, 7, 8] the "
                               "decoding weighs")
    with pytest.raises(ValueError) as info:
        central_noise_scale(SimpleNamespace(alpha=np.zeros(3)), {}, 2.0)
    assert str(info.value) == "central noise scale 0.0 from sizes [] and count 2"


@pytest.mark.mutation_found("reports")
def test_the_size_check_tolerance_is_inclusive_and_at_least_absolute_1e_9():
    code = _Code({0: {0: 0.0}})  # expected sum 0 whatever the size
    check_reply_sizes(code, 0, [5.0], 1e-9)  # exactly at the tolerance: accepted
    with pytest.raises(RejectedReply, match="do not add up"):
        check_reply_sizes(code, 0, [5.0], 1.5e-9)


@pytest.mark.mutation_found("reports")
def test_three_sizes_are_enough_to_flag_an_outlier():
    assert outlying_sizes({0: 1.0, 1: 1.0, 2: 1000.0}) == [(2, 1000.0, 1.0)]


@pytest.mark.mutation_found("reports")
def test_one_worker_in_several_ties_is_the_one_excluded_and_named_for_its_partitions():
    from fl_gradcode.flower.reports import agree_sizes

    # worker 0 holds partitions 0 and 1 (each shared with one honest replica) and misreports
    # both; partition 2's two replicas tie on their own
    code = _Code({0: {0: 1.0, 1: 1.0}, 1: {0: 1.0}, 2: {1: 1.0}, 3: {2: 1.0}, 4: {2: 1.0}})
    agreed, excluded, confirmed = agree_sizes(
        code, {0: [11.0, 21.0], 1: [10.0], 2: [20.0], 3: [5.0], 4: [6.0]})
    assert excluded[0] == (
        "partition-sizes: worker 0 disagrees with another replica in each of partitions [0, 1] "
        "(no other worker disagrees in as many); partition 0: workers [0] report 11; workers "
        "[1] report 10; partition 1: workers [0] report 21; workers [2] report 20")
    assert sorted(excluded) == [0, 3, 4]
    assert excluded[3].endswith(": no majority, every replica in the tie excluded")
    assert agreed == {0: 10.0, 1: 20.0} and confirmed == {}


@pytest.mark.parametrize("limit", [0, 1, 5, 12, 20, 40])
def test_public_reason_never_exceeds_its_limit_even_when_the_note_would(limit):
    for text in ("x" * 100, "\n" * 100, "short"):
        out = public_reason(text, limit=limit)
        assert len(out) <= limit
        if len(text) <= limit and "\n" not in text:
            assert out == text


@settings(max_examples=300, deadline=None)
@given(
    coefficients=st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=1, max_size=5),
    sizes=st.lists(st.floats(0, 1e7, allow_nan=False), min_size=5, max_size=5),
    off=st.sampled_from([0.0, 0.5, 0.999, 1.0, 1.001, 2.0, -0.999, -1.001, 1e6]),
)
def test_check_reply_sizes_accepts_exactly_what_the_relative_tolerance_allows(
        coefficients, sizes, off):
    """Near the bound, with terms that cancel (the scale ``sum |c| n`` then sets it): the
    verdict is the rule's, ``|sum c n - count| <= SIZE_RTOL max(sum |c| n, |count|, 1)``."""
    sizes = sizes[: len(coefficients)]
    code = _Code({0: dict(enumerate(coefficients))})
    expected = 0.0
    for c, n in zip(coefficients, sizes, strict=True):
        expected += c * n
    scale = float(np.sum(np.abs(np.array(coefficients)) * np.array(sizes)))
    count = expected + off * SIZE_RTOL * max(scale, abs(expected), 1.0)
    accept = abs(expected - count) <= SIZE_RTOL * max(scale, abs(count), 1.0)
    if accept:
        check_reply_sizes(code, 0, sizes, count)
    else:
        with pytest.raises(RejectedReply, match="do not add up"):
            check_reply_sizes(code, 0, sizes, count)
