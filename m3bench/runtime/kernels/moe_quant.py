"""Fused MoE over MXFP8 / NVFP4 experts with the tile-dequantizing kernels (kernels/moe_quant_triton.py).

    out = fused_moe_quant(x, w_gate, w_up, w_down, topk_ids, topk_weights, activation, alpha, limit, out,
                          scales, tiles=None)

moe.fused_moe runs this for quantized experts unless given the first kernels' `MoeTiles`. Tiles: BLOCK_N
64 (one wgmma row group of expert rows), BLOCK_M the pairs of an expert block (16 at decode), BLOCK_K 128;
at batch 1 gate|up splits K in two so the grid fills one wave (split pieces meet as in mx_linear: fp32
partials, the shared per-device counters, the last piece sums in order).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from m3bench.runtime.kernels.backend import interpreting, next_pow2, pdl_args
from m3bench.runtime.kernels.moe_align import moe_align
from m3bench.runtime.kernels.moe_scales import MoeScales
from m3bench.runtime.kernels.mx_linear import check_counters, split_counters
from m3bench.runtime.kernels.reference import MoeActivation

ACT_CODES = {MoeActivation.SWIGLUOAI: 0, MoeActivation.SILU: 1}


@dataclass(frozen=True)
class QuantMoeTiles:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3
    split_k: int = 1  # gate|up only: K pieces (the last piece of a tile sums them and applies the activation)


GATE_UP_WAVE = 3 * 132  # resident gate|up programs at BLOCK_M 16 (sm90: 122 registers, 45 KB shared)


def quant_moe_tiles(n_pairs: int, n_experts: int, inter: int, hidden: int) -> QuantMoeTiles:
    """BLOCK_M 16 / 32 / 64 by the mean pairs of an expert (decode: 16), BLOCK_N 64, BLOCK_K 128; gate|up K
    split (2 or 4) while the live blocks' grid stays within one wave (batch 1: 4 experts x 48 tiles x 2)."""
    per_expert = n_pairs / max(1, n_experts)
    block_m = 16 if per_expert <= 12 else 32 if per_expert <= 28 else 64
    grid = min(n_pairs, n_experts) * math.ceil(inter / 64)  # M-blocks at decode: one a hit expert
    split = 1
    while block_m == 16 and split < 4 and grid * split * 2 <= GATE_UP_WAVE and hidden % (split * 2 * 128) == 0:
        split *= 2
    return QuantMoeTiles(block_m, 64, 128, 4, 3, split)


def _scale(s: torch.Tensor) -> torch.Tensor:
    if s.stride(-1) != 1:
        raise ValueError("expert scales must be contiguous along their inputs")
    return s if s.dtype == torch.float8_e4m3fn else s.view(torch.uint8)


def _words(w: torch.Tensor, nvfp4: bool) -> tuple[torch.Tensor, int, int]:
    """(weights, expert stride, row stride) for the kernels: packed NVFP4 as int32 words (8 codes each)."""
    if nvfp4:
        if w.shape[-1] % 4 or w.stride(1) % 4 or w.stride(0) % 4 or w.storage_offset() % 4:
            raise ValueError("NVFP4 expert rows must be whole int32 words (16 inputs)")
        w = w.view(torch.int32)
    return w, w.stride(0), w.stride(1)


def _glob(g: torch.Tensor | None, w: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(per-row NVFP4 global scales [E, rows], expert stride); the weight as a dummy for MXFP8."""
    if g is None:
        return w, 0
    if g.stride(-1) != 1:
        raise ValueError("NVFP4 global scales must be contiguous along their rows")
    return g, g.stride(0)


def fused_moe_quant(x, w_gate, w_up, w_down, topk_ids, topk_weights, activation: MoeActivation, alpha: float,
                    limit: float, out: torch.Tensor | None, scales: MoeScales,
                    tiles: QuantMoeTiles | None = None) -> torch.Tensor:
    """sum_k topk_weights[t, k] * expert_{topk_ids[t, k]}(x[t]) -> [T, H] (x's dtype)."""
    if w_gate.dim() != 3 or w_down.dim() != 3:
        raise ValueError("the tile-dequantizing MoE kernels read row-major experts [E, N, K], not block-major ones")
    for w in (x, w_gate, w_up, w_down):
        if w.stride(-1) != 1:
            raise ValueError("x and the expert weights must be contiguous along their last (reduction) dim")
    n_tok, top_k = topk_ids.shape
    n_exp, inter, hidden = w_gate.shape[0], w_gate.shape[1], x.shape[1]
    t = tiles or quant_moe_tiles(n_tok * top_k, n_exp, inter, hidden)
    ids = topk_ids.reshape(-1).contiguous()
    sorted_ids, block_expert, n_post = moe_align(ids, n_exp, t.block_m)
    fmt, f32 = 2 if scales.nvfp4 else 1, x.dtype == torch.float32 or interpreting()
    h = x.new_empty((sorted_ids.shape[0], inter))
    _gate_up(x, w_gate, w_up, h, sorted_ids, block_expert, n_post, top_k, activation, alpha, limit, t, scales,
             fmt, f32)
    y = x.new_empty((n_tok * top_k, hidden), dtype=torch.float32)
    _down(h, w_down, y, sorted_ids, block_expert, n_post, topk_weights.reshape(-1).contiguous(), t, scales, fmt, f32)
    out = torch.empty_like(x) if out is None else out
    topk_sum(y, ids, out, n_exp, top_k)
    return out


def _even(rows: int, inputs: int, t: QuantMoeTiles) -> bool:
    return rows % t.block_n == 0 and inputs % t.block_k == 0


def _gate_up(x, wg, wu, h, sorted_ids, block_expert, n_post, top_k, act, alpha, limit, t, scales, fmt, f32):
    from m3bench.runtime.kernels.moe_quant_triton import moe_quant_gate_up_kernel

    sg, su = _scale(scales.gate), _scale(scales.up)
    (gg, gge), (gu, gue) = _glob(scales.gate_global, wg), _glob(scales.up_global, wu)
    n_tiles, split = math.ceil(wg.shape[1] / t.block_n), t.split_k
    if split > 1 and x.shape[1] % (split * t.block_k):
        raise ValueError(f"split_k {split} x block_k {t.block_k} does not divide the hidden size {x.shape[1]}")
    check_counters(block_expert.shape[0] * n_tiles, split)
    parts = x.new_empty((split, 2, h.shape[0], wg.shape[1]) if split > 1 else (1,), dtype=torch.float32)
    grid = (block_expert.shape[0], n_tiles * split)
    (wg, s_ge, s_gn), (wu, s_ue, s_un) = _words(wg, fmt == 2), _words(wu, fmt == 2)
    moe_quant_gate_up_kernel[grid](
        x, wg, wu, h, sorted_ids, block_expert, n_post, top_k * x.shape[0], alpha, limit,
        x.stride(0), s_ge, s_gn, s_ue, s_un, h.stride(0),
        sg, su, sg.stride(0), sg.stride(1), su.stride(0), su.stride(1), gg, gu, gge, gue,
        parts, split_counters(x.device), h.shape[0],
        H=x.shape[1], I=wg.shape[1], TOPK=top_k, BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k,
        ACT=ACT_CODES[act], F32=f32, FMT=fmt, EVEN=_even(wg.shape[1], x.shape[1], t), SPLIT=split,
        num_warps=t.num_warps, num_stages=t.num_stages, **pdl_args(x),
    )


def _down(h, wd, y, sorted_ids, block_expert, n_post, weights, t, scales, fmt, f32):
    from m3bench.runtime.kernels.moe_quant_triton import moe_quant_down_kernel

    sd = _scale(scales.down)
    gd, gde = _glob(scales.down_global, wd)
    grid = (block_expert.shape[0], math.ceil(wd.shape[1] / t.block_n))
    wd, s_de, s_dn = _words(wd, fmt == 2)
    moe_quant_down_kernel[grid](
        h, wd, y, sorted_ids, block_expert, n_post, weights, y.shape[0],
        h.stride(0), s_de, s_dn, y.stride(0), sd, sd.stride(0), sd.stride(1), gd, gde,
        I=h.shape[1], H=wd.shape[1], BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k, F32=f32, FMT=fmt,
        EVEN=_even(wd.shape[1], h.shape[1], t), num_warps=t.num_warps, num_stages=t.num_stages, **pdl_args(h),
    )


def topk_sum(y: torch.Tensor, ids: torch.Tensor, out: torch.Tensor, n_exp: int, top_k: int) -> None:
    """out[t] = sum of y[t * top_k + k] over the local picks k (moe_quant_triton.topk_sum_kernel)."""
    from m3bench.runtime.kernels.moe_quant_triton import topk_sum_kernel

    block_n = min(1024, next_pow2(out.shape[1]))
    grid = (out.shape[0], math.ceil(out.shape[1] / block_n))
    topk_sum_kernel[grid](y, ids, out, y.stride(0), out.stride(0), E=n_exp, H=out.shape[1], TOPK=top_k,
                          TOPK_P2=next_pow2(top_k), BLOCK_N=block_n, num_warps=4, **pdl_args(out))
