"""Triton decode GEMM over plain weights whose input is a residual add + RMSNorm not yet computed:

    h = r + d (rounded to the stream's dtype, as torch's add; stored by the programs of output tile 0)
    y = norm(h) W^T (+ b),   norm(h) = h * rsqrt(mean(h^2) + eps) * w_norm   (Gemma: * (1 + w_norm))

computed as (h * w_norm) W^T * rsqrt(mean(h^2) + eps): the row's scale is a scalar, so it is applied to the
accumulator once the whole row's sum of squares is known. Each program sums the squares of its own K chunk (the
chunk it multiplies anyway); with K split the chunks' sums meet where the splits' partials meet (the tile's last
split sums both in split order: deterministic, one launch). The operand of the MMA is h * w_norm rounded to the
weight's dtype (bf16), where the unfused path rounds h * rsqrt * w_norm: the same rounding, at another scale.

The skinny dot kernel's layout (kernels/skinny_triton.py): the weight tile on the MMA's M side, the rows (padded to
16) on its N side; grid (N tiles, SPLIT).
"""

import triton
import triton.language as tl

from m3bench.runtime.kernels.mx_tiles_triton import dot_acc, last_split, store_partial, sum_partials
from m3bench.runtime.kernels.pdl_triton import pdl_wait
from m3bench.runtime.kernels.round_triton import round_for


@triton.jit(do_not_specialize=["M"])
def norm_dot_kernel(
    r_ptr, d_ptr, nw_ptr, h_ptr, w_ptr, b_ptr, y_ptr, part_ptr, ssq_ptr, cnt_ptr, M, eps, s_rm, s_dm, s_hm, s_wn,
    s_ym, N: tl.constexpr, K: tl.constexpr, K_SPLIT: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr, GEMMA: tl.constexpr, F32: tl.constexpr,
    EVEN: tl.constexpr, PDL: tl.constexpr,
):
    """y[:M, n-tile] = norm(r + d)[:M] @ W[n-tile]^T (+ b[n]); h = r + d stored by tile 0. Grid (N tiles, SPLIT);
    part [SPLIT, M, N] and ssq [SPLIT, N tiles, BLOCK_M] fp32 (SPLIT > 1)."""
    pdl_wait(PDL)  # first: nothing global before it (pdl_triton)
    tile = tl.program_id(0)
    n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.arange(0, BLOCK_M)
    n_ok, m_ok = n < N, m < M
    acc, ssq = _norm_acc(r_ptr, d_ptr, nw_ptr, h_ptr, w_ptr, s_rm, s_dm, s_hm, s_wn, n, m, n_ok, m_ok, tl.where(tile == 0, M, 0),
                         N, K, K_SPLIT, BLOCK_N, BLOCK_M, BLOCK_K, GEMMA, F32, EVEN)
    acc = tl.trans(acc)  # [BLOCK_M, BLOCK_N]
    mask = m_ok[:, None] & n_ok[None, :]
    if SPLIT > 1:
        cell = m[:, None].to(tl.int64) * N + n[None, :]
        n_tiles: tl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
        ssq_tile = ssq_ptr + tile * BLOCK_M  # this tile's rows of each split's plane
        store_partial(acc, cell, mask, part_ptr, M * N)
        store_partial(ssq, m, m_ok, ssq_tile, n_tiles * BLOCK_M)
        if last_split(cnt_ptr, tile, SPLIT):
            acc = sum_partials(acc, cell, mask, part_ptr, M * N, SPLIT)
            ssq = sum_partials(ssq, m, m_ok, ssq_tile, n_tiles * BLOCK_M, SPLIT)
            _store_scaled(acc, ssq, eps, m, n, mask, y_ptr, s_ym, b_ptr, K, HAS_BIAS)
            tl.atomic_xchg(cnt_ptr + tile, 0)
    else:
        _store_scaled(acc, ssq, eps, m, n, mask, y_ptr, s_ym, b_ptr, K, HAS_BIAS)


@triton.jit
def _norm_acc(r_ptr, d_ptr, nw_ptr, h_ptr, w_ptr, s_rm, s_dm, s_hm, s_wn, n, m, n_ok, m_ok, h_rows,
              N, K: tl.constexpr, K_SPLIT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_K: tl.constexpr,
              GEMMA: tl.constexpr, F32: tl.constexpr, EVEN: tl.constexpr):
    """This program's split (program_id(1)): W[n] @ (h * w_norm)[m]^T as fp32 [BLOCK_N, BLOCK_M] and the rows' sums
    of h^2 over the split's K [BLOCK_M]; stores h over the split for its first h_rows rows (M in tile 0, else 0)."""
    acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    ssq = tl.zeros([BLOCK_M], tl.float32)
    w_rows = w_ptr + n.to(tl.int64) * s_wn
    m64 = m.to(tl.int64)
    hdt: tl.constexpr = h_ptr.dtype.element_ty
    k_begin = tl.program_id(1) * K_SPLIT
    for k_off in range(0, K_SPLIT, BLOCK_K):  # constant trip count
        kk = k_begin + k_off + tl.arange(0, BLOCK_K)
        k_ok = kk < K
        rows_ok = m_ok[:, None] & k_ok[None, :]
        r = tl.load(r_ptr + m64[:, None] * s_rm + kk[None, :], mask=rows_ok, other=0.0)
        d = tl.load(d_ptr + m64[:, None] * s_dm + kk[None, :], mask=rows_ok, other=0.0)
        hf = round_for(r.to(tl.float32) + d.to(tl.float32), hdt)  # [BLOCK_M, BLOCK_K]
        tl.store(h_ptr + m64[:, None] * s_hm + kk[None, :], hf.to(hdt), mask=(m < h_rows)[:, None] & k_ok[None, :])
        ssq += tl.sum(hf * hf, axis=1)
        wn = tl.load(nw_ptr + kk, mask=k_ok, other=0.0).to(tl.float32)
        if GEMMA:
            wn = 1.0 + wn
        x = hf * wn[None, :]
        if F32:  # the interpreter: round as the GPU's cast does (round_triton), the operand then widened by dot_acc
            x = round_for(x, w_ptr.dtype.element_ty)
        x = tl.trans(x.to(w_ptr.dtype.element_ty))  # [BLOCK_K, BLOCK_M]
        if EVEN:
            w = tl.load(w_rows[:, None] + kk[None, :])
        else:
            w = tl.load(w_rows[:, None] + kk[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        acc = dot_acc(w, x, acc, F32)
    return acc, ssq


@triton.jit
def _store_scaled(acc, ssq, eps, m, n, mask, y_ptr, s_ym, b_ptr, K: tl.constexpr, HAS_BIAS: tl.constexpr):
    """y = acc * rsqrt(ssq / K + eps) per row (+ b[n]), in y's dtype."""
    rstd = 1.0 / tl.sqrt(ssq / K + eps)
    y = acc * rstd[:, None]
    if HAS_BIAS:
        y += tl.load(b_ptr + n[None, :] + m[:, None] * 0, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + m[:, None].to(tl.int64) * s_ym + n[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)
