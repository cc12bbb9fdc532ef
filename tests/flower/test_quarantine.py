"""Quarantine of repeat offenders: offences within a window, doubling quarantines."""

from __future__ import annotations

import logging

import pytest

from fl_gradcode.flower.quarantine import Quarantine


# ======== edges: exact values, bounds and messages ===============================================
def test_defaults_two_offences_in_ten_rounds_give_five_rounds():
    q = Quarantine()
    assert (q.offences, q.window, q.rounds) == (2, 10, 5)
    assert q.offend(1, [3], "x") == []
    assert q.offend(10, [3], "x") == [3]  # round 1 is within the 10 rounds 1..10
    assert q.held(15, [3]) == {3} and q.held(16, [3]) == set()


@pytest.mark.parametrize("name", ["offences", "window", "rounds"])
@pytest.mark.parametrize("bad", [0, -1, True, 2.0, "2", None])
def test_each_setting_must_be_an_integer_of_at_least_one(name, bad):
    with pytest.raises(ValueError) as info:
        Quarantine(**{name: bad})
    assert str(info.value) == f"quarantine {name}={bad!r} must be an integer >= 1"


def test_one_is_a_valid_setting():
    q = Quarantine(offences=1, window=1, rounds=1)
    assert q.offend(4, [2], "x") == [2]
    assert q.held(5, [1, 2]) == {2} and q.held(6, [2]) == set()


def test_a_node_offends_at_most_once_per_round():
    q = Quarantine()  # two offences within ten rounds
    assert q.offend(3, [7], "x") == [] and q.offend(3, [7], "again") == []
    assert q.held(4, [7]) == set()
    assert q.offend(4, [7], "x") == [7]


def test_offences_count_only_within_the_window(flwr_log):
    q = Quarantine(offences=2, window=3, rounds=2)
    assert q.offend(10, [7], "x") == []
    assert q.offend(13, [7], "x") == []  # round 10 is 3 rounds back: outside rounds 11..13
    assert q.held(14, [7]) == set()
    assert q.offend(15, [7], "x") == [7]  # rounds 13 and 15
    assert q.held(16, [7]) == {7} and q.held(17, [7]) == {7} and q.held(18, [7]) == set()
    assert flwr_log == [(logging.WARNING, "round 15: node 7 quarantined for rounds 16-17 "
                                          "(2 offences in 3 rounds: x); it is sent no work")]


def test_each_further_quarantine_is_twice_as_long_and_offences_start_afresh(flwr_log):
    q = Quarantine(offences=2, window=100, rounds=3)
    assert q.offend(1, [4], "a") == []
    assert q.offend(2, [4], "a") == [4]  # rounds 3-5
    assert q.held(5, [4]) == {4} and q.held(6, [4]) == set()
    assert q.offend(6, [4], "b") == []  # the offences before the quarantine no longer count
    assert q.offend(7, [4], "b") == [4]  # second quarantine: 6 rounds, 8-13
    assert q.held(13, [4]) == {4} and q.held(14, [4]) == set()
    q.offend(20, [4], "c")
    assert q.offend(21, [4], "c") == [4]  # third: 12 rounds, 22-33
    assert q.held(33, [4]) == {4} and q.held(34, [4]) == set()
    assert [text for _, text in flwr_log] == [
        "round 2: node 4 quarantined for rounds 3-5 (2 offences in 100 rounds: a); it is sent "
        "no work",
        "round 7: node 4 quarantined for rounds 8-13 (2 offences in 100 rounds: b); it is sent "
        "no work",
        "round 21: node 4 quarantined for rounds 22-33 (2 offences in 100 rounds: c); it is "
        "sent no work",
    ]


def test_a_node_named_twice_in_a_round_offends_once_and_nodes_are_kept_apart():
    q = Quarantine(offences=2, window=5, rounds=1)
    assert q.offend(1, [9, 9, 2], "x") == []
    assert q.offend(2, [9, 2, 5], "x") == [2, 9]  # sorted node ids
    assert q.held(3, [2, 5, 9, 11]) == {2, 9}
    assert q.offend(3, [5], "x") == [5]  # node 5's offences: rounds 2 and 3, its own count
    assert q.held(4, [2, 5, 9]) == {5}


def test_a_node_that_never_offended_is_never_held_from_round_1():
    q = Quarantine(offences=1, window=1, rounds=1)
    assert q.held(1, [0, 1, 2]) == set()
    q.offend(1, [1], "x")
    assert q.held(2, [0, 1, 2]) == {1}
