"""Flower ClientApp: compute the assigned partitions' updates and send one coded combination.

Each SuperNode is one worker of the code; it learns its worker index from its node config
(``partition-id`` in simulation, ``--node-config "partition-id=3"`` in deployment) and
answers the server's ``query`` with it. A ``train`` message carries the global arrays, the
worker's partitions and their coefficients ``B[i, j] * w_j``; the client rebuilds those
partitions deterministically from ``(dataset, partitioner, alpha, k, seed)``, computes every
partition's update, and replies with ``sum_j coef_j * u_j``. Its latency is sampled from
``(seed, round, worker)``: slept for real in ``wallclock`` timing, reported in ``virtual``.
"""

from __future__ import annotations

import time
from functools import lru_cache

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fl_gradcode.config import worker_list
from fl_gradcode.data import run_partitions
from fl_gradcode.latency import client_delay, make_latency
from fl_gradcode.learning import dp_sgd_update, make_model, partition_update
from fl_gradcode.privacy import NoiseKeys, clip, noise_seed, partition_noise
from fl_gradcode.strategy import flatten

app = ClientApp()


@lru_cache(maxsize=4)
def _model(name: str, shape: tuple[int, ...], classes: int):
    return make_model(name, shape, classes)


@lru_cache(maxsize=4)
def _keys(key_file: str) -> NoiseKeys:
    """Partition keys from the node config's ``dp-key-file`` or ``FL_GRADCODE_DP_KEY_FILE``:
    client-side secrets, never part of a message."""
    return NoiseKeys.from_config({"dp-key-file": key_file} if key_file else {})


def worker_index(context: Context) -> int:
    """The worker index from the node config (``partition-id`` or ``worker-index``)."""
    cfg = context.node_config
    for key in ("worker-index", "partition-id"):
        if key in cfg:
            return int(cfg[key])
    raise ValueError(f"node config {dict(cfg)} has no 'partition-id' (the worker index)")


@app.query()
def query(msg: Message, context: Context) -> Message:
    meta = MetricRecord({"worker": worker_index(context)})
    return Message(RecordDict({"meta": meta}), reply_to=msg)


def _partition_update(j, cfg, theta, data, idx, model, keys: NoiseKeys | None) -> np.ndarray:
    """Partition ``j``'s update before the partition-level mechanism (record-level DP-SGD
    already applied when ``dp='sample'``)."""
    server_round, seed = int(cfg["server-round"]), int(cfg["seed"])
    common = {
        "kind": str(cfg["update"]),
        "lr": float(cfg["lr"]),
        "epochs": int(cfg["local-epochs"]),
        "batch_size": int(cfg["batch-size"]),
    }
    if str(cfg.get("dp", "none")) == "sample":
        if keys is None:
            raise ValueError("dp='sample' needs partition keys on the client")
        key = keys.key(j)
        return dp_sgd_update(
            model,
            theta,
            data.x_train[idx],
            data.y_train[idx],
            clip_norm=float(cfg["clip-norm"]),
            noise_multiplier=float(cfg["noise-multiplier"]),
            data_seed=noise_seed(key, server_round, j, purpose="data"),
            noise_seed=noise_seed(key, server_round, j),
            **common,
        )
    return partition_update(
        model, theta, data.x_train[idx], data.y_train[idx], seed=(seed, server_round, j), **common
    )


def private_update(
    u: np.ndarray, j: int, cfg: ConfigRecord, keys: NoiseKeys | None, worker: int
) -> np.ndarray:
    """Partition ``j``'s update as released under the run's DP mode (before encoding)."""
    mode = str(cfg.get("dp", "none"))
    if mode in ("none", "sample"):
        return u
    clip_norm = float(cfg["clip-norm"])
    clipped = clip(u, clip_norm)
    if mode == "central":  # the trusted server adds the noise after decoding
        return clipped
    if keys is None:
        raise ValueError("dp='partition' needs partition keys on the client")
    std = float(cfg["noise-multiplier"]) * clip_norm
    round_ = int(cfg["server-round"])
    # dp-noise=independent is the failure mode: every replica draws its own noise
    purpose = f"replica={worker}" if str(cfg["dp-noise"]) == "independent" else "noise"
    return clipped + partition_noise(keys.key(j), round_, j, u.size, std, purpose)


def compute_reply(
    cfg: ConfigRecord,
    arrays: ArrayRecord,
    extra_delay_s: float = 0.0,
    keys: NoiseKeys | None = None,
    memo: dict | None = None,
):
    """The coded update and its timing for one train message.

    A pure function of the message and the client's own secrets (``keys``): every replica of a
    partition computes the same clipped, noised update. ``memo`` (in-process simulations only)
    shares a round's partition updates between the simulated replicas, which would compute
    bit-identical values anyway; virtual time then comes from the latency model.
    """
    worker = int(cfg["worker"])
    server_round = int(cfg["server-round"])
    seed = int(cfg["seed"])
    parts = [int(j) for j in cfg["partitions"] if int(j) >= 0]
    coefs = [float(c) for c in cfg["coefficients"]][: len(parts)]
    theta, _ = flatten(arrays)
    coded = np.zeros_like(theta)
    compute_s = 0.0
    if parts:
        data, index = run_partitions(cfg, int(cfg["num-partitions"]))
        model = _model(str(cfg["model"]), data.input_shape, data.num_classes)
        t0 = time.perf_counter()  # compute only: data loading is cached after the first round
        if memo is not None and memo.get("round") != server_round:
            memo.clear()
            memo["round"] = server_round
        for j, c in zip(parts, coefs, strict=True):
            u = None if memo is None else memo.get(j)
            if u is None:
                u = _partition_update(j, cfg, theta, data, index[j], model, keys)
                if memo is not None:
                    memo[j] = u
            coded += c * private_update(u, j, cfg, keys, worker)
        compute_s = time.perf_counter() - t0
    latency = make_latency(
        str(cfg["latency"]),
        scale=float(cfg["latency-scale"]),
        rate=float(cfg["latency-rate"]),
        shape=float(cfg["latency-shape"]),
        p=float(cfg["latency-p"]),
        slowdown=float(cfg["latency-slowdown"]),
        trace=str(cfg["latency-trace"]),
        seed=seed,
    )
    delay = client_delay(
        latency, worker=worker, round_index=server_round, load=len(parts), seed=seed
    )
    if worker in worker_list(str(cfg["slow-workers"])):
        delay += float(cfg["slow-delay-s"])
    delay += float(cfg["partition-cost-s"]) * len(parts)  # modelled compute: s+1 partitions
    delay += extra_delay_s
    if worker in worker_list(str(cfg["nan-workers"])):
        coded[0] = np.nan  # fault injection for tests: a corrupted reply
    measured = compute_s if str(cfg["virtual-compute"]) == "measured" else 0.0
    return coded, {"compute-s": compute_s, "delay-s": delay, "virtual-s": measured + delay}


@app.train()
def train(msg: Message, context: Context) -> Message:
    cfg = msg.content.config_records["config"]
    extra = float(context.node_config.get("extra-delay-s", 0.0))
    keys = None
    if str(cfg.get("dp", "none")) in ("partition", "sample"):
        keys = _keys(str(context.node_config.get("dp-key-file", "")))
    coded, timing = compute_reply(cfg, msg.content.array_records["arrays"], extra, keys)
    if str(cfg["timing"]) == "wallclock":
        time.sleep(timing["delay-s"])
    return make_reply(msg, coded, timing)


def make_reply(msg: Message, coded: np.ndarray, timing: dict[str, float]) -> Message:
    """The reply the strategy expects: ``coded/update`` and ``meta`` (worker, round, timing)."""
    cfg = msg.content.config_records["config"]
    meta = MetricRecord(
        {"worker": int(cfg["worker"]), "server-round": int(cfg["server-round"]), **timing}
    )
    content = RecordDict({"coded": ArrayRecord({"update": Array(coded)}), "meta": meta})
    return Message(content, reply_to=msg)
