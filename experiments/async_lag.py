"""Coded asynchrony that replicates once the model shows a class it never learnt: FedBuff over
partitions held as in gradient coding, switched to the least-served rule for good once the
median class's recall on the server's held-out data is at least ``L`` while some class's best
recall so far is below 0.1 (``experiments/grid.toml``, amendment 32), read beside the
benchmark's verdict.

Unlike the update-norm rules of amendments 26 to 29, the signal is not a statistic of the
updates the replication steers (:class:`fl_gradcode.flower.asynchronous.ReplicatedFedBuff`,
``lag_level``). ``python -m experiments.async_lag --phase dev`` picks ONE ``L`` among 0.8, 0.9,
0.95 on the development seeds of amendment 24's fifteen cells by amendment 24's rule;
``--phase eval [--cells PATTERNS]`` runs the pick on the evaluation seeds, paired by seed with
FedBuff, amendment 23's ``s = 1`` and amendment 24's bar (``over_earlier``). Results:
``results/async_lag.json``.
FedBuff: Nguyen et al., AISTATS 2022, https://arxiv.org/abs/2106.06639; the placement: Tandon
et al., *Gradient Coding*, ICML 2017.
"""

from __future__ import annotations

from experiments.async_bar import LAG, command

__all__ = ["main"]

#: the command line (``--phase dev|eval``, ``--cells``, ``--out``)
main = command(LAG, __doc__)

if __name__ == "__main__":
    raise SystemExit(main())
