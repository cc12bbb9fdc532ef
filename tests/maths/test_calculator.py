"""The "does coding pay?" calculator: its table, its text and its command line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fl_gradcode.calculator import PRESETS, main, render, table


def test_calculator_preset_and_a_regime_where_coding_loses():
    p = PRESETS["seeds-64"]
    res = table(p["n"], p["latency"], s_values=p["s"], samples=2000,
                **{k: p[k] for k in ("p", "slowdown", "scale", "rate")})
    assert res["coding_pays"] and res["best"]["s"] > 0
    assert "coding pays" in render(res, 3)
    calm = table(64, "shifted-exponential", s_values=[0, 1, 3, 7], samples=2000,
                 scale=1.0, rate=10.0)
    assert not calm["coding_pays"] and calm["best"]["s"] == 0
    assert "does NOT pay" in render(calm)


# ======== edges: exact values, bounds and messages ===============================================
def _slow_count(seed: int, n: int, p: float) -> int:
    """How many of clients 0..n-1 the persistent model slows (its rule, drawn here with numpy)."""
    return sum(np.random.default_rng([seed, w, 7]).random() < p for w in range(n))


def test_the_table_seeds_the_persistent_model_with_its_seed():
    # almost deterministic delays (rate 1e9): a slow client takes load * 100, a fast one load * 1,
    # so the (n-s)-th arrival is slow iff s < k (k slow clients) and uncoded waits for a slow one
    n, p, slowdown = 6, 0.5, 100.0
    seed = next(s for s in range(1, 50) if _slow_count(s, n, p) != _slow_count(0, n, p))
    k = _slow_count(seed, n, p)
    res = table(n, "persistent", s_values=[0, 1, 2, 3, 4, 5], samples=50, seed=seed, p=p,
                slowdown=slowdown, scale=1.0, rate=1e9)
    for row in res["rows"]:
        s = row["s"]
        assert row["exact (any n-s)"] == pytest.approx((s + 1) * (slowdown if s < k else 1.0),
                                                       rel=1e-6), s
        assert row["uncoded"] == pytest.approx(slowdown if k else 1.0, rel=1e-6)


class _OneSecond:
    """Every client takes exactly 1 s whatever its load (a deterministic stand-in model)."""

    load_scaled = False

    def sample(self, size, rng, load=1.0):
        return np.ones(size)


def test_a_code_that_only_ties_uncoded_does_not_pay(monkeypatch):
    import fl_gradcode.calculator as calculator

    monkeypatch.setattr(calculator, "make_latency", lambda name, seed, **kw: _OneSecond())
    res = table(4, "stand-in", s_values=[1], samples=10)
    assert res["best"] == {"s": 1, "code": "exact (any n-s)", "time": 1.0, "speedup": 1.0}
    assert res["coding_pays"] is False


def test_render_writes_the_table_line_by_line():
    result = {
        "n": 4, "latency": "none", "model_args": {}, "partition_cost": 0.0,
        "rows": [
            {"s": 0, "load": 1, "uncoded": 2.0, "ignore-stragglers": 2.0,
             "exact (any n-s)": 2.0, "frc": 2.0},
            {"s": 1, "load": 2, "uncoded": 2.0, "ignore-stragglers": 1.5,
             "exact (any n-s)": 1.0, "frc": None},
        ],
        "best": {"s": 1, "code": "exact (any n-s)", "time": 1.0, "speedup": 2.0},
        "coding_pays": True,
    }
    expected = [
        "n=4, latency=none {}, partition cost 0.0",
        "   s  load   uncoded  ignore(n-s)   any n-s       frc  any n-s speedup",
        "   0    1x     2.000        2.000     2.000     2.000          1.00x",
        "   1    2x     2.000        1.500     1.000         -          2.00x  <-",
        "best exact choice: exact (any n-s) with s=1 (E[T]=1.000, 2.00x vs uncoded) "
        "-> coding pays",
    ]
    assert render(result, highlight=1).splitlines() == expected
    assert render(result).splitlines()[3] == expected[3].removesuffix("  <-")


def test_the_preset_prints_its_note_and_marks_its_s(capsys, tmp_path):
    out = tmp_path / "preset.json"
    result = main(["--preset", "seeds-64", "--samples", "200", "--json", str(out)])
    # the preset, spelled out: 64 workers, bimodal, 5% slowed 10x, s in {0, 1, 3, 7, 15}
    assert result == table(64, "bimodal", s_values=[0, 1, 3, 7, 15], partition_cost=0.0,
                           samples=200, seed=0, p=0.05, slowdown=10.0, scale=1.0, rate=1.0)
    text = capsys.readouterr().out.splitlines()
    assert text[0] == "64 workers, 5% stragglers slowed 10x, s=3 (every partition stored 4x)"
    marked = [line.split()[0] for line in text if line.endswith("<-")]
    assert marked == ["3"]
    assert out.read_text() == json.dumps(result, indent=2)


def test_every_command_line_option_reaches_the_table(capsys, tmp_path):
    out = tmp_path / "t.json"
    result = main(["--n", "8", "--latency", "pareto", "--scale", "2", "--rate", "3",
                   "--shape", "1.5", "--p", "0.25", "--slowdown", "4", "--partition-cost", "0.5",
                   "--s", "1,3", "--samples", "100", "--seed", "5", "--json", str(out)])
    args = {"scale": 2.0, "rate": 3.0, "shape": 1.5, "p": 0.25, "slowdown": 4.0}
    assert result["model_args"] == args
    assert all(type(v) is float for v in result["model_args"].values())
    assert result == table(8, "pareto", s_values=[1, 3], partition_cost=0.5, samples=100,
                           seed=5, **args)
    assert json.loads(out.read_text()) == result
    assert "n=8, latency=pareto" in capsys.readouterr().out


def test_the_command_line_defaults(tmp_path):
    out = tmp_path / "d.json"
    result = main(["--json", str(out)])
    # defaults: 64 bimodal clients, 5% slowed 10x, shift 1, rate 1, shape 2, no compute cost,
    # 4000 rounds, seed 0, s spread {0, 1, 2, 3, n/16, n/8, n/4, n/2}
    expected = table(64, "bimodal", s_values=[0, 1, 2, 3, 4, 8, 16, 32], partition_cost=0.0,
                     samples=4000, seed=0, scale=1.0, rate=1.0, shape=2.0, p=0.05,
                     slowdown=10.0)
    assert result == expected
    assert [type(r["s"]) for r in result["rows"]] == [int] * 8
    assert json.loads(out.read_text()) == expected
    small = main(["--n", "10", "--samples", "20"])
    assert [r["s"] for r in small["rows"]] == [0, 1, 2, 3, 5]


def test_help_describes_the_calculator_and_its_options(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "Does coding pay? Expected round time and speedup per straggler tolerance" in text
    for words in ("--scale SCALE shift / Pareto scale --rate RATE --shape SHAPE Pareto shape "
                  "--p P fraction of slow clients --slowdown SLOWDOWN",
                  "--s S comma list of s (default: a spread up to n-1) --samples"):
        assert words in text, words
