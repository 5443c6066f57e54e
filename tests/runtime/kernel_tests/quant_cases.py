"""Random MXFP8 / NVFP4 weights shared by the quantized-kernel tests (fresh random data, never zeros)."""

from __future__ import annotations

import torch

from m3bench.runtime import quant


def mx_random(g: torch.Generator, *shape: int, spread: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8 (fp8, E8M0) of random weights whose rows' scales spread over 2 * spread exponents."""
    w = torch.randn(*shape, generator=g) * torch.exp2(
        torch.randint(-spread, spread, (*shape[:-1], 1), generator=g).float())
    return quant.quant_mxfp8(w)


def nv_random_experts(g: torch.Generator, n_exp: int, rows: int, cols: int):
    """Stacked NVFP4 experts (packed, e4m3 scales, fp32 global per row [E, rows]), a different global scale
    per expert, as the layer keeps them."""
    parts = [quant.quant_nvfp4(torch.randn(rows, cols, generator=g) * (e + 1)) for e in range(n_exp)]
    glob = torch.stack([p[2].expand(rows) for p in parts]).contiguous()
    return torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts]), glob
