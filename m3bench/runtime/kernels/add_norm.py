"""Fused residual add + RMSNorm (Triton), one launch instead of an add and a norm's five ops.
The torch reference is `layers.norm.add_rms_norm`'s torch path (residual + x, then rms_norm).

    h, y = add_rms_norm_fused(residual, x, weight, eps, gemma=True)   # [T, H] each
"""

from __future__ import annotations

import torch

from m3bench.runtime.kernels.backend import next_pow2

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_HIDDEN = 16384  # one row in registers


def add_norm_supported(residual: torch.Tensor, x: torch.Tensor) -> bool:
    return (residual.dtype == x.dtype and x.dtype in DTYPES and residual.shape == x.shape and x.dim() == 2
            and x.shape[-1] <= MAX_HIDDEN)


def add_rms_norm_fused(residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool,
                       out: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    from m3bench.runtime.kernels.add_norm_triton import _add_rms_norm_kernel

    if not add_norm_supported(residual, x):
        raise ValueError(f"add_rms_norm_fused needs two [T, H] tensors of one of {DTYPES}, H <= {MAX_HIDDEN}")
    if residual.stride(-1) != 1 or x.stride(-1) != 1:
        raise ValueError("residual and x must be contiguous in their last dim")
    h, y = out if out is not None else (torch.empty_like(x), torch.empty_like(x))
    n_tok, hidden = x.shape
    if n_tok:
        _add_rms_norm_kernel[(n_tok,)](
            residual, x, weight, h, y, float(eps), residual.stride(0), x.stride(0), h.stride(0), y.stride(0),
            H=hidden, BLOCK=next_pow2(hidden), GEMMA=gemma, num_warps=8 if hidden >= 4096 else 4,
        )
    return h, y
