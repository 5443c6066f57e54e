"""Block scales of quantized expert weights, an input of the fused MoE (kernels/moe.py, moe_quant.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from m3bench.runtime import quant


@dataclass(frozen=True)
class MoeScales:
    """Block scales of quantized expert weights (views into stacked tensors work, as for the weights):
    E8M0 for MXFP8; e4m3 plus per-row fp32 globals for NVFP4. With scales, fused_moe runs the generation
    `kernels/quant_kernels.py` picks (V1: moe_triton.py, MXFP8's default; V2: moe_quant.py, NVFP4's) unless
    its tiles name one (`MoeTiles` V1, `QuantMoeTiles` V2)."""

    gate: torch.Tensor
    up: torch.Tensor
    down: torch.Tensor
    gate_global: torch.Tensor | None = None  # NVFP4 only
    up_global: torch.Tensor | None = None
    down_global: torch.Tensor | None = None

    @property
    def nvfp4(self) -> bool:
        return self.gate_global is not None

    def dequantized(self, w_gate, w_up, w_down, dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.nvfp4:
            return (quant.dequant_nvfp4(w_gate, self.gate, self.gate_global, dtype),
                    quant.dequant_nvfp4(w_up, self.up, self.up_global, dtype),
                    quant.dequant_nvfp4(w_down, self.down, self.down_global, dtype))
        return (quant.dequant_mxfp8(w_gate, self.gate, dtype), quant.dequant_mxfp8(w_up, self.up, dtype),
                quant.dequant_mxfp8(w_down, self.down, dtype))
