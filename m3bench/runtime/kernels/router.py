"""Fused router epilogue (Triton): sigmoid + correction bias + top-k + renormalise + scaling of
the fp32 router logits in one launch. The torch reference is `layers.moe.route`'s torch path.

    w, ids = router_topk(logits, bias, top_k, scale)   # logits [T, E] fp32 -> [T, k] fp32, [T, k] int64
    w, local_ids, alignment = router_topk_align(logits, bias, top_k, scale, first, n_local, block_m, shared)
    w, local_ids, alignment = routing_outputs(1, top_k, n_local, block_m, False, dev)   # one token: empty, then
    y = fused_moe(x, ..., local_ids, w, alignment=alignment, route=KernelRoute(logits, bias, scale, first))
                                                      # filled by the MoE's gate|up launch, which routes the token

`router_topk_align` (T <= ALIGN_TOKENS) also lays the rank's picks out for the fused MoE (kernels.moe.
moe_align's MoeAlignment, the shared expert's pairs included when `shared`) in the same launch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from m3bench.runtime.kernels.backend import next_pow2, pdl_args
from m3bench.runtime.kernels.moe_align import MoeAlignment, align_slots

ALIGN_TOKENS = 16  # router_topk_align runs as one program: its rows stay in registers


def router_shapes_supported(n_experts: int, top_k: int) -> bool:
    """The kernels' shapes: E a power of two up to 1024, 1 <= k <= E."""
    return n_experts == next_pow2(n_experts) and n_experts <= 1024 and 1 <= top_k <= n_experts


def router_topk_supported(logits: torch.Tensor, top_k: int) -> bool:
    """fp32 logits [T, E] of the kernel's shapes."""
    return logits.dtype == torch.float32 and router_shapes_supported(logits.shape[-1], top_k)


def router_topk(logits: torch.Tensor, bias: torch.Tensor | None, top_k: int, scale: float,
                out: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    from m3bench.runtime.kernels.router_triton import router_topk_kernel

    if not router_topk_supported(logits, top_k) or logits.stride(-1) != 1:
        raise ValueError(f"router_topk needs contiguous fp32 logits with a power-of-two expert count, "
                         f"got {tuple(logits.shape)} {logits.dtype}")
    n_tok, n_exp = logits.shape
    if out is None:
        out = (torch.empty((n_tok, top_k), dtype=torch.float32, device=logits.device),
               torch.empty((n_tok, top_k), dtype=torch.int64, device=logits.device))
    w, ids = out
    block_t = max(1, min(16, 4096 // n_exp))
    bias_t = logits if bias is None else bias
    router_topk_kernel[(math.ceil(n_tok / block_t),)](
        logits, bias_t, w, ids, n_tok, float(scale), logits.stride(0),
        E=n_exp, K=top_k, KP=next_pow2(top_k), BLOCK_T=block_t, HAS_BIAS=bias is not None, num_warps=4,
        **pdl_args(logits),
    )
    return w, ids


def router_align_supported(n_tok: int, n_experts: int, top_k: int) -> bool:
    """router_topk_align's shapes: at most ALIGN_TOKENS tokens (one program)."""
    return n_tok <= ALIGN_TOKENS and router_shapes_supported(n_experts, top_k)


def router_topk_align(logits: torch.Tensor, bias: torch.Tensor | None, top_k: int, scale: float, first: int,
                      n_local: int, block_m: int, shared: bool) -> tuple[torch.Tensor, torch.Tensor, MoeAlignment]:
    """router_topk, the ids made local (minus `first`), and moe_align(local ids, n_local, block_m,
    n_shared = T if shared) of the same picks, in one launch."""
    from m3bench.runtime.kernels.router_triton import router_align_kernel

    if not (router_topk_supported(logits, top_k) and router_align_supported(*logits.shape, top_k)
            and logits.stride(-1) == 1):
        raise ValueError(f"router_topk_align needs contiguous fp32 logits of at most {ALIGN_TOKENS} tokens and a "
                         f"power-of-two expert count, got {tuple(logits.shape)} {logits.dtype}")
    n_tok, n_exp = logits.shape
    w, ids, out = routing_outputs(n_tok, top_k, n_local, block_m, shared, logits.device)
    router_align_kernel[(1,)](
        logits, logits if bias is None else bias, w, ids, n_tok, float(scale), logits.stride(0), int(first),
        out.sorted_ids, out.block_expert, out.n_post, E=n_exp, K=top_k, KP=next_pow2(top_k),
        BLOCK_T=next_pow2(max(n_tok, 1)), HAS_BIAS=bias is not None, E_LOCAL=n_local, BLOCK_M=block_m,
        SHARED=shared, num_warps=4, **pdl_args(logits),
    )
    return w, ids, out


def routing_outputs(n_tok: int, top_k: int, n_local: int, block_m: int, shared: bool, device: torch.device
                    ) -> tuple[torch.Tensor, torch.Tensor, MoeAlignment]:
    """Empty (weights [T, k] fp32, local ids [T, k] int64, MoeAlignment) for a kernel that routes and aligns
    (router_topk_align's, or the fused MoE's gate|up launch with a KernelRoute)."""
    n_slots = align_slots(n_tok * top_k, n_local, block_m, n_tok if shared else 0)
    return (torch.empty((n_tok, top_k), dtype=torch.float32, device=device),
            torch.empty((n_tok, top_k), dtype=torch.int64, device=device),
            MoeAlignment(torch.empty((n_slots,), dtype=torch.int32, device=device),
                         torch.empty((n_slots // block_m,), dtype=torch.int32, device=device),
                         torch.empty((1,), dtype=torch.int32, device=device)))


@dataclass(frozen=True)
class KernelRoute:
    """One token's routing made inside the fused MoE's gate|up launch (kernels/moe_route_triton.py, as
    router_topk_align computes it) from the router's fp32 logits [1, E]: no launch of its own. fused_moe(...,
    route=KernelRoute(...)) takes routing_outputs' buffers as its topk_weights, topk_ids and alignment and fills them."""

    logits: torch.Tensor
    bias: torch.Tensor | None
    scale: float
    first: int  # the rank's first expert: ids are stored local (minus first)

    def check(self, top_k: int) -> None:
        if not (router_topk_supported(self.logits, top_k) and self.logits.shape[0] == 1
                and self.logits.stride(-1) == 1):
            raise ValueError(f"fused_moe: routing in the gate|up launch needs contiguous fp32 logits of one token and "
                             f"a power-of-two expert count, got {tuple(self.logits.shape)} {self.logits.dtype}")
