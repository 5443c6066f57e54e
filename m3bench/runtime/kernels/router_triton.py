"""Triton router epilogue: sigmoid, correction bias, top-k, renormalise, scale, in one kernel.

Grid (cdiv(T, BLOCK_T),): one program loads BLOCK_T rows of the fp32 router logits [T, E] (E a
power of two), takes top-k by sigmoid + bias with k rounds of arg-max (ties: the lowest expert id,
highest first as torch.topk returns them), and writes the unbiased sigmoid weights of the chosen
experts renormalised to sum 1 times `scale`, with the expert ids (int64).
`router_align_kernel` (one program, T <= BLOCK_T) goes on to the fused MoE's alignment
(moe_triton.align_pairs) of the picks that land on this rank's experts [first, first + E_LOCAL) (and
the shared expert's pairs): the routing and the MoE's first launch in one.
`router_gemv_align_kernel`, grid (E / BLOCK_N, SPLIT), T <= 4: the router GEMM itself (skinny_triton.gemv_rows,
K split, the splits of an expert tile meeting as in mx_tiles_triton.finish_tile) writes the logits, and the last
tile to finish (a second counter, slot E / BLOCK_N) runs router_align_kernel's work: GEMM, top-k and
alignment in one launch.
"""

import triton
import triton.language as tl

from m3bench.runtime.kernels.moe_triton import align_pairs
from m3bench.runtime.kernels.mx_tiles_triton import last_split, store_partial, sum_partials
from m3bench.runtime.kernels.skinny_triton import gemv_rows


@triton.jit
def _topk_rows(logit_ptr, bias_ptr, rows, ok, scale, s_lt, E: tl.constexpr, K: tl.constexpr, KP: tl.constexpr,
               BLOCK_T: tl.constexpr, HAS_BIAS: tl.constexpr):
    """(weights [BLOCK_T, KP] fp32, expert ids [BLOCK_T, KP] int32) of the rows' top-k picks (slots >= K: 0)."""
    ex = tl.arange(0, E)
    logits = tl.load(logit_ptr + rows[:, None].to(tl.int64) * s_lt + ex[None, :], mask=ok[:, None], other=0.0)
    s = 1.0 / (1.0 + tl.exp(-logits))
    choice = s
    if HAS_BIAS:
        choice = s + tl.load(bias_ptr + ex)[None, :]
    slot = tl.arange(0, KP)
    w_acc = tl.zeros([BLOCK_T, KP], tl.float32)
    id_acc = tl.zeros([BLOCK_T, KP], tl.int32)
    for j in tl.static_range(K):
        best = tl.max(choice, axis=1)
        pick = tl.min(tl.where(choice == best[:, None], ex[None, :], E), axis=1)
        hit = ex[None, :] == pick[:, None]
        w_j = tl.sum(tl.where(hit, s, 0.0), axis=1)
        w_acc = tl.where(slot[None, :] == j, w_j[:, None], w_acc)
        id_acc = tl.where(slot[None, :] == j, pick[:, None], id_acc)
        choice = tl.where(hit, float("-inf"), choice)
    return w_acc / tl.sum(w_acc, axis=1)[:, None] * scale, id_acc


@triton.jit
def router_topk_kernel(
    logit_ptr, bias_ptr, w_ptr, id_ptr, n_tok, scale, s_lt,
    E: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, BLOCK_T: tl.constexpr, HAS_BIAS: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    ok = rows < n_tok
    w_acc, id_acc = _topk_rows(logit_ptr, bias_ptr, rows, ok, scale, s_lt, E, K, KP, BLOCK_T, HAS_BIAS)
    slot = tl.arange(0, KP)
    out = rows[:, None].to(tl.int64) * K + slot[None, :]
    keep = ok[:, None] & (slot[None, :] < K)
    tl.store(w_ptr + out, w_acc, mask=keep)
    tl.store(id_ptr + out, id_acc.to(tl.int64), mask=keep)


@triton.jit(do_not_specialize=["n_tok", "first"])
def router_align_kernel(
    logit_ptr, bias_ptr, w_ptr, id_ptr, n_tok, scale, s_lt, first, sorted_ptr, block_expert_ptr, n_post_ptr,
    E: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, BLOCK_T: tl.constexpr, HAS_BIAS: tl.constexpr,
    E_LOCAL: tl.constexpr, BLOCK_M: tl.constexpr, SHARED: tl.constexpr,
):
    """router_topk_kernel for all T <= BLOCK_T tokens (ids stored local: minus `first`), then
    moe_align_kernel's layout of the local picks:
    pair t * K + k (local expert id - first), the shared expert (SHARED: local id E_LOCAL) pairs
    T * K + t; padding marker T * K (+ T)."""
    route_align(logit_ptr, bias_ptr, w_ptr, id_ptr, n_tok, scale, s_lt, first, sorted_ptr, block_expert_ptr,
                n_post_ptr, E, K, KP, BLOCK_T, HAS_BIAS, E_LOCAL, BLOCK_M, SHARED)


@triton.jit
def route_align(logit_ptr, bias_ptr, w_ptr, id_ptr, n_tok, scale, s_lt, first, sorted_ptr, block_expert_ptr,
                n_post_ptr, E: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, BLOCK_T: tl.constexpr,
                HAS_BIAS: tl.constexpr, E_LOCAL: tl.constexpr, BLOCK_M: tl.constexpr, SHARED: tl.constexpr):
    rows = tl.arange(0, BLOCK_T)
    ok = rows < n_tok
    w_acc, id_acc = _topk_rows(logit_ptr, bias_ptr, rows, ok, scale, s_lt, E, K, KP, BLOCK_T, HAS_BIAS)
    slot = tl.arange(0, KP)
    pair = rows[:, None] * K + slot[None, :]
    keep = ok[:, None] & (slot[None, :] < K)
    local = id_acc - first
    tl.store(w_ptr + pair, w_acc, mask=keep)
    tl.store(id_ptr + pair, local.to(tl.int64), mask=keep)  # local ids (other ranks': outside [0, E_LOCAL))
    # The alignment reads the picks back as one flat row, as moe_align_kernel does: aligning the [BLOCK_T, KP]
    # tile through tl.reshape lost picks on the H200 (Triton 3.6; the interpreter was right) from 2 tokens on.
    tl.debug_barrier()  # the stores above are visible to every thread of the program
    n_pairs = n_tok * K
    flat = tl.arange(0, BLOCK_T * KP)
    picks = tl.load(id_ptr + flat, mask=flat < n_pairs, other=-1)
    picks = tl.where((picks >= 0) & (picks < E_LOCAL), picks, -1).to(tl.int32)
    marker = n_pairs
    if SHARED:
        marker = n_pairs + n_tok
    start = align_pairs(picks, flat, marker, n_tok * 0, sorted_ptr, block_expert_ptr, E_LOCAL, BLOCK_M)
    if SHARED:  # every token's pair with the shared expert, after the routed ones
        start = align_pairs(tl.where(ok, 0, -1), n_pairs + rows, marker, start, sorted_ptr, block_expert_ptr,
                            1, BLOCK_M, E_LOCAL)
    tl.store(n_post_ptr, start)


@triton.jit(do_not_specialize=["n_tok", "first"])
def router_gemv_align_kernel(
    x_ptr, rw_ptr, logit_ptr, part_ptr, cnt_ptr, s_xm, s_wn,
    bias_ptr, w_ptr, id_ptr, n_tok, scale, first, sorted_ptr, block_expert_ptr, n_post_ptr,
    H: tl.constexpr, K_SPLIT: tl.constexpr, SPLIT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    E: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, BLOCK_T: tl.constexpr, HAS_BIAS: tl.constexpr,
    E_LOCAL: tl.constexpr, BLOCK_M: tl.constexpr, SHARED: tl.constexpr,
):
    """logits[:T, n-tile] = x W_router^T (fp32), then (last tile) router_align_kernel on them. Logits [T, E]
    contiguous; the counters: one per expert tile, then slot E / BLOCK_N for the tiles."""
    TILES: tl.constexpr = E // BLOCK_N
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.arange(0, BLOCK_T)
    acc = gemv_rows(x_ptr, rw_ptr, n_tok, s_xm, s_wn, n, n < E, tl.program_id(1) * K_SPLIT, H, K_SPLIT, BLOCK_T,
                    BLOCK_N, BLOCK_K, True)
    mask = (rows < n_tok)[:, None] & (n < E)[None, :]
    cell = rows[:, None] * E + n[None, :]
    if SPLIT > 1:
        store_partial(acc, cell, mask, part_ptr, n_tok * E)
        if last_split(cnt_ptr, tl.program_id(0), SPLIT):
            tl.store(logit_ptr + cell, sum_partials(acc, cell, mask, part_ptr, n_tok * E, SPLIT), mask=mask)
            tl.atomic_xchg(cnt_ptr + tl.program_id(0), 0)
            _last_tile_routes(logit_ptr, cnt_ptr, bias_ptr, w_ptr, id_ptr, n_tok, scale, first, sorted_ptr,
                              block_expert_ptr, n_post_ptr, TILES, E, K, KP, BLOCK_T, HAS_BIAS, E_LOCAL, BLOCK_M,
                              SHARED)
    else:
        tl.store(logit_ptr + cell, acc, mask=mask)
        _last_tile_routes(logit_ptr, cnt_ptr, bias_ptr, w_ptr, id_ptr, n_tok, scale, first, sorted_ptr,
                          block_expert_ptr, n_post_ptr, TILES, E, K, KP, BLOCK_T, HAS_BIAS, E_LOCAL, BLOCK_M, SHARED)


@triton.jit
def _last_tile_routes(logit_ptr, cnt_ptr, bias_ptr, w_ptr, id_ptr, n_tok, scale, first, sorted_ptr, block_expert_ptr,
                      n_post_ptr, TILES: tl.constexpr, E: tl.constexpr, K: tl.constexpr, KP: tl.constexpr,
                      BLOCK_T: tl.constexpr, HAS_BIAS: tl.constexpr, E_LOCAL: tl.constexpr, BLOCK_M: tl.constexpr,
                      SHARED: tl.constexpr):
    """The last expert tile to store its logits routes and aligns every token, then resets the tiles' counter."""
    if last_split(cnt_ptr, TILES, TILES):
        route_align(logit_ptr, bias_ptr, w_ptr, id_ptr, n_tok, scale, E, first, sorted_ptr, block_expert_ptr,
                    n_post_ptr, E, K, KP, BLOCK_T, HAS_BIAS, E_LOCAL, BLOCK_M, SHARED)
        tl.atomic_xchg(cnt_ptr + TILES, 0)
