"""The results writer: config.json, rounds.jsonl, final_model.npz and debug.log, each written
whole or not at all, and a write that fails warns and lets the run go on."""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import pytest

from fl_gradcode.results import ROUND_FIELDS, RoundRecorder, read_rounds


def _row(r: int, **extra) -> dict:
    return {"round": r, "decode": "exact", "clients_used": [0, 1], "stragglers": [],
            "late_dropped": 0, "rejected": 0, "decode_error": 0.0, "virtual_s": float(r),
            "wall_s": 0.1, "accuracy": None, "loss": None, **extra}


def test_round_fields_are_the_documented_keys():
    assert ROUND_FIELDS == ("round", "decode", "clients_used", "stragglers", "late_dropped",
                            "rejected", "decode_error", "virtual_s", "wall_s", "accuracy",
                            "loss")


# ======== edges: exact values, bounds and messages ===============================================
def test_config_json_is_sorted_indented_plain_json(tmp_path):
    config = {"z": np.float32(0.5), "a": np.arange(3), 7: (1, np.int64(2)),
              "nested": {"bad": float("nan"), "inf": -np.inf, "ok": 1.5}}
    RoundRecorder(tmp_path / "deep" / "run", config)
    text = (tmp_path / "deep" / "run" / "config.json").read_text()
    expected = {"7": [1, 2], "a": [0, 1, 2], "nested": {"bad": None, "inf": None, "ok": 1.5},
                "z": 0.5}
    assert json.loads(text) == expected
    assert text == json.dumps(expected, indent=2, sort_keys=True)
    assert not (tmp_path / "deep" / "run" / "config.json.tmp").exists()
    assert (tmp_path / "deep" / "run" / "rounds.jsonl").read_text() == ""


def test_a_new_recorder_empties_the_rounds_of_an_earlier_run(tmp_path):
    (tmp_path / "rounds.jsonl").write_text('{"round": 9}\n')
    RoundRecorder(tmp_path, {})
    assert (tmp_path / "rounds.jsonl").read_text() == ""


def test_each_round_is_one_sorted_json_line_with_nan_as_null(tmp_path):
    rec = RoundRecorder(tmp_path, {"seed": 0})
    assert rec.record(_row(1, loss=float("nan"), extra=np.float64(2.0))) is True
    assert rec.record(_row(2)) is True
    lines = (tmp_path / "rounds.jsonl").read_text().split("\n")
    assert lines[2] == "" and len(lines) == 3
    first = _row(1, loss=None, extra=2.0)
    assert lines[0] == json.dumps(first, sort_keys=True)
    assert read_rounds(tmp_path) == [first, _row(2)]
    assert rec.failures == 0


def test_a_round_without_a_documented_field_is_refused_by_name(tmp_path):
    rec = RoundRecorder(tmp_path, {})
    row = _row(1)
    del row["wall_s"], row["loss"]
    with pytest.raises(ValueError, match=r"^round record lacks \['wall_s', 'loss'\]$"):
        rec.record(row)


def test_a_round_json_cannot_hold_warns_with_its_round_and_the_file_is_unchanged(tmp_path,
                                                                               flwr_log):
    rec = RoundRecorder(tmp_path, {})
    rec.record(_row(1))
    before = (tmp_path / "rounds.jsonl").read_bytes()
    assert rec.record(_row(2, model=object())) is False
    assert (tmp_path / "rounds.jsonl").read_bytes() == before
    assert rec.failures == 1
    [(level, text)] = flwr_log
    assert level == logging.WARNING
    assert text.startswith(f"cannot append round 2 to {tmp_path / 'rounds.jsonl'}: TypeError: ")
    assert text.endswith(" (the run goes on; this result is not saved)")


def test_a_config_json_cannot_hold_warns_and_writes_nothing(tmp_path, flwr_log):
    rec = RoundRecorder(tmp_path, {"bad": object()})
    assert rec.failures == 1
    assert not (tmp_path / "config.json").exists()
    assert os.listdir(tmp_path) == ["rounds.jsonl"]
    [(level, text)] = flwr_log
    assert level == logging.WARNING
    assert text.startswith(f"cannot write {tmp_path / 'config.json'}: TypeError: ")
    assert text.endswith("(the run goes on; this result is not saved)")


def test_a_failed_config_rename_leaves_no_temporary_file(tmp_path, monkeypatch, flwr_log):
    from pathlib import Path

    def refuse(self, target):
        raise PermissionError(13, "read-only", str(target))

    monkeypatch.setattr(Path, "replace", refuse)
    rec = RoundRecorder(tmp_path, {"seed": 1})
    assert rec.failures == 1
    assert sorted(os.listdir(tmp_path)) == ["rounds.jsonl"]
    assert "PermissionError" in flwr_log[0][1]


def test_a_directory_that_cannot_be_created_warns_twice_and_the_run_goes_on(tmp_path, flwr_log):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    rec = RoundRecorder(blocker / "run", {"seed": 0})
    assert rec.failures == 2
    assert flwr_log[0][1].startswith(
        f"cannot create {blocker / 'run' / 'rounds.jsonl'}: NotADirectoryError: ")
    assert flwr_log[1][1].startswith(f"cannot write {blocker / 'run' / 'config.json'}: ")
    assert rec.record(_row(1)) is False
    assert rec.debug("x") is False
    assert rec.save_model({"w": np.ones(2)}) is False
    assert rec.failures == 5
    assert flwr_log[3][1].startswith(f"cannot append to {blocker / 'run' / 'debug.log'}: ")
    assert flwr_log[4][1].startswith(f"cannot write {blocker / 'run' / 'final_model.npz'}: ")


def test_debug_appends_utf8_text_and_creates_its_file_on_first_use(tmp_path):
    rec = RoundRecorder(tmp_path, {})
    assert not (tmp_path / "debug.log").exists()
    assert rec.debug("Traceback é\n") is True
    assert rec.debug("next \udc80\n") is True
    assert (tmp_path / "debug.log").read_bytes() == "Traceback é\n".encode() + b"next ?\n"
    assert oct((tmp_path / "debug.log").stat().st_mode & 0o777) == oct(0o644 & ~_umask())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_save_model_replaces_the_model_and_leaves_no_temporary_file(tmp_path):
    rec = RoundRecorder(tmp_path, {})
    assert rec.save_model({"w": [1.0, 2.0], "b": np.zeros((2, 2))}) is True
    assert rec.save_model({"w": np.array([3.0])}) is True
    with np.load(tmp_path / "final_model.npz") as z:
        assert sorted(z.files) == ["w"]
        np.testing.assert_array_equal(z["w"], [3.0])
    assert sorted(os.listdir(tmp_path)) == ["config.json", "final_model.npz", "rounds.jsonl"]


def test_a_failed_model_write_keeps_the_previous_model_and_removes_the_temporary(tmp_path,
                                                                              monkeypatch,
                                                                              flwr_log):
    rec = RoundRecorder(tmp_path, {})
    rec.save_model({"w": np.array([1.0])})

    def fail_after_writing(file, **arrays):
        with open(file, "wb") as fh:
            fh.write(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "savez", fail_after_writing)
    assert rec.save_model({"w": np.array([2.0])}) is False
    monkeypatch.undo()
    with np.load(tmp_path / "final_model.npz") as z:
        np.testing.assert_array_equal(z["w"], [1.0])
    assert not (tmp_path / "final_model.tmp.npz").exists()
    assert rec.failures == 1
    assert flwr_log[0][1].startswith(f"cannot write {tmp_path / 'final_model.npz'}: OSError: ")


def test_a_write_the_os_splits_is_finished_and_one_that_writes_nothing_is_rolled_back(
        tmp_path, monkeypatch):
    rec = RoundRecorder(tmp_path, {})
    real = os.write
    calls: list[int] = []

    def three_bytes_at_a_time(fd, data):
        calls.append(len(data))
        return real(fd, bytes(data[:3]))

    monkeypatch.setattr(os, "write", three_bytes_at_a_time)
    assert rec.record(_row(1)) is True
    monkeypatch.setattr(os, "write", real)
    line = json.dumps(_row(1), sort_keys=True) + "\n"
    assert (tmp_path / "rounds.jsonl").read_text() == line
    assert calls[:2] == [len(line), len(line) - 3]  # each retry sends the rest

    before = (tmp_path / "rounds.jsonl").read_bytes()
    monkeypatch.setattr(os, "write", lambda fd, data: 0)
    assert rec.record(_row(2)) is False
    monkeypatch.setattr(os, "write", real)
    assert (tmp_path / "rounds.jsonl").read_bytes() == before
    assert rec.failures == 1


def test_a_write_that_returns_nothing_names_how_much_was_written(tmp_path, monkeypatch,
                                                                flwr_log):
    rec = RoundRecorder(tmp_path, {})
    real = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real(fd, bytes(data[:4])) if len(data) > 10
                        else 0)
    assert rec.debug("0123456789ab") is False
    monkeypatch.setattr(os, "write", real)
    assert flwr_log[0][1].endswith(": OSError: wrote 4 of 12 bytes (the run goes on; this "
                                   "result is not saved)")
    assert (tmp_path / "debug.log").read_bytes() == b""


def test_read_rounds_skips_blank_lines(tmp_path):
    (tmp_path / "rounds.jsonl").write_text('{"round": 1}\n\n  \n{"round": 2}\n')
    assert read_rounds(str(tmp_path)) == [{"round": 1}, {"round": 2}]


def test_a_failed_rollback_still_reports_the_write_that_failed(tmp_path, monkeypatch, flwr_log):
    rec = RoundRecorder(tmp_path, {})
    real = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real(fd, bytes(data[:4])) if len(data) > 10
                        else 0)

    def no_truncate(fd, size):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "ftruncate", no_truncate)
    assert rec.debug("0123456789ab") is False
    monkeypatch.undo()
    assert flwr_log[0][1].endswith(": OSError: wrote 4 of 12 bytes (the run goes on; this "
                                   "result is not saved)")


def test_config_json_is_written_through_a_sibling_temporary_file(tmp_path, monkeypatch):
    from pathlib import Path

    written: list[str] = []
    real = Path.write_bytes

    def spy(self, data):
        written.append(self.name)
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", spy)
    RoundRecorder(tmp_path, {"seed": 0})
    assert written == ["config.json.tmp"]
    assert json.loads((tmp_path / "config.json").read_text()) == {"seed": 0}
