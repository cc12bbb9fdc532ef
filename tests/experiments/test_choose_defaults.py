"""``python -m experiments.choose_defaults --quick``: the JSON holds every candidate of the
grid file's rule with its per-regime per-seed ratios, and the recorded choice is the one the
rule gives on those ratios (recomputed here from the raw times, independently of the
script's own helpers)."""

from __future__ import annotations

import json
import math
import statistics
import tomllib
from pathlib import Path

import pytest
import torch

from experiments import choose_defaults

GRID = Path(__file__).resolve().parents[2] / "experiments" / "grid.toml"


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("defaults") / "defaults.json"
    threads = torch.get_num_threads()
    try:
        assert choose_defaults.main(["--quick", "--out", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    assert not out.with_name(out.stem + ".partial.json").exists()
    return json.loads(out.read_text())


def _number(value):
    return math.inf if value == "inf" else value


def test_the_json_holds_every_candidate_of_the_rule(quick):
    assert {"rule", "rule_reading", "settings", "candidates", "chosen", "current_defaults",
            "best_fixed_code", "fixed_code_time_to_target", "runtime_s"} <= set(quick)
    text = GRID.read_text()
    assert "The rule by which the main job's defaults" in quick["rule"]
    assert "Evaluation seeds never enter the choice." in quick["rule"]
    assert " ".join(quick["rule"].split()[:6]) in " ".join(text.replace("#", " ").split())
    space = tomllib.loads(text)["rules"]["defaults_candidates"]
    settings = quick["settings"]
    got = {(c["s-max"], c["auto-margin"]) for c in quick["candidates"]}
    assert got == {(s, m) for s in space["s-max"] for m in space["auto-margin"]}
    n = settings["n"]
    for c in quick["candidates"]:
        assert c["s_max_effective"] == (min(max(1, n // 4), n - 1) if c["s-max"] == 0
                                        else c["s-max"])
        for regime in settings["regimes"]:
            assert set(c["ratios"][regime]) == {str(s) for s in settings["seeds"]}
    from fl_gradcode.config.keys import key

    assert quick["current_defaults"]["s-max"] == key("s-max").default
    assert quick["current_defaults"]["auto-margin"] == key("auto-margin").default


def test_the_ratios_are_the_times_of_auto_over_the_best_fixed_code(quick):
    settings = quick["settings"]
    for c in quick["candidates"]:
        for regime in settings["regimes"]:
            for seed in map(str, settings["seeds"]):
                codes = quick["fixed_code_time_to_target"][regime][seed]
                assert set(codes) == set(settings["fixed_codes"])
                reached = [t for t in codes.values() if t is not None]
                best = min(reached) if reached else math.inf
                auto = c["time_to_target"][regime][seed]
                auto = math.inf if auto is None else auto
                got = _number(c["ratios"][regime][seed])
                if math.isinf(auto) and math.isinf(best):
                    assert got is None
                elif math.isinf(best):
                    assert got == 0.0
                elif math.isinf(auto):
                    assert got == math.inf
                else:
                    assert got == pytest.approx(auto / best)


def test_the_choice_follows_the_rule_on_the_recorded_ratios(quick):
    def median(c):
        values = [_number(v) for per_seed in c["ratios"].values() for v in per_seed.values()
                  if v is not None]
        if not values:
            return None
        values.sort()
        if len(values) % 2 == 0 and math.isinf(values[len(values) // 2]):
            return math.inf
        return statistics.median(values)

    rows = quick["candidates"]
    for c in rows:
        want = median(c)
        got = _number(c["median"])
        assert (got is None) if want is None else got == pytest.approx(want)
    ranked = sorted(rows, key=lambda c: (median(c) is None,
                                         math.inf if median(c) is None else median(c),
                                         c["s_max_effective"], c["auto-margin"]))
    best = ranked[0]
    chosen = quick["chosen"]
    assert (chosen["s-max"], chosen["auto-margin"]) == (best["s-max"], best["auto-margin"])
    now = quick["current_defaults"]
    current = next(c for c in rows if (c["s-max"], c["auto-margin"]) == (now["s-max"],
                                                                          now["auto-margin"]))
    assert _number(quick["current_defaults"]["median"]) == _number(current["median"])


def test_an_unfinished_run_with_other_settings_is_not_overwritten(tmp_path):
    out = tmp_path / "defaults.json"
    partial = tmp_path / "defaults.partial.json"
    partial.write_text(json.dumps({"settings": {"n": 20}, "done": {}}))
    with pytest.raises(SystemExit, match="unfinished run with other settings"):
        choose_defaults.main(["--quick", "--out", str(out)])
    assert json.loads(partial.read_text())["settings"] == {"n": 20}
