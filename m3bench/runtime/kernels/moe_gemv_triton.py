"""Triton routed experts at one token as GEMVs (no tl.dot, no alignment): the program's pick k = program_id(0) //
tiles reads its expert id from topk_ids and exits when the expert is another rank's; the rest is mx_gemv_kernel's
arithmetic (kernels/mx_tiles_triton.py): fp32 products summed within each 32-block, times the block's power of two
(SCALED: MXFP8; plain weights without), the cross-thread sum over the blocks once after the K loop.

    moe_gemv_gate_up_kernel  inter[k, n] = act(x . wg[e, n], x . wu[e, n]) (fp32), K split over program_id(1): the
                             tile's last split to finish sums the partials in split order and activates
    moe_gemv_down_kernel     y[c, k, n] = weight[k] * inter[k, chunk c] . wd[e, n, chunk c] (fp32 planes a K chunk,
                             summed with the picks by moe_triton.moe_sum_kernel or the add + norm after)
"""

import triton
import triton.language as tl

from m3bench.runtime.kernels.moe_quant_triton import swiglu
from m3bench.runtime.kernels.mx_tiles_triton import (
    MX_BLOCK,
    gemv_scales,
    gemv_weights,
    last_split,
    sum_partials,
)
from m3bench.runtime.kernels.pdl_triton import pdl_wait


@triton.jit
def pick_tile(ids_ptr, E, N: tl.constexpr, BLOCK_N: tl.constexpr):
    """(pick k, its expert id as int64, whether that expert is this rank's, the tile's rows n, n < N) of program_id(0):
    the picks' N-row outputs in BLOCK_N tiles, pick after pick."""
    n_tiles: tl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
    k = tl.program_id(0) // n_tiles
    e = tl.load(ids_ptr + k).to(tl.int64)
    n = tl.program_id(0) % n_tiles * BLOCK_N + tl.arange(0, BLOCK_N)
    return k, e, (e >= 0) & (e < E), n, n < N


@triton.jit
def gemv_block(w_rows, s_rows, xr, k0, n_ok, s_wb, K: tl.constexpr, G: tl.constexpr, SCALED: tl.constexpr,
               EVEN: tl.constexpr):
    """[BLOCK_N, G] fp32: the rows' (w_rows [BLOCK_N]) products with xr [G, 32] (fp32, inputs k0 ..) summed within
    each 32-block, times the block's power of two (SCALED; scales of a row at s_rows [BLOCK_N], one byte a block)."""
    part = tl.sum(gemv_weights(w_rows, k0, n_ok, s_wb, K, G, EVEN) * xr[None, :, :], axis=2)
    if SCALED:
        part = part * gemv_scales(s_rows, k0, n_ok, K, G)
    return part


@triton.jit
def input_blocks(x_row, k0, K: tl.constexpr, G: tl.constexpr):
    """A row's inputs k0 + [0, 32 G) as fp32 [G, 32] (0 past K)."""
    kk = k0 + tl.arange(0, G)[:, None] * MX_BLOCK + tl.arange(0, MX_BLOCK)[None, :]
    return tl.load(x_row + kk, mask=kk < K, other=0.0).to(tl.float32)


@triton.jit
def moe_gemv_gate_up_kernel(
    x_ptr, wg_ptr, wu_ptr, sg_ptr, su_ptr, ids_ptr, inter_ptr, part_ptr, cnt_ptr, alpha, limit,
    s_ge, s_gn, s_gb, s_ue, s_un, s_ub, s_sge, s_sgn, s_sue, s_sun, s_ik,
    E: tl.constexpr, H: tl.constexpr, I: tl.constexpr, TOPK: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, SPLIT: tl.constexpr, ACT: tl.constexpr, SCALED: tl.constexpr, EVEN: tl.constexpr,
    PDL: tl.constexpr,
):
    """inter[k, n-tile] (fp32) of the token's pick k = program_id(0) // tiles; grid (TOPK x I / BLOCK_N, SPLIT),
    program_id(1) the K piece (H / SPLIT inputs); partials part[piece, k, gate|up, I]."""
    pdl_wait(PDL)  # first: nothing global before it (pdl_triton)
    k, e, mine, n, n_ok = pick_tile(ids_ptr, E, I, BLOCK_N)
    if not mine:
        return
    G: tl.constexpr = BLOCK_K // MX_BLOCK
    wg_rows, wu_rows = wg_ptr + e * s_ge + n * s_gn, wu_ptr + e * s_ue + n * s_un
    sg_rows, su_rows = sg_ptr + e * s_sge + n * s_sgn, su_ptr + e * s_sue + n * s_sun
    acc_g = tl.zeros([BLOCK_N, G], tl.float32)
    acc_u = tl.zeros([BLOCK_N, G], tl.float32)
    k_begin = tl.program_id(1) * (H // SPLIT)
    for k_off in range(0, H // SPLIT, BLOCK_K):  # constant trip count
        k0 = k_begin + k_off
        xr = input_blocks(x_ptr, k0, H, G)
        acc_g += gemv_block(wg_rows, sg_rows, xr, k0, n_ok, s_gb, H, G, SCALED, EVEN)
        acc_u += gemv_block(wu_rows, su_rows, xr, k0, n_ok, s_ub, H, G, SCALED, EVEN)
    gate, up = tl.sum(acc_g, axis=1), tl.sum(acc_u, axis=1)
    out = inter_ptr + k * s_ik + n
    if SPLIT > 1:
        cell = (k * 2 * I + n).to(tl.int64)
        piece = part_ptr + tl.program_id(1).to(tl.int64) * (TOPK * 2 * I) + cell
        tl.store(piece, gate, mask=n_ok, cache_modifier=".cg")  # past L1: the last piece reads it
        tl.store(piece + I, up, mask=n_ok, cache_modifier=".cg")
        if last_split(cnt_ptr, tl.program_id(0), SPLIT):
            gate = sum_partials(gate, cell, n_ok, part_ptr, TOPK * 2 * I, SPLIT)
            up = sum_partials(up, cell + I, n_ok, part_ptr, TOPK * 2 * I, SPLIT)
            tl.store(out, swiglu(gate, up, alpha, limit, ACT), mask=n_ok)
            tl.atomic_xchg(cnt_ptr + tl.program_id(0), 0)
    else:
        tl.store(out, swiglu(gate, up, alpha, limit, ACT), mask=n_ok)


@triton.jit
def moe_gemv_down_kernel(
    inter_ptr, wd_ptr, sd_ptr, ids_ptr, weights_ptr, y_ptr, s_ik, s_de, s_dn, s_db, s_sde, s_sdn, s_yc, s_yp,
    E: tl.constexpr, I: tl.constexpr, H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    K_CHUNK: tl.constexpr, SCALED: tl.constexpr, EVEN: tl.constexpr, PDL: tl.constexpr,
):
    """y[c, k, n-tile] = weights[k] * inter[k, chunk c] . wd[e, n-tile, chunk c] (fp32); grid (TOPK x H / BLOCK_N,
    chunks), program_id(1) the chunk c of K_CHUNK inputs (the last one shorter)."""
    pdl_wait(PDL)  # first: nothing global before it (pdl_triton)
    k, e, mine, n, n_ok = pick_tile(ids_ptr, E, H, BLOCK_N)
    if not mine:
        return
    G: tl.constexpr = BLOCK_K // MX_BLOCK
    w_rows, s_rows = wd_ptr + e * s_de + n * s_dn, sd_ptr + e * s_sde + n * s_sdn
    acc = tl.zeros([BLOCK_N, G], tl.float32)
    k_begin = tl.program_id(1) * K_CHUNK
    for k_off in range(0, K_CHUNK, BLOCK_K):  # constant trip count (past I: masked, EVEN never)
        k0 = k_begin + k_off
        xr = input_blocks(inter_ptr + k * s_ik, k0, I, G)
        acc += gemv_block(w_rows, s_rows, xr, k0, n_ok, s_db, I, G, SCALED, EVEN)
    y = tl.sum(acc, axis=1) * tl.load(weights_ptr + k).to(tl.float32)
    tl.store(y_ptr + tl.program_id(1).to(tl.int64) * s_yc + k * s_yp + n, y, mask=n_ok)
