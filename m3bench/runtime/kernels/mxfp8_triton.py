"""Triton MXFP8 GEMM: y = x W^T (+ b) with W float8_e4m3fn [N, K] and E8M0 scales [N, K/32], the
weight tile dequantized in registers (Hopper has no MX instructions: the scale tile is applied
inside the GEMM loop: `mx_dot` scales each 32-wide sub-dot's fp32 partial by its block's power of two). `mx_dot`
and `nv_weight_tile` (NVFP4:
E2M1 codes, e4m3 scale per 16, fp32 global per row) serve the fused MoE's expert formats.
"""

import triton
import triton.language as tl

from m3bench.runtime.kernels.kv_tiles_triton import mma
from m3bench.runtime.kernels.mx_tiles_triton import e8m0_scale, finish_tile
from m3bench.runtime.kernels.pdl_triton import pdl_wait

MX_BLOCK = tl.constexpr(32)
NV_BLOCK = tl.constexpr(16)


@triton.jit
def mx_block_steps(s_rows, n_ok, k0, K, G: tl.constexpr):
    """The powers of two 2**(s - 127) of the G (1, 2 or 4) E8M0 blocks at inputs k0.. of the rows whose scales
    start at s_rows [BLOCK_N]: a 4-tuple of fp32 [BLOCK_N] (G < 4: the tuple repeats), 0 past K. One load of
    G bytes a row; the caller loads the next K step's while this one's sub-dots run (the pipeliner moves only
    the tiles). As fp32 bit patterns (mx_tiles_triton.e8m0_scale): no exp2."""
    blk = k0 // MX_BLOCK + tl.arange(0, G)
    raw = tl.load(s_rows[:, None] + blk[None, :], mask=n_ok[:, None] & (blk * MX_BLOCK < K)[None, :], other=0)
    return _four(e8m0_scale(raw), G)


@triton.jit
def nv_block_steps(s_rows, g_rows, n_ok, k0, K, G: tl.constexpr):
    """mx_block_steps for NVFP4 codes held as e4m3 bytes: each 16-wide block's e4m3 scale x its row's fp32 global
    (g_rows [BLOCK_N]), a 4-tuple of fp32 [BLOCK_N], 0 past K."""
    blk = k0 // NV_BLOCK + tl.arange(0, G)
    raw = tl.load(s_rows[:, None] + blk[None, :], mask=n_ok[:, None] & (blk * NV_BLOCK < K)[None, :], other=0.0)
    return _four(raw.to(tl.float32) * tl.load(g_rows, mask=n_ok, other=0.0)[:, None], G)


@triton.jit
def sub_block_steps(s_rows, g_rows, n_ok, k0, K, G: tl.constexpr, FMT: tl.constexpr):
    """The multipliers of a K step's G sub-blocks: MXFP8's powers of two (FMT 1) or NVFP4's scale x global (FMT 3,
    the codes as e4m3 bytes)."""
    if FMT == 3:
        return nv_block_steps(s_rows, g_rows, n_ok, k0, K, G)
    else:
        return mx_block_steps(s_rows, n_ok, k0, K, G)


@triton.jit
def _four(f, G: tl.constexpr):
    """[BLOCK_N, G] (G 1, 2 or 4) as a 4-tuple of its columns (G < 4: the tuple repeats)."""
    if G == 1:
        s0 = tl.reshape(f, (f.shape[0],))
        return s0, s0, s0, s0
    elif G == 2:
        s0, s1 = tl.split(f)
        return s0, s1, s0, s1
    else:
        even, odd = tl.split(tl.reshape(f, (f.shape[0], 2, 2)))  # [:, 0::2] and [:, 1::2]
        s0, s2 = tl.split(even)
        s1, s3 = tl.split(odd)
        return s0, s1, s2, s3


@triton.jit
def act_block(a_rows, kk, a_ok, F32: tl.constexpr):
    """Activations [BLOCK_M, 32] at inputs kk as the sub-dot's operand: fp16 (exact for bf16 values of
    magnitude 2**-14 .. 65504; smaller ones keep 2**-24 absolute precision), so that the fp8 weights need one
    conversion (e4m3 -> f16, two a instruction; e4m3 -> bf16 costs four); fp32 with F32."""
    a = tl.load(a_rows + kk[None, :], mask=a_ok, other=0.0)
    if F32:
        return a.to(tl.float32)
    else:
        return a.to(tl.float16)


@triton.jit
def mx_weight_blocks(w_rows, s_blk, n_ok, k0, K, BLOCK_K: tl.constexpr, SB: tl.constexpr = MX_BLOCK):
    """The fp8 weights of rows w_rows [BLOCK_N, 1] at inputs k0 + [0, BLOCK_K) as their G (1, 2 or 4) 32-wide
    blocks: a 4-tuple of [BLOCK_N, 32] tiles (G < 4 repeats), each loaded on its own. A row's block b starts at
    w_rows + b * s_blk: 32 in the row-major layout [N, K], N * 32 in the block-major one (quant.block_major:
    [K/32, N, 32], where a block's tile is one contiguous run of BLOCK_N x 32 bytes). Loaded a block at a time,
    the tiles keep 32-byte rows in shared memory, which the dot operand reads without bank conflicts (a whole
    [BLOCK_N, 128] tile's 128-byte rows were read 4-way conflicted: H200 ncu, L1 82% busy, the MoE 1.2x slower).
    SB: the block width, 32 (MXFP8) or 16 (NVFP4 codes as e4m3 bytes; quant.block_major with width 16)."""
    G: tl.constexpr = BLOCK_K // SB
    w0 = _mx_block(w_rows, s_blk, n_ok, k0, K, 0, SB)
    if G == 1:
        return w0, w0, w0, w0
    w1 = _mx_block(w_rows, s_blk, n_ok, k0, K, 1, SB)
    if G == 2:
        return w0, w1, w0, w1
    return w0, w1, _mx_block(w_rows, s_blk, n_ok, k0, K, 2, SB), _mx_block(w_rows, s_blk, n_ok, k0, K, 3, SB)


@triton.jit
def _mx_block(w_rows, s_blk, n_ok, k0, K, j: tl.constexpr, SB: tl.constexpr):
    """Block j of the K step at k0 (a multiple of SB) of the rows: [BLOCK_N, SB] fp8, 0 past K."""
    k = k0 + j * SB
    i = tl.arange(0, SB)
    return tl.load(w_rows + (k // SB) * s_blk + i[None, :], mask=n_ok[:, None] & (k + i < K)[None, :], other=0.0)


@triton.jit
def mx_subdot(acc, a, w, step, F32: tl.constexpr):
    """acc + (a . w^T) * step: one 32-block's fp8 weights w [BLOCK_N, 32] against a (act_block), the fp32 partial
    scaled by the block's power of two (exact)."""
    return acc + mma(a, tl.trans(w).to(a.dtype), F32) * step[None, :]


@triton.jit
def mx_dot(acc, a_rows, w_rows, s_blk, steps, n_ok, row_ok, k0, K, F32: tl.constexpr, BLOCK_K: tl.constexpr,
           SB: tl.constexpr = MX_BLOCK):
    """acc + a[:, k0:k0+BLOCK_K] . dequant(w)[n, k0:k0+BLOCK_K]^T as one 32-wide sub-dot per E8M0 block
    (mx_weight_blocks; s_blk: the weights' block stride), each fp32 partial scaled by its block's power of two
    (steps: mx_block_steps at k0; exact), so no per-element scale. `a_rows` [BLOCK_M, 1] and `w_rows`
    [BLOCK_N, 1] point at the rows' starts. SB: the sub-block width (mx_weight_blocks)."""
    w = mx_weight_blocks(w_rows, s_blk, n_ok, k0, K, BLOCK_K, SB)
    for j in tl.static_range(BLOCK_K // SB):
        kk = k0 + j * SB + tl.arange(0, SB)
        a = act_block(a_rows, kk, row_ok[:, None] & (kk < K)[None, :], F32)
        acc = mx_subdot(acc, a, w[j], steps[j], F32)
    return acc


@triton.jit
def nv_weight_tile(w_base, s_base, g_base, n, kk, s_wn, s_sn, n_ok, k_ok):
    """fp32 [BLOCK_N, BLOCK_K] of NVFP4 weights: E2M1 codes (two a byte, element 2j in the low nibble)
    x their e4m3 scale (one per 16 inputs) x the row's fp32 global scale."""
    mask = n_ok[:, None] & k_ok[None, :]
    byte = tl.load(w_base + n[:, None] * s_wn + (kk // 2)[None, :], mask=mask, other=0).to(tl.int32)
    code = tl.where((kk % 2 == 0)[None, :], byte & 15, byte >> 4)
    e = (code >> 1) & 3
    m = (code & 1).to(tl.float32)
    val = tl.where(e == 0, 0.5 * m, (1.0 + 0.5 * m) * tl.exp2((e - 1).to(tl.float32)))
    val = tl.where(code >= 8, -val, val)
    s = tl.load(s_base + n[:, None] * s_sn + (kk // NV_BLOCK)[None, :], mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_base + n, mask=n_ok, other=0.0).to(tl.float32)
    return val * s * g[:, None]


@triton.jit(do_not_specialize=["M"])
def mxfp8_linear_kernel(
    x_ptr, w_ptr, s_ptr, b_ptr, y_ptr, part_ptr, cnt_ptr, M, s_xm, s_wn, s_wb, s_sn, s_ym,
    N: tl.constexpr, K: tl.constexpr, K_SPLIT: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr, F32: tl.constexpr, PDL: tl.constexpr,
):
    """One [BLOCK_M, BLOCK_N] tile of y over K range program_id(1) * K_SPLIT + [0, K_SPLIT), fp32 accumulation
    in BLOCK_K steps. Grid (N tiles x M tiles, SPLIT), N tiles fastest; with K split, the tile's splits meet in
    the kernel (mx_tiles_triton.finish_tile: a per-tile counter, the last split sums the fp32 partials in split
    order and adds the bias)."""
    pdl_wait(PDL)  # first: nothing global before it (pdl_triton)
    n_tiles: tl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
    n = (tl.program_id(0) % n_tiles) * BLOCK_N + tl.arange(0, BLOCK_N)
    m = (tl.program_id(0) // n_tiles) * BLOCK_M + tl.arange(0, BLOCK_M)
    k_start = tl.program_id(1) * K_SPLIT
    m_ok, n_ok = m < M, n < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    a_rows = x_ptr + m[:, None].to(tl.int64) * s_xm
    w_rows = w_ptr + n[:, None].to(tl.int64) * s_wn
    s_rows = s_ptr + n.to(tl.int64) * s_sn
    steps = mx_block_steps(s_rows, n_ok, k_start, K, BLOCK_K // MX_BLOCK)
    for k_off in range(0, K_SPLIT, BLOCK_K):  # constant trip count
        k0 = k_start + k_off
        next_steps = mx_block_steps(s_rows, n_ok, k0 + BLOCK_K, K, BLOCK_K // MX_BLOCK)
        acc = mx_dot(acc, a_rows, w_rows, s_wb, steps, n_ok, m_ok, k0, K, F32, BLOCK_K)
        steps = next_steps
    finish_tile(acc, m, n, m_ok, n_ok, y_ptr, s_ym, b_ptr, 0, part_ptr, cnt_ptr, tl.program_id(0), M, N, SPLIT,
                HAS_BIAS)
