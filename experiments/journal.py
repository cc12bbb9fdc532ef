"""A cell's finished runs on disk, so a cell cut off (a session's end, a crash, a kill) resumes
where it stopped instead of starting over.

One JSON line per finished run (``{"key", "record"}``) after a header line (``{"identity",
"digest"}``). The identity is everything a run's numbers depend on: the cell (run config,
``n``, cohort, rounds, target, the rivals' rules), the development and evaluation seeds, the
versions of Python, numpy, torch and Flower, torch's and BLAS's threads, and a digest of the
code that runs (the packages ``fl_gradcode``, ``clients``, ``server``,
``experiments/rival_runs.py``, and the harness modules that decide which runs a cell makes
under which key: ``compare``, ``deadline_best``, ``fedbuff_tuning``, ``first_k_tuning``). A
journal whose identity differs is not read: it is set
aside (renamed ``*.stale``) and the cell starts afresh, with a message saying so. A cell
whose compute is measured once keeps that measurement in the journal (``meta``), so a
resumed cell charges every run the same value.
"""

from __future__ import annotations

import hashlib
import json
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["Journal", "code_digest"]

ROOT = Path(__file__).resolve().parent.parent
#: The code a run's numbers depend on (relative to the repository root): what runs, and what
#: decides the runs a cell makes and their keys (e.g. the deadline a code's own deadline is
#: read at).
CODE = ("fl_gradcode", "clients", "server", "experiments/rival_runs.py",
        "experiments/compare.py", "experiments/runner.py", "experiments/cell.py",
        "experiments/deadline_best.py",
        "experiments/fedbuff_tuning.py", "experiments/first_k_tuning.py")


def code_digest(root: Path = ROOT) -> str:
    """SHA-256 over the paths and contents of the Python files of :data:`CODE`."""
    digest = hashlib.sha256()
    for entry in CODE:
        path = root / entry
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for file in files:
            digest.update(file.relative_to(root).as_posix().encode() + b"\0")
            digest.update(file.read_bytes() + b"\0")
    return digest.hexdigest()


def _versions() -> dict[str, str]:
    import flwr
    import numpy
    import torch
    from threadpoolctl import threadpool_info

    # the threads too: a sum split over threads may differ in its last bit
    return {"python": platform.python_version(), "numpy": numpy.__version__,
            "torch": torch.__version__, "flwr": flwr.__version__,
            "torch_threads": str(torch.get_num_threads()),
            "blas_threads": ",".join(str(lib["num_threads"]) for lib in threadpool_info()
                                     if lib.get("user_api") == "blas")}


def _plain(value: Any) -> Any:
    """numpy scalars and arrays as JSON numbers and lists."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


class Journal:
    """The finished runs of one cell with ``identity`` (any JSON value), kept in ``path``.

    :meth:`get` hands back, once, a run finished by an earlier process of the same identity
    (``None`` otherwise; :attr:`runs` holds those not handed back yet), :meth:`add` appends
    one; :meth:`meta` / :meth:`set_meta` keep facts measured once per cell. :attr:`resumed`
    counts the runs read back (:attr:`resumed_wall_s`: the wall seconds they took),
    :attr:`stale` names the journal set aside (another cell, seeds, code or versions), if
    any."""

    def __init__(self, path: Path, identity: Any) -> None:
        self.path = Path(path)
        identity = {"cell": identity, "versions": _versions(), "code": code_digest()}
        self.digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
        self.runs: dict[str, dict[str, Any]] = {}  # by earlier processes, not read back yet
        self._meta: dict[str, Any] = {}
        self.resumed = 0
        self.resumed_wall_s = 0.0
        self.stale: Path | None = None
        if self.path.exists():
            self._read()
        if not self.path.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._append({"identity": identity, "digest": self.digest})

    def _read(self) -> None:
        text = self.path.read_text()
        if text and not text.endswith("\n"):  # a line cut off by a kill mid-write: dropped
            text = text[: text.rfind("\n") + 1]
            self.path.write_text(text)
        lines = text.splitlines()
        try:
            header = json.loads(lines[0]) if lines else {}
        except json.JSONDecodeError:
            header = {}
        if header.get("digest") != self.digest:
            self.stale = self.path.with_name(self.path.name + ".stale")
            self.path.replace(self.stale)
            return
        for line in lines[1:]:
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:  # a damaged line: that run runs again
                continue
            if "meta" in entry:
                self._meta.update(entry["meta"])
            elif "key" in entry:
                self.runs[json.dumps(entry["key"])] = entry["record"]

    def _append(self, entry: Mapping[str, Any]) -> None:
        with open(self.path, "a") as fh:
            fh.write(json.dumps(entry, default=_plain) + "\n")
            fh.flush()

    def get(self, key: tuple) -> dict[str, Any] | None:
        record = self.runs.pop(json.dumps(list(key)), None)
        if record is not None:
            self.resumed += 1
            self.resumed_wall_s += float(record.get("wall_s", 0.0))
        return record

    def add(self, key: tuple, record: Mapping[str, Any]) -> None:
        self._append({"key": list(key), "record": record})

    def meta(self, name: str) -> Any:
        return self._meta.get(name)

    def set_meta(self, name: str, value: Any) -> None:
        self._meta[name] = value
        self._append({"meta": {name: value}})
