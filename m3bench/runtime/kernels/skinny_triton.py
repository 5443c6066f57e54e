"""Triton decode GEMMs over plain (bf16 / fp16 / fp32) weights for a few rows: y = x W^T (+ b), M <= 16.

    skinny_dot_kernel   y^T = W x^T, one tl.dot per BLOCK_K step with the weight tile on the MMA's M side and
                        the rows (padded to 16) on its N side ("swap AB"); the pipeliner streams the tiles.
                        GATED: W is a fused gate|up [2I, K] and y [M, I] = act(x W_gate^T, x W_up^T) (each
                        rounded to y's dtype first, as the unfused gate|up GEMM + gated_act would)
    (the GEMV, no tensor cores, for fp32 weights such as the router's: mx_tiles_triton.mx_gemv_kernel unscaled)

A decode GEMM of one TP8 rank is a few MB (qkv + index 1920 x 6144 bf16: 23.6 MB): cuBLAS runs it on too
few CTAs and sums its split K in a second kernel. These kernels fill one wave of resident programs by
splitting K, and the splits of an output tile meet in the kernel (mx_tiles_triton.finish_tile: fp32
partials, a per-tile counter, the last split sums in a fixed order): deterministic, one launch.
"""

import triton
import triton.language as tl

from m3bench.runtime.kernels.moe_triton import gated_activation
from m3bench.runtime.kernels.mx_tiles_triton import dot_acc, finish_tile, last_split, store_partial, sum_partials
from m3bench.runtime.kernels.pdl_triton import pdl_wait
from m3bench.runtime.kernels.round_triton import round_for


@triton.jit(do_not_specialize=["M"])
def skinny_dot_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, part_ptr, cnt_ptr, M, s_xm, s_wn, s_ym, s_bm, alpha, limit,
    N: tl.constexpr, K: tl.constexpr, K_SPLIT: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr, F32: tl.constexpr, EVEN: tl.constexpr,
    GATED: tl.constexpr, ACT: tl.constexpr, PDL: tl.constexpr,
):
    """y[:M, n-tile]^T = W[n-tile] @ x[:M]^T (+ b[m * s_bm + n]); GATED: N = I, W rows n and I + n. Grid (N tiles,
    SPLIT)."""
    pdl_wait(PDL)  # first: nothing global before it (pdl_triton)
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.arange(0, BLOCK_M)
    n_ok, m_ok = n < N, m < M
    acc, acc_u = skinny_acc(x_ptr, w_ptr, s_xm, s_wn, n, m, n_ok, m_ok, N, K, K_SPLIT, BLOCK_N, BLOCK_M, BLOCK_K,
                            F32, EVEN, GATED)
    if GATED:
        _finish_gated(tl.trans(acc), tl.trans(acc_u), m, n, m_ok, n_ok, y_ptr, s_ym, part_ptr, cnt_ptr, M, N,
                      alpha, limit, SPLIT, ACT)
    else:
        finish_tile(tl.trans(acc), m, n, m_ok, n_ok, y_ptr, s_ym, b_ptr, s_bm, part_ptr, cnt_ptr, tl.program_id(0),
                    M, N, SPLIT, HAS_BIAS)


@triton.jit
def skinny_acc(x_ptr, w_ptr, s_xm, s_wn, n, m, n_ok, m_ok, N, K: tl.constexpr, K_SPLIT: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, F32: tl.constexpr,
               EVEN: tl.constexpr, GATED: tl.constexpr):
    """This program's split (program_id(1)) of W[n] @ x[m]^T as fp32 [BLOCK_N, BLOCK_M] (GATED: and of the up rows
    n + N, else zeros)."""
    acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    acc_u = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    w_rows = w_ptr + n.to(tl.int64) * s_wn
    u_rows = w_ptr + (n + N).to(tl.int64) * s_wn
    x_rows = x_ptr + m.to(tl.int64) * s_xm
    k_begin = tl.program_id(1) * K_SPLIT
    for k_off in range(0, K_SPLIT, BLOCK_K):  # constant trip count
        kk = k_begin + k_off + tl.arange(0, BLOCK_K)
        x = tl.trans(tl.load(x_rows[:, None] + kk[None, :], mask=m_ok[:, None] & (kk < K)[None, :], other=0.0))
        acc = dot_acc(_tile(w_rows, kk, n_ok, K, EVEN), x, acc, F32)
        if GATED:
            acc_u = dot_acc(_tile(u_rows, kk, n_ok, K, EVEN), x, acc_u, F32)
    return acc, acc_u


@triton.jit
def _tile(rows, kk, n_ok, K: tl.constexpr, EVEN: tl.constexpr):
    if EVEN:
        return tl.load(rows[:, None] + kk[None, :])
    else:
        return tl.load(rows[:, None] + kk[None, :], mask=n_ok[:, None] & (kk < K)[None, :], other=0.0)


@triton.jit
def _finish_gated(g, u, m, n, m_ok, n_ok, y_ptr, s_ym, part_ptr, cnt_ptr, M, N, alpha, limit,
                  SPLIT: tl.constexpr, ACT: tl.constexpr):
    """y[m, n] = act(g, u) (each rounded to y's dtype first); SPLIT > 1: the splits meet as in finish_tile, the
    gate and up partials side by side (part [SPLIT, 2, M, N])."""
    mask = m_ok[:, None] & n_ok[None, :]
    cell = m[:, None].to(tl.int64) * N + n[None, :]
    if SPLIT > 1:
        store_partial(g, cell, mask, part_ptr, 2 * M * N)
        store_partial(u, cell + M * N, mask, part_ptr, 2 * M * N)
        if last_split(cnt_ptr, tl.program_id(0), SPLIT):
            g = sum_partials(g, cell, mask, part_ptr, 2 * M * N, SPLIT)
            u = sum_partials(u, cell + M * N, mask, part_ptr, 2 * M * N, SPLIT)
            _store_gated(g, u, m, n, mask, y_ptr, s_ym, alpha, limit, ACT)
            tl.atomic_xchg(cnt_ptr + tl.program_id(0), 0)
    else:
        _store_gated(g, u, m, n, mask, y_ptr, s_ym, alpha, limit, ACT)


@triton.jit
def _store_gated(g, u, m, n, mask, y_ptr, s_ym, alpha, limit, ACT: tl.constexpr):
    dt: tl.constexpr = y_ptr.dtype.element_ty
    h = gated_activation(round_for(g, dt), round_for(u, dt), alpha, limit, ACT)
    tl.store(y_ptr + m[:, None].to(tl.int64) * s_ym + n[None, :], h.to(dt), mask=mask)
