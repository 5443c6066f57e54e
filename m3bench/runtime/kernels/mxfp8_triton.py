"""Triton MXFP8 GEMM: y = x W^T (+ b) with W float8_e4m3fn [N, K] and E8M0 scales [N, K/32], the
weight tile dequantized in registers (Hopper has no MX instructions: the scale tile is applied
inside the GEMM loop: `mx_dot` scales each 32-wide sub-dot's fp32 partial by its block's power of two). `mx_dot`
and `nv_weight_tile` (NVFP4:
E2M1 codes, e4m3 scale per 16, fp32 global per row) serve the fused MoE's expert formats.
"""

import triton
import triton.language as tl

from m3bench.runtime.kernels.kv_tiles_triton import mma

MX_BLOCK = tl.constexpr(32)
E8M0_BIAS = tl.constexpr(127.0)
NV_BLOCK = tl.constexpr(16)


@triton.jit
def mx_dot(acc, a_rows, w_rows, s_base, s_sn, n, n_ok, row_ok, k0, K, F32: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc + a[:, k0:k0+BLOCK_K] . dequant(w)[n, k0:k0+BLOCK_K]^T as one 32-wide sub-dot per E8M0 block: the
    block's power of two scales the fp32 partial (exact), so no per-element scale gather or exp2.
    `a_rows` [BLOCK_M, 1] and `w_rows` [BLOCK_N, 1] point at the rows' starts."""
    for j in tl.static_range(BLOCK_K // MX_BLOCK):
        kk = k0 + j * MX_BLOCK + tl.arange(0, MX_BLOCK)
        k_ok = kk < K
        a = tl.load(a_rows + kk[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_rows + kk[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        s = tl.load(s_base + n * s_sn + (k0 // MX_BLOCK + j), mask=n_ok & (k0 + j * MX_BLOCK < K), other=127)
        acc += mma(a, tl.trans(w), F32) * tl.exp2(s.to(tl.float32) - E8M0_BIAS)[None, :]
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
    x_ptr, w_ptr, s_ptr, b_ptr, y_ptr, M, s_xm, s_wn, s_sn, s_ym, s_split,
    N: tl.constexpr, K: tl.constexpr, K_SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr, F32: tl.constexpr,
):
    """One [BLOCK_M, BLOCK_N] tile of y over K range program_id(2) * K_SPLIT + [0, K_SPLIT), fp32
    accumulation in BLOCK_K steps; with K split, program s writes its partial at y + s * s_split."""
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    k_start = tl.program_id(2) * K_SPLIT
    m_ok, n_ok = m < M, n < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    a_rows = x_ptr + m[:, None].to(tl.int64) * s_xm
    w_rows = w_ptr + n[:, None].to(tl.int64) * s_wn
    for k0 in range(k_start, k_start + K_SPLIT, BLOCK_K):
        acc = mx_dot(acc, a_rows, w_rows, s_ptr, s_sn, n, n_ok, m_ok, k0, K, F32, BLOCK_K)
    if HAS_BIAS:
        acc += tl.load(b_ptr + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    out = y_ptr + tl.program_id(2).to(tl.int64) * s_split + m[:, None].to(tl.int64) * s_ym + n[None, :]
    tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])
