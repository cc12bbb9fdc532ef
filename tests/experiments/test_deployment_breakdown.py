"""experiments/deployment_breakdown.py: the SuperNode log parser and the per-round decomposition
(fast, synthetic stamps), and a short run on Flower's deployment engine on localhost."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load():
    from experiments import deployment_breakdown

    return deployment_breakdown


def _t(clock: str) -> float:
    return datetime.strptime(f"2026-01-01 {clock}", "%Y-%m-%d %H:%M:%S,%f").timestamp()


def test_supernode_log_gives_arrival_and_departure_of_each_message(tmp_path):
    log = tmp_path / "supernode0.log"
    log.write_text(
        "\x1b[92mINFO 2026-01-01 10:00:01,000\x1b[0m:      Receiving: train message (ID: aa11)\n"
        "\x1b[92mINFO 2026-01-01 10:00:01,100\x1b[0m:      Received successfully\n"
        "\x1b[94mDEBUG 2026-01-01 10:00:02,500\x1b[0m:     Start `flwr-clientapp` process\n"
        "DEBUG 2026-01-01 10:00:02,900:     [flwr-clientapp] Start FAB installation.\n"
        "INFO 2026-01-01 10:00:03,000:      Sending: train message (ID: bb22)\n"
        "INFO 2026-01-01 10:00:03,250:      Sent successfully\n"
        "INFO :      an undated line\n"
    )
    events = load().supernode_events(log)
    assert events["aa11"]["received"] == pytest.approx(_t("10:00:01,000"))
    assert events["aa11"]["fetched"] == pytest.approx(_t("10:00:01,100"))
    assert events["aa11"]["clientapp_booted"] == pytest.approx(_t("10:00:02,500"))
    assert events["aa11"]["clientapp_task_pulled"] == pytest.approx(_t("10:00:02,900"))
    assert events["bb22"] == {"sending": pytest.approx(_t("10:00:03,000")),
                              "sent": pytest.approx(_t("10:00:03,250"))}


def test_a_round_is_decomposed_along_its_last_arriving_reply():
    mod = load()
    server = {"events": [
        {"event": "configure_train", "round": 1, "t0": 0.0, "t1": 0.1, "sent": 2},
        {"event": "push", "t0": 0.1, "t1": 0.2, "message_id": "i1", "node_id": 1},
        {"event": "push", "t0": 0.1, "t1": 0.2, "message_id": "i2", "node_id": 2},
        {"event": "pull", "t0": 5.0, "t1": 5.1, "message_id": "r1", "reply_to": "i1"},
        {"event": "on_reply", "t0": 5.1, "t1": 5.2, "message_id": "r1"},
        {"event": "pull", "t0": 7.0, "t1": 7.1, "message_id": "r2", "reply_to": "i2"},
        {"event": "on_reply", "t0": 7.1, "t1": 7.2, "message_id": "r2"},
        {"event": "aggregate_train", "round": 1, "t0": 7.2, "t1": 7.5, "replies": 2},
    ]}
    clients = [
        {"message_id": "i1", "process_start": 1.5, "entry": 3.0, "exit": 4.0,
         "import_torch_s": 0.5, "import_gc_s": 0.2, "train_calls": [[3.7, 3.9]],
         "partition_id": 0, "module_start": 2.9, "module_imported": 2.95},
        {"message_id": "i2", "process_start": 2.0, "entry": 4.0, "exit": 6.0,
         "import_torch_s": 1.0, "import_gc_s": 0.5, "train_calls": [[5.5, 5.9]],
         "partition_id": 1, "module_start": 3.9, "module_imported": 3.95},
    ]
    nodes = {
        "i1": {"received": 1.0, "fetched": 1.2}, "r1": {"sending": 4.5, "sent": 4.8},
        "i2": {"received": 1.5, "fetched": 1.7}, "r2": {"sending": 6.5, "sent": 6.9},
    }
    (row,) = mod.breakdown(server, clients, nodes)["rounds"]
    assert row["critical_node_partition"] == 1
    assert row["round_s"] == pytest.approx(7.5)
    assert row["flower_poll_s"] == pytest.approx(1.3)
    assert row["superexec_poll_s"] == pytest.approx(0.5)  # from "received": fetch overlaps
    assert row["fetch_s"] == pytest.approx(0.2)
    assert row["clientapp_start_s"] == pytest.approx(2.0)
    assert row["mod_import_s"] == pytest.approx(1.5)
    assert row["client_train_s"] == pytest.approx(0.4)
    assert row["mod_overhead_s"] == pytest.approx(0.1)
    assert row["reply_return_s"] == pytest.approx(0.9)
    assert row["server_pull_wait_s"] == pytest.approx(0.2)
    assert row["server_on_reply_s"] == pytest.approx(0.1)  # r1's overlapped the wait
    assert sum(row[k] for k in mod.KEYS) == pytest.approx(row["round_s"])



def test_a_reply_sent_earlier_but_pulled_a_poll_later_is_the_critical_one():
    # Flower's FedAvg pulls every 3 s, and the SuperLink hands out a reply once its metadata is
    # pushed, before its node logs "Sent successfully" (after the contents' upload): r2 is
    # pulled at 7.0 while still uploading (sent 7.3), r1, done at 7.05, misses that poll and
    # comes at 10.0. The round waited for r1, and nothing is left unexplained
    mod = load()
    server = {"events": [
        {"event": "configure_train", "round": 1, "t0": 0.0, "t1": 0.1, "sent": 2},
        {"event": "push", "t0": 0.1, "t1": 0.2, "message_id": "i1", "node_id": 1},
        {"event": "push", "t0": 0.1, "t1": 0.2, "message_id": "i2", "node_id": 2},
        {"event": "pull", "t0": 7.0, "t1": 7.1, "message_id": "r2", "reply_to": "i2"},
        {"event": "pull", "t0": 10.0, "t1": 10.1, "message_id": "r1", "reply_to": "i1"},
        {"event": "aggregate_train", "round": 1, "t0": 10.1, "t1": 10.2, "replies": 2},
    ]}
    clients = [
        {"message_id": "i1", "process_start": 1.5, "entry": 3.0, "exit": 6.0,
         "train_calls": [[3.5, 5.5]], "partition_id": 0},
        {"message_id": "i2", "process_start": 2.0, "entry": 4.0, "exit": 6.5,
         "train_calls": [[4.5, 6.0]], "partition_id": 1},
    ]
    nodes = {
        "i1": {"received": 1.0}, "r1": {"sending": 6.2, "sent": 7.05},
        "i2": {"received": 1.5}, "r2": {"sending": 6.6, "sent": 7.3},
    }
    (row,) = mod.breakdown(server, clients, nodes)["rounds"]
    assert row["critical_node_partition"] == 0
    assert row["server_pull_wait_s"] == pytest.approx(10.1 - 7.05)
    assert row["other_s"] == pytest.approx(0.0, abs=1e-9)
    assert sum(row[k] for k in mod.KEYS) == pytest.approx(row["round_s"])

def test_a_node_that_receives_before_the_push_call_returns_has_no_negative_poll():
    # the SuperLink stores the message before its push call returns to the ServerApp, so a
    # node polling at that moment receives it first: the push's tail overlaps the poll, and
    # no interval may come out negative while the parts still sum to the round
    mod = load()
    server = {"events": [
        {"event": "configure_train", "round": 1, "t0": 0.0, "t1": 0.1, "sent": 1},
        {"event": "push", "t0": 0.1, "t1": 0.5, "message_id": "i1", "node_id": 1},
        {"event": "pull", "t0": 3.0, "t1": 3.1, "message_id": "r1", "reply_to": "i1"},
        {"event": "aggregate_train", "round": 1, "t0": 3.1, "t1": 3.2, "replies": 1},
    ]}
    clients = [{"message_id": "i1", "process_start": 0.6, "entry": 1.0, "exit": 2.0,
                "train_calls": [[1.2, 1.8]], "partition_id": 0}]
    nodes = {"i1": {"received": 0.35}, "r1": {"sending": 2.1, "sent": 2.5}}
    (row,) = mod.breakdown(server, clients, nodes)["rounds"]
    assert row["push_s"] == pytest.approx(0.35 - 0.1)
    assert row["flower_poll_s"] == pytest.approx(0.0)
    assert all(row[k] >= 0 for k in mod.KEYS if k != "other_s")
    assert sum(row[k] for k in mod.KEYS) == pytest.approx(row["round_s"])


@pytest.mark.deployment
def test_localhost_rounds_are_timed_end_to_end(tmp_path):
    mod = load()
    out = tmp_path / "breakdown"
    result = mod.main(["--nodes", "3", "--rounds", "2", "--modes", "fedavg", "coded",
                       "--workdir", str(tmp_path / "work"), "--out", str(out)])
    saved = json.loads(out.with_suffix(".json").read_text())
    assert set(saved["runs"]["3"]) == {"fedavg", "coded"}
    runs = result["runs"]["3"]
    for mode, run in runs.items():
        assert [r["round"] for r in run["rounds"]] == [1, 2], mode
        for row in run["rounds"]:
            assert all(row[k] is not None for k in mod.KEYS), (mode, row)
            assert all(row[k] > -0.1 for k in mod.KEYS if k != "other_s"), (mode, row)
            assert abs(row["other_s"]) < 0.25 * row["round_s"], (mode, row)
            # the SuperNode asks for work every 3 s when idle
            assert row["flower_poll_s"] < 3.0 + 1.5, (mode, row)
    fedavg, coded = runs["fedavg"], runs["coded"]
    assert fedavg["identify_messages"] == 0 and coded["identify_messages"] == 3
    # the mod imports no torch: a coded round's ClientApp pays only the mod's own import
    assert coded["mod_imported_torch"] is False and fedavg["mod_imported_torch"] is False
    assert all(r["mod_import_torch_s"] == 0 for r in coded["rounds"])
    assert all(r["replies_used"] == 3 and r["mod_import_s"] == 0 for r in fedavg["rounds"])
    # every coded round ended at its first decodable set, never at the deadline (which only
    # bounds a slow start-up): n - s = 2 replies decode; a third pulled in the same poll is
    # used too
    assert [r.get("decode") for r in coded["rounds"]] == ["exact", "exact"], coded["rounds"]
    assert all(r["replies_used"] in (2, 3) for r in coded["rounds"]), coded["rounds"]
    assert all("decode" not in r for r in fedavg["rounds"])
    assert coded["rounds"][0]["handshake_s"] > 0
    assert all(r["mod_import_s"] > 0 for r in coded["rounds"])  # one process per message
