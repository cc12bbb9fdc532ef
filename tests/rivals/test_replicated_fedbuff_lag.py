"""``ReplicatedFedBuff(lag_level=L)``: FedBuff-like (the bar ``replicate_below``) until an
evaluation shows the median class recall at least ``L`` while some class's best recall so far
is below 0.1, then every held partition at the bar 1 for good; against the numpy reference of
``test_replicated_fedbuff`` with the switch at the step the scripted recalls say."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord
from hypothesis import given, settings
from hypothesis import strategies as st

from fl_gradcode.flower import gradient_coding_mod
from fl_gradcode.flower.asynchronous import CLASS_RECALL_KEY, LAG_FLOOR, ReplicatedFedBuff
from fl_gradcode.flower.testing import InProcessGrid
from fl_gradcode.rivals import train_timing_mod
from tests.apps.numpy_app import LR, as_dict, assert_model, initial_arrays, make_app
from tests.flower.harness import FixedArrivals
from tests.rivals.test_replicated_fedbuff import TABLE, replicated_reference

pytestmark = [
    pytest.mark.filterwarnings("ignore:fraction_evaluate"),
    pytest.mark.filterwarnings("ignore:gradient_coding_mod. no partition key:UserWarning"),
]


def _scripted(recalls):
    """An evaluate_fn returning ``recalls[step]`` (the last one past the script) as the class
    recalls, and recording each step's model."""
    models = {}

    def evaluate_fn(step, arrays):
        models[step] = as_dict(arrays)
        return MetricRecord({"accuracy": 0.5,
                             CLASS_RECALL_KEY: list(recalls[min(step, len(recalls) - 1)])})
    return evaluate_fn, models


def _run(strategy, recalls, steps, n=4):
    evaluate_fn, models = _scripted(recalls)
    strategy.start(grid=InProcessGrid(make_app(train_timing_mod, gradient_coding_mod), n),
                   initial_arrays=initial_arrays(), num_rounds=steps,
                   train_config=ConfigRecord({"lr": LR}), evaluate_fn=evaluate_fn)
    return models


def _switch_step(recalls, level, steps, first=1):
    """The first step whose evaluation trips the reading (computed apart: a loop over the
    script from step ``first``; the initial model's, step 0, is not read in a run), or None."""
    best = [-math.inf] * len(recalls[0])
    for step in range(first, steps + 1):
        row = recalls[min(step, len(recalls) - 1)]
        best = [b if math.isnan(r) else max(b, r) for b, r in zip(best, row, strict=True)]
        finite = sorted(r for r in row if not math.isnan(r))
        if not finite:
            continue
        mid = len(finite) // 2
        median = (finite[mid] if len(finite) % 2 else (finite[mid - 1] + finite[mid]) / 2)
        if median >= level and any(-math.inf < b < LAG_FLOOR for b in best):
            return step
    return None


LEARNT_BUT_ONE = [[0.0, 0.0, 0.0]] * 3 + [[0.95, 0.92, 0.0]]  # trips at step 3 (L <= 0.935)
LEARNT_ALL = [[0.0, 0.0, 0.0], [0.3, 0.0, 0.2], [0.2, 0.15, 0.0], [0.95, 0.95, 0.0]]
# the untrained model guesses class 2 for most inputs: above 0.1 at step 0 only
CHANCE_AT_START = [[0.0, 0.05, 0.9], [0.2, 0.3, 0.0], [0.95, 0.92, 0.0]]


@pytest.mark.parametrize("recalls, level, bar", [
    (LEARNT_BUT_ONE, 0.9, 0.0),   # FedBuff, then s = 1's least-served rule from step 3
    (LEARNT_BUT_ONE, 0.9, 0.25),  # the bar 0.25, then 1
    (LEARNT_BUT_ONE, 0.95, 0.0),  # the median 0.92 never reaches 0.95: FedBuff throughout
    (LEARNT_ALL, 0.9, 0.0),       # every class once above 0.1: never trips
    (CHANCE_AT_START, 0.9, 0.0),  # the initial model's guesses are not learning: trips
    ([[0.0] * 3, [0.95, math.nan, 0.0]], 0.9, 0.0),  # a class with no example is not read
])
def test_the_switch_comes_at_the_step_the_recalls_say_and_follows_the_reference(
        recalls, level, bar):
    steps = 10
    switch = _switch_step(recalls, level, steps)
    strategy = ReplicatedFedBuff(s=1, replicate_below=bar, lag_level=level, buffer_size=2,
                                 concurrency=4, server_lr=0.7, latency=FixedArrivals(TABLE),
                                 measured_compute=False)
    models = _run(strategy, recalls, steps)
    expected, times, parts = replicated_reference(TABLE, 4, 1, 2, 0.7, steps, bar=bar,
                                                  switch_after=switch)
    for step in range(1, steps + 1):
        assert_model(models[step], expected[step])
    assert [row["clients_used"] for row in strategy.history] == [
        parts[t] for t in range(1, steps + 1)]
    if switch is None:
        assert strategy.lagged_at is None
    else:
        assert strategy.lagged_at == pytest.approx(times[switch] if switch else 0.0)


def test_the_switch_changes_the_run_and_without_it_the_run_is_fedbuffs():
    """The same script at a level it reaches and one it does not: the slow client 3's
    partition is computed by its neighbour only after the switch."""
    runs = {}
    for level in (0.9, 0.99):
        strategy = ReplicatedFedBuff(s=1, replicate_below=0.0, lag_level=level, buffer_size=1,
                                     concurrency=4, latency=FixedArrivals(TABLE),
                                     measured_compute=False)
        _run(strategy, LEARNT_BUT_ONE, 12)
        runs[level] = [(row["clients_used"][0], row["computed_by"][0])
                       for row in strategy.history]
    assert (3, 2) in runs[0.9]
    assert all(j == c for j, c in runs[0.99]) and all(j != 3 for j, _ in runs[0.99])


def test_a_second_run_reads_the_classes_afresh():
    """A first run that learns every class (its best recalls all above the floor) leaves
    nothing behind: the second trips where a fresh strategy does, at the reference's time."""
    strategy = ReplicatedFedBuff(s=1, replicate_below=0.0, lag_level=0.9, buffer_size=2,
                                 concurrency=4, latency=FixedArrivals(TABLE),
                                 measured_compute=False)
    _run(strategy, LEARNT_ALL, 6)
    assert strategy.lagged_at is None
    models = _run(strategy, LEARNT_BUT_ONE, 6)
    expected, times, parts = replicated_reference(TABLE, 4, 1, 2, 1.0, 6, bar=0.0,
                                                  switch_after=3)
    assert strategy.lagged_at == pytest.approx(times[3])
    for step in range(1, 7):
        assert_model(models[step], expected[step])
    assert [row["clients_used"] for row in strategy.history[-6:]] == [
        parts[t] for t in range(1, 7)]
    _run(strategy, LEARNT_ALL, 6)  # and a third run after one that switched: afresh again
    assert strategy.lagged_at is None
    assert all(j == c for row in strategy.history[-6:]
               for j, c in zip(row["clients_used"], row["computed_by"], strict=True))


def test_a_reading_with_another_number_of_classes_is_refused_naming_both():
    recalls = [[0.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.95, 0.0]]
    strategy = ReplicatedFedBuff(s=1, replicate_below=0.0, lag_level=0.99, buffer_size=2,
                                 concurrency=4, latency=FixedArrivals(TABLE),
                                 measured_compute=False)
    with pytest.raises(ValueError, match="gave 2 class recalls where the run's first gave 3"):
        _run(strategy, recalls, 4)


@pytest.mark.parametrize(("later", "got"), [({"accuracy": 0.9}, "None"),  # no recalls
                                           ({CLASS_RECALL_KEY: 0.9}, "0.9")])  # not a list
def test_a_later_evaluation_without_recalls_is_not_read_and_warned_of_once(caplog, later, got):
    def evaluate_fn(step, arrays):
        if step == 0:
            return MetricRecord({CLASS_RECALL_KEY: [0.0, 0.0, 0.0]})
        return MetricRecord(later)  # from step 1 on

    strategy = ReplicatedFedBuff(s=1, replicate_below=0.0, lag_level=0.5, buffer_size=2,
                                 concurrency=4, latency=FixedArrivals(TABLE),
                                 measured_compute=False)
    with caplog.at_level("WARNING", logger="flwr"):
        strategy.start(grid=InProcessGrid(make_app(train_timing_mod, gradient_coding_mod), 4),
                       initial_arrays=initial_arrays(), num_rounds=4,
                       train_config=ConfigRecord({"lr": LR}), evaluate_fn=evaluate_fn)
    assert caplog.text.count("server step 1 holds no 'class-recall' list of numbers "
                             f"(got {got})") == 1
    assert "server step 2" not in caplog.text
    assert strategy.lagged_at is None and len(strategy.history) == 4


@pytest.mark.parametrize("bad", [0, 0.0, -0.5, 1.5, math.nan, math.inf, True, "0.9"])
def test_a_bad_lag_level_is_refused_by_name(bad):
    with pytest.raises(ValueError, match=rf"lag_level={bad!r} must be a number in \(0, 1\]"):
        ReplicatedFedBuff(s=1, lag_level=bad, buffer_size=1)


def test_a_lag_level_with_s_zero_is_refused_it_would_change_nothing():
    with pytest.raises(ValueError, match=r"lag_level=0.9 with s=0"):
        ReplicatedFedBuff(s=0, lag_level=0.9, buffer_size=1)


def test_a_lag_level_with_the_bar_already_one_is_refused_it_would_change_nothing():
    with pytest.raises(ValueError, match=r"lag_level=0.9 with replicate_below=1"):
        ReplicatedFedBuff(s=1, lag_level=0.9, buffer_size=1)


@pytest.mark.parametrize("metrics", [
    None, MetricRecord({"accuracy": 0.1}), MetricRecord({CLASS_RECALL_KEY: 0.5}),
    MetricRecord({CLASS_RECALL_KEY: []}),
    MetricRecord({CLASS_RECALL_KEY: [math.nan, math.nan]})])
def test_an_evaluation_without_class_recalls_is_refused_before_any_job(metrics):
    strategy = ReplicatedFedBuff(s=1, replicate_below=0.0, lag_level=0.9, buffer_size=1,
                                 concurrency=3,
                                 latency=FixedArrivals(TABLE), measured_compute=False)
    sent = []

    def app(msg, context):
        sent.append(msg.metadata.group_id)
        return make_app(train_timing_mod, gradient_coding_mod)(msg, context)

    got = None if metrics is None else metrics.get(CLASS_RECALL_KEY)
    said = rf"no {CLASS_RECALL_KEY!r}.*\(got {re.escape(repr(got))};"
    with pytest.raises(ValueError, match=said):
        strategy.start(grid=InProcessGrid(app, 3), initial_arrays=initial_arrays(),
                       num_rounds=2, train_config=ConfigRecord({"lr": LR}),
                       evaluate_fn=lambda step, arrays: metrics)
    assert sent == [] and strategy.history == []


def test_no_evaluate_fn_is_refused_naming_what_to_pass():
    strategy = ReplicatedFedBuff(s=1, replicate_below=0.0, lag_level=0.9, buffer_size=1,
                                 latency=FixedArrivals(TABLE), measured_compute=False)
    with pytest.raises(ValueError, match="pass an evaluate_fn"):
        strategy.start(grid=InProcessGrid(make_app(train_timing_mod, gradient_coding_mod), 3),
                       initial_arrays=initial_arrays(), num_rounds=1)


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.lists(st.one_of(st.floats(0, 1), st.just(math.nan)), min_size=3,
                              max_size=3), min_size=1, max_size=8),
       level=st.floats(0.05, 1.0))
def test_the_reading_trips_where_the_loop_says(rows, level):
    """``observe`` over a sequence of recalls against the loop of :func:`_switch_step`."""
    strategy = ReplicatedFedBuff(s=1, replicate_below=0.0, lag_level=level, buffer_size=1)
    tripped = None
    for step, row in enumerate(rows):
        strategy.now = float(step)
        strategy.observe(row)
        if strategy.lagged_at is not None and tripped is None:
            tripped = step
    assert tripped == _switch_step(rows, level, len(rows) - 1, first=0)


def test_the_apps_evaluation_returns_each_class_recall_consistent_with_its_accuracy():
    """The project's evaluate_fn: the class recalls, weighted by each class's test examples,
    average to its accuracy; each recall recomputed from the model's predictions apart."""
    import torch

    from fl_gradcode.config import merge_config
    from fl_gradcode.data import load_dataset
    from fl_gradcode.learning import make_model, set_flat_parameters
    from server.app import model_and_evaluation

    cfg = merge_config({})
    data = load_dataset(str(cfg["dataset"]), int(cfg["seed"]))
    initial, evaluate_fn, _ = model_and_evaluation(cfg, data, classes=True)
    assert CLASS_RECALL_KEY not in model_and_evaluation(cfg, data)[1](0, initial)
    rng = np.random.default_rng(3)
    arrays = {k: v.numpy() + rng.normal(0, 0.5, v.numpy().shape) for k, v in initial.items()}
    metrics = evaluate_fn(1, ArrayRecord({k: Array(v) for k, v in arrays.items()}))
    recall = metrics[CLASS_RECALL_KEY]
    model = make_model(str(cfg["model"]), data.input_shape, data.num_classes, 0)
    set_flat_parameters(model, np.concatenate([arrays[n].ravel()
                                               for n, _ in model.named_parameters()]))
    with torch.no_grad():
        pred = model(torch.as_tensor(data.x_test, dtype=torch.float64)).argmax(1).numpy()
    y = np.asarray(data.y_test)
    for c in range(data.num_classes):
        if (y == c).any():
            assert recall[c] == pytest.approx(float(np.mean(pred[y == c] == c)))
        else:
            assert math.isnan(recall[c])
    counts = np.bincount(y, minlength=data.num_classes)
    assert float(np.nansum(np.array(recall) * counts) / len(y)) == pytest.approx(
        metrics["accuracy"])
