"""Triton fused MoE: align (sort pairs by expert, pad to BLOCK_M), gate+up GEMM with the
activation fused, down GEMM with the routing weight fused, and a top-k reduction.

Pairs p = t * TOPK + k (token t, its k-th expert). Expert weights [E, I, H] (gate, up) and
[E, H, I] (down), contiguous along the reduction dim. FMT 1 (MXFP8): float8_e4m3fn weights and E8M0
scales [E, I, H/32] / [E, H, I/32]; FMT 2 (NVFP4): packed uint8 [E, I, H/2] / [E, H, I/2], e4m3 scales
per 16 inputs and an fp32 global scale per row [E, I] / [E, H]; both dequantized in registers. Grids are static upper bounds; programs
past the padded pair count (read on the device) exit at once.
"""

import triton
import triton.language as tl

from m3bench.runtime.kernels.kv_tiles_triton import mma
from m3bench.runtime.kernels.moe_quant_triton import pair_block, swiglu
from m3bench.runtime.kernels.mxfp8_triton import mx_dot, nv_weight_tile


@triton.jit(do_not_specialize=["n_pairs"])
def moe_align_kernel(
    ids_ptr, n_pairs, sorted_ptr, block_expert_ptr, n_post_ptr,
    E: tl.constexpr, BLOCK_M: tl.constexpr, NP: tl.constexpr,
):
    """One program: sorted_ptr[slot] = pair id (n_pairs marks padding), one expert per block."""
    offs = tl.arange(0, NP)
    ids = tl.load(ids_ptr + offs, mask=offs < n_pairs, other=-1)
    pad = tl.arange(0, BLOCK_M)
    start = tl.program_id(0) * 0  # an int32 tensor (n_pairs may be a constexpr 1)
    for e in range(E):
        hit = (ids == e).to(tl.int32)
        cnt = tl.sum(hit, axis=0)
        rank = tl.cumsum(hit, axis=0) - 1
        tl.store(sorted_ptr + start + rank, offs, mask=hit > 0)
        n_blk = tl.cdiv(cnt, BLOCK_M)
        tl.store(sorted_ptr + start + cnt + pad, n_pairs + pad * 0, mask=pad < n_blk * BLOCK_M - cnt)
        for i in range(n_blk):
            tl.store(block_expert_ptr + start // BLOCK_M + i, e)
        start += n_blk * BLOCK_M
    tl.store(n_post_ptr, start)


_activation = swiglu  # one definition with the quantized MoE kernels
_block_rows = pair_block


@triton.jit(do_not_specialize=["n_pairs"])
def moe_gate_up_kernel(
    x_ptr, wg_ptr, wu_ptr, inter_ptr, sorted_ptr, block_expert_ptr, n_post_ptr, n_pairs,
    alpha, limit, s_xt, s_ge, s_gn, s_ue, s_un, s_it, sg_ptr, su_ptr, s_sge, s_sgn, s_sue, s_sun,
    gg_ptr, gu_ptr, s_gge, s_gue,
    H: tl.constexpr, I: tl.constexpr, TOPK: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ACT: tl.constexpr, F32: tl.constexpr, FMT: tl.constexpr,
):
    """inter[slot, n] = act(x[tok] . wg[e, n], x[tok] . wu[e, n]) for the block's slots."""
    pid_m = tl.program_id(0)
    if pid_m * BLOCK_M >= tl.load(n_post_ptr):
        return
    e, slots, pair, row_ok = _block_rows(sorted_ptr, block_expert_ptr, n_pairs, pid_m, BLOCK_M)
    tok = (pair // TOPK).to(tl.int64)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < I
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, H, BLOCK_K):
        if FMT == 1:  # MXFP8: 32-wide sub-dots, each scaled by its E8M0 block
            a_rows = x_ptr + tok[:, None] * s_xt
            acc_g = mx_dot(acc_g, a_rows, wg_ptr + e * s_ge + n[:, None] * s_gn, sg_ptr + e * s_sge, s_sgn, n, n_ok,
                           row_ok, k0, H, F32, BLOCK_K)
            acc_u = mx_dot(acc_u, a_rows, wu_ptr + e * s_ue + n[:, None] * s_un, su_ptr + e * s_sue, s_sun, n, n_ok,
                           row_ok, k0, H, F32, BLOCK_K)
        else:
            kk = k0 + tl.arange(0, BLOCK_K)
            k_ok = kk < H
            a = tl.load(x_ptr + tok[:, None] * s_xt + kk[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            w_mask = n_ok[:, None] & k_ok[None, :]
            if FMT == 2:
                wg = nv_weight_tile(wg_ptr + e * s_ge, sg_ptr + e * s_sge, gg_ptr + e * s_gge, n, kk, s_gn, s_sgn,
                                    n_ok, k_ok)
                wu = nv_weight_tile(wu_ptr + e * s_ue, su_ptr + e * s_sue, gu_ptr + e * s_gue, n, kk, s_un, s_sun,
                                    n_ok, k_ok)
            else:
                wg = tl.load(wg_ptr + e * s_ge + n[:, None] * s_gn + kk[None, :], mask=w_mask, other=0.0)
                wu = tl.load(wu_ptr + e * s_ue + n[:, None] * s_un + kk[None, :], mask=w_mask, other=0.0)
            acc_g += mma(a, tl.trans(wg), F32)
            acc_u += mma(a, tl.trans(wu), F32)
    h = _activation(acc_g, acc_u, alpha, limit, ACT)
    out = inter_ptr + slots[:, None].to(tl.int64) * s_it + n[None, :]
    tl.store(out, h.to(inter_ptr.dtype.element_ty), mask=row_ok[:, None] & n_ok[None, :])


@triton.jit(do_not_specialize=["n_pairs"])
def moe_down_kernel(
    inter_ptr, wd_ptr, y_ptr, sorted_ptr, block_expert_ptr, n_post_ptr, weights_ptr, n_pairs,
    s_it, s_de, s_dn, s_yp, sd_ptr, s_sde, s_sdn, gd_ptr, s_gde,
    I: tl.constexpr, H: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, F32: tl.constexpr, FMT: tl.constexpr,
):
    """y[pair, n] = routing_weight[pair] * inter[slot] . wd[e, n]."""
    pid_m = tl.program_id(0)
    if pid_m * BLOCK_M >= tl.load(n_post_ptr):
        return
    e, slots, pair, row_ok = _block_rows(sorted_ptr, block_expert_ptr, n_pairs, pid_m, BLOCK_M)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < H
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    rows = slots[:, None].to(tl.int64) * s_it
    for k0 in range(0, I, BLOCK_K):
        if FMT == 1:  # MXFP8: 32-wide sub-dots, each scaled by its E8M0 block
            acc = mx_dot(acc, inter_ptr + rows, wd_ptr + e * s_de + n[:, None] * s_dn, sd_ptr + e * s_sde, s_sdn, n,
                         n_ok, row_ok, k0, I, F32, BLOCK_K)
        else:
            kk = k0 + tl.arange(0, BLOCK_K)
            k_ok = kk < I
            a = tl.load(inter_ptr + rows + kk[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            w_mask = n_ok[:, None] & k_ok[None, :]
            if FMT == 2:
                w = nv_weight_tile(wd_ptr + e * s_de, sd_ptr + e * s_sde, gd_ptr + e * s_gde, n, kk, s_dn, s_sdn,
                                   n_ok, k_ok)
            else:
                w = tl.load(wd_ptr + e * s_de + n[:, None] * s_dn + kk[None, :], mask=w_mask, other=0.0)
            acc += mma(a, tl.trans(w), F32)
    acc *= tl.load(weights_ptr + pair, mask=row_ok, other=0.0).to(tl.float32)[:, None]
    out = y_ptr + pair[:, None].to(tl.int64) * s_yp + n[None, :]
    tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=row_ok[:, None] & n_ok[None, :])


@triton.jit
def moe_sum_kernel(
    y_ptr, ids_ptr, out_ptr, s_yp, s_ot, E: tl.constexpr, H: tl.constexpr, TOPK: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """out[t, n] = sum over k with a local expert of y[t * TOPK + k, n]; grid (T, cdiv(H, BLOCK_N))."""
    t = tl.program_id(0).to(tl.int64)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_N], tl.float32)
    for k in range(TOPK):
        e = tl.load(ids_ptr + t * TOPK + k)
        n_end = tl.where((e >= 0) & (e < E), H, 0)  # (a vector mask, not vector & scalar bool)
        acc += tl.load(y_ptr + (t * TOPK + k) * s_yp + n, mask=n < n_end, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * s_ot + n, acc.to(out_ptr.dtype.element_ty), mask=n < H)
