"""The Flower layer: one client mod and one strategy wrapper make any Flower app gradient-coded.

>>> from fl_gradcode.flower import GradientCoding, gradient_coding_mod  # doctest: +SKIP

Client side: ``ClientApp(mods=[gradient_coding_mod])``; server side:
``GradientCoding(FedAvg(), code="grouped-rs", s=2, ...)``. The modules: ``protocol`` (message
keys, reply layout, parsing into a rejection reason), ``mod`` (the client mod), ``wrapper``
(the strategy), ``grid`` (early return), ``clock`` (virtual / wallclock rounds), ``testing``
(an in-process grid running real ClientApps).
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .clock import VirtualClock, WallClock
    from .grid import EarlyReturnGrid
    from .mod import gradient_coding_mod, make_gradient_coding_mod, partition_seed
    from .policy import AdaptiveCodePolicy, CodePolicy, FixedCodePolicy
    from .protocol import PROTOCOL_KEY, RejectedReply
    from .sampling import seeded_sampling
    from .wrapper import GradientCoding

# Imported on first use: Flower starts one ClientApp process per message, and a process that
# only needs the mod then never imports the server side (wrapper, codes, scipy).
_LAZY = {
    "VirtualClock": "clock", "WallClock": "clock", "EarlyReturnGrid": "grid",
    "gradient_coding_mod": "mod", "make_gradient_coding_mod": "mod", "partition_seed": "mod",
    "PROTOCOL_KEY": "protocol", "RejectedReply": "protocol", "GradientCoding": "wrapper",
    "CodePolicy": "policy", "FixedCodePolicy": "policy", "AdaptiveCodePolicy": "policy",
    "seeded_sampling": "sampling",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{_LAZY[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = [
    "PROTOCOL_KEY",
    "AdaptiveCodePolicy",
    "CodePolicy",
    "EarlyReturnGrid",
    "FixedCodePolicy",
    "GradientCoding",
    "RejectedReply",
    "VirtualClock",
    "WallClock",
    "gradient_coding_mod",
    "make_gradient_coding_mod",
    "partition_seed",
    "seeded_sampling",
]
