"""Numbers read from files (reference YAML, traces, results JSON): a bool is not a number there.

    is_number(1.5), is_number(True)        # True, False
    is_finite_number(float("nan"))          # False
    is_int(3), is_int(3.0), is_int(True)    # True, False, False
"""

from __future__ import annotations

import math
from typing import Any


def is_number(value: Any) -> bool:
    """An int or a float, not a bool (YAML / JSON `true` parses to a bool, which Python counts as an int)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_int(value: Any) -> bool:
    """An int, not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_finite_number(value: Any) -> bool:
    """is_number and neither NaN nor infinite."""
    return is_number(value) and math.isfinite(value)
