"""How much of its weights a decode GEMM prefetches into L2 before its PDL wait (kernels/pdl_triton.prefetch_weights).

    PREFETCH=prefetch_inputs(x, weight, k_split, block_k)                        # row-major weights [N, K]
    PREFETCH=prefetch_inputs(x, weight, k_split, block_k, block_major=True)      # quant.block_major weights

Under PDL (kernels/backend.Pdl) a kernel's programs become resident while the kernel before them still runs. A
decode step's GEMMs mostly follow latency-bound kernels (an add + norm, the split-KV combine) that leave HBM idle,
so each program may ask for its weights before it waits: a bulk L2 prefetch returns no data, so nothing is read
early. The process-wide choice (M3BENCH_WEIGHT_PREFETCH, or PREFETCH["mode"] in place):

    OFF    nothing before the wait (the default until timed on a GPU)
    HEAD   each program's first two BLOCK_K steps of its split: the pipeline's first loads find L2
    WHOLE  each program's whole split (block-major: the largest power of two of its blocks)

Only kernels launched with PDL prefetch (without it they start after the kernel before them has finished), and
only where the bulk prefetch's alignment holds (16-byte starts and lengths); elsewhere PREFETCH is 0 and the
kernel compiles exactly as before.
"""

from __future__ import annotations

import os
from enum import Enum

import torch

from m3bench.runtime.errors import InputError
from m3bench.runtime.kernels.backend import pdl_launch


class WeightPrefetch(Enum):
    OFF = "off"
    HEAD = "head"
    WHOLE = "whole"


HEAD_STEPS = 2  # BLOCK_K steps a HEAD prefetch asks for
ALIGN_BYTES = 16  # cp.async.bulk.prefetch: 16-byte aligned starts, lengths a multiple of 16
PREFETCH_ENV = "M3BENCH_WEIGHT_PREFETCH"


def prefetch_from_env() -> WeightPrefetch:
    """PREFETCH_ENV's mode, OFF when unset; a bad value is an InputError naming the choices."""
    raw = os.environ.get(PREFETCH_ENV, WeightPrefetch.OFF.value)
    try:
        return WeightPrefetch(raw)
    except ValueError:
        raise InputError(f"{PREFETCH_ENV}={raw!r}: expected one of {[p.value for p in WeightPrefetch]}") from None


PREFETCH = {"mode": prefetch_from_env()}  # the process-wide choice (benchmarks switch it in place)


def prefetch_inputs(x: torch.Tensor, weight: torch.Tensor, k_split: int, block_k: int, block_major: bool = False,
                    width: int = 32, block_stride: int = 0) -> int:
    """The inputs of each weight row's split a program prefetches before its wait (the kernels' PREFETCH): 0 when
    off, when x's launch has no PDL, or when the alignment does not hold. block_major: weights in width-wide blocks
    `block_stride` elements apart (kernels/mx_linear.block_stride)."""
    mode = PREFETCH["mode"]
    if mode is WeightPrefetch.OFF or not pdl_launch(x):
        return 0
    want = k_split if mode is WeightPrefetch.WHOLE else min(k_split, HEAD_STEPS * block_k)
    elem = weight.element_size()
    if block_major:
        runs = 1 << ((want // width).bit_length() - 1) if want >= width else 0
        aligned = (block_stride * elem) % ALIGN_BYTES == 0 and (width * elem) % ALIGN_BYTES == 0
        want = runs * width
    else:
        aligned = ((weight.stride(0) * elem) % ALIGN_BYTES == 0 and (k_split * elem) % ALIGN_BYTES == 0
                   and (want * elem) % ALIGN_BYTES == 0)
    return want if want > 0 and aligned and weight.data_ptr() % ALIGN_BYTES == 0 else 0
