"""The launcher's comparison table names what each run is and how it was timed: an
asynchronous run (server steps, no exact rounds) and wallclock runs (wall-clock time)."""

from __future__ import annotations

import pytest

from fl_gradcode.results import ROUND_FIELDS, RoundRecorder


def test_compare_says_an_asynchronous_run_is_one_and_counts_no_exact_rounds(tmp_path):
    """A run of ``asynchronous=true`` has server steps (decode ``buffered``), not coded
    rounds: the table must not call it gradient coding of its code, nor count 0 exact
    rounds."""
    from server.launch import compare

    finals = {"coded": [0.5, 0.9], "uncoded": [0.4, 0.8]}
    for name, accuracy in finals.items():
        rec = RoundRecorder(tmp_path / name, {"code": "grouped-rs", "s": 1, "asynchronous":
                                              name == "coded", "buffer-size": 3,
                                              "server-steps": 2, "straggler-timeout": 2.0})
        for r, acc in enumerate(accuracy, start=1):
            rec.record({**{k: 0 for k in ROUND_FIELDS}, "round": r,
                        "decode": "buffered" if name == "coded" else "exact",
                        "accuracy": acc, "virtual_s": 2.0 * r, "bytes_up": 10**6,
                        "compute_s": 0.5, "late_dropped": 0})
    text = compare(tmp_path / "coded", tmp_path / "uncoded")
    assert ("coded: asynchronous: FedBuff over partitions held by s + 1 = 2 clients, a server "
            "step every 3 updates, 2 steps") in text
    assert "code=grouped-rs" not in text
    row = next(line.split() for line in text.splitlines() if line.startswith("coded "))
    assert row[6] == "n/a"
    assert "virtual time):" in text  # the runs' config says no timing: virtual


def test_compare_says_wallclock_runs_are_timed_in_wall_clock_time(tmp_path):
    from server.launch import compare

    for name in ("coded", "uncoded"):
        rec = RoundRecorder(tmp_path / name, {"code": "grouped-rs", "s": 1,
                                              "timing": "wallclock",
                                              "straggler-timeout": 2.0})
        rec.record({**{k: 0 for k in ROUND_FIELDS}, "round": 1, "decode": "exact",
                    "accuracy": 0.5, "virtual_s": 2.0, "bytes_up": 10**6, "compute_s": 0.5,
                    "late_dropped": 0})
    text = compare(tmp_path / "coded", tmp_path / "uncoded")
    assert "wall-clock time):" in text and "virtual time" not in text


@pytest.mark.parametrize(("margin", "said"), [
    ({}, ""), ({"replicate-margin": 2.0}, " by more than 2 sd"),
    ({"need-ratio": 1.5}, " (1x when its last update was over 1.5x the own's)"),
    ({"need-ratio": 2.0, "need-latch": True},
     " (1x once when its last update was over 2x the own's)"),
    ({"need-ratio": 2.0, "need-latch": True, "need-reference": "era"},
     " (1x once when its recent updates were over 2x their era's)"),
    ({"need-ratio": 2.0, "need-latch": True, "need-reference": "cohort", "need-prior": True},
     " (1x once when its recent updates were over 2x their cohort's era's, and until read "
     "twice)")])
def test_compare_names_the_bar_of_an_asynchronous_run_that_set_one(tmp_path, margin, said):
    from server.launch import compare

    for name in ("coded", "uncoded"):
        rec = RoundRecorder(tmp_path / name, {"code": "grouped-rs", "s": 1, "asynchronous":
                                              name == "coded", "buffer-size": 3,
                                              "server-steps": 2, "replicate-below": 0.5,
                                              "s-asked": "auto", "straggler-timeout": 2.0,
                                              **margin})
        rec.record({**{k: 0 for k in ROUND_FIELDS}, "round": 1, "decode": "exact",
                    "accuracy": 0.9, "virtual_s": 2.0, "bytes_up": 10**6, "compute_s": 0.5,
                    "late_dropped": 0})
    text = compare(tmp_path / "coded", tmp_path / "uncoded")
    assert ("held by s + 1 = 2 clients, a neighbour's partition served while below 0.5x a "
            f"client's own{said} (s='auto'), a server step every 3 updates") in text


@pytest.mark.parametrize(("asked", "said"), [
    ("auto", ", the held partition served least so far (s='auto'), a server step"),
    (1, ", a server step")])
def test_compare_names_the_least_served_rule_when_s_auto_runs_it(tmp_path, asked, said):
    from server.launch import compare

    for name in ("coded", "uncoded"):
        rec = RoundRecorder(tmp_path / name, {"code": "grouped-rs", "s": 1, "asynchronous":
                                              name == "coded", "buffer-size": 3,
                                              "server-steps": 2, "replicate-below": 1.0,
                                              "s-asked": asked, "straggler-timeout": 2.0})
        rec.record({**{k: 0 for k in ROUND_FIELDS}, "round": 1, "decode": "exact",
                    "accuracy": 0.9, "virtual_s": 2.0, "bytes_up": 10**6, "compute_s": 0.5,
                    "late_dropped": 0})
    assert f"held by s + 1 = 2 clients{said} every 3 updates" in compare(tmp_path / "coded",
                                                                         tmp_path / "uncoded")


def _asynchronous_table(root, coded_s: float, fedbuff_s: float) -> str:
    """The table of an asynchronous coded run, FedBuff and wait-for-all (8 s), each one
    evaluation at 0.9 after the given virtual seconds."""
    from server.launch import compare

    for name, seconds in (("coded", coded_s), ("fedbuff", fedbuff_s), ("uncoded", 8.0)):
        rec = RoundRecorder(root / name, {"code": "grouped-rs", "s": 1 if name == "coded"
                                          else 0, "asynchronous": name != "uncoded",
                                          "buffer-size": 3, "server-steps": 1,
                                          "straggler-timeout": 2.0})
        rec.record({**{k: 0 for k in ROUND_FIELDS}, "round": 1, "decode": "exact",
                    "accuracy": 0.9, "virtual_s": seconds, "bytes_up": 10**6,
                    "compute_s": 0.5, "late_dropped": 0})
    return compare(root / "coded", root / "uncoded", None, root / "fedbuff")


def test_the_table_reads_an_asynchronous_run_against_fedbuff_and_says_whose_gain(tmp_path):
    text = _asynchronous_table(tmp_path, coded_s=1.0, fedbuff_s=2.0)
    assert "fedbuff: FedBuff itself (asynchronous, s = 0" in text
    assert "coding reached 0.900 2.00x sooner than fedbuff" in text
    assert "coding reached 0.900 8.00x sooner than uncoded" in text
    assert "against fedbuff, replication's alone" in text
    # without the FedBuff run the attribution line is not given
    from server.launch import compare

    assert "replication's alone" not in compare(tmp_path / "coded", tmp_path / "uncoded")


def test_the_table_reads_rounds_against_fedbuff_and_says_where_coding_does_not_pay(tmp_path):
    from server.launch import compare

    for name, seconds, cfg in (
            ("coded", 4.0, {"code": "grouped-rs", "s": 1, "straggler-timeout": 2.0}),
            ("uncoded", 8.0, {"code": "uncoded", "s": 0}),
            ("fedbuff", 2.0, {"code": "grouped-rs", "s": 0, "asynchronous": True,
                              "buffer-size": 3, "server-lr": 1.0, "server-steps": 40})):
        rec = RoundRecorder(tmp_path / name, cfg)
        rec.record({**{k: 0 for k in ROUND_FIELDS}, "round": 1, "decode": "exact",
                    "accuracy": 0.9, "virtual_s": seconds, "bytes_up": 10**6,
                    "compute_s": 0.5, "late_dropped": 0})
    text = compare(tmp_path / "coded", tmp_path / "uncoded", None, tmp_path / "fedbuff")
    assert ("fedbuff: FedBuff (buffered asynchronous aggregation, Nguyen et al. 2022), a "
            "server step every 3 updates at server lr 1.0, 40 steps, untuned") in text
    assert ("coding was 2.00x slower to 0.900 than fedbuff (finals 0.900, 0.900): here it does "
            "not pay") in text
    assert "coding reached 0.900 2.00x sooner than uncoded" in text
    assert "replication's alone" not in text  # rounds: no attribution line
    # rounds that lose to FedBuff say how to run this library's asynchronous mode instead
    assert "add asynchronous=true s='auto' to --run-config" in text
    # how FedBuff's settings were chosen is the launcher's to say, and the label says it
    tuned = compare(tmp_path / "coded", tmp_path / "uncoded", None, tmp_path / "fedbuff",
                    "tuned on development seeds 0, 1")
    assert "40 steps, tuned on development seeds 0, 1" in tuned and "untuned" not in tuned


def test_fedbuffs_final_does_not_set_the_target_of_the_other_rows(tmp_path):
    """FedBuff's run ends when its updates are spent: a lower final of its own leaves the
    target at the lowest final of the others, and the table says it did not reach it."""
    from server.launch import compare

    for name, curve in (("coded", [(1.0, 0.7), (2.0, 0.9)]), ("uncoded", [(4.0, 0.8)]),
                        ("fedbuff", [(0.5, 0.6), (1.5, 0.75)])):
        rec = RoundRecorder(tmp_path / name, {"code": "grouped-rs", "s": 1})
        for i, (seconds, accuracy) in enumerate(curve, start=1):
            rec.record({**{k: 0 for k in ROUND_FIELDS}, "round": i, "decode": "exact",
                        "accuracy": accuracy, "virtual_s": seconds, "bytes_up": 10**6,
                        "compute_s": 0.5, "late_dropped": 0})
    text = compare(tmp_path / "coded", tmp_path / "uncoded", None, tmp_path / "fedbuff")
    assert "time to accuracy 0.800" in text and "(but FedBuff's" in text
    assert "coding reached 0.800 2.00x sooner than uncoded" in text
    assert "fedbuff did not reach 0.800" in text and "here at 1.50 s" in text
    assert max(map(len, text.splitlines()[:-1])) <= 100  # one screen (but the figure's path)


def test_only_rounds_that_lose_to_fedbuff_are_told_how_to_run_asynchronously(tmp_path):
    from server.launch import compare

    def runs(root, coded_s, asynchronous):
        for name, seconds in (("coded", coded_s), ("uncoded", 8.0), ("fedbuff", 2.0)):
            rec = RoundRecorder(root / name, {"code": "grouped-rs", "s": 1 if name == "coded"
                                              else 0, "buffer-size": 3, "server-steps": 1,
                                              "asynchronous": name == "fedbuff" or asynchronous,
                                              "server-lr": 1.0, "straggler-timeout": 2.0})
            rec.record({**{k: 0 for k in ROUND_FIELDS}, "round": 1, "accuracy": 0.9,
                        "decode": "buffered" if name != "uncoded" and (
                            name == "fedbuff" or asynchronous) else "exact",
                        "virtual_s": seconds, "bytes_up": 10**6, "compute_s": 0.5,
                        "late_dropped": 0})
        return compare(root / "coded", root / "uncoded", None, root / "fedbuff")

    hint = "add asynchronous=true s='auto' to --run-config"
    assert hint in runs(tmp_path / "a", 4.0, False)  # rounds, slower than FedBuff
    assert hint not in runs(tmp_path / "b", 1.0, False)  # rounds, sooner than FedBuff
    slower_async = runs(tmp_path / "c", 4.0, True)  # already asynchronous, and slower
    assert "here it does not pay" in slower_async and hint not in slower_async
    # where the launcher found the asynchronous app would refuse the job's keys: not said

    refused = compare(tmp_path / "a" / "coded", tmp_path / "a" / "uncoded", None,
                      tmp_path / "a" / "fedbuff", async_hint=None)
    assert "here it does not pay" in refused and "to --run-config" not in refused
    # with FedBuff's tuned keys, the hint gives them: the mode then runs what FedBuff ran
    tuned = compare(tmp_path / "a" / "coded", tmp_path / "a" / "uncoded", None,
                    tmp_path / "a" / "fedbuff", async_tuned="server-lr=2.0 buffer-size=1")
    assert (f"{hint}\n   with server-lr=2.0 buffer-size=1, the fedbuff run's tuned settings, "
            "against FedBuff)") in tuned
    assert all(len(line) <= 100 for line in tuned.splitlines() if "--run-config" in line
               or "tuned settings" in line)


def test_the_hint_is_given_only_where_the_asynchronous_app_would_run_the_job():
    from server.launch import async_hint, override_values, parse_overrides, preset_overrides

    def hint(text):
        return async_hint(override_values(parse_overrides(text)))

    assert hint("") == hint("num-rounds=5") == "asynchronous=true s='auto'"
    assert hint("dp='partition'") is None  # no DP in asynchronous runs
    assert hint("straggler-timeout=2.0") is None  # a round's deadline: refused there
    assert hint(preset_overrides("coding-wins")) is None  # its hand-set deadline
    assert hint("asynchronous=true") is None  # already asynchronous


@pytest.mark.parametrize(("lagged", "said"), [
    ([None, 1.5], " (it did at 1.50 s)"), ([None, None], " (it never did)")])
def test_compare_says_whether_the_class_reading_switched(tmp_path, lagged, said):
    """s='auto' (the class reading): FedBuff until it trips, then the least-served rule; the
    label reads when it switched from the run's rows."""
    from server.launch import compare

    for name in ("coded", "uncoded"):
        rec = RoundRecorder(tmp_path / name, {"code": "grouped-rs", "s": 1, "asynchronous":
                                              name == "coded", "buffer-size": 3,
                                              "server-steps": 2, "replicate-below": 0.0,
                                              "lag-level": 0.9, "s-asked": "auto",
                                              "straggler-timeout": 2.0})
        for step, when in enumerate(lagged, start=1):
            rec.record({**{k: 0 for k in ROUND_FIELDS}, "round": step, "decode": "exact",
                        "accuracy": 0.9, "virtual_s": 2.0 * step, "bytes_up": 10**6,
                        "compute_s": 0.5, "late_dropped": 0,
                        **({"lagged_at": when} if name == "coded" else {})})
    text = compare(tmp_path / "coded", tmp_path / "uncoded")
    assert ("held by s + 1 = 2 clients, each client its own partition (FedBuff) until the "
            "median class recall reached 0.9 with a class never learnt, then the held "
            f"partition served least so far{said} (s='auto'), a server step every 3 "
            "updates") in text


def _class_reading_table(tmp_path, extra) -> str:
    from server.launch import compare

    for name in ("coded", "uncoded"):
        rec = RoundRecorder(tmp_path / name, {"code": "grouped-rs", "s": 1, "asynchronous":
                                              name == "coded", "buffer-size": 3,
                                              "server-steps": 1, "replicate-below": 0.0,
                                              "lag-level": 0.9, "straggler-timeout": 2.0,
                                              **extra})
        rec.record({**{k: 0 for k in ROUND_FIELDS}, "round": 1, "decode": "exact",
                    "accuracy": 0.9, "virtual_s": 2.0, "bytes_up": 10**6, "compute_s": 0.5,
                    "late_dropped": 0, **({"lagged_at": None} if name == "coded" else {})})
    return compare(tmp_path / "coded", tmp_path / "uncoded")


def test_compare_names_a_need_rule_beside_the_class_reading(tmp_path):
    """A class reading with the bar 0 beside a need rule: the need rule lifts a partition's
    bar before the switch, so the label names both, not FedBuff alone until the switch."""
    text = _class_reading_table(tmp_path, {"need-ratio": 1.5})
    assert "(1x when its last update was over 1.5x the own's)" in text
    assert "each client its own partition (FedBuff) until" not in text
    assert ("every partition served as much once the median class recall reached 0.9 with a "
            "class never learnt (it never did)") in text


def test_compare_puts_the_margin_after_the_switch_of_the_class_reading(tmp_path):
    """With the bar 0 a margin changes nothing before the class reading switches (nothing is
    below 0x); after it, the bar is 1 and the margin is what holds replication back."""
    text = _class_reading_table(tmp_path, {"replicate-margin": 2.0})
    assert ("each client its own partition (FedBuff) until the median class recall reached "
            "0.9 with a class never learnt, then a neighbour's partition served while below "
            "1x a client's own by more than 2 sd (it never did)") in text
    assert "below 0x" not in text


@pytest.mark.parametrize(("coded_s", "fedbuff_s", "said"), [
    (2.004, 2.001, "coding reached 0.900 at the same time as fedbuff"),
    (4.03, 4.01, "coding was 0.02 s slower to 0.900 than fedbuff"),
    (4.01, 4.03, "coding reached 0.900 0.02 s sooner than fedbuff"),
    (4.0149, 4.0151, "coding reached 0.900 0.01 s sooner than fedbuff"),  # 4.01 s, 4.02 s
    (4.0251, 4.0149, "coding was 0.02 s slower to 0.900 than fedbuff")])  # 4.03 s, 4.01 s
def test_times_the_table_shows_alike_are_a_tie_and_a_gap_under_half_a_percent_in_seconds(
        tmp_path, coded_s, fedbuff_s, said):
    # the table shows times to 0.01 s: two it shows alike were called "1.00x slower"
    text = _asynchronous_table(tmp_path, coded_s=coded_s, fedbuff_s=fedbuff_s)
    assert said in text and "1.00x" not in text


def test_a_tie_is_said_as_a_tie_not_as_coding_being_slower(tmp_path):
    # the asynchronous s='auto' runs as FedBuff until its class reading switches: where it
    # never does, both runs reach the target at the same virtual time
    text = _asynchronous_table(tmp_path, coded_s=2.0, fedbuff_s=2.0)
    assert "coding reached 0.900 at the same time as fedbuff" in text
    assert "slower to 0.900 than fedbuff" not in text and "does not pay" not in text


def test_a_round_deadline_the_user_set_is_named_to_leave_out_not_a_reason_for_no_hint(
        tmp_path, monkeypatch):
    # the launcher's own deadline line says to add straggler-timeout; with it set, the
    # asynchronous suggestion vanished (the asynchronous app refuses a round's deadline)
    from server.launch import compare
    from tests.integration.launching import launch_main

    launch_main(tmp_path / "a", monkeypatch, ["--run-config", "straggler-timeout=3.0"])
    keywords = launch_main.keywords[0]
    assert keywords["async_hint"] == "asynchronous=true s='auto'"
    assert keywords["async_without"] == "straggler-timeout=3.0"
    # a preset's deadline is its regime's: no hint, as before
    launch_main(tmp_path / "b", monkeypatch, ["--preset", "coding-wins"])
    assert launch_main.keywords[0]["async_hint"] is None
    assert launch_main.keywords[0]["async_without"] is None
    # nor where another key keeps the asynchronous app from the job
    launch_main(tmp_path / "c", monkeypatch, ["--run-config",
                                              "straggler-timeout=3.0 dp='partition'"])
    assert launch_main.keywords[0]["async_hint"] is None
    # the table's line names it, each line within 100 characters
    for name, seconds in (("coded", 4.0), ("uncoded", 8.0), ("fedbuff", 1.0)):
        rec = RoundRecorder(tmp_path / "t" / name, {
            "code": "grouped-rs", "s": 0 if name == "fedbuff" else 1,
            "asynchronous": name == "fedbuff", "buffer-size": 3, "server-steps": 1,
            "straggler-timeout": 3.0})
        rec.record({**{k: 0 for k in ROUND_FIELDS}, "round": 1, "decode": "approximate"
                    if name == "fedbuff" else "exact", "accuracy": 0.9, "virtual_s": seconds,
                    "bytes_up": 10**6, "compute_s": 0.5, "late_dropped": 0})
    text = compare(tmp_path / "t" / "coded", tmp_path / "t" / "uncoded", None,
                   tmp_path / "t" / "fedbuff", async_tuned="server-lr=2.0 buffer-size=1",
                   async_without="straggler-timeout=3.0")
    assert ("add asynchronous=true s='auto' to --run-config\n   with server-lr=2.0 "
            "buffer-size=1, the fedbuff run's tuned settings,\n   and leave out "
            "straggler-timeout=3.0 (rounds' deadline), against FedBuff)") in text
    assert all(len(line) <= 100 for line in text.splitlines() if "leave out" in line)
