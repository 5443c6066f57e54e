"""Fused router epilogue (Triton): sigmoid + correction bias + top-k + renormalise + scaling of
the fp32 router logits in one launch. The torch reference is `layers.moe.route`'s torch path.

    w, ids = router_topk(logits, bias, top_k, scale)   # logits [T, E] fp32 -> [T, k] fp32, [T, k] int64
"""

from __future__ import annotations

import math

import torch

from m3bench.runtime.kernels.backend import next_pow2


def router_topk_supported(logits: torch.Tensor, top_k: int) -> bool:
    """The kernel's shapes: fp32 logits, E a power of two up to 1024, 1 <= k <= E."""
    e = logits.shape[-1]
    return logits.dtype == torch.float32 and e == next_pow2(e) and e <= 1024 and 1 <= top_k <= e


def router_topk(logits: torch.Tensor, bias: torch.Tensor | None, top_k: int, scale: float,
                out: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    from m3bench.runtime.kernels.router_triton import _router_topk_kernel

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
    _router_topk_kernel[(math.ceil(n_tok / block_t),)](
        logits, bias_t, w, ids, n_tok, float(scale), logits.stride(0),
        E=n_exp, K=top_k, KP=next_pow2(top_k), BLOCK_T=block_t, HAS_BIAS=bias is not None, num_warps=4,
    )
    return w, ids
