"""Coded asynchrony that replicates by need, latched: a low bar, lifted to 1 for the rest of
the run once a neighbour's partition's update was larger than the client's own
(``experiments/grid.toml``, amendment 27), read beside the benchmark's verdict.

A client computes its neighbour's partition while that partition's jobs are fewer than 0.25
times its own partition's, or fewer than its own partition's once the neighbour's partition's
last update was more than ``rho`` times as large as its own partition's last update
(:class:`fl_gradcode.flower.asynchronous.ReplicatedFedBuff`, ``need_ratio``, ``need_latch``).
``python -m experiments.async_latch --phase dev`` picks ONE ``rho`` among 1.5, 2, 3 on the
development seeds of amendment 24's fifteen cells by amendment 24's rule; ``--phase eval
[--cells PATTERNS]`` runs the pick on the evaluation seeds, paired by seed with FedBuff,
amendment 23's ``s = 1`` and amendment 24's bar (``over_earlier``). Results:
``results/async_latch.json``.
FedBuff: Nguyen et al., AISTATS 2022, https://arxiv.org/abs/2106.06639; the placement: Tandon
et al., *Gradient Coding*, ICML 2017; sampling by update norm: Chen, Horvath and Richtarik,
*Optimal Client Sampling for Federated Learning*, TMLR 2022, https://arxiv.org/abs/2010.13723.
"""

from __future__ import annotations

from experiments.async_bar import LATCH, command

__all__ = ["main"]

#: the command line (``--phase dev|eval``, ``--cells``, ``--out``)
main = command(LATCH, __doc__)

if __name__ == "__main__":
    raise SystemExit(main())
