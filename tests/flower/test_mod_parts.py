"""The client mod's warnings belong to the mod instance that gives them, and the modules that
make up the mod hold no mutable state of their own."""

from __future__ import annotations

import ast
import json
import warnings
from pathlib import Path

from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from fl_gradcode.flower.mod import make_gradient_coding_mod
from tests.flower.messages import node_context, train_instruction, train_message

ROOT = Path(__file__).resolve().parents[2]
FLOWER = ROOT / "fl_gradcode" / "flower"


def _app(msg: Message, context) -> Message:
    """A numpy app (``theta + j + 1`` from 4 examples) that also writes ``context.state``
    (which the mod discards, with a warning)."""
    context.state["mine"] = ConfigRecord({"step": 1})
    theta = msg.content["arrays"]["w"].numpy()
    pid = float(context.node_config["partition-id"])
    return Message(RecordDict({"arrays": ArrayRecord({"w": Array(theta + pid + 1.0)}),
                               "metrics": MetricRecord({"num-examples": 4})}), reply_to=msg)


def _ours(seen) -> list[str]:
    """The mod's public-seed and context.state warnings among ``seen``, by kind."""
    kinds = {"no partition key": "seed", "context.state": "state"}
    return sorted(kind for w in seen for text, kind in kinds.items()
                  if text in str(w.message))


def _call(mod, rnd: int, cfg: dict | None = None, **instruction):
    reply = mod(train_message(train_instruction(round=rnd, nonce=f"n{rnd}", **instruction)),
                node_context(cfg), _app)
    assert not reply.has_error(), reply.error.reason


def test_each_mod_instance_gives_each_of_its_warnings_once(tmp_path):
    """Public seeds and a written context.state: warned by the first call of each mod, not by
    its later calls; a second mod in the same process warns again (it has said nothing)."""
    first, second = make_gradient_coding_mod(), make_gradient_coding_mod()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _call(first, 1)
        once = _ours(seen)
        _call(first, 2)
        assert _ours(seen) == once
        _call(second, 1)
    assert once == ["seed", "state"]
    assert _ours(seen) == ["seed", "seed", "state", "state"]


def test_the_in_memory_replay_warning_is_given_once_per_mod(tmp_path):
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"master": bytes(range(32)).hex()}))
    cfg = {"partition-id": 0, "num-partitions": 3, "dp-key-file": str(keys)}
    first, second = make_gradient_coding_mod(), make_gradient_coding_mod()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for mod, rnd in ((first, 1), (first, 2), (second, 1)):
            _call(mod, rnd, cfg, dp="partition")
    replay = [w for w in seen if "'dp-state-file'" in str(w.message)]
    assert len(replay) == 2


def test_a_keyed_node_asked_for_no_dp_does_not_warn_of_replays(tmp_path):
    """Without DP (and no budget) a replayed round draws no keyed noise again and resets no
    budget: the in-memory replay warning, one per message where each message loads the app
    afresh, would only be noise; a keyed DP round still gives it."""
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"master": bytes(range(32)).hex()}))
    cfg = {"partition-id": 0, "num-partitions": 3, "dp-key-file": str(keys)}
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _call(make_gradient_coding_mod(), 1, cfg)
        plain = [w for w in seen if "'dp-state-file'" in str(w.message)]
        _call(make_gradient_coding_mod(), 1, cfg, dp="partition")
    assert plain == []
    assert len([w for w in seen if "'dp-state-file'" in str(w.message)]) == 1


def _module_state(path: Path) -> list[str]:
    """``global`` statements, and module-level names (but ``__all__``) bound to a mutable
    display (set, dict, list) or to ``set()`` / ``dict()`` / ``list()``."""
    found = []
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            found.append(f"global {', '.join(node.names)}")
    for node in tree.body:
        value = getattr(node, "value", None)
        mutable = isinstance(value, (ast.Set, ast.Dict, ast.List)) or (
            isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
            and value.func.id in ("set", "dict", "list"))
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and mutable:
            name = ast.unparse(node).split("=")[0].strip()
            if name != "__all__":
                found.append(name)
    return found


def test_the_mods_modules_hold_no_mutable_state():
    modules = [FLOWER / "mod.py", FLOWER / "mod_order.py", *sorted((FLOWER / "client").glob(
        "*.py"))]
    assert {m.name: _module_state(m) for m in modules} == {m.name: [] for m in modules}
