"""Fused residual add + RMSNorm (Triton), one launch instead of an add and a norm's five ops.
The torch reference is `layers.norm.add_rms_norm`'s torch path (residual + x, then rms_norm).

    h, y = add_rms_norm_fused(residual, x, weight, eps, gemma=True)   # [T, H] each
    h, y = add_rms_norm_fused(residual, x, weight, eps, True, y32_out=buf)  # buf: y widened to fp32 too
    h, y = add_rms_norm_fused(residual, moe_sum, weight, eps, True)   # x a fused MoE's partials (kernels/moe_sum.py):
                                                                      # summed in this launch, the sum kernel's bits
"""

from __future__ import annotations

import torch

from m3bench.runtime.kernels.backend import next_pow2, pdl_args
from m3bench.runtime.kernels.moe_sum import MoeSum

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_HIDDEN = 16384  # one row in registers


def add_norm_supported(residual: torch.Tensor, x: torch.Tensor | MoeSum) -> bool:
    return (residual.dtype == x.dtype and x.dtype in DTYPES and tuple(residual.shape) == tuple(x.shape)
            and residual.dim() == 2 and residual.shape[-1] <= MAX_HIDDEN)


def add_rms_norm_fused(residual: torch.Tensor, x: torch.Tensor | MoeSum, weight: torch.Tensor, eps: float,
                       gemma: bool, out: tuple[torch.Tensor, torch.Tensor] | None = None,
                       y32_out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(h, y); y32_out [T, H] fp32, when given, also receives y as stored, widened (the router's input)."""
    from m3bench.runtime.kernels.add_norm_triton import add_rms_norm_kernel, moe_sum_add_rms_norm_kernel

    if not add_norm_supported(residual, x):
        raise ValueError(f"add_rms_norm_fused needs two [T, H] tensors of one of {DTYPES}, H <= {MAX_HIDDEN}")
    if residual.stride(-1) != 1 or (not isinstance(x, MoeSum) and x.stride(-1) != 1):
        raise ValueError("residual and x must be contiguous in their last dim")
    n_tok, hidden = residual.shape
    h, y = out if out is not None else (torch.empty_like(residual), torch.empty_like(residual))
    if y32_out is not None and (y32_out.dtype != torch.float32 or tuple(y32_out.shape) != (n_tok, hidden)
                                or y32_out.stride(-1) != 1):
        raise ValueError(f"y32_out must be a contiguous fp32 {(n_tok, hidden)} tensor")
    y32 = y if y32_out is None else y32_out
    if not n_tok:
        return h, y
    common = dict(H=hidden, BLOCK=next_pow2(hidden), GEMMA=gemma, COPY32=y32_out is not None,
                  num_warps=8 if hidden >= 4096 else 4, **pdl_args(residual))
    if isinstance(x, MoeSum):
        add = x.addend
        moe_sum_add_rms_norm_kernel[(n_tok,)](
            residual, x.y, x.ids, residual if add is None else add, weight, h, y, y32, float(eps), residual.stride(0),
            x.y.stride(1), x.y.stride(0), 0 if add is None else add.stride(0), h.stride(0), y.stride(0),
            y32.stride(0), x.ids.numel(), E=x.n_exp, TOPK=x.top_k, CHUNKS=x.y.shape[0], SHARED=x.shared,
            ADD=add is not None, **common)
    else:
        add_rms_norm_kernel[(n_tok,)](residual, x, weight, h, y, y32, float(eps), residual.stride(0), x.stride(0),
                                      h.stride(0), y.stride(0), y32.stride(0), **common)
    return h, y
