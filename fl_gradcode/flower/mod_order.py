"""Client mods listed after ``gradient_coding_mod``: named once in a warning.

``ClientApp(mods=[gradient_coding_mod, m])`` runs ``m`` inside the coded computation: once per
partition the node computes, on that partition's train message (the app's records, the node's
context with the partition's ``partition-id``), before coding. For the clipping and local-DP
mods that is the point (each partition's update clipped / noised before coding); a mod that
acts per node (logs a node's metrics or timing, e.g. the TensorBoard and W&B mods of Flower's
custom-mods example) then acts once per partition, with the partition's metrics, which is not
what it did without coding. :func:`warn_inner_mods` names such mods once per mod instance.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["PER_PARTITION_MODS", "inner_mods", "warn_inner_mods"]

#: Mods whose per-partition run is what coding needs (documented in docs/works_with.md).
PER_PARTITION_MODS = frozenset({"fixedclipping_mod", "adaptiveclipping_mod", "LocalDpMod"})


class WarnsOnce(Protocol):
    """Gives each kind of warning once (:class:`~fl_gradcode.flower.client.notices.Notices`)."""

    def once(self, kind: str, text: str) -> None: ...


def _name(mod: Any) -> str:
    return getattr(mod, "__name__", None) or type(mod).__name__


def inner_mods(call_next: Callable[..., Any], limit: int = 32) -> list[str]:
    """The names of the mods ``call_next`` runs before the app (Flower's ``make_ffn`` chain:
    each link's closure holds ``_mod`` and ``_ffn``); ``[]`` when it cannot tell."""
    names: list[str] = []
    fn: Any = call_next
    for _ in range(limit):
        code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None)
        if code is None or not cells:
            break
        free = dict(zip(code.co_freevars, cells, strict=False))
        if "_mod" not in free or "_ffn" not in free:
            break
        try:
            names.append(_name(free["_mod"].cell_contents))
            fn = free["_ffn"].cell_contents
        except ValueError:  # an empty cell
            break
    return names


def warn_inner_mods(call_next: Callable[..., Any], notices: WarnsOnce) -> None:
    """Warn (once per ``notices``: the mod's) about each mod listed after
    ``gradient_coding_mod`` that is not one of :data:`PER_PARTITION_MODS`."""
    for name in inner_mods(call_next):
        if name in PER_PARTITION_MODS:
            continue
        notices.once(
            f"inner-mod:{name}",
            f"{name} is listed after gradient_coding_mod in ClientApp(mods=[...]): it runs "
            "inside the coded computation, once per partition this node computes (on that "
            "partition's train message and context), not once per node and round. A mod that "
            "logs or acts per node (metrics, timing) then sees each partition as the node. "
            "List it before gradient_coding_mod only if it passes on the protocol's messages "
            "(the identify handshake and coded instructions carry no 'arrays' or 'config' "
            "record); see 'Client mods' in docs/works_with.md.",
        )
