"""Flower ServerApp: build the code for the connected SuperNodes and run coded rounds."""

from __future__ import annotations

import time
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from fl_gradcode.codes import make_code
from fl_gradcode.config import merge_config
from fl_gradcode.data import run_partitions
from fl_gradcode.learning import dp_sgd_steps, evaluate, make_model
from fl_gradcode.privacy import DPConfig, PrivacyAccountant, independent_noise_multiplier
from fl_gradcode.results import RoundRecorder
from fl_gradcode.strategy import GradientCoding, flatten, to_array_record

# What the server forwards to clients in every train message (clients never need run_config).
CLIENT_KEYS = (
    "seed",
    "dataset",
    "synthetic-alpha",
    "synthetic-beta",
    "model",
    "partitioner",
    "dirichlet-alpha",
    "local-epochs",
    "batch-size",
    "latency",
    "latency-scale",
    "latency-rate",
    "latency-shape",
    "latency-p",
    "latency-slowdown",
    "latency-trace",
    "virtual-compute",
    "partition-cost-s",
    "slow-workers",
    "slow-delay-s",
    "nan-workers",
)


def wait_for_nodes(grid: Grid, want: int, timeout: float = 120.0, settle: float = 3.0) -> int:
    """Number of clients: ``want`` if > 0 (waiting for that many), else the connected count once
    it has been stable for ``settle`` seconds."""
    t_end = time.monotonic() + timeout
    last, since = -1, time.monotonic()
    while time.monotonic() < t_end:
        count = len(list(grid.get_node_ids()))
        if want > 0 and count >= want:
            return want
        if count != last:
            last, since = count, time.monotonic()
        elif want <= 0 and count > 0 and time.monotonic() - since >= settle:
            return count
        time.sleep(0.2)
    if want > 0:
        raise RuntimeError(f"only {last} SuperNodes connected within {timeout} s; need {want}")
    if last <= 0:
        raise RuntimeError(f"no SuperNode connected within {timeout} s")
    return last


def make_accountant(dp: DPConfig, code, sizes: np.ndarray, cfg: dict[str, Any]):
    """Opacus-backed accountant for the sampling the run really uses.

    partition / central: every partition is released once per round (sample rate 1) with noise
    multiplier ``sigma`` (``identical`` noise: every decode is post-processing of the noisy
    partition updates); ``independent`` noise: the server can average a partition's replicas,
    so the effective multiplier is ``independent_noise_multiplier(B w, sigma)``.
    sample: each partition's DP-SGD steps (sample rate ``1/len(loader)``); ε of the worst.
    """
    sigma = dp.noise_multiplier
    if dp.mode == "sample":
        units = []
        for size in sizes.astype(int):
            q, steps = dp_sgd_steps(
                int(size),
                kind=str(cfg["update"]),
                epochs=int(cfg["local-epochs"]),
                batch_size=int(cfg["batch-size"]),
            )
            units.append([(sigma, q, steps)])
        return PrivacyAccountant(dp, units)
    if dp.mode == "partition" and dp.noise == "independent":
        sigma = independent_noise_multiplier(code.B * code.weights, sigma)
    return PrivacyAccountant(dp, [(sigma, 1.0, 1)])


def build(cfg: dict[str, Any], n: int) -> tuple[GradientCoding, ArrayRecord]:
    """The strategy and initial model for ``n`` clients and a merged run config ``cfg``."""
    seed = int(cfg["seed"])
    if int(cfg["s"]) >= n:
        log(
            WARNING,
            "s=%d stragglers cannot be tolerated with n=%d clients; using s=%d "
            "(start more SuperNodes, e.g. --federation-config num-supernodes=12)",
            cfg["s"],
            n,
            n - 1,
        )
        cfg["s"] = n - 1
    options = {"rescale": True} if cfg["code"] == "ignore-stragglers" else {}
    unweighted = make_code(str(cfg["code"]), n=n, s=int(cfg["s"]), seed=seed, **options)
    data, index = run_partitions(cfg, unweighted.k)
    sizes = np.array([len(p) for p in index], dtype=np.float64)
    code = unweighted.with_weights(sizes / sizes.sum())  # built once: same B, same draws
    min_replies = int(cfg["min-replies"])
    if min_replies < 0:  # approximate codes take the fastest n - s replies
        min_replies = 0 if code.is_exact else n - int(cfg["s"])
    dp = DPConfig(
        mode=str(cfg["dp"]),
        clip_norm=float(cfg["clip-norm"]),
        noise_multiplier=float(cfg["noise-multiplier"]),
        noise=str(cfg["dp-noise"]),
        delta=float(cfg["delta"]),
        accountant=str(cfg["accountant"]),
        target_epsilon=float(cfg["target-epsilon"]),
    )
    accountant = make_accountant(dp, code, sizes, cfg) if dp.enabled else None
    model = make_model(str(cfg["model"]), data.input_shape, data.num_classes, seed)
    initial = {name: p.detach().numpy().copy() for name, p in model.named_parameters()}

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        theta, _ = flatten(arrays)
        loss, acc = evaluate(model, theta, data.x_test, data.y_test)
        return MetricRecord({"accuracy": acc, "loss": loss})

    results_dir = Path(str(cfg["results-dir"])).expanduser().resolve()
    recorder = RoundRecorder(
        results_dir,
        {
            **cfg,
            "num-clients": n,
            "code-k": code.k,
            "code-load": code.load,
            "partition-sizes": sizes.astype(int).tolist(),
        },
    )
    strategy = GradientCoding(
        code,
        update=str(cfg["update"]),
        lr=float(cfg["lr"]),
        server_optimizer=str(cfg["server-optimizer"]),
        server_lr=float(cfg["server-lr"]),
        momentum=float(cfg["momentum"]),
        timing=str(cfg["timing"]),
        straggler_timeout=float(cfg["straggler-timeout"]),
        max_decode_error=float(cfg["max-decode-error"]),
        client_config={key: cfg[key] for key in CLIENT_KEYS},
        evaluate_fn=evaluate_fn,
        recorder=recorder,
        round_timeout=float(cfg["round-timeout"]),
        warmup_timeout=float(cfg["warmup-timeout"]),
        min_replies=min_replies or None,
        num_rounds=int(cfg["num-rounds"]),
        dp=dp,
        accountant=accountant,
        seed=seed,
    )
    log(
        INFO,
        "fl-gradcode: %d clients, code %s (k=%d, load %d, tolerates %d), %s updates, %s timing, "
        "dp=%s; results in %s",
        n,
        code.name,
        code.k,
        code.load,
        code.s,
        cfg["update"],
        cfg["timing"],
        dp.mode,
        results_dir,
    )
    return strategy, to_array_record(initial)


def run(grid: Grid, run_config: dict[str, Any]) -> GradientCoding:
    """Run a coded job with ``run_config`` (merged over the defaults) on ``grid``."""
    cfg = merge_config(run_config)
    n = wait_for_nodes(grid, int(cfg["num-clients"]))
    strategy, initial = build(cfg, n)
    strategy.start(
        grid=grid,
        initial_arrays=initial,
        num_rounds=int(cfg["num-rounds"]),
        timeout=float(cfg["round-timeout"]),
    )
    return strategy


def run_in_process(
    run_config: dict[str, Any],
    n: int,
    *,
    keys: Any = None,
    recorded: list | None = None,
) -> tuple[GradientCoding, np.ndarray]:
    """The same job without Ray: the real strategy and the real client computation
    (``clients.app.compute_reply``) over an in-process :class:`LocalGrid`, in virtual time.

    This is what makes experiments with 100+ clients honest on a 2-core machine: the virtual
    arrival times come from the latency model, not from how a thread pool happened to schedule
    the clients. ``keys`` are the clients' DP partition keys; ``recorded`` collects every pushed
    message. Returns the strategy (its ``history`` is the per-round record) and the final model.
    """
    from clients.app import compute_reply, make_reply
    from fl_gradcode.local_grid import LocalGrid, set_task_identity

    set_task_identity()
    cfg = merge_config({**run_config, "timing": "virtual"})
    strategy, initial = build(cfg, n)

    memo: dict = {}

    def respond(msg, worker):
        c = msg.content.config_records["config"]
        coded, timing = compute_reply(c, msg.content.array_records["arrays"], 0.0, keys, memo)
        return make_reply(msg, coded, timing)

    grid = LocalGrid(n, respond)
    result = strategy.start(
        grid=grid, initial_arrays=initial, num_rounds=int(cfg["num-rounds"]), timeout=3600
    )
    if recorded is not None:
        recorded.extend(grid.pushed)
    return strategy, flatten(result.arrays)[0]


def make_server_app(overrides: dict[str, Any] | None = None) -> ServerApp:
    """A ServerApp whose run config is ``context.run_config`` updated with ``overrides``
    (``run_simulation`` passes an empty run config; tests use the overrides)."""
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        run(grid, {**dict(context.run_config), **(overrides or {})})

    return server_app


app = make_server_app()
