"""The experiments' JSON writer: indented, every array of numbers on one line, and read back
as the same value."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from experiments.common import dumps

_numbers = st.one_of(st.none(), st.integers(-10**12, 10**12),
                     st.floats(allow_nan=False, allow_infinity=False))
_values = st.recursive(
    st.one_of(_numbers, st.text(max_size=5), st.booleans()),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=4), inner, max_size=4)),
    max_leaves=30)


@given(_values)
def test_dumps_reads_back_as_the_same_value(value):
    assert json.loads(dumps(value)) == value


@given(st.lists(_numbers, min_size=1, max_size=12))
def test_an_array_of_numbers_is_one_line(numbers):
    text = dumps({"curve": numbers})
    assert len(text.splitlines()) == 3
    assert json.loads(text) == {"curve": numbers}


def test_strings_that_look_like_numbers_are_not_touched():
    value = {"a": ["1", "2"], "b": ["[1, 2]"], "c": [[1, 2], "x"]}
    assert json.loads(dumps(value)) == value


def test_a_string_holding_an_array_keeps_its_spacing():
    value = {"note": "[1,   2]", "other": ["[3,\n 4]"]}
    assert json.loads(dumps(value)) == value
