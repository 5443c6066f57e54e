"""Triton helpers shared by the attention and index kernels: decode a [TILE, D] KV tile in-kernel.

Formats (constexpr FMT): 0 plain (bf16/fp16/fp32), 1 fp8 e4m3 (passed as a uint8 view),
2 NVFP4 (uint8 data, two E2M1 codes a byte low nibble first; uint8 view of e4m3 scales,
one per 16 elements; fp32 global scale read from a 1-element tensor). Quantized tiles decode into
fp16 (exactly) and the dots run on fp16 operands (dot_operand), so the tensor cores take them with
no fp32 round trip; NVFP4's global scale multiplies the dot products (kv_tile_factor).
Only Triton 3.0-era language features (no gather, no warp specialization).
"""

import triton
import triton.language as tl

FMT_PLAIN = 0
FMT_FP8 = 1
FMT_NVFP4 = 2


@triton.jit
def e2m1_as_e4m3(code):
    """E2M1 codes (int32 0..15, sign bit 3) -> float8_e4m3fn codes of the same values / 64, so the
    hardware fp8 conversion decodes them (2 a cvt) instead of ~10 integer ops an element.

    The three magnitude bits (e1 e0 m) move under e4m3's exponent LSBs and mantissa MSB: e4m3 is
    2^(E-7) (1 + mmm/8) with E = e1 e0 and mmm = m00, i.e. 2^(e-7) (1 + m/2), E2M1 is 2^(e-1) (1 + m/2):
    a factor 2^6; the subnormals agree too (e = 0: m 2^-7 against m 0.5) and zero maps to zero.
    """
    return (((code & 8) << 4) | ((code & 7) << 2)).to(tl.uint8)


@triton.jit
def nvfp4_to_f16_asm(byte):
    """uint8 NVFP4 bytes -> (low-nibble, high-nibble) fp16 values / 64, as e2m1_as_e4m3 + the fp8
    conversion, four bytes a register: the e4m3 codes of all four low (high) nibbles in 3 (4) integer
    ops, then two cvt.rn.f16x2.e4m3x2 (sm89+: H100/H200)."""
    return tl.inline_asm_elementwise(
        asm="""{
        .reg .b32 t, u;
        .reg .b16 a, b;
        shl.b32 t, $4, 4;
        and.b32 t, t, 0x80808080;
        shl.b32 u, $4, 2;
        and.b32 u, u, 0x1C1C1C1C;
        or.b32 t, t, u;
        mov.b32 {a, b}, t;
        cvt.rn.f16x2.e4m3x2 $0, a;
        cvt.rn.f16x2.e4m3x2 $1, b;
        shr.b32 u, $4, 2;
        and.b32 u, u, 0x1C1C1C1C;
        and.b32 t, $4, 0x80808080;
        or.b32 t, t, u;
        mov.b32 {a, b}, t;
        cvt.rn.f16x2.e4m3x2 $2, a;
        cvt.rn.f16x2.e4m3x2 $3, b;
        }""",
        constraints="=r,=r,=r,=r,r", args=[byte], dtype=(tl.float16, tl.float16), is_pure=True, pack=4)


@triton.jit
def e2m1_to_f32(code):
    """E2M1 code (int32, 0..15) -> fp32 of {0, .5, 1, 1.5, 2, 3, 4, 6} with sign bit 3."""
    return e2m1_as_e4m3(code).to(tl.float8e4nv, bitcast=True).to(tl.float32) * 64.0


@triton.jit
def load_kv_tile(data_ptr, scale_ptr, row_off, sc_row, mask,
                 FMT: tl.constexpr, TILE: tl.constexpr, D: tl.constexpr, ASM: tl.constexpr = False):
    """Tile [TILE, D] of the rows starting at row_off (elements of data), masked rows read 0:
    fp16 for FP8 / NVFP4 (exact: see below), the cache's own dtype for plain caches (mma converts).

    row_off: [TILE] int64 offsets of each token's row in data; sc_row (NVFP4): [TILE] int64 indices of
    each token's row of D/16 scales (its offset / (D/16): backend.scale_row_strides);
    mask: [TILE] rows to read, or None: every row (no predicates on the loads).
    FP8 e4m3 converts to fp16 exactly (one cvt per two elements). NVFP4 loads D/2 contiguous bytes
    and D/16 scales per row and widens them in registers (join + reshape), so both loads stay
    vectorized; the nibbles decode through the fp8 conversion (e2m1_as_e4m3: values / 64) and times
    their e4m3 block scale in fp16, exact (<= 6 significant bits, magnitudes 2^-16 .. 42); the global
    scale and the 64 are NOT applied: the caller multiplies its dot products by kv_tile_factor.
    ASM (sm89+, not the interpreter): the same codes made four bytes at a time in PTX
    (nvfp4_to_f16_asm), no widening to int32.
    """
    if FMT == 2:
        even, odd = load_nvfp4_halves(data_ptr, scale_ptr, row_off, sc_row, mask, TILE, D, ASM)
        return tl.reshape(tl.join(even, odd), (TILE, D))  # element values / 64
    elif FMT == 1:
        cols = tl.arange(0, D)
        raw = load_rows(data_ptr + row_off[:, None] + cols[None, :], mask)
        return raw.to(tl.float8e4nv, bitcast=True).to(tl.float16)
    else:
        cols = tl.arange(0, D)
        return load_rows(data_ptr + row_off[:, None] + cols[None, :], mask)


@triton.jit
def load_nvfp4_halves(data_ptr, scale_ptr, row_off, sc_row, mask,
                      TILE: tl.constexpr, D: tl.constexpr, ASM: tl.constexpr = False):
    """An NVFP4 tile as two [TILE, D/2] fp16 tiles, its even elements (the low nibbles) and its odd
    ones (the high nibbles), each times its e4m3 block scale (values / 64, as load_kv_tile's).

    A dot over the head dim can take the halves as they come (q_even . even + q_odd . odd: dot_parts,
    load_halves): no join + reshape to interleave them, which costs the index kernel ~7% on the H200.
    Element 2i and 2i+1 both sit in block i // 8 of 16 elements: one scale broadcast serves both.
    """
    half = tl.arange(0, D // 2)
    byte = load_rows(data_ptr + row_off[:, None] + half[None, :], mask)
    if ASM:
        lo, hi = nvfp4_to_f16_asm(byte)
    else:
        lo = e2m1_as_e4m3(byte.to(tl.int32)).to(tl.float8e4nv, bitcast=True).to(tl.float16)
        hi = e2m1_as_e4m3(byte.to(tl.int32) >> 4).to(tl.float8e4nv, bitcast=True).to(tl.float16)
    groups = tl.arange(0, D // 16)
    # scale rows, not offsets: a row starts at a multiple of D/16 that Triton can see, so a token's scales
    # load as one vector, asynchronously with the data (cp.async). Byte offsets with a stride of 8 carry no
    # JIT hint (those are multiples of 16), and every scale was a synchronous byte load waited on in the same
    # step (the NVFP4 indexer on the H200, ncu: L1TEX stalls); tl.multiple_of on them was lost in the loop
    sc = load_rows(scale_ptr + (sc_row * (D // 16))[:, None] + groups[None, :], mask)
    step = sc.to(tl.float8e4nv, bitcast=True).to(tl.float16)
    step = tl.reshape(tl.broadcast_to(step[:, :, None], (TILE, D // 16, 8)), (TILE, D // 2))
    return lo * step, hi * step


@triton.jit
def load_rows(ptrs, mask):
    """tl.load of [rows, cols] pointers: rows where mask ([rows]) is false read 0; mask None reads them all."""
    if mask is None:
        return tl.load(ptrs)
    else:
        return tl.load(ptrs, mask=mask[:, None], other=0)


@triton.jit
def load_halves(row_ptr, mask, D: tl.constexpr):
    """The even and odd elements of [rows, D] vectors at row_ptr ([rows] pointers): [rows, D/2] each,
    the other side of a dot with load_nvfp4_halves' tiles."""
    half = tl.arange(0, D // 2)
    even = tl.load(row_ptr[:, None] + 2 * half[None, :], mask=mask[:, None], other=0.0)
    odd = tl.load(row_ptr[:, None] + 2 * half[None, :] + 1, mask=mask[:, None], other=0.0)
    return even, odd


@triton.jit
def load_query(row_ptr, mask, FMT: tl.constexpr, F32: tl.constexpr, D: tl.constexpr):
    """The query rows of dot_parts as dot operands (a, b): NVFP4's even and odd halves, else the whole
    rows (b is a again)."""
    if FMT == 2:
        even, odd = load_halves(row_ptr, mask, D)
        return dot_operand(even, FMT, F32), dot_operand(odd, FMT, F32)
    else:
        q = dot_operand(tl.load(row_ptr[:, None] + tl.arange(0, D)[None, :], mask=mask[:, None], other=0.0), FMT, F32)
        return q, q


@triton.jit
def load_kv_parts(data_ptr, scale_ptr, row_off, sc_row, mask,
                  FMT: tl.constexpr, TILE: tl.constexpr, D: tl.constexpr, ASM: tl.constexpr):
    """load_kv_tile's tile as the parts dot_parts takes: NVFP4's even and odd halves
    (load_nvfp4_halves), else the whole tile (b is a again)."""
    if FMT == 2:
        return load_nvfp4_halves(data_ptr, scale_ptr, row_off, sc_row, mask, TILE, D, ASM)
    else:
        k = load_kv_tile(data_ptr, scale_ptr, row_off, sc_row, mask, FMT, TILE, D, ASM)
        return k, k


@triton.jit
def dot_parts(q_a, q_b, k_a, k_b, FMT: tl.constexpr, F32: tl.constexpr):
    """[rows, TILE] fp32 dots over the head dim of load_query's rows with load_kv_parts' keys."""
    if FMT == 2:
        return mma(q_a, tl.trans(k_a), F32) + mma(q_b, tl.trans(k_b), F32)
    else:
        return mma(q_a, tl.trans(k_a), F32)


@triton.jit
def hoist_query_operand(q_a, q_b, data_ptr, scale_ptr, FMT: tl.constexpr, F32: tl.constexpr, D: tl.constexpr,
                        ASM: tl.constexpr):
    """Call before a key loop that dots load_query's rows: on sm80+ the loop then keeps the query's MMA operand
    registers instead of rebuilding them every step. Computes nothing (the GPU drops the dot it adds).

    Triton builds a dot's operand registers (through shared memory) where the dot is. In a loop that was
    every step, and for fp16 queries against 8-bit keys (4 k a thread) it costs 2 loads a register pair and a
    move per register each dot: ~100 sm90 instructions of the indexer's 128-key step (FP8 and NVFP4 keys). A dot
    with the same query here, outside the loop, gets the identical conversion, which the loop's then reuses
    (common subexpression); the dot itself (32 keys that read nothing) is kept through Triton's passes by a
    volatile asm and removed by ptxas, as its result is unused. Not under F32 (the interpreter, no asm), nor
    for 16-bit keys, whose operands load whole registers from shared memory (ldmatrix) at little cost.
    """
    if FMT != 0 and not F32:
        keys = tl.arange(0, 32).to(tl.int64)
        k_a, k_b = load_kv_parts(data_ptr, scale_ptr, keys, keys, keys < 0, FMT, 32, D, ASM)
        s = dot_parts(q_a, q_b, k_a, k_b, FMT, F32)
        tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [s], dtype=tl.float32, is_pure=False, pack=1)


@triton.jit
def kv_tile_factor(gscale_ptr, FMT: tl.constexpr):
    """What load_kv_tile's values still need: NVFP4's global scale times the 64 of e2m1_as_e4m3."""
    if FMT == 2:
        return tl.load(gscale_ptr) * 64.0
    else:
        return 1.0


@triton.jit
def dot_operand(x, FMT: tl.constexpr, F32: tl.constexpr):
    """The query side of a dot with load_kv_tile's tiles: fp16 against FP8 / NVFP4 tiles (their exact
    dtype: normed queries sit far inside fp16's range, with 3 more mantissa bits than bf16), else x."""
    if FMT != 0 and not F32:
        return x.to(tl.float16)
    else:
        return x


@triton.jit
def mma(a, b, F32: tl.constexpr):
    """tl.dot with fp32 accumulation; F32 runs it on fp32 operands in IEEE precision (fp32
    inputs, and the CPU interpreter, whose bf16 dot is wrong), else on a's dtype (bf16)."""
    if F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b.to(a.dtype))
