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


# ======== edges: exact values, bounds and messages ===============================================
def test_public_reason_escapes_c1_controls_and_cuts_with_a_note():
    assert public_reason("a\x7fb\x9fc\xa0d") == "a\\x7fb\\x9fc\xa0d"
    assert public_reason("x" * 10, limit=10) == "x" * 10
    cut = public_reason("abcdefghijklmnopqrstuvwxyz", limit=24)
    assert cut == "abcde... [26 characters]"
    # escaping lengthens: a text that fits only unescaped is cut too
    assert public_reason("\n" * 20, limit=25) == "\\n\\n\\n... [20 characters]"
    assert public_reason(12) == "12"


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


def test_size_lists_are_shown_up_to_eight_values():
    code = _Code({0: {j: 1.0 for j in range(10)}})
    with pytest.raises(RejectedReply) as info:
        check_reply_sizes(code, 0, list(range(9)), 1.0)
    assert str(info.value).startswith("partition-sizes=[0, 1, 2, 3, 4, 5, 6, 7, ...] has 9 ")


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


def test_outlying_sizes_are_more_than_a_hundred_times_the_median_of_three_or_more():
    assert outlying_sizes({0: 1.0, 1: 1.0}) == []
    assert outlying_sizes({0: 1.0, 1: 100.0, 2: 100.1, 3: 1.0, 4: 1.0}) == [(2, 100.1, 1.0)]
    assert outlying_sizes({0: 0.0, 1: 0.0, 2: 5.0}) == []


def test_missing_keys_needs_a_reason_and_every_reason_to_say_so():
    assert missing_keys([]) is False
    assert missing_keys(["x needs partition keys on the client",
                         "node has no key for partition 3"]) is True
    assert missing_keys(["x needs partition keys on the client", "other"]) is False
    assert missing_keys(iter(["has no key for partition 1"])) is True


def test_an_untrainable_round_says_why_and_what_to_do():
    err = untrainable(4, "partition")
    assert isinstance(err, RuntimeError)
    assert str(err) == ("round 4: every reply was refused because the clients have no DP "
                        "partition keys (dp='partition'); nothing can be trained. "
                        + MISSING_KEYS_HELP)
    assert "FL_GRADCODE_DP_KEY_FILE" in MISSING_KEYS_HELP


def test_replicas_agree_within_a_relative_tolerance_of_the_larger_size():
    from fl_gradcode.flower.reports import agree_sizes

    code = _Code({0: {0: 1.0}, 1: {0: 1.0}, 2: {1: 1.0}, 3: {1: 1.0}})
    big = 1e6
    agreed, excluded, confirmed = agree_sizes(
        code, {0: [big], 1: [big * (1 + 5e-10)], 2: [3.0], 3: [3.0]})
    assert excluded == {} and agreed == {0: big * (1 + 5e-10), 1: 3.0}
    assert confirmed == agreed


def test_the_noise_scale_names_at_most_eight_missing_partitions_and_refuses_no_weight():
    many = SimpleNamespace(alpha=np.ones(10))
    with pytest.raises(ValueError) as info:
        central_noise_scale(many, {0: 1.0}, 1.0)
    assert str(info.value) == ("no checked size for partitions [1, 2, 3, 4, 5, 6, 7, 8] the "
                               "decoding weighs")
    with pytest.raises(ValueError) as info:
        central_noise_scale(SimpleNamespace(alpha=np.zeros(3)), {}, 2.0)
    assert str(info.value) == "central noise scale 0.0 from sizes [] and count 2"


def test_the_size_check_tolerance_is_inclusive_and_at_least_absolute_1e_9():
    code = _Code({0: {0: 0.0}})  # expected sum 0 whatever the size
    check_reply_sizes(code, 0, [5.0], 1e-9)  # exactly at the tolerance: accepted
    with pytest.raises(RejectedReply, match="do not add up"):
        check_reply_sizes(code, 0, [5.0], 1.5e-9)


def test_three_sizes_are_enough_to_flag_an_outlier():
    assert outlying_sizes({0: 1.0, 1: 1.0, 2: 1000.0}) == [(2, 1000.0, 1.0)]


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


# ======== edges: exact values, bounds and messages ===============================================
_NOT_ADDING_UP = r"^partition-sizes=\[.*\] do not add up to num-examples="


def _agree(code, reported, confirmed=None):
    from fl_gradcode.flower.reports import agree_sizes

    return agree_sizes(code, reported, confirmed)


def test_exactly_eight_sizes_are_shown_without_an_ellipsis():
    code = _Code({0: {j: 1.0 for j in range(7)}})
    with pytest.raises(RejectedReply) as info:
        check_reply_sizes(code, 0, [float(v) for v in range(1, 9)], 36.0)
    assert str(info.value) == ("partition-sizes=[1, 2, 3, 4, 5, 6, 7, 8] has 8 entries; "
                               "worker 0 holds 7 partitions")


def test_a_code_with_fewer_coefficients_than_partitions_is_an_error_not_a_shorter_sum():
    # worker 0 holds partitions 0 and 1 but the code gives one coefficient: 1 * 3 == 3 would
    # pass if the second size were silently dropped
    code = SimpleNamespace(assignment=lambda worker: [0, 1],
                           encoding_coefficients=lambda worker: [1.0])
    with pytest.raises(ValueError, match=r"^zip\(\) argument 2 is longer than argument 1$"):
        check_reply_sizes(code, 0, [3.0, 4.0], 3.0)


def test_the_scale_bound_is_inclusive():
    """``|sum c n - count| <= SIZE_RTOL max(sum |c| n, |count|, 1)`` with equality: terms
    that cancel (sum 0, scale 2^41), count = -SIZE_RTOL 2^41 (all exact in float64)."""
    code = _Code({0: {0: 1.0, 1: -1.0}})
    bound = SIZE_RTOL * float(2**41)
    assert bound > SIZE_RTOL * max(bound, 1.0)  # the count's own bound is exceeded
    check_reply_sizes(code, 0, [2.0**40, 2.0**40], -bound)
    with pytest.raises(RejectedReply, match=_NOT_ADDING_UP):
        check_reply_sizes(code, 0, [2.0**40, 2.0**40], -np.nextafter(bound, np.inf))


@pytest.mark.skipif(np.finfo(np.longdouble).nmant <= 52, reason="long double is float64 here")
def test_long_double_sizes_are_read_as_float64_for_the_scale():
    """The client sums float64 sizes, so the scale is ``sum |c| float64(n)``: 3 * 2^60 here,
    where the long double sum would be one float64 step (512) larger."""
    ld = np.longdouble
    sizes = [ld(2**60) + 127, ld(2**59) + 63, ld(3 * 2**59) + 127]
    as64 = [float(n) for n in sizes]
    assert as64 == [2.0**60, 2.0**59, 3.0 * 2**59]  # the weighted sum 1, 1, -1 is exactly 0
    code = _Code({0: {0: 1.0, 1: 1.0, 2: -1.0}})
    bound = SIZE_RTOL * (3.0 * 2**60)
    wider = SIZE_RTOL * float(ld(2**60) + 127 + ld(2**59) + 63 + ld(3 * 2**59) + 127)
    assert wider > bound
    check_reply_sizes(code, 0, sizes, -bound)
    with pytest.raises(RejectedReply, match=_NOT_ADDING_UP):
        check_reply_sizes(code, 0, sizes, -wider)


def test_a_reply_within_its_count_bound_is_settled_without_the_scale():
    """The scale (``sum |c| n``) is only computed when the count's own bound
    ``SIZE_RTOL max(|count|, 1)`` (inclusive) is not met: here it would overflow float64 and
    warn, though the reply is consistent."""
    import warnings

    code = _Code({0: {0: 1.0, 1: -1.0, 2: 1.0}})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # sum = 1e10 + 1, count 1e10: off 1 <= 1e-9 * 1e10
        check_reply_sizes(code, 0, [1e308, 1e308, 1e10 + 1.0], 1e10)
        # sum = 1e-9, count 0: off 1e-9 == 1e-9 * 1, the bound is inclusive
        check_reply_sizes(code, 0, [1e308, 1e308, 1e-9], 0.0)
    with pytest.warns(RuntimeWarning, match="overflow"):  # the scale, when it is needed
        check_reply_sizes(code, 0, [1e308, 1e308, 1e10 + 1.0], 1e10 - 100.0)


def test_a_worker_without_partitions_reporting_zero_takes_no_part_in_the_agreement():
    # the mod reports [0] for a worker with nothing assigned; every valid reply is cross-checked
    code = _Code({0: {0: 1.0}, 1: {0: 1.0}, 2: {}})
    agreed, excluded, confirmed = _agree(code, {0: [5.0], 1: [5.0], 2: [0.0]})
    assert (agreed, excluded, confirmed) == ({0: 5.0}, {}, {0: 5.0})


def test_an_outvoted_reason_names_at_most_six_groups_of_claims():
    # partition 0: workers 0-2 report 10, workers 3-8 each report another value (7 groups)
    code = _Code({w: {0: 1.0} for w in range(9)})
    reported = {w: [10.0] for w in range(3)} | {w: [float(w)] for w in range(3, 9)}
    agreed, excluded, _ = _agree(code, reported)
    assert agreed == {0: 10.0} and sorted(excluded) == list(range(3, 9))
    assert excluded[8] == (
        "partition-sizes: n_0=8 disagrees with the other replicas of partition 0 (workers "
        "[0, 1, 2] report 10; workers [3] report 3; workers [4] report 4; workers [5] report "
        "5; workers [6] report 6; workers [7] report 7)")


def test_a_worker_in_five_ties_is_named_for_all_five_with_the_claims_of_four():
    # worker 0 holds partitions 0-4, each shared with one honest worker (1-5), and adds 1 to all
    code = _Code({0: {j: 1.0 for j in range(5)}} | {j + 1: {j: 1.0} for j in range(5)})
    reported = {0: [11.0, 21.0, 31.0, 41.0, 51.0]} | {j + 1: [10.0 * (j + 1)] for j in range(5)}
    agreed, excluded, _ = _agree(code, reported)
    assert agreed == {j: 10.0 * (j + 1) for j in range(5)}
    assert excluded == {0: (
        "partition-sizes: worker 0 disagrees with another replica in each of partitions "
        "[0, 1, 2, 3, 4] (no other worker disagrees in as many); partition 0: workers [0] "
        "report 11; workers [1] report 10; partition 1: workers [0] report 21; workers [2] "
        "report 20; partition 2: workers [0] report 31; workers [3] report 30; partition 3: "
        "workers [0] report 41; workers [4] report 40")}


@pytest.mark.skipif(np.finfo(np.longdouble).minexp >= -1022, reason="no long double range")
def test_decoding_weights_are_read_as_float64_so_an_underflowing_weight_needs_no_size():
    # 1e-4000 is 0 in float64, the precision the decoded average is computed in
    decoding = SimpleNamespace(alpha=np.array([np.longdouble(2), np.longdouble("1e-4000")]))
    assert decoding.alpha[1] != 0 and np.float64(decoding.alpha[1]) == 0.0
    assert central_noise_scale(decoding, {0: 10.0}, 4.0) == 2.0 * 10.0 / 4.0
