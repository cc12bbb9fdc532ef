"""The Flower layer: one client mod and one strategy wrapper make any Flower app gradient-coded.

>>> from fl_gradcode.flower import GradientCoding, gradient_coding_mod  # doctest: +SKIP

Client side: ``ClientApp(mods=[gradient_coding_mod])``; server side:
``GradientCoding(FedAvg(), code="grouped-rs", s=2, ...)``. The modules: ``protocol`` (message
keys, reply layout, parsing into a rejection reason), ``mod`` (the client mod), ``wrapper``
(the strategy), ``grid`` (early return), ``clock`` (virtual / wallclock rounds), ``testing``
(an in-process grid running real ClientApps).
"""

from .clock import VirtualClock, WallClock
from .grid import EarlyReturnGrid
from .mod import gradient_coding_mod, make_gradient_coding_mod, partition_seed
from .protocol import PROTOCOL_KEY, RejectedReply
from .wrapper import GradientCoding

__all__ = [
    "PROTOCOL_KEY",
    "EarlyReturnGrid",
    "GradientCoding",
    "RejectedReply",
    "VirtualClock",
    "WallClock",
    "gradient_coding_mod",
    "make_gradient_coding_mod",
    "partition_seed",
]
