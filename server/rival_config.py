"""Which run configs a rival run (``rival``: Flower's own FedAvg, with or without a round
deadline) can honour: one rule for the ServerApp (``server.app.build_rival``), the three-way
launcher (``server.launch``) and the benchmark's rivals (``experiments.rival_runs``).

A rival is plain Flower FedAvg on the coded run's data, model, seeds and latency draws. A key
it would not apply is refused, naming it, rather than dropped without a word: DP, a server
optimiser, the client faults of ``fault_injection_mod`` (they act on coded messages only, so
the rival would run without them and the comparison would flatter it), and, for
``drop-stragglers``, any coded-only key (``code``, ``s``, ``verify``, ``roster``, ...) set to
another value than its default. The launcher and the benchmark drop the coded-only keys from
their rival runs themselves (the user's values stay in the coded run); ``fedavg`` is
``server.deploy_local``'s baseline, which takes the coded run's whole ``--run-config`` and
reads none of its coded-only keys."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fl_gradcode.config import coded_only_keys, key

__all__ = ["FAULT_KEYS", "RIVALS", "rival_refusal", "shared_keys"]

#: ``rival`` values: runs that are not coded, for comparisons (``""``: the coded run):
#: Flower's FedAvg dropping the replies later than ``straggler-timeout`` (virtual time), and
#: plain Flower FedAvg waiting for every reply (any timing: deploy_local's baseline).
RIVALS = ("drop-stragglers", "fedavg")
#: Client faults injected around the coding mod; they act on coded messages only.
FAULT_KEYS = ("slow-workers", "nan-workers")


def shared_keys(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` without the coded-only keys (``rival`` among them): what a rival run takes
    from the coded run's config (the launcher's, the benchmark's and the in-process rivals)."""
    coded_only = coded_only_keys()
    return {k: v for k, v in values.items() if k not in coded_only}


def rival_refusal(cfg: Mapping[str, Any], rival: str) -> str | None:
    """Why ``rival`` cannot run with the merged run config ``cfg`` (``None``: it can); the
    reason starts with the offending ``key=value``."""
    if rival not in RIVALS:
        return f"rival={rival!r}: expected one of {RIVALS} ('' is the coded run)"
    plain = f"rival={rival!r} is plain Flower FedAvg"
    if str(cfg["dp"]) != "none":
        return f"dp={cfg['dp']!r}: {plain}, which applies no DP; run it with dp='none'"
    if str(cfg["server-optimizer"]) != "sgd" or float(cfg["server-lr"]) != 1.0:
        return (f"server-optimizer={cfg['server-optimizer']!r}, server-lr={cfg['server-lr']!r}:"
                f" {plain}; it needs server-optimizer='sgd' and server-lr=1.0")
    if rival == "drop-stragglers" and str(cfg["timing"]) != "virtual":
        return (f"timing={cfg['timing']!r}: rival={rival!r} drops stragglers in virtual time; "
                "it needs timing='virtual'")
    if rival == "fedavg" and str(cfg["timing"]) != "virtual" and str(cfg["latency"]) != "none":
        return (f"latency={cfg['latency']!r}: rival={rival!r} with timing={cfg['timing']!r} "
                "sleeps no simulated latency (the coded run's clients would): run both with "
                "latency='none'")
    faults = [f"{name}={cfg[name]!r}" for name in FAULT_KEYS if str(cfg[name]).strip()]
    if faults:
        return (f"{', '.join(faults)}: client faults are injected into coded messages only, so "
                f"rival={rival!r} would run without them; run the rival without faults")
    if rival == "fedavg":  # deploy_local's baseline: the coded run's whole config, by design
        return None
    coded = [f"{name}={cfg[name]!r}" for name in coded_only_keys()
             if name != "rival" and name in cfg and _differs(name, cfg[name])]
    if coded:
        return (f"{', '.join(coded)}: read by coded runs only, so rival={rival!r} would ignore "
                "them; remove them from the rival's run config")
    return None


def _differs(name: str, value: Any) -> bool:
    entry = key(name)
    try:
        return entry.cast(value) != entry.cast(entry.default)
    except (TypeError, ValueError):
        return True
