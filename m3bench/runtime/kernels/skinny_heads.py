"""The decode q|k|v(|index) projection and its heads' norm + RoPE + cache write in one launch
(kernels/skinny_heads_triton.py) instead of two (skinny_linear, then norm_rope_write / norm_rope_write_pair).

    y, outs = skinny_heads(x, weight, bias, (main, index), eps, gemma, cos, sin, slot_mapping)
    # y = x W^T (+ b) [M, N]; outs: each branch's normed, rotated query heads [M, hq, d]; K / V / index K written

Where `skinny_heads_supported` says so: up to HEADS_MAX_ROWS rows, weights the skinny GEMM takes (kernels.skinny),
one head width d for
every branch (a tile is one head), the heads laid out in y in the kernel's order without gaps (q, k, v, then the
index q and the index key), and one cache format for both branches. The reference is the two launches it
replaces, to the bit given the same tiles (`heads_tiles`).
"""

from __future__ import annotations

import torch

from m3bench.runtime.kernels.backend import interpreting, pdl_args, sm_count
from m3bench.runtime.kernels.kv_quant import kv_format_of
from m3bench.runtime.kernels.mx_linear import SMS, MxKernel, MxTiles, block_k_for, check_split, split_counters
from m3bench.runtime.kernels.norm_rope import BranchWrite, HeadRows
from m3bench.runtime.kernels.skinny import skinny_split, skinny_supported

HEADS_MAX_ROWS = 4  # the tile's writer runs its head for each row in turn: a serial tail that grows with the rows
#                     (norm_rope_write runs a program a row and head), so more rows keep the two launches

def heads_layout_ok(writes: tuple[BranchWrite, ...], n: int) -> bool:
    """Every branch's heads d wide (one d for all), consecutive in head_row's order from column 0, filling n."""
    d, col = writes[0].branch.d, 0
    for w in writes:
        b = w.branch
        if b.d != d or b.q_col != col or b.k_col != col + b.hq * d or (b.hv and b.v_col != b.k_col + b.hk * d):
            return False
        col += (b.hq + b.hk + b.hv) * d
    return col == n


def skinny_heads_supported(x: torch.Tensor, weight: torch.Tensor, writes: tuple[BranchWrite, ...],
                           max_rows: int) -> bool:
    """The fused launch runs this projection (the caller checks the device, as for skinny_linear)."""
    caches = [w.k_cache for w in writes] + [w.v_cache for w in writes if w.v_cache is not None]
    formats = {kv_format_of(c) for c in caches}
    return (skinny_supported(x, weight, min(max_rows, HEADS_MAX_ROWS)) and x.dtype != torch.float32
            and 1 <= len(writes) <= 2
            and len(formats) == 1 and heads_layout_ok(writes, weight.shape[0]) and weight.shape[1] == x.shape[-1])


def heads_tiles(m: int, n: int, k: int, d: int, sms: int = SMS) -> MxTiles:
    """The skinny dot tiles with one head (d columns) a tile: BLOCK_K 128 (64 below 512 inputs), K split by
    skinny_split."""
    bk = block_k_for(k, 128 if k >= 512 else 64)
    return MxTiles(MxKernel.DOT, 16, d, bk, skinny_split(n // d, k, bk, MxKernel.DOT, sms), 4, 4 if bk >= 128 else 6)


def skinny_heads(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, writes: tuple[BranchWrite, ...],
                 eps: float, gemma: bool, cos: torch.Tensor, sin: torch.Tensor, slot_mapping: torch.Tensor,
                 tiles: MxTiles | None = None) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """x [M, K] -> (y [M, N], each branch's query heads); the keys and values written as norm_rope_write's."""
    from m3bench.runtime.kernels.skinny_heads_triton import skinny_heads_kernel

    m, k = x.shape
    n, d = weight.shape[0], writes[0].branch.d
    if x.stride(-1) != 1 or not skinny_heads_supported(x, weight, writes, HEADS_MAX_ROWS):
        raise ValueError(f"skinny_heads: unsupported projection {tuple(x.shape)} x {tuple(weight.shape)} "
                         f"({x.dtype}) or head layout")
    t = tiles or heads_tiles(m, n, k, d, sm_count(x.device.index or 0) if x.is_cuda else SMS)
    if t.block_n != d or t.kernel is not MxKernel.DOT or m > t.block_m:
        raise ValueError(f"skinny_heads tiles must be dot tiles one head ({d}) wide for {m} rows, got {t}")
    check_split(t, m, n, k)
    y = x.new_empty((m, n))
    heads = HeadRows.of(y, writes, cos, sin)
    parts = x.new_empty((t.split_k, m, n) if t.split_k > 1 else (1,), dtype=torch.float32)
    if m:
        skinny_heads_kernel[(n // d, t.split_k)](
            x, weight, y if bias is None else bias, y, parts, split_counters(x.device), m, x.stride(0),
            weight.stride(0), y.stride(0), heads.cos, heads.sin, slot_mapping, float(eps), heads.cos.stride(0),
            *heads.args, N=n, K=k, K_SPLIT=k // t.split_k, SPLIT=t.split_k, BLOCK_M=t.block_m, BLOCK_K=t.block_k,
            HAS_BIAS=bias is not None, F32=interpreting(), EVEN=k % t.block_k == 0, **heads.meta(gemma),
            num_warps=t.num_warps, num_stages=t.num_stages, **pdl_args(x),
        )
    return y, heads.outs
