"""The benchmark's runs, each ``(method, seed)`` made once per cell: :class:`Runner` runs the
methods of :mod:`experiments.rival_runs` on a cell (wait-for-all and deadline runs are reused
by the deadline rules; a fixed code's own deadline is read from its runs whose deadline never
binds), optionally through a :class:`~experiments.journal.Journal` that resumes a cut run."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from experiments.journal import Journal
from experiments.rival_runs import (
    Cell,
    run_auto_replicated,
    run_coded,
    run_replicated,
    run_rival,
)
from experiments.summary import fmt

__all__ = ["OPEN_DEADLINE_S", "Runner", "with_timeout"]


class Runner:
    """Runs each ``(method, seed)`` once (wait-for-all and deadline runs are reused by the
    deadline rules)."""

    def __init__(self, cell: Cell, log: Callable[[str], None] = print,
                 journal: Journal | None = None) -> None:
        self.cell = cell
        self.log = log
        self.cache: dict[tuple, dict[str, Any]] = {}
        self.coded_cell: Cell | None = None
        #: a fixed code's own deadline (:meth:`code_deadline`), where it has one
        self.code_deadlines: dict[str, float] = {}
        self.journal = journal

    def _run(self, key: tuple, make: Callable[[], dict[str, Any]],
             label: str | None = None) -> dict[str, Any]:
        if key not in self.cache and self.journal is not None:
            resumed = self.journal.get(key)
            if resumed is not None:
                self.cache[key] = resumed
        if key not in self.cache:
            record = make()
            self.cache[key] = record
            if self.journal is not None:
                self.journal.add(key, record)
            reached = record["time_to_target"]
            self.log(f"  {label or key[0]:>14} seed {record['seed']:>3}: time to target "
                     f"{'never' if reached is None else format(reached, '.2f') + ' s'}, final "
                     f"{fmt(record['final_accuracy'], '.3f')}, {record['rounds']} rounds, "
                     f"compute {record['client_compute_s']:.1f} s ({record['wall_s']:.1f} s)")
        return self.cache[key]

    def coded(self, method: str, seed: int) -> dict[str, Any]:
        """A coded method's run, on :attr:`coded_cell` (the cell with the coded methods'
        straggler deadline) when set."""
        cell = self.coded_cell or self.cell
        deadline = self.code_deadlines.get(method)
        if deadline is None:
            return self._run((method, seed), lambda: run_coded(method, seed, cell))
        own = with_timeout(cell, deadline)
        return self._run((method, round(deadline, 12), seed),
                         lambda: run_coded(method, seed, own), f"{method} {deadline:.3g}s")

    def code_deadline(self, method: str, dev_seeds: Sequence[int], quantile: float,
                      slack: float) -> float:
        """The stated deadline rule applied to the fixed code ``method``'s own client times:
        every valid reply's arrival in its runs on ``dev_seeds`` whose deadline never binds
        (:data:`OPEN_DEADLINE_S`), its other settings as the coded methods'."""
        from fl_gradcode.rivals import stated_deadline

        times = [t for seed in dev_seeds for t in self.open(method, seed)["client_times_s"]]
        return stated_deadline(times, quantile, slack)

    def open(self, method: str, seed: int) -> dict[str, Any]:
        """The coded ``method``'s run whose deadline never binds, with its client times."""
        cell = with_timeout(self.coded_cell or self.cell, OPEN_DEADLINE_S)
        return self._run((method, "open", seed), lambda: run_coded(
            method, seed, cell, client_times=True), f"{method} open")

    def rival(self, method: str, seed: int) -> dict[str, Any]:
        if method == "wait-for-all" and self.cell.private:  # Flower's FedAvg applies no DP
            return {**self.open("uncoded:0", seed), "method": "wait-for-all"}
        return self._run((method, seed), lambda: run_rival(method, seed, self.cell))

    def deadline(self, deadline: float, seed: int, label: str) -> dict[str, Any]:
        record = self._run(("deadline", round(deadline, 12), seed),
                           lambda: run_rival("deadline", seed, self.cell, deadline),
                           f"{label} {deadline:.3g}s" if label != "deadline" else None)
        return {**record, "method": label}

    def fedbuff(self, cell: Cell, seed: int) -> dict[str, Any]:
        """FedBuff with ``cell``'s server learning rate and buffer (its tuning's runs and the
        pick's are told apart by both)."""
        lr, fraction = float(cell.fedbuff_server_lr), float(cell.fedbuff_buffer_fraction)
        return self._run(("fedbuff", lr, fraction, seed),
                         lambda: run_rival("fedbuff", seed, cell),
                         f"fedbuff lr {lr:g} K {cell.fedbuff_buffer()}")

    def replicated(self, cell: Cell, s: int, seed: int) -> dict[str, Any]:
        """``fedbuff-replicated`` with ``s >= 1`` and ``cell``'s FedBuff settings."""
        lr, fraction = float(cell.fedbuff_server_lr), float(cell.fedbuff_buffer_fraction)
        return self._run(("fedbuff-replicated", lr, fraction, s, seed),
                         lambda: run_replicated(s, seed, cell),
                         f"fedbuff-replicated s {s}")

    def auto_replicated(self, cell: Cell, seed: int) -> dict[str, Any]:
        """``fedbuff-auto``: the main job's asynchronous ``s='auto'`` with ``cell``'s FedBuff
        settings."""
        lr, fraction = float(cell.fedbuff_server_lr), float(cell.fedbuff_buffer_fraction)
        return self._run(("fedbuff-auto", lr, fraction, seed),
                         lambda: run_auto_replicated(seed, cell), "fedbuff-auto")

    def first_k(self, cell: Cell, seed: int) -> dict[str, Any]:
        """first-k with ``cell``'s over-commitment (its tuning's runs told apart by it)."""
        return self._run(("first-k", float(cell.overcommit), seed),
                         lambda: run_rival("first-k", seed, cell),
                         f"first-k c {cell.overcommit:g} K {cell.first_k()}")

    def stated_deadline(self, dev_seeds: Sequence[int], quantile: float,
                        slack: float) -> float:
        from fl_gradcode.rivals import stated_deadline

        times = [t for seed in dev_seeds
                 for t in self.rival("wait-for-all", seed)["client_times_s"]]
        return stated_deadline(times, quantile, slack)


#: A round deadline that never binds (seconds): a fixed code's round ends at its decode, the
#: runs its own deadline is read from (:meth:`Runner.code_deadline`).
OPEN_DEADLINE_S = 1e6


def with_timeout(cell: Cell, seconds: float) -> Cell:
    return dataclasses.replace(cell, run_config={**cell.run_config,
                                                 "straggler-timeout": float(seconds)})
