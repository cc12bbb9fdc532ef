"""``slow-classes``: data that only the persistently slow clients hold.

Expected values come from the latency model's own per-round delays (who is slow is read from
``client_delay``, not from the partition code) and from counting labels."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fl_gradcode.config import merge_config
from fl_gradcode.data import load_dataset, run_partitions, speed_correlated_partition


def _slow_by_delay(cfg, n: int) -> set[int]:
    """The clients slower than every fast delay could be, from the delays the clock reads
    (``latency-slowdown`` large enough that a slow client's shift passes every fast draw)."""
    from fl_gradcode.latency import client_delay
    from server.app import run_latency

    model = run_latency(cfg, n)
    fast_max = float(cfg["latency-scale"]) + 50.0 / float(cfg["latency-rate"])  # > any Exp tail
    out = set()
    for w in range(n):
        times = [client_delay(model, worker=w, round_index=r, load=1.0, seed=int(cfg["seed"]))
                 for r in range(5)]
        if min(times) > fast_max:
            out.add(w)
    return out


@pytest.mark.parametrize("seed,classes", [(0, 2), (3, 1), (11, 3)])
def test_only_the_clients_slow_every_round_hold_the_slow_classes(seed, classes):
    n = 20
    cfg = merge_config({"seed": seed, "slow-classes": classes, "latency": "persistent",
                        "latency-slowdown": 200.0})
    data, parts = run_partitions(cfg, n)
    slow = _slow_by_delay(cfg, n)
    assert 0 < len(slow) < n
    y = data.y_train
    held_by_slow = set(np.unique(np.concatenate([y[parts[j]] for j in slow])).tolist())
    held_by_fast = set(np.unique(np.concatenate(
        [y[parts[j]] for j in range(n) if j not in slow])).tolist())
    assert len(held_by_slow) == classes and not held_by_slow & held_by_fast
    assert held_by_slow | held_by_fast == set(np.unique(y).tolist())
    # every training example once, every partition non-empty
    every = np.concatenate(parts)
    assert len(every) == len(y) and len(np.unique(every)) == len(y)
    assert min(len(p) for p in parts) > 0
    # the slow clients' shares of their classes are near-equal
    sizes = [len(parts[j]) for j in slow]
    assert max(sizes) - min(sizes) <= 1
    # deterministic: the client rebuilds the server's partitions
    assert all(np.array_equal(a, b) for a, b in zip(parts, run_partitions(cfg, n)[1],
                                                     strict=True))


def test_zero_slow_classes_keeps_the_partitioner_s_split():
    plain = run_partitions(merge_config({"seed": 4}), 12)[1]
    zero = run_partitions(merge_config({"seed": 4, "slow-classes": 0}), 12)[1]
    assert all(np.array_equal(a, b) for a, b in zip(plain, zero, strict=True))


def test_latency_seed_picks_the_slow_clients_not_the_run_seed():
    common = {"slow-classes": 2, "latency-seed": 5, "latency-slowdown": 200.0}
    a = merge_config({"seed": 1, **common})
    b = merge_config({"seed": 2, **common})
    slow = _slow_by_delay(a, 20)
    assert 0 < len(slow) < 20 and slow == _slow_by_delay(b, 20)
    for cfg in (a, b):  # both runs give their slow classes to the same clients
        data, parts = run_partitions(cfg, 20)
        y = data.y_train
        mine = set(np.unique(np.concatenate([y[parts[j]] for j in slow])).tolist())
        theirs = set(np.unique(np.concatenate(
            [y[parts[j]] for j in range(20) if j not in slow])).tolist())
        assert len(mine) == 2 and not mine & theirs


@pytest.mark.parametrize("update,match", [
    ({"latency": "bimodal"}, "latency='persistent'"),
    ({"slow-classes": 10}, r"slow-classes=10 must be an integer in \[1, 9\]"),
    ({"latency-p": 0.0}, "at least one slow"),
    ({"latency-p": 1.0}, "at least one slow"),
])
def test_a_setting_that_cannot_hold_is_refused_with_the_value(update, match):
    cfg = merge_config({"slow-classes": 2, "latency": "persistent", **update})
    with pytest.raises(ValueError, match=match):
        run_partitions(cfg, 20)


@settings(max_examples=40, deadline=None)
@given(k=st.integers(2, 30), slow_classes=st.integers(1, 9), seed=st.integers(0, 10**6),
       data=st.data())
def test_partition_property(k, slow_classes, seed, data):
    y = load_dataset("digits", 0).y_train
    slow = data.draw(st.sets(st.integers(0, k - 1), min_size=1, max_size=k - 1))
    parts = speed_correlated_partition(y, k, sorted(slow), slow_classes, partitioner="iid",
                                       seed=seed)
    assert len(parts) == k
    every = np.concatenate(parts)
    assert np.array_equal(np.sort(every), np.arange(len(y)))
    slow_labels = set(np.unique(y[np.concatenate([parts[j] for j in slow])]).tolist())
    counts = np.bincount(y)
    # exactly slow_classes classes, and every example of them with the slow clients
    assert len(slow_labels) == slow_classes
    assert sum(len(parts[j]) for j in slow) == sum(counts[c] for c in slow_labels)


def test_the_main_job_sends_the_client_what_it_needs_to_rebuild_them():
    from server.app import CLIENT_KEYS

    assert {"slow-classes", "latency", "latency-p", "latency-seed"} <= set(CLIENT_KEYS)
