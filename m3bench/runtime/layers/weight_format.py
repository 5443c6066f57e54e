"""How the linear layers and routed experts of a model keep their weights: the model dtype, or MXFP8.

    with linear_format(LinearFormat.MXFP8):      # layers built inside hold fp8 weights + E8M0 scales
        layer = ColumnParallelLinear(...)
    w, s = mx_params((out, in_features), device)  # float8_e4m3fn [out, in], uint8 [out, in / 32]

MXFP8 (runtime/quant.py): `w = fp8 * 2**(scale - 127)`, one scale per 32 inputs of a row; NVFP4 experts
(NVFP4_EXPERTS): `w = e2m1 * e4m3 scale (per 16 inputs) * global` with one fp32 global per row. The model
picks the format (M3ForCausalLM(weights=...)); attention, MLP and MoE code need not know it: only
linear.py and moe.py read `current_linear_format()` when they allocate.

MXFP8 weights load row-major ([N, K], as stored) and are then laid out as `MX_LAYOUT` says
(`set_mx_layout`): BLOCK_MAJOR keeps each 32-wide input block of consecutive rows contiguous
(quant.block_major), so the kernels' per-block tile loads read whole lines; the kernels read either.
NVFP4 experts load packed (two E2M1 codes a byte, as stored) and are then held as `NV_CODES` says
(`set_nv_codes`): PACKED, run by the tile-dequantizing kernels (kernels/moe_quant.py), or E4M3, each code as the
e4m3 byte of its value (exact; twice the bytes), run by the first-generation kernels with 16-wide sub-dots and laid
out as MX_LAYOUT says (16-wide blocks).
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from enum import Enum
from typing import Iterator

import torch
from torch import nn

from m3bench.runtime import quant
from m3bench.runtime.errors import ConfigError
from m3bench.runtime.nv_codes import NvCodes, nv_codes


class LinearFormat(Enum):
    PLAIN = "plain"  # the model's dtype
    MXFP8 = "mxfp8"  # float8_e4m3fn weight + uint8 E8M0 scale per 32 inputs
    NVFP4_EXPERTS = "nvfp4-experts"  # routed experts NVFP4 (as the ModelOpt release), the other linears MXFP8

    @property
    def linears_mxfp8(self) -> bool:
        return self is not LinearFormat.PLAIN

    @property
    def experts_nvfp4(self) -> bool:
        return self is LinearFormat.NVFP4_EXPERTS


class MxLayout(Enum):
    """How MXFP8 weights sit in memory once loaded (the kernels read both; kernels/mx_linear.block_stride)."""

    ROW_MAJOR = "row-major"  # [..., N, K] as the checkpoint stores them
    BLOCK_MAJOR = "block-major"  # storage [..., K/32, N, 32], the view [..., N, K/32, 32] (quant.block_major)


# The process-wide choice. H200, one TP8/EP8 rank in MXFP8, 60 layers, 8k (benchmarks/mxfp8_gpu.py --steps-only,
# 2026-12-03): block-major steps B1 9.689 / B16 22.293 / B64 32.121 ms against row-major 10.946 / 26.062 / 37.414.
MX_LAYOUT = {"layout": MxLayout.BLOCK_MAJOR}
MX_WEIGHTS = (("weight", "weight_scale"), ("w_gate_up", "w_gate_up_scale"), ("w_down", "w_down_scale"))


NV_WEIGHTS = (("w_gate_up", "w_gate_up_scale", "w_gate_up_global"), ("w_down", "w_down_scale", "w_down_global"))


def set_nv_codes(model: nn.Module, codes: NvCodes, layout: MxLayout | None = None) -> int:
    """Hold every NVFP4 expert weight of the model's modules (NV_WEIGHTS: codes beside e4m3 scales and fp32
    globals) as `codes` (E4M3: laid out as `layout`, default MX_LAYOUT's, in 16-wide blocks), expert by expert,
    replacing its parameter; idempotent. Returns how many weights changed."""
    layout = layout or MX_LAYOUT["layout"]
    changed = 0
    for mod in model.modules():
        for w_name, s_name, g_name in NV_WEIGHTS:
            w, s = getattr(mod, w_name, None), getattr(mod, s_name, None)
            if getattr(mod, g_name, None) is None or not isinstance(w, torch.Tensor):
                continue
            if _nv_held(w, s, layout) is codes:
                continue
            data = torch.stack([_nv_expert(w.data[e], s.dim() - 1, codes) for e in range(w.shape[0])])
            if codes is NvCodes.E4M3 and layout is MxLayout.BLOCK_MAJOR:  # the stack of views is row-major again
                data = quant.block_major(data, quant.NV_BLOCK)
            setattr(mod, w_name, nn.Parameter(data, requires_grad=False))
            changed += 1
    return changed


def _nv_held(w: torch.Tensor, s: torch.Tensor, layout: MxLayout) -> NvCodes | None:
    """How stacked expert codes w are held: PACKED, E4M3 in `layout`, or None (E4M3 in the other layout)."""
    if w.dtype == torch.uint8:
        return NvCodes.PACKED
    return NvCodes.E4M3 if _laid_out(w, s, layout) else None


def _laid_out(w: torch.Tensor, s: torch.Tensor, layout: MxLayout) -> bool:
    """Whether a weight beside its block scales s sits in `layout` (block-major views have one more dim)."""
    return (w.dim() == s.dim() + 1) == (layout is MxLayout.BLOCK_MAJOR)


def _nv_expert(w: torch.Tensor, dims: int, codes: NvCodes) -> torch.Tensor:
    """One expert's codes ([R, K/2] packed, or e4m3 [R, K] / its block-major view) as `codes`, row-major."""
    if w.dtype == torch.uint8:
        return quant.e2m1_as_e4m3(w) if codes is NvCodes.E4M3 else w
    rows = quant.row_major(w) if w.dim() == dims + 1 else w
    return rows if codes is NvCodes.E4M3 else quant.e4m3_as_e2m1(rows)


def set_mx_layout(model: nn.Module, layout: MxLayout) -> int:
    """Lay every MXFP8 weight of the model's modules (MX_WEIGHTS: a float8_e4m3fn weight beside its E8M0 scale)
    out as `layout`, replacing its parameter; idempotent. Returns how many weights moved."""
    moved = 0
    for mod in model.modules():
        for w_name, s_name in MX_WEIGHTS:
            w, s = getattr(mod, w_name, None), getattr(mod, s_name, None)
            if not isinstance(w, torch.Tensor) or s is None or w.dtype != torch.float8_e4m3fn:
                continue
            if getattr(mod, f"{w_name}_global", None) is not None:  # NVFP4 codes held as e4m3: set_nv_codes
                continue
            if _laid_out(w, s, layout):
                continue
            data = quant.block_major(w.data) if layout is MxLayout.BLOCK_MAJOR else quant.row_major(w.data)
            setattr(mod, w_name, nn.Parameter(data, requires_grad=False))
            moved += 1
    return moved


@contextmanager
def mx_loading(model: nn.Module) -> Iterator[None]:
    """Loading fills row-major MXFP8 weights and packed NVFP4 experts; afterwards they take the process's MX_LAYOUT
    and NV_CODES."""
    set_mx_layout(model, MxLayout.ROW_MAJOR)
    set_nv_codes(model, NvCodes.PACKED)
    yield
    set_mx_layout(model, MX_LAYOUT["layout"])
    set_nv_codes(model, nv_codes())


_FORMAT: ContextVar[LinearFormat] = ContextVar("linear_format", default=LinearFormat.PLAIN)


@contextmanager
def linear_format(fmt: LinearFormat) -> Iterator[None]:
    token = _FORMAT.set(fmt)
    try:
        yield
    finally:
        _FORMAT.reset(token)


def current_linear_format() -> LinearFormat:
    return _FORMAT.get()


def mx_params(shape: tuple[int, ...], device) -> tuple[nn.Parameter, nn.Parameter]:
    """(fp8 weight [..., K], uint8 scale [..., K / 32]) parameters, K a multiple of 32."""
    *lead, k = shape
    if k % quant.MX_BLOCK:
        raise ConfigError(f"MXFP8 weights need a multiple of {quant.MX_BLOCK} inputs per rank, got a {tuple(shape)} "
                          "weight (use --weights-dtype bfloat16, or another --tp)")
    w = nn.Parameter(torch.empty(shape, dtype=torch.float8_e4m3fn, device=device), requires_grad=False)
    s = nn.Parameter(torch.empty((*lead, k // quant.MX_BLOCK), dtype=torch.uint8, device=device), requires_grad=False)
    return w, s


def nv_params(shape: tuple[int, int, int], device) -> tuple[nn.Parameter, nn.Parameter, nn.Parameter]:
    """Stacked NVFP4 experts [E, R, K]: (packed uint8 [E, R, K/2], e4m3 scale [E, R, K/16], fp32 global [E, R])."""
    e, r, k = shape
    if k % quant.NV_BLOCK:
        raise ConfigError(f"NVFP4 experts need a multiple of {quant.NV_BLOCK} inputs, got a {tuple(shape)} weight "
                          "(use --weights-dtype bfloat16)")
    def param(s, dt):  # noqa: E306
        return nn.Parameter(torch.empty(s, dtype=dt, device=device), requires_grad=False)
    return (param((e, r, k // 2), torch.uint8), param((e, r, k // quant.NV_BLOCK), torch.float8_e4m3fn),
            param((e, r), torch.float32))


def fill_nvfp4(target: torch.Tensor, scale: torch.Tensor, scale_2: torch.Tensor, w: torch.Tensor) -> None:
    """Quantize w [R, K] into packed target [R, K/2], its e4m3 scale and its per-row global scale."""
    data, s, g = quant.quant_nvfp4(w)
    target.copy_(data)
    scale.copy_(s)
    scale_2.copy_(g.expand(scale_2.shape))


def fill_mxfp8(target: torch.Tensor, scale: torch.Tensor, w: torch.Tensor) -> None:
    """Quantize w (any float dtype, target's shape) into the fp8 target and its scale."""
    data, s = quant.quant_mxfp8(w)
    target.copy_(data)
    scale.copy_(s)
