"""Replica-identical seeding of a partition's computation: every replica of partition ``j``
draws the same random numbers, whichever node runs it.

Without a partition key the seed is a function of ``(run seed, round, j)`` only (public,
reproducible); with the partition's key it is ``HMAC(key_j, nonce, round, j)`` (secret to the
server, fresh in every run).
"""

from __future__ import annotations

import hashlib
import random
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from ...privacy import noise_seed

__all__ = ["imported_torch", "partition_seed", "reseeded", "rng_states", "seed_everything",
           "set_rng_states"]


def partition_seed(
    seed: int, server_round: int, partition: int, key: bytes | None = None, nonce: str = ""
) -> int:
    """The 63-bit seed of partition ``partition``'s computation in ``server_round``.

    Without ``key``: a hash of ``(seed, round, partition)`` (public, reproducible). With the
    partition's key: ``HMAC-SHA256(key, nonce, round, partition)`` (secret, fresh per run).
    """
    if key is not None:
        return noise_seed(key, server_round, partition, purpose="app-rng", nonce=nonce) >> 1
    tag = f"fl-gradcode;seed={int(seed)};round={int(server_round)};partition={int(partition)}"
    return int.from_bytes(hashlib.sha256(tag.encode()).digest()[:8], "little") >> 1


def imported_torch() -> Any:
    """torch if this process has imported it (the app did), else ``None``."""
    return sys.modules.get("torch")


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's global and (if imported) torch's RNGs: what the mod does before
    each partition's training, and the deadline baseline before each client's."""
    random.seed(seed)
    # the app may draw from numpy's global RNG: seeded with all 63 bits (one 32-bit word of a
    # secret seed would give 2**32 noise streams, a collision in ~1e5 releases)
    np.random.seed([seed & 0xFFFFFFFF, seed >> 32])  # noqa: NPY002
    torch = imported_torch()
    if torch is not None:
        _seed_torch(torch, seed)


def _seed_torch(torch: Any, seed: int) -> None:
    """``torch.manual_seed(seed)``. Without an accelerator only the CPU generator exists, and
    it alone is seeded: ``torch.manual_seed`` would also register deferred seeding of every
    absent device, formatting a stack trace for each (a third of a millisecond per partition
    on a quiet machine, milliseconds on a loaded one)."""
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and not accelerator.is_available():
        torch.default_generator.manual_seed(int(seed))
    else:
        torch.manual_seed(seed)


def rng_states() -> tuple[Any, Any, Any]:
    """Python's, numpy's global and (if imported) torch's RNG states, for
    :func:`set_rng_states`."""
    torch = imported_torch()
    return (random.getstate(), np.random.get_state(),  # noqa: NPY002
            None if torch is None else torch.get_rng_state())


def set_rng_states(states: tuple[Any, Any, Any]) -> None:
    """Restore what :func:`rng_states` saved (torch's only if it was imported then)."""
    random.setstate(states[0])
    np.random.set_state(states[1])  # noqa: NPY002
    torch = imported_torch()
    if states[2] is not None and torch is not None:
        torch.set_rng_state(states[2])


@contextmanager
def reseeded(seed: int | None) -> Iterator[None]:
    """Run the block with Python's, numpy's global and (if imported) torch's RNGs seeded from
    ``seed`` (:func:`seed_everything`; ``None``: left as they are), and give the caller's
    states back after it, even when it raises: in one process the server's Flower samples
    its cohorts from Python's ``random``, which a client's seeding must not move."""
    saved = rng_states()
    if seed is not None:
        seed_everything(seed)
    try:
        yield
    finally:
        set_rng_states(saved)
