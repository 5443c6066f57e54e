"""Gated activation of a fused gate|up projection in one Triton launch (the dense MLP, the unfused shared
expert) instead of torch's ~7 elementwise ops; the torch reference is layers.activation.split_gate_up.

    h = gated_act(gate_up, MoeActivation.SWIGLUOAI, alpha, limit)   # [T, 2I] -> [T, I]
"""

from __future__ import annotations

import math

import torch

from m3bench.runtime.kernels.backend import pdl_args
from m3bench.runtime.kernels.moe import ACT_CODE
from m3bench.runtime.kernels.reference import MoeActivation

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def gated_act_supported(gate_up: torch.Tensor) -> bool:
    return gate_up.dtype in DTYPES and gate_up.dim() == 2 and gate_up.shape[-1] % 2 == 0 and gate_up.stride(-1) == 1


def gated_act(gate_up: torch.Tensor, activation: MoeActivation, alpha: float, limit: float) -> torch.Tensor:
    from m3bench.runtime.kernels.gated_act_triton import gated_act_kernel

    if not gated_act_supported(gate_up):
        raise ValueError(f"gated_act needs a row-contiguous [T, 2I] {DTYPES} tensor, got {tuple(gate_up.shape)} "
                         f"{gate_up.dtype}")
    n_tok, inter = gate_up.shape[0], gate_up.shape[1] // 2
    out = gate_up.new_empty((n_tok, inter))
    block = 1024
    if n_tok:
        gated_act_kernel[(n_tok, math.ceil(inter / block))](
            gate_up, out, float(alpha), float(limit), gate_up.stride(0), out.stride(0), I=inter, BLOCK=block,
            ACT=ACT_CODE[activation], num_warps=4, **pdl_args(gate_up),
        )
    return out
