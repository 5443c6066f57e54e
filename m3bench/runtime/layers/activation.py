"""Gated activations: `act(gate, up)` for the two families (SwiGLU-OAI for M3, SiLU for Llama/Qwen)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from m3bench.runtime.config import Activation


def swigluoai(gate: torch.Tensor, up: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """g = gate.clamp(max=limit); u = up.clamp(-limit, limit); g * sigmoid(alpha g) * (u + 1)."""
    g = gate.clamp(max=limit)
    u = up.clamp(min=-limit, max=limit)
    return g * torch.sigmoid(alpha * g) * (u + 1.0)


def silu_and_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


def gated_activation(kind: Activation, gate: torch.Tensor, up: torch.Tensor, alpha: float,
                     limit: float) -> torch.Tensor:
    if kind is Activation.SWIGLUOAI:
        return swigluoai(gate, up, alpha, limit)
    return silu_and_mul(gate, up)


def split_gate_up(gate_up: torch.Tensor, kind: Activation, alpha: float, limit: float) -> torch.Tensor:
    """[..., 2I] with gate first, then up -> act [..., I]."""
    gate, up = gate_up.chunk(2, dim=-1)
    return gated_activation(kind, gate, up, alpha, limit)
