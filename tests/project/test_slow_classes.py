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


def test_a_client_with_an_empty_run_config_rebuilds_the_server_s_partitions(tmp_path):
    # run_simulation gives ClientApps an empty run config: everything comes in the train config
    from flwr.app import Context, Message, MessageType, RecordDict

    from clients.app import client_config
    from server.app import build

    cfg = merge_config({"seed": 12, "slow-classes": 2, "latency-p": 0.3, "latency-seed": 9,
                        "results-dir": str(tmp_path / "r")})
    train_config = build(cfg, 20)[3]
    msg = Message(RecordDict({"config": train_config}), dst_node_id=7,
                  message_type=MessageType.TRAIN)
    context = Context(run_id=1, node_id=7, node_config={}, state=RecordDict(), run_config={})
    client = client_config(context, msg)
    server_parts = run_partitions(cfg, 20)[1]
    client_parts = run_partitions(client, 20)[1]
    assert all(np.array_equal(a, b) for a, b in zip(server_parts, client_parts, strict=True))
    # and the slow clients of latency-seed 9 at p = 0.3 hold the two slow classes
    slow = _slow_by_delay({**cfg, "latency-slowdown": 200.0}, 20)
    y = load_dataset("digits", 12).y_train
    assert len(set(np.unique(np.concatenate([y[client_parts[j]] for j in slow])))) == 2


def test_the_natural_partitioner_splits_the_remaining_classes():
    cfg = merge_config({"seed": 1, "slow-classes": 2, "partitioner": "natural",
                        "latency-slowdown": 200.0})
    data, parts = run_partitions(cfg, 20)
    slow = _slow_by_delay(cfg, 20)
    y = data.y_train
    held = np.isin(y, np.unique(np.concatenate([y[parts[j]] for j in slow])))
    fast = [j for j in range(20) if j not in slow]
    used = sum(len(parts[j]) for j in fast)
    # the natural split leaves examples unused by design (at most what every class supplies
    # for its Dirichlet label mixes: about 55-65 % of digits at 16 clients); a split that
    # counted the removed classes asked for examples that no longer exist and shrank to ~0
    assert used >= 0.3 * int((~held).sum())
    assert min(len(parts[j]) for j in fast) >= 2
    assert not set(np.unique(np.concatenate([y[parts[j]] for j in fast]))) & set(
        np.unique(y[held]))


@pytest.mark.parametrize("dataset", ["mnist1d", "synthetic"])
def test_other_datasets(dataset):
    cfg = merge_config({"seed": 0, "slow-classes": 1, "dataset": dataset})
    data, parts = run_partitions(cfg, 20)
    every = np.concatenate(parts)
    assert len(np.unique(every)) == len(every) == len(data.y_train)


def test_every_code_keeps_the_slow_classes_on_the_slow_clients_own_partitions(tmp_path):
    """comm-efficient with s + m = 3 not dividing 20 used to have k = 18 partitions (the
    data split 18 ways, the slow classes no longer the slow clients'); the ServerApp now
    builds it with one partition per client, so slow-classes takes it."""
    from server.app import build, cohort_code

    base = {"slow-classes": 2, "s": 1, "results-dir": str(tmp_path / "r")}
    build(merge_config({**base, "code": "comm-efficient", "m": 2}), 20)
    built, why = cohort_code("comm-efficient", 1, 20, 2)
    assert (built.k, built.s, built.m, why) == (20, 1, 2, None)
    assert sorted(len(built.assignment(i)) for i in range(20)) == [3] * 12 + [4] * 8
    build(merge_config({**base, "code": "grouped-rs"}), 20)
    with pytest.raises(ValueError, match="latency-slowdown > 1"):
        build(merge_config({**base, "code": "grouped-rs", "latency-slowdown": 1.0}), 20)


def test_the_benchmark_sets_such_a_code_aside_with_the_reason():
    """The grid's rule is that of the construction it ran (k = 18 at 20 clients)."""
    from experiments.compare import code_fit

    cfg = merge_config({"slow-classes": 2, "update": "gradient", "m": 1})
    assert code_fit("comm-efficient:2", 20, 20, cfg, grid=True)[1] is not None
    assert "slow-classes" in code_fit("comm-efficient:2", 20, 20, cfg, grid=True)[1]
    assert code_fit("grouped-rs:2", 20, 20, cfg, grid=True) == (None, None)
    plain = merge_config({"update": "gradient", "m": 1})
    assert code_fit("comm-efficient:2", 20, 20, plain, grid=True)[1] is None
    # as the ServerApp builds it now (one partition per client), nothing to set aside
    assert code_fit("comm-efficient:2", 20, 20, cfg) == (None, None)


def test_the_extension_s_readme_line_names_who_never_reached_and_the_speedup():
    from tools.docgen.slow_classes import render_headline

    def runs(method, times, final):
        return [{"method": method, "seed": 10 + i, "time_to_target": t, "final_accuracy": final}
                for i, t in enumerate(times)]

    cell = {"settings": {"latency": "persistent", "seeds": [10, 11, 12], "target": 0.85,
                         "run_config": {"partitioner": "dirichlet"}},
            "runs": [*runs("auto", [10.0, 12.0, 14.0], 0.9),
                     *runs("first-k", [None, None, None], 0.78),
                     *runs("wait-for-all", [40.0, 48.0, 60.0], 0.9),
                     *runs("fedbuff", [30.0, None, 36.0], 0.88)]}
    line = render_headline([(2, 20, cell), (2, 100, None)])
    # auto's median 12 s; the best rival that does not code is FedBuff (median 36 s): 3.00x
    assert "auto 12.0 s (3/3)" in line
    assert "FedBuff, took 3.00× auto's time" in line
    # who reached the target on fewer than every seed, and the run not made yet
    assert "first-k 0/3" in line and "FedBuff 2/3" in line and "wait-for-all 3/3" not in line
    assert "Registered, not run yet: 2 classes at n = 100" in line


def test_a_run_whose_rivals_predate_the_grid_files_newer_rules_says_so():
    from tools.docgen.slow_classes import predates, rule_flags

    old = {"methods": ["auto", "deadline", "fedbuff"], "fedbuff": {"server_lr": 1.0}}
    assert rule_flags(old) == (" --rule fedbuff_tune=0 --rule rivals_stop_dropped_work=0"
                               " --rule auto_stop_at_decode=0")
    assert "FedBuff untuned" in predates(old) and "not stopped" in predates(old)
    assert "auto's late work stopped at the deadline" in predates(old)
    new = {**old, "rivals_stop_dropped_work": True, "auto_stop_at_decode": True,
           "fedbuff": {"server_lr": 0.5, "tuning": {"chosen": {}, "extend": 2}}}
    assert rule_flags(new) == "" and predates(new) == ""
    # a rule the run set itself is its own choice, not a rule it predates
    own = {**new, "fedbuff": {"server_lr": 1.0}, "rules_set": {"fedbuff_tune": 0.0}}
    assert rule_flags(own) == " --rule fedbuff_tune=0" and predates(own) == ""


def test_first_k_care_and_fedbuff_lists_not_grown_are_named_with_their_amendments():
    from tools.docgen.slow_classes import predates, rule_flags

    old = {"methods": ["first-k", "fedbuff"], "rivals_stop_dropped_work": True,
           "first_k": {"k": 15, "overcommit": 1.3}, "fedbuff": {"tuning": {"chosen": {}}}}
    # both can be turned off to reproduce the run, and the CLI takes the flags
    assert rule_flags(old) == " --rule first_k_tune=0 --rule fedbuff_tune_extend=0"
    from experiments.compare_cli import parse_rules
    assert parse_rules(rule_flags(old).replace(" --rule ", " ").split()) == {
        "first_k_tune": 0.0, "fedbuff_tune_extend": 0.0}
    assert "c fixed a priori" in predates(old) and "(amendment 18)" in predates(old)
    assert "lists not grown past an edge pick (amendment 16)" in predates(old)
    new = {**old, "first_k": {**old["first_k"], "tuning": {"chosen": {}}},
           "fedbuff": {"tuning": {"chosen": {}, "extend": 2}}}
    assert rule_flags(new) == "" and predates(new) == ""



def test_the_rules_every_run_predates_are_said_once_in_the_readme_line():
    from tools.docgen.slow_classes import predates, render_headline

    def runs(method, times):
        return [{"method": method, "seed": 10 + i, "time_to_target": t, "final_accuracy": 0.9}
                for i, t in enumerate(times)]

    def cell(**settings):
        return {"settings": {"latency": "persistent", "seeds": [10, 11], "target": 0.85,
                             "methods": ["auto", "wait-for-all", "fedbuff"],
                             "run_config": {"partitioner": "dirichlet"}, **settings},
                "runs": [*runs("auto", [10.0, 12.0]), *runs("wait-for-all", [40.0, 48.0]),
                         *runs("fedbuff", [30.0, 36.0])]}

    old = cell()  # FedBuff untuned, auto's late work not stopped at decode
    caveat = predates(old["settings"])
    assert "FedBuff untuned" in caveat and "(amendment 15)" in caveat
    body = caveat.split(":", 1)[1][1:-1]
    both_old = render_headline([(2, 20, old), (1, 20, cell())])
    assert both_old.count(body) == 1
    assert f"all its runs predate the rules: {body})" in both_old
    assert "2 classes at n = 20: auto" in both_old and "1 class at n = 20: auto" in both_old
    new = cell(auto_stop_at_decode=True, fedbuff={"tuning": {"extend": True}})
    assert predates(new["settings"]) == ""
    mixed = render_headline([(2, 20, old), (1, 20, new)])
    assert "all its runs predate" not in mixed and mixed.count(body) == 1
    assert f"2 classes at n = 20{caveat}: auto" in mixed and "1 class at n = 20: auto" in mixed
    assert "predate" not in render_headline([(2, 20, new)])


def test_cut_keys_are_every_run_config_key_the_split_reads():
    """A budgeted node pins the keys of fl_gradcode.data.CUT_KEYS (node config dp-cut-keys'
    default): they must be every key run_partitions reads, or a server could re-cut the data
    through one left out."""
    from fl_gradcode.data import CUT_KEYS

    class Reads(dict):
        def __init__(self, values):
            super().__init__(values)
            self.read: set[str] = set()

        def __getitem__(self, key):
            self.read.add(key)
            return super().__getitem__(key)

        def get(self, key, default=None):
            self.read.add(key)
            return super().get(key, default)

    cfg = Reads(merge_config({"seed": 2, "slow-classes": 2, "latency": "persistent"}))
    run_partitions(cfg, 12)
    assert cfg.read == set(CUT_KEYS)
