"""The client-cost and end-to-end benchmarks run at tiny sizes and write what they promise:
the JSON shape the docs read, and coded results that agree with the uncoded ones (no timed
assertion: the numbers are measurements, not properties)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.experiments.test_experiments_smoke import load

CLIENT_KEYS = {"params", "s", "wire", "app_partition_s", "coded_total_s", "plain_total_s",
               "mod_overhead_s", "mod_overhead_vs_partition", "mod_overhead_vs_app",
               "components_s", "peak_extra_bytes", "peak_extra_models", "reply_bytes",
               "plain_reply_bytes", "max_rel_error", "loadavg"}


def test_bench_client_quick_reply_is_the_numpy_combination_of_the_plain_replies(tmp_path):
    out = tmp_path / "client.json"
    result = load("bench_client").main(["--quick", "--out", str(out)])
    saved = json.loads(out.read_text())
    assert saved["rows"] == json.loads(json.dumps(result["rows"]))
    assert saved["command"].startswith("python -m experiments.bench_client")
    rows = {r["wire"]: r for r in saved["rows"]}
    assert set(rows) == {"model", "float64"}
    for row in rows.values():
        assert CLIENT_KEYS <= set(row)
        assert set(row["components_s"]) == {"deserialize", "encode", "serialize"}
        assert row["coded_total_s"] > 0 and row["app_partition_s"] > 0
    # the coded reply against sum_j B[0, j] n_j (theta_j - theta) computed from plain replies
    assert rows["float64"]["max_rel_error"] <= 1e-12
    assert rows["model"]["max_rel_error"] <= 1e-6
    # model-dtype replies are one FedAvg reply's size; float64 ones twice (headers aside)
    plain = rows["model"]["plain_reply_bytes"]
    assert rows["model"]["reply_bytes"] <= plain + 1024
    assert rows["float64"]["reply_bytes"] >= 1.9 * plain


def _check_end_to_end(saved: dict) -> None:
    _check_no_stragglers(saved)
    _check_stragglers_and_scale(saved)


def _check_no_stragglers(saved: dict) -> None:
    ns = saved["no_stragglers"]
    assert {"fedavg_round_s", "coded_round_s", "coded_vs_fedavg", "overhead_beyond_compute",
            "max_rel_diff_vs_fedavg", "decodes", "blocks", "command"} <= set(ns)
    assert {b["strategy"] for b in ns["blocks"]} == {"fedavg", "coded"}
    assert ns["decodes"] == ["exact"]
    assert ns["max_rel_diff_vs_fedavg"] <= 1e-5  # the coded model is FedAvg's


def _check_stragglers_and_scale(saved: dict) -> None:
    st = saved["stragglers"]
    assert st["clock"] == "virtual" and set(st["time_to_target_s"]) == {
        "coded", "wait_for_all", "drop_stragglers"}
    # the rival (Flower's FedAvg with a round deadline) ran on the same rounds and clock
    rival = st["runs"]["drop_stragglers"]["rows"]
    assert len(rival) == len(st["runs"]["coded"]["rows"]) and all(
        r["decode"] in ("all", "partial", "skipped") and r["virtual_round_s"] > 0
        for r in rival)
    assert 0 < st["drop_stragglers_deadline_s"] and set(st["final_accuracy"]) == set(
        st["time_to_target_s"])
    assert st["rel_diff_coded_vs_wait_for_all"] <= 1e-5
    coded, wait = st["runs"]["coded"]["rows"], st["runs"]["wait_for_all"]["rows"]
    assert [r["accuracy"] for r in coded] == pytest.approx([r["accuracy"] for r in wait])
    assert all(r["decode"] == "exact" for r in coded)
    # the virtual clock moves forward every round (per-round times are its differences)
    for rows in (coded, wait):
        assert all(r["virtual_round_s"] > 0 for r in rows)
        elapsed = [r["virtual_elapsed_s"] for r in rows]
        assert elapsed == pytest.approx(list(np.cumsum(
            [r["virtual_round_s"] for r in rows])))
    sc = saved["scale"]
    assert {"nodes", "cohort", "fedavg_round_s", "coded_round_s", "peak_rss_bytes",
            "coded_handshake_s", "app_compute_s",
            "blocks"} <= set(sc)
    assert set(sc["peak_rss_bytes"]) == {"fedavg", "coded"}
    assert all(v > 0 for v in sc["peak_rss_bytes"].values())
    assert sc["decodes"] == ["exact"]


def test_bench_end_to_end_quick_in_process_coded_rounds_equal_fedavgs(tmp_path):
    out = tmp_path / "e2e.json"
    load("bench_end_to_end").main(["--quick", "--engine", "inprocess", "--out", str(out)])
    saved = json.loads(out.read_text())
    assert saved["engine"] == "inprocess" and saved["quick"] is True
    _check_end_to_end(saved)


def test_bench_end_to_end_refuses_an_unknown_part(tmp_path, capsys):
    with pytest.raises(SystemExit):
        load("bench_end_to_end").main(["--parts", "no_stragglers,warp", "--out",
                                       str(tmp_path / "x.json")])
    assert "warp" in capsys.readouterr().err


@pytest.mark.simulation
def test_bench_end_to_end_quick_in_flowers_simulation_engine(tmp_path):
    """The benchmark's Flower-engine path: coded rounds alternating with FedAvg's in Ray
    train FedAvg's model. One part only (each part boots Ray, about a minute on two cores);
    every part's keys and numbers are checked with the in-process engine above."""
    out = tmp_path / "e2e.json"
    load("bench_end_to_end").main(["--quick", "--parts", "no_stragglers", "--out", str(out)])
    saved = json.loads(out.read_text())
    assert saved["engine"] == "ray" and "stragglers" not in saved
    _check_no_stragglers(saved)
