"""A fused MoE's last step, the sum of its picks: launched on its own, or left to the residual add + norm after it.

    s = fused_moe(..., defer_sum=True)     # MoeSum: the down GEMM's fp32 partials, not yet summed
    y = summed(s)                          # the sum kernel's launch: [T, H] in the MoE's dtype (a tensor passes)
    h, x = add_rms_norm_fused(r, s, ...)   # kernels/add_norm.py: summed inside the add + norm's launch, same bits

The sum (moe_triton.moe_partials_sum): for each token, its picks of local experts over the down GEMM's K chunks, the
shared expert's row when inside, then `add` (fp32, in that order), stored in the MoE's dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Callable

import torch

from m3bench.runtime.kernels.backend import next_pow2, pdl_args


@dataclass(frozen=True)
class MoeSum:
    """y [chunks, rows, H] fp32: the down GEMM's rows (token t's pick k at t * top_k + k, the shared expert's rows after
    the routed ones when `shared`); ids [T * top_k] the picks' local expert ids (outside [0, n_exp): another rank's);
    add: [T, H] in dtype, or a callable giving it (called once, right before the launch that sums)."""

    y: torch.Tensor
    ids: torch.Tensor
    n_exp: int
    top_k: int
    shared: bool
    add: torch.Tensor | Callable[[], torch.Tensor] | None
    dtype: torch.dtype

    @property
    def shape(self) -> tuple[int, int]:
        return self.ids.numel() // self.top_k, self.y.shape[2]

    @cached_property
    def addend(self) -> torch.Tensor | None:
        add = self.add() if callable(self.add) else self.add
        if add is not None and (tuple(add.shape) != self.shape or add.stride(-1) != 1):
            raise ValueError(f"fused_moe: add must be a {self.shape} tensor contiguous in its last dim")
        return add

    def ended(self, defer: bool, out: torch.Tensor | None) -> torch.Tensor | MoeSum:
        """A fused MoE's result: itself, unsummed (defer, no out given), or the sum kernel's launch (into out)."""
        return self if defer and out is None else self.summed(out)

    def summed(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """The sum kernel's launch: [T, H] in dtype (into out when given)."""
        from m3bench.runtime.kernels.moe_triton import moe_sum_kernel

        add = self.addend
        out = self.y.new_empty(self.shape, dtype=self.dtype) if out is None else out
        block_n = min(1024, next_pow2(out.shape[1]))
        grid = (out.shape[0], math.ceil(out.shape[1] / block_n))
        moe_sum_kernel[grid](self.y, self.ids, out, out if add is None else add, self.y.stride(1), self.y.stride(0),
                             out.stride(0), 0 if add is None else add.stride(0), self.ids.numel(), E=self.n_exp,
                             H=out.shape[1], TOPK=self.top_k, CHUNKS=self.y.shape[0], BLOCK_N=block_n,
                             SHARED=self.shared, ADD=add is not None, num_warps=4, **pdl_args(out))
        return out


def summed(delta: torch.Tensor | MoeSum) -> torch.Tensor:
    """A layer's output as a tensor: a MoeSum's sum launched, a tensor as it is."""
    return delta.summed() if isinstance(delta, MoeSum) else delta
