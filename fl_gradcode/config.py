"""Run-config keys (kebab-case) and their defaults; ``pyproject.toml`` repeats them for Flower.

A test checks that ``[tool.flwr.app.config]`` and :data:`DEFAULTS` agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["DEFAULTS", "merge_config"]

DEFAULTS: dict[str, Any] = {
    "num-rounds": 30,
    "num-clients": 0,  # 0: one client per connected SuperNode
    "code": "grouped-rs",
    "s": 3,  # or "auto": chosen every round from observed latencies
    "s-max": 0,  # s="auto": largest tolerance; 0 = max(1, n // 4)
    "auto-margin": 0.1,  # s="auto": larger s preferred when predicted within this slack
    "fraction-train": 1.0,  # cohort sampled each round (Flower's fraction_train); 1 = all
    "exclude-slow": 0.0,  # s="auto": clients this many times slower may be excluded; 0 = never
    # s="auto": JSON file of latency observations read at start (if it exists: a warm start
    # instead of s_max) and rewritten after every round; "": none
    "latency-state": "",
    "update": "gradient",
    "local-epochs": 1,
    "batch-size": 32,
    "lr": 0.5,
    "server-lr": 1.0,
    "server-optimizer": "sgd",
    "momentum": 0.9,
    "dataset": "digits",
    "synthetic-alpha": 1.0,
    "synthetic-beta": 1.0,
    "model": "logreg",
    "partitioner": "dirichlet",
    "dirichlet-alpha": 0.5,
    "latency": "bimodal",
    "latency-scale": 0.1,
    "latency-rate": 10.0,
    "latency-shape": 2.0,
    "latency-p": 0.1,
    "latency-slowdown": 20.0,
    "latency-trace": "canada",
    "latency-drift-round": 15,
    "latency-seed": -1,  # which clients are persistently slow; -1: from seed
    "virtual-compute": "measured",
    "partition-cost-s": 0.0,
    "busy": "",  # "skip", "queue" or "fit" a busy client's work; "": queue for auto, else skip
    "upload-bandwidth": 0.0,  # virtual timing: bytes/s per client upload; 0 = instantaneous
    "m": 1,  # code="comm-efficient": every reply is 1/m of the model
    "timing": "virtual",
    "straggler-timeout": 10.0,
    "stop-late-work": False,  # workers stop at the round's deadline instead of finishing
    # s="auto": each round's deadline is this factor times its predicted time (and work stops
    # there); 0 = the straggler-timeout only
    "auto-deadline": 0.0,
    "max-decode-error": 0.5,
    "min-replies": -1,  # -1: n - s for approximate codes, none for exact codes; 0: none
    "round-timeout": 600.0,
    "warmup-timeout": 120.0,
    "slow-workers": "",
    "slow-delay-s": 0.0,
    "nan-workers": "",
    "dp": "none",
    "clip-norm": 1.0,
    "noise-multiplier": 1.0,
    "dp-noise": "identical",
    "delta": 1e-5,
    "accountant": "rdp",
    "target-epsilon": 0.0,
    "dp-run-nonce": "",  # empty: a fresh nonce per run (pinning reuses noise across runs)
    "dp-server-key-file": "",  # central DP: server key for reproducible noise (default: OS)
    "seed": 0,
    "results-dir": "results/run",
    # "": the coded run; "drop-stragglers": plain Flower FedAvg that averages the replies that
    # arrived by straggler-timeout (virtual time) and drops the rest (a baseline)
    "rival": "",
}


def merge_config(run_config: Mapping[str, Any] | None) -> dict[str, Any]:
    """Defaults overridden by ``run_config``; unknown keys raise a ``ValueError`` naming them."""
    cfg = dict(DEFAULTS)
    for key, value in (run_config or {}).items():
        if key not in DEFAULTS:
            raise ValueError(f"unknown run-config key {key!r}; known keys: {sorted(DEFAULTS)}")
        default = DEFAULTS[key]
        if key == "s" and value == "auto":
            cfg[key] = value
            continue
        if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if type(value) is not type(default):
            raise ValueError(
                f"run-config {key}={value!r} must be {type(default).__name__} like its default "
                f"{default!r}"
            )
        cfg[key] = value
    return cfg


def worker_list(text: str) -> set[int]:
    """``"1,4"`` -> ``{1, 4}`` (for ``slow-workers`` / ``nan-workers``)."""
    try:
        return {int(x) for x in str(text).replace(" ", "").split(",") if x}
    except ValueError as exc:
        raise ValueError(f"expected comma-separated worker indices; got {text!r}") from exc
