"""A code option no cohort size could take is refused by name (make_code, and the strategy
when it is built), never a reason for another code; one some cohort sizes take is not."""

from __future__ import annotations

import inspect
import math

import pytest
from flwr.serverapp.strategy import FedAvg

from fl_gradcode import codes
from fl_gradcode.codes import CODE_OPTIONS, CodeOptionError, available_codes, make_code
from fl_gradcode.codes.nested import nested_code
from fl_gradcode.flower import GradientCoding
from fl_gradcode.flower.membership import code_for_cohort

BAD = [
    ("grouped-rs", 1, {"max_amplification": 0.5}, "max_amplification=0.5 must be a number >= 1"),
    ("grouped-rs", 1, {"max_amplification": math.nan}, "max_amplification=nan must be"),
    ("grouped-rs", 1, {"max_relative_amplification": 0.5},
     "max_relative_amplification=0.5 must be a number >= 1 or None"),
    ("grouped-rs", 1, {"max_load_overhead": 0.9}, "max_load_overhead=0.9 must be a number"),
    ("crc", 1, {"draws": 0}, "draws=0 must be an integer >= 1"),
    ("comm-efficient", 1, {"draws": -1}, "draws=-1 must be an integer >= 1"),
    ("bgc", 1, {"load": 0}, "load=0 must be an integer >= 1 or None"),
    ("expander", 1, {"load": 2.5}, "load=2.5 must be an integer"),
    ("bgc", 1, {"load": "3"}, "load='3' must be an integer"),
    ("comm-efficient", 1, {"dim": 0}, "dim=0 must be an integer >= 1 or None"),
    ("comm-efficient", 1, {"own_partitions": "yes"}, "own_partitions='yes' must be True or"),
    ("nested", 2, {"s_max": 1}, "s_max=1 must be >= s=2"),
    ("nested", 0, {"s_max": -1}, "s_max=-1 must be an integer >= 0"),
    ("nested", 1, {"s_max": 1.5}, "s_max=1.5 must be an integer"),
    ("nested", 1, {"layout": "bogus"}, "layout='bogus'; expected one of"),
    ("nested", 1, {"max_amplification": 0.5}, "max_amplification=0.5 must be a number >= 1"),
    ("frc", 1, {"weights": [1.0, 0.0, 1.0, 1.0]}, r"weights\[1\]=0.0 must be positive"),
    ("uncoded", 0, {"weights": [1.0, math.inf]}, r"weights\[1\]=inf must be positive"),
    ("ignore-stragglers", 1, {"rescale": "no"}, "rescale='no' must be True or False"),
    ("frc", 1, {"load": 2}, "invalid option for code 'frc': load=2"),
]


@pytest.mark.parametrize(("name", "s", "options", "match"), BAD)
def test_make_code_refuses_an_option_no_cohort_takes_naming_it(name, s, options, match):
    for n in (4, 6, 12):  # whatever the cohort
        with pytest.raises(CodeOptionError, match=match):
            make_code(name, n=n, s=s, **options)


@pytest.mark.parametrize(("name", "s", "options", "match"), BAD)
def test_the_strategy_refuses_it_when_built_and_no_round_falls_back(name, s, options, match):
    # the strategy refuses any partition weights (they would change its average)
    strategy_match = r"code_options\['weights'\]" if "weights" in options else match
    with pytest.raises(ValueError, match=strategy_match):
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
    if "weights" not in options:  # the strategy refuses weights (a policy's own may hold)
        GradientCoding(FedAvg(), code=name, s=s, code_options=options)  # not refused
    code, why = code_for_cohort(name, n_good, s, 0, dict(options))
    assert (code.name, why) == (name, None)
    code, why = code_for_cohort(name, n_bad, s, 0, dict(options))
    assert why is not None and f"cannot take a cohort of {n_bad}" in why


def _keyword_options(factory) -> set[str]:
    """The keyword-only options of a code's constructor (the seed is the registry's)."""
    return {p.name for p in inspect.signature(factory).parameters.values()
            if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name != "seed"}


def test_each_codes_options_are_its_constructors_keywords():
    constructors = {
        "uncoded": codes.UncodedCode, "ignore-stragglers": codes.IgnoreStragglers,
        "frc": codes.FractionalRepetitionCode, "crc": codes.CyclicRepetitionCode,
        "grouped-rs": codes.GroupedReedSolomonCode, "bgc": codes.BernoulliCode,
        "expander": codes.ExpanderCode, "comm-efficient": codes.CommunicationEfficientCode,
        "nested": nested_code}
    assert set(constructors) == set(available_codes()) == set(CODE_OPTIONS)
    for name, factory in constructors.items():
        assert set(CODE_OPTIONS[name]) == _keyword_options(factory), name


@pytest.mark.parametrize(("name", "s", "options"), [
    ("bgc", 1, {"load": None}), ("expander", 1, {"load": None}),
    ("nested", 1, {"s_max": None}), ("nested", 2, {"s_max": 2}),
    ("nested", 1, {"max_amplification": 1.0}), ("nested", 1, {"max_amplification": math.inf}),
    ("nested", 1, {"layout": "window"}),
    ("crc", 1, {"draws": 1}), ("comm-efficient", 1, {"draws": 1, "dim": None}),
    ("grouped-rs", 1, {"max_amplification": math.inf, "max_relative_amplification": None,
                       "max_load_overhead": 1.0}),
    ("ignore-stragglers", 1, {"rescale": 1}), ("comm-efficient", 1, {"own_partitions": True}),
    ("frc", 1, {"weights": (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12)}),
])
def test_the_edges_of_each_rule_are_accepted(name, s, options):
    make_code(name, n=12, s=s, **options)
    if "weights" not in options:  # the strategy refuses weights: they change its average
        GradientCoding(FedAvg(), code=name, s=s, code_options=options)


def test_code_options_with_auto_are_refused_as_they_would_not_reach_its_placement():
    with pytest.raises(ValueError, match=r"s='auto'.*nested placement"):
        GradientCoding(FedAvg(), code="nested", s="auto", s_max=3,
                       code_options={"layout": "window"})
    GradientCoding(FedAvg(), code="nested", s="auto", s_max=3)


@pytest.mark.parametrize("code", ["bgc", "expander", "comm-efficient", "uncoded",
                                  "ignore-stragglers"])
def test_auto_refuses_a_code_name_it_would_not_run(code):
    with pytest.raises(ValueError, match=rf"code='{code}' with s='auto'.*give a fixed s"):
        GradientCoding(FedAvg(), code=code, s="auto")
    GradientCoding(FedAvg(), code=code, s=1)  # the same name with a fixed s runs it


def test_auto_takes_an_exact_code_name():
    for code in ("nested", "grouped-rs", "frc", "crc"):
        assert GradientCoding(FedAvg(), code=code, s="auto").options.code.adaptive


def test_auto_refuses_a_code_object_it_would_not_run():
    with pytest.raises(ValueError, match=r"FractionalRepetitionCode object would not run"):
        GradientCoding(FedAvg(), code=make_code("frc", n=6, s=2), s="auto")


@pytest.mark.parametrize("code", ["grouped-rs", "nested"])
def test_auto_refuses_a_reply_length_it_would_not_use(code):
    with pytest.raises(ValueError, match=r"m=2 with s='auto'.*whole models"):
        GradientCoding(FedAvg(), code=code, s="auto", m=2)
    GradientCoding(FedAvg(), code=code, s="auto", m=1)  # whole replies: what it sends


def test_m_is_refused_with_a_code_that_has_no_reply_length():
    with pytest.raises(ValueError, match="invalid option for code 'grouped-rs': m=2"):
        GradientCoding(FedAvg(), code="grouped-rs", s=1, m=2)


@pytest.mark.parametrize("name", ["frc", "grouped-rs", "crc", "comm-efficient"])
def test_partition_weights_are_refused_by_the_strategy_not_folded_into_the_average(name):
    """GradientCoding decodes sum_j n_j theta_j / sum_j n_j and counts the examples itself:
    weights w_j (code_options or a code object built with them) would change that average
    while rounds say exact, so both are refused naming the weights. Unit weights pass."""
    options = {"m": 1} if name == "comm-efficient" else {}
    with pytest.raises(ValueError, match=r"code_options\['weights'\]"):
        GradientCoding(FedAvg(), code=name, s=1,
                       code_options={"weights": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0], **options})
    weighted = make_code(name, 6, 1, weights=[10.0, 11.0, 12.0, 13.0, 14.0, 15.0],
                         **({"own_partitions": True} if name == "comm-efficient" else {}),
                         **options)
    with pytest.raises(ValueError, match=r"partition weights \[10\.0, 11\.0"):
        GradientCoding(FedAvg(), code=weighted)
    plain = make_code(name, 6, 1, weights=[1.0] * 6,
                      **({"own_partitions": True} if name == "comm-efficient" else {}),
                      **options)
    assert GradientCoding(FedAvg(), code=plain).options.code.code is plain


@pytest.mark.parametrize("s", ["auto", 1])
def test_an_unknown_code_name_is_refused_when_built_naming_the_near_one(s):
    """A typo ('grouped_rs') is refused by GradientCoding itself, with the registry's names and
    the close one, whether s is fixed or 'auto' (not at the first round, nor as a real code)."""
    with pytest.raises(ValueError, match=r"unknown code 'grouped_rs'.*'grouped-rs'"):
        GradientCoding(FedAvg(), code="grouped_rs", s=s)


@pytest.mark.parametrize("bad", ["pareto", 2.0, {"name": "pareto"}])
def test_a_latency_that_is_not_a_model_is_refused_when_built(bad):
    """``latency='pareto'`` (the run-config key's value) is not a latency model: refused when
    the strategy is built, naming the value and how to build one, not an AttributeError in
    round 1."""
    with pytest.raises(TypeError, match=r"latency=.*not a latency model.*make_latency"):
        GradientCoding(FedAvg(), code="frc", s=1, latency=bad)
