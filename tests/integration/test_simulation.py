"""End-to-end runs in Flower's simulation engine (Ray): exactness, stragglers, bad replies."""

from __future__ import annotations

import time

import numpy as np
import pytest

from fl_gradcode.results import ROUND_FIELDS, read_rounds

pytestmark = pytest.mark.simulation


def simulate(tmp_path, name: str, num_supernodes: int, **overrides):
    from flwr.simulation import run_simulation

    from clients.app import app as client_app
    from server.app import make_server_app

    out = tmp_path / name
    config = {"results-dir": str(out), **overrides}
    t0 = time.monotonic()
    run_simulation(
        make_server_app(config),
        client_app,
        num_supernodes=num_supernodes,
        backend_config={"client_resources": {"num_cpus": 1}},
    )
    elapsed = time.monotonic() - t0
    model = np.load(out / "final_model.npz")
    flat = np.concatenate([model[k].reshape(-1) for k in model.files])
    return read_rounds(out), flat, elapsed


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("update", ["gradient", "local"])
def test_coded_run_with_stragglers_equals_uncoded_run(tmp_path, update):
    # virtual time from the latency model only: measured compute (Ray start-up, a loaded
    # machine) would make the deadline, not the code, decide which rounds decode exactly
    common = {"num-rounds": 3, "update": update, "seed": 3, "lr": 0.3 if update == "local" else 0.5,
              "virtual-compute": "none"}
    coded_rounds, coded, _ = simulate(
        tmp_path,
        "coded",
        4,
        code="grouped-rs",
        s=1,
        latency="shifted-exponential",
        **({"nan-workers": "1"} if update == "gradient" else {}),
        **common,
    )
    uncoded_rounds, uncoded, _ = simulate(
        tmp_path, "uncoded", 4, code="uncoded", s=0, latency="none", **common
    )
    assert all(set(ROUND_FIELDS) <= set(r) for r in coded_rounds)
    assert [r["decode"] for r in coded_rounds] == ["exact"] * 3
    assert all(len(r["stragglers"]) >= 1 for r in coded_rounds)  # stragglers every round
    assert all(len(r["clients_used"]) == 4 for r in uncoded_rounds)
    if update == "gradient":  # worker 1 sends NaN: rejected, counted, never decoded
        assert all(r["rejected"] == 1 and 1 not in r["clients_used"] for r in coded_rounds)
    assert np.all(np.isfinite(coded))
    assert rel(coded, uncoded) <= 1e-6
    assert coded_rounds[-1]["accuracy"] == pytest.approx(uncoded_rounds[-1]["accuracy"])


def test_wallclock_slow_client_does_not_hold_rounds_back(tmp_path):
    rounds, model, _ = simulate(
        tmp_path,
        "wall",
        4,
        code="grouped-rs",
        s=1,
        timing="wallclock",
        latency="none",
        **{"slow-workers": "2", "slow-delay-s": 10.0, "num-rounds": 3, "straggler-timeout": 8.0},
    )
    assert [r["decode"] for r in rounds] == ["exact"] * 3
    assert all(2 not in r["clients_used"] for r in rounds)
    # no round waits for the slow client's 10 s: round 1 ended before its reply (it is still
    # sleeping on round 1's work when round 2 starts, so it is not sent new work), and the
    # later rounds take less than that delay (the bound is the delay, not a guess at how fast
    # the machine is; round 1 also starts the Ray actors, 18 s once under load)
    assert rounds[1]["busy"] == [2]
    assert all(r["wall_s"] < 10.0 for r in rounds[1:]), [r["wall_s"] for r in rounds]
    assert np.all(np.isfinite(model))


def test_auto_tolerance_in_wallclock_rounds_skips_a_slow_client_and_stays_exact(tmp_path):
    """``s=auto`` through our ServerApp and ClientApp in Flower's simulation engine, wallclock
    rounds: it starts at ``s-max``, never waits for a client asleep for 10 s, records its
    choice per round, and every round decodes the uncoded result (compared with an uncoded run
    without the slow client's delay)."""
    common = {"num-rounds": 3, "update": "gradient", "seed": 5, "lr": 0.5, "latency": "none"}
    rounds, model, _ = simulate(
        tmp_path,
        "auto",
        6,
        code="grouped-rs",
        s="auto",
        **{"s-max": 2, "timing": "wallclock", "slow-workers": "2", "slow-delay-s": 10.0,
           "straggler-timeout": 8.0},
        **common,
    )
    _, uncoded, _ = simulate(tmp_path, "uncoded", 6, code="uncoded", s=0, **common)
    assert [r["decode"] for r in rounds] == ["exact"] * 3
    assert rounds[0]["s"] == 2  # no observation yet: the safe s_max
    assert all(r["s"] in (1, 2) for r in rounds)  # one client asleep: s = 0 cannot decode
    assert all(2 not in r["clients_used"] for r in rounds)
    # as above: round 1 ended before the slow client's reply (others may still be computing
    # too), the later rounds take less than its delay
    assert 2 in rounds[1]["busy"]
    assert all(r["wall_s"] < 10.0 for r in rounds[1:]), [r["wall_s"] for r in rounds]
    assert rel(model, uncoded) <= 1e-6


def test_asynchronous_wallclock_run_takes_a_sleeping_clients_partition_from_its_neighbour(
        tmp_path):
    """``asynchronous=true`` through our ServerApp and ClientApp in Flower's simulation
    engine, in real time: client 2 sleeps 10 s after each job; the server steps go on without
    it, and its partition enters the model through client 1 (which holds partitions 1 and 2,
    s = 1), every update of the first steps coming from the awake clients."""
    rounds, model, _ = simulate(
        tmp_path, "async", 4, asynchronous=True, s=1, timing="wallclock", latency="none",
        **{"slow-workers": "2", "slow-delay-s": 10.0, "num-rounds": 3, "buffer-size": 2,
           "seed": 1},
    )
    assert len(rounds) == 6  # 3 rounds' worth of 4 updates, 2 per server step
    pairs = [(p, by) for r in rounds for p, by in zip(r["clients_used"], r["computed_by"],
                                                      strict=True)]
    assert (2, 1) in pairs
    assert all(by != 2 for p, by in pairs[:4])
    assert np.all(np.isfinite(model))
