"""code_for_cohort's fallback is a string whose parts (reason, code built, s, n) are the code
it returned: a caller can reword it without parsing it."""

from __future__ import annotations

import pickle

import pytest

from fl_gradcode.codes import available_codes, make_code
from fl_gradcode.codes.cohort import Fallback, code_for_cohort

SPECS = ["frc", "crc", "grouped-rs", "comm-efficient", "bgc", "nested"]


@pytest.mark.parametrize("spec", SPECS)
def test_every_fallback_names_the_code_it_returned(spec):
    assert spec in available_codes()
    seen = 0
    for n in range(1, 10):
        for s in range(0, n + 2):
            options = {"m": 2} if spec == "comm-efficient" else {}
            code, why = code_for_cohort(spec, n, s, 0, options)
            assert code.n == n and code.k == n
            if why is None:
                assert (code.name, code.s) == (spec, s)
                continue
            seen += 1
            assert isinstance(why, str) and isinstance(why, Fallback)
            assert why.code.split()[0] == code.name, (spec, n, s, str(why))
            assert (why.s, why.n) == (code.s, n)
            assert str(why) == f"{why.reason}; using {why.code} with s={why.s} for cohorts of {n}"
            assert why.reason and "; using " not in why.reason
    assert seen > 0  # every spec here falls back somewhere in this range


def test_a_fallback_for_a_code_object_of_another_size_carries_its_parts():
    code, why = code_for_cohort(make_code("frc", n=6, s=1), 5, 1, 0, {})
    assert (why.reason, why.code, why.s, why.n) == (
        "the code was built for n=6 clients but the cohort has 5", "grouped-rs", 1, 5)
    assert (code.name, code.s, code.n) == ("grouped-rs", 1, 5)


def test_a_fallback_survives_pickling_with_its_parts():
    _, why = code_for_cohort("frc", 20, 2, 0, {})
    back = pickle.loads(pickle.dumps(why))
    assert back == why and (back.reason, back.code, back.s, back.n) == (
        why.reason, why.code, why.s, why.n)
