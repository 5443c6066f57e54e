"""Strict JSON for every record m3bench writes: no bare NaN / Infinity (strict parsers reject them).

    text = dumps_strict({"stderr": float("nan"), "n": 1})
    # {"stderr": null, "stderr_null_reason": "undefined for a single item (n=1): NaN", "n": 1}

A non-finite number becomes null, and the dict holding it gets `<key>_null_reason` saying why.
"""

from __future__ import annotations

import json
import math
from typing import Any

NULL_SUFFIX = "_null_reason"
KNOWN_REASONS = {"stderr": "undefined for a single item (n=1)"}


def _reason(key: str, value: float) -> str:
    what = "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    known = KNOWN_REASONS.get(key)
    return f"{known}: {what}" if known else f"not a finite number: {what}"


def _bad(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def finite_or_null(value: Any) -> Any:
    """A copy of `value` with every non-finite float replaced by None (and the reason beside it in dicts)."""
    if isinstance(value, dict):
        out: dict = {}
        for k, v in value.items():
            out[k] = finite_or_null(v)
            if _bad(v):
                out[f"{k}{NULL_SUFFIX}"] = _reason(str(k), v)
            elif isinstance(v, (list, tuple)) and any(_bad(x) for x in v):
                out[f"{k}{NULL_SUFFIX}"] = "holds non-finite numbers, written as null"
        return out
    if isinstance(value, (list, tuple)):
        return [finite_or_null(v) for v in value]
    return None if _bad(value) else value


def dumps_strict(value: Any, **kwargs: Any) -> str:
    """json.dumps that never writes NaN / Infinity (allow_nan=False after finite_or_null)."""
    default = kwargs.pop("default", None)
    if default is not None:  # numpy scalars and the like: convert first so their NaNs are seen too
        value = json.loads(json.dumps(value, default=default))
    return json.dumps(finite_or_null(value), allow_nan=False, **kwargs)
