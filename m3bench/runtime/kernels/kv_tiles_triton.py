"""Triton helpers shared by the attention and index kernels: decode a [TILE, D] KV tile in-kernel.

Formats (constexpr FMT): 0 plain (bf16/fp16/fp32), 1 fp8 e4m3 (passed as a uint8 view),
2 NVFP4 (uint8 data, two E2M1 codes a byte low nibble first; uint8 view of e4m3 scales,
one per 16 elements; fp32 global scale read from a 1-element tensor).
Only Triton 3.0-era language features (no gather, no warp specialization).
"""

import triton
import triton.language as tl

FMT_PLAIN = 0
FMT_FP8 = 1
FMT_NVFP4 = 2


@triton.jit
def e2m1_to_f32(code):
    """E2M1 code (int32, 0..15) -> fp32 of {0, .5, 1, 1.5, 2, 3, 4, 6} with sign bit 3.

    Built from bits (integer ops only, no exp2): magnitude m = (e << 1) | mantissa with a 2-bit
    exponent of bias 1, so e >= 1 is 2^(e-1) * (1 + mantissa / 2) and m == 1 is 0.5.
    """
    mag = code & 7
    normal = (((mag >> 1) + 126) << 23) | ((mag & 1) << 22)
    bits = tl.where(mag >= 2, normal, tl.where(mag == 1, 0x3F000000, 0))
    return (bits | ((code & 8) << 28)).to(tl.float32, bitcast=True)


@triton.jit
def load_kv_tile(data_ptr, scale_ptr, gscale, row_off, sc_row_off, mask,
                 FMT: tl.constexpr, TILE: tl.constexpr, D: tl.constexpr):
    """Tile [TILE, D] of the rows starting at row_off (elements of data), masked rows read 0:
    fp32 for FP8 / NVFP4, the cache's own dtype for plain caches (mma converts as needed).

    row_off / sc_row_off: [TILE] int64 offsets of each token's row in data / scales (NVFP4);
    mask: [TILE] rows to read. NVFP4 loads D/2 contiguous bytes and D/16 scales per row and
    widens them in registers (join + reshape), so both loads stay vectorized.
    """
    m2 = mask[:, None]
    if FMT == 2:
        half = tl.arange(0, D // 2)
        byte = tl.load(data_ptr + row_off[:, None] + half[None, :], mask=m2, other=0).to(tl.int32)
        vals = tl.reshape(tl.join(e2m1_to_f32(byte & 15), e2m1_to_f32(byte >> 4)), (TILE, D))
        groups = tl.arange(0, D // 16)
        sc = tl.load(scale_ptr + sc_row_off[:, None] + groups[None, :], mask=m2, other=0)
        step = sc.to(tl.float8e4nv, bitcast=True).to(tl.float32) * gscale
        step = tl.reshape(tl.broadcast_to(step[:, :, None], (TILE, D // 16, 16)), (TILE, D))
        return vals * step
    elif FMT == 1:
        cols = tl.arange(0, D)
        raw = tl.load(data_ptr + row_off[:, None] + cols[None, :], mask=m2, other=0)
        return raw.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    else:
        cols = tl.arange(0, D)
        return tl.load(data_ptr + row_off[:, None] + cols[None, :], mask=m2, other=0.0)


@triton.jit
def load_nvfp4_halves(data_ptr, scale_ptr, row_off, sc_row_off, mask, TILE: tl.constexpr, D: tl.constexpr):
    """The even and the odd elements, each [TILE, D/2] fp32, of an NVFP4 tile, not yet times the
    global scale: byte j of a row holds elements 2j (low nibble) and 2j+1 (high), both in scale
    group j // 8. No join / reshape: one vectorized byte load, the scale of each byte read by
    address (8 bytes share one, served from L1), and both halves stay in the load's layout, so a
    caller splits its dot products into even and odd columns instead of widening the tile."""
    half = tl.arange(0, D // 2)
    m2 = mask[:, None]
    byte = tl.load(data_ptr + row_off[:, None] + half[None, :], mask=m2, other=0).to(tl.int32)
    sc = tl.load(scale_ptr + sc_row_off[:, None] + (half // 8)[None, :], mask=m2, other=0)
    step = sc.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    return e2m1_to_f32(byte & 15) * step, e2m1_to_f32(byte >> 4) * step


@triton.jit
def mma(a, b, F32: tl.constexpr):
    """tl.dot with fp32 accumulation; F32 runs it on fp32 operands in IEEE precision (fp32
    inputs, and the CPU interpreter, whose bf16 dot is wrong), else on a's dtype (bf16)."""
    if F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b.to(a.dtype))
