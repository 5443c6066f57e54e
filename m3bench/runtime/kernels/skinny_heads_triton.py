"""Triton decode q|k|v(|index) projection ending in its heads' norm + RoPE + cache write: one launch for the two
of skinny_dot_kernel + norm_rope_write_kernel at a few rows.

    skinny_heads_kernel   y[:M, tile] = x W[tile]^T (+ b) as skinny_dot_kernel (one output tile = one head,
                          BLOCK_N = D; K split, the splits meeting in the kernel), then the program that writes
                          the tile (the last split to arrive) runs norm_rope_triton.head_row for its head j = tile
                          and every row: the query head normed and rotated into its output, a key head into its
                          cache, a value head into its cache, as norm_rope_write_kernel's program (t, j) would

The head work runs beside the other tiles' GEMM, in parallel across the heads (no serial tail behind one
program); y is still written (head_row reads its row back: the same bits as the two launches, given the same
tiles). The columns of y must hold the heads in head_row's order, each D wide: q, k, v, then (TWO) the index
q and the index key (kernels.skinny_heads checks it).
"""

import triton
import triton.language as tl

from m3bench.runtime.kernels.mx_tiles_triton import finish_tile
from m3bench.runtime.kernels.norm_rope_triton import head_row
from m3bench.runtime.kernels.pdl_triton import pdl_wait
from m3bench.runtime.kernels.skinny_triton import skinny_acc


@triton.jit(do_not_specialize=["M"])
def skinny_heads_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, part_ptr, cnt_ptr, M, s_xm, s_wn, s_ym,
    cos_ptr, sin_ptr, slot_ptr, eps, s_ct,
    q_ptr, qw_ptr, kw_ptr, k_ptr, ks_ptr, kgs_ptr, v_ptr, vs_ptr, vgs_ptr, q_col, k_col, v_col, s_qt, s_qh,
    s_kp, s_kh, s_kt, s_ksp, s_ksh, s_kst, s_vp, s_vh, s_vt, s_vsp, s_vsh, s_vst,
    q2_ptr, qw2_ptr, kw2_ptr, k2_ptr, ks2_ptr, kgs2_ptr, v2_ptr, vs2_ptr, vgs2_ptr, q2_col, k2_col, v2_col,
    s_q2t, s_q2h, s_k2p, s_k2h, s_k2t, s_ks2p, s_ks2h, s_ks2t, s_v2p, s_v2h, s_v2t, s_vs2p, s_vs2h, s_vs2t,
    N: tl.constexpr, K: tl.constexpr, K_SPLIT: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr, F32: tl.constexpr, EVEN: tl.constexpr,
    HQ: tl.constexpr, HK: tl.constexpr, HV: tl.constexpr, D: tl.constexpr, NORM: tl.constexpr,
    HQ2: tl.constexpr, HK2: tl.constexpr, D2: tl.constexpr, NORM2: tl.constexpr,
    HALF: tl.constexpr, PAGE: tl.constexpr, GEMMA: tl.constexpr, ROPE: tl.constexpr, FMT: tl.constexpr,
    TWO: tl.constexpr, PDL: tl.constexpr,
):
    """Grid (N / D heads, SPLIT): head j's D columns of y for M <= BLOCK_M rows, then its norm / RoPE / write."""
    pdl_wait(PDL)  # first: nothing global before it (pdl_triton)
    j = tl.program_id(0)
    n = j * D + tl.arange(0, D)
    m = tl.arange(0, BLOCK_M)
    n_ok, m_ok = n < N, m < M
    acc, _ = skinny_acc(x_ptr, w_ptr, s_xm, s_wn, n, m, n_ok, m_ok, N, K, K_SPLIT, D, BLOCK_M, BLOCK_K, F32, EVEN,
                        False)
    # the tile's writer: the last of its K splits (finish_tile), y's head columns stored (+ the bias [N])
    if finish_tile(tl.trans(acc), m, n, m_ok, n_ok, y_ptr, s_ym, b_ptr, 0, part_ptr, cnt_ptr, j, M, N, SPLIT,
                   HAS_BIAS):
        tl.debug_barrier()  # the tile's row stored by every thread before head_row reads it back
        for t in range(M):  # (M <= HEADS_MAX_ROWS rows: 32-bit offsets)
            head_row(t, j, y_ptr + t * s_ym, cos_ptr + t * s_ct, sin_ptr + t * s_ct, slot_ptr, eps,
                     q_ptr, qw_ptr, kw_ptr, k_ptr, ks_ptr, kgs_ptr, v_ptr, vs_ptr, vgs_ptr, q_col, k_col, v_col,
                     s_qt, s_qh, s_kp, s_kh, s_kt, s_ksp, s_ksh, s_kst, s_vp, s_vh, s_vt, s_vsp, s_vsh, s_vst,
                     q2_ptr, qw2_ptr, kw2_ptr, k2_ptr, ks2_ptr, kgs2_ptr, v2_ptr, vs2_ptr, vgs2_ptr, q2_col, k2_col,
                     v2_col, s_q2t, s_q2h, s_k2p, s_k2h, s_k2t, s_ks2p, s_ks2h, s_ks2t, s_v2p, s_v2h, s_v2t,
                     s_vs2p, s_vs2h, s_vs2t, HQ, HK, HV, D, NORM, HQ2, HK2, D2, NORM2, HALF, PAGE, GEMMA, ROPE, FMT,
                     TWO)
