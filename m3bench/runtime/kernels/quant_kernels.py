"""Which generation of the quantized-weight (MXFP8 / NVFP4) decode kernels runs when a call names no tiles.

    linear_generation(rows)        # the MXFP8 linear kernel for `rows` activation rows
    moe_generation(nvfp4)          # the quantized fused MoE's kernels
    default_quant_kernels()        # AUTO unless M3BENCH_QUANT_KERNELS=v1 / v2 pins one (read once a process)

V1 (kernels/mxfp8_triton.py; moe_triton.py with scales) and V2 (kernels/mx_tiles_triton.py, moe_quant_triton.py:
whole tiles dequantized, one dot a K step, split-K meeting in the kernel; at one row the GEMV) both passed
their checks on the H200 (tests/runtime/test_mxfp8_gpu.py, 2026-12-02). AUTO runs the faster of the two as
`benchmarks/mxfp8_speed.py` timed them there (docs/performance.md section 9): the V2 GEMV at one row (every
linear faster than V1, and than bf16), V1 from 2 to LINEAR_V2_FROM_ROWS - 1 = 64 rows (faster at 4 and 16 rows
in 5 of 6 linears; at 64 rows on its own tiles, mxfp8.ROWS64, faster in 5 of 6 on the H100 of 2026-12-07,
section 9h), V2 from there (prefill: BLOCK_M 128); the MoE on V1 for MXFP8 (faster at every batch) and V2 for
NVFP4 (~7x faster than V1's per-code decode).
A call that passes `tiles` picks its kernel itself.
"""

from __future__ import annotations

import functools
import os
from enum import Enum

from m3bench.runtime.errors import InputError

ENV_VAR = "M3BENCH_QUANT_KERNELS"
# V1 to 64 rows: at 64 the first kernel on mxfp8.ROWS64's tiles against the V2 dot (H100, 2026-12-07,
# benchmarks/mxfp8_speed_sweep.py dot-tiles): best tiles 18.5 / 11.3 / 28.3 / 16.0 / 14.7 / 6.2 us against the dot's
# rule 26.0 / 15.3 / 28.4 / 17.5 / 18.8 / 9.6 (qkv + index, o_proj, dense gate|up, dense down, shared gate|up, down);
# the H200 of 2026-12-02 had found the dot faster at 64 rows than V1's tiles of then (16 rows' split rule)
LINEAR_V2_FROM_ROWS = 65


class QuantKernels(Enum):
    AUTO = "auto"  # the measured choice per call (the module docstring)
    V1 = "v1"
    V2 = "v2"


@functools.cache  # read once: it is asked on every quantized linear / MoE call (a hot path)
def default_quant_kernels() -> QuantKernels:
    raw = os.environ.get(ENV_VAR, QuantKernels.AUTO.value)
    try:
        return QuantKernels(raw)
    except ValueError:
        raise InputError(f"{ENV_VAR}={raw!r}: expected one of {[k.value for k in QuantKernels]}") from None


def linear_generation(rows: int) -> QuantKernels:
    """V1 or V2 for an MXFP8 linear over `rows` activation rows (V2 at one row is its GEMV: mx_linear.GEMV_MAX_ROWS)."""
    pinned = default_quant_kernels()
    if pinned is not QuantKernels.AUTO:
        return pinned
    return QuantKernels.V2 if rows == 1 or rows >= LINEAR_V2_FROM_ROWS else QuantKernels.V1


def moe_generation(nvfp4: bool) -> QuantKernels:
    """V1 or V2 for the quantized fused MoE (MXFP8: V1; NVFP4: V2)."""
    pinned = default_quant_kernels()
    if pinned is not QuantKernels.AUTO:
        return pinned
    return QuantKernels.V2 if nvfp4 else QuantKernels.V1
