"""``ReplicatedFedBuff`` (FedBuff over partitions each held by ``s + 1`` clients) against a
numpy reference of its definition: every client always busy, each job the held partition
served least so far (ties: the client's own, then the next in its cycle), the partition's own
update ``theta_j - theta_sent`` weighted ``(1 + tau)^-1/2``, a server step every ``K``."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
from flwr.app import ConfigRecord, Error, Message
from hypothesis import given, settings
from hypothesis import strategies as st

from fl_gradcode.codes.repetition import crc_matrix
from fl_gradcode.flower import gradient_coding_mod
from fl_gradcode.flower.asynchronous import ReplicatedFedBuff, cyclic_placement
from fl_gradcode.flower.testing import InProcessGrid
from fl_gradcode.rivals import FedBuff, train_timing_mod
from tests.apps.numpy_app import (
    LR,
    as_dict,
    assert_model,
    call_app,
    initial_arrays,
    make_app,
    theta0,
)
from tests.flower.harness import DevicesOff, FixedArrivals

pytestmark = [
    pytest.mark.filterwarnings("ignore:fraction_evaluate"),
    pytest.mark.filterwarnings("ignore:gradient_coding_mod. no partition key:UserWarning"),
]


def start_run(strategy, n, steps, app=None, grid=None):
    models = {}

    def evaluate_fn(step, arrays):
        models[step] = as_dict(arrays)

    result = strategy.start(
        grid=grid or InProcessGrid(app or make_app(train_timing_mod, gradient_coding_mod), n),
        initial_arrays=initial_arrays(), num_rounds=steps,
        train_config=ConfigRecord({"lr": LR}), evaluate_fn=evaluate_fn)
    return result, models


def replicated_reference(table, n, s, k, server_lr, steps, sizes=None, cost=0.0, bar=1.0,
                         margin=0.0, need=math.inf, latch=False, era=0, prior=False,
                         trace=None, switch_after=None):
    """Concurrency ``n``: a finished client is sent the current model at once. ``bar``:
    client ``p`` computes another held partition only while its jobs are fewer than
    ``bar`` times partition ``p``'s and, ``margin`` z, while partition ``p``'s lead them by
    more than z standard deviations of a difference of two counts of one rate (then the
    least served of those); ``need`` rho: a held partition whose last update (``theta_j -
    theta_sent``) was more than rho times as large as partition ``p``'s last has the bar 1
    (``latch``: from then on); ``era`` w > 0: instead, a partition whose last three (at
    least two) norms, each over the median of the norms that arrived before it of updates
    computed from the models of its step and the w before (at least three), have a geometric
    mean above rho; ``prior``: a partition with fewer than two such ratios has the bar 1.
    ``trace`` (a dict, filled): each partition's ratios (``"ratios"``) and the latched set.
    ``switch_after`` t: from server step t on, every held partition has the bar 1.
    ``table[job][p]``: client ``p``'s ``job``-th job's latency, plus ``cost`` times the load
    of the partition it computes (its size over the mean of ``sizes``). Returns the model and
    time of each step and each step's partitions."""
    served = [0] * n
    norms, latched, arrived, ratios = {}, set(), [], {}

    def is_needed(q, p):
        if era:
            mine = ratios.get(q, [])[-3:]
            return len(mine) >= 2 and float(np.exp(np.mean(mine))) > need
        return q in norms and p in norms and norms[q] > need * norms[p]

    def bar_of(q, p):
        if q in latched:
            return 1.0
        if prior and len(ratios.get(q, [])) < 2:
            return 1.0
        if is_needed(q, p):
            if latch:
                latched.add(q)
            return 1.0
        return bar
    load = [1.0] * n if sizes is None else [x / np.mean(sizes) for x in sizes]
    theta, version = theta0(), 0

    def pick(p):
        held = [(p + t) % n for t in range(s + 1)]
        if bar == 1.0 and margin == 0.0:  # the least served held partition, own first on a tie
            j = min(held, key=lambda q: (served[q], held.index(q)))
        else:
            starved = [q for q in held[1:] if served[q] < bar_of(q, p) * served[p]
                       and served[p] - served[q] > margin * math.sqrt(served[p] + served[q])]
            j = min(starved, key=lambda q: (served[q], held.index(q))) if starved else p
        served[j] += 1
        return j

    jobs = [1] * n
    running = {}
    for p in range(n):
        j = pick(p)
        running[p] = (table[1][p] + cost * load[j], version, theta, j)
    buffer, used, models, times, parts = None, [], {}, {}, {}
    while version < steps:
        p = min(running, key=lambda q: (running[q][0], q))
        arrive, sent_version, sent, j = running.pop(p)
        new, _, _ = call_app(sent, j, n)
        norms[j] = math.sqrt(sum(float(np.sum((new[m] - sent[m]) ** 2)) for m in sent))
        pool = [x for v, x in arrived if sent_version - era <= v <= sent_version]
        if len(pool) >= 3:
            ratios.setdefault(j, []).append(math.log(norms[j] / float(np.median(pool))))
        arrived.append((sent_version, norms[j]))
        if trace is not None:
            trace.update(ratios=ratios, latched=latched)
        w = (1.0 + version - sent_version) ** -0.5
        delta = {m: w * (new[m] - sent[m]) for m in sent}
        buffer = delta if buffer is None else {m: buffer[m] + delta[m] for m in buffer}
        used.append(j)
        if len(used) == k:
            theta = {m: theta[m] + server_lr * buffer[m] / k for m in theta}
            version += 1
            models[version], times[version], parts[version] = theta, arrive, used
            buffer, used = None, []
            if switch_after is not None and version >= switch_after:
                bar, margin = 1.0, 0.0
        jobs[p] += 1
        j = pick(p)
        running[p] = (arrive + table[jobs[p]][p] + cost * load[j], version, theta, j)
    return models, times, parts


# client 3 is persistently slow; the others' durations vary by job (drawn: no two arrivals
# at one time, whose order the reference would break otherwise than the dispatch order)
TABLE = {j: [*np.random.default_rng(j).uniform(0.3, 0.8, 3), 50.0] for j in range(1, 30)}


@pytest.mark.parametrize("s, theta", [(1, 1.0), (2, 1.0), (1, 0.5), (2, 0.3), (2, 0.9)])
def test_each_job_is_the_least_served_held_partition_and_steps_follow_fedbuff(s, theta):
    strategy = ReplicatedFedBuff(s=s, buffer_size=2, concurrency=4, server_lr=0.7,
                                 latency=FixedArrivals(TABLE), measured_compute=False,
                                 **({} if theta == 1.0 else {"replicate_below": theta}))
    result, models = start_run(strategy, 4, 8)
    expected, times, parts = replicated_reference(TABLE, 4, s, 2, 0.7, 8, bar=theta)
    for step in range(1, 9):
        assert_model(models[step], expected[step])
    assert_model(as_dict(result.arrays), expected[8])
    assert [row["virtual_s"] for row in strategy.history] == pytest.approx(
        [times[t] for t in range(1, 9)])
    assert [row["clients_used"] for row in strategy.history] == [parts[t] for t in range(1, 9)]


def test_a_jobs_compute_is_charged_by_the_partition_it_computes_not_the_clients_own():
    sizes = [10, 40, 10, 100]  # loads 0.25, 1, 0.25, 2.5 (mean 40)
    strategy = ReplicatedFedBuff(s=1, buffer_size=2, concurrency=4, server_lr=0.7,
                                 latency=FixedArrivals(TABLE), measured_compute=False,
                                 partition_sizes=sizes, compute_cost_s=0.3)
    _, models = start_run(strategy, 4, 8)
    expected, times, parts = replicated_reference(TABLE, 4, 1, 2, 0.7, 8, sizes=sizes, cost=0.3)
    assert [row["virtual_s"] for row in strategy.history] == pytest.approx(
        [times[t] for t in range(1, 9)])
    assert [row["clients_used"] for row in strategy.history] == [parts[t] for t in range(1, 9)]
    for step in range(1, 9):
        assert_model(models[step], expected[step])
    # the fast client 2 computed the slow client 3's partition, charged at its load
    assert any(3 in row["clients_used"] for row in strategy.history)


def test_a_device_gone_off_leaves_its_partition_to_its_neighbour():
    """Client 1's device is off for every job (the server hears so 0.2 s after each start):
    partition 1 enters the model through client 0, which holds it too, and a job that
    brought nothing does not count as serving the partition."""
    off = {r: [0.3, math.inf, 0.35, 0.4] for r in range(1, 40)}
    notices = {r: {1: 0.2} for r in range(1, 40)}
    latency = DevicesOff(off, notices)
    strategy = ReplicatedFedBuff(s=1, buffer_size=1, concurrency=4, latency=latency,
                                 measured_compute=False)
    start_run(strategy, 4, 12)
    assert all(1 not in row["computed_by"] for row in strategy.history)
    uses = [(row["clients_used"][0], row["computed_by"][0]) for row in strategy.history]
    assert (1, 0) in uses
    assert min(strategy.served.values()) >= 0
    # client 1 keeps being sent work and keeps being reported off, 0.2 s after each start
    assert sum(row["rejected"] for row in strategy.history) >= 5
    used = np.bincount([j for j, _ in uses], minlength=4)
    assert used[1] >= used.max() - 2  # served about as often as any other partition


def test_a_device_off_gets_no_job_until_its_own_device_is_on_again():
    """FedScale devices: client 0 (1 s a job) is on 0-2.5 s and 10-900 s of its cycle,
    client 1 takes 10 s a job, client 2 0.7 s. At 2 s partition 1 is the least served that
    client 0 holds, so its third job is partition 1's; the device goes off during it (heard
    of 0.1 s later): one report, and no job for client 0 until its own device is on at 10 s
    (not partition 1's device, which is always on)."""
    from fl_gradcode.devices import DeviceTrace

    capacity = {w + 1: {"computation": 1000.0 * sec / 3, "communication": 1.0}
                for w, sec in enumerate([1.0, 10.0, 0.7])}
    behave = {1: {"active": [0.0, 10.0], "inactive": [2.5, 900.0], "finish_time": 1000.0}}
    strategy = ReplicatedFedBuff(s=1, buffer_size=1, concurrency=3, measured_compute=False,
                                 latency=DeviceTrace(capacity, behave, notice_s=0.1))
    start_run(strategy, 3, 30)
    assert sum(row["rejected"] for row in strategy.history) == 1
    by_zero = [row["virtual_s"] for row in strategy.history if row["computed_by"] == [0]]
    assert any(t < 2.5 for t in by_zero) and any(t > 10.0 for t in by_zero)
    assert not any(2.5 < t < 10.0 for t in by_zero)


def test_the_slow_clients_partition_enters_the_model_through_its_neighbour():
    """Before client 3's first reply (50 s), FedBuff never uses partition 3; with s = 1 the
    fast client 2, which holds it too, computes it."""
    runs = {}
    for s in (0, 1):
        strategy = ReplicatedFedBuff(s=s, buffer_size=1, concurrency=4,
                                     latency=FixedArrivals(TABLE), measured_compute=False)
        start_run(strategy, 4, 12)
        assert strategy.history[-1]["virtual_s"] < 50.0
        runs[s] = strategy.history
    assert all(3 not in row["clients_used"] for row in runs[0])
    uses = [(row["clients_used"][0], row["computed_by"][0]) for row in runs[1]]
    assert (3, 2) in uses
    counts = np.bincount([j for j, _ in uses], minlength=4)
    assert counts.max() - counts.min() <= 2  # every partition served about equally


@pytest.mark.parametrize("s, theta", [(0, 1.0), (2, 0.0)])
def test_s_zero_is_fedbuff_step_for_step(s, theta):
    plain = FedBuff(buffer_size=2, concurrency=4, server_lr=0.7,
                    latency=FixedArrivals(TABLE), measured_compute=False)
    _, fedbuff_models = start_run(plain, 4, 6, app=make_app(train_timing_mod))
    coded = ReplicatedFedBuff(s=s, replicate_below=theta, buffer_size=2, concurrency=4,
                              server_lr=0.7, latency=FixedArrivals(TABLE),
                              measured_compute=False)
    _, models = start_run(coded, 4, 6)
    for step in range(7):
        assert_model(models[step], fedbuff_models[step])
    for mine, theirs in zip(coded.history, plain.history, strict=True):
        for key in ("clients_used", "staleness", "virtual_s", "num_examples"):
            assert mine[key] == pytest.approx(theirs[key])


@pytest.mark.parametrize("n, s", [(5, 1), (6, 2), (7, 3), (4, 3)])
def test_the_placement_is_the_cyclic_repetition_codes_support(n, s):
    rows = crc_matrix(n, s, np.random.default_rng(0))
    for p in range(n):
        assert sorted(cyclic_placement(p, n, s)) == sorted(np.flatnonzero(rows[p]).tolist())


def test_a_bad_reply_is_dropped_and_the_run_goes_on():
    def app(msg, context):
        if int(context.node_config["partition-id"]) == 1 and msg.metadata.group_id != \
                "identify":
            return Message(Error(0, "client crashed"), reply_to=msg)
        return make_app(train_timing_mod, gradient_coding_mod)(msg, context)

    strategy = ReplicatedFedBuff(s=1, buffer_size=2, concurrency=3,
                                 latency=FixedArrivals(TABLE), measured_compute=False)
    _, models = start_run(strategy, 3, 4, app=app)
    assert sorted(models) == [0, 1, 2, 3, 4]
    assert all(1 not in row["computed_by"] for row in strategy.history)
    assert sum(row["rejected"] for row in strategy.history) >= 1
    assert any(1 in row["clients_used"] for row in strategy.history)  # node 0 holds it


@pytest.mark.parametrize("s", [0, 1])
def test_a_weight_that_makes_the_update_infinite_is_a_rejected_reply(s):
    """A coded reply whose num-examples is finite and > 0 but tiny (1e-320): the update it
    stands for (the reply over its weight) is not finite; the reply is rejected and the model
    stays finite, step after step."""
    from fl_gradcode.flower.protocol import PROTOCOL_KEY

    meta_key = PROTOCOL_KEY + "-meta"

    def tiny_weight_mod(msg, context, call_next):
        reply = call_next(msg, context)
        if (int(context.node_config["partition-id"]) == 0 and not reply.has_error()
                and meta_key in reply.content.metric_records):
            meta = reply.content.metric_records[meta_key]
            meta["num-examples"] = 1e-320
            if "partition-sizes" in meta:
                meta["partition-sizes"] = [1e-320]
        return reply

    strategy = ReplicatedFedBuff(s=s, buffer_size=2, concurrency=3,
                                 latency=FixedArrivals(TABLE), measured_compute=False)
    app = make_app(tiny_weight_mod, train_timing_mod, gradient_coding_mod)
    _, models = start_run(strategy, 3, 4, app=app)
    assert all(np.all(np.isfinite(v)) for model in models.values() for v in model.values())
    assert sum(row["rejected"] for row in strategy.history) >= 1


def test_two_claims_of_one_partition_get_neither_claimant_a_job(caplog):
    """Node 3 claims node 0's partition: as in the coded rounds, neither claimant is used (no
    first-come rule an impostor could win), and the log names them."""
    grid = InProcessGrid(make_app(train_timing_mod, gradient_coding_mod), 4,
                         node_config=lambda i: {"partition-id": 0} if i == 3 else {})
    strategy = ReplicatedFedBuff(s=1, buffer_size=2, concurrency=4,
                                 latency=FixedArrivals(TABLE), measured_compute=False)
    _, models = start_run(strategy, 4, 4, grid=grid)
    assert all(0 not in row["computed_by"] for row in strategy.history)
    assert sorted(models) == [0, 1, 2, 3, 4]
    assert "claims partition-id=0 of 4, as does node" in caplog.text


def test_a_claim_of_another_num_partitions_gets_no_job():
    """Node 3 claims partition 0 of 1 among nodes that claim 4: it is not used (its replicas
    would train 'partition 0 of 1', the whole data as one partition); no app call is told
    num-partitions=1."""
    told = []

    def record_mod(msg, context, call_next):
        if msg.metadata.message_type == "train":
            told.append(int(context.node_config["num-partitions"]))
        return call_next(msg, context)

    grid = InProcessGrid(make_app(train_timing_mod, gradient_coding_mod, record_mod), 4,
                         node_config=lambda i: ({"partition-id": 0, "num-partitions": 1}
                                                if i == 3 else {}))
    strategy = ReplicatedFedBuff(s=1, buffer_size=2, concurrency=4,
                                 latency=FixedArrivals(TABLE), measured_compute=False)
    start_run(strategy, 4, 6, grid=grid)
    assert told and set(told) == {4}


def test_when_every_claim_is_refused_the_error_says_so():
    """Every node claims partition 0: none is used, and the run's error says the claims were
    refused (it asked whether the ClientApp has the mod)."""
    grid = InProcessGrid(make_app(train_timing_mod, gradient_coding_mod), 4,
                         node_config=lambda i: {"partition-id": 0})
    strategy = ReplicatedFedBuff(s=1, buffer_size=2, concurrency=4,
                                 latency=FixedArrivals(TABLE), measured_compute=False)
    with pytest.raises(ValueError, match="every node's identity claim was refused"):
        start_run(strategy, 4, 2, grid=grid)


def test_a_node_that_does_not_identify_gets_no_job(caplog):
    def app(msg, context):
        if int(context.node_config["partition-id"]) == 2:
            return Message(Error(0, "no mod here"), reply_to=msg)
        return make_app(train_timing_mod, gradient_coding_mod)(msg, context)

    strategy = ReplicatedFedBuff(s=1, buffer_size=1, concurrency=3,
                                 latency=FixedArrivals(TABLE), measured_compute=False)
    with caplog.at_level(logging.WARNING):
        start_run(strategy, 3, 4, app=app)
    assert "1 of 3 nodes did not identify" in caplog.text
    assert all(2 not in row["computed_by"] for row in strategy.history)
    assert any(2 in row["clients_used"] for row in strategy.history)  # node 1 holds it


def test_without_the_coding_mod_it_says_what_to_add():
    strategy = ReplicatedFedBuff(s=1, buffer_size=1, latency=FixedArrivals(TABLE),
                                 measured_compute=False)
    with pytest.raises(ValueError, match="gradient_coding_mod"):
        start_run(strategy, 3, 1, app=make_app(train_timing_mod))


@pytest.mark.parametrize("s", [-1, True, 1.0, "1"])
def test_bad_s_is_refused_by_name(s):
    with pytest.raises(ValueError, match=rf"s={s!r} must be an integer >= 0"):
        ReplicatedFedBuff(s=s, buffer_size=1)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 60), s=st.integers(0, 70))
def test_every_partition_has_min_s_plus_one_n_holders_each_holding_as_many(n, s):
    held = [cyclic_placement(p, n, s) for p in range(n)]
    copies = min(s + 1, n)
    assert all(len(set(h)) == len(h) == copies and h[0] == p for p, h in enumerate(held))
    holders = np.bincount([j for h in held for j in h], minlength=n)
    assert holders.tolist() == [copies] * n


# every client's job takes 0.3-0.8 s, one of them 5 s in a drawn tenth of its jobs
TRANSIENT = {j: [*np.random.default_rng(100 + j).uniform(0.3, 0.8, 6)] for j in range(1, 80)}
for _j in range(1, 80):
    _slow = np.random.default_rng(200 + _j).integers(0, 60)
    if _slow < 6:
        TRANSIENT[_j][_slow] = 5.0


def test_below_the_bar_transient_stragglers_leave_every_client_its_own_partition():
    strategy = ReplicatedFedBuff(s=1, replicate_below=0.5, buffer_size=2, concurrency=6,
                                 latency=FixedArrivals(TRANSIENT), measured_compute=False)
    start_run(strategy, 6, 40)
    pairs = [(j, c) for row in strategy.history
             for j, c in zip(row["clients_used"], row["computed_by"], strict=True)]
    assert len(pairs) == 80 and all(j == c for j, c in pairs)


@pytest.mark.parametrize("theta", [0.25, 0.5])
def test_a_persistently_slow_clients_partition_is_served_at_the_bar(theta):
    """Client 3 takes 50 s a job: its neighbour 2 serves partition 3 while it has fewer jobs
    than ``theta`` times partition 2's, so it is served about ``theta`` times as often."""
    strategy = ReplicatedFedBuff(s=1, replicate_below=theta, buffer_size=1, concurrency=4,
                                 latency=FixedArrivals(TABLE), measured_compute=False)
    start_run(strategy, 4, 60)
    used = np.bincount([j for row in strategy.history for j in row["clients_used"]],
                       minlength=4)
    assert all(row["computed_by"] != [3] for row in strategy.history)  # it never replied
    assert used[3] >= 1
    assert abs(used[3] - theta * used[2]) <= 2


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan"), True, "0.5"])
def test_a_bar_outside_zero_one_is_refused_by_name(bad):
    with pytest.raises(ValueError, match="replicate_below="):
        ReplicatedFedBuff(s=1, replicate_below=bad, buffer_size=1)


def _follows_reference(s, theta, margin=0.0, need=math.inf, latch=False, era=0):
    """Forty steps of one update each on ``TABLE`` against the reference with the same rule;
    the reference's partitions of each step."""
    strategy = ReplicatedFedBuff(s=s, replicate_below=theta, replicate_margin=margin,
                                 need_ratio=need, need_latch=latch,
                                 need_reference="era" if era else "own", buffer_size=1,
                                 concurrency=4, server_lr=0.7, latency=FixedArrivals(TABLE),
                                 measured_compute=False)
    result, _ = start_run(strategy, 4, 40)
    expected, times, parts = replicated_reference(TABLE, 4, s, 1, 0.7, 40, bar=theta, margin=margin,
                                        need=need, latch=latch, era=era)
    assert [row["clients_used"] for row in strategy.history] == [parts[t] for t in range(1, 41)]
    assert [row["virtual_s"] for row in strategy.history] == pytest.approx(
        [times[t] for t in range(1, 41)])
    assert_model(as_dict(result.arrays), expected[40])
    return parts


@pytest.mark.parametrize("s, theta, z", [(1, 1.0, 1.0), (1, 0.75, 2.0), (2, 0.9, 1.5)])
def test_a_margin_replicates_only_a_lead_beyond_chance_as_the_reference_does(s, theta, z):
    parts = _follows_reference(s, theta, margin=z)
    # the slow client 3's partition is served by a neighbour, later than without the margin
    _, _, plain = replicated_reference(TABLE, 4, s, 1, 0.7, 40, bar=theta)
    first = min(t for t in range(1, 41) if 3 in parts[t])
    assert first > min(t for t in range(1, 41) if 3 in plain[t])


def test_a_margin_keeps_transient_stragglers_own_partitions_the_bar_alone_replicates():
    def replicated(**margin):
        strategy = ReplicatedFedBuff(s=1, replicate_below=1.0, buffer_size=2, concurrency=6,
                                     latency=FixedArrivals(TRANSIENT), measured_compute=False,
                                     **margin)
        start_run(strategy, 6, 40)
        return sum(j != c for row in strategy.history
                   for j, c in zip(row["clients_used"], row["computed_by"], strict=True))

    assert replicated() > 0
    assert replicated(replicate_margin=3.0) == 0


@pytest.mark.parametrize("bad", [-0.5, float("inf"), float("nan"), True, "1"])
def test_a_bad_margin_is_refused_by_name(bad):
    with pytest.raises(ValueError, match="replicate_margin="):
        ReplicatedFedBuff(s=1, replicate_margin=bad, buffer_size=1)


@pytest.mark.parametrize("s, theta, rho", [(1, 0.25, 1.0), (1, 0.25, 1.2), (2, 0.5, 1.1)])
def test_a_neighbour_whose_updates_are_larger_is_served_as_much_as_the_reference_says(
        s, theta, rho):
    parts = _follows_reference(s, theta, need=rho)
    _, _, plain = replicated_reference(TABLE, 4, s, 1, 0.7, 40, bar=theta)
    assert parts != plain  # the norms changed which partitions were computed


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), True, "2"])
def test_a_bad_need_ratio_is_refused_by_name(bad):
    with pytest.raises(ValueError, match="need_ratio="):
        ReplicatedFedBuff(s=1, need_ratio=bad, buffer_size=1)


@pytest.mark.parametrize("s, theta, rho", [(1, 0.25, 1.2), (2, 0.25, 1.1)])
def test_a_latched_need_keeps_the_bar_one_as_the_reference_does(s, theta, rho):
    parts = _follows_reference(s, theta, need=rho, latch=True)
    _, _, unlatched = replicated_reference(TABLE, 4, s, 1, 0.7, 40, bar=theta, need=rho)
    assert parts != unlatched  # the latch changed which partitions were computed
    with pytest.raises(ValueError, match="need_latch="):
        ReplicatedFedBuff(s=1, need_latch=1, buffer_size=1)


@pytest.mark.parametrize("s, rho", [(1, 1.2), (2, 1.5)])
def test_a_need_read_against_the_era_follows_the_reference(s, rho):
    """Thirty steps of two updates (a few updates of each step's era arrive before a stale
    one) against the reference's era rule, which differs here from the own-partition rule
    and from the bar alone."""
    strategy = ReplicatedFedBuff(s=s, replicate_below=0.25, need_ratio=rho, need_latch=True,
                                 need_reference="era", buffer_size=2, concurrency=4,
                                 server_lr=0.7, latency=FixedArrivals(TABLE),
                                 measured_compute=False)
    result, _ = start_run(strategy, 4, 30)
    expected, times, parts = replicated_reference(TABLE, 4, s, 2, 0.7, 30, bar=0.25, need=rho,
                                        latch=True, era=2)
    assert [row["clients_used"] for row in strategy.history] == [parts[t] for t in range(1, 31)]
    assert [row["virtual_s"] for row in strategy.history] == pytest.approx(
        [times[t] for t in range(1, 31)])
    assert_model(as_dict(result.arrays), expected[30])
    _, _, own = replicated_reference(TABLE, 4, s, 2, 0.7, 30, bar=0.25, need=rho, latch=True)
    _, _, plain = replicated_reference(TABLE, 4, s, 2, 0.7, 30, bar=0.25)
    assert parts != own and parts != plain  # the era's reading changed what was computed
    assert 3 in strategy.needed  # the slow client's partition, read through its neighbour


@pytest.mark.parametrize("bad", ["mine", "", None, 1])
def test_a_bad_need_reference_is_refused_by_name(bad):
    with pytest.raises(ValueError, match="need_reference="):
        ReplicatedFedBuff(s=1, need_ratio=2.0, need_reference=bad, buffer_size=1)


@pytest.mark.parametrize("s, k, rho", [(1, 1, 1.2), (1, 2, 3.0), (2, 1, 1.5)])
def test_a_need_read_over_a_cohorts_era_with_a_prior_follows_the_reference(s, k, rho):
    """``need_reference='cohort'``: the era spans ceil(concurrency / K) steps before an
    update's own; ``need_prior``: a partition read fewer than twice has the bar 1. Each
    changes what is computed against the three-step era without a prior."""
    def run(reference, prior):
        strategy = ReplicatedFedBuff(s=s, replicate_below=0.25, need_ratio=rho,
                                     need_latch=True, need_reference=reference,
                                     need_prior=prior, buffer_size=k, concurrency=4,
                                     server_lr=0.7, latency=FixedArrivals(TABLE),
                                     measured_compute=False)
        result, _ = start_run(strategy, 4, 24)
        return strategy, result

    strategy, result = run("cohort", True)
    expected, times, parts = replicated_reference(TABLE, 4, s, k, 0.7, 24, bar=0.25, need=rho,
                                        latch=True, era=math.ceil(4 / k), prior=True)
    assert [row["clients_used"] for row in strategy.history] == [parts[t] for t in range(1, 25)]
    assert [row["virtual_s"] for row in strategy.history] == pytest.approx(
        [times[t] for t in range(1, 25)])
    assert_model(as_dict(result.arrays), expected[24])
    _, _, no_prior = replicated_reference(TABLE, 4, s, k, 0.7, 24, bar=0.25, need=rho, latch=True,
                                era=math.ceil(4 / k))
    assert parts != no_prior  # the prior changed what was computed
    unread = run("era", False)[0]
    assert [row["clients_used"] for row in unread.history] != [parts[t] for t in range(1, 25)]


@pytest.mark.parametrize("bad", [1, "yes", None])
def test_a_bad_need_prior_or_one_without_an_era_is_refused_by_name(bad):
    with pytest.raises(ValueError, match="need_prior="):
        ReplicatedFedBuff(s=1, need_ratio=2.0, need_reference="era", need_prior=bad,
                          buffer_size=1)
    with pytest.raises(ValueError, match="need_prior=True"):
        ReplicatedFedBuff(s=1, need_ratio=2.0, need_prior=True, buffer_size=1)


# eight clients, 3 and 6 persistently slow, the others 0.3-0.8 s a job (drawn)
TABLE8 = {j: [*np.random.default_rng(300 + j).uniform(0.3, 0.8, 8)] for j in range(1, 60)}
for _row in TABLE8.values():
    _row[3], _row[6] = 4.0, 9.0


@pytest.mark.parametrize("reference, k, rho", [("era", 3, 1.3), ("era", 2, 1.1),
                                               ("cohort", 3, 1.3), ("cohort", 1, 1.2)])
def test_each_readings_ratios_and_latches_are_the_references(reference, k, rho):
    """Eight clients, two of them slow: every reading of every partition (the log of its
    norm over the median of the earlier arrivals of its era) and the partitions latched are
    the reference's, as are the steps; ``cohort`` with the prior."""
    prior = reference == "cohort"
    strategy = ReplicatedFedBuff(s=1, replicate_below=0.25, need_ratio=rho, need_latch=True,
                                 need_reference=reference, need_prior=prior, buffer_size=k,
                                 concurrency=8, server_lr=0.7, latency=FixedArrivals(TABLE8),
                                 measured_compute=False)
    result, _ = start_run(strategy, 8, 30)
    trace = {}
    window = 2 if reference == "era" else math.ceil(8 / k)
    expected, times, parts = replicated_reference(TABLE8, 8, 1, k, 0.7, 30, bar=0.25, need=rho,
                                        latch=True, era=window, prior=prior, trace=trace)
    assert [row["clients_used"] for row in strategy.history] == [parts[t] for t in range(1, 31)]
    assert [row["virtual_s"] for row in strategy.history] == pytest.approx(
        [times[t] for t in range(1, 31)])
    assert_model(as_dict(result.arrays), expected[30])
    assert sorted(strategy.readings) == sorted(trace["ratios"])
    for p, mine in strategy.readings.items():
        assert list(mine) == pytest.approx(trace["ratios"][p][-3:], abs=1e-12)
    assert strategy.needed == trace["latched"] and strategy.needed


@pytest.mark.parametrize("concurrency, k, steps", [(4, 1, 4), (None, 3, 3), (3, 3, 1)])
def test_a_cohorts_era_spans_the_steps_of_the_jobs_in_flight(concurrency, k, steps):
    strategy = ReplicatedFedBuff(s=1, replicate_below=0.25, need_ratio=2.0,
                                 need_reference="cohort", buffer_size=k,
                                 concurrency=concurrency, latency=FixedArrivals(TABLE8),
                                 measured_compute=False)
    start_run(strategy, 8, 2)
    assert strategy.era_steps == steps


def test_a_second_run_of_the_same_strategy_reads_need_afresh():
    strategy = ReplicatedFedBuff(s=1, replicate_below=0.25, need_ratio=1.3, need_latch=True,
                                 need_reference="cohort", need_prior=True, buffer_size=3,
                                 concurrency=8, server_lr=0.7, latency=FixedArrivals(TABLE8),
                                 measured_compute=False)
    first, _ = start_run(strategy, 8, 20)
    runs = [row["clients_used"] for row in strategy.history]
    again, _ = start_run(strategy, 8, 20)
    assert [row["clients_used"] for row in strategy.history[-20:]] == runs
    assert_model(as_dict(again.arrays), as_dict(first.arrays))
