"""Triton per-head RMSNorm + partial NeoX RoPE + KV-cache write of one attention branch, one launch.

Grid (T, HQ + HK + HV): program (t, j) takes one head row of token t from the fused projection
output y [T, N] (its columns start at q_col / k_col / v_col): j < HQ a query head (norm with the
q weight, rotate, store to q_out [T, HQ, D]); then HK key heads (norm with the k weight, rotate,
quantize into the K cache at the token's slot); then HV value heads (quantize into the V cache).
The index branch runs the same kernel: index-query heads out, the one index key into its cache;
with TWO both branches of an MSA layer run in one launch (the index rows after the main ones).

RoPE pairs i and i + HALF for i < HALF (dims >= 2 HALF untouched): the row is loaded whole and
once more permuted (its partner of every element), so any HALF works with power-of-two D. Every
intermediate the torch path rounds to the model dtype is rounded the same way here (norm output,
rotated row), with explicit round-to-nearest (round_triton), so the interpreter agrees too.
"""

import triton
import triton.language as tl

from m3bench.runtime.kernels.kv_write_triton import store_kv_row
from m3bench.runtime.kernels.pdl_triton import pdl_wait
from m3bench.runtime.kernels.round_triton import round_for


@triton.jit
def _norm(x, w_ptr, idx, eps, D: tl.constexpr, NORM: tl.constexpr, GEMMA: tl.constexpr, rstd):
    """x * rstd * (1 + w[idx]) (Gemma) or * w[idx] (plain); x itself without NORM."""
    if NORM:
        w = tl.load(w_ptr + idx).to(tl.float32)
        if GEMMA:
            w = 1.0 + w
        return x * rstd * w
    else:
        return x


@triton.jit
def _norm_rope_row(y_row, w_ptr, cos_row, sin_row, eps, dtype: tl.constexpr, D: tl.constexpr,
                   HALF: tl.constexpr, NORM: tl.constexpr, GEMMA: tl.constexpr, ROPE: tl.constexpr):
    cols = tl.arange(0, D)
    x = tl.load(y_row + cols).to(tl.float32)
    rstd = 1.0
    if NORM:
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
    xn = round_for(_norm(x, w_ptr, cols, eps, D, NORM, GEMMA, rstd), dtype)
    if ROPE:
        rot = cols < 2 * HALF
        first = cols < HALF
        partner = tl.where(first, cols + HALF, tl.where(rot, cols - HALF, cols))
        xp = tl.load(y_row + partner).to(tl.float32)
        xpn = round_for(_norm(xp, w_ptr, partner, eps, D, NORM, GEMMA, rstd), dtype)
        f = tl.where(first, cols, cols - HALF)
        c = tl.load(cos_row + f, mask=rot, other=1.0)
        s = tl.load(sin_row + f, mask=rot, other=0.0)
        turned = tl.where(first, xn * c - xpn * s, xn * c + xpn * s)
        xn = tl.where(rot, round_for(turned, dtype), xn)
    return xn


@triton.jit
def _branch_program(
    t, j, y_row, cos_row, sin_row, slot_ptr, eps,
    q_ptr, qw_ptr, kw_ptr, k_ptr, ks_ptr, kgs_ptr, v_ptr, vs_ptr, vgs_ptr, q_col, k_col, v_col, s_qt, s_qh,
    s_kp, s_kh, s_kt, s_ksp, s_ksh, s_kst, s_vp, s_vh, s_vt, s_vsp, s_vsh, s_vst,
    HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr, HALF: tl.constexpr, PAGE: tl.constexpr,
    NORM: tl.constexpr, GEMMA: tl.constexpr, ROPE: tl.constexpr, FMT: tl.constexpr,
):
    """Head row j of one branch for token t: a query head out, a key head or a value head into its cache."""
    dtype = q_ptr.dtype.element_ty
    if j < HQ:
        x = _norm_rope_row(y_row + q_col + j * D, qw_ptr, cos_row, sin_row, eps, dtype, D, HALF, NORM, GEMMA, ROPE)
        tl.store(q_ptr + t * s_qt + j * s_qh + tl.arange(0, D), x.to(dtype))
    else:
        slot = tl.load(slot_ptr + t).to(tl.int64)
        if slot >= 0:
            page = slot // PAGE
            off = slot % PAGE
            if j < HQ + HK:
                h = j - HQ
                x = _norm_rope_row(y_row + k_col + h * D, kw_ptr, cos_row, sin_row, eps, dtype, D, HALF,
                                   NORM, GEMMA, ROPE)
                store_kv_row(x, k_ptr, ks_ptr, kgs_ptr, page * s_kp + h * s_kh + off * s_kt,
                             page * s_ksp + h * s_ksh + off * s_kst, D, FMT)
            else:
                h = j - HQ - HK
                x = round_for(tl.load(y_row + v_col + h * D + tl.arange(0, D)).to(tl.float32), dtype)
                store_kv_row(x, v_ptr, vs_ptr, vgs_ptr, page * s_vp + h * s_vh + off * s_vt,
                             page * s_vsp + h * s_vsh + off * s_vst, D, FMT)


@triton.jit
def head_row(
    t, j, y_row, cos_row, sin_row, slot_ptr, eps,
    q_ptr, qw_ptr, kw_ptr, k_ptr, ks_ptr, kgs_ptr, v_ptr, vs_ptr, vgs_ptr, q_col, k_col, v_col, s_qt, s_qh,
    s_kp, s_kh, s_kt, s_ksp, s_ksh, s_kst, s_vp, s_vh, s_vt, s_vsp, s_vsh, s_vst,
    q2_ptr, qw2_ptr, kw2_ptr, k2_ptr, ks2_ptr, kgs2_ptr, v2_ptr, vs2_ptr, vgs2_ptr, q2_col, k2_col, v2_col,
    s_q2t, s_q2h, s_k2p, s_k2h, s_k2t, s_ks2p, s_ks2h, s_ks2t, s_v2p, s_v2h, s_v2t, s_vs2p, s_vs2h, s_vs2t,
    HQ: tl.constexpr, HK: tl.constexpr, HV: tl.constexpr, D: tl.constexpr, NORM: tl.constexpr,
    HQ2: tl.constexpr, HK2: tl.constexpr, D2: tl.constexpr, NORM2: tl.constexpr,
    HALF: tl.constexpr, PAGE: tl.constexpr, GEMMA: tl.constexpr, ROPE: tl.constexpr, FMT: tl.constexpr,
    TWO: tl.constexpr,
):
    """Head row j of token t (y_row its projection row): the first branch's HQ + HK + HV rows, then (TWO) the
    second's (norm_rope_write_kernel's program (t, j); also the qkv GEMM's tail, skinny_heads_triton)."""
    if TWO:
        if j >= HQ + HK + HV:
            _branch_program(t, j - (HQ + HK + HV), y_row, cos_row, sin_row, slot_ptr, eps,
                            q2_ptr, qw2_ptr, kw2_ptr, k2_ptr, ks2_ptr, kgs2_ptr, v2_ptr, vs2_ptr, vgs2_ptr,
                            q2_col, k2_col, v2_col, s_q2t, s_q2h, s_k2p, s_k2h, s_k2t, s_ks2p, s_ks2h, s_ks2t,
                            s_v2p, s_v2h, s_v2t, s_vs2p, s_vs2h, s_vs2t, HQ2, HK2, D2, HALF, PAGE, NORM2, GEMMA,
                            ROPE, FMT)
        else:
            _branch_program(t, j, y_row, cos_row, sin_row, slot_ptr, eps,
                            q_ptr, qw_ptr, kw_ptr, k_ptr, ks_ptr, kgs_ptr, v_ptr, vs_ptr, vgs_ptr,
                            q_col, k_col, v_col, s_qt, s_qh, s_kp, s_kh, s_kt, s_ksp, s_ksh, s_kst,
                            s_vp, s_vh, s_vt, s_vsp, s_vsh, s_vst, HQ, HK, D, HALF, PAGE, NORM, GEMMA, ROPE, FMT)
    else:
        _branch_program(t, j, y_row, cos_row, sin_row, slot_ptr, eps,
                        q_ptr, qw_ptr, kw_ptr, k_ptr, ks_ptr, kgs_ptr, v_ptr, vs_ptr, vgs_ptr,
                        q_col, k_col, v_col, s_qt, s_qh, s_kp, s_kh, s_kt, s_ksp, s_ksh, s_kst,
                        s_vp, s_vh, s_vt, s_vsp, s_vsh, s_vst, HQ, HK, D, HALF, PAGE, NORM, GEMMA, ROPE, FMT)


@triton.jit
def norm_rope_write_kernel(
    y_ptr, cos_ptr, sin_ptr, slot_ptr, eps, s_yt, s_ct,
    q_ptr, qw_ptr, kw_ptr, k_ptr, ks_ptr, kgs_ptr, v_ptr, vs_ptr, vgs_ptr, q_col, k_col, v_col, s_qt, s_qh,
    s_kp, s_kh, s_kt, s_ksp, s_ksh, s_kst, s_vp, s_vh, s_vt, s_vsp, s_vsh, s_vst,
    q2_ptr, qw2_ptr, kw2_ptr, k2_ptr, ks2_ptr, kgs2_ptr, v2_ptr, vs2_ptr, vgs2_ptr, q2_col, k2_col, v2_col,
    s_q2t, s_q2h, s_k2p, s_k2h, s_k2t, s_ks2p, s_ks2h, s_ks2t, s_v2p, s_v2h, s_v2t, s_vs2p, s_vs2h, s_vs2t,
    HQ: tl.constexpr, HK: tl.constexpr, HV: tl.constexpr, D: tl.constexpr, NORM: tl.constexpr,
    HQ2: tl.constexpr, HK2: tl.constexpr, D2: tl.constexpr, NORM2: tl.constexpr,
    HALF: tl.constexpr, PAGE: tl.constexpr, GEMMA: tl.constexpr, ROPE: tl.constexpr, FMT: tl.constexpr,
    TWO: tl.constexpr, PDL: tl.constexpr,
):
    """Grid (T, HQ + HK + HV [+ HQ2 + HK2 + HV2 with TWO]): the first branch's head rows, then (TWO)
    the second's (the index branch of an MSA layer: its cache in the same format), one launch."""
    pdl_wait(PDL)  # first: nothing global before it (pdl_triton)
    t = tl.program_id(0).to(tl.int64)
    head_row(t, tl.program_id(1), y_ptr + t * s_yt, cos_ptr + t * s_ct, sin_ptr + t * s_ct, slot_ptr, eps,
             q_ptr, qw_ptr, kw_ptr, k_ptr, ks_ptr, kgs_ptr, v_ptr, vs_ptr, vgs_ptr, q_col, k_col, v_col, s_qt, s_qh,
             s_kp, s_kh, s_kt, s_ksp, s_ksh, s_kst, s_vp, s_vh, s_vt, s_vsp, s_vsh, s_vst,
             q2_ptr, qw2_ptr, kw2_ptr, k2_ptr, ks2_ptr, kgs2_ptr, v2_ptr, vs2_ptr, vgs2_ptr, q2_col, k2_col, v2_col,
             s_q2t, s_q2h, s_k2p, s_k2h, s_k2t, s_ks2p, s_ks2h, s_ks2t, s_v2p, s_v2h, s_v2t, s_vs2p, s_vs2h, s_vs2t,
             HQ, HK, HV, D, NORM, HQ2, HK2, D2, NORM2, HALF, PAGE, GEMMA, ROPE, FMT, TWO)
