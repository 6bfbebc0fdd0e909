"""The key grammar's float32 arithmetic (rounding and the shortest decimal that reads back),
done without NumPy so that reading a key does not load it, against NumPy's own: the float32 cast
and ``format_float_positional``'s Dragon4, which printed every key before."""

from __future__ import annotations

import random
import struct
import warnings

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from benanza.ops.grammar import FLT_MAX, f32, format_number


def _numpy_text(x: float) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NumPy warns of a cast past the range; both give infinity
        text = np.format_float_positional(np.float32(x), trim="-")
    return "0" if text == "-0" else text


def _from_bits(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def _float32s() -> list[float]:
    """Each binade's edges (where the interval of values that read back is lopsided), the
    subnormals' edge, the range's ends, and a seeded sample of all bit patterns."""
    out = [0.0, -0.0, 1e-5, 0.1, 1 / 3, FLT_MAX, -FLT_MAX, float("inf"), float("-inf"), float("nan")]
    for e in range(-149, 128):
        power = struct.unpack("<I", struct.pack("<f", 2.0**e))[0]
        out += [_from_bits(b) for b in range(power - 3, power + 4) if 0 < b < 0x7F800000]
    rng = random.Random(28)
    out += [_from_bits(rng.randrange(1, 0x7F800000)) * rng.choice((1, -1)) for _ in range(8000)]
    # decimals as a model's attributes are written: few digits, any scale
    out += [rng.randrange(1, 10**rng.randrange(1, 8)) * 10.0**rng.randrange(-40, 30) for _ in range(2000)]
    return out


def test_the_shortest_decimal_is_the_one_numpy_prints():
    wrong = [(x, _numpy_text(x), format_number(x)) for x in _float32s() if format_number(x) != _numpy_text(x)]
    assert wrong == []


@given(st.floats(allow_nan=False))
def test_rounding_to_float32_is_numpys_cast(x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert f32(x) == float(np.float32(x))
    assert format_number(x) == _numpy_text(x)


def test_integers_print_as_integers():
    assert [format_number(v) for v in (3, np.int64(-7), True, np.uint8(255))] == ["3", "-7", "1", "255"]
    assert FLT_MAX == float(np.finfo(np.float32).max)
