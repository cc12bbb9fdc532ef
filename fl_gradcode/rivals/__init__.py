"""What a Flower user would run instead of gradient coding: small public Flower strategies.

Each is a subclass of Flower's ``FedAvg`` (Message API) on the same virtual clock, seeds and
latency draws as the coded runs (:class:`~fl_gradcode.flower.clock.VirtualClock`,
:func:`fl_gradcode.latency.client_delay`), with the ClientApp's ``train_timing_mod``:

* :class:`WaitForAll`: Flower's FedAvg as shipped, waiting for every sampled client;
* :class:`DeadlineFedAvg`: FedAvg dropping the replies later than a round deadline, with
  :func:`stated_deadline` (the pre-stated rule that picks it from development runs) and
  :func:`deadline_grid` (the grid on which the best deadline in hindsight is sought);
* :class:`FirstK`: over-commitment, sample ``ceil(c K)`` and keep the first ``K`` arrivals;
* :class:`FedBuff`: buffered asynchronous aggregation with staleness weights.

>>> from fl_gradcode.rivals import FirstK, FedBuff, WaitForAll  # doctest: +SKIP
"""

from ..flower.deadline import DeadlineFedAvg, train_timing_mod
from .fedbuff import FedBuff, staleness_weight
from .synchronous import NO_DEADLINE, FirstK, WaitForAll, deadline_grid, stated_deadline

__all__ = [
    "NO_DEADLINE",
    "DeadlineFedAvg",
    "FedBuff",
    "FirstK",
    "WaitForAll",
    "deadline_grid",
    "staleness_weight",
    "stated_deadline",
    "train_timing_mod",
]
