"""Which generation of the quantized-weight (MXFP8 / NVFP4) decode kernels runs when a call names no tiles.

    default_quant_kernels()        # QuantKernels.V1 unless M3BENCH_QUANT_KERNELS=v2 (read once a process)

V1 (kernels/mxfp8_triton.py; moe_triton.py with scales): checked and timed on the H200 (docs/performance.md
section 7). V2 (kernels/mx_tiles_triton.py, moe_quant_triton.py: whole tiles dequantized, one dot a K step,
split-K meeting in the kernel): checked on CPU under the Triton interpreter and compiled for sm90, not yet
run on a GPU (section 9). The default stays V1 until V2 has run there; a call that passes `tiles` picks
its kernel itself.
"""

from __future__ import annotations

import functools
import os
from enum import Enum

from m3bench.runtime.errors import InputError

ENV_VAR = "M3BENCH_QUANT_KERNELS"


class QuantKernels(Enum):
    V1 = "v1"
    V2 = "v2"


@functools.cache  # read once: it is asked on every quantized linear / MoE call (a hot path)
def default_quant_kernels() -> QuantKernels:
    raw = os.environ.get(ENV_VAR, QuantKernels.V1.value)
    try:
        return QuantKernels(raw)
    except ValueError:
        raise InputError(f"{ENV_VAR}={raw!r}: expected one of {[k.value for k in QuantKernels]}") from None
