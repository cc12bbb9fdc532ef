"""experiments/first_hour.py: the three in-process runs, the JSON's shape, ratios from the rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments import first_hour

ROOT = Path(__file__).resolve().parents[2]


def _rows(times: list[float], accs: list[float]) -> list[dict]:
    return [{"round": i + 1, "virtual_s": t, "accuracy": a, "decode": "exact", "bytes_up": 1e6,
             "compute_s": 0.1, "late_dropped": 0}
            for i, (t, a) in enumerate(zip(times, accs, strict=True))]


def test_ratios_come_from_the_rows():
    rows = {
        "coded": _rows([1.0, 2.0, 3.0], [0.5, 0.8, 0.9]),
        "wait-for-all": _rows([3.0, 6.0, 9.0], [0.5, 0.7, 0.85]),
        "drop-stragglers": _rows([1.5, 3.0, 4.5], [0.6, 0.7, 0.8]),
    }
    row = first_hour.seed_row(rows, seed=4)
    assert row["target"] == 0.8  # the lowest final accuracy, as the main job's table
    assert row["coded"]["time_to"] == 2.0
    assert row["wait-for-all"]["time_to"] == 9.0
    assert row["drop-stragglers"]["time_to"] == 4.5
    assert row["speedup_vs_wait"] == pytest.approx(4.5)
    assert row["speedup_vs_drop"] == pytest.approx(2.25)
    assert first_hour.seed_wins(row)
    rows["wait-for-all"] = _rows([1.0, 2.0, 3.0], [0.5, 0.8, 0.85])
    slower = first_hour.seed_row(rows, seed=4)
    assert slower["speedup_vs_wait"] == pytest.approx(1.0)
    assert not first_hour.seed_wins(slower)


def test_rivals_leave_out_coded_only_keys_and_get_their_own():
    regime = {"s": "auto", "stop-late-work": True, "straggler-timeout": 2.0}
    assert first_hour.run_overrides("coded", regime) == regime
    wait = first_hour.run_overrides("wait-for-all", regime)
    assert wait == {"code": "uncoded", "s": 0, "straggler-timeout": 1000000.0}
    drop = first_hour.run_overrides("drop-stragglers", regime)
    assert drop == {"straggler-timeout": 2.0, "rival": "drop-stragglers"}


def test_tiny_exploration_has_the_documented_shape():
    regimes = {"tiny": {"straggler-timeout": 2.0, "virtual-compute": "none",
                        "partition-cost-s": 0.05}}
    result = first_hour.explore(regimes, [0], n=4, rounds=2, log=lambda _: None)
    assert result["seeds"] == [0]
    entry = result["regimes"]["tiny"]
    assert entry["run_config"]["num-rounds"] == 2
    (row,) = entry["per_seed"]
    assert row["seed"] == 0
    for name in first_hour.RUN_NAMES:
        assert row[name]["rounds"] == 2
        assert row[name]["final"] is not None
    coded, wait = row["coded"]["time_to"], row["wait-for-all"]["time_to"]
    assert row["speedup_vs_wait"] == pytest.approx(wait / coded)
    assert entry["median_speedup_vs_wait"] == pytest.approx(row["speedup_vs_wait"])
    assert entry["wins"] == row["wins"] == first_hour.seed_wins(row)
    recommended, losing = first_hour.pick(result)
    assert (recommended, losing) == (("tiny", None) if entry["wins"] else (None, "tiny"))


def test_regimes_run_over_the_pinned_base_not_todays_defaults(tmp_path, monkeypatch):
    """Every run gets BASE under its regime's overrides, so a regime means the runs the
    committed JSON measured whatever the defaults are now; the JSON records the base."""
    import json
    from types import SimpleNamespace

    from experiments import rival_runs

    seen = []
    ran = SimpleNamespace(history=[])
    monkeypatch.setattr(rival_runs, "start_coded", lambda cfg, n, **_: seen.append(cfg) or ran)
    monkeypatch.setattr(rival_runs, "start_rival",
                        lambda method, cfg, n, **_: seen.append(cfg) or ran)
    for name in first_hour.RUN_NAMES:
        first_hour.run_one(name, {"latency": "pareto"}, 5, 4, tmp_path)
    coded, wait, drop = seen
    assert {k: coded[k] for k in first_hour.BASE if k != "latency"} == {
        k: v for k, v in first_hour.BASE.items() if k != "latency"}
    assert coded["latency"] == wait["latency"] == drop["latency"] == "pareto"
    assert wait["virtual-compute"] == drop["virtual-compute"] == first_hour.BASE[
        "virtual-compute"]
    data = json.loads((ROOT / "results" / "first_hour.json").read_text())
    assert data["base"] == first_hour.BASE


def test_todays_defaults_are_the_base_with_the_recommended_regime():
    """All but the deadline: straggler-timeout follows the grid file's rule
    (tests/experiments/test_main_job_deadline.py)."""
    import json

    from fl_gradcode.config import DEFAULTS

    data = json.loads((ROOT / "results" / "first_hour.json").read_text())
    recommended = {**first_hour.BASE, **data["regimes"][data["recommended"]]["run_config"]}
    assert data["regimes"][data["recommended"]]["wins"]
    recommended.pop("straggler-timeout")
    assert {k: DEFAULTS[k] for k in recommended} == recommended
