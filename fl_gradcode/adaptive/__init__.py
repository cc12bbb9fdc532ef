"""Adaptive gradient coding: pick the straggler tolerance ``s`` online, every round (no Flower).

Modules: :mod:`.survival` (the pooled curve), :mod:`.estimator` (:class:`LatencyEstimator`),
:mod:`.cohort` (:class:`CohortView`), :mod:`.state` (the latency-state file), :mod:`.rules`
(when a code decodes), :mod:`.choice` (:func:`choose_s`).

The data is placed once for a maximum tolerance (:class:`fl_gradcode.codes.NestedPlacement`),
so switching ``s`` between rounds moves no data. Each round the server

1. feeds what it saw into a :class:`LatencyEstimator` (reply times, censored for clients that
   had not replied when the round ended, late replies added when they arrive), then
2. calls :func:`choose_s`, which simulates the next round for every candidate ``s`` with the
   estimated per-client latency distributions and returns the ``s`` with the smallest expected
   time until the replies decode (``s = 0`` is uncoded on the same placement, so exact coding
   is never predicted to lose to it); optionally each ``s`` also with the clients estimated
   persistently slow excluded (:meth:`fl_gradcode.codes.NestedPlacement.code_excluding`).

Latency model. Client ``i``, given load ``L_i`` (partitions it computes times the cost of one
partition) and still busy for ``b_i`` seconds, replies after ``b_i + L_i**beta * X_i``. ``X_i``
is its per-unit latency, ``X_i = f_i * E`` (an accelerated-failure-time model): a per-client
slowness factor ``f_i`` (persistently slow clients) times a common distribution ``E``.

* ``E``: weighted Kaplan-Meier curve of all clients' normalised times ``X / f_i``, with
  exponential forgetting (``halflife`` rounds) for drift. Beyond the largest observed time,
  which is exactly what early-ending rounds hide, a generalised Pareto tail fitted to the
  upper part of the curve by censored maximum likelihood (peaks over threshold): exponential
  delays give an exponential tail, Pareto delays a Pareto tail.
* ``f_i``: maximum a posteriori under the censored likelihood (events contribute the density
  of ``E``, censored rounds its survival beyond the censoring time) with a log-normal prior;
  a client that never replies keeps gaining slowness, so a dead node ends up tolerated.
* ``beta``: ``1`` is compute-bound work (a coded client with ``s+1`` partitions takes ``s+1``
  times longer: coding rarely pays), ``0`` a delay that does not shrink with the work
  (network, queueing, heavy tails: coding pays). Given, or estimated by a ridge regression of
  each round's log median time on its log median load, starting from ``beta = 1``. That prior
  makes small ``s`` look cheap, so the policy tries them and learns from the result:
  optimism in the face of uncertainty, the principle of UCB (Auer et al.), without an explicit
  bonus.

Censoring. A client that has not replied when the round ends (or errors, or never answers)
has a time known only to exceed the round's duration. Dropping such observations, or treating
them as replies at the deadline, biases every estimate towards fast clients (the tests measure
it: mean relative error of per-client rates 0.87 and 0.38 against 0.046 for the censored MLE).
The bound grows while the reply is outstanding (:meth:`LatencyEstimator.observe_pending`), and
the mass beyond the last observed reply is drawn beyond the censoring times that carry it, so
a slow mode seen only through censoring is never predicted faster than the time it has
already taken.

Busy clients. A client still working on earlier work is priced by its remaining time, drawn
from the estimator conditional on the work not being done after the time since it was sent
(:meth:`LatencyEstimator.sample_remaining`, ``choose_s(pending=...)``): what a server knows.
``choose_s(busy_until=...)`` takes known finishing times instead (a simulator's knowledge).

References:
    Kaplan, Meier, "Nonparametric Estimation from Incomplete Observations", JASA 53(282), 1958
    (the product-limit estimator, here with weights).
    Efron, "The two sample problem with censored data", Proc. 5th Berkeley Symposium 4, 1967
    (Kaplan-Meier as redistribution of censored mass to the right).
    Cox, Oakes, "Analysis of Survival Data", Chapman & Hall 1984 (censored likelihoods; the
    exponential MLE rate = events / total exposure of :meth:`LatencyEstimator.rates`).
    Pickands, "Statistical inference using extreme order statistics", Ann. Statist. 3(1), 1975
    (generalised Pareto tails above a threshold).
    Auer, Cesa-Bianchi, Fischer, "Finite-time Analysis of the Multiarmed Bandit Problem",
    Machine Learning 47, 2002 (UCB: optimism in the face of uncertainty).
    David, Nagaraja, "Order Statistics", 3rd ed., Wiley 2003 (a round that needs ``t`` of ``m``
    replies lasts the ``t``-th order statistic; Monte Carlo here because clients differ).
    Wang et al., "Heterogeneity-aware Gradient Coding for Straggler Tolerance", ICDCS 2019,
    https://arxiv.org/abs/1901.09339 (heterogeneous workers: slow ones get less work; here a
    busy client may get none for a round, and with ``exclude_slower_than`` a client
    estimated persistently slow may be excluded, its partitions shared by the others).
    Tandon, Lei, Dimakis, Karampatziakis, ICML 2017, https://arxiv.org/abs/1612.03301 and
    Halbawi, Azizan, Salehi, Hassibi, ISIT 2018, https://arxiv.org/abs/1706.05436 (the codes).
"""


from .approximate import (
    ERROR_POWER,
    ApproxCandidate,
    DecodeErrors,
    check_error_power,
    choose_progress,
    measure_errors,
    missing_weights,
    price_candidates,
    progress_cost,
)
from .choice import Decision, SingleCode, choose_s, expected_round_time
from .cohort import CohortView
from .estimator import LatencyEstimator
from .rules import DecodeRule, code_loads, decode_rule
from .state import ObservedRound

__all__ = [
    "ERROR_POWER",
    "ApproxCandidate",
    "CohortView",
    "Decision",
    "DecodeErrors",
    "DecodeRule",
    "LatencyEstimator",
    "ObservedRound",
    "SingleCode",
    "check_error_power",
    "choose_progress",
    "choose_s",
    "code_loads",
    "decode_rule",
    "expected_round_time",
    "measure_errors",
    "missing_weights",
    "price_candidates",
    "progress_cost",
]
