"""Run-config keys: the table (fl_gradcode.config.KEYS), pyproject's [tool.flwr.app.config],
GradientCoding's signature, the ServerApp's construction and docs/options.md agree."""

from __future__ import annotations

import inspect
import json
import tomllib
from pathlib import Path

import pytest

from fl_gradcode.config import DEFAULTS, KEYS, merge_config
from fl_gradcode.flower import GradientCoding

ROOT = Path(__file__).resolve().parents[2]
REQUIRED = [
    "num-rounds", "code", "s", "update", "local-epochs", "lr", "server-optimizer", "dataset",
    "partitioner", "dirichlet-alpha", "latency", "timing", "straggler-timeout", "seed",
    "results-dir",
]


def test_pyproject_run_config_equals_defaults():
    app = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    assert app["config"] == DEFAULTS
    # every key, in the table's order, with the default's type (1.0 is not 1)
    assert list(app["config"]) == list(DEFAULTS) == [k.name for k in KEYS]
    for name, value in app["config"].items():
        assert type(value) is type(DEFAULTS[name]), name
    assert app["components"] == {"serverapp": "server.app:app", "clientapp": "clients.app:app"}


def test_pyproject_run_config_section_is_the_generated_text():
    from fl_gradcode.config import pyproject_section

    text = (ROOT / "pyproject.toml").read_text()
    start = text.index("[tool.flwr.app.config]\n")
    # regenerate with: python -m fl_gradcode.config --pyproject
    assert text[start:start + len(pyproject_section()) + 1] == pyproject_section() + "\n"
    section = pyproject_section().splitlines()
    assert section[0] == "[tool.flwr.app.config]" and len(section) == len(KEYS) + 1
    assert section[1:4] == ["num-rounds = 30", "num-clients = 0", 'code = "grouped-rs"']
    assert 'stop-late-work = "auto"' in section and "delta = 1e-05" in section


def test_run_config_keys_exist_and_are_documented_in_the_option_page():
    page = (ROOT / "docs" / "options.md").read_text(encoding="utf-8")
    for key in [*REQUIRED, *DEFAULTS]:
        assert key in DEFAULTS
        assert f"| `{key}` |" in page, key


def test_merge_config_rejects_unknown_keys_and_wrong_types():
    assert merge_config({"s": 2})["s"] == 2
    assert merge_config({"lr": 1})["lr"] == 1.0  # an int where a float is expected is fine
    with pytest.raises(ValueError, match="unknown run-config key 'stragglers'"):
        merge_config({"stragglers": 3})
    with pytest.raises(ValueError, match="num-rounds='5' must be int"):
        merge_config({"num-rounds": "5"})


@pytest.mark.parametrize(
    ("run_config", "expected"),
    [({"s": 3}, "skip"), ({}, "queue"), ({"s": "auto"}, "queue"),
     ({"s": 3, "busy": "queue"}, "queue"),
     ({"s": "auto", "busy": "skip"}, "skip"), ({"busy": "queue", "timing": "wallclock"}, "skip")],
)
def test_busy_run_config_key_reaches_the_strategy(run_config, expected, tmp_path):
    from server.app import build

    cfg = merge_config({**run_config, "results-dir": str(tmp_path)})
    strategy = build(cfg, 4)[0]
    assert strategy.busy_mode == expected


def test_bad_busy_value_is_refused_with_its_value(tmp_path):
    from server.app import build

    with pytest.raises(ValueError, match="busy='later'"):
        build(merge_config({"busy": "later", "results-dir": str(tmp_path)}), 4)


def test_auto_margin_run_config_key_reaches_the_strategy_and_is_validated(tmp_path):
    from server.app import build

    base = {"s": "auto", "results-dir": str(tmp_path)}
    assert build(merge_config(base), 4)[0].auto_margin == 0.2  # the documented default
    assert build(merge_config({**base, "auto-margin": 0.25}), 4)[0].auto_margin == 0.25
    with pytest.raises(ValueError, match=r"auto_margin=-0\.5"):
        build(merge_config({**base, "auto-margin": -0.5}), 4)


def test_exclude_slow_run_config_key_reaches_the_strategy_and_is_validated(tmp_path):
    from server.app import build

    base = {"s": "auto", "results-dir": str(tmp_path)}
    assert build(merge_config(base), 4)[0].exclude_slow is None  # 0: never (the default)
    assert build(merge_config({**base, "exclude-slow": 5.0}), 4)[0].exclude_slow == 5.0
    with pytest.raises(ValueError, match=r"exclude_slow=0\.5"):
        build(merge_config({**base, "exclude-slow": 0.5}), 4)
    with pytest.raises(ValueError, match="needs s='auto'"):
        build(merge_config({"exclude-slow": 5.0, "s": 3, "results-dir": str(tmp_path)}), 4)


def test_fraction_train_samples_a_cohort_every_round_and_is_validated(tmp_path):
    import random

    import numpy as np

    from server.app import build, run_in_process

    base = {"results-dir": str(tmp_path)}
    # Flower samples max(int(connected * fraction), min_train_nodes) nodes: all 12 connected,
    # everyone / 6 as before; asked for one node at least, a dead node never stalls the job
    inner = build(merge_config(base), 12)[0].inner
    assert (inner.fraction_train, inner.min_train_nodes, inner.min_available_nodes) == (1.0, 1, 1)
    inner = build(merge_config({**base, "fraction-train": 0.5}), 12)[0].inner
    assert (inner.fraction_train, inner.min_train_nodes, inner.min_available_nodes) == (0.5, 1, 1)
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match=f"fraction-train={bad}"):
            build(merge_config({**base, "fraction-train": bad}), 12)
    run = {**base, "fraction-train": 0.5, "num-rounds": 3, "s": 2, "latency": "pareto",
           "virtual-compute": "none"}
    random.seed(12345)  # the run seeds the cohort sampling itself
    strategy, theta = run_in_process(run, 12)
    assert len(strategy.history) == 3
    assert all(r["decode"] == "exact" and r["s"] == 2 for r in strategy.history)
    # 6 replies at most per round: the code is built over the 6-node cohort
    assert all(len(r["clients_used"]) <= 6 for r in strategy.history)
    assert len(strategy.identities) > 6  # different cohorts were sampled
    random.seed(999)
    again, theta_again = run_in_process(run, 12)  # same seed, same cohorts, same model
    np.testing.assert_array_equal(theta, theta_again)
    assert [r["virtual_s"] for r in again.history] == [r["virtual_s"] for r in strategy.history]


def test_independent_noise_is_accounted_with_the_sampled_cohorts_code(tmp_path):
    """Partition DP with independent noise: the accountant's noise multiplier comes from the
    code the rounds use, the one over the sampled cohort (6 of 12 nodes: grouped-rs s = 3 on
    6 clients, multiplier 0.72), not the one over all 12 (1.0)."""
    from fl_gradcode.codes import make_code
    from fl_gradcode.privacy import independent_noise_multiplier
    from server.app import build

    cfg = merge_config({"results-dir": str(tmp_path), "dp": "partition",
                        "dp-noise": "independent", "noise-multiplier": 1.0, "s": 3,
                        "code": "grouped-rs", "fraction-train": 0.5})
    strategy = build(cfg, 12)[0]
    ((sigma, q, count),) = strategy.accountant.units[0]
    cohort = independent_noise_multiplier(make_code("grouped-rs", n=6, s=3, seed=0).B, 1.0)
    everyone = independent_noise_multiplier(make_code("grouped-rs", n=12, s=3, seed=0).B, 1.0)
    assert abs(cohort - everyone) > 0.1  # the premise: the two codes differ
    assert sigma == pytest.approx(cohort)
    assert (q, count) == (1.0, 1)


def test_latency_seed_picks_the_slow_clients_and_the_run_seed_the_draws(tmp_path):
    from server.app import build

    def strategy(**keys):
        cfg = merge_config({"latency": "persistent", "latency-p": 0.3,
                            "results-dir": str(tmp_path), **keys})
        return build(cfg, 40)[0]

    def slow(st):
        return [w for w in range(40) if st.latency.is_slow(w)]

    shared = strategy(seed=5, **{"latency-seed": 1})
    seed1, seed5 = strategy(seed=1), strategy(seed=5)
    assert slow(shared) == slow(seed1) != slow(seed5)  # the federation's hardware of seed 1
    assert shared.seed == 5  # per-round draws follow the run seed


def test_latency_state_run_config_key_reaches_the_strategy(tmp_path):
    from server.app import build

    base = {"s": "auto", "results-dir": str(tmp_path)}
    assert build(merge_config(base), 4)[0].latency_state is None
    path = tmp_path / "sub" / "latency.json"
    st = build(merge_config({**base, "latency-state": str(path)}), 4)[0]
    assert st.latency_state == str(path.resolve())


# --- the table drives the rest -----------------------------------------------------------


def _gradient_coding_parameters():
    import inspect

    from fl_gradcode.flower import GradientCoding

    return inspect.signature(GradientCoding.__init__).parameters


def test_every_keyword_of_the_table_is_a_gradient_coding_parameter():
    parameters = _gradient_coding_parameters()
    keywords = [k.keyword for k in KEYS if k.keyword is not None]
    assert len(keywords) == len(set(keywords))  # one key per keyword
    for keyword in keywords:
        assert keyword in parameters, keyword
        assert parameters[keyword].kind is not parameters[keyword].VAR_KEYWORD


def test_rival_shares_keywords_with_gradient_coding_meaning_the_same():
    import inspect

    from fl_gradcode.flower.clock import timing_value
    from fl_gradcode.flower.deadline import DeadlineFedAvg
    from server.app import RIVAL_KEYWORDS

    rival = inspect.signature(DeadlineFedAvg.__init__).parameters
    coded = _gradient_coding_parameters()
    table = {k.keyword for k in KEYS}
    for keyword in RIVAL_KEYWORDS:
        assert keyword in table, keyword
        # a timing keyword's default is read from the timing group when the rival is built
        assert timing_value(rival[keyword].default) == coded[keyword].default, keyword


def test_run_config_defaults_agree_with_python_or_say_why(tmp_path, monkeypatch):
    """For every key with a keyword, the keyword the default run config builds equals
    GradientCoding's signature default, or the table states why not (and then it really
    differs): the difference is stated once, with why."""
    from fl_gradcode.privacy import DPConfig
    from server.app import strategy_keywords

    monkeypatch.chdir(tmp_path)
    built = strategy_keywords(merge_config({}), 12)
    parameters = _gradient_coding_parameters()
    differs = set()
    for entry in KEYS:
        if entry.keyword is None:
            continue
        python_default = parameters[entry.keyword].default
        if entry.why_differs:
            differs.add(entry.name)
            assert built[entry.keyword] != python_default, entry.name
        else:
            assert built[entry.keyword] == python_default, entry.name
    # the main job's regime (the first-hour experiment's recommendation), DP and results
    assert differs == {"s", "s-max", "latency", "virtual-compute", "partition-cost-s",
                       "straggler-timeout", "dp", "results-dir"}
    assert built["s"] == "auto" and parameters["s"].default == 1  # the main job's s; Python's 1
    assert built["s_max"] == 4 and built["measured_compute"] is False
    assert built["compute_cost_s"] == 0.05
    # the main job's deadline: what the grid file's rule gave (results/main_job_deadline.json)
    ruled = json.loads((ROOT / "results" / "main_job_deadline.json").read_text())
    assert built["straggler_timeout"] == ruled["straggler_timeout_s"]
    assert built["dp"] == DPConfig() and not built["dp"].enabled  # the same as None: no DP


def test_table_choices_are_the_components_own():
    from fl_gradcode.codes import available_codes
    from fl_gradcode.config import key
    from fl_gradcode.data import DATASETS, PARTITIONERS
    from fl_gradcode.latency import LATENCY_MODELS
    from fl_gradcode.learning import MODELS
    from fl_gradcode.privacy import DP_MODES, DP_NOISE
    from server.app import RIVALS, SERVER_OPTIMIZERS

    real = {
        "code": available_codes(), "latency": LATENCY_MODELS, "dp": DP_MODES,
        "dp-noise": DP_NOISE, "dataset": DATASETS, "partitioner": PARTITIONERS,
        "model": MODELS, "server-optimizer": SERVER_OPTIMIZERS, "rival": ("", *RIVALS),
    }
    for name, values in real.items():
        assert set(key(name).choices) == set(values), name


def test_client_and_coded_only_keys_come_from_the_table():
    from fl_gradcode.config import client_keys, coded_only_keys
    from server.app import CLIENT_KEYS
    from server.launch import CODED_ONLY

    # the values these names held before the table, written out by hand in server/
    assert set(CLIENT_KEYS) == {
        "seed", "dataset", "synthetic-alpha", "synthetic-beta", "model", "partitioner",
        "dirichlet-alpha", "update", "local-epochs", "batch-size", "dp", "clip-norm",
        "noise-multiplier", "slow-workers", "slow-delay-s", "nan-workers",
        # added with the natural partitioner (clients rebuild the same partitions)
        "natural-sigma",
        # added with slow-classes (clients rebuild who is slow to rebuild the partitions)
        "slow-classes", "latency", "latency-p", "latency-seed",
    }
    assert set(CODED_ONLY) == {
        "code", "s", "s-max", "auto-margin", "exclude-slow", "latency-state", "auto-deadline",
        "stop-late-work", "busy", "m", "max-decode-error", "min-replies", "rival",
        # added with the table
        "verify", "verify-tolerance",
        "roster",  # the membership roster
        "auto-approximate",  # s=auto's approximate rounds
    }
    assert set(client_keys()) == {*CLIENT_KEYS, "lr"}
    assert CODED_ONLY == coded_only_keys()


def test_option_page_is_generated_from_the_table():
    from fl_gradcode.config import codes_markdown, options_markdown, options_page

    page = (ROOT / "docs" / "options.md").read_text(encoding="utf-8")
    # regenerate with: python -m fl_gradcode.config --write docs/options.md
    assert page == options_page()
    assert options_markdown() in page and codes_markdown() in page
    for entry in KEYS:
        if entry.why_differs:
            assert entry.why_differs in page


def test_codes_markdown_lists_every_registry_code_with_its_kind():
    from fl_gradcode.codes import available_codes, make_code
    from fl_gradcode.config import codes_markdown

    table = codes_markdown()
    for name in available_codes():
        kind = "exact" if make_code(name, n=6, s=2).is_exact else "approximate"
        assert f"| `{name}` | {kind} |" in table, name
    assert "Tandon et al. 2017" in table and "Charles et al. 2017" in table


def test_option_page_cli_prints_or_writes_the_page(tmp_path, capsys, monkeypatch):
    from fl_gradcode.config import options_page, pyproject_section
    from fl_gradcode.config.__main__ import main

    out = tmp_path / "options.md"
    assert main(["--write", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == options_page()
    assert main([]) == 0
    assert capsys.readouterr().out == options_page()
    assert main(["--pyproject"]) == 0
    assert capsys.readouterr().out == pyproject_section()
    monkeypatch.setattr("sys.argv", ["fl_gradcode.config", "--pyproject"])
    assert main() == 0  # the command line's arguments
    assert capsys.readouterr().out == pyproject_section()
    for bad in (["--write"], ["--out", str(out)], ["--write", str(out), "x"],
                ["--pyproject", "x"]):
        assert main(bad) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.startswith("Usage: ``python -m fl_gradcode")


def test_key_entries_validate_themselves():
    from fl_gradcode.config import Key, group_values

    with pytest.raises(ValueError, match="kebab-case"):
        Key("Num_Rounds", 1, "x")
    with pytest.raises(ValueError, match="not in"):
        Key("mode", "c", "x", choices=("a", "b"))
    with pytest.raises(ValueError, match="why_differs needs a keyword"):
        Key("k", 1, "x", why_differs="because")
    with pytest.raises(ValueError, match="none_when"):
        Key("k", 0, "x", keyword="k", none_when="")
    with pytest.raises(ValueError, match="side="):
        Key("k", 0, "x", side="launch")
    with pytest.raises(ValueError, match=r"k: default None must be bool/int/float/str"):
        Key("k", None, "x")
    with pytest.raises(ValueError, match=r"k: feeds group 'wire' not in \('dp'"):
        Key("k", 0, "x", feeds=("wire", "mode"))
    with pytest.raises(ValueError, match="group="):
        group_values(DEFAULTS, "wire")
    s = Key("s", 3, "x", keyword="s", also=("auto",))
    assert (s.keyword_value("auto"), s.keyword_value(2)) == ("auto", 2)
    assert s.cast("2") == 2 and s.cast(2.0) == 2  # any other value: the default's type
    # a default from `also` needs the other values' type
    with pytest.raises(ValueError, match=r"s: the default 'auto' is one of also=\('auto',\): "
                       "kind"):
        Key("s", "auto", "x", keyword="s", also=("auto",))
    auto = Key("s", "auto", "x", keyword="s", also=("auto",), kind=int)
    assert (auto.keyword_value("auto"), auto.cast("2"), auto.cast(2.0)) == ("auto", 2, 2)
    assert type(auto.cast("2")) is int
    with pytest.raises(ValueError, match="k: default 1 is not of kind float"):
        Key("k", 1, "x", kind=float)
    with pytest.raises(ValueError, match="kind="):
        Key("k", 1, "x", kind=list)
    with pytest.raises(ValueError, match=r"none_when=0\.0 must be int"):
        Key("s", "auto", "x", keyword="s", also=("auto",), kind=int, none_when=0.0)
    assert Key("k", 0.0, "x", keyword="k", none_when=0.0).keyword_value(0) is None


def test_option_table_rows_escape_markdown_and_show_what_each_key_reaches():
    from fl_gradcode.config import Key, options_markdown

    table = options_markdown([
        Key("pipe-key", "a|b", "splits on |\nand lines", keyword="wire", choices=("a|b", "c")),
        Key("flag", False, "a bool", side="both"),
        Key("clip", 1.5, "c", side="client", feeds=("dp", "clip_norm")),
        Key("frac", 0.5, "f", feeds=("inner", "fraction_train")),
        Key("every", 2, "e", keyword="s", why_differs="because"),
    ])
    rows = table.splitlines()
    assert rows[:2] == ["| key | default | what it does | `GradientCoding` keyword | side |",
                        "|---|---|---|---|---|"]
    assert rows[2] == ('| `pipe-key` | `"a\\|b"` | splits on \\| and lines; one of `"a\\|b"`, '
                       '`"c"` | `wire` | server |')
    assert rows[3] == "| `flag` | `false` | a bool | — | both |"
    assert rows[4] == "| `clip` | `1.5` | c | `dp` = `DPConfig(clip_norm=)` | client |"
    assert rows[5] == "| `frac` | `0.5` | f | inner strategy's `fraction_train` | server |"
    assert rows[6] == "| `every` | `2` | e | `s` | server |"
    assert rows[7:] == ["", "Defaults that differ from `GradientCoding`'s signature:", "",
                        "- `every` (`s`): because."]
    assert "Defaults that differ" not in options_markdown([Key("k", True, "t")])
    assert "| `k` | `true` |" in options_markdown([Key("k", True, "t")])


def test_table_lookups_and_worker_lists():
    from fl_gradcode.config import client_keys, coded_only_keys, key, worker_list

    assert key("s").keyword == "s" and key("s").default == DEFAULTS["s"] == "auto"
    assert key("s").value_type is int and key("s-max").value_type is int
    with pytest.raises(KeyError):
        key("stragglers")
    assert client_keys()[:3] == ("update", "local-epochs", "batch-size")  # table order
    assert coded_only_keys()[:2] == ("code", "s") and coded_only_keys()[-1] == "rival"
    assert worker_list("1, 4") == {1, 4} and worker_list("") == set() and worker_list(3) == {3}
    assert worker_list("1 2,3") == {12, 3}  # spaces are removed before the split
    with pytest.raises(ValueError, match="comma-separated worker indices; got '1;2'"):
        worker_list("1;2")


def test_merge_config_coerces_ints_to_floats_only():
    cfg = merge_config({"lr": 2, "num-rounds": 5, "stop-late-work": True})
    assert (cfg["lr"], type(cfg["lr"])) == (2.0, float) and cfg["num-rounds"] == 5
    assert merge_config(None) == DEFAULTS and merge_config({}) is not DEFAULTS
    with pytest.raises(ValueError, match=r"lr=True must be float like its default 0\.5"):
        merge_config({"lr": True})
    with pytest.raises(ValueError, match=r"num-rounds=5\.0 must be int"):
        merge_config({"num-rounds": 5.0})
    with pytest.raises(ValueError,
                       match="known keys: \\['accountant', 'auto-approximate', 'auto-deadline'"):
        merge_config({"nope": 1})


def test_merge_config_accepts_auto_for_s_only():
    assert merge_config({"s": "auto"})["s"] == "auto"
    # the default is "auto", yet s is an int key: ints are accepted, other types refused
    assert merge_config({"s": 2})["s"] == 2 and merge_config({"s": 0})["s"] == 0
    with pytest.raises(ValueError, match=r"s=2\.5 must be int or 'auto' like its default"):
        merge_config({"s": 2.5})
    with pytest.raises(ValueError, match="s=True must be int"):
        merge_config({"s": True})
    with pytest.raises(ValueError, match="s='fast' must be int"):
        merge_config({"s": "fast"})
    with pytest.raises(ValueError, match="s-max='auto' must be int"):
        merge_config({"s-max": "auto"})


# GradientCoding's (or, for a rival, DeadlineFedAvg's) construction arguments, the inner
# strategy, the train config and the accountant, captured by running the ServerApp's build()
# BEFORE the run-config table existed (hand-written keywords): the table must build the same.
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


def _plain(value, tmp):
    """A comparable, JSON-like description of a construction argument."""
    if isinstance(value, dict):
        return {str(k): _plain(v, tmp) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, tmp) for v in value]
    if isinstance(value, str):
        return value.replace(str(tmp), "<tmp>")
    if isinstance(value, _SIMPLE):
        return value
    if type(value).__name__ == "ServerNoise":
        return ["ServerNoise", [round(float(x), 12) for x in value.draw(3, 1.0, 1, "n")]]
    if type(value).__module__.startswith("flwr"):
        keep = ("fraction_train", "fraction_evaluate", "min_available_nodes", "min_train_nodes",
                "server_learning_rate", "server_momentum", "eta")
        return [type(value).__name__, {k: getattr(value, k) for k in keep if hasattr(value, k)}]
    return repr(value)


def _construction(overrides, n, tmp, monkeypatch):
    import server.app as server_app

    seen = {}

    def recorder(real):
        def record(*args, **kwargs):
            seen["args"], seen["kwargs"] = _plain(list(args), tmp), _plain(kwargs, tmp)
            return real(*args, **kwargs)
        return record

    monkeypatch.setattr(server_app, "GradientCoding", recorder(server_app.GradientCoding))
    monkeypatch.setattr(server_app, "DeadlineFedAvg", recorder(server_app.DeadlineFedAvg))
    cfg = merge_config({"results-dir": str(tmp / "r"), **overrides})
    make = server_app.build_rival if cfg["rival"] else server_app.build
    strategy, _, _, train_config = make(cfg, n)
    plain_cfg, config = _plain(cfg, tmp), _plain(dict(train_config), tmp)
    seen["train_config"] = {
        "keys": sorted(config),
        "not_from_cfg": {k: v for k, v in config.items() if plain_cfg.get(k, "<missing>") != v},
    }
    run_config = seen["kwargs"].pop("run_config")
    # the accountant is passed as a keyword (it used to be assigned after construction): it
    # is compared below through the strategy's accountant, as before
    seen["kwargs"].pop("accountant", None)
    seen["run_config_not_from_cfg"] = {
        k: v for k, v in run_config.items() if plain_cfg.get(k, "<missing>") != v}
    seen["run_config_missing"] = sorted(set(plain_cfg) - set(run_config))
    accountant = getattr(strategy, "accountant", None)
    seen["accountant"] = None if accountant is None else _plain(accountant.units, tmp)
    return seen


def _expected(case):
    expected = {k: (dict(v) if isinstance(v, dict) else v) for k, v in OLD_BASE.items()}
    for section, value in OLD_CHANGES.get(case, {}).items():
        if section == "kwargs" and set(value) <= set(OLD_BASE["kwargs"]):
            expected["kwargs"] = {**OLD_BASE["kwargs"], **value}
        else:
            expected[section] = value
    return expected


@pytest.mark.parametrize("case", list(CASES))
def test_server_app_builds_the_same_strategy_as_before_the_table(case, tmp_path, monkeypatch):
    import json

    (tmp_path / "server.json").write_text(json.dumps({"server": "11" * 32}))
    overrides, n = CASES[case]
    overrides = {**CAPTURE_DEFAULTS, **overrides}
    overrides = {k: v.replace("<tmp>", str(tmp_path)) if isinstance(v, str) else v
                 for k, v in overrides.items()}
    seen = _construction(overrides, n, tmp_path, monkeypatch)
    # client keys added after the capture are forwarded in the train config too (at their
    # defaults here: the same partitions as before)
    for name in CLIENT_KEYS_ADDED_AFTER_CAPTURE:
        seen["train_config"]["keys"].remove(name)
    if "kwargs" in seen and OLD_BASE["kwargs"].keys() <= seen["kwargs"].keys():
        # keys added after the capture build their keyword at GradientCoding's own default:
        # the same strategy as passing nothing
        signature = inspect.signature(GradientCoding.__init__).parameters
        for keyword in ADDED_AFTER_CAPTURE:
            assert seen["kwargs"].pop(keyword) == signature[keyword].default, keyword
    assert seen == _expected(case)


# run-config keys added after the construction above was captured, by GradientCoding keyword
ADDED_AFTER_CAPTURE = ("verify", "verify_tolerance", "roster", "num_partitions",
                       "auto_approximate")
# client run-config keys added after the capture
CLIENT_KEYS_ADDED_AFTER_CAPTURE = ("natural-sigma", "slow-classes", "latency", "latency-p",
                                   "latency-seed")


def test_verify_keys_turn_on_the_integrity_check_of_the_strategy(tmp_path):
    from server.app import build

    out = str(tmp_path / "r")
    cfg = merge_config({"verify": True, "verify-tolerance": 1e-4, "code": "frc",
                        "results-dir": out})
    strategy = build(cfg, 6)[0]
    assert strategy.options.integrity.verify is True
    assert strategy.options.integrity.verify_tolerance == 1e-4
    plain = build(merge_config({"results-dir": out}), 6)[0]
    assert plain.options.integrity.verify is False
    # refused where it cannot check, with the reason, as GradientCoding(verify=True) is
    with pytest.raises(ValueError, match="verify"):
        build(merge_config({"verify": True, "code": "uncoded", "s": 0, "results-dir": out}), 4)
    # and for the default grouped-rs, whose Reed-Solomon blocks cannot be settled
    with pytest.raises(ValueError, match="repetition group"):
        build(merge_config({"verify": True, "results-dir": out}), 6)


def test_an_empty_results_dir_writes_no_results_files_not_the_working_directory(
        tmp_path, monkeypatch):
    """``results-dir=""`` means GradientCoding's ``results_dir=None`` (no files), as ``""``
    means ``None`` for the table's other path keys; it never resolves to the working
    directory."""
    from server.app import strategy_keywords

    monkeypatch.chdir(tmp_path)
    built = strategy_keywords(merge_config({"results-dir": ""}), 12)
    assert built["results_dir"] is None
    given = strategy_keywords(merge_config({"results-dir": "out"}), 12)
    assert given["results_dir"] == str(tmp_path / "out")


def test_the_main_job_refuses_an_empty_results_dir(tmp_path, monkeypatch, capsys):
    """The main job compares its runs' records: with ``results-dir=""`` there are none, so it
    refuses before any run, naming the value."""
    from server import launch

    monkeypatch.chdir(tmp_path)
    ran = []
    monkeypatch.setattr(launch, "flwr_run", lambda *a, **k: ran.append(a) or 0)
    code = launch.main(["--home", str(tmp_path / "home"), "--run-config", "results-dir=''"])
    assert code == 2 and not ran
    assert "results-dir=''" in capsys.readouterr().err
