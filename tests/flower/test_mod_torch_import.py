"""The client mod imports torch only when the app does, and seeds it even then.

Each case runs in a fresh interpreter (the test process has torch loaded by other tests).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PRELUDE = f"""
import json, sys
sys.path[:0] = [{str(ROOT)!r}]
import numpy as np
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from tests.flower.messages import node_context as _context
from tests.flower.messages import train_instruction as _train_instruction
from tests.flower.messages import train_message as _message
from fl_gradcode.flower.mod import make_gradient_coding_mod
from fl_gradcode.flower.testing import set_task_identity
set_task_identity()
calls = []
"""


def _run(body: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PRELUDE + body], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_numpy_app_through_the_mod_never_imports_torch():
    got = _run("""
def numpy_app(msg, context):
    calls.append(1)
    theta = msg.content["arrays"]["w"].numpy()
    return Message(RecordDict({"arrays": ArrayRecord({"w": Array(theta + np.random.rand(6))}),
                               "metrics": MetricRecord({"num-examples": 4})}), reply_to=msg)
reply = make_gradient_coding_mod()(_message(_train_instruction()), _context(), numpy_app)
print(json.dumps({"torch": "torch" in sys.modules, "error": reply.has_error(),
                  "calls": len(calls)}))
""")
    assert got == {"torch": False, "error": False, "calls": 1}


def test_a_partition_dp_release_with_a_ledger_and_budget_never_imports_torch(tmp_path):
    """The release ledger's epsilon (dp='partition', dp-state-file, dp-max-epsilon) is computed
    without Opacus' import of torch: a numpy app's node stays torch-free."""
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"master": bytes(range(32)).hex()}))
    got = _run(f"""
def numpy_app(msg, context):
    calls.append(1)
    theta = msg.content["arrays"]["w"].numpy()
    return Message(RecordDict({{"arrays": ArrayRecord({{"w": Array(theta + 1.0)}}),
                               "metrics": MetricRecord({{"num-examples": 4}})}}), reply_to=msg)
cfg = {{"partition-id": 0, "num-partitions": 3, "dp-key-file": {str(keys)!r},
       "dp-state-file": {str(tmp_path / "state.jsonl")!r}, "dp-max-epsilon": 50.0}}
inst = _train_instruction(dp="partition", noise_multiplier=1.0)
reply = make_gradient_coding_mod()(_message(inst), _context(cfg), numpy_app)
print(json.dumps({{"torch": "torch" in sys.modules, "error": reply.has_error(),
                  "calls": len(calls)}}))
""")
    assert got == {"torch": False, "error": False, "calls": 1}


TORCH_APP = """
def torch_app(msg, context):
    import torch  # imported by the app, on its first call
    calls.append(1)
    theta = msg.content["arrays"]["w"].numpy()
    draw = torch.rand(6, dtype=torch.float64).numpy()
    return Message(RecordDict({"arrays": ArrayRecord({"w": Array(theta + draw)}),
                               "metrics": MetricRecord({"num-examples": 4})}), reply_to=msg)
"""


def test_an_app_that_imports_torch_gets_the_seeded_torch_draw_in_every_process():
    """The coded reply equals n_j * torch.rand under torch.manual_seed(partition seed), the
    same whether torch was loaded before the first call or by it (then that call runs twice)."""
    body = TORCH_APP + """
from fl_gradcode.flower.mod import partition_seed
inst = _train_instruction()
if PRELOAD:
    import torch
mod = make_gradient_coding_mod()
first = mod(_message(inst), _context(), torch_app)
n_first = len(calls)
second = mod(_message(inst), _context(), torch_app)
import torch
torch.manual_seed(partition_seed(inst.seed, inst.round, 1, None, inst.nonce))
expected = 4 * torch.rand(6, dtype=torch.float64).numpy()
got = [r.content["gradient-coding"]["w"].numpy().tolist() for r in (first, second)]
print(json.dumps({"got": got, "expected": expected.tolist(), "calls": [n_first, len(calls)]}))
"""
    cold = _run("PRELOAD = False\n" + body)
    warm = _run("PRELOAD = True\n" + body)
    for result in (cold, warm):
        assert result["got"][0] == result["expected"] and result["got"][1] == result["expected"]
    assert cold["expected"] == warm["expected"]
    assert cold["calls"] == [2, 3]  # the call that imported torch ran again, seeded
    assert warm["calls"] == [1, 2]
