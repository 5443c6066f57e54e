"""Fused per-head RMSNorm + partial RoPE + KV-cache write (Triton): one launch per attention branch
instead of the ~15 torch ops of norm, rotate, quantize and indexed store. The torch reference is
the attention layer's own path (layers.norm.rms_norm, layers.rotary.apply_rope, KVCache.write).

    q = norm_rope_write(y, Branch(q_col=0, k_col=Hq*d, v_col=(Hq+Hkv)*d, hq=Hq, hk=Hkv, hv=Hkv, d=d),
                        q_w, k_w, eps, gemma, cos, sin, slot_mapping, k_cache, v_cache)

y [T, N] the fused projection output (the branch's heads at its column offsets); cos / sin
[T, r/2] fp32; k_cache / v_cache [pages, H, P, d] or [pages, P, d] (index keys), any KV format.
Returns the normed, rotated query heads [T, hq, d] in y's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from m3bench.runtime.kernels import kv_quant as kq
from m3bench.runtime.kernels.backend import FMT_CODE, cache_kernel_args

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class Branch:
    """Where one branch's heads sit in y: hq query heads from q_col, hk key heads from k_col, hv
    value heads from v_col (0: none, the index branch), each d wide."""

    q_col: int
    k_col: int
    v_col: int
    hq: int
    hk: int
    hv: int
    d: int


def norm_rope_supported(y: torch.Tensor, d: int, half: int) -> bool:
    return y.dtype in DTYPES and y.dim() == 2 and d >= 16 and d & (d - 1) == 0 and 2 * half <= d


def _cache_strides(cache: kq.PagedTensor, data: torch.Tensor, scales: torch.Tensor) -> tuple[int, ...]:
    if len(cache.shape) == 4:  # [pages, H, P, d]
        return (*data.stride()[:3], *scales.stride()[:3])
    return (data.stride(0), 0, data.stride(1), scales.stride(0), 0, scales.stride(1))  # index keys [pages, P, d]


def norm_rope_write(y: torch.Tensor, b: Branch, q_weight: torch.Tensor | None, k_weight: torch.Tensor | None,
                    eps: float, gemma: bool, cos: torch.Tensor, sin: torch.Tensor, slot_mapping: torch.Tensor,
                    k_cache: kq.PagedTensor, v_cache: kq.PagedTensor | None = None,
                    q_out: torch.Tensor | None = None) -> torch.Tensor:
    from m3bench.runtime.kernels.norm_rope_triton import _norm_rope_write_kernel

    half = cos.shape[-1]
    if not norm_rope_supported(y, b.d, half) or y.stride(-1) != 1:
        raise ValueError(f"norm_rope_write needs a [T, N] {DTYPES} row-contiguous input and a power-of-two "
                         f"head dim >= 16 with rotary <= head dim; got {tuple(y.shape)} {y.dtype}, d={b.d}")
    fmt = kq.kv_format_of(k_cache)
    if v_cache is not None and kq.kv_format_of(v_cache) is not fmt:
        raise ValueError("K and V caches must share one format")
    v_cache = k_cache if v_cache is None else v_cache
    kd, ks, kgs = cache_kernel_args(k_cache)
    vd, vs, vgs = cache_kernel_args(v_cache)
    n_tok = y.shape[0]
    q_out = y.new_empty((n_tok, b.hq, b.d)) if q_out is None else q_out
    norm = q_weight is not None
    cos, sin = cos.float().contiguous(), sin.float().contiguous()
    if n_tok:
        _norm_rope_write_kernel[(n_tok, b.hq + b.hk + b.hv)](
            y, q_out, q_weight if norm else y, k_weight if norm else y, cos, sin, slot_mapping,
            kd, ks, kgs, vd, vs, vgs, float(eps), b.q_col, b.k_col, b.v_col, y.stride(0),
            q_out.stride(0), q_out.stride(1), cos.stride(0),
            *_cache_strides(k_cache, kd, ks), *_cache_strides(v_cache, vd, vs),
            HQ=b.hq, HK=b.hk, D=b.d, HALF=half, PAGE=k_cache.shape[-2], NORM=norm, GEMMA=gemma,
            ROPE=half > 0, FMT=FMT_CODE[fmt], num_warps=1 if b.d <= 128 else 2,
        )
    return q_out
