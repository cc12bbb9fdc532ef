"""Coded asynchrony that replicates by need read against a cohort's era, with a prior: as
amendment 28 (``experiments.async_era``), but the era spans as many server steps as take a
cohort's updates and a partition read fewer than twice is served as if needed
(``experiments/grid.toml``, amendment 29), read beside the benchmark's verdict.

A client computes its neighbour's partition while that partition's jobs are fewer than 0.25
times its own partition's, or fewer than its own partition's while that partition has been
read fewer than twice, or for good once the geometric mean of its last three update norms,
each over the median norm of the updates computed from the models of its own server step and
the ``ceil(cohort / K)`` before, was above ``rho``
(:class:`fl_gradcode.flower.asynchronous.ReplicatedFedBuff`, ``need_reference="cohort"``,
``need_prior=True``). ``python -m experiments.async_prior --phase dev`` picks ONE ``rho``
among 1.5, 2, 3 on the development seeds of amendment 24's fifteen cells by amendment 24's
rule; ``--phase eval [--cells PATTERNS]`` runs the pick on the evaluation seeds, paired by
seed with FedBuff, amendment 23's ``s = 1`` and amendment 24's bar (``over_earlier``).
Results: ``results/async_prior.json``.
FedBuff: Nguyen et al., AISTATS 2022, https://arxiv.org/abs/2106.06639; the placement: Tandon
et al., *Gradient Coding*, ICML 2017; sampling by update norm: Chen, Horvath and Richtarik,
*Optimal Client Sampling for Federated Learning*, TMLR 2022, https://arxiv.org/abs/2010.13723.
"""

from __future__ import annotations

from experiments.async_bar import PRIOR, command

__all__ = ["main"]

#: the command line (``--phase dev|eval``, ``--cells``, ``--out``)
main = command(PRIOR, __doc__)

if __name__ == "__main__":
    raise SystemExit(main())
