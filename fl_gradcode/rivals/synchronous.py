"""Round-based rivals: wait for all, drop after a deadline, first ``K`` of ``ceil(c K)``.

All three are :class:`~fl_gradcode.flower.deadline.DeadlineFedAvg` (Flower's ``FedAvg`` with
arrivals on the coded runs' virtual clock) with another rule for when a round ends; each
round's row (``history``, ``rounds.jsonl``) is DeadlineFedAvg's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.serverapp import Grid

from ..flower.deadline import DeadlineFedAvg

__all__ = ["NO_DEADLINE", "FirstK", "WaitForAll", "deadline_grid", "stated_deadline"]

#: A deadline later than any round: the round waits for every reply.
NO_DEADLINE = 1e12

#: The stated deadline rule: ``SLACK`` times the ``QUANTILE`` of the client times seen.
QUANTILE = 0.75
SLACK = 3.0
#: The grid of the best deadline in hindsight: these multiples of the stated rule's deadline
#: (1.0 included, so the best in hindsight is never worse on the seeds it is chosen on).
GRID_FACTORS = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0)


def stated_deadline(arrivals: Iterable[float], quantile: float = QUANTILE,
                    slack: float = SLACK) -> float:
    """The round deadline the stated rule picks: ``slack`` times the ``quantile`` of the
    client times ``arrivals`` (virtual seconds from a round's start to a reply: compute plus
    latency) seen in wait-for-all runs on development seeds. A deadline at the quantile itself
    would drop a quarter of the replies of even idle clients; the slack is over the fast
    clients' time (Bonawitz et al., *Towards Federated Learning at Scale*, SysML 2019, pair a
    deadline with a goal count; here the deadline alone is tuned)."""
    times = np.asarray(list(arrivals), dtype=np.float64)
    if times.size == 0 or not np.all(np.isfinite(times)) or np.any(times < 0):
        raise ValueError(f"arrivals: expected non-negative finite seconds, got {times.size} "
                         "values (none, or some negative or not finite)")
    if not 0.0 < quantile <= 1.0 or not slack > 0:
        raise ValueError(f"quantile={quantile!r} must be in (0, 1] and slack={slack!r} > 0")
    return float(slack * np.quantile(times, quantile))


def deadline_grid(base: float, factors: Sequence[float] = GRID_FACTORS) -> list[float]:
    """The deadlines tried for the best deadline in hindsight: ``factors`` times ``base``
    (the stated rule's deadline)."""
    if not base > 0:
        raise ValueError(f"base={base!r} must be a positive deadline in seconds")
    return [float(base * f) for f in factors]


class WaitForAll(DeadlineFedAvg):
    """Flower's ``FedAvg`` as shipped (McMahan et al., *Communication-Efficient Learning of
    Deep Networks from Decentralized Data*, AISTATS 2017): sample the cohort, wait for every
    reply, example-weighted mean. Exact, as slow as the slowest sampled client. Takes
    :class:`DeadlineFedAvg`'s arguments except ``deadline``."""

    def __init__(self, **kwargs: Any) -> None:
        if "deadline" in kwargs:
            raise ValueError("WaitForAll waits for every reply: it takes no deadline "
                             "(use DeadlineFedAvg(deadline=...) to drop late replies)")
        super().__init__(deadline=NO_DEADLINE, **kwargs)


class FirstK(DeadlineFedAvg):
    """Over-commitment: sample ``ceil(overcommit * k)`` clients, average the first ``k``
    replies to arrive (virtual time), discard the rest (Bonawitz et al., *Towards Federated
    Learning at Scale*, SysML 2019, select 130 %; FedScale's aggregator over-commits 1.3x by
    default). Costs about ``(overcommit - 1) * k`` wasted client computations per round, and
    is biased towards fast clients like a deadline.

    Parameters
    ----------
    k : int
        Replies averaged per round (``>= 1``).
    overcommit : float
        Sampled clients per kept reply (``>= 1``; 1.3 by default).
    deadline : float
        Also end a round here with fewer than ``k`` replies (default: never).
    **kwargs : Any
        :class:`DeadlineFedAvg`'s other arguments and FedAvg's, except ``fraction_train`` and
        ``min_train_nodes`` (the sample size is ``ceil(overcommit * k)``).
    """

    def __init__(self, *, k: int, overcommit: float = 1.3, deadline: float = NO_DEADLINE,
                 **kwargs: Any) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k={k!r} must be an integer >= 1 (replies kept per round)")
        if not (isinstance(overcommit, (int, float)) and math.isfinite(overcommit)
                and overcommit >= 1.0):
            raise ValueError(f"overcommit={overcommit!r} must be a number >= 1")
        for name in ("fraction_train", "min_train_nodes"):
            if name in kwargs:
                raise ValueError(f"FirstK samples ceil(overcommit * k) nodes: do not pass "
                                 f"{name} (got {kwargs[name]!r})")
        self.k = k
        self.overcommit = float(overcommit)
        self.sample_size = math.ceil(self.overcommit * k - 1e-9)
        # FedAvg samples max(int(n * fraction_train), min_train_nodes): exactly sample_size
        super().__init__(deadline=deadline, fraction_train=1e-12,
                         min_train_nodes=self.sample_size, **kwargs)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> list[Message]:
        connected = len(list(grid.get_node_ids()))
        if connected < self.sample_size:
            raise ValueError(f"FirstK(k={self.k}, overcommit={self.overcommit}) samples "
                             f"{self.sample_size} nodes but only {connected} are connected: "
                             "lower k or overcommit")
        return super().configure_train(server_round, arrays, config, grid)

    def round_complete(self, arrived: list[int]) -> bool:
        """The round ends at the ``k``-th arrival (of the replies it can average: a reply
        weighing no examples, or laid out otherwise than the others, is not passed here)."""
        return len(arrived) >= self.k
