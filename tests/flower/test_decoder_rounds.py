"""The decoder inside a round: a ``RoundAggregator`` decoding round 1 with a fresh verifier
and quarantine. A reply whose NaN or Inf spoils the decoded model is rejected with its array
named and the round decoded again; the decoding's error is recorded; a round the decoder
refuses, or one ``verify=True`` withholds, is recorded as skipped, with the right warning."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from flwr.app import Message, RecordDict
from flwr.serverapp.strategy import FedAvg

from fl_gradcode.codes import make_code
from tests.flower.decoder_support import SHAPES, average, make_decoder, problem


def _decode_in_a_round(code, theta, valid, used, sparse, *, integrity=None, probe=None,
                       max_decode_error=0.5):
    """Round 1 of ``code`` on nodes 100, 101, ... holding the replies ``valid``, decoded over
    ``used`` by a RoundAggregator with a fresh verifier (``integrity`` options, the round's
    cross-check ``probe``) and quarantine: ``(outcome, arrays, state)``."""
    import dataclasses

    from fl_gradcode.flower.aggregator import RoundAggregator
    from fl_gradcode.flower.collector import Arrivals
    from fl_gradcode.flower.deadline_policy import DeadlinePolicy
    from fl_gradcode.flower.dispatch import Requests
    from fl_gradcode.flower.options import DeadlineOptions, IntegrityOptions
    from fl_gradcode.flower.quarantine import Quarantine
    from fl_gradcode.flower.round_state import RoundPlan, RoundState
    from fl_gradcode.flower.verifier import RoundVerifier, Verification

    cohort = [100 + w for w in range(code.n)]
    plan = RoundPlan(
        number=1, code=code, cohort=tuple(cohort), partitions=(), busy=(), excluded=(),
        quarantined=(), layout={k: v.shape for k, v in theta.items()}, reply_layout={},
        dtypes={k: v.dtype for k, v in theta.items()}, theta=theta, array_key="arrays",
        wire="float64", wall_start=0.0, probe=probe)
    requests = Requests({w: Message(RecordDict({}), dst_node_id=n, message_type="train")
                         for w, n in enumerate(cohort)})
    arrivals = Arrivals(code)
    for worker, reply in valid.items():
        arrivals.accept(worker, reply)
    state = RoundState(plan, requests, arrivals, verification=Verification(tuple(used), None))
    verifier = RoundVerifier(integrity or IntegrityOptions(),
                             DeadlinePolicy(DeadlineOptions(), False), Quarantine())
    aggregator = RoundAggregator(decoder=make_decoder(FedAvg(), sparse=sparse), verifier=verifier,
                                 max_decode_error=max_decode_error)
    state, arrays, _ = aggregator.decode(state)
    assert dataclasses.is_dataclass(state)
    return state.outcome, arrays, state


def _aggregate_with_a_nan_reply(sparse):
    """FRC n=4, s=1, every reply in hand, reply 1 holding a NaN its decoding may not read."""
    code = make_code("frc", n=4, s=1)
    theta, sizes, deltas, replies = problem(code)
    replies[1].arrays["w"][0, 0] = np.nan
    outcome, arrays, state = _decode_in_a_round(code, theta, dict(replies), [0, 1, 2, 3],
                                                sparse)
    return outcome, arrays, state, average(theta, sizes, deltas)


def test_a_reply_whose_nan_spoils_the_decoded_model_is_rejected_and_the_round_decoded_again():
    outcome, arrays, state, expected = _aggregate_with_a_nan_reply(sparse=False)
    assert state.rejected == [(101, "array 'w' contains NaN or Inf")] and 1 not in state.valid
    assert outcome.decode == "exact" and outcome.used == [0, 2, 3]
    for k in SHAPES:
        np.testing.assert_allclose(arrays[k].numpy(), expected[k], rtol=1e-10)


def test_a_nan_in_a_reply_the_decoding_does_not_read_rejects_nothing():
    outcome, arrays, state, expected = _aggregate_with_a_nan_reply(sparse=True)
    assert state.rejected == [] and outcome.decode == "exact"
    assert outcome.used == [0, 1, 2, 3] and outcome.replies_read == 2
    for k in SHAPES:
        np.testing.assert_allclose(arrays[k].numpy(), expected[k], rtol=1e-10)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_crc_reply_whose_non_finite_value_spoils_the_sums_is_named_and_the_round_redecoded(
        bad):
    """CRC n=8, s=2, seven float64 replies decoded densely (every coefficient nonzero and not
    1: every reply after the first is added by the in-place BLAS kernel); reply 3 holds one
    non-finite value. The decoded block is not finite, so the replies are checked one by one:
    reply 3 is rejected with its array named, and the six others decode exactly."""
    code = make_code("crc", n=8, s=2, seed=0)
    theta, sizes, deltas, replies = problem(code)
    used = [0, 1, 2, 3, 4, 5, 6]
    rows = code.chunk_decoder(code.decoding(used))[:, used]
    assert np.all(rows != 0.0) and np.all(rows != 1.0)  # the kernel's path, no 0/1 shortcut
    replies[3].arrays["w"].reshape(-1)[5] = bad
    outcome, arrays, state = _decode_in_a_round(code, theta, {w: replies[w] for w in used},
                                                used, sparse=False)
    assert state.rejected == [(103, "array 'w' contains NaN or Inf")] and 3 not in state.valid
    assert outcome.decode == "exact" and outcome.used == [0, 1, 2, 4, 5, 6]
    expected = average(theta, sizes, deltas)
    for k in SHAPES:
        np.testing.assert_allclose(arrays[k].numpy(), expected[k], rtol=1e-9)


def test_a_round_records_the_decodings_error():
    """FRC n=4, s=1 (groups {0, 1} and {2, 3}): both groups decode exactly (error 0); group 0
    alone at best recovers partitions 0 and 1, ``alpha = [1, 1, 0, 0]``: error
    ``||alpha - 1||^2 / k = 2 / 4``."""
    code = make_code("frc", n=4, s=1)
    theta, sizes, deltas, replies = problem(code)
    exact, _, _ = _decode_in_a_round(code, theta, dict(replies), [0, 2], sparse=True)
    assert exact.decode == "exact" and exact.decode_error == 0.0
    approx, arrays, _ = _decode_in_a_round(code, theta, dict(replies), [0], sparse=True)
    assert approx.decode == "approx" and approx.decode_error == pytest.approx(0.5, abs=1e-12)
    expected = average(theta, sizes, deltas, alpha=np.array([1.0, 1.0, 0.0, 0.0]))
    np.testing.assert_allclose(arrays["w"].numpy(), expected["w"], rtol=1e-10)


def test_a_decodable_round_the_decoder_refuses_is_recorded_as_skipped(caplog):
    """Every partition claims no examples: the decoding is exact but the count is 0, so
    nothing is applied and the round says so."""
    code = make_code("frc", n=4, s=1)
    theta, _, _, replies = problem(code)
    for r in replies.values():
        r.num_examples = 0.0
    with caplog.at_level(logging.WARNING, logger="flwr"):
        outcome, arrays, state = _decode_in_a_round(code, theta, dict(replies), [0, 1, 2, 3],
                                                    sparse=True)
    assert outcome.decode == "skipped" and arrays is None and state.rejected == []
    assert outcome.replies_read == 0 and outcome.num_examples is None
    assert "round 1: decoded example count 0.0; round skipped" in [
        r.getMessage() for r in caplog.records]


def test_under_verify_a_round_skipped_anyway_is_not_said_to_be_withheld(caplog):
    """``verify=True``, the replies not cross-checked: a round with nothing decodable is
    skipped for that reason alone; the "could not all be cross-checked" warning is for a
    decodable round only."""
    from types import SimpleNamespace

    from fl_gradcode.flower.options import IntegrityOptions

    code = make_code("frc", n=4, s=1)
    theta, _, _, replies = problem(code)
    for used in ([], [0]):  # no decoding; error 0.5 beyond max_decode_error=0.25
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="flwr"):
            outcome, arrays, _ = _decode_in_a_round(
                code, theta, dict(replies), used, sparse=True,
                integrity=IntegrityOptions(verify=True), probe=SimpleNamespace(verdicts={}),
                max_decode_error=0.25)
        assert outcome.decode == "skipped" and arrays is None
        assert outcome.decode_error == (1.0 if not used else pytest.approx(0.5, abs=1e-12))
        assert not any("cross-checked" in r.getMessage() for r in caplog.records)
    with caplog.at_level(logging.WARNING, logger="flwr"):  # a decodable one is withheld
        outcome, _, _ = _decode_in_a_round(
            code, theta, dict(replies), [0, 2], sparse=True,
            integrity=IntegrityOptions(verify=True), probe=SimpleNamespace(verdicts={}))
    assert outcome.decode == "skipped"
    assert [r.getMessage() for r in caplog.records] == [
        "round 1: verify=True and the replies could not all be cross-checked before the "
        "deadline; nothing is applied"]
