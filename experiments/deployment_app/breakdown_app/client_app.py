"""ClientApp: numpy logistic regression on a synthetic partition, with timestamps.

``timing_mod`` is the outermost mod. For a message carrying the gradient-coding record it
imports ``fl_gradcode.flower.mod`` (timed, and whether it brought torch in: it does not; with
``lean-import`` without the package's ``__init__``) and hands the message to
``gradient_coding_mod``; any other message goes straight to the train handler, as in a plain
Flower app (with ``app-imports-torch``, after importing torch as a torch app would). Each
ClientApp process (Flower starts one per message) writes one JSON file into
the run config's ``stamp-dir``: the process start time, the module import time, the handler's
entry and exit, every train call, and the message's Flower metadata.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from . import T_MODULE  # stamped by the package, before the imports above

T_IMPORTED = time.time()
PROTOCOL_KEY = "gradient-coding"  # fl_gradcode.flower.protocol.PROTOCOL_KEY, not imported here
TRAIN_CALLS: list[tuple[float, float]] = []


def process_start_time() -> float:
    """Wall-clock start of this process (``/proc``, 10-ms resolution); ``nan`` elsewhere."""
    try:
        stat = Path("/proc/self/stat").read_text()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        ticks = int(stat.rsplit(")", 1)[1].split()[19])
        return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


T_PROCESS = process_start_time()


def partition_data(pid: int, cfg) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1000 + pid)
    d, k, m = int(cfg["features"]), int(cfg["classes"]), int(cfg["examples"])
    centres = np.random.default_rng(0).normal(size=(k, d))
    y = rng.integers(0, k, size=m)
    x = centres[y] + rng.normal(scale=2.0, size=(m, d))
    return x, y


def train(msg: Message, context: Context) -> Message:
    """``local-steps`` full-batch gradient steps of softmax regression on partition
    ``partition-id``; replies with the trained ``arrays`` and ``num-examples``."""
    t0 = time.time()
    cfg = context.run_config
    pid = int(context.node_config["partition-id"])
    x, y = partition_data(pid, cfg)
    arrays = msg.content["arrays"]
    w = arrays["w"].numpy().astype(np.float64)
    b = arrays["b"].numpy().astype(np.float64)
    onehot = np.eye(w.shape[1])[y]
    lr = float(msg.content["config"]["lr"])
    for _ in range(int(cfg["local-steps"])):
        logits = x @ w + b
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        g = (p - onehot) / len(y)
        w -= lr * (x.T @ g)
        b -= lr * g.sum(axis=0)
    out = ArrayRecord({"w": Array(w.astype(np.float32)), "b": Array(b.astype(np.float32))})
    metrics = MetricRecord({"num-examples": len(y)})
    reply = Message(RecordDict({"arrays": out, "metrics": metrics}), reply_to=msg)
    TRAIN_CALLS.append((t0, time.time()))
    return reply


def _write_stamp(context: Context, record: dict) -> None:
    stamp_dir = str(context.run_config.get("stamp-dir", ""))
    if not stamp_dir:
        return
    path = Path(stamp_dir) / f"client-{os.getpid()}-{record['message_id'][:16]}.json"
    path.write_text(json.dumps(record))


def _stub_flower_package() -> None:
    """Import ``fl_gradcode.flower.mod`` without the package's ``__init__`` (which also imports
    the server-side wrapper and the codes): what a lazy ``__init__`` would give a ClientApp."""
    if "fl_gradcode.flower" in sys.modules:
        return
    import importlib.util
    import types

    spec = importlib.util.find_spec("fl_gradcode")
    if spec is None or not spec.submodule_search_locations:
        return
    package = types.ModuleType("fl_gradcode.flower")
    package.__path__ = [str(Path(next(iter(spec.submodule_search_locations))) / "flower")]
    sys.modules["fl_gradcode.flower"] = package


def timing_mod(msg: Message, context: Context, call_next) -> Message:
    t_entry = time.time()
    coded = msg.has_content() and PROTOCOL_KEY in msg.content.config_records
    kind, import_torch_s, import_gc_s, app_import_s = "plain", 0.0, 0.0, 0.0
    mod_imported_torch = False
    if coded:
        kind = str(msg.content.config_records[PROTOCOL_KEY].get("op", "coded"))
        had_torch = "torch" in sys.modules
        t1 = time.time()
        if bool(context.run_config.get("lean-import", False)):
            _stub_flower_package()
        from fl_gradcode.flower.mod import gradient_coding_mod

        t2 = time.time()
        # the mod does not import torch; were it to, its import time would be counted here
        mod_imported_torch = not had_torch and "torch" in sys.modules
        import_gc_s = t2 - t1
        reply = gradient_coding_mod(msg, context, call_next)
    else:
        if bool(context.run_config.get("app-imports-torch", False)):  # as a torch app would
            had_torch = "torch" in sys.modules
            t0 = time.time()
            import torch  # noqa: F401

            app_import_s = 0.0 if had_torch else time.time() - t0
        reply = call_next(msg, context)
    t_exit = time.time()
    _write_stamp(
        context,
        {
            "kind": kind,
            "message_id": msg.metadata.message_id,
            "group_id": msg.metadata.group_id,
            "node_id": context.node_id,
            "partition_id": int(context.node_config.get("partition-id", -1)),
            "created_at": msg.metadata.created_at,
            "delivered_at": msg.metadata.delivered_at,
            "process_start": T_PROCESS,
            "module_start": T_MODULE,
            "module_imported": T_IMPORTED,
            "entry": t_entry,
            "import_torch_s": import_torch_s,
            "mod_imported_torch": mod_imported_torch,
            "import_gc_s": import_gc_s,
            "app_import_s": app_import_s,
            "train_calls": TRAIN_CALLS,
            "exit": t_exit,
            "reply_error": reply.has_error(),
            "reply_created_at": reply.metadata.created_at,
        },
    )
    return reply


app = ClientApp(mods=[timing_mod])
app.train()(train)
