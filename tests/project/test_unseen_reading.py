"""The ``unseen-check`` block reads amendment 33's settings with the verdict's rule, the
asynchronous ``s='auto'`` (``fedbuff-auto``) in ``auto``'s place: hand-made cells whose
medians are known."""

from __future__ import annotations

import json

from tools.docgen import unseen


def _runs(method, times, final=0.9, lagged=None):
    return [{"method": method, "seed": 20 + i, "time_to_target": t, "final_accuracy": final,
             **({"lagged_at": lagged} if method == "fedbuff-auto" else {})}
            for i, t in enumerate(times)]


def _write(tmp_path, monkeypatch, cells):
    (tmp_path / unseen.FILE).write_text(json.dumps({"seeds": "20-24", "quick": False,
                                                    "cells": cells}))
    monkeypatch.setattr(unseen, "RESULTS", tmp_path)
    monkeypatch.setattr(unseen, "load", lambda name: json.loads((tmp_path / name).read_text()))


def test_the_block_reads_each_setting_against_the_best_rival(tmp_path, monkeypatch):
    # a: fedbuff-auto's median 1.0 = FedBuff's, the best rival (met); auto's 3.0 is 3.00x
    # FedBuff's (not met);
    # b: fedbuff-auto 1.2 against FedBuff 1.0 (1.20x, not met); it switched on every seed;
    # c: fedbuff-auto's final 0.8 is more than 0.5 point below FedBuff's 0.9: not met
    a = {"runs": [*_runs("fedbuff-auto", [1.0, 0.9, 1.1]), *_runs("fedbuff", [1.0, 0.9, 1.1]),
                  *_runs("first-k", [2.0, 2.0, 2.0]), *_runs("auto", [3.0, 3.0, 3.0])]}
    b = {"runs": [*_runs("fedbuff-auto", [1.2, 1.2, 1.2], lagged=0.5),
                  *_runs("fedbuff", [1.0, 1.0, 1.0]), *_runs("auto", [1.0, 1.0, 1.0])]}
    c = {"runs": [*_runs("fedbuff-auto", [1.0, 1.0, 1.0], final=0.8),
                  *_runs("fedbuff", [1.0, 1.0, 1.0]), *_runs("wait-for-all", [9.0, None, 9.0])]}
    # persistent stragglers on the key table's Dirichlet partitions: a and d are "hard";
    # d: fedbuff-auto 1.0 against FedBuff's 3.0, the best rival that does not code (3.00x)
    hard = {"latency": "persistent", "run_config": {}}
    d = {"settings": hard,
         "runs": [*_runs("fedbuff-auto", [1.0, 1.0, 1.0]), *_runs("fedbuff", [3.0, 3.0, 3.0]),
                  *_runs("grouped-rs:1", [0.5, 0.5, 0.5]), *_runs("auto", [4.0, 4.0, 4.0])]}
    a["settings"] = hard
    b["settings"] = {"latency": "bimodal", "run_config": {}}
    _write(tmp_path, monkeypatch, {"a": a, "b": b, "c": c, "d": d})
    text = unseen.unseen_check()
    assert "met the goal (median time within 1.05× of the best rival's" in text
    assert "in 1 of 4; the synchronous `auto` in 1." in text  # b's auto ties FedBuff
    # d misses the goal (grouped-rs:1 is twice as fast) but is 3x the best uncoded rival
    assert ("(2 of the settings), it was at least 2× faster than the best rival that does not "
            "code (wait-for-all, deadline-best, first-k, FedBuff) in 1 of 2: a 1.00× (FedBuff); "
            "d 3.00× (FedBuff).") in text
    assert "| a | 1.0 s (3/3) | 1.00× FedBuff's: met | 3.0 s (3/3) | 3.00× FedBuff's: not met" \
        in text
    assert "| b | 1.2 s (3/3) | 1.20× FedBuff's: not met |" in text and "| 3 of 3 |" in text
    assert ("| c | 1.0 s (3/3) | 1.00× FedBuff's, final accuracy more than 0.5 point below: "
            "not met |") in text
    # a's fedbuff-auto runs are FedBuff's seed by seed; c's never switched but differ
    # (another final accuracy), d's differ in time: only a "ran as FedBuff itself"
    assert "In 1 of the 4 it never switched and its runs were FedBuff's" in text
    assert "| a | 1.0 s (3/3) |" in text and text.count("(FedBuff's runs)") == 1
    sentence = unseen.headline_sentence()
    assert "it met the goal in 1 of 4 (in 1 of them it never switched" in sentence
    assert "`auto` in 1" in sentence


def test_an_unreached_seed_counts_as_never_in_the_median(tmp_path, monkeypatch):
    # fedbuff-auto [1, 1, never]: median 1.0; FedBuff [0.5, never, never]: median never, so
    # fedbuff-auto is the only one with a finite median: "∞ (only it reached the target)"
    cell = {"settings": {"latency": "pareto", "run_config": {}},
            "runs": [*_runs("fedbuff-auto", [1.0, 1.0, None]),
                     *_runs("fedbuff", [0.5, None, None])]}
    _write(tmp_path, monkeypatch, {"e": cell})
    text = unseen.unseen_check()
    assert "| e | 1.0 s (2/3) | 0.00× FedBuff's: met |" not in text
    assert "| e | 1.0 s (2/3) | only it reached the target, never FedBuff's: met |" in text
    assert "e ∞ (only it reached the target; FedBuff)" in text
    # and where it never reached the target, no ratio is made up
    cell["runs"] = [*_runs("fedbuff-auto", [None, None, 1.0]), *_runs("fedbuff", [None] * 3)]
    _write(tmp_path, monkeypatch, {"e": cell})
    text = unseen.unseen_check()
    assert "neither reached the target, FedBuff's: met" in text
    assert "e never reached the target (FedBuff)" in text


def test_no_file_no_block_and_a_quick_file_no_headline(tmp_path, monkeypatch):
    monkeypatch.setattr(unseen, "RESULTS", tmp_path)
    assert unseen.unseen_check() is None and unseen.headline_sentence() == ""
    _write(tmp_path, monkeypatch, {"a": {"runs": _runs("fedbuff-auto", [1.0])}})
    data = json.loads((tmp_path / unseen.FILE).read_text())
    (tmp_path / unseen.FILE).write_text(json.dumps({**data, "quick": True}))
    assert unseen.headline_sentence() == ""
    assert "quick slice, not a reading" in unseen.unseen_check()
