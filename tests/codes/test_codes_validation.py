"""Bad input gets a ValueError that names the value and the expectation."""

from __future__ import annotations

import re

import numpy as np
import pytest

from fl_gradcode.codes import GradientCode, available_codes, make_code


def test_registry_lists_the_named_codes():
    names = available_codes()
    for required in ("uncoded", "ignore-stragglers", "frc", "crc"):
        assert required in names
    assert len(set(names)) == len(names)


@pytest.mark.parametrize("name", available_codes())
def test_every_registered_code_builds_and_round_trips(name):
    code = make_code(name, n=12, s=2, seed=0)
    assert isinstance(code, GradientCode)
    assert code.B.shape == (code.n, code.k)
    rng = np.random.default_rng(0)
    updates = {j: rng.standard_normal(6) for j in range(code.k)}
    replies = {i: code.encode(i, updates) for i in range(code.n)}
    target = sum(code.weights[j] * updates[j] for j in range(code.k))
    np.testing.assert_allclose(code.decode(replies, approximate=True), target, atol=1e-9)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"name": "frc", "n": 12, "s": 12}, "s=12 must be < n=12"),
        ({"name": "crc", "n": 5, "s": -1}, "s=-1 must be >= 0"),
        ({"name": "crc", "n": -3, "s": 0}, "n=-3 must be >= 1"),
        ({"name": "frc", "n": 10, "s": 3}, r"\(s\+1\) \| n; got n=10, s=3"),
        ({"name": "nope", "n": 4, "s": 1}, "unknown code 'nope'"),
        ({"name": "crc", "n": 4.5, "s": 1}, "n=4.5 must be an integer"),
        ({"name": "frc", "n": 4, "s": 1, "bogus": 1}, "invalid option for code 'frc'"),
        ({"name": "comm-efficient", "n": 5, "s": 4, "m": 2}, r"s \+ m = 6 must be <= n=5"),
        ({"name": "comm-efficient", "n": 5, "s": 1, "m": 0}, "m=0 must be an integer >= 1"),
        ({"name": "bgc", "n": 5, "s": 1, "load": 9}, "load d=9"),
        ({"name": "expander", "n": 5, "s": 1, "load": 3}, "n\\*d even"),
        ({"name": "grouped-rs", "n": 5, "s": 1, "max_amplification": 0.5}, "max_amplification"),
    ],
)
def test_invalid_parameters_raise_value_error_naming_the_value(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_code(**kwargs)


def _uncoded(n):
    from fl_gradcode.codes.repetition import UncodedCode
    return UncodedCode(n)


def _ignore(n, s):
    from fl_gradcode.codes.repetition import IgnoreStragglers
    return IgnoreStragglers(n, s)


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: _uncoded(2.5), "n=2.5 must be an integer"),
        (lambda: _uncoded(True), "n=True must be an integer"),
        (lambda: _uncoded(-1), "n=-1 must be >= 1"),
        (lambda: _uncoded(0), "n=0 must be >= 1"),
        (lambda: _ignore(2.5, 1), "n=2.5 must be an integer"),
        (lambda: _ignore(4, 4), "s=4 must be < n=4"),
        (lambda: make_code("nested", 4, 1, s_max=9), "s_max=9 must be >= 0 and < n=4"),
    ],
)
def test_direct_constructors_and_s_max_name_the_bad_value(build, match):
    with pytest.raises(ValueError, match=match):
        build()


@pytest.mark.parametrize("bad", [[1.0, 2.0], [1, 2, 3, 0], [1, 2, np.nan, 4], [[1, 2, 3, 4]]])
def test_bad_weights_are_rejected(bad):
    with pytest.raises(ValueError, match="weights"):
        make_code("frc", n=4, s=1, weights=bad)


def test_client_index_out_of_range_is_rejected_everywhere():
    code = make_code("frc", n=4, s=1)
    with pytest.raises(ValueError, match="client index 4 is out of range"):
        code.assignment(4)
    with pytest.raises(ValueError, match="client index -1 is out of range"):
        code.is_decodable([0, -1])
    with pytest.raises(ValueError, match="client index 7"):
        code.decode({7: np.zeros(3)})
    with pytest.raises(ValueError, match="must be an integer"):
        code.encode("0", {0: np.zeros(2), 1: np.zeros(2)})
    with pytest.raises(ValueError, match="appears more than once"):
        code.decoding_vector([0, 0, 2])


def test_bad_updates_and_replies_are_rejected():
    code = make_code("frc", n=4, s=1)
    with pytest.raises(ValueError, match=r"lack \[1\]"):
        code.encode(0, {0: np.zeros(3)})
    with pytest.raises(ValueError, match="length 2; expected 3"):
        code.encode(0, {0: np.zeros(3), 1: np.zeros(2)})
    with pytest.raises(ValueError, match="1-D array"):
        code.encode(0, {0: np.zeros((3, 1)), 1: np.zeros((3, 1))})
    with pytest.raises(ValueError, match="NaN or Inf"):
        code.decode({0: np.array([1.0, np.nan]), 2: np.zeros(2)})
    with pytest.raises(ValueError, match="reply of client 2 has length 3; expected 2"):
        code.decode({0: np.zeros(2), 2: np.zeros(3)})
    with pytest.raises(ValueError, match="real numeric"):
        code.decode({0: np.array(["a", "b"]), 2: np.zeros(2)})
    with pytest.raises(ValueError, match="mapping"):
        code.decode([np.zeros(2)])


def test_encoding_matrix_is_read_only():
    code = make_code("crc", n=6, s=2)
    with pytest.raises(ValueError):
        code.B[0, 0] = 5.0
    with pytest.raises(ValueError):
        code.decoding(range(6)).coefficients[0] = 1.0


def test_decoding_error_checks_the_shape_of_a():
    code = make_code("frc", n=4, s=1)
    with pytest.raises(ValueError, match=r"a has shape \(3,\); expected \(2,\)"):
        code.decoding_error([0, 2], [1.0, 1.0, 1.0])


def test_same_seed_same_code_and_different_seed_different_code():
    for name in ("crc", "bgc", "expander", "comm-efficient"):
        a, b = make_code(name, n=12, s=2, seed=4), make_code(name, n=12, s=2, seed=4)
        np.testing.assert_array_equal(a.B, b.B)
    np.testing.assert_array_equal(
        make_code("comm-efficient", n=12, s=2, seed=4).gammas[0],
        make_code("comm-efficient", n=12, s=2, seed=4).gammas[0],
    )
    assert not np.array_equal(make_code("crc", n=12, s=2, seed=1).B, make_code("crc", n=12, s=2).B)


# ======== edges: exact values, bounds and messages ===============================================
@pytest.mark.parametrize("shape", [(0, 3), (3, 0), (0, 0), (4,)])
def test_an_empty_or_non_2d_matrix_is_refused_with_its_shape(shape):
    """Zero clients is refused by the shape check itself, not later by the ``s`` range."""
    with pytest.raises(ValueError, match=r"^B must be a non-empty 2-D array of shape \(n, k\); "
                       rf"got {re.escape(str(shape))}$"):
        GradientCode(np.zeros(shape), 0, is_exact=True)


@pytest.mark.parametrize("received", ["012", b"01", 3, None])
def test_a_received_set_that_is_not_an_iterable_of_indices_is_named(received):
    code = make_code("frc", n=4, s=1)
    with pytest.raises(ValueError, match=rf"^received={re.escape(repr(received))} must be an "
                       r"iterable of client indices$"):
        code.decoding_error(received)


@pytest.mark.parametrize("scale", [1.0, 1e-200, 1e-312, 1e-315])
def test_condition_number_of_a_rank_one_block_is_one_at_every_scale(scale):
    """``B_F`` of rank one (every client holds both partitions, equal entries) has exactly one
    nonzero singular value (numpy's rank), so its condition number restricted to the nonzero
    singular values is 1, also when the entries are subnormal and the cut underflows to 0."""
    B = np.full((3, 2), scale)
    assert np.linalg.matrix_rank(np.ones((3, 2))) == 1
    code = GradientCode(B, 1, is_exact=False)
    assert code.condition_number([0, 1, 2]) == 1.0
    assert code.condition_number([2, 0]) == 1.0


def test_replies_of_different_lengths_name_the_client_and_the_expected_length():
    code = make_code("frc", n=4, s=1)
    with pytest.raises(ValueError, match=r"^reply of client 2 has length 3; expected 2 like "
                                         r"the other replies$"):
        code.decode({0: np.ones(2), 2: np.ones(3)})


def test_decoding_no_replies_without_a_length_says_how_to_get_zeros():
    from fl_gradcode.codes import NotDecodableError

    code = make_code("frc", n=4, s=1)
    with pytest.raises(NotDecodableError,
                       match=r"^no replies to decode \(pass length= to get zeros\)$"):
        code.decode({}, approximate=True)


def test_the_codes_weights_are_read_only():
    code = make_code("frc", n=4, s=1, weights=[1.0, 2.0, 3.0, 4.0])
    assert not code.weights.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        code.weights[0] = 5.0
    assert not code.with_weights([4.0, 3.0, 2.0, 1.0]).weights.flags.writeable
