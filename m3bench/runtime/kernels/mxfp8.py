"""MXFP8 linear layer kernel entry point: Triton on CUDA, dequantize-then-matmul in torch elsewhere.

    y = mxfp8_linear(x [M, K], weight fp8 [N, K], scale uint8 E8M0 [N, K/32], bias [N] | None)

`w = fp8 * 2**(scale - 127)` per 32 consecutive inputs of a row (runtime/quant.py). The Triton kernels
read the fp8 bytes and the scales and dequantize in registers (one byte a weight crosses HBM): the first
kernel (`LinearTiles`, 32-wide sub-dots, mxfp8_triton.py) or the decode kernels of kernels/mx_linear.py
(`MxTiles`), whichever kernels/quant_kernels.py measured faster for the batch (or the `tiles` given). The torch path dequantizes to x's dtype first
and is the CPU reference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from m3bench.runtime import quant
from m3bench.runtime.kernels.backend import KernelBackend, interpreting, pdl_args, use_triton
from m3bench.runtime.kernels.mx_linear import (
    MAX_SPLIT,
    PER_SM,
    SMS,
    MxTiles,
    block_stride,
    check_counters,
    mx_linear,
    split_counters,
    split_for,
)
from m3bench.runtime.kernels.quant_kernels import QuantKernels, linear_generation

MIN_SPLIT_STEPS = 2  # 128-wide K steps a split keeps at least (o_proj, 8 steps: 4 splits ran fastest)
# BLOCK_M 64 (33-64 rows): (programs an SM in the wave, K steps a split at least, warps). H100 sweep at 64 rows
# (benchmarks/mxfp8_speed_sweep.py dot-tiles, 2026-12-07, block-major), best first-kernel tiles, us: qkv + index
# 32-wide x 8 splits 18.5, o_proj 1 split 11.3, dense gate|up 4 splits 28.3, dense down 1 16.0, shared gate|up 8
# 14.7, shared down 1 6.2 (4 warps), where the rule before (3 an SM, 2 steps a split, 8 warps, as at 16 / 32 rows)
# split them 16 / 4 / 8 / 4 / 16 / 1 ways: fewer, longer splits, as the partials grow with the rows
ROWS64 = (2, 6, 4)


@dataclass(frozen=True)
class LinearTiles:
    block_m: int
    block_n: int
    block_k: int = 128
    num_warps: int = 4
    num_stages: int = 4
    split_k: int = 1  # > 1: K in that many pieces, their fp32 partials summed in the kernel (skinny decode GEMMs)


def linear_tiles(m: int, n: int, k: int = 0, sms: int = SMS) -> LinearTiles:
    """Skinny M (decode): BLOCK_M the rows padded to 16 (32, 64), BLOCK_N 64 (32 where 64-wide tiles split
    MAX_SPLIT ways fill at most half a wave), then the largest split of K into whole 128-steps (mx_linear.split_for:
    <= MAX_SPLIT, at least MIN_SPLIT_STEPS a split) that keeps the grid within one wave of resident programs
    (mx_linear.PER_SM). H100 sweep on block-major weights (benchmarks/mxfp8_speed_sweep.py linear-v1-tiles,
    2026-12-06), 4 / 16 rows: qkv + index 1920 x 6144 11.4 /
    12.3 us with 12 splits against 13.4 / 14.8 with 16 (the rule before: doubling to two waves); o_proj 4 splits
    and dense gate|up 8 as before; shared gate|up 768 x 6144 BLOCK_N 32 x 16 splits 8.0 / 8.3 against 8.5 / 9.2.
    BLOCK_M 64 (33-64 rows) takes ROWS64's wave and split: each split's fp32 partials are 64 rows wide there."""
    block_m = 16 if m <= 16 else 32 if m <= 32 else 64
    per_sm, min_steps, warps = ROWS64 if block_m == 64 else (PER_SM.get(block_m, 2), MIN_SPLIT_STEPS, 4)
    m_tiles, wave = math.ceil(m / block_m), per_sm * sms
    block_n = 64 if 2 * m_tiles * math.ceil(n / 64) * MAX_SPLIT > wave else 32
    tiles = m_tiles * math.ceil(n / block_n)
    split = split_for(tiles, k, 128, wave, min_steps) if k % 128 == 0 else 1
    return LinearTiles(block_m, block_n, num_warps=warps, split_k=split)


def mxfp8_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None,
                 backend: KernelBackend = KernelBackend.AUTO,
                 tiles: LinearTiles | MxTiles | None = None) -> torch.Tensor:
    """x [..., K] @ dequant(weight, scale)^T (+ bias) -> [..., N] in x's dtype."""
    if not use_triton(backend, x):
        return F.linear(x, quant.dequant_mxfp8(weight, scale, x.dtype), bias)
    lead, k = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    n = weight.shape[0]
    if tiles is None and linear_generation(x2.shape[0]) is QuantKernels.V1:
        tiles = linear_tiles(x2.shape[0], n, k)
    if not isinstance(tiles, LinearTiles):
        y = mx_linear(x2, weight, scale, bias, tiles) if x2.shape[0] else x2.new_empty((0, n))
        return y.reshape(*lead, n)
    t = tiles  # a LinearTiles here: the first kernel
    if not x2.shape[0]:
        return x2.new_empty((*lead, n))
    y = x2.new_empty((x2.shape[0], n))
    _launch(x2, weight, scale, bias, y, t)
    return y.reshape(*lead, n)


def _launch(x, weight, scale, bias, y, t: LinearTiles) -> None:
    """y [M, N] = x @ dequant(weight)^T (+ bias), one launch: with K split, the splits meet in the kernel (fp32
    partials, the split counters of kernels/mx_linear.py)."""
    from m3bench.runtime.kernels.mxfp8_triton import mxfp8_linear_kernel

    if weight.stride(-1) != 1 or scale.stride(-1) != 1:
        raise ValueError("MXFP8 weight and scale must be contiguous along K")
    m, k = x.shape
    n = weight.shape[0]
    if t.split_k > 1 and k % (t.split_k * t.block_k):
        raise ValueError(f"split_k {t.split_k} x block_k {t.block_k} does not divide K {k}")
    tiles = math.ceil(m / t.block_m) * math.ceil(n / t.block_n)
    check_counters(tiles, t.split_k)
    parts = x.new_empty((t.split_k, m, n) if t.split_k > 1 else (1,), dtype=torch.float32)
    mxfp8_linear_kernel[(tiles, t.split_k)](
        x, weight, scale.view(torch.uint8), bias if bias is not None else y, y, parts, split_counters(x.device), m,
        x.stride(0), weight.stride(0), block_stride(weight, 2), scale.stride(0), y.stride(0),
        N=n, K=k, K_SPLIT=k // t.split_k, SPLIT=t.split_k, BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k,
        HAS_BIAS=bias is not None, F32=x.dtype == torch.float32 or interpreting(), num_warps=t.num_warps,
        num_stages=t.num_stages, **pdl_args(x),
    )
