"""KV-cache quantization formats in plain torch: FP8 e4m3 (unscaled cast) and NVFP4.

NVFP4 layout (last dim d, a multiple of 16):
  data   uint8            [..., d/2]   two E2M1 codes a byte, element 2i in the low nibble
  scales float8_e4m3fn    [..., d/16]  one scale per 16 consecutive elements
  global_scale fp32 scalar             x ~= e2m1(code) * float(scale) * global_scale
E2M1 code: bit 3 sign, bits 0-2 index into E2M1_VALUES.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch

FP8_MAX = 448.0
E2M1_MAX = 6.0
NVFP4_BLOCK = 16
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Midpoints between neighbouring E2M1 magnitudes, and whether a tie rounds up
# (round half to even code: ties between codes k and k+1 go to the even one).
_E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_TIE_ROUNDS_UP = (False, True, False, True, False, True, False)


def e2m1_table(device=None, dtype=torch.float32) -> torch.Tensor:
    """The 16 values of the E2M1 codes 0..15 (codes 8..15 are the negatives)."""
    mags = torch.tensor(E2M1_VALUES, dtype=dtype, device=device)
    return torch.cat([mags, -mags])


def quantize_fp8(x: torch.Tensor) -> torch.Tensor:
    """Unscaled cast to float8_e4m3fn, saturating to +-448 (NaN stays NaN)."""
    return x.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def dequantize_fp8(x: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """float8_e4m3fn -> dtype (exact: every e4m3 value is representable in bf16/fp32)."""
    return x.to(dtype)


def nvfp4_global_scale(amax: torch.Tensor | float) -> torch.Tensor:
    """fp32 global scale that maps a tensor amax onto the largest block scale (448 * 6)."""
    amax = torch.as_tensor(amax, dtype=torch.float32)
    return (amax / (FP8_MAX * E2M1_MAX)).clamp_min(torch.finfo(torch.float32).tiny)


def _e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """Nearest E2M1 code (uint8 0..15) of each fp32 value already scaled to [-6, 6]."""
    mag = x.abs().clamp(max=E2M1_MAX)
    idx = torch.zeros_like(mag, dtype=torch.uint8)
    for mid, up in zip(_E2M1_MIDPOINTS, _TIE_ROUNDS_UP):
        idx += (mag >= mid if up else mag > mid).to(torch.uint8)
    return idx | ((x < 0) & (idx > 0)).to(torch.uint8) << 3


def nvfp4_block_scales(x: torch.Tensor, global_scale: torch.Tensor | float) -> torch.Tensor:
    """e4m3 scale of each 16-element block: amax / 6 / global_scale, saturated, rounded."""
    blocks = x.float().unflatten(-1, (-1, NVFP4_BLOCK))
    gs = torch.as_tensor(global_scale, dtype=torch.float32, device=x.device)
    raw = blocks.abs().amax(dim=-1) / E2M1_MAX / gs
    return raw.clamp(max=FP8_MAX).to(torch.float8_e4m3fn)


def quantize_nvfp4(
    x: torch.Tensor, global_scale: torch.Tensor | float
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., d] -> (data uint8 [..., d/2], scales float8_e4m3fn [..., d/16])."""
    if x.shape[-1] % NVFP4_BLOCK:
        raise ValueError(f"NVFP4 needs the last dim to be a multiple of 16, got {x.shape[-1]}")
    scales = nvfp4_block_scales(x, global_scale)
    gs = torch.as_tensor(global_scale, dtype=torch.float32, device=x.device)
    step = (scales.float() * gs).unsqueeze(-1)
    blocks = x.float().unflatten(-1, (-1, NVFP4_BLOCK))
    scaled = torch.where(step > 0, blocks / torch.where(step > 0, step, 1.0), 0.0)
    codes = _e2m1_codes(scaled).flatten(-2)
    data = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return data, scales


def unpack_e2m1(data: torch.Tensor) -> torch.Tensor:
    """uint8 [..., d/2] -> E2M1 codes uint8 [..., d], low nibble first."""
    return torch.stack([data & 0xF, data >> 4], dim=-1).flatten(-2)


def dequantize_nvfp4(
    data: torch.Tensor,
    scales: torch.Tensor,
    global_scale: torch.Tensor | float,
    dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """(data [..., d/2], scales [..., d/16], global scale) -> dtype [..., d]."""
    values = e2m1_table(data.device)[unpack_e2m1(data).long()]
    gs = torch.as_tensor(global_scale, dtype=torch.float32, device=data.device)
    step = scales.float().unsqueeze(-1) * gs
    out = values.unflatten(-1, (-1, NVFP4_BLOCK)) * step
    return out.flatten(-2).to(dtype)


class KVFormat(Enum):
    """How a paged K / V / index-key cache stores its values."""

    PLAIN = "plain"  # bf16 / fp16 / fp32, used as is
    FP8 = "fp8"  # float8_e4m3fn, unscaled
    NVFP4 = "nvfp4"  # Nvfp4Pages


@dataclass(frozen=True)
class Nvfp4Pages:
    """An NVFP4 paged cache: data [..., d/2] uint8, scales [..., d/16] e4m3, fp32 global scale.

    `global_scale` is a 1-element fp32 tensor on the cache's device (kernels read it there, so
    nothing is read on the host) or a Python float.
    """

    data: torch.Tensor
    scales: torch.Tensor
    global_scale: torch.Tensor | float

    @property
    def head_dim(self) -> int:
        return self.data.shape[-1] * 2

    @property
    def shape(self) -> tuple[int, ...]:
        return (*self.data.shape[:-1], self.head_dim)

    @property
    def device(self) -> torch.device:
        return self.data.device


PagedTensor = torch.Tensor | Nvfp4Pages  # what a K / V / index-key cache argument may be


def kv_format_of(cache: PagedTensor) -> KVFormat:
    """The storage format of a cache tensor (NVFP4 caches are Nvfp4Pages)."""
    if isinstance(cache, Nvfp4Pages):
        return KVFormat.NVFP4
    if cache.dtype == torch.float8_e4m3fn:
        return KVFormat.FP8
    if cache.dtype in (torch.bfloat16, torch.float16, torch.float32, torch.float64):
        return KVFormat.PLAIN
    raise TypeError(f"unsupported KV cache dtype {cache.dtype}")


def dequantize_pages(cache: PagedTensor, dtype: torch.dtype) -> torch.Tensor:
    """Any paged cache (or a slice of one) as a dtype tensor [..., d]."""
    fmt = kv_format_of(cache)
    if fmt is KVFormat.NVFP4:
        return dequantize_nvfp4(cache.data, cache.scales, cache.global_scale, dtype)
    return cache.to(dtype)


def index_pages(cache: PagedTensor, index) -> PagedTensor:
    """cache[index] for either kind of cache (NVFP4 indexes data and scales alike)."""
    if isinstance(cache, Nvfp4Pages):
        return Nvfp4Pages(cache.data[index], cache.scales[index], cache.global_scale)
    return cache[index]
