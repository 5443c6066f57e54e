"""RMSNorm computed in fp32 (or fp64 for fp64 inputs): Gemma `(1 + w)` or plain `w` scaling; the
residual add before a norm fused with it (`add_rms_norm`: one Triton kernel when the backend picks
Triton, kernels.add_norm)."""

from __future__ import annotations

import torch
from torch import nn

from m3bench.runtime.config import NormKind
from m3bench.runtime.kernels.add_norm import add_norm_supported, add_rms_norm_fused
from m3bench.runtime.kernels.backend import KernelBackend, use_triton
from m3bench.runtime.kernels.moe_sum import MoeSum, summed


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32 for low-precision tensors, the tensor's own dtype for fp32 / fp64."""
    return torch.promote_types(dtype, torch.float32)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, kind: NormKind) -> torch.Tensor:
    """Normalise the last dimension of x; the result has x's dtype."""
    ct = compute_dtype(x.dtype)
    xf = x.to(ct)
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    w = weight.to(ct)
    y = y * (1.0 + w) if kind is NormKind.GEMMA else y * w
    return y.to(x.dtype)


def add_rms_norm(residual: torch.Tensor, x: torch.Tensor | MoeSum, weight: torch.Tensor, eps: float, kind: NormKind,
                 backend: KernelBackend = KernelBackend.TORCH, y32_out: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(h, norm(h)) with h = residual + x; y32_out (fp32 [T, H]) also receives norm(h) widened. x may be a fused MoE's
    partials (kernels/moe_sum.MoeSum): summed in the fused kernel's launch, else by their own sum launch first."""
    if use_triton(backend, residual) and add_norm_supported(residual, x):
        return add_rms_norm_fused(residual.contiguous(), x if isinstance(x, MoeSum) else x.contiguous(), weight, eps,
                                  kind is NormKind.GEMMA, y32_out=y32_out)
    h = residual + summed(x)
    y = rms_norm(h, weight, eps, kind)
    if y32_out is not None:
        y32_out.copy_(y)
    return h, y


def neutral_value(kind: NormKind) -> float:
    """The weight value at which the norm only normalises (0 for Gemma, 1 for plain)."""
    return 0.0 if kind is NormKind.GEMMA else 1.0


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, kind: NormKind, dtype: torch.dtype, device: torch.device | str):
        super().__init__()
        self.eps = eps
        self.kind = kind
        self.weight = nn.Parameter(torch.full((dim,), neutral_value(kind), dtype=dtype, device=device),
                                   requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps, self.kind)

    def add_forward(self, residual: torch.Tensor, x: torch.Tensor | MoeSum, backend: KernelBackend = KernelBackend.TORCH,
                    y32_out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(residual + x, this norm of it), fused on the Triton backend (y32_out: the norm widened too)."""
        return add_rms_norm(residual, x, self.weight, self.eps, self.kind, backend, y32_out)
