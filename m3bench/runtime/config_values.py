"""Typed readers of config.json values: a value of the wrong JSON type is a ConfigError, never coerced.

    n = read_int(raw, "num_hidden_layers")                 # 60; "60", 60.0, 4.5, true -> ConfigError
    theta = read_float(raw, "rope_theta", default=1e4)     # an int is a fine float
    on = read_bool(raw, "use_qk_norm", default=True)       # true / false (or 0 / 1)
    flags = per_layer_values(value, "key", n_layers, layers)   # a scalar or a per-layer list, read at `layers`

Integer fields have sanity bounds (`INT_BOUNDS`): a config asking for 10^12 vocabulary rows is refused
here, before anything is allocated.
"""

from __future__ import annotations

from typing import Any

from m3bench.runtime.errors import ConfigError

REQUIRED = object()

# Upper bounds far above any published model, low enough that a typo cannot allocate terabytes.
INT_BOUNDS = {
    "vocab_size": 1 << 24, "hidden_size": 1 << 17, "num_hidden_layers": 1024, "num_attention_heads": 4096,
    "num_key_value_heads": 4096, "head_dim": 4096, "intermediate_size": 1 << 20,
    "dense_intermediate_size": 1 << 20, "shared_intermediate_size": 1 << 20, "num_local_experts": 1 << 16,
    "num_experts": 1 << 16, "num_experts_per_tok": 1 << 16, "n_shared_experts": 64,
    "max_position_embeddings": 1 << 31, "rotary_dim": 4096,
}
DEFAULT_INT_BOUND = 1 << 31


def _kind(v: Any) -> str:
    return {bool: "a boolean", str: "a string", float: "a float", list: "a list", dict: "an object"}.get(
        type(v), type(v).__name__)


def _lookup(raw: dict, key: str, alts: tuple[str, ...], default: Any) -> tuple[str, Any]:
    for k in (key, *alts):
        if raw.get(k) is not None:
            return k, raw[k]
    if default is REQUIRED:
        raise ConfigError(f"config.json lacks required field {key!r}")
    return key, default


def check_int(key: str, v: Any, lo: int = 0) -> int:
    """v must be a JSON integer (not a bool, float or string) in [lo, bound of key]."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(f"config.json: {key} must be an integer, got {v!r} ({_kind(v)})")
    hi = INT_BOUNDS.get(key, DEFAULT_INT_BOUND)
    if not lo <= v <= hi:
        raise ConfigError(f"config.json: {key}={v} is outside [{lo}, {hi}]")
    return v


def read_int(raw: dict, key: str, *alts: str, default: Any = REQUIRED, lo: int = 0) -> int:
    k, v = _lookup(raw, key, alts, default)
    return check_int(k, v, lo)


def read_float(raw: dict, key: str, *alts: str, default: Any = REQUIRED) -> float:
    k, v = _lookup(raw, key, alts, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ConfigError(f"config.json: {k} must be a number, got {v!r} ({_kind(v)})")
    if v != v or v in (float("inf"), float("-inf")):
        raise ConfigError(f"config.json: {k} must be finite, got {v!r}")
    return float(v)


def check_bool(key: str, v: Any) -> bool:
    if isinstance(v, bool) or (isinstance(v, int) and v in (0, 1)):
        return bool(v)
    raise ConfigError(f"config.json: {key} must be true or false, got {v!r} ({_kind(v)})")


def read_bool(raw: dict, key: str, default: Any = REQUIRED) -> bool:
    k, v = _lookup(raw, key, (), default)
    return check_bool(k, v)


def read_str(raw: dict, key: str, default: Any = REQUIRED) -> str:
    k, v = _lookup(raw, key, (), default)
    if not isinstance(v, str):
        raise ConfigError(f"config.json: {k} must be a string, got {v!r} ({_kind(v)})")
    return v


def read_token_ids(raw: dict, key: str) -> tuple[int, ...]:
    """A token id or a list of them (absent: ())."""
    v = raw.get(key)
    if v is None:
        return ()
    return tuple(check_int(key, x) for x in (v if isinstance(v, list) else [v]))


def read_optional_token_id(raw: dict, key: str) -> int | None:
    v = raw.get(key)
    return None if v is None else check_int(key, v)


def per_layer_values(value: Any, key: str, n_layers: int, layers: tuple[int, ...]) -> dict[int, Any]:
    """{layer: entry} for `layers` only. `value` is a scalar (every layer), a list of n_layers entries
    (indexed by layer; entries of other layers mean nothing and are not read) or a list with one entry
    per layer of `layers` (in order)."""
    if not isinstance(value, list):
        return {i: value for i in layers}
    if len(value) == n_layers:
        return {i: value[i] for i in layers}
    if len(value) == len(layers):
        return dict(zip(layers, value))
    raise ConfigError(f"config.json: {key} has {len(value)} entries; expected {n_layers} (one per layer) "
                      f"or {len(layers)} (one per layer it applies to)")
