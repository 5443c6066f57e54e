"""Dense gated MLP: fused column-parallel gate|up, activation, row-parallel down; the activation runs as one
Triton launch (kernels.gated_act) when the caller's kernel backend picks Triton and `fuse_act` is on."""

from __future__ import annotations

import torch
from torch import nn

from m3bench.runtime.config import Activation
from m3bench.runtime.kernels.backend import KernelBackend, use_triton
from m3bench.runtime.kernels.gated_act import gated_act, gated_act_supported
from m3bench.runtime.kernels.reference import MoeActivation
from m3bench.runtime.layers.activation import split_gate_up
from m3bench.runtime.layers.linear import ColumnParallelLinear, RowParallelLinear, Segment, WeightSlot
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

    def forward(self, x: torch.Tensor, backend: KernelBackend = KernelBackend.TORCH) -> torch.Tensor:
        gu = self.gate_up(x)
        if self.fuse_act and use_triton(backend, gu) and gated_act_supported(gu):
            return self.down(gated_act(gu, MoeActivation(self.act.value), self.alpha, self.limit))
        return self.down(split_gate_up(gu, self.act, self.alpha, self.limit))

    def slots(self, prefix: str) -> list[WeightSlot]:
        return self.gate_up.slots(prefix) + self.down.slots(prefix)
