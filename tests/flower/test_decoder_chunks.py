"""Each code's own chunks on the one decoder path: chunk coefficients and the chunk decoder
checked against the code's ``B``, the reply layout covering the decoded vector once, the
wire dtypes, and the error amplification (its definition, numpy) that makes ``wire="auto"``
send float64."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.serverapp.strategy import FedAvg

from fl_gradcode.codes import available_codes, make_code
from fl_gradcode.flower import protocol
from fl_gradcode.flower.decoder import (
    ReplyLayout,
    error_amplification,
    instruction_chunks,
    replies_read,
    wire_dtypes,
)
from tests.flower.decoder_support import make_decoder


# ================================================================== codes' own chunks
@pytest.mark.parametrize("name", available_codes())
def test_chunk_coefficients_and_decoder_agree_with_the_codes_B(name):
    options = {"m": 3} if name == "comm-efficient" else {}
    code = make_code(name, n=9, s=2, seed=1, **options)
    m = code.chunks
    coefficients = np.array([code.chunk_coefficients(i) for i in range(code.n)])  # n x m
    assert coefficients.shape == (code.n, m)
    used = [i for i in range(code.n) if i not in (1, 5)]
    decoding = code.decoding(used)
    D = code.chunk_decoder(decoding)
    assert D.shape == (m, code.n)
    assert np.all(D[:, [1, 5]] == 0)
    if m == 1:
        assert np.all(coefficients == 1.0)
        assert instruction_chunks(code, 0) == ()
        # one chunk: its row is the decoding vector, so D B = alpha (1 when exact)
        np.testing.assert_allclose(D[0] @ code.B, decoding.alpha, atol=1e-9)
        return
    assert instruction_chunks(code, 4) == tuple(coefficients[4])
    # m chunks: workers with the same row of B form a group that mixes the same m chunks;
    # from the group's received members, D recovers each chunk: D_T C_T = I (C_T: |T| x m)
    rows = {tuple(code.B[i]) for i in range(code.n)}
    for row in rows:
        group = [i for i in range(code.n) if tuple(code.B[i]) == row]
        got = [i for i in group if i in used]
        assert len(got) >= m
        np.testing.assert_allclose(D[:, got] @ coefficients[got], np.eye(m), atol=1e-9)
        # any m members' coefficients are independent (MDS): any m replies decode the group
        assert np.linalg.matrix_rank(coefficients[group[:m]]) == m


def test_error_amplification_reads_every_chunk_row():
    frc = make_code("frc", n=8, s=1)
    assert error_amplification(frc, seed=0) == pytest.approx(1.0)
    code = make_code("comm-efficient", n=8, s=1, m=2)
    rng = np.random.default_rng(0)
    n, s = code.n, code.s
    sets = [list(range(n))]
    sets += [sorted(rng.choice(n, size=n - s, replace=False).tolist()) for _ in range(24)]
    sets += [[i for i in range(n) if (i - start) % n >= s] for start in range(0, n, 1)]
    row_l1 = np.abs(code.B).sum(axis=1)
    worst = max(float(np.abs(np.asarray(code.decoding(f).coefficients)).sum(axis=0) @ row_l1)
                for f in sets) / code.k
    assert error_amplification(code, seed=0) == pytest.approx(worst)


def test_replies_read_counts_the_replies_any_chunk_row_reads():
    frc = make_code("frc", n=6, s=1)
    assert replies_read(frc.sparse_decoding(list(range(6))), list(range(6))) == 3
    code = make_code("comm-efficient", n=6, s=1, m=2)
    assert replies_read(code.decoding([0, 1, 3, 4, 5]), [0, 1, 3, 4, 5]) == 5


def test_wire_dtypes_follow_the_layout():
    dtypes = {"w": np.dtype(np.float32), "b": np.dtype(np.int64)}
    frc, chunked = make_code("frc", n=4, s=1), make_code("comm-efficient", n=6, s=1, m=2)
    assert wire_dtypes(frc, dtypes, "model") == {"w": np.float32, "b": np.float64}
    assert wire_dtypes(frc, dtypes, "float64") == {"w": np.float64, "b": np.float64}
    assert wire_dtypes(chunked, dtypes, "model") == {protocol.CHUNK_KEY: np.float64}
    only32 = {"w": np.dtype(np.float32)}
    assert wire_dtypes(chunked, only32, "model") == {protocol.CHUNK_KEY: np.float32}
    assert wire_dtypes(chunked, only32, "float64") == {protocol.CHUNK_KEY: np.float64}


@pytest.mark.parametrize(("dim", "m"), [(19, 1), (19, 2), (19, 3), (20, 3), (1, 4)])
def test_the_layout_covers_the_decoded_vector_once(dim, m):
    theta = {"a": np.zeros(dim - 1), "z": np.zeros(1)} if dim > 1 else {"a": np.zeros(1)}
    code = make_code("comm-efficient", n=max(m + 1, 4), s=1, m=m)
    layout = ReplyLayout.of(code, theta)
    seen = []
    for chunk, segment, first, last in layout.pieces(0, dim + 1):
        assert 0 <= chunk < m and first < last
        bounds = np.cumsum([0, *(int(np.prod(s)) for s in layout.arrays.values()),
                            int(layout.count_in_record)])
        seen.extend(chunk * layout.length + bounds[segment] + q for q in range(first, last))
    assert seen == list(range(dim + 1))
    assert layout.length == -(-(dim + 1) // m)


def test_auto_wire_sends_float64_for_a_code_that_amplifies_rounding_beyond_the_limit():
    decoder = make_decoder(FedAvg())
    crc = make_code("crc", 8, 3)  # error amplification about 50 (> 8)
    assert error_amplification(crc, seed=0) > 8
    assert decoder.wire_for(crc) == "float64"
    assert decoder.wire_for(make_code("grouped-rs", 8, 3)) == "model"  # amplification 1
    assert make_decoder(FedAvg(), wire="float64").wire_for(make_code("frc", 4, 1)) == "float64"


def _amplification_over(code, sets):
    """The definition of ``error_amplification`` over the given decodable sets (numpy)."""
    row_l1 = np.abs(code.B).sum(axis=1)
    return max(float(np.sum(np.abs(code.chunk_decoder(code.decoding(r))).sum(axis=0) * row_l1))
               / code.k for r in sets)


def test_error_amplification_is_the_worst_decodable_set_and_reproducible():
    import itertools

    crc = make_code("crc", 6, 2)  # 15 four-reply sets: the 24 samples find the worst one
    every = [list(range(6))] + [list(c) for c in itertools.combinations(range(6), 4)]
    assert error_amplification(crc, seed=0) == pytest.approx(_amplification_over(crc, every))
    wide = make_code("crc", 12, 4)  # 495 eight-reply sets: the seed decides the sample
    assert error_amplification(wide, seed=0) == error_amplification(wide, seed=0)


def test_error_amplification_draws_the_number_of_samples_it_is_given():
    import itertools

    code = make_code("crc", 12, 4)
    bursts = [[i for i in range(12) if (i - start) % 12 >= 4] for start in range(12)]
    assert error_amplification(code, seed=0, samples=0) == pytest.approx(
        _amplification_over(code, [list(range(12)), *bursts]))
    every = [list(c) for c in itertools.combinations(range(8), 5)]
    small = make_code("crc", 8, 3)
    assert error_amplification(small, seed=0, samples=200) == pytest.approx(
        _amplification_over(small, [list(range(8)), *every]))


def test_auto_wire_samples_the_amplification_with_the_decoders_seed(monkeypatch):
    import fl_gradcode.flower.decoder as decoder_module

    seeds = []

    def spy(code, seed=0, samples=24):
        seeds.append(seed)
        return 100.0

    monkeypatch.setattr(decoder_module, "error_amplification", spy)
    crc = make_code("crc", 8, 3)
    assert crc.rounding_amplification is None or crc.rounding_amplification > 8
    assert make_decoder(FedAvg(), seed=7).wire_for(crc) == "float64"
    assert seeds == [7]


def test_a_sampled_amplification_can_miss_a_worse_set_as_the_wire_option_says():
    """WireOptions: only grouped-rs has a bound over every straggler set; a code's sampled
    amplification can miss a worse set. comm-efficient at a cohort of 14, s = 5: its sample
    is <= 8 (so wire='auto' sends float32 for a float32 model) while some decodable set
    amplifies more than 8 (computed here over every set, from D and B with numpy)."""
    import itertools

    from fl_gradcode.flower.decoder import AMPLIFICATION_LIMIT
    from fl_gradcode.flower.membership import code_for_cohort

    code, _ = code_for_cohort("comm-efficient", 14, 5, 0, {})
    assert code.rounding_amplification is None
    assert error_amplification(code, seed=0) <= AMPLIFICATION_LIMIT
    weighted = np.abs(code.B * code.weights).sum(axis=1)
    worst = 0.0
    for received in itertools.combinations(range(code.n), code.n - code.s):
        decoding = code.decoding(received)
        assert decoding.exact
        D = code.chunk_decoder(decoding)
        worst = max(worst, float(np.abs(D).sum(axis=0) @ weighted) / code.k)
    assert worst > AMPLIFICATION_LIMIT
