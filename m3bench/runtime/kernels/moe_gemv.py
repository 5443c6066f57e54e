"""The routed experts at one token as GEMVs (kernels/moe_gemv_triton.py): plain or MXFP8 experts (row- or block-major),
no alignment launch, the down GEMM's K chunks left as fp32 planes for the sum (kernels/moe_sum.MoeSum).

    y = moe_gemv(x [1, H], w_gate, w_up, w_down, ids [TOPK], weights [TOPK], activation, alpha, limit, tiles, scales)

At one token the first-generation kernels run BLOCK_M 16 rows for one (15 padding) and 32-wide sub-dots, whose
MXFP8 down GEMM took 21.5 us at one local pick and at two alike (H100, 2026-12-06: 30% of its bytes' floor, a
latency per program, not the bytes). The MXFP8 linear GEMV (kernels/mx_linear.py) reads a matrix of that size in
about half that (docs/performance.md 9f). Tiles: `gemv_tiles` (MoeTiles with gemv=True).
"""

from __future__ import annotations

import math

import torch

from m3bench.runtime.kernels.backend import pdl_args
from m3bench.runtime.kernels.moe_args import check_weights, down_chunks, scale_args
from m3bench.runtime.kernels.moe_quant import ACT_CODES
from m3bench.runtime.kernels.moe_scales import MoeScales
from m3bench.runtime.kernels.mx_linear import GEMV_BLOCK_K, SMS, block_k_for, block_stride, check_counters
from m3bench.runtime.kernels.mx_linear import split_counters, split_for
from m3bench.runtime.kernels.reference import MoeActivation

GEMV_BLOCK_N = 16
GEMV_WARPS = 8
# resident programs an SM holds (256 threads; registers a thread of the Triton 3.6 sm90 build, no spills): gate|up
# 63 (MXFP8) / 73 (plain) -> 3; down 48 / 63 -> 4
GATE_UP_PER_SM = 3
DOWN_PER_SM = 4


def gemv_split(rows: int, inputs: int, block_n: int, block_k: int, per_sm: int, sms: int = SMS) -> int:
    """K pieces of one expert's GEMV over `rows` x `inputs` so that one local pick's tiles fit one wave of `per_sm`
    resident programs an SM, each piece at least two K steps (mx_linear.split_for's rule)."""
    return split_for(math.ceil(rows / block_n), inputs, block_k, per_sm * sms, 2)


def check_gemv(x: torch.Tensor, w_gate: torch.Tensor, scales: MoeScales | None) -> None:
    """The GEMV path runs one token of plain or MXFP8 experts."""
    if x.shape[0] != 1:
        raise ValueError(f"the one-token MoE GEMV takes one token, got {x.shape[0]}")
    if scales is not None and (scales.nvfp4 or w_gate.dtype != torch.float8_e4m3fn):
        raise ValueError("the one-token MoE GEMV runs plain or MXFP8 experts, not NVFP4")
    if x.stride(-1) != 1:
        raise ValueError("x must be contiguous along its last dim")


def moe_gemv(x, w_gate, w_up, w_down, ids, weights, activation: MoeActivation, alpha: float, limit: float, tiles,
             scales: MoeScales | None) -> torch.Tensor:
    """The down GEMM's fp32 planes [chunks, TOPK, H] of the token's picks (rows of other ranks' picks unwritten)."""
    check_gemv(x, w_gate, scales)
    check_weights(w_gate, w_up, w_down)
    inter = _gate_up(x, w_gate, w_up, ids, activation, alpha, limit, tiles, scales)
    return _down(inter, w_down, ids, weights, tiles, scales, x.shape[1])


def _gate_up(x, wg, wu, ids, activation, alpha, limit, tiles, scales) -> torch.Tensor:
    from m3bench.runtime.kernels.moe_gemv_triton import moe_gemv_gate_up_kernel

    top_k, n_exp, n_inter, hidden = ids.numel(), wg.shape[0], wg.shape[1], x.shape[1]
    split, bk = tiles.split_k, tiles.block_k
    if hidden % (split * bk):
        raise ValueError(f"split_k {split} x block_k {bk} does not divide the hidden size {hidden}")
    n_tiles = top_k * math.ceil(n_inter / tiles.block_n)
    check_counters(n_tiles, split)
    inter = x.new_empty((top_k, n_inter), dtype=torch.float32)
    part = x.new_empty((split, top_k, 2, n_inter) if split > 1 else (1,), dtype=torch.float32)
    (sg, sge, sgn), (su, sue, sun) = scale_args(scales and scales.gate, wg), scale_args(scales and scales.up, wu)
    moe_gemv_gate_up_kernel[(n_tiles, split)](
        x, wg, wu, sg, su, ids, inter, part, split_counters(x.device), alpha, limit,
        wg.stride(0), wg.stride(1), block_stride(wg, 3), wu.stride(0), wu.stride(1), block_stride(wu, 3),
        sge, sgn, sue, sun, inter.stride(0),
        E=n_exp, H=hidden, I=n_inter, TOPK=top_k, BLOCK_N=tiles.block_n, BLOCK_K=bk, SPLIT=split,
        ACT=ACT_CODES[activation], SCALED=scales is not None,
        EVEN=n_inter % tiles.block_n == 0 and hidden % bk == 0,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages, **pdl_args(x),
    )
    return inter


def _down(inter, wd, ids, weights, tiles, scales, hidden) -> torch.Tensor:
    from m3bench.runtime.kernels.moe_gemv_triton import moe_gemv_down_kernel

    top_k, n_exp, n_inter = ids.numel(), wd.shape[0], inter.shape[1]
    bn, bk = tiles.n_down, tiles.block_k
    chunks, k_chunk = down_chunks(n_inter, tiles.split_down, bk)
    k_chunk = k_chunk or math.ceil(n_inter / bk) * bk  # one chunk: all of I in whole K steps
    y = inter.new_empty((chunks, top_k, hidden), dtype=torch.float32)
    sd, sde, sdn = scale_args(scales and scales.down, wd)
    moe_gemv_down_kernel[(top_k * math.ceil(hidden / bn), chunks)](
        inter, wd, sd, ids, weights, y, inter.stride(0), wd.stride(0), wd.stride(1), block_stride(wd, 3),
        sde, sdn, y.stride(0), y.stride(1),
        E=n_exp, I=n_inter, H=hidden, BLOCK_N=bn, BLOCK_K=bk, K_CHUNK=k_chunk, SCALED=scales is not None,
        EVEN=hidden % bn == 0 and n_inter % k_chunk == 0,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages, **pdl_args(inter),
    )
    return y


def gemv_block_k(hidden: int, inter: int) -> int:
    """BLOCK_K of both GEMVs: the linear GEMV's (mx_linear.GEMV_BLOCK_K), or the largest power of two dividing both."""
    return min(block_k_for(hidden, GEMV_BLOCK_K), block_k_for(inter, GEMV_BLOCK_K))
