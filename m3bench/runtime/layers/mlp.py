"""Dense gated MLP: fused column-parallel gate|up, activation, row-parallel down; the activation runs as one
Triton launch (kernels.gated_act) when the caller's kernel backend picks Triton and `fuse_act` is on, or inside
the gate|up GEMM when that runs the skinny decode kernel (kernels.skinny, few rows on CUDA)."""

from __future__ import annotations

import torch
from torch import nn

from m3bench.runtime.config import Activation
from m3bench.runtime.kernels.backend import KernelBackend, use_triton
from m3bench.runtime.kernels.gated_act import gated_act, gated_act_supported
from m3bench.runtime.kernels.reference import MoeActivation
from m3bench.runtime.kernels.skinny import Gate, skinny_linear
from m3bench.runtime.layers.activation import split_gate_up
from m3bench.runtime.layers.linear import ColumnParallelLinear, RowParallelLinear, Segment, WeightSlot, skinny_runs
from m3bench.runtime.parallel import SINGLE, TPGroup


class GatedMLP(nn.Module):
    """down(act(gate(x), up(x))); also the MoE's shared expert (`reduce=False` there)."""

    def __init__(self, hidden: int, intermediate: int, act: Activation, alpha: float, limit: float,
                 dtype: torch.dtype, device, tp: TPGroup = SINGLE, reduce: bool = True):
        super().__init__()
        self.act, self.alpha, self.limit = act, alpha, limit
        segs = (Segment("gate_proj", intermediate), Segment("up_proj", intermediate))
        self.gate_up = ColumnParallelLinear(hidden, segs, False, dtype, device, tp)
        self.down = RowParallelLinear(intermediate, hidden, "down_proj", False, dtype, device, tp, reduce)
        self.fuse_act = True  # with a Triton kernel backend: the activation in one launch

    def forward(self, x: torch.Tensor, backend: KernelBackend = KernelBackend.TORCH,
                add: torch.Tensor | None = None) -> torch.Tensor:
        """down(act(gate, up)) (+ add [..., hidden], in the down GEMM's epilogue when it can)."""
        return self.down(self.activated(x, backend), add=add)

    def activated(self, x: torch.Tensor, backend: KernelBackend) -> torch.Tensor:
        gu_layer = self.gate_up
        if (self.fuse_act and use_triton(backend, x) and gu_layer.weight_scale is None and gu_layer.bias is None
                and skinny_runs(x, gu_layer.weight, gu_layer.skinny_rows)):
            return skinny_linear(x, gu_layer.weight, gate=Gate(MoeActivation(self.act.value), self.alpha, self.limit))
        gu = gu_layer(x)
        if self.fuse_act and use_triton(backend, gu) and gated_act_supported(gu):
            return gated_act(gu, MoeActivation(self.act.value), self.alpha, self.limit)
        return split_gate_up(gu, self.act, self.alpha, self.limit)

    def slots(self, prefix: str) -> list[WeightSlot]:
        return self.gate_up.slots(prefix) + self.down.slots(prefix)
