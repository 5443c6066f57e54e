"""How NVFP4 experts' E2M1 codes sit in memory once loaded: the process's choice (no torch: the memory plan reads it).

    nv_codes()          # NvCodes.PACKED unless M3BENCH_NV_CODES=e4m3 (read on first use) or NV_CODES["codes"] is set

PACKED keeps two codes a byte, as stored, for the tile-dequantizing kernels; E4M3 holds each code as the e4m3 byte
of its value (exact; twice the bytes) for the first-generation kernels (layers/weight_format.set_nv_codes).
"""

from __future__ import annotations

import os
from enum import Enum

from m3bench.runtime.errors import InputError


class NvCodes(Enum):
    """How NVFP4 experts' E2M1 codes sit in memory once loaded (their e4m3 scales and fp32 globals stay)."""

    PACKED = "packed"  # uint8 [..., K/2], two codes a byte, as stored: the tile-dequantizing kernels (V2)
    E4M3 = "e4m3"  # float8_e4m3fn [..., K], each code as its value's e4m3 byte (exact): the first-generation kernels


# The process-wide choice: PACKED unless M3BENCH_NV_CODES=e4m3 (read on first use). H100, one TP8/EP8 rank, 60
# layers (docs/performance.md 9d): E4M3 steps 1.26 / 1.51 / 1.27x faster than PACKED at B1 / B16 / B64, still
# below bf16 at B1 and B64, for 1.9x the experts' memory (53.2 against 29.2 GiB of weights a rank): PACKED stays.
NV_CODES_ENV = "M3BENCH_NV_CODES"
NV_CODES: dict[str, NvCodes] = {}


def nv_codes() -> NvCodes:
    """The process's NvCodes (NV_CODES["codes"] once set; else the environment's, PACKED by default)."""
    if "codes" not in NV_CODES:
        raw = os.environ.get(NV_CODES_ENV, NvCodes.PACKED.value)
        try:
            NV_CODES["codes"] = NvCodes(raw)
        except ValueError:
            raise InputError(f"{NV_CODES_ENV}={raw!r}: expected one of {[c.value for c in NvCodes]}") from None
    return NV_CODES["codes"]
