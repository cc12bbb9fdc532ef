"""Coded asynchrony whose replication waits for a lead beyond chance: amendment 24's bar plus
a margin ``z`` (``experiments/grid.toml``, amendment 25), read beside the benchmark's verdict.

A client computes its neighbour's partition only while that partition's jobs are fewer than
0.75 times its own partition's AND trail them by more than ``z`` standard deviations of a
difference of two counts of one rate (:class:`fl_gradcode.flower.asynchronous.ReplicatedFedBuff`,
``replicate_margin``). ``python -m experiments.async_margin --phase dev`` picks ONE ``z`` among
0, 1, 2, 3 on the development seeds of amendment 24's fifteen cells by amendment 24's rule;
``--phase eval [--cells PATTERNS]`` runs the pick on the evaluation seeds, paired by seed with
FedBuff, amendment 23's ``s = 1`` and amendment 24's bar (``over_earlier``). Results:
``results/async_margin.json``. FedBuff: Nguyen et al., AISTATS 2022,
https://arxiv.org/abs/2106.06639; the placement: Tandon et al., *Gradient Coding*, ICML 2017.
"""

from __future__ import annotations

from experiments.async_bar import MARGIN, command

__all__ = ["main"]

#: the command line (``--phase dev|eval``, ``--cells``, ``--out``)
main = command(MARGIN, __doc__)

if __name__ == "__main__":
    raise SystemExit(main())
