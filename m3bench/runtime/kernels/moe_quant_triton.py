"""Triton fused MoE over MXFP8 (FMT 1) or NVFP4 (FMT 2) experts: each K step dequantizes the whole expert
weight tile in registers (mx_tiles_triton.mx_tile / nv_tile) and runs ONE tl.dot with the weight tile on
the MMA's M side and the expert's block of pairs on its N side (swap AB: acc [BLOCK_N, BLOCK_M]).

Pairs p = t * TOPK + k sorted by expert and padded to BLOCK_M (moe.moe_align); weights as in moe_triton.py.
Programs past the padded pair count (read on the device) exit at once. EVEN: the weight tiles need no masks
(BLOCK_N divides the rows, BLOCK_K the inputs).
"""

import triton
import triton.language as tl

from m3bench.runtime.kernels.mx_tiles_triton import MX_BLOCK, dot_acc, mx_steps, mx_tile, nv_steps, nv_tile
from m3bench.runtime.kernels.pdl_triton import pdl_wait


@triton.jit
def row_globals(g_ptr, n, n_ok, FMT: tl.constexpr):
    """NVFP4: the rows' fp32 global scales x 64 (loop-invariant); MXFP8: unused zeros."""
    if FMT == 2:
        return tl.load(g_ptr + n, mask=n_ok, other=0.0).to(tl.float32) * 64.0
    else:
        return n.to(tl.float32) * 0.0


@triton.jit
def expert_steps(s_ptr, glob64, n, n_ok, k0, s_sn, K: tl.constexpr, BLOCK_K: tl.constexpr, F32: tl.constexpr,
                 FMT: tl.constexpr):
    """Per-block multipliers of one expert's tile at k0 (pointers already offset to the expert)."""
    if FMT == 1:
        return mx_steps(s_ptr, n, n_ok, k0, s_sn, K, BLOCK_K, F32)
    else:
        return nv_steps(s_ptr, glob64, n, n_ok, k0, s_sn, K, BLOCK_K, F32)


@triton.jit
def expert_tile(w_ptr, step, n, n_ok, k0, s_wn, K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                F32: tl.constexpr, FMT: tl.constexpr, EVEN: tl.constexpr):
    """[BLOCK_N, BLOCK_K] dequantized weights of one expert (pointer already offset to the expert)."""
    if FMT == 1:
        return mx_tile(w_ptr, step, n, n_ok, k0, s_wn, MX_BLOCK, K, BLOCK_N, BLOCK_K, F32, EVEN)
    else:
        return nv_tile(w_ptr, step, n, n_ok, k0, s_wn, K, BLOCK_N, BLOCK_K, F32, EVEN)


@triton.jit
def swiglu(g, u, alpha, limit, ACT: tl.constexpr):
    """ACT 0 swigluoai: g=min(g, L), u=clamp(u, -L, L), g*sigmoid(alpha g)*(u+1); 1 silu(g)*u."""
    if ACT == 0:
        g = tl.minimum(g, limit)
        u = tl.minimum(tl.maximum(u, -limit), limit)
        return g / (1.0 + tl.exp(-alpha * g)) * (u + 1.0)
    else:
        return g / (1.0 + tl.exp(-g)) * u


@triton.jit
def pair_block(sorted_ptr, block_expert_ptr, n_pairs, pid_m, BLOCK_M: tl.constexpr):
    """(expert, slots, pair ids, live-row mask) of the M-block pid_m."""
    e = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    slots = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_ptr + slots)
    return e, slots, pair, pair < n_pairs


@triton.jit(do_not_specialize=["n_pairs"])
def moe_quant_gate_up_kernel(
    x_ptr, wg_ptr, wu_ptr, inter_ptr, sorted_ptr, block_expert_ptr, n_post_ptr, n_pairs,
    alpha, limit, s_xt, s_ge, s_gn, s_ue, s_un, s_it, sg_ptr, su_ptr, s_sge, s_sgn, s_sue, s_sun,
    gg_ptr, gu_ptr, s_gge, s_gue, part_ptr, cnt_ptr, n_slots,
    H: tl.constexpr, I: tl.constexpr, TOPK: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ACT: tl.constexpr, F32: tl.constexpr, FMT: tl.constexpr,
    EVEN: tl.constexpr, SPLIT: tl.constexpr, PDL: tl.constexpr,
):
    """inter[slot, n] = act(x[tok] . wg[e, n], x[tok] . wu[e, n]); grid (M-blocks, I / BLOCK_N x SPLIT):
    program_id(1) = n tile + tiles x K piece (H / SPLIT inputs each; the pieces meet in split_gate_up)."""
    pdl_wait(PDL)  # first: nothing global before it (pdl_triton)
    pid_m = tl.program_id(0)
    if pid_m * BLOCK_M >= tl.load(n_post_ptr):
        return
    e, slots, pair, row_ok = pair_block(sorted_ptr, block_expert_ptr, n_pairs, pid_m, BLOCK_M)
    x_rows = x_ptr + (pair // TOPK).to(tl.int64) * s_xt
    n_tiles: tl.constexpr = (I + BLOCK_N - 1) // BLOCK_N
    n = tl.program_id(1) % n_tiles * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < I
    k_begin = tl.program_id(1) // n_tiles * (H // SPLIT)
    acc_g = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    acc_u = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    sg_e, su_e = sg_ptr + e * s_sge, su_ptr + e * s_sue
    glob_g = row_globals(gg_ptr + e * s_gge, n, n_ok, FMT)
    glob_u = row_globals(gu_ptr + e * s_gue, n, n_ok, FMT)
    step_g = expert_steps(sg_e, glob_g, n, n_ok, k_begin, s_sgn, H, BLOCK_K, F32, FMT)
    step_u = expert_steps(su_e, glob_u, n, n_ok, k_begin, s_sun, H, BLOCK_K, F32, FMT)
    for k_off in range(0, H // SPLIT, BLOCK_K):
        k0 = k_begin + k_off
        kk = k0 + tl.arange(0, BLOCK_K)
        xt = tl.trans(tl.load(x_rows[:, None] + kk[None, :], mask=row_ok[:, None] & (kk < H)[None, :], other=0.0))
        next_g = expert_steps(sg_e, glob_g, n, n_ok, k0 + BLOCK_K, s_sgn, H, BLOCK_K, F32, FMT)
        next_u = expert_steps(su_e, glob_u, n, n_ok, k0 + BLOCK_K, s_sun, H, BLOCK_K, F32, FMT)
        wg = expert_tile(wg_ptr + e * s_ge, step_g, n, n_ok, k0, s_gn, H, BLOCK_N, BLOCK_K, F32, FMT, EVEN)
        acc_g = dot_acc(wg, xt, acc_g, F32)
        wu = expert_tile(wu_ptr + e * s_ue, step_u, n, n_ok, k0, s_un, H, BLOCK_N, BLOCK_K, F32, FMT, EVEN)
        acc_u = dot_acc(wu, xt, acc_u, F32)
        step_g, step_u = next_g, next_u
    mask = n_ok[:, None] & row_ok[None, :]
    out = inter_ptr + slots[None, :].to(tl.int64) * s_it + n[:, None]
    if SPLIT > 1:
        tile = pid_m * n_tiles + tl.program_id(1) % n_tiles
        cell = slots[None, :].to(tl.int64) * I + n[:, None]
        piece = part_ptr + (tl.program_id(1) // n_tiles).to(tl.int64) * 2 * n_slots * I + cell
        tl.store(piece, acc_g, mask=mask, cache_modifier=".cg")
        tl.store(piece + n_slots * I, acc_u, mask=mask, cache_modifier=".cg")
        tl.debug_barrier()  # every thread's partial stored before the release below
        if tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel") == SPLIT - 1:  # the last piece sums them in order
            acc_g = tl.zeros_like(acc_g)
            acc_u = tl.zeros_like(acc_u)
            for sp in tl.static_range(SPLIT):  # all partials in flight at once
                acc_g += tl.load(part_ptr + sp * 2 * n_slots * I + cell, mask=mask, other=0.0, cache_modifier=".cg")
                acc_u += tl.load(part_ptr + (sp * 2 + 1) * n_slots * I + cell, mask=mask, other=0.0,
                                 cache_modifier=".cg")
            h = swiglu(acc_g, acc_u, alpha, limit, ACT)
            tl.store(out, h.to(inter_ptr.dtype.element_ty), mask=mask)
            tl.atomic_xchg(cnt_ptr + tile, 0)
    else:
        h = swiglu(acc_g, acc_u, alpha, limit, ACT)
        tl.store(out, h.to(inter_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["n_pairs"])
def moe_quant_down_kernel(
    inter_ptr, wd_ptr, y_ptr, sorted_ptr, block_expert_ptr, n_post_ptr, weights_ptr, n_pairs,
    s_it, s_de, s_dn, s_yp, sd_ptr, s_sde, s_sdn, gd_ptr, s_gde,
    I: tl.constexpr, H: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, F32: tl.constexpr, FMT: tl.constexpr, EVEN: tl.constexpr, PDL: tl.constexpr,
):
    """y[pair, n] = routing_weight[pair] * inter[slot] . wd[e, n]; grid (M-blocks, H / BLOCK_N)."""
    pdl_wait(PDL)  # first: nothing global before it (pdl_triton)
    pid_m = tl.program_id(0)
    if pid_m * BLOCK_M >= tl.load(n_post_ptr):
        return
    e, slots, pair, row_ok = pair_block(sorted_ptr, block_expert_ptr, n_pairs, pid_m, BLOCK_M)
    a_rows = inter_ptr + slots.to(tl.int64) * s_it
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < H
    acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    sd_e = sd_ptr + e * s_sde
    glob = row_globals(gd_ptr + e * s_gde, n, n_ok, FMT)
    step = expert_steps(sd_e, glob, n, n_ok, 0, s_sdn, I, BLOCK_K, F32, FMT)
    for k0 in range(0, I, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        at = tl.trans(tl.load(a_rows[:, None] + kk[None, :], mask=row_ok[:, None] & (kk < I)[None, :], other=0.0))
        next_step = expert_steps(sd_e, glob, n, n_ok, k0 + BLOCK_K, s_sdn, I, BLOCK_K, F32, FMT)
        w = expert_tile(wd_ptr + e * s_de, step, n, n_ok, k0, s_dn, I, BLOCK_N, BLOCK_K, F32, FMT, EVEN)
        acc = dot_acc(w, at, acc, F32)
        step = next_step
    acc *= tl.load(weights_ptr + pair, mask=row_ok, other=0.0).to(tl.float32)[None, :]
    out = y_ptr + pair[None, :].to(tl.int64) * s_yp + n[:, None]
    tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=n_ok[:, None] & row_ok[None, :])


@triton.jit
def topk_sum_kernel(
    y_ptr, ids_ptr, out_ptr, s_yp, s_ot, E: tl.constexpr, H: tl.constexpr, TOPK: tl.constexpr,
    TOPK_P2: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr,
):
    """out[t, n] = sum of y[t * TOPK + k, n] over the picks k of a local expert (ids in [0, E)), the
    [TOPK, BLOCK_N] rows read at once; grid (T, cdiv(H, BLOCK_N))."""
    pdl_wait(PDL)  # first: nothing global before it (pdl_triton)
    t = tl.program_id(0).to(tl.int64)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.arange(0, TOPK_P2)
    e = tl.load(ids_ptr + t * TOPK + k, mask=k < TOPK, other=-1)
    local = (e >= 0) & (e < E)
    rows = y_ptr + (t * TOPK + k)[:, None] * s_yp + n[None, :]
    v = tl.load(rows, mask=local[:, None] & (n < H)[None, :], other=0.0).to(tl.float32)
    tl.store(out_ptr + t * s_ot + n, tl.sum(v, axis=0).to(out_ptr.dtype.element_ty), mask=n < H)
