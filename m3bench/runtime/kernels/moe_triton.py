"""Triton fused MoE: align (sort pairs by expert, pad to BLOCK_M), gate+up GEMM with the
activation fused, down GEMM with the routing weight fused, and a top-k reduction.

Pairs p = t * TOPK + k (token t, its k-th expert). With SHARED the shared expert is one more
expert (local id E_R, weight 1) that every token picks: its pairs are n_routed + t, its weights
their own tensors ([I_S, H] gate / up, [H, I_S] down, plain only). SPLIT > 1 (skinny batches) splits
the gate+up reduction into K chunks (SPLIT for the shared expert, SPLIT_R for routed ones: grid dim 1
enumerates N tiles x chunks) and writes fp32 partials by pair; the last chunk of a tile to finish (a split counter
per tile, mx_tiles_triton.last_split) sums them in chunk order and applies the activation, in the same launch.
Expert weights [E, I, H] (gate, up) and
[E, H, I] (down), contiguous along the reduction dim. FMT 1 (MXFP8): float8_e4m3fn weights and E8M0
scales [E, I, H/32] / [E, H, I/32]; FMT 2 (NVFP4): packed uint8 [E, I, H/2] / [E, H, I/2], e4m3 scales
per 16 inputs and an fp32 global scale per row [E, I] / [E, H]; FMT 3: NVFP4 with its codes as e4m3 bytes
(quant.e2m1_as_e4m3), run as FMT 1 with 16-wide sub-dots (SB) scaled by scale x global; all dequantized in
registers. Grids are static upper bounds; programs
past the padded pair count (read on the device) exit at once.
"""

import triton
import triton.language as tl

from m3bench.runtime.kernels.kv_tiles_triton import mma
from m3bench.runtime.kernels.moe_quant_triton import pair_block, swiglu
from m3bench.runtime.kernels.moe_route_triton import routed_block
from m3bench.runtime.kernels.mx_tiles_triton import last_split
from m3bench.runtime.kernels.mxfp8_triton import (
    act_block,
    mx_dot,
    mx_subdot,
    mx_weight_blocks,
    nv_weight_tile,
    sub_block_steps,
)
from m3bench.runtime.kernels.pdl_triton import pdl_wait


@triton.jit(do_not_specialize=["n_pairs", "n_shared"])
def moe_align_kernel(
    ids_ptr, n_pairs, n_shared, sorted_ptr, block_expert_ptr, n_post_ptr,
    E: tl.constexpr, BLOCK_M: tl.constexpr, NP: tl.constexpr, SHARED: tl.constexpr, PDL: tl.constexpr,
):
    """One program: sorted_ptr[slot] = pair id (n_pairs + n_shared marks padding), one expert per
    block; SHARED: expert E - 1 is the shared one, picked by pairs n_pairs .. n_pairs + n_shared - 1."""
    pdl_wait(PDL)  # first: nothing global before it (pdl_triton)
    offs = tl.arange(0, NP)
    ids = tl.load(ids_ptr + offs, mask=offs < n_pairs, other=-1)
    if SHARED:
        ids = tl.where((ids >= 0) & (ids < E - 1), ids, -1)  # other ranks' ids never hit the shared slot
        ids = tl.where((offs >= n_pairs) & (offs < n_pairs + n_shared), E - 1, ids)
    start = align_pairs(ids, offs, n_pairs + n_shared, tl.program_id(0) * 0, sorted_ptr, block_expert_ptr, E, BLOCK_M)
    tl.store(n_post_ptr, start)


@triton.jit
def align_pairs(ids, pairs, marker, start, sorted_ptr, block_expert_ptr, E: tl.constexpr, BLOCK_M: tl.constexpr,
                E_BASE: tl.constexpr = 0):
    """Experts 0..E-1 in order from slot `start` (an int32 tensor): the pairs (1D, ascending) whose
    id is e, padded with `marker` to whole BLOCK_M blocks, each block's expert (e + E_BASE) recorded;
    returns the slot after the last block."""
    pad = tl.arange(0, BLOCK_M)
    for e in range(E):
        hit = (ids == e).to(tl.int32)
        cnt = tl.sum(hit, axis=0)
        rank = tl.cumsum(hit, axis=0) - 1
        tl.store(sorted_ptr + start + rank, pairs, mask=hit > 0)
        n_blk = tl.cdiv(cnt, BLOCK_M)
        tl.store(sorted_ptr + start + cnt + pad, marker + pad * 0, mask=pad < n_blk * BLOCK_M - cnt)
        for i in range(n_blk):
            tl.store(block_expert_ptr + start // BLOCK_M + i, e + E_BASE)
        start += n_blk * BLOCK_M
    return start


gated_activation = swiglu  # one definition with the quantized MoE kernels
_block_rows = pair_block


@triton.jit
def _pick_expert(e, w_ptr, s_e, s_n, ws_ptr, s_wsn, N: tl.constexpr, N_S: tl.constexpr, E_R: tl.constexpr):
    """(weight base, row stride, rows N) of local expert e: the stacked routed weights, or the shared
    expert's own at e == E_R (all int64 tensors, so both branches agree)."""
    base = w_ptr + e * s_e
    s_row = e * 0 + s_n
    rows = e * 0 + N
    if e == E_R:
        base = ws_ptr + e * 0
        s_row = e * 0 + s_wsn
        rows = e * 0 + N_S
    return base, s_row, rows


@triton.jit(do_not_specialize=["n_pairs", "n_routed"])
def moe_gate_up_kernel(
    x_ptr, wg_ptr, wu_ptr, inter_ptr, sorted_ptr, block_expert_ptr, n_post_ptr, n_pairs,
    alpha, limit, s_xt, s_ge, s_gn, s_ue, s_un, s_it, sg_ptr, su_ptr, s_sge, s_sgn, s_sue, s_sun,
    gg_ptr, gu_ptr, s_gge, s_gue, n_routed, wsg_ptr, wsu_ptr, s_wsg, s_wsu, part_ptr, s_pk, s_pp, s_gb, s_ub,
    cnt_ptr, logit_ptr, rbias_ptr, r_scale, first, w_out_ptr, id_out_ptr,
    H: tl.constexpr, I: tl.constexpr, TOPK: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ACT: tl.constexpr, F32: tl.constexpr, FMT: tl.constexpr,
    SHARED: tl.constexpr, E_R: tl.constexpr, I_S: tl.constexpr, SPLIT: tl.constexpr, SPLIT_R: tl.constexpr,
    SB: tl.constexpr, ROUTE: tl.constexpr, E_ALL: tl.constexpr, KP: tl.constexpr, HAS_BIAS: tl.constexpr,
    E_LOCAL: tl.constexpr, PDL: tl.constexpr,
):
    """inter[slot, n] = act(x[tok] . wg[e, n], x[tok] . wu[e, n]) for the block's slots (SPLIT > 1:
    the fp32 partials of one K chunk into part[chunk, pair]; SPLIT chunks for the shared expert,
    SPLIT_R for a routed one, the grid's dim 1 spanning N tiles x chunks of the larger of the two; the tile's
    last chunk to finish sums them in chunk order, activates, and resets its counter cnt[block * N_T + tile]).
    FMT 1 and 3 run SB-wide sub-dots (mxfp8_triton.mx_subdot). ROUTE (one token, no shared expert): each program
    routes the token from its router logits [1, E_ALL] (moe_route_triton.routed_block); the first program stores the
    picks (w_out, id_out: local ids, `first` off) and the alignment the down GEMM reads."""
    pdl_wait(PDL)  # first: nothing global before it (pdl_triton)
    pid_m = tl.program_id(0)
    if ROUTE:
        e, slots, pair, row_ok = routed_block(logit_ptr, rbias_ptr, r_scale, first, w_out_ptr, id_out_ptr, sorted_ptr,
                                              block_expert_ptr, n_post_ptr, pid_m,
                                              (pid_m == 0) & (tl.program_id(1) == 0), E_ALL, TOPK, KP, HAS_BIAS,
                                              E_LOCAL, BLOCK_M)
        if e < 0:
            return
    else:
        if pid_m * BLOCK_M >= tl.load(n_post_ptr):
            return
        e, slots, pair, row_ok = _block_rows(sorted_ptr, block_expert_ptr, n_pairs, pid_m, BLOCK_M)
    if SHARED:
        tok = tl.where(pair < n_routed, pair // TOPK, pair - n_routed).to(tl.int64)
        wg_base, s_gn_e, n_lim = _pick_expert(e, wg_ptr, s_ge, s_gn, wsg_ptr, s_wsg, I, I_S, E_R)
        wu_base, s_un_e, n_lim = _pick_expert(e, wu_ptr, s_ue, s_un, wsu_ptr, s_wsu, I, I_S, E_R)
    else:
        tok = (pair // TOPK).to(tl.int64)
        wg_base, s_gn_e, wu_base, s_un_e, n_lim = wg_ptr + e * s_ge, s_gn, wu_ptr + e * s_ue, s_un, I
    if SPLIT > 1:  # program_id(1) = N tile * n_split + K chunk (the grid covers the larger product)
        n_split = tl.where(e == E_R, SPLIT, SPLIT_R)
        pid_n = tl.program_id(1) // n_split
        pid_k = tl.program_id(1) % n_split
        k_per = tl.cdiv(tl.cdiv(H, n_split), BLOCK_K) * BLOCK_K
        k_lo = pid_k * k_per
        k_hi = tl.minimum(k_lo + k_per, H)
    else:
        pid_n, pid_k, k_lo, k_hi = tl.program_id(1), 0, 0, H
    if pid_n * BLOCK_N >= n_lim:
        return
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < n_lim
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    G: tl.constexpr = BLOCK_K // SB
    if FMT == 1 or FMT == 3:  # MXFP8 scales (NVFP4's scale x global), each K step's loaded one step ahead
        sg_rows, su_rows = sg_ptr + e * s_sge + n * s_sgn, su_ptr + e * s_sue + n * s_sun
        gg_rows, gu_rows = gg_ptr + e * s_gge + n, gu_ptr + e * s_gue + n
        steps_g = sub_block_steps(sg_rows, gg_rows, n_ok, k_lo, H, G, FMT)
        steps_u = sub_block_steps(su_rows, gu_rows, n_ok, k_lo, H, G, FMT)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        if FMT == 1 or FMT == 3:  # SB-wide sub-dots, each scaled by its block's multiplier; one activation block
            next_g = sub_block_steps(sg_rows, gg_rows, n_ok, k0 + BLOCK_K, H, G, FMT)
            next_u = sub_block_steps(su_rows, gu_rows, n_ok, k0 + BLOCK_K, H, G, FMT)
            qg = mx_weight_blocks(wg_ptr + e * s_ge + n[:, None] * s_gn, s_gb, n_ok, k0, H, BLOCK_K, SB)
            qu = mx_weight_blocks(wu_ptr + e * s_ue + n[:, None] * s_un, s_ub, n_ok, k0, H, BLOCK_K, SB)
            for j in tl.static_range(G):
                kk = k0 + j * SB + tl.arange(0, SB)
                a = act_block(x_ptr + tok[:, None] * s_xt, kk, row_ok[:, None] & (kk < H)[None, :], F32)
                acc_g = mx_subdot(acc_g, a, qg[j], steps_g[j], F32)
                acc_u = mx_subdot(acc_u, a, qu[j], steps_u[j], F32)
            steps_g, steps_u = next_g, next_u
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
                wg = tl.load(wg_base + n[:, None] * s_gn_e + kk[None, :], mask=w_mask, other=0.0)
                wu = tl.load(wu_base + n[:, None] * s_un_e + kk[None, :], mask=w_mask, other=0.0)
            acc_g += mma(a, tl.trans(wg), F32)
            acc_u += mma(a, tl.trans(wu), F32)
    mask = row_ok[:, None] & n_ok[None, :]
    if SPLIT > 1:
        part = part_ptr + pair[:, None].to(tl.int64) * s_pp + n[None, :]
        tl.store(part + pid_k * s_pk, acc_g, mask=mask, cache_modifier=".cg")  # past L1: the last chunk reads it
        tl.store(part + pid_k * s_pk + I, acc_u, mask=mask, cache_modifier=".cg")
        N_T: tl.constexpr = (I + BLOCK_N - 1) // BLOCK_N + (I_S + BLOCK_N - 1) // BLOCK_N  # tiles a block, at most
        tile = pid_m * N_T + pid_n
        if last_split(cnt_ptr, tile, n_split):
            acc_g = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            acc_u = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            for k in range(0, n_split):  # chunk order: deterministic
                acc_g += tl.load(part + k * s_pk, mask=mask, other=0.0, cache_modifier=".cg")
                acc_u += tl.load(part + k * s_pk + I, mask=mask, other=0.0, cache_modifier=".cg")
            _store_inter(acc_g, acc_u, inter_ptr, slots, n, mask, s_it, alpha, limit, ACT)
            tl.atomic_xchg(cnt_ptr + tile, 0)
    else:
        _store_inter(acc_g, acc_u, inter_ptr, slots, n, mask, s_it, alpha, limit, ACT)


@triton.jit
def _store_inter(acc_g, acc_u, inter_ptr, slots, n, mask, s_it, alpha, limit, ACT: tl.constexpr):
    h = gated_activation(acc_g, acc_u, alpha, limit, ACT)
    tl.store(inter_ptr + slots[:, None].to(tl.int64) * s_it + n[None, :], h.to(inter_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["n_pairs", "n_routed"])
def moe_down_kernel(
    inter_ptr, wd_ptr, y_ptr, sorted_ptr, block_expert_ptr, n_post_ptr, weights_ptr, n_pairs,
    s_it, s_de, s_dn, s_yp, s_ys, sd_ptr, s_sde, s_sdn, gd_ptr, s_gde, n_routed, wsd_ptr, s_wsd, s_db,
    I: tl.constexpr, H: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, K_CHUNK: tl.constexpr, F32: tl.constexpr, FMT: tl.constexpr,
    SHARED: tl.constexpr, E_R: tl.constexpr, I_S: tl.constexpr, SB: tl.constexpr, PDL: tl.constexpr,
):
    """y[c, pair, n] = routing_weight[pair] * inter[slot, chunk c] . wd[e, n, chunk c] (the shared expert's pairs:
    weight 1), with K_CHUNK > 0 the reduction over I split in chunks of K_CHUNK (grid axis 2), which
    moe_sum_kernel sums; K_CHUNK 0: one chunk, all of I."""
    pdl_wait(PDL)  # first: nothing global before it (pdl_triton)
    pid_m = tl.program_id(0)
    if pid_m * BLOCK_M >= tl.load(n_post_ptr):
        return
    e, slots, pair, row_ok = _block_rows(sorted_ptr, block_expert_ptr, n_pairs, pid_m, BLOCK_M)
    if SHARED:
        wd_base, s_dn_e, k_end = _pick_expert(e, wd_ptr, s_de, s_dn, wsd_ptr, s_wsd, I, I_S, E_R)
    else:
        wd_base, s_dn_e, k_end = wd_ptr + e * s_de, s_dn, I
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < H
    if K_CHUNK > 0:
        k_lo = tl.program_id(2) * K_CHUNK
        k_hi = tl.minimum(k_lo + K_CHUNK, k_end)
        y_ptr += tl.program_id(2).to(tl.int64) * s_ys
    else:
        k_lo = 0
        k_hi = k_end
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    rows = slots[:, None].to(tl.int64) * s_it
    if FMT == 1 or FMT == 3:  # MXFP8 scales (NVFP4's scale x global), each K step's loaded one step ahead
        sd_rows, gd_rows = sd_ptr + e * s_sde + n * s_sdn, gd_ptr + e * s_gde + n
        steps = sub_block_steps(sd_rows, gd_rows, n_ok, k_lo, I, BLOCK_K // SB, FMT)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        if FMT == 1 or FMT == 3:  # SB-wide sub-dots, each scaled by its block's multiplier
            next_steps = sub_block_steps(sd_rows, gd_rows, n_ok, k0 + BLOCK_K, I, BLOCK_K // SB, FMT)
            acc = mx_dot(acc, inter_ptr + rows, wd_ptr + e * s_de + n[:, None] * s_dn, s_db, steps, n_ok, row_ok,
                         k0, I, F32, BLOCK_K, SB)
            steps = next_steps
        else:
            kk = k0 + tl.arange(0, BLOCK_K)
            k_ok = kk < k_end
            a = tl.load(inter_ptr + rows + kk[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            w_mask = n_ok[:, None] & k_ok[None, :]
            if FMT == 2:
                w = nv_weight_tile(wd_ptr + e * s_de, sd_ptr + e * s_sde, gd_ptr + e * s_gde, n, kk, s_dn, s_sdn,
                                   n_ok, k_ok)
            else:
                w = tl.load(wd_base + n[:, None] * s_dn_e + kk[None, :], mask=w_mask, other=0.0)
            acc += mma(a, tl.trans(w), F32)
    if SHARED:
        acc *= tl.load(weights_ptr + pair, mask=row_ok & (pair < n_routed), other=1.0).to(tl.float32)[:, None]
    else:
        acc *= tl.load(weights_ptr + pair, mask=row_ok, other=0.0).to(tl.float32)[:, None]
    out = y_ptr + pair[:, None].to(tl.int64) * s_yp + n[None, :]
    tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=row_ok[:, None] & n_ok[None, :])


@triton.jit
def moe_partials_sum(y_ptr, ids_ptr, add_ptr, t, n, s_yp, s_ys, s_at, n_routed, E: tl.constexpr, H: tl.constexpr,
                     TOPK: tl.constexpr, CHUNKS: tl.constexpr, SHARED: tl.constexpr, ADD: tl.constexpr,
                     BLOCK_N: tl.constexpr):
    """Token t's columns n of a fused MoE's result, fp32: sum over k with a local expert of y[c, t * TOPK + k, n] over
    the down GEMM's CHUNKS chunks c (+ the shared expert's row y[0, n_routed + t] with SHARED, one chunk) (+ add[t, n]
    with ADD), in that order, over BLOCK_N columns n (moe_sum_kernel's, and add_norm_triton's MoE variant's)."""
    acc = tl.zeros([BLOCK_N], tl.float32)
    for k in range(TOPK):
        e = tl.load(ids_ptr + t * TOPK + k)
        n_end = tl.where((e >= 0) & (e < E), H, 0)  # (a vector mask, not vector & scalar bool)
        for c in tl.static_range(CHUNKS):
            acc += tl.load(y_ptr + c * s_ys + (t * TOPK + k) * s_yp + n, mask=n < n_end, other=0.0).to(tl.float32)
    if SHARED:
        acc += tl.load(y_ptr + (n_routed + t) * s_yp + n, mask=n < H, other=0.0).to(tl.float32)
    if ADD:
        acc += tl.load(add_ptr + t * s_at + n, mask=n < H, other=0.0).to(tl.float32)
    return acc


@triton.jit(do_not_specialize=["n_routed"])
def moe_sum_kernel(
    y_ptr, ids_ptr, out_ptr, add_ptr, s_yp, s_ys, s_ot, s_at, n_routed, E: tl.constexpr, H: tl.constexpr,
    TOPK: tl.constexpr, CHUNKS: tl.constexpr, BLOCK_N: tl.constexpr, SHARED: tl.constexpr, ADD: tl.constexpr,
    PDL: tl.constexpr,
):
    """out[t, n] = moe_partials_sum in out's dtype; grid (T, cdiv(H, BLOCK_N))."""
    pdl_wait(PDL)  # first: nothing global before it (pdl_triton)
    t = tl.program_id(0).to(tl.int64)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = moe_partials_sum(y_ptr, ids_ptr, add_ptr, t, n, s_yp, s_ys, s_at, n_routed, E, H, TOPK, CHUNKS, SHARED, ADD,
                           BLOCK_N)
    tl.store(out_ptr + t * s_ot + n, acc.to(out_ptr.dtype.element_ty), mask=n < H)
