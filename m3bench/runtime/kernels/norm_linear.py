"""A decode GEMM that takes the residual add + RMSNorm before it (kernels/norm_linear_triton.py): one launch for
what the fused path runs as two (kernels/add_norm.py, then kernels/skinny.py).

    h, y = norm_linear(residual, delta, norm_weight, eps, gemma, weight, bias)   # h = residual + delta,
                                                                                # y = norm(h) @ weight^T (+ bias)

Few rows (the skinny dot's tiles and K split, kernels.skinny.skinny_tiles), bf16 (fp32 in the CPU interpreter)
plain weights; `norm_linear_supported` says when it runs. The torch reference is `norm_linear_reference`.
"""

from __future__ import annotations

import torch

from m3bench.runtime.kernels.backend import interpreting, pdl_args, sm_count
from m3bench.runtime.kernels.mx_linear import SMS, MxKernel, MxTiles, check_split, split_counters
from m3bench.runtime.kernels.skinny import SKINNY_MAX_ROWS, skinny_tiles

DTYPES = (torch.bfloat16, torch.float32)  # not fp16: h * w_norm, the MMA's operand, is unscaled (fp16 overflows)


def norm_linear_supported(residual: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor,
                          max_rows: int = SKINNY_MAX_ROWS) -> bool:
    """residual and delta [M, K] (M <= max_rows) of one dtype in DTYPES, contiguous rows, against a plain weight
    [N, K] of that dtype."""
    return (residual.dim() == 2 and tuple(delta.shape) == tuple(residual.shape)
            and 0 < residual.shape[0] <= min(max_rows, SKINNY_MAX_ROWS)
            and residual.dtype == delta.dtype == weight.dtype and residual.dtype in DTYPES
            and weight.dim() == 2 and weight.shape[1] == residual.shape[1] and weight.stride(-1) == 1
            and residual.stride(-1) == 1 and delta.stride(-1) == 1 and residual.shape[1] % 32 == 0)


def norm_linear(residual: torch.Tensor, delta: torch.Tensor, norm_weight: torch.Tensor, eps: float, gemma: bool,
                weight: torch.Tensor, bias: torch.Tensor | None = None, h_out: torch.Tensor | None = None,
                tiles: MxTiles | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(h, y): h = residual + delta [M, K] (into h_out when given), y = rms_norm(h) @ weight^T (+ bias) [M, N];
    tiles: the dot kernel's (default skinny_tiles')."""
    from m3bench.runtime.kernels.norm_linear_triton import norm_dot_kernel

    if not norm_linear_supported(residual, delta, weight):
        raise ValueError(f"norm_linear needs residual / delta [M <= {SKINNY_MAX_ROWS}, K] and a weight [N, K] of one "
                         f"of {DTYPES}, K a multiple of 32, contiguous rows")
    m, k = residual.shape
    n = weight.shape[0]
    h = torch.empty_like(residual) if h_out is None else h_out
    if tuple(h.shape) != (m, k) or h.dtype != residual.dtype or h.stride(-1) != 1:
        raise ValueError(f"h_out must be a {residual.dtype} {(m, k)} tensor, contiguous rows")
    t = tiles or skinny_tiles(m, n, k, weight.dtype, kernel=MxKernel.DOT,
                              sms=sm_count(residual.device.index or 0) if residual.is_cuda else SMS)
    if t.kernel is not MxKernel.DOT or m > t.block_m:
        raise ValueError(f"norm_linear runs the dot kernel on at most block_m rows, got {t.kernel.name} for {m} rows")
    check_split(t, m, n, k)
    grid = t.grid(m, n)
    y = residual.new_empty((m, n))
    split = t.split_k > 1
    parts = residual.new_empty((t.split_k, m, n) if split else (1,), dtype=torch.float32)
    ssq = residual.new_empty((t.split_k, grid[0], t.block_m) if split else (1,), dtype=torch.float32)
    norm_dot_kernel[grid](
        residual, delta, norm_weight, h, weight, bias if bias is not None else y, y, parts, ssq,
        split_counters(residual.device), m, float(eps), residual.stride(0), delta.stride(0), h.stride(0),
        weight.stride(0), y.stride(0), N=n, K=k, K_SPLIT=k // t.split_k, SPLIT=t.split_k, BLOCK_M=t.block_m,
        BLOCK_N=t.block_n, BLOCK_K=t.block_k, HAS_BIAS=bias is not None, GEMMA=gemma,
        F32=weight.dtype == torch.float32 or interpreting(), EVEN=n % t.block_n == 0 and k % t.block_k == 0,
        num_warps=t.num_warps, num_stages=t.num_stages, **pdl_args(residual),
    )
    return h, y


def norm_linear_reference(residual: torch.Tensor, delta: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                          gemma: bool, weight: torch.Tensor, bias: torch.Tensor | None = None
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """(h, y), y in float64: h = residual + delta (torch's add in the stream's dtype), y = rms_norm(h) W^T from h."""
    h = residual + delta
    hd = h.to(torch.float64)
    w = norm_weight.to(torch.float64)
    x = hd * torch.rsqrt(hd.pow(2).mean(-1, keepdim=True) + eps) * ((1.0 + w) if gemma else w)
    y = x @ weight.to(torch.float64).T
    return h, (y if bias is None else y + bias.to(torch.float64))
