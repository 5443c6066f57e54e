"""The fused MoE's token-to-expert alignment: (token, pick) pairs sorted by expert and padded to whole
BLOCK_M blocks, by one Triton program (moe_triton.moe_align_kernel) or device torch ops for large counts."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from m3bench.runtime.kernels.backend import next_pow2, pdl_args


@dataclass(frozen=True)
class MoeAlignment:
    """moe_align's result, when another kernel produced it (kernels.router.router_topk_align)."""

    sorted_ids: torch.Tensor  # [S] pair ids padded per expert (n_pairs + n_shared marks padding)
    block_expert: torch.Tensor  # [S / BLOCK_M] expert of each M-block
    n_post: torch.Tensor  # [1] padded count


def align_slots(n_pairs: int, n_experts: int, block_m: int, n_shared: int = 0) -> int:
    """S, the static slot count of an alignment (whole BLOCK_M blocks)."""
    return math.ceil(max_padded_pairs(n_pairs, n_experts, block_m, n_shared) / block_m) * block_m


def max_padded_pairs(n_pairs: int, n_experts: int, block_m: int, n_shared: int = 0) -> int:
    """Static bound of the padded pair count: each active expert (the shared one too) pads less than BLOCK_M."""
    return n_pairs + n_shared + (min(n_experts, n_pairs) + (n_shared > 0)) * (block_m - 1)


MAX_KERNEL_ALIGN_PAIRS = 16384  # the one-program align keeps every pair in registers


def moe_align(ids: torch.Tensor, n_experts: int, block_m: int, n_shared: int = 0):
    """(sorted pair ids padded per expert [S] (n_pairs + n_shared marks padding), expert of each
    M-block [S / BLOCK_M], padded count [1]); S is a static bound, slots past the count are unused.
    n_shared > 0: expert n_experts is the shared one, its pairs n_pairs .. n_pairs + n_shared - 1."""
    n_pairs = ids.numel()
    n_slots = align_slots(n_pairs, n_experts, block_m, n_shared)
    if n_pairs + n_shared > MAX_KERNEL_ALIGN_PAIRS:
        if n_shared:
            local = torch.where((ids >= 0) & (ids < n_experts), ids, -1)
            ids, n_experts = torch.cat([local, local.new_full((n_shared,), n_experts)]), n_experts + 1
        return moe_align_torch(ids, n_experts, block_m, n_slots)
    from m3bench.runtime.kernels.moe_triton import moe_align_kernel

    sorted_ids = torch.empty((n_slots,), dtype=torch.int32, device=ids.device)  # all live slots written
    block_expert = torch.empty((n_slots // block_m,), dtype=torch.int32, device=ids.device)
    n_post = torch.empty((1,), dtype=torch.int32, device=ids.device)
    warps = 4 if n_pairs + n_shared <= 4096 else 16
    moe_align_kernel[(1,)](ids, n_pairs, n_shared, sorted_ids, block_expert, n_post, E=n_experts + (n_shared > 0),
                            BLOCK_M=block_m, NP=next_pow2(max(n_pairs + n_shared, 16)), SHARED=n_shared > 0,
                            num_warps=warps, **pdl_args(ids))
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
