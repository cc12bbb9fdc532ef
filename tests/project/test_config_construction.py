"""Run-config keys: the ServerApp builds from the table the same strategy as it did from the
hand-written keywords before the table existed, case by case, read through what a user can
observe: every option of the strategy (``strategy.options``; a rival's public attributes) against
a ``GradientCoding`` built through the public constructor from the captured keywords, the inner
strategy, the run's ``config.json``, the train config the clients are sent and the accountant."""

from __future__ import annotations

import inspect
import json

import pytest
from flwr.serverapp import strategy as flower_strategies

from fl_gradcode import latency as latency_models
from fl_gradcode.config import merge_config
from fl_gradcode.flower import GradientCoding
from fl_gradcode.flower.options import FLAT_NAMES
from fl_gradcode.privacy import DPConfig, ServerNoise

# GradientCoding's (or, for a rival, DeadlineFedAvg's) construction arguments, the inner
# strategy, the train config and the accountant, captured by running the ServerApp's build()
# BEFORE the run-config table existed (hand-written keywords): the table must build a strategy
# with the same options as those keywords give through the public constructor.
CASES = {
    "default": ({}, 4),
    "auto": ({"s": "auto", "s-max": 2, "auto-margin": 0.2, "exclude-slow": 4.0,
              "latency-state": "<tmp>/state.json", "auto-deadline": 2.5, "busy": "fit",
              "stop-late-work": True}, 8),
    "dp-central": ({"dp": "central", "dp-server-key-file": "<tmp>/server.json",
                    "dp-run-nonce": "abc", "noise-multiplier": 0.7, "clip-norm": 2.0,
                    "delta": 1e-6, "accountant": "prv", "target-epsilon": 8.0}, 6),
    "dp-partition-independent": ({"dp": "partition", "dp-noise": "independent",
                                  "fraction-train": 0.5, "s": 2}, 12),
    "dp-sample": ({"dp": "sample", "update": "local", "local-epochs": 2, "batch-size": 16}, 4),
    "comm-efficient": ({"code": "comm-efficient", "m": 2, "s": 1, "min-replies": 0,
                        "timing": "wallclock", "virtual-compute": "none",
                        "partition-cost-s": 0.5, "upload-bandwidth": 1e6,
                        "server-optimizer": "adam", "server-lr": 0.1}, 5),
    "approx": ({"code": "grouped-rs", "min-replies": 3, "max-decode-error": 0.3,
                "straggler-timeout": 2.0, "round-timeout": 30.0, "warmup-timeout": 5.0,
                "latency": "persistent", "latency-seed": 7, "seed": 3, "m": 4,
                "server-optimizer": "momentum", "momentum": 0.5, "slow-workers": "1,2",
                "slow-delay-s": 0.5, "nan-workers": "3"}, 6),
    "rival": ({"rival": "drop-stragglers", "straggler-timeout": 1.5,
               "virtual-compute": "none", "upload-bandwidth": 2e5, "fraction-train": 0.5,
               "partition-cost-s": 0.25}, 6),
    "uncoded": ({"code": "uncoded", "s": 0, "straggler-timeout": 1000000.0}, 4),
}


# the defaults, when the construction below was captured, of the keys the main job's regime
# has changed since: every case runs on them, so it still compares the same run configs
CAPTURE_DEFAULTS = {"s": 3, "s-max": 0, "auto-margin": 0.1, "stop-late-work": False,
                    "latency": "bimodal",
                    "latency-p": 0.1,
                    "virtual-compute": "measured", "partition-cost-s": 0.0,
                    "straggler-timeout": 10.0}


OLD_BASE = {'accountant': None,
            'args': [['FedAvg',
                      {'fraction_evaluate': 0.0,
                       'fraction_train': 1.0,
                       'min_available_nodes': 1,
                       'min_train_nodes': 1}]],
            'kwargs': {'auto_deadline': None,
                       'auto_margin': 0.1,
                       'busy': None,
                       'code': 'grouped-rs',
                       'compute_cost_s': 0.0,
                       'dp': "DPConfig(mode='none', clip_norm=1.0, noise_multiplier=1.0, "
                             "noise='identical', delta=1e-05, accountant='rdp', "
                             'target_epsilon=0.0)',
                       'dp_run_nonce': '',
                       'exclude_slow': None,
                       'latency': 'Bimodal(base=ShiftedExponential(shift=0.1, rate=10.0, '
                                  'load_scaled=True), p=0.1, slowdown=20.0)',
                       'latency_state': None,
                       'm': None,
                       'max_decode_error': 0.5,
                       'measured_compute': True,
                       'min_replies': None,
                       'results_dir': '<tmp>/r',
                       'round_timeout': 600.0,
                       's': 3,
                       's_max': None,
                       'seed': 0,
                       'server_noise': None,
                       'stop_late_work': False,
                       'straggler_timeout': 10.0,
                       'timing': 'virtual',
                       'upload_bandwidth': None,
                       'warmup_timeout': 120.0},
            'run_config_missing': [],
            'run_config_not_from_cfg': {'num-clients': 4, 'partition-sizes': [528, 197, 333, 380]},
            'train_config': {'keys': ['batch-size',
                                      'clip-norm',
                                      'dataset',
                                      'dirichlet-alpha',
                                      'dp',
                                      'local-epochs',
                                      'lr',
                                      'model',
                                      'nan-workers',
                                      'noise-multiplier',
                                      'partitioner',
                                      'seed',
                                      'slow-delay-s',
                                      'slow-workers',
                                      'synthetic-alpha',
                                      'synthetic-beta',
                                      'update'],
                             'not_from_cfg': {}}}


OLD_CHANGES = {
    'approx': {'args': [['FedAvgM',
                         {'fraction_evaluate': 0.0,
                          'fraction_train': 1.0,
                          'min_available_nodes': 1,
                          'min_train_nodes': 1,
                          'server_learning_rate': 1.0,
                          'server_momentum': 0.5}]],
               'kwargs': {'latency': 'PersistentSlow(base=ShiftedExponential(shift=0.1, '
                                     'rate=10.0, load_scaled=True), p=0.1, slowdown=20.0, '
                                     'slow=(), seed=7)',
                          'max_decode_error': 0.3,
                          'min_replies': 3,
                          'round_timeout': 30.0,
                          'seed': 3,
                          'straggler_timeout': 2.0,
                          'warmup_timeout': 5.0},
               'run_config_not_from_cfg': {'num-clients': 6,
                                           'partition-sizes': [310, 340, 182, 129, 185, 292]}},
    'auto': {'kwargs': {'auto_deadline': 2.5,
                        'auto_margin': 0.2,
                        'busy': 'fit',
                        'exclude_slow': 4.0,
                        'latency_state': '<tmp>/state.json',
                        's': 'auto',
                        's_max': 2,
                        'stop_late_work': True},
             'run_config_not_from_cfg': {'num-clients': 8,
                                         'partition-sizes': [300,
                                                             86,
                                                             80,
                                                             223,
                                                             139,
                                                             127,
                                                             269,
                                                             214]}},
    'comm-efficient': {'args': [['FedAdam',
                                 {'eta': 0.1,
                                  'fraction_evaluate': 0.0,
                                  'fraction_train': 1.0,
                                  'min_available_nodes': 1,
                                  'min_train_nodes': 1}]],
                       'kwargs': {'code': 'comm-efficient',
                                  'compute_cost_s': 0.5,
                                  'm': 2,
                                  'measured_compute': False,
                                  'min_replies': 5,
                                  's': 1,
                                  'timing': 'wallclock',
                                  'upload_bandwidth': 1000000.0},
                       'run_config_not_from_cfg': {'num-clients': 5,
                                                   'partition-sizes': [215, 283, 279, 381, 280]}},
    'dp-central': {'accountant': [[[0.7, 1.0, 1]]],
                   'kwargs': {'dp': "DPConfig(mode='central', clip_norm=2.0, "
                                    "noise_multiplier=0.7, noise='identical', delta=1e-06, "
                                    "accountant='prv', target_epsilon=8.0)",
                              'dp_run_nonce': 'abc',
                              'server_noise': ['ServerNoise',
                                               [1.96715474111, 0.249299568914, 0.666574484197]]},
                   'run_config_not_from_cfg': {'num-clients': 6,
                                               'partition-sizes': [336, 219, 244, 153, 155, 331]}},
    'dp-partition-independent': {'accountant': [[[1.0, 1.0, 1]]],
                                 'args': [['FedAvg',
                                           {'fraction_evaluate': 0.0,
                                            'fraction_train': 0.5,
                                            'min_available_nodes': 1,
                                            'min_train_nodes': 1}]],
                                 'kwargs': {'dp': "DPConfig(mode='partition', clip_norm=1.0, "
                                                  "noise_multiplier=1.0, noise='independent', "
                                                  "delta=1e-05, accountant='rdp', "
                                                  'target_epsilon=0.0)',
                                            's': 2},
                                 'run_config_not_from_cfg': {'num-clients': 12,
                                                             'partition-sizes': [145,
                                                                                 64,
                                                                                 145,
                                                                                 83,
                                                                                 135,
                                                                                 112,
                                                                                 163,
                                                                                 125,
                                                                                 87,
                                                                                 61,
                                                                                 88,
                                                                                 230]}},
    'dp-sample': {'accountant': [[[1.0, 0.030303030303030304, 66]],
                                 [[1.0, 0.07692307692307693, 26]],
                                 [[1.0, 0.047619047619047616, 42]],
                                 [[1.0, 0.041666666666666664, 48]]],
                  'kwargs': {'dp': "DPConfig(mode='sample', clip_norm=1.0, noise_multiplier=1.0, "
                                   "noise='identical', delta=1e-05, accountant='rdp', "
                                   'target_epsilon=0.0)'}},
    'rival': {'args': [],
              'kwargs': {'compute_cost_s': 0.25,
                         'deadline': 1.5,
                         'fraction_evaluate': 0.0,
                         'fraction_train': 0.5,
                         'latency': 'Bimodal(base=ShiftedExponential(shift=0.1, rate=10.0, '
                                    'load_scaled=True), p=0.1, slowdown=20.0)',
                         'measured_compute': False,
                         'min_available_nodes': 1,
                         'min_train_nodes': 1,
                         'partition_sizes': [336, 219, 244, 153, 155, 331],
                         'results_dir': '<tmp>/r',
                         'seed': 0,
                         'upload_bandwidth': 200000.0},
              'run_config_not_from_cfg': {'num-clients': 6,
                                          'partition-sizes': [336, 219, 244, 153, 155, 331]}},
    'uncoded': {'kwargs': {'code': 'uncoded', 's': 0, 'straggler_timeout': 1000000.0}},
}


_SIMPLE = (int, float, str, bool, type(None))
_INNER_FIELDS = ("fraction_train", "fraction_evaluate", "min_available_nodes", "min_train_nodes",
                 "server_learning_rate", "server_momentum", "eta")


def _plain(value, tmp):
    """A comparable, JSON-like description of an option's value."""
    if isinstance(value, dict):
        return {str(k): _plain(v, tmp) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, tmp) for v in value]
    if isinstance(value, str):
        return value.replace(str(tmp), "<tmp>")
    if isinstance(value, _SIMPLE):
        return value
    if isinstance(value, ServerNoise):
        return ["ServerNoise", [round(float(x), 12) for x in value.draw(3, 1.0, 1, "n")]]
    if type(value).__module__.startswith("flwr"):
        return [type(value).__name__,
                {k: getattr(value, k) for k in _INNER_FIELDS if hasattr(value, k)}]
    return repr(value)


def _captured_object(keyword, value, tmp):
    """The object a captured keyword's description stands for."""
    if keyword == "dp":
        return eval(value, {"DPConfig": DPConfig})  # a repr captured above
    if keyword == "latency":
        return eval(value, dict(vars(latency_models)))  # a repr captured above
    if keyword == "server_noise":
        return None if value is None else ServerNoise.from_file(str(tmp / "server.json"))
    if isinstance(value, str):
        return value.replace("<tmp>", str(tmp))
    return value


def _inner(description):
    (name, fields), = description
    return getattr(flower_strategies, name)(**fields)


def _by_hand(expected, tmp):
    """``GradientCoding`` built through its public constructor from the captured keywords
    (what a user writing the strategy by hand passes)."""
    kwargs = {k: _captured_object(k, v, tmp) for k, v in expected["kwargs"].items()}
    kwargs["results_dir"] = str(tmp / "by-hand")  # the built strategy's config.json stays
    return GradientCoding(_inner(expected["args"]), **kwargs)


def _options(strategy, tmp, *, skip=()):
    names = (*FLAT_NAMES, "seed", "code_options")
    return {name: _plain(strategy.options.get(name), tmp) for name in names
            if name not in ("accountant", *skip)}


def _build(overrides, n, tmp):
    import server.app as server_app

    cfg = merge_config({"results-dir": str(tmp / "r"), **overrides})
    make = server_app.build_rival if cfg["rival"] else server_app.build
    strategy, _, _, train_config = make(cfg, n)
    return cfg, strategy, train_config


def _train_config(cfg, train_config, tmp):
    plain_cfg, config = _plain(cfg, tmp), _plain(dict(train_config), tmp)
    keys = sorted(set(config) - set(CLIENT_KEYS_ADDED_AFTER_CAPTURE))
    return {"keys": keys,
            "not_from_cfg": {k: v for k, v in config.items()
                             if plain_cfg.get(k, "<missing>") != v}}


def _run_config(cfg, tmp, described=()):
    """What the run's config.json says of the run config: the keys that differ from ``cfg``
    and the keys of ``cfg`` it lacks (``described``: keys config.json states as an option)."""
    written = json.loads((tmp / "r" / "config.json").read_text())
    plain_cfg = _plain(cfg, tmp)
    return {"not_from_cfg": {k: v for k, v in _plain(written, tmp).items()
                             if k not in described and k in plain_cfg | {"num-clients": 0,
                                                                        "partition-sizes": 0}
                             and plain_cfg.get(k, "<missing>") != v},
            "missing": sorted(k for k in set(plain_cfg) - set(written) if k not in described)}


# sections changed on purpose after the capture: independent noise's accountant starts at the
# worst case of the cohort's code (grouped-rs s = 2: a partition dominating its 3 replies), not
# the equal-size multiplier, so the budget check never judges a round above its own multiplier
CHANGED_AFTER_CAPTURE = {"dp-partition-independent": {"accountant": [[[1 / 3**0.5, 1.0, 1]]]}}


def _expected(case):
    expected = {k: (dict(v) if isinstance(v, dict) else v) for k, v in OLD_BASE.items()}
    for section, value in OLD_CHANGES.get(case, {}).items():
        if section == "kwargs" and set(value) <= set(OLD_BASE["kwargs"]):
            expected["kwargs"] = {**OLD_BASE["kwargs"], **value}
        else:
            expected[section] = value
    expected.update(CHANGED_AFTER_CAPTURE.get(case, {}))
    return expected


def _overrides(case, tmp):
    overrides, n = CASES[case]
    overrides = {**CAPTURE_DEFAULTS, **overrides}
    if case == "rival":  # a rival refuses the coded-only keys it would not read
        from fl_gradcode.config import coded_only_keys

        overrides = {k: v for k, v in overrides.items()
                     if k == "rival" or k not in coded_only_keys()}
    return {k: v.replace("<tmp>", str(tmp)) if isinstance(v, str) else v
            for k, v in overrides.items()}, n


@pytest.fixture
def server_key(tmp_path):
    (tmp_path / "server.json").write_text(json.dumps({"server": "11" * 32}))


@pytest.mark.parametrize("case", [c for c in CASES if c != "rival"])
def test_server_app_builds_the_same_strategy_as_before_the_table(case, tmp_path, server_key):
    expected = _expected(case)
    overrides, n = _overrides(case, tmp_path)
    cfg, strategy, train_config = _build(overrides, n, tmp_path)
    built_options = _options(strategy, tmp_path)
    by_hand = _by_hand(expected, tmp_path)
    # options added after the capture stay at the constructor's defaults: the strategy the
    # captured keywords build by hand (without a pinned nonce or a server key file, each
    # strategy draws its own nonce and server noise: compared below where they are pinned)
    drawn = ("nonce", "server_noise")
    assert {k: v for k, v in built_options.items() if k not in drawn} == \
        _options(by_hand, tmp_path, skip=drawn)
    if expected["kwargs"]["dp_run_nonce"]:
        assert built_options["nonce"] == expected["kwargs"]["dp_run_nonce"]
    # the options a run config sets differently from the constructor's defaults, by value
    signature = inspect.signature(GradientCoding.__init__).parameters
    assert {k: _plain(strategy.options.get(k), tmp_path) for k in ADDED_AFTER_CAPTURE
            if k in FLAT_NAMES} == {k: _plain(signature[k].default, tmp_path)
                                    for k in ADDED_AFTER_CAPTURE if k in FLAT_NAMES}
    assert _plain(strategy.inner, tmp_path) == expected["args"][0]
    if expected["kwargs"]["server_noise"] is not None:
        assert _plain(strategy.server_noise, tmp_path) == expected["kwargs"]["server_noise"]
    accountant = strategy.accountant
    assert (None if accountant is None else _plain(accountant.units, tmp_path)) == \
        expected["accountant"]
    assert _train_config(cfg, train_config, tmp_path) == expected["train_config"]
    described = set(strategy.options.describe("", None))
    assert _run_config(cfg, tmp_path, described) == {
        "not_from_cfg": expected["run_config_not_from_cfg"],
        "missing": expected["run_config_missing"]}


def test_server_app_builds_the_same_rival_as_before_the_table(tmp_path, server_key):
    expected = _expected("rival")
    overrides, n = _overrides("rival", tmp_path)
    cfg, strategy, train_config = _build(overrides, n, tmp_path)
    kwargs = dict(expected["kwargs"])
    assert _plain(str(strategy.recorder.directory), tmp_path) == kwargs.pop("results_dir")
    assert {k: _plain(getattr(strategy, k), tmp_path) for k in kwargs} == kwargs
    assert _train_config(cfg, train_config, tmp_path) == expected["train_config"]
    assert _run_config(cfg, tmp_path) == {"not_from_cfg": expected["run_config_not_from_cfg"],
                                          "missing": expected["run_config_missing"]}


# run-config keys added after the construction above was captured, by GradientCoding keyword
ADDED_AFTER_CAPTURE = ("verify", "verify_tolerance", "roster", "num_partitions",
                       "auto_approximate")


# client run-config keys added after the capture
CLIENT_KEYS_ADDED_AFTER_CAPTURE = ("natural-sigma", "slow-classes", "latency", "latency-p",
                                   "latency-seed")
