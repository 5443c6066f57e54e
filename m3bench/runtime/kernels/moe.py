"""Fused MoE entry point: Triton on CUDA, the torch reference on CPU.

    out = fused_moe(x, w_gate, w_up, w_down, topk_ids, topk_weights, MoeActivation.SWIGLUOAI)

x [T, H]; w_gate, w_up [E, I, H] (views into one stacked [E, 2I, H] tensor work); w_down
[E, H, I]; topk_ids [T, K] local expert ids, ids outside [0, E) (experts of other ranks)
contribute nothing; topk_weights [T, K] routing weights (already renormalized and scaled).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from m3bench.runtime.kernels import reference
from m3bench.runtime.kernels.backend import (
    KernelBackend,
    interpreting,
    next_pow2,
    use_triton,
)
from m3bench.runtime.kernels.reference import MoeActivation

_ACT_CODE = {MoeActivation.SWIGLUOAI: 0, MoeActivation.SILU: 1}


@dataclass(frozen=True)
class MoeTiles:
    """Tile sizes of the grouped GEMMs (one config per batch bucket); block_n_down 0: block_n."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3
    block_n_down: int = 0

    @property
    def n_down(self) -> int:
        return self.block_n_down or self.block_n


MIN_PROGRAMS = 264  # two waves of 132 SMs: narrow N tiles until the skinny GEMMs fill them


def moe_tiles(n_pairs: int, n_experts: int, inter: int, hidden: int) -> MoeTiles:
    """Skinny batches: BLOCK_M 16 (M padded to 16) and N tiles narrowed until the grid of the
    few active experts fills the GPU; bigger batches: larger M tiles."""
    per_expert = n_pairs / max(1, n_experts)  # mean pairs of an expert (upper bound of active)
    if per_expert <= 8:
        base = MoeTiles(16, 64, 128, num_warps=4, num_stages=4)
    elif per_expert <= 24:
        base = MoeTiles(32, 64, 128, num_warps=4, num_stages=4)
    else:
        base = MoeTiles(64, 128, 64, num_warps=8, num_stages=3)
    blocks = min(n_pairs, n_experts) * max(1, math.ceil(per_expert / base.block_m))
    return replace(base, block_n=_narrow(base.block_n, blocks, inter),
                   block_n_down=_narrow(base.block_n, blocks, hidden))


def _narrow(block_n: int, blocks: int, n: int) -> int:
    while block_n > 16 and blocks * math.ceil(n / block_n) < MIN_PROGRAMS:
        block_n //= 2
    return block_n


def fused_moe(
    x: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    activation: MoeActivation = MoeActivation.SWIGLUOAI,
    alpha: float = 1.702,
    limit: float = 7.0,
    out: torch.Tensor | None = None,
    backend: KernelBackend = KernelBackend.AUTO,
    tiles: MoeTiles | None = None,
) -> torch.Tensor:
    """sum_k topk_weights[t, k] * expert_{topk_ids[t, k]}(x[t]) -> [T, H]."""
    if not use_triton(backend, x):
        return reference.fused_moe_ref(
            x, w_gate, w_up, w_down, topk_ids, topk_weights, activation, alpha, limit, out
        )
    n_tok, top_k = topk_ids.shape
    n_exp = w_gate.shape[0]
    tiles = tiles or moe_tiles(n_tok * top_k, n_exp, w_gate.shape[1], w_gate.shape[2])
    ids = topk_ids.reshape(-1).contiguous()
    sorted_ids, block_expert, n_post = moe_align(ids, n_exp, tiles.block_m)
    inter = x.new_empty((sorted_ids.shape[0], w_gate.shape[1]))
    _launch_gate_up(x, w_gate, w_up, inter, sorted_ids, block_expert, n_post, top_k, activation,
                    alpha, limit, tiles)
    y = x.new_empty((n_tok * top_k, w_down.shape[1]), dtype=torch.float32)
    weights = topk_weights.reshape(-1).contiguous()
    _launch_down(inter, w_down, y, sorted_ids, block_expert, n_post, weights, tiles)
    out = torch.empty_like(x) if out is None else out
    _launch_sum(y, ids, out, n_exp, top_k)
    return out


def max_padded_pairs(n_pairs: int, n_experts: int, block_m: int) -> int:
    """Static bound of the padded pair count: each active expert pads less than BLOCK_M."""
    return n_pairs + min(n_experts, n_pairs) * (block_m - 1)


MAX_KERNEL_ALIGN_PAIRS = 16384  # the one-program align keeps every pair in registers


def moe_align(ids: torch.Tensor, n_experts: int, block_m: int):
    """(sorted pair ids padded per expert [S] (n_pairs marks padding), expert of each M-block
    [S / BLOCK_M], padded count [1]); S is a static bound, slots past the count are unused."""
    n_pairs = ids.numel()
    n_slots = math.ceil(max_padded_pairs(n_pairs, n_experts, block_m) / block_m) * block_m
    if n_pairs > MAX_KERNEL_ALIGN_PAIRS:
        return moe_align_torch(ids, n_experts, block_m, n_slots)
    from m3bench.runtime.kernels.moe_triton import moe_align_kernel

    sorted_ids = torch.empty((n_slots,), dtype=torch.int32, device=ids.device)  # all live slots written
    block_expert = torch.empty((n_slots // block_m,), dtype=torch.int32, device=ids.device)
    n_post = torch.empty((1,), dtype=torch.int32, device=ids.device)
    warps = 4 if n_pairs <= 4096 else 16
    moe_align_kernel[(1,)](ids, n_pairs, sorted_ids, block_expert, n_post,
                            E=n_experts, BLOCK_M=block_m, NP=next_pow2(max(n_pairs, 16)), num_warps=warps)
    return sorted_ids, block_expert, n_post


def moe_align_torch(ids: torch.Tensor, n_experts: int, block_m: int, n_slots: int):
    """moe_align in device torch ops (no host reads) for large pair counts (prefill)."""
    n_pairs = ids.numel()
    key = torch.where((ids >= 0) & (ids < n_experts), ids.long(), n_experts)  # n_experts: not local
    counts = torch.zeros(n_experts + 1, dtype=torch.long, device=ids.device)
    counts.scatter_add_(0, key, torch.ones_like(key))
    padded = (counts + block_m - 1) // block_m * block_m
    padded[-1] = 0
    ends = padded.cumsum(0)
    order = torch.argsort(key, stable=True)
    skey = key[order]
    rank = torch.arange(n_pairs, device=ids.device) - (counts.cumsum(0) - counts)[skey]
    slot = torch.where(skey < n_experts, ends[skey] - padded[skey] + rank, n_slots)  # n_slots: dropped
    sorted_ids = torch.full((n_slots + 1,), n_pairs, dtype=torch.int32, device=ids.device)
    sorted_ids.scatter_(0, slot, order.to(torch.int32))
    first_block = torch.arange(n_slots // block_m, device=ids.device) * block_m
    block_expert = torch.searchsorted(ends[:-1], first_block, right=True).clamp(max=n_experts - 1)
    return sorted_ids[:n_slots], block_expert.to(torch.int32), ends[-1:].to(torch.int32)


def _check_weights(*ws):
    for w in ws:
        if w.stride(-1) != 1:
            raise ValueError("expert weights must be contiguous along their last (reduction) dim")


def _launch_gate_up(x, wg, wu, inter, sorted_ids, block_expert, n_post, top_k, act, alpha, limit, tiles):
    from m3bench.runtime.kernels.moe_triton import moe_gate_up_kernel

    _check_weights(x, wg, wu)
    n_inter, hidden = wg.shape[1], wg.shape[2]
    grid = (block_expert.shape[0], math.ceil(n_inter / tiles.block_n))
    moe_gate_up_kernel[grid](
        x, wg, wu, inter, sorted_ids, block_expert, n_post, top_k * x.shape[0], alpha, limit,
        x.stride(0), wg.stride(0), wg.stride(1), wu.stride(0), wu.stride(1), inter.stride(0),
        H=hidden, I=n_inter, TOPK=top_k, BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n,
        BLOCK_K=tiles.block_k, ACT=_ACT_CODE[act], F32=x.dtype == torch.float32 or interpreting(),
        num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )


def _launch_down(inter, wd, y, sorted_ids, block_expert, n_post, weights, tiles):
    from m3bench.runtime.kernels.moe_triton import moe_down_kernel

    _check_weights(wd)
    hidden, n_inter = wd.shape[1], wd.shape[2]
    grid = (block_expert.shape[0], math.ceil(hidden / tiles.n_down))
    moe_down_kernel[grid](
        inter, wd, y, sorted_ids, block_expert, n_post, weights, y.shape[0],
        inter.stride(0), wd.stride(0), wd.stride(1), y.stride(0),
        I=n_inter, H=hidden, BLOCK_M=tiles.block_m, BLOCK_N=tiles.n_down, BLOCK_K=tiles.block_k,
        F32=inter.dtype == torch.float32 or interpreting(),
        num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )


def _launch_sum(y, ids, out, n_exp, top_k):
    from m3bench.runtime.kernels.moe_triton import moe_sum_kernel

    block_n = min(1024, next_pow2(out.shape[1]))
    grid = (out.shape[0], math.ceil(out.shape[1] / block_n))
    moe_sum_kernel[grid](y, ids, out, y.stride(0), out.stride(0), E=n_exp, H=out.shape[1],
                          TOPK=top_k, BLOCK_N=block_n, num_warps=4)
