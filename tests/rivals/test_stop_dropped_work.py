"""``stop_dropped_work`` of the synchronous rivals (``DeadlineFedAvg``, ``FirstK``) against a
numpy reference: a client whose reply a round drops stops its work when that round ends, so
its next message starts at once (without the option it runs its late job to the end and the
next message waits behind it)."""

from __future__ import annotations

import pytest
from flwr.app import ConfigRecord

from fl_gradcode.flower.testing import InProcessGrid
from fl_gradcode.rivals import DeadlineFedAvg, FirstK, train_timing_mod
from tests.apps.numpy_app import LR, as_dict, assert_model, fedavg, initial_arrays, make_app, theta0
from tests.flower.harness import FixedArrivals

pytestmark = pytest.mark.filterwarnings("ignore:fraction_evaluate")

# partition 3 is slow in round 1 only; partition 1 in round 2 only
TABLE = {1: [0.5, 0.4, 0.1, 3.0], 2: [0.6, 2.5, 0.2, 0.3], 3: [0.7, 0.6, 0.5, 0.4],
         4: [0.3, 0.5, 0.4, 0.6]}


def _reference(n, rounds, *, k=None, deadline=None, stop=False):
    """FedAvg per round of the replies kept (the first ``k`` arrivals, or those by
    ``deadline``); a client's job starts when its earlier one ends; a dropped client's job
    ends at its arrival, or with ``stop`` at the round's end (or at its start, if later).
    Returns each round's model, kept partitions and end time."""
    theta, now, busy_until = theta0(), 0.0, [0.0] * n
    out = []
    for r in range(1, rounds + 1):
        start = now
        begin = [max(busy_until[p], start) for p in range(n)]
        arrive = [begin[p] + TABLE[r][p] for p in range(n)]
        order = sorted(range(n), key=lambda p: (arrive[p], p))
        if k is not None:
            kept = order[:k]
            now = arrive[kept[-1]]
        else:
            kept = [p for p in order if arrive[p] <= start + deadline]
            now = start + deadline if len(kept) < n else max(arrive)
        for p in range(n):
            busy_until[p] = (max(begin[p], now) if stop and p not in kept
                             else max(busy_until[p], arrive[p]))
        theta = fedavg(theta, kept, n)
        out.append((theta, sorted(kept), now))
    return out


def _run(cls, **kwargs):
    strategy = cls(latency=FixedArrivals(TABLE), measured_compute=False, fraction_evaluate=0.0,
                   min_available_nodes=1, **kwargs)
    models = {}

    def evaluate_fn(server_round, arrays):
        models[server_round] = as_dict(arrays)

    strategy.start(grid=InProcessGrid(make_app(train_timing_mod), 4),
                   initial_arrays=initial_arrays(), num_rounds=4,
                   train_config=ConfigRecord({"lr": LR}), evaluate_fn=evaluate_fn)
    return strategy, models


@pytest.mark.parametrize("stop", [False, True])
@pytest.mark.parametrize("cls, kwargs, reference", [
    (FirstK, {"k": 3}, {"k": 3}),
    (DeadlineFedAvg, {"deadline": 1.0, "min_train_nodes": 4}, {"deadline": 1.0}),
])
def test_a_dropped_client_stops_at_the_rounds_end_only_with_stop_dropped_work(
        cls, kwargs, reference, stop):
    strategy, models = _run(cls, stop_dropped_work=stop, **kwargs)
    expected = _reference(4, 4, stop=stop, **reference)
    other = _reference(4, 4, stop=not stop, **reference)
    assert [e[1:] for e in expected] != [o[1:] for o in other]  # the option matters here
    for r, (theta, kept, end) in enumerate(expected, start=1):
        row = strategy.history[r - 1]
        assert row["clients_used"] == kept, (r, row)
        assert row["virtual_s"] == pytest.approx(end)
        assert_model(models[r], theta)


def test_the_option_changes_what_the_slow_clients_next_rounds_take_in():
    # without it partition 3's round-2 job waits for its round-1 job (3.0 s) and is late
    # again; with it, its round-2 job starts when round 1 ends and arrives in time
    assert [r[1] for r in _reference(4, 2, deadline=1.0)] == [[0, 1, 2], [0, 2]]
    assert [r[1] for r in _reference(4, 2, deadline=1.0, stop=True)] == [[0, 1, 2], [0, 2, 3]]
    for stop, kept in ((False, [0, 2]), (True, [0, 2, 3])):
        strategy, _ = _run(DeadlineFedAvg, deadline=1.0, min_train_nodes=4,
                           stop_dropped_work=stop)
        assert strategy.history[1]["clients_used"] == kept


def test_stop_dropped_work_that_is_not_a_bool_is_refused_by_name():
    with pytest.raises(ValueError, match=r"stop_dropped_work='yes' must be True or False"):
        DeadlineFedAvg(deadline=1.0, stop_dropped_work="yes")


def test_a_node_not_heard_of_by_the_rounds_end_is_stopped_then_too():
    """Partition 3's device is off in round 1 and the server hears so at 5.0 s, after the
    round's 1.0 s deadline; in round 2 it replies in 0.3 s. Without the option its round-2
    message waits until 5.0 s (arriving 4.3 s after round 2 starts: dropped); with it the
    node is let go at the round's end and its reply is in time."""
    import math

    from tests.flower.harness import DevicesOff

    table = {1: [0.5, 0.4, 0.1, math.inf], 2: [0.6, 0.5, 0.2, 0.3]}
    for stop, kept in ((False, [0, 1, 2]), (True, [0, 1, 2, 3])):
        strategy = DeadlineFedAvg(latency=DevicesOff(table, {1: {3: 5.0}}), deadline=1.0,
                                  measured_compute=False, fraction_evaluate=0.0,
                                  min_available_nodes=1, min_train_nodes=4,
                                  stop_dropped_work=stop)
        strategy.start(grid=InProcessGrid(make_app(train_timing_mod), 4),
                       initial_arrays=initial_arrays(), num_rounds=2,
                       train_config=ConfigRecord({"lr": LR}))
        assert strategy.history[1]["clients_used"] == kept
