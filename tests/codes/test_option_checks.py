"""A code option no cohort size could take is refused by name (make_code, and the strategy
when it is built), never a reason for another code; one some cohort sizes take is not."""

from __future__ import annotations

import math

import pytest
from flwr.serverapp.strategy import FedAvg

from fl_gradcode.codes import CODE_OPTIONS, CodeOptionError, available_codes, make_code
from fl_gradcode.flower import GradientCoding
from fl_gradcode.flower.membership import code_for_cohort

BAD = [
    ("grouped-rs", 1, {"max_amplification": 0.5}, "max_amplification=0.5"),
    ("grouped-rs", 1, {"max_amplification": math.nan}, "max_amplification=nan"),
    ("grouped-rs", 1, {"max_relative_amplification": 0.5}, "max_relative_amplification=0.5"),
    ("grouped-rs", 1, {"max_load_overhead": 0.9}, "max_load_overhead=0.9"),
    ("crc", 1, {"draws": 0}, "draws=0"),
    ("bgc", 1, {"load": 0}, "load=0"),
    ("expander", 1, {"load": 2.5}, "load=2.5"),
    ("bgc", 1, {"load": "3"}, "load='3'"),
    ("comm-efficient", 1, {"dim": 0}, "dim=0"),
    ("comm-efficient", 1, {"own_partitions": "yes"}, "own_partitions='yes'"),
    ("nested", 2, {"s_max": 1}, "s_max=1 must be >= s=2"),
    ("nested", 0, {"s_max": -1}, "s_max=-1"),
    ("nested", 1, {"s_max": 1.5}, "s_max=1.5"),
    ("nested", 1, {"layout": "bogus"}, "layout='bogus'"),
    ("nested", 1, {"max_amplification": 0.5}, "max_amplification=0.5"),
    ("frc", 1, {"weights": [1.0, 0.0, 1.0, 1.0]}, r"weights\[1\]=0.0"),
    ("uncoded", 0, {"weights": [1.0, math.inf]}, r"weights\[1\]=inf"),
    ("ignore-stragglers", 1, {"rescale": "no"}, "rescale='no'"),
    ("frc", 1, {"load": 2}, "invalid option for code 'frc': load=2"),
]


@pytest.mark.parametrize(("name", "s", "options", "match"), BAD)
def test_make_code_refuses_an_option_no_cohort_takes_naming_it(name, s, options, match):
    for n in (4, 6, 12):  # whatever the cohort
        with pytest.raises(CodeOptionError, match=match):
            make_code(name, n=n, s=s, **options)


@pytest.mark.parametrize(("name", "s", "options", "match"), BAD)
def test_the_strategy_refuses_it_when_built_and_no_round_falls_back(name, s, options, match):
    with pytest.raises(ValueError, match=match):
        GradientCoding(FedAvg(), code=name, s=s, code_options=options)
    # a round given it anyway (a policy's own options) refuses it too: no fallback code
    with pytest.raises(CodeOptionError, match=match):
        code_for_cohort(name, 12, s, 0, dict(options))


def test_the_nested_keyword_s_max_is_refused_below_a_fixed_s():
    with pytest.raises(ValueError, match="s_max=1 must be >= s=2"):
        GradientCoding(FedAvg(), code="nested", s=2, s_max=1)


@pytest.mark.parametrize(("name", "s", "options", "n_bad", "n_good"), [
    ("bgc", 1, {"load": 15}, 10, 25),  # load <= n
    ("nested", 1, {"s_max": 20}, 12, 25),  # s_max < n
    ("frc", 1, {"weights": [1.0] * 6}, 4, 6),  # one weight per partition
])
def test_an_option_some_cohorts_take_is_accepted_and_falls_back_only_where_it_must(
        name, s, options, n_bad, n_good):
    GradientCoding(FedAvg(), code=name, s=s, code_options=options)  # not refused
    code, why = code_for_cohort(name, n_good, s, 0, dict(options))
    assert (code.name, why) == (name, None)
    code, why = code_for_cohort(name, n_bad, s, 0, dict(options))
    assert why is not None and f"cannot take a cohort of {n_bad}" in why


def test_every_code_builds_with_each_option_it_takes_at_a_good_value():
    good = {"weights": None, "rescale": True, "draws": 2, "max_amplification": 1e6,
            "max_relative_amplification": None, "max_load_overhead": 2.0, "load": 3,
            "m": 2, "dim": None, "own_partitions": True, "s_max": 2, "layout": "window"}
    assert set(CODE_OPTIONS) == set(available_codes())
    for name, takes in CODE_OPTIONS.items():
        for key in takes:
            make_code(name, n=12, s=1, **{key: good[key]})


def test_m_is_refused_with_a_code_that_has_no_reply_length():
    with pytest.raises(ValueError, match="invalid option for code 'grouped-rs': m=2"):
        GradientCoding(FedAvg(), code="grouped-rs", s=1, m=2)
