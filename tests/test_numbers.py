"""Numbers read from files: a bool is not one, NaN / infinity are not finite ones."""

import math

from m3bench.numbers import is_finite_number, is_int, is_number


def test_bool_is_not_a_number_and_nan_is_not_finite():
    assert is_number(1) and is_number(1.5) and is_number(math.nan)
    assert not any(is_number(v) for v in (True, False, "1", None))
    assert is_finite_number(0) and is_finite_number(-2.5)
    assert not any(is_finite_number(v) for v in (math.nan, math.inf, -math.inf, True, "1"))


def test_int_is_not_a_bool_nor_a_float():
    assert is_int(0) and is_int(-3)
    assert not any(is_int(v) for v in (True, False, 3.0, "3", None))
