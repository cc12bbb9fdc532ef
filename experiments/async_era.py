"""Coded asynchrony that replicates by need read against the era: a low bar, lifted to 1 for
the rest of the run once a partition's recent updates were larger than the federation's of
the same era (``experiments/grid.toml``, amendment 28), read beside the benchmark's verdict.

A client computes its neighbour's partition while that partition's jobs are fewer than 0.25
times its own partition's, or fewer than its own partition's once the geometric mean of that
partition's last three update norms, each over the median norm of the updates computed from
the models of its own server step and the two before, was above ``rho``
(:class:`fl_gradcode.flower.asynchronous.ReplicatedFedBuff`, ``need_reference="era"``).
``python -m experiments.async_era --phase dev`` picks ONE ``rho`` among 1.5, 2, 3 on the
development seeds of amendment 24's fifteen cells by amendment 24's rule; ``--phase eval
[--cells PATTERNS]`` runs the pick on the evaluation seeds, paired by seed with FedBuff,
amendment 23's ``s = 1`` and amendment 24's bar (``over_earlier``). Results:
``results/async_era.json``.
FedBuff: Nguyen et al., AISTATS 2022, https://arxiv.org/abs/2106.06639; the placement: Tandon
et al., *Gradient Coding*, ICML 2017; sampling by update norm: Chen, Horvath and Richtarik,
*Optimal Client Sampling for Federated Learning*, TMLR 2022, https://arxiv.org/abs/2010.13723.
"""

from __future__ import annotations

from experiments.async_bar import ERA, command

__all__ = ["main"]

#: the command line (``--phase dev|eval``, ``--cells``, ``--out``)
main = command(ERA, __doc__)

if __name__ == "__main__":
    raise SystemExit(main())
