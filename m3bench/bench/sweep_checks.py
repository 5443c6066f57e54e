"""Checks a sweep makes before measuring anything: lengths against the context, the target reachable.

    check_lengths(cfg, max_model_len)               # every (ISL, OSL) at its longest fits, else InputError
    check_output_lengths(cfg)                       # every output has >= 2 tokens (TPOT is defined)
    max_len = probe_server(base_url, api_key)       # GET /v1/models: InputError when unreachable or refused
"""

from __future__ import annotations

from typing import Any

from m3bench.bench.workload import DatasetKind
from m3bench.numbers import is_int
from m3bench.runtime.errors import InputError

PROBE_TIMEOUT_S = 10.0


def check_lengths(cfg: Any, max_model_len: int | None) -> None:
    """Every point's longest prompt plus longest output fits `max_model_len` (None: not known, not checked).

    A trace replay takes its lengths from the trace and skips (and counts) what does not fit instead."""
    if max_model_len is None or getattr(cfg, "trace", None) is not None:
        return
    for isl, osl in cfg.lengths:
        longest_in = cfg.length_range.bounds(isl)[1] if cfg.dataset is DatasetKind.RANDOM else 0
        longest_out = cfg.length_range.bounds(osl)[1]
        if longest_in + longest_out > max_model_len:
            raise InputError(f"--isl {isl} / --osl {osl} (up to {longest_in} + {longest_out} tokens with the length "
                             f"range) exceed the model's context of {max_model_len} tokens")


def check_output_lengths(cfg: Any) -> None:
    """Every request of a point asks for >= 2 output tokens: TPOT (E2EL - TTFT) / (n - 1) needs two."""
    if getattr(cfg, "trace", None) is not None:  # the trace's own output lengths
        return
    for _, osl in cfg.lengths:
        shortest = cfg.length_range.bounds(osl)[0]
        if shortest < 2:
            raise InputError(f"--osl {osl} draws outputs of {shortest} token(s): TPOT needs at least 2 output tokens")


def probe_server(base_url: str, api_key: str | None, timeout_s: float = PROBE_TIMEOUT_S) -> int | None:
    """The server's max_model_len from /v1/models (None when it does not say); InputError if it cannot be used."""
    import httpx

    root = base_url.rstrip("/").removesuffix("/v1")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        resp = httpx.get(f"{root}/v1/models", headers=headers, timeout=timeout_s)
    except (httpx.HTTPError, ValueError) as e:
        raise InputError(f"--base-url {base_url}: cannot reach the server ({type(e).__name__}: {e})") from None
    if resp.status_code in (401, 403):
        raise InputError(f"--base-url {base_url}: the server refused the API key (HTTP {resp.status_code})")
    if resp.status_code != 200:
        raise InputError(f"--base-url {base_url}: GET /v1/models answered HTTP {resp.status_code}")
    try:
        cards = resp.json().get("data") or [{}]
        value = cards[0].get("max_model_len")
    except (ValueError, AttributeError, TypeError, IndexError):
        return None
    return value if is_int(value) and value > 0 else None
