"""Decode GEMMs over plain weights for a few rows (kernels/skinny_triton.py): tile choice and launch.

    y = skinny_linear(x [M, K], weight [N, K], bias | None, tiles=skinny_tiles(M, N, K, weight.dtype))
    y = skinny_linear(x, weight, add=r)             # + r [M, N] in the epilogue (the shared expert's down + routed)
    h = skinny_linear(x, gate_up [2I, K], gate=Gate(MoeActivation.SILU, alpha, limit))   # act(gate, up): [M, I]

For M <= SKINNY_MAX_ROWS (decode up to batch 16, a speculative verify of 1 + 3 tokens up to batch 4; fp32, the
router, to 4 rows) on CUDA in bf16 / fp16 / fp32. K is split as far as one wave of resident programs allows and the splits meet
in the kernel (the same per-tile counters as kernels/mx_linear.py, one stream at a time), so a call is
one launch. layers/linear.py runs it where `skinny_supported` says so and the layer's `skinny_rows` allows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from m3bench.runtime.kernels.backend import interpreting, next_pow2, pdl_args, sm_count
from m3bench.runtime.kernels.moe import ACT_CODE
from m3bench.runtime.kernels.mx_linear import SMS, MxKernel, MxTiles, block_k_for, check_split, split_counters
from m3bench.runtime.kernels.reference import MoeActivation

SKINNY_MAX_ROWS = 16  # the dot kernel pads the rows to 16 anyway
GEMV_MAX_ROWS = 4  # the fp32 GEMV (the router): its accumulator grows with the rows
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# Programs in flight per SM the split aims at, and the K steps a dot split keeps. Sweeps at one TP8 rank's shapes
# (benchmarks/skinny_gemm.py --sweep) at 1 row: H200 2026-12-02: qkv + index 1920 x 6144 10.0 us with 4 splits,
# 10.3 with 6; o_proj 6144 x 1024 6.1 with 1 split, 7.5 with 2; shared gate|up 768 x 6144 7.0 with 8, 7.7 with 16;
# dense gate|up 3072 x 6144 13.6 with 4, more with 2. H100 2026-12-06: qkv + index 11.7 with 4 against 12.5 with 6;
# shared gate|up + act (384 columns of 32) 7.8 with 8 against 9.7 with 4 (48 programs leave a third of the SMs idle).
# So: splits of LONG_SPLIT_STEPS where they still fill FILL_PER_SM programs an SM, else as many as fit.
PER_SM = {MxKernel.DOT: 1.5, MxKernel.GEMV: 4}
MIN_SPLIT_STEPS = 6  # BLOCK_K steps a dot split keeps at least (a pipeline of 4 stages needs a few)
LONG_SPLIT_STEPS = 12  # ... and keeps where the grid still fills FILL_PER_SM (shorter splits pay ramp + finish again)
FILL_PER_SM = 0.7
WHOLE_K_FROM = 0.7  # output tiles per SM from which the dot kernel does not split K


@dataclass(frozen=True)
class Gate:
    """The gated activation a fused gate|up GEMM ends with (kernels/moe_triton.gated_activation)."""

    activation: MoeActivation
    alpha: float
    limit: float


def skinny_tiles(m: int, n: int, k: int, dtype: torch.dtype = torch.bfloat16, kernel: MxKernel | None = None,
                 sms: int = SMS, gated: bool = False) -> MxTiles:
    """Tiles for n output columns (a gated call: I, `gated`). Dot (bf16 / fp16): BLOCK_N 64 (gated 32: two row
    sets a program), BLOCK_K 128 (64 below 512 inputs, 6 stages), rows padded to 16, 4 stages. GEMV (fp32 weights, or asked for): BLOCK_N 16, BLOCK_K 1024
    (fp32: 512; or the largest power of two dividing K), 8 warps. K split by `skinny_split`."""
    kernel = kernel or (MxKernel.GEMV if dtype == torch.float32 and not gated else MxKernel.DOT)
    if kernel is MxKernel.GEMV:
        bk = block_k_for(k, 1024 if dtype != torch.float32 else 512)
        return MxTiles(kernel, next_pow2(max(1, m)), 16, bk, skinny_split(math.ceil(n / 16), k, bk, kernel, sms),
                           8, 1)
    bk, bn = block_k_for(k, 128 if k >= 512 else 64), 32 if gated else 64
    return MxTiles(kernel, 16, bn, bk, skinny_split(math.ceil(n / bn), k, bk, kernel, sms), 4,
                       4 if bk >= 128 else 6)


def skinny_split(tiles: int, k: int, block_k: int, kernel: MxKernel, sms: int = SMS) -> int:
    """The largest divisor of K / BLOCK_K that keeps the grid within PER_SM programs an SM and (dot) each split
    at MIN_SPLIT_STEPS steps or more; the dot kernel does not split from WHOLE_K_FROM tiles an SM, and keeps
    LONG_SPLIT_STEPS steps a split where the grid still has FILL_PER_SM programs an SM."""
    if kernel is MxKernel.DOT and tiles >= WHOLE_K_FROM * sms:
        return 1
    steps, least = k // block_k, (MIN_SPLIT_STEPS * block_k if kernel is MxKernel.DOT else block_k)
    fits = [d for d in range(1, steps + 1)
            if steps % d == 0 and tiles * d <= PER_SM[kernel] * sms and k // d >= least]
    long = [d for d in fits
            if kernel is MxKernel.DOT and steps // d >= LONG_SPLIT_STEPS and tiles * d >= FILL_PER_SM * sms]
    return (long or fits or [1])[-1]


def skinny_supported(x: torch.Tensor, weight: torch.Tensor, max_rows: int = SKINNY_MAX_ROWS) -> bool:
    """x [..., K] with at most max_rows rows against a plain weight [N, K] of a shape and dtype this kernel
    runs (the caller checks the device: CUDA, or the CPU interpreter when called directly)."""
    rows = x.numel() // max(1, x.shape[-1])
    return (0 < rows <= min(max_rows, GEMV_MAX_ROWS if x.dtype == torch.float32 else SKINNY_MAX_ROWS)
            and x.dtype == weight.dtype
            and x.dtype in DTYPES and weight.dim() == 2 and weight.stride(-1) == 1 and x.shape[-1] % 32 == 0)


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  tiles: MxTiles | None = None, add: torch.Tensor | None = None,
                  gate: Gate | None = None) -> torch.Tensor:
    """x [..., K] @ weight^T (+ bias, + add [..., N]) -> [..., N] in x's dtype; gate: weight is a fused gate|up
    [2I, K] and the result act(gate, up) [..., I] (the dot kernel; no bias or add)."""
    from m3bench.runtime.kernels import mx_tiles_triton
    from m3bench.runtime.kernels import skinny_triton as kt

    lead, k = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m, n = x2.shape[0], weight.shape[0] // (2 if gate else 1)
    t = tiles or skinny_tiles(m, n, k, weight.dtype, sms=sm_count(x.device.index or 0) if x.is_cuda else SMS,
                              gated=gate is not None)
    _check(t, m, k, n, gate, bias, add)
    grid = t.grid(m, n)
    y = x2.new_empty((m, n))
    planes = 2 if gate else 1
    parts = x2.new_empty((t.split_k, planes, m, n) if t.split_k > 1 else (1,), dtype=torch.float32)
    extra, s_bm = _addend(bias, add, m, n, y)
    head, tail = (x2, weight), (extra, y, parts, split_counters(x2.device), m, x2.stride(0), weight.stride(0))
    even = n % t.block_n == 0 and k % t.block_k == 0
    meta = dict(N=n, K=k, K_SPLIT=k // t.split_k, SPLIT=t.split_k, BLOCK_M=t.block_m, BLOCK_N=t.block_n,
                BLOCK_K=t.block_k, HAS_BIAS=bias is not None or add is not None, EVEN=even, num_warps=t.num_warps,
                num_stages=t.num_stages, **pdl_args(x2))
    if t.kernel is MxKernel.GEMV:  # the MXFP8 GEMV unscaled (its scale pointer and stride unused), row-major
        mx_tiles_triton.mx_gemv_kernel[grid](*head, weight, *tail, 32, 0, y.stride(0), s_bm, **meta,
                                             SCALED=False)
    else:
        act = gate or Gate(MoeActivation.SILU, 1.0, 0.0)
        kt.skinny_dot_kernel[grid](*head, *tail, y.stride(0), s_bm, float(act.alpha), float(act.limit), **meta,
                                   F32=x2.dtype == torch.float32 or interpreting(), GATED=gate is not None,
                                   ACT=ACT_CODE[act.activation])
    return y.reshape(*lead, n)


def _check(t: MxTiles, m: int, k: int, n: int, gate: Gate | None, bias, add) -> None:
    if m > t.block_m:
        raise ValueError(f"skinny tiles take at most block_m {t.block_m} rows, got {m}")
    check_split(t, m, n, k)
    if gate is not None and (t.kernel is not MxKernel.DOT or bias is not None or add is not None):
        raise ValueError("a gated skinny GEMM runs the dot kernel, without bias or add")
    if bias is not None and add is not None:
        raise ValueError("skinny_linear takes a bias or an add, not both")


def _addend(bias, add, m: int, n: int, y: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(the tensor the epilogue adds, its row stride): a bias [N] (0), an add [..., N] ([M, N] rows), or none (y)."""
    if bias is not None:
        return bias, 0
    if add is None:
        return y, 0
    add2 = add.reshape(m, n)
    if add2.stride(-1) != 1:
        add2 = add2.contiguous()
    return add2, add2.stride(0)
