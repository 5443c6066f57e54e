"""Triton residual add + RMSNorm: h = r + x (rounded to the stream's dtype, as torch's add), then
y = h * rsqrt(mean(h^2) + eps) * (1 + w) (Gemma) or * w (plain), in fp32, cast back.

Grid (T,): one program per row, the whole hidden dim (BLOCK a power of two >= H) in registers.
COPY32 also stores y (as rounded) widened to fp32 (the MoE router's input).
The MoE variant takes x as a fused MoE's partials (kernels/moe_sum.py) and sums them first, as the MoE's sum kernel
would have (fp32, stored in the stream's dtype): the same bits, one launch fewer.
"""

import triton
import triton.language as tl

from m3bench.runtime.kernels.moe_triton import moe_partials_sum
from m3bench.runtime.kernels.pdl_triton import pdl_wait
from m3bench.runtime.kernels.round_triton import round_for


@triton.jit
def _add_norm_row(r, x, row, cols, ok, w_ptr, h_ptr, y_ptr, y32_ptr, eps, s_h, s_y, s_y32,
                  H: tl.constexpr, GEMMA: tl.constexpr, COPY32: tl.constexpr):
    """Stores h = r + x (fp32 sum rounded to h's dtype) and y = norm(h) (and y widened with COPY32) at row."""
    hf = round_for(r.to(tl.float32) + x.to(tl.float32), h_ptr.dtype.element_ty)
    tl.store(h_ptr + row * s_h + cols, hf.to(h_ptr.dtype.element_ty), mask=ok)
    rstd = 1.0 / tl.sqrt(tl.sum(hf * hf, axis=0) / H + eps)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    if GEMMA:
        w = 1.0 + w
    y = round_for(hf * rstd * w, y_ptr.dtype.element_ty)
    tl.store(y_ptr + row * s_y + cols, y.to(y_ptr.dtype.element_ty), mask=ok)
    if COPY32:  # y as stored, widened: the fp32 router's input without a cast launch
        tl.store(y32_ptr + row * s_y32 + cols, y.to(y_ptr.dtype.element_ty).to(tl.float32), mask=ok)


@triton.jit
def add_rms_norm_kernel(
    r_ptr, x_ptr, w_ptr, h_ptr, y_ptr, y32_ptr, eps, s_r, s_x, s_h, s_y, s_y32,
    H: tl.constexpr, BLOCK: tl.constexpr, GEMMA: tl.constexpr, COPY32: tl.constexpr, PDL: tl.constexpr,
):
    pdl_wait(PDL)  # first: nothing global before it (pdl_triton)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < H
    r = tl.load(r_ptr + row * s_r + cols, mask=ok, other=0.0)
    x = tl.load(x_ptr + row * s_x + cols, mask=ok, other=0.0)
    _add_norm_row(r, x, row, cols, ok, w_ptr, h_ptr, y_ptr, y32_ptr, eps, s_h, s_y, s_y32, H, GEMMA, COPY32)


@triton.jit(do_not_specialize=["n_routed"])
def moe_sum_add_rms_norm_kernel(
    r_ptr, p_ptr, ids_ptr, a_ptr, w_ptr, h_ptr, y_ptr, y32_ptr, eps, s_r, s_pp, s_ps, s_a, s_h, s_y, s_y32, n_routed,
    E: tl.constexpr, TOPK: tl.constexpr, CHUNKS: tl.constexpr, SHARED: tl.constexpr, ADD: tl.constexpr,
    H: tl.constexpr, BLOCK: tl.constexpr, GEMMA: tl.constexpr, COPY32: tl.constexpr, PDL: tl.constexpr,
):
    """add_rms_norm_kernel with x = the MoE's result: moe_partials_sum over its partials p [CHUNKS, rows, H] (local ids,
    the shared expert's rows, the addend a), rounded to the stream's dtype as the MoE's sum kernel stores it."""
    pdl_wait(PDL)  # first: nothing global before it (pdl_triton)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < H
    r = tl.load(r_ptr + row * s_r + cols, mask=ok, other=0.0)
    x = moe_partials_sum(p_ptr, ids_ptr, a_ptr, row, cols, s_pp, s_ps, s_a, n_routed, E, H, TOPK, CHUNKS, SHARED, ADD,
                         BLOCK).to(h_ptr.dtype.element_ty)
    _add_norm_row(r, x, row, cols, ok, w_ptr, h_ptr, y_ptr, y32_ptr, eps, s_h, s_y, s_y32, H, GEMMA, COPY32)
