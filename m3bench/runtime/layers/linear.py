"""Tensor-parallel linear layers and the `WeightSlot` each parameter is loaded through.

ColumnParallelLinear splits output rows (heads, intermediate) over the TP world and may fuse
several canonical tensors ("segments", e.g. q, k, v) into one GEMM; RowParallelLinear splits the
input dimension and sums the partial products with one all-reduce. Built under
`linear_format(LinearFormat.MXFP8)` (layers/weight_format.py) both keep `weight` float8_e4m3fn and
`weight_scale` uint8 E8M0 [out, in / 32] and run kernels.mxfp8.mxfp8_linear (Triton on CUDA). Plain
weights at up to `skinny_rows` rows on CUDA (decode) run kernels.skinny.skinny_linear (one launch, K split
in the kernel) instead of cuBLAS; `set_skinny_rows(model, 0)` turns that off (the torch reference path).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from m3bench.runtime.kernels.mxfp8 import mxfp8_linear
from m3bench.runtime.kernels.skinny import SKINNY_MAX_ROWS, skinny_linear, skinny_supported
from m3bench.runtime.layers.weight_format import current_linear_format, mx_params
from m3bench.runtime.parallel import SINGLE, TPGroup


@dataclass(frozen=True)
class WeightSlot:
    """One canonical tensor and where this rank keeps it: `target` is a view into a parameter."""

    name: str
    target: torch.Tensor
    shard_dim: int | None  # dimension of the canonical tensor split over TP; None = replicated
    split: tuple[int, int] | None = None  # (piece, pieces) when not (tp rank, tp world): duplicated heads
    scale: torch.Tensor | None = None  # MXFP8: E8M0 scales of `target` (uint8 [rows, cols / 32]); NVFP4: e4m3 [rows, cols / 16]
    scale_2: torch.Tensor | None = None  # NVFP4: fp32 global scale per row [rows] (target: packed uint8 [rows, cols / 2])


@dataclass(frozen=True)
class Segment:
    """A part of a fused column-parallel output: canonical name stem and full output size."""

    name: str
    size: int
    sharded: bool = True
    heads: int = 0  # > 0: split by these heads, duplicated when fewer than the world (TPGroup.head_split)

    def split(self, tp: TPGroup) -> tuple[int, int] | None:
        """(piece, pieces) of this segment on this rank; None when replicated."""
        if not self.sharded:
            return None
        return tp.head_split(self.heads, self.name) if self.heads else (tp.rank, tp.world)

    def local_size(self, tp: TPGroup) -> int:
        split = self.split(tp)
        if split is None:
            return self.size
        if self.size % split[1]:
            raise ValueError(f"{self.name} {self.size} does not split into {split[1]} pieces")
        return self.size // split[1]


def _param(shape: tuple[int, ...], dtype: torch.dtype, device) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)


def _weight(shape: tuple[int, int], dtype: torch.dtype, device) -> tuple[nn.Parameter, nn.Parameter | None]:
    """(weight, MXFP8 scale or None) in the current linear format."""
    if current_linear_format().linears_mxfp8:
        return mx_params(shape, device)
    return _param(shape, dtype, device), None


SKINNY_ROWS = SKINNY_MAX_ROWS  # a layer's default `skinny_rows`: on (CUDA only)


def linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None, bias=None,
           skinny_rows: int = 0, add: torch.Tensor | None = None) -> torch.Tensor:
    """x W^T (+ b) (+ add, in x's dtype), W plain or MXFP8 (with its scale); plain W at up to skinny_rows rows
    on CUDA through the skinny decode kernel (the add in its epilogue)."""
    if scale is not None:
        y = mxfp8_linear(x, weight, scale, bias)
    elif skinny_runs(x, weight, skinny_rows) and (bias is None or add is None):
        return skinny_linear(x, weight, bias, add=add)
    else:
        y = F.linear(x, weight, bias)
    return y if add is None else y + add


def skinny_runs(x: torch.Tensor, weight: torch.Tensor, skinny_rows: int) -> bool:
    """x W^T runs the skinny decode kernel: CUDA, few rows, a plain weight it takes."""
    return bool(skinny_rows) and x.is_cuda and skinny_supported(x, weight, skinny_rows)


def set_skinny_rows(model: nn.Module, rows: int) -> None:
    """Every layer of `model` that can run the skinny decode kernel does so up to `rows` rows (0: never)."""
    for module in model.modules():
        if hasattr(module, "skinny_rows"):
            module.skinny_rows = rows


class ColumnParallelLinear(nn.Module):
    """y = x W^T (+ b) with W's rows split over TP; fused segments come out in order."""

    def __init__(self, in_features: int, segments: tuple[Segment, ...], bias: bool, dtype: torch.dtype,
                 device, tp: TPGroup = SINGLE):
        super().__init__()
        self.segments, self.tp = segments, tp
        self.local_sizes = tuple(s.local_size(tp) for s in segments)
        out = sum(self.local_sizes)
        self.weight, self.weight_scale = _weight((out, in_features), dtype, device)
        self.bias = _param((out,), dtype, device) if bias else None
        self.skinny_rows = SKINNY_ROWS

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.weight_scale, self.bias, self.skinny_rows)

    def split(self, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return y.split(self.local_sizes, dim=-1)

    def slots(self, prefix: str) -> list[WeightSlot]:
        out, start = [], 0
        for seg, n in zip(self.segments, self.local_sizes):
            dim, split = (0, seg.split(self.tp)) if seg.sharded else (None, None)
            scale = None if self.weight_scale is None else self.weight_scale[start:start + n]
            out.append(WeightSlot(f"{prefix}{seg.name}.weight", self.weight[start:start + n], dim, split, scale))
            if self.bias is not None:
                out.append(WeightSlot(f"{prefix}{seg.name}.bias", self.bias[start:start + n], dim, split))
            start += n
        return out


class RowParallelLinear(nn.Module):
    """y = all_reduce(x_local W_local^T) (+ b); `reduce=False` leaves the partial sum to the caller."""

    def __init__(self, in_features: int, out_features: int, name: str, bias: bool, dtype: torch.dtype,
                 device, tp: TPGroup = SINGLE, reduce: bool = True):
        super().__init__()
        self.name = name
        self.tp = tp
        self.reduce = reduce
        self.weight, self.weight_scale = _weight((out_features, tp.shard_size(in_features, name)), dtype, device)
        self.bias = _param((out_features,), dtype, device) if bias else None
        self.skinny_rows = SKINNY_ROWS

    def forward(self, x: torch.Tensor, add: torch.Tensor | None = None) -> torch.Tensor:
        """add: a tensor [..., out] added to the result (in the GEMM's epilogue when it can: not reduced here)."""
        y = linear(x, self.weight, self.weight_scale, skinny_rows=self.skinny_rows,
                   add=None if self.reduce else add)
        if self.reduce:
            y = self.tp.all_reduce(y)
            if add is not None:
                y = y + add
        # the bias is added once, after the sum (by rank 0 only when the caller reduces later)
        if self.bias is not None and (self.reduce or self.tp.rank == 0):
            y = y + self.bias
        return y

    def slots(self, prefix: str) -> list[WeightSlot]:
        out = [WeightSlot(f"{prefix}{self.name}.weight", self.weight, 1, scale=self.weight_scale)]
        if self.bias is not None:
            out.append(WeightSlot(f"{prefix}{self.name}.bias", self.bias, None))
        return out
