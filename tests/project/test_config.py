"""Run-config keys: the table (fl_gradcode.config.KEYS), pyproject's [tool.flwr.app.config],
GradientCoding's signature and docs/options.md agree; ``merge_config`` checks a run config
against the table.

The keys reaching the strategy through the ServerApp's ``build`` are tested in
test_config_build.py, the ServerApp's construction against the one captured before the table
in test_config_construction.py."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from fl_gradcode.config import DEFAULTS, KEYS, merge_config

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
        "warmup-timeout",  # the membership's first wait: no rival reads it
        "asynchronous", "buffer-size", "replicate-below", "replicate-margin",  # FedBuff over
        "need-ratio", "need-latch", "need-reference", "need-prior",  # replicated partitions
        "lag-level",  # the class reading (asynchronous)
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
    assert coded_only_keys()[:2] == ("code", "s") and coded_only_keys()[-1] == "buffer-size"
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
                       match="known keys: \\['accountant', 'asynchronous', 'auto-approximate'"):
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
