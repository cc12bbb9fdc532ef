"""GradientCoding's option groups: each rule, frozen-ness, bad values named in the errors."""

from __future__ import annotations

import dataclasses
import logging

import pytest
from flwr.serverapp.strategy import FedAvg

from fl_gradcode.flower import GradientCoding
from fl_gradcode.flower.options import (
    AdaptiveOptions,
    CodeOptions,
    DeadlineOptions,
    IntegrityOptions,
    Options,
    PrivacyOptions,
    TimingOptions,
    WireOptions,
)


def test_defaults_match_gradient_coding_keywords():
    options = Options.from_keywords()
    assert options.code == CodeOptions("grouped-rs", 1, False, {})
    assert options.timing == TimingOptions()
    assert options.deadline == DeadlineOptions()
    assert options.integrity == IntegrityOptions()
    assert options.wire == WireOptions()
    assert options.adaptive == AdaptiveOptions()
    assert options.seed == 0 and not options.estimating
    assert options.privacy.dp.mode == PrivacyOptions().dp.mode
    assert len(options.privacy.nonce) == 32  # fresh per run


@pytest.mark.parametrize("group", [CodeOptions(), AdaptiveOptions(), TimingOptions(),
                                   DeadlineOptions(), IntegrityOptions(), WireOptions()])
def test_every_group_is_frozen(group):
    name = dataclasses.fields(group)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(group, name, None)


def test_options_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Options.from_keywords().seed = 3


@pytest.mark.parametrize(("keywords", "match"), [
    ({"code": 3}, r"code must be a registry name"),
    ({"s": -1}, r"s=-1 must be an integer >= 0 or 'auto'"),
    ({"s": True}, r"s=True must be"),
    ({"s": "auto", "s_max": 0}, r"s_max=0 must be an integer >= 1"),
    ({"s": "auto", "auto_margin": -0.1}, r"auto_margin=-0.1 must be a number >= 0"),
    ({"s": "auto", "exclude_slow": 1.0}, r"exclude_slow=1.0 must be a slowness factor > 1"),
    ({"exclude_slow": 2.0}, r"exclude_slow=2.0 needs s='auto'"),
    ({"auto_deadline": 2.0}, r"auto_deadline=2.0 needs s='auto' or busy='fit'"),
    ({"s": "auto", "auto_deadline": 0.5}, r"auto_deadline=0.5 must be a factor >= 1"),
    ({"s": "auto", "auto_deadline": 2.0, "timing": "wallclock"},
     r"auto_deadline=2.0 needs timing='virtual'"),
    ({"max_decode_error": -1}, r"max_decode_error=-1 must be >= 0"),
    ({"min_replies": 0}, r"min_replies=0 must be an integer >= 1 or None"),
    ({"round_timeout": 0}, r"round_timeout=0 must be > 0 seconds"),
    ({"warmup_timeout": -1}, r"warmup_timeout=-1 must be > 0 seconds"),
    ({"straggler_timeout": 0}, r"straggler_timeout=0 must be > 0 seconds"),
    ({"wire": "float16"}, r"wire='float16'; expected 'auto', 'model' or 'float64'"),
    ({"compute_cost_s": -1.0}, r"compute_cost_s=-1.0 must be a finite number >= 0"),
    ({"stop_late_work": 1}, r"stop_late_work=1 must be True or False"),
    ({"busy": "later"}, r"busy='later'; expected 'skip', 'queue', 'fit' or None"),
    ({"timing": "sundial"}, r"timing='sundial'; expected one of"),
    ({"upload_bandwidth": 0}, r"upload_bandwidth=0 must be a positive number"),
    ({"upload_bandwidth": float("inf")}, r"upload_bandwidth=inf must be a positive number"),
    ({"verify": True, "s": 0}, r"verify"),
    # comm-efficient's reply length: refused, not a fallback code every round
    ({"code": "comm-efficient", "m": 0}, r"m=0 must be an integer >= 1"),
    ({"code": "comm-efficient", "m": -2}, r"m=-2 must be an integer >= 1"),
    ({"code": "comm-efficient", "m": 1.5}, r"m=1.5 must be an integer >= 1"),
    ({"code": "comm-efficient", "m": "2"}, r"m='2' must be an integer >= 1"),
    ({"code": "comm-efficient", "m": True}, r"m=True must be an integer >= 1"),
    ({"code": "comm-efficient", "code_options": {"m": 0}}, r"m=0 must be an integer >= 1"),
])
def test_each_bad_value_is_named_in_its_error(keywords, match):
    error = TypeError if keywords.get("code") == 3 else ValueError
    with pytest.raises(error, match=match):
        Options.from_keywords(**keywords)
    with pytest.raises(error, match=match):  # the same error through the strategy
        GradientCoding(FedAvg(), **keywords)


def test_busy_resolves_from_s_and_timing():
    assert Options.from_keywords(s="auto").timing.busy == "queue"
    assert Options.from_keywords().timing.busy == "skip"
    assert Options.from_keywords(busy="fit").timing.busy == "fit"
    # wallclock rounds always skip busy members (the grid waits for their earlier replies)
    wall = Options.from_keywords(s="auto", timing="wallclock")
    assert wall.timing.busy == "skip"
    wall = Options.from_keywords(s=1, timing="wallclock")
    assert wall.timing.busy == "skip" and not wall.estimating
    assert Options.from_keywords(busy="fit").estimating


def test_a_timing_group_that_queues_under_wallclock_is_refused():
    with pytest.raises(ValueError, match=r"busy='queue' with timing='wallclock'"):
        TimingOptions(mode="wallclock", busy="queue")


def test_auto_deadline_implies_stop_late_work():
    options = Options.from_keywords(s="auto", auto_deadline=1.5)
    assert options.timing.stop_late_work and options.deadline.auto_deadline == 1.5
    # s="auto" with queued work stops late work by default ("auto"); a fixed code does not
    assert Options.from_keywords(s="auto").timing.stop_late_work
    assert not Options.from_keywords(s=1).timing.stop_late_work


def test_auto_reports_s_max_as_its_s():
    assert Options.from_keywords(s="auto", s_max=3).code.s == 3
    assert Options.from_keywords(s="auto").code.s == 1
    assert Options.from_keywords(s="auto").code.adaptive


def test_nested_s_max_and_m_enter_the_code_options():
    nested = Options.from_keywords(code="nested", s=1, s_max=3)
    assert nested.code_options == {"s_max": 3}
    assert Options.from_keywords(code="comm-efficient", m=2).code_options == {"m": 2}
    # the auto placement takes s_max itself, not as a code option
    assert Options.from_keywords(code="nested", s="auto", s_max=3).code_options == {}
    # agreeing values are accepted
    assert Options.from_keywords(code="comm-efficient", m=2,
                                 code_options={"m": 2}).code_options == {"m": 2}


@pytest.mark.parametrize(("keywords", "name"), [
    ({"code": "nested", "s": 1, "s_max": 3, "code_options": {"s_max": 2}}, "s_max"),
    ({"code": "comm-efficient", "m": 2, "code_options": {"m": 4}}, "m"),
])
def test_a_code_option_that_contradicts_its_keyword_is_refused(keywords, name):
    with pytest.raises(ValueError, match=rf"code_options\['{name}'\]=.* contradicts {name}="):
        Options.from_keywords(**keywords)


def test_code_options_are_copied():
    user = {"rescale": False}
    options = Options.from_keywords(code="ignore-stragglers", code_options=user)
    user["rescale"] = True
    assert options.code_options == {"rescale": False}
    copy = options.code_options
    copy["rescale"] = True
    assert options.code_options == {"rescale": False}


def test_latency_state_without_the_estimator_warns(caplog, tmp_path):
    with caplog.at_level(logging.WARNING, logger="flwr"):
        Options.from_keywords(latency_state=tmp_path / "x.json")
    assert any("latency_state=" in r.getMessage() for r in caplog.records)


def test_values_are_normalised():
    options = Options.from_keywords(s="auto", auto_margin=0, exclude_slow=2, seed="3" and 3,
                                    straggler_timeout=5, upload_bandwidth=10,
                                    verify_tolerance=1)
    values = {"auto_margin": (options.adaptive.auto_margin, 0.0),
              "exclude_slow": (options.adaptive.exclude_slow, 2.0),
              "straggler_timeout": (options.deadline.straggler_timeout, 5.0),
              "upload_bandwidth": (options.timing.upload_bandwidth, 10.0),
              "verify_tolerance": (options.integrity.verify_tolerance, 1.0)}
    for name, (value, given) in values.items():  # floats, and the values given
        assert isinstance(value, float) and value == given, (name, value)


def test_flat_names_read_through_the_strategy():
    strategy = GradientCoding(FedAvg(), s="auto", s_max=2, timing="virtual", auto_deadline=2.0)
    assert strategy.timing == "virtual" and strategy.busy_mode == "queue"
    assert strategy.s == 2 and strategy.s_max == 2 and strategy.stop_late_work
    assert strategy.straggler_timeout == 10.0 and strategy.auto_deadline == 2.0
    assert strategy.options.get("seed") == 0
    with pytest.raises(AttributeError):
        strategy.no_such_option  # noqa: B018
    with pytest.raises(AttributeError):
        strategy.options.get("no_such_option")


def test_a_pinned_nonce_is_kept():
    assert Options.from_keywords(dp_run_nonce="abc").privacy.nonce == "abc"


def test_config_json_names_every_option_that_shapes_the_rounds():
    auto = Options.from_keywords(s="auto", s_max=2, seed=7, auto_deadline=1.5,
                                 straggler_timeout=4, max_decode_error=0.25)
    assert auto.describe("FedAvg", {"num-server-rounds": 3}) == {
        "num-server-rounds": 3, "strategy": "FedAvg", "code": "nested (adaptive)", "s": "auto",
        "s_max": 2, "exclude_slow": None, "timing": "virtual", "latency": "None", "seed": 7,
        "straggler_timeout": 4.0, "stop_late_work": True, "auto_deadline": 1.5,
        "max_decode_error": 0.25, "dp": "none", "busy": "queue",
    }
    fixed = Options.from_keywords(code="frc", s=2, timing="wallclock").describe("FedProx", None)
    assert fixed["code"] == "frc" and fixed["s"] == 2 and fixed["strategy"] == "FedProx"
    assert fixed["timing"] == "wallclock" and fixed["busy"] == "skip"


@pytest.mark.parametrize(("build", "message"), [
    (lambda: AdaptiveOptions(enabled=True, auto_margin=float("inf")),
     "auto_margin=inf must be a number >= 0"),
    (lambda: AdaptiveOptions(enabled=True, exclude_slow=0.5),
     "exclude_slow=0.5 must be a slowness factor > 1 (or None: never exclude)"),
    (lambda: DeadlineOptions(auto_deadline=0.5),
     "auto_deadline=0.5 must be a factor >= 1 of the predicted round time "
     "(or None: the straggler_timeout only)"),
    (lambda: TimingOptions(busy="later"), "busy='later'; expected 'skip', 'queue', 'fit' or None"),
    (lambda: TimingOptions(mode="wallclock", busy="fit"),
     "busy='fit' with timing='wallclock': wallclock rounds always skip busy members"),
    (lambda: TimingOptions(upload_bandwidth=-1.0),
     "upload_bandwidth=-1.0 must be a positive number of bytes per second, or None "
     "(transfers take no time)"),
])
def test_a_group_names_its_bad_value_in_full(build, message):
    with pytest.raises(ValueError) as error:
        build()
    assert str(error.value) == message


@pytest.mark.parametrize("value", [0, None])
def test_a_stop_late_work_that_is_not_a_bool_is_refused_even_without_auto_deadline(value):
    with pytest.raises(ValueError, match=rf"stop_late_work={value!r} must be True or False"):
        Options.from_keywords(stop_late_work=value)


def test_auto_deadline_between_1_and_2_is_refused_under_wallclock():
    with pytest.raises(ValueError, match=r"auto_deadline=1.5 needs timing='virtual'"):
        Options.from_keywords(s="auto", auto_deadline=1.5, timing="wallclock")


def test_every_keyword_reaches_its_group():
    from fl_gradcode.latency import Pareto
    from fl_gradcode.privacy import DPConfig, PrivacyAccountant

    latency = Pareto(1.0, 1.5)
    accountant = PrivacyAccountant(DPConfig(mode="central"), [(1.0, 1.0, 1)])
    options = Options.from_keywords(latency=latency, accountant=accountant,
                                    dp=DPConfig(mode="central"),
                                    sparse_decoding=False, measured_compute=False)
    assert options.timing.latency is latency
    assert options.privacy.accountant is accountant
    assert options.wire.sparse_decoding is False
    assert options.timing.measured_compute is False
    assert Options.from_keywords().timing.measured_compute is True
    assert TimingOptions(measured_compute=0).measured_compute is False


# ======== edges: exact values, bounds and messages ===============================================
def test_the_smallest_valid_values_are_accepted_and_values_are_normalised(tmp_path):
    assert AdaptiveOptions(enabled=True, s_max=1).s_max == 1
    assert DeadlineOptions(min_replies=1).min_replies == 1
    state = AdaptiveOptions(enabled=True, latency_state=tmp_path / "lat.json").latency_state
    assert state == str(tmp_path / "lat.json") and type(state) is str
    assert IntegrityOptions(verify=1).verify is True


@pytest.mark.parametrize(("keywords", "match"), [
    ({"verify": "false"}, r"verify='false' must be True or False"),
    ({"measured_compute": "no"}, r"measured_compute='no' must be True or False"),
    ({"sparse_decoding": "false"}, r"sparse_decoding='false' must be True or False"),
    ({"verify": 2}, r"verify=2 must be True or False"),
    ({"verify_tolerance": float("nan")}, r"verify_tolerance=nan must be a finite number >= 0"),
    ({"verify_tolerance": -1.0}, r"verify_tolerance=-1.0 must be a finite number >= 0"),
    ({"verify_tolerance": "0.1"}, r"verify_tolerance='0.1' must be a finite number >= 0"),
    ({"min_replies": float("nan")}, r"min_replies=nan must be an integer >= 1 or None"),
    ({"min_replies": 2.5}, r"min_replies=2.5 must be an integer >= 1 or None"),
    ({"min_replies": "3"}, r"min_replies='3' must be an integer >= 1 or None"),
    ({"compute_cost_s": float("nan")}, r"compute_cost_s=nan must be a finite number >= 0"),
    ({"compute_cost_s": float("inf")}, r"compute_cost_s=inf must be a finite number >= 0"),
    ({"seed": 1.7}, r"seed=1.7 must be an integer"),
    ({"seed": "3"}, r"seed='3' must be an integer"),
])
def test_a_value_of_the_wrong_kind_is_refused_not_coerced(keywords, match):
    """``bool("false")`` is True and ``int(1.7)`` is 1: such values used to be coerced into
    another setting than the one written (verification on, a different seed)."""
    with pytest.raises(ValueError, match=match):
        Options.from_keywords(**keywords)
    with pytest.raises(ValueError, match=match):
        GradientCoding(FedAvg(), **keywords)


def test_integers_that_are_flags_or_whole_numbers_are_still_accepted():
    import numpy as np

    assert Options.from_keywords(seed=np.int64(4)).seed == 4
    assert type(Options.from_keywords(seed=np.int64(4)).seed) is int
    assert DeadlineOptions(min_replies=np.int64(2)).min_replies == 2
    assert WireOptions(sparse_decoding=np.bool_(False)).sparse_decoding is False
    assert IntegrityOptions(verify_tolerance=0).verify_tolerance == 0.0


def test_an_accountant_without_dp_is_refused_as_its_epsilon_would_be_false():
    """No noise is added with dp mode none, so an accountant would report an epsilon that
    holds nothing (and could stop training at a budget nothing spent)."""
    from flwr.serverapp.strategy import FedAvg

    from fl_gradcode.flower import GradientCoding
    from fl_gradcode.privacy import DPConfig, PrivacyAccountant

    accountant = PrivacyAccountant(DPConfig(mode="central"), [(1.0, 1.0, 1)])
    with pytest.raises(ValueError, match=r"with dp=DPConfig\(mode='none'.*epsilon would be "
                                         r"false"):
        GradientCoding(FedAvg(), accountant=accountant)
    strategy = GradientCoding(FedAvg())
    with pytest.raises(ValueError, match=r"with dp=DPConfig\(mode='none'"):
        strategy.accountant = accountant  # assigned later: the same rule
    assert strategy.accountant is None
    GradientCoding(FedAvg(), accountant=accountant, dp=DPConfig(mode="central"))
    # an accountant counting another noise than the run adds: its epsilon would be false too
    quieter = DPConfig(mode="central", noise_multiplier=0.0)
    with pytest.raises(ValueError, match=r"it counts another DPConfig"):
        GradientCoding(FedAvg(), accountant=accountant, dp=quieter)


def test_a_code_objects_own_s_is_the_tolerance_and_a_contradicting_s_is_refused():
    """The object decides the tolerance: the options (and config.json) used to record the
    keyword's s (3) while the code tolerated 1."""
    from flwr.serverapp.strategy import FedAvg

    from fl_gradcode.codes import make_code
    from fl_gradcode.flower import GradientCoding

    code = make_code("frc", n=6, s=2)
    assert GradientCoding(FedAvg(), code=code).options.code.s == 2  # s not given
    assert GradientCoding(FedAvg(), code=code, s=2).options.code.s == 2
    with pytest.raises(ValueError, match=r"s=3 contradicts the FractionalRepetitionCode "
                                         r"object's s=2"):
        GradientCoding(FedAvg(), code=code, s=3)


@pytest.mark.parametrize("keywords", [{"m": 2}, {"code_options": {"layout": "window"}},
                                      {"s_max": 4}])
def test_options_a_code_object_would_not_use_are_refused(keywords):
    from flwr.serverapp.strategy import FedAvg

    from fl_gradcode.codes import make_code
    from fl_gradcode.flower import GradientCoding

    with pytest.raises(ValueError, match=r"object: the code is built already"):
        GradientCoding(FedAvg(), code=make_code("frc", n=6, s=1), s=1, **keywords)
    if "m" in keywords:  # the object's own reply length is accepted
        GradientCoding(FedAvg(), code=make_code("comm-efficient", n=6, s=1, m=2), s=1, m=2)


def test_an_explicit_stop_late_work_false_contradicting_auto_deadline_is_refused():
    with pytest.raises(ValueError, match=r"stop_late_work=False contradicts auto_deadline"):
        Options.from_keywords(s="auto", auto_deadline=3.0, stop_late_work=False)
    assert Options.from_keywords(s="auto", auto_deadline=3.0).timing.stop_late_work is True


def test_auto_says_when_s_max_is_capped_by_the_cohort(flwr_log):
    import logging

    from fl_gradcode.flower.policy import AdaptiveCodePolicy

    policy = AdaptiveCodePolicy(s="auto", s_max=50)
    assert policy.placement(4).s_max == 3
    policy.placement(4)  # built once per cohort size: said once
    said = [line for level, line in flwr_log if level == logging.WARNING and "s_max=50" in line]
    assert said == ["s_max=50 cannot be tolerated with a cohort of 4 (at most 3): s='auto' "
                    "chooses s in 0..3 for cohorts of 4"]


@pytest.mark.parametrize(("keywords", "match"), [
    ({"s_max": "x"}, r"s_max='x' must be an integer >= 1"),
    ({"s_max": 0}, r"s_max=0 must be an integer >= 1"),
    ({"auto_margin": -5}, r"auto_margin=-5 must be a number >= 0"),
])
def test_auto_options_are_checked_with_a_fixed_s_too(keywords, match):
    """They used to be checked with s='auto' only, so a bad value was accepted and unused."""
    with pytest.raises(ValueError, match=match):
        Options.from_keywords(code="frc", s=1, **keywords)


@pytest.mark.parametrize("mode", ["central", "sample"])
def test_independent_noise_outside_partition_dp_is_refused(mode):
    """Only dp='partition' draws noise per replica: with central or sample DP the key was
    accepted and the run was the identical-noise one."""
    from fl_gradcode.privacy import DPConfig

    with pytest.raises(ValueError, match=rf"dp-noise='independent' with dp='{mode}'"):
        Options.from_keywords(dp=DPConfig(mode=mode, noise="independent"))
    assert Options.from_keywords(dp=DPConfig(mode=mode)).privacy.dp.noise == "identical"
    partition = DPConfig(mode="partition", noise="independent")
    assert Options.from_keywords(dp=partition).privacy.dp.noise == "independent"


def test_uncoded_with_a_tolerance_it_does_not_have_is_refused():
    """code='uncoded' needs every reply: an s of 2 used to run as s=0 while the run's
    config.json said s=2."""
    with pytest.raises(ValueError, match=r"s=2 with code='uncoded': it tolerates no straggler"):
        GradientCoding(FedAvg(), code="uncoded", s=2)
    for keywords in ({"s": 0}, {}):  # s=0, and the keyword's default, are its own tolerance
        strategy = GradientCoding(FedAvg(), code="uncoded", **keywords)
        assert strategy.options.describe("FedAvg", {})["s"] == 0  # config.json's record
