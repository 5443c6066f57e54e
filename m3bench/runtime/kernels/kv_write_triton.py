"""Triton KV write: quantize K / V / index-key rows and scatter them into their paged slots.

Grid (T, H): one program per token and head. The arithmetic mirrors kv_quant.py bit for bit
(IEEE divisions, round-to-nearest-even e4m3 casts, the same E2M1 midpoints and tie rules), so
the Triton and torch writers store identical bytes. Slots < 0 (padding tokens) are skipped.
"""

import triton
import triton.language as tl

from m3bench.runtime.kernels.pdl_triton import pdl_wait
from m3bench.runtime.kernels.round_triton import round_for

E2M1_MAX = tl.constexpr(6.0)
FP8_MAX = tl.constexpr(448.0)


@triton.jit
def _to_e4m3_bits(x):
    """fp32 -> float8_e4m3fn bits (uint8), saturated to +-448, round to nearest even.

    Integer arithmetic on the fp32 bits (the interpreter's fp8 cast misrounds): normals round
    the 23-bit mantissa to 3 bits (carry into the exponent included), subnormals (< 2^-6) are
    k * 2^-9 with k = rne(|x| * 512), and k = 8 is exactly the smallest normal's code.
    """
    y = tl.minimum(tl.maximum(x, -FP8_MAX), FP8_MAX)
    bits = y.to(tl.int32, bitcast=True)
    mag_bits = bits & 0x7FFFFFFF
    normal = ((mag_bits + 0x7FFFF + ((mag_bits >> 20) & 1)) >> 20) - (120 << 3)
    scaled = tl.abs(y) * 512.0
    low = tl.floor(scaled)
    frac = scaled - low
    k = low.to(tl.int32)
    k += ((frac > 0.5) | ((frac == 0.5) & ((k & 1) == 1))).to(tl.int32)
    code = tl.where(tl.abs(y) < 0.015625, k, normal)
    return (code | ((bits >> 24) & 0x80)).to(tl.uint8)


@triton.jit
def _e2m1_code(x):
    """Nearest E2M1 code (int32 0..15) of values scaled to [-6, 6]; ties to the even code."""
    mag = tl.minimum(tl.abs(x), E2M1_MAX)
    idx = (mag > 0.25).to(tl.int32) + (mag >= 0.75).to(tl.int32) + (mag > 1.25).to(tl.int32)
    idx += (mag >= 1.75).to(tl.int32) + (mag > 2.5).to(tl.int32) + (mag >= 3.5).to(tl.int32)
    idx += (mag > 5.0).to(tl.int32)
    return tl.where((x < 0) & (idx > 0), idx + 8, idx)


@triton.jit
def store_kv_row(x, data_ptr, scale_ptr, gs_ptr, row, sc_row, D: tl.constexpr, FMT: tl.constexpr):
    """Quantize one fp32 row x [D] to the cache format and store it at element offset `row` of data
    (NVFP4: D/2 code bytes there, D/16 scales at `sc_row` of scales)."""
    if FMT == 2:
        gs = tl.load(gs_ptr)
        groups = tl.reshape(x, (D // 16, 16))
        raw = tl.math.div_rn(tl.math.div_rn(tl.max(tl.abs(groups), axis=1), E2M1_MAX), gs)
        sc_bits = _to_e4m3_bits(raw)
        step = sc_bits.to(tl.float8e4nv, bitcast=True).to(tl.float32) * gs
        safe = tl.where(step > 0, step, 1.0)
        scaled = tl.where(step[:, None] > 0, tl.math.div_rn(groups, safe[:, None]), 0.0)
        lo, hi = tl.split(tl.reshape(_e2m1_code(scaled), (D // 2, 2)))
        tl.store(data_ptr + row + tl.arange(0, D // 2), (lo | (hi << 4)).to(tl.uint8))
        tl.store(scale_ptr + sc_row + tl.arange(0, D // 16), sc_bits)
    elif FMT == 1:
        tl.store(data_ptr + row + tl.arange(0, D), _to_e4m3_bits(x))
    else:
        dtype = data_ptr.dtype.element_ty
        tl.store(data_ptr + row + tl.arange(0, D), round_for(x, dtype).to(dtype))


@triton.jit
def kv_write_kernel(
    x_ptr, slot_ptr, data_ptr, scale_ptr, gs_ptr,
    s_xt, s_xh, s_dp, s_dh, s_dt, s_sp, s_sh, s_st,
    PAGE: tl.constexpr, D: tl.constexpr, FMT: tl.constexpr, PDL: tl.constexpr,
):
    pdl_wait(PDL)  # first: nothing global before it (pdl_triton)
    t = tl.program_id(0)
    h = tl.program_id(1)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot < 0:
        return
    page = slot // PAGE
    off = slot % PAGE
    x = tl.load(x_ptr + t.to(tl.int64) * s_xt + h * s_xh + tl.arange(0, D)).to(tl.float32)
    store_kv_row(x, data_ptr, scale_ptr, gs_ptr, page * s_dp + h * s_dh + off * s_dt,
                 page * s_sp + h * s_sh + off * s_st, D, FMT)
