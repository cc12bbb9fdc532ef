"""Our own ClientApp: an ordinary Flower app made gradient-coded by ``gradient_coding_mod``.

The train handler is what any Flower app's is: read ``partition-id`` / ``num-partitions`` from
the node config, load that partition (here: the embedded datasets, partitioned from the run
config's keys), train the received ``arrays`` with the received ``config`` (``lr``), and reply
with the trained ``arrays`` and ``metrics`` holding ``num-examples``. The mod calls it once per
assigned partition, seeded per (run, round, partition), and sends one coded reply.

``update=gradient``: one full-batch gradient step ``theta - lr * g_j`` (the decoded
example-weighted average is gradient descent on the whole data); ``update=local``:
``local-epochs`` of minibatch SGD with minibatch order drawn from the seeded torch RNG (FedAvg
over partitions). ``dp=sample``: record-level DP-SGD with Opacus, generators drawn from the
seeded RNG (secret when the node has a partition key). ``dp``, ``noise-multiplier`` and
``clip-norm`` come from the run config updated with the server's train config, but never past
the node's own policy (node config ``dp-required``, ``dp-min-noise-multiplier``): a config
asking for less is refused (and under the coding mod a node with a policy is handed the
instruction's checked values).

``train_timing_mod`` (outermost) times plain, uncoded train messages for the drop-stragglers
baseline (``rival``); coded messages pass it untouched. ``fault_injection_mod`` (outside the
coding mod) implements the test/demo keys
``nan-workers``, ``slow-workers`` / ``slow-delay-s`` and the node config's ``extra-delay-s``.
"""

from __future__ import annotations

import time
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fl_gradcode.config import DEFAULTS, merge_config, worker_list
from fl_gradcode.data import run_partitions
from fl_gradcode.flower import gradient_coding_mod, protocol
from fl_gradcode.flower.client_policy import NodePolicy
from fl_gradcode.flower.deadline import train_timing_mod
from fl_gradcode.learning import dp_sgd_steps, dp_sgd_update, make_model, partition_update
from fl_gradcode.privacy import SAMPLE_RATE_METRIC, STEPS_METRIC

__all__ = ["app", "client_config", "fault_injection_mod", "train"]


@lru_cache(maxsize=4)
def _model(name: str, shape: tuple[int, ...], classes: int) -> torch.nn.Module:
    return make_model(name, shape, classes)


def client_config(context: Context, msg: Message) -> dict[str, Any]:
    """The run config, updated with run-config keys the server forwards in the train config
    (``run_simulation`` gives ClientApps an empty run config)."""
    forwarded = {}
    if msg.has_content() and "config" in msg.content.config_records:
        forwarded = {
            k: v for k, v in msg.content.config_records["config"].items() if k in DEFAULTS
        }
    return merge_config({**dict(context.run_config), **forwarded})


def flat_theta(arrays: ArrayRecord, model: torch.nn.Module) -> np.ndarray:
    """The global arrays as one float64 vector in the model's parameter order."""
    return np.concatenate(
        [np.asarray(arrays[name].numpy(), dtype=np.float64).reshape(-1)
         for name, _ in model.named_parameters()]
    )


def as_arrays(theta: np.ndarray, model: torch.nn.Module) -> ArrayRecord:
    out, start = {}, 0
    for name, p in model.named_parameters():
        out[name] = Array(theta[start : start + p.numel()].reshape(tuple(p.shape)).copy())
        start += p.numel()
    return ArrayRecord(out)


def train(msg: Message, context: Context) -> Message:
    """Train partition ``partition-id`` of ``num-partitions`` from the received model."""
    cfg = client_config(context, msg)
    # the node's own DP policy over the dp / sigma the server's config asks for (the coding
    # mod already hands a node with a policy the instruction's checked values)
    NodePolicy.from_node_config(context.node_config).check_app_config(cfg)
    pid = int(context.node_config["partition-id"])
    num = int(context.node_config["num-partitions"])
    data, index = run_partitions(cfg, num)
    idx = index[pid]
    model = _model(str(cfg["model"]), data.input_shape, data.num_classes)
    theta = flat_theta(msg.content["arrays"], model)
    lr = float(msg.content["config"]["lr"])
    kind = str(cfg["update"])
    # every random choice below is drawn from the RNG the coding mod seeded for this partition
    draw = [int(x) for x in torch.randint(0, 2**62, (2,))]
    common = {"kind": kind, "lr": lr, "epochs": int(cfg["local-epochs"]),
              "batch_size": int(cfg["batch-size"])}
    if str(cfg["dp"]) == "sample":
        update = dp_sgd_update(
            model, theta, data.x_train[idx], data.y_train[idx],
            clip_norm=float(cfg["clip-norm"]), noise_multiplier=float(cfg["noise-multiplier"]),
            data_seed=draw[0], noise_seed=draw[1], **common,
        )
    else:
        update = partition_update(
            model, theta, data.x_train[idx], data.y_train[idx], seed=tuple(draw), **common
        )
    new = theta - lr * update if kind == "gradient" else theta + update
    metrics = MetricRecord({"num-examples": len(idx), "update-norm": float(np.linalg.norm(update))})
    if str(cfg["dp"]) == "sample":  # its DP-SGD, for the node's release ledger to account
        rate, steps = dp_sgd_steps(len(idx), kind=kind, epochs=common["epochs"],
                                   batch_size=common["batch_size"])
        metrics[SAMPLE_RATE_METRIC], metrics[STEPS_METRIC] = float(rate), int(steps)
    return Message(RecordDict({"arrays": as_arrays(new, model), "metrics": metrics}), reply_to=msg)


def fault_injection_mod(msg: Message, context: Context, call_next) -> Message:
    """Test/demo faults around the coding mod: a NaN reply (``nan-workers``), a slow worker
    (``slow-workers``: ``slow-delay-s`` added, slept in wallclock timing, reported as compute
    in virtual timing), a deliberately slow node (node config ``extra-delay-s``, slept; also
    for a plain train message, as the rivals send)."""
    instruction = None
    if msg.has_content():
        instruction = protocol.parse_instruction(msg.content)
    reply = call_next(msg, context)
    if instruction is None and msg.metadata.message_type == MessageType.TRAIN:
        # a plain (rival) train message: the node's own delay holds it back as well, so the
        # baseline meets the slow node a coded run meets
        time.sleep(float(context.node_config.get("extra-delay-s", 0.0)))
        return reply
    if instruction is None or instruction.op != protocol.OP_TRAIN or reply.has_error():
        return reply
    cfg = client_config(context, msg)
    worker = instruction.worker
    delay = float(context.node_config.get("extra-delay-s", 0.0))
    if worker in worker_list(str(cfg["slow-workers"])):
        delay += float(cfg["slow-delay-s"])
    content = reply.content
    meta_key = protocol.PROTOCOL_KEY + "-meta"
    if delay > 0:
        if instruction.timing == "wallclock":
            time.sleep(delay)
        else:
            meta = content.metric_records[meta_key]
            meta["compute-s"] = float(meta["compute-s"]) + delay
    if worker in worker_list(str(cfg["nan-workers"])):
        record = content.array_records[protocol.PROTOCOL_KEY]
        name = next(iter(record.keys()))
        bad = record[name].numpy().copy()
        bad.reshape(-1)[0] = np.nan
        record[name] = Array(bad)
    return reply


def make_client_app(mods: list | None = None) -> ClientApp:
    """Our ClientApp with the given mods (default: fault injection around the coding mod)."""
    client_app = ClientApp(mods=mods if mods is not None else
                           [train_timing_mod, fault_injection_mod, gradient_coding_mod])
    client_app.train()(train)
    return client_app


app = make_client_app()
