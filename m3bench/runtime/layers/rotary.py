"""Partial NeoX rotary embedding: the first `rotary_dim` dims of a head rotate, pairs i and i + r/2.

`inv_freq = theta^(-arange(0, r, 2) / r)` (optionally Llama-3 scaled); the angle table is computed
in fp32 from the positions, as every public implementation does, and applied in fp32 (fp64 for
fp64 tensors).
"""

from __future__ import annotations

import math

import torch

from m3bench.runtime.config import RopeScaling
from m3bench.runtime.layers.norm import compute_dtype


def inv_frequencies(rotary_dim: int, theta: float, scaling: RopeScaling | None) -> torch.Tensor:
    """[rotary_dim / 2] fp32 inverse frequencies."""
    inv = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim))
    return inv if scaling is None else llama3_scale(inv, scaling)


def llama3_scale(inv: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    """Llama-3 scaling: long wavelengths divided by `factor`, short kept, a smooth ramp between."""
    old = s.original_max_position_embeddings
    low_wavelen = old / s.low_freq_factor
    high_wavelen = old / s.high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / s.factor, inv)
    smooth = (old / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


class RotaryEmbedding:
    """Holds inv_freq on the model's device; `cos_sin(positions)` once per forward, `apply` per tensor."""

    def __init__(self, rotary_dim: int, theta: float, scaling: RopeScaling | None, device: torch.device | str):
        self.rotary_dim = rotary_dim
        self.inv_freq = inv_frequencies(rotary_dim, theta, scaling).to(device)

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T] -> (cos, sin), each [T, rotary_dim / 2] fp32."""
        angles = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, d] (or [T, d]); rotates dims [0, r) with r = 2 * cos.shape[-1], keeps the rest."""
    half = cos.shape[-1]
    ct = compute_dtype(x.dtype)
    if x.dim() == 3:
        cos, sin = cos[:, None, :], sin[:, None, :]
    cos, sin = cos.to(ct), sin.to(ct)
    x1 = x[..., :half].to(ct)
    x2 = x[..., half:2 * half].to(ct)
    rot = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)
    return torch.cat((rot, x[..., 2 * half:]), dim=-1)
