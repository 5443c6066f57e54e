"""Write K / V / index-key rows into a paged cache, quantizing on the way (one launch on CUDA).

    write_pages(cache, x, slot_mapping)   # cache: k_cache / v_cache / ik_cache (PagedTensor)

x [T, Hkv, d] for K / V caches [pages, Hkv, P, d], or [T, d] for index keys [pages, P, d];
slot_mapping [T] int = page * P + offset (negative: padding, skipped). NVFP4 caches
(Nvfp4Pages) get their codes and per-16 scales from the cache's global scale. The torch path
(CPU) is kv_quant's functions plus an indexed store: both store the same bytes.
"""

from __future__ import annotations

import torch

from m3bench.runtime.kernels import kv_quant as kq
from m3bench.runtime.kernels.backend import (
    FMT_CODE,
    KernelBackend,
    cache_kernel_args,
    pdl_args,
    use_triton,
)


def write_pages(cache: kq.PagedTensor, x: torch.Tensor, slot_mapping: torch.Tensor,
                backend: KernelBackend = KernelBackend.AUTO) -> None:
    """Store x's rows at their slots (quantized to the cache's format)."""
    if use_triton(backend, x):
        _launch_write(cache, x, slot_mapping)
    else:
        write_pages_ref(cache, x, slot_mapping)


def write_pages_ref(cache: kq.PagedTensor, x: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """The torch writer (reference and CPU path)."""
    page_size = cache.shape[-2]
    keep = slot_mapping >= 0
    x, slots = x[keep], slot_mapping[keep].long()
    index = (slots // page_size, slice(None), slots % page_size) if len(cache.shape) == 4 else (
        slots // page_size, slots % page_size)
    fmt = kq.kv_format_of(cache)
    if fmt is kq.KVFormat.NVFP4:
        data, scales = kq.quantize_nvfp4(x, cache.global_scale)
        cache.data[index] = data
        cache.scales[index] = scales
    elif fmt is kq.KVFormat.FP8:
        cache[index] = kq.quantize_fp8(x)
    else:
        cache[index] = x.to(cache.dtype)


def _launch_write(cache: kq.PagedTensor, x: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    from m3bench.runtime.kernels.kv_write_triton import kv_write_kernel

    data, scales, gs = cache_kernel_args(cache)
    per_head = len(cache.shape) == 4  # [pages, Hkv, P, d] vs index keys [pages, P, d]
    x3 = x if per_head else x.unsqueeze(1)
    if x3.stride(-1) != 1 or data.stride(-1) != 1:
        raise ValueError("x and the cache must be contiguous in their last dim")
    d_strides = data.stride()[:3] if per_head else (data.stride(0), 0, data.stride(1))
    s_strides = scales.stride()[:3] if per_head else (scales.stride(0), 0, scales.stride(1))
    kv_write_kernel[(x3.shape[0], x3.shape[1])](
        x3, slot_mapping, data, scales, gs, x3.stride(0), x3.stride(1), *d_strides, *s_strides,
        PAGE=cache.shape[-2], D=cache.shape[-1], FMT=FMT_CODE[kq.kv_format_of(cache)], num_warps=1,
        **pdl_args(x),
    )
