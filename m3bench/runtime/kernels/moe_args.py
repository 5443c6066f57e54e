"""Kernel arguments that both fused-MoE launchers build alike: the first generation's (kernels/moe.py) and the
one-token GEMVs' (kernels/moe_gemv.py). Below both, so neither imports the other for them."""

from __future__ import annotations

import math

import torch


def check_weights(*ws: torch.Tensor) -> None:
    for w in ws:
        if w.stride(-1) != 1:
            raise ValueError("expert weights must be contiguous along their last (reduction) dim")


def scale_args(s: torch.Tensor | None, w: torch.Tensor) -> tuple:
    """(scale tensor, expert stride, row stride) for the kernel: e4m3 scales as they are (NVFP4), E8M0 as uint8
    (MXFP8); the weight itself as a dummy for plain experts."""
    if s is None:
        return w, 0, 0
    check_weights(s)
    return (s if s.dtype == torch.float8_e4m3fn else s.view(torch.uint8)), s.stride(0), s.stride(1)


def global_args(g: torch.Tensor | None, w: torch.Tensor) -> tuple:
    """(per-row global scales [E, rows], expert stride) for the kernel (NVFP4); a dummy otherwise."""
    if g is None:
        return w, 0
    if g.stride(-1) != 1:
        raise ValueError("NVFP4 global scales must be contiguous along their rows")
    return g, g.stride(0)


def down_chunks(n_inter: int, split_down: int, block_k: int) -> tuple[int, int]:
    """(chunks, inputs a chunk) of the down GEMM's reduction over n_inter: at most split_down chunks of whole
    BLOCK_K steps, the last one shorter; (1, 0) unsplit."""
    if split_down <= 1:
        return 1, 0
    k_chunk = math.ceil(n_inter / split_down / block_k) * block_k
    return math.ceil(n_inter / k_chunk), k_chunk
