"""The router's top-k (router_triton's) and the fused MoE's alignment for one token, made by each program of the MoE's
gate|up launch from the router's logits (moe_triton.moe_gate_up_kernel's ROUTE): the router's own launch left out.

Every program computes the same picks; the first one also stores them (weights, local ids) and the alignment
(moe_triton.align_pairs' layout: the local picks by expert id, one BLOCK_M block each, padded with the marker TOPK), for
the down GEMM and the sum launched after it.
"""

import triton
import triton.language as tl

from m3bench.runtime.kernels.topk_keys_triton import (
    MAX_KEY,
    NO_KEY,
    key_index,
    ordered_key,
)


@triton.jit
def topk_rows(logit_ptr, bias_ptr, rows, ok, scale, s_lt, E: tl.constexpr, K: tl.constexpr, KP: tl.constexpr,
              BLOCK_T: tl.constexpr, HAS_BIAS: tl.constexpr):
    """(weights [BLOCK_T, KP] fp32, expert ids [BLOCK_T, KP] int32) of the rows' top-k picks (slots >= K: 0): top-k by
    sigmoid + bias (ties: the lowest expert id), the unbiased sigmoids renormalised to sum 1 times `scale`. Each round
    is one max over packed (score, expert) keys (topk_keys_triton); the weights are gathered once after the rounds."""
    ex = tl.arange(0, E)
    logits = tl.load(logit_ptr + rows[:, None].to(tl.int64) * s_lt + ex[None, :], mask=ok[:, None], other=0.0)
    s = 1.0 / (1.0 + tl.exp(-logits))
    choice = s
    if HAS_BIAS:
        choice = s + tl.load(bias_ptr + ex)[None, :]
    keys = ordered_key(choice, ex[None, :] + rows[:, None] * 0, choice == choice)
    slot = tl.arange(0, KP)
    id_acc = tl.zeros([BLOCK_T, KP], tl.int32)
    prev = tl.full([BLOCK_T], MAX_KEY, tl.int64)
    for j in tl.static_range(K):
        best = tl.max(tl.where(keys < prev[:, None], keys, NO_KEY), axis=1)
        id_acc = tl.where(slot[None, :] == j, key_index(best)[:, None], id_acc)
        prev = best
    id_acc = tl.where(slot[None, :] < K, id_acc, 0)
    hit = (ex[None, None, :] == id_acc[:, :, None]) & (slot < K)[None, :, None]
    w_acc = tl.sum(tl.where(hit, s[:, None, :], 0.0), axis=2)
    return w_acc / tl.sum(w_acc, axis=1)[:, None] * scale, id_acc


@triton.jit
def routed_block(logit_ptr, bias_ptr, scale, first, w_out_ptr, id_out_ptr, sorted_ptr, block_expert_ptr, n_post_ptr,
                 pid_m, writer, E: tl.constexpr, TOPK: tl.constexpr, KP: tl.constexpr, HAS_BIAS: tl.constexpr,
                 E_LOCAL: tl.constexpr, BLOCK_M: tl.constexpr):
    """(local expert, slots, pair ids, live-row mask) of M-block pid_m for one token routed by its logits [1, E] (the
    expert -1 where the token has fewer local picks than pid_m + 1); `writer`: this program stores the picks
    (w_out [TOPK] fp32, id_out [TOPK] int64 local ids) and the alignment (sorted, block_expert, n_post)."""
    one = tl.arange(0, 1)
    w2, id2 = topk_rows(logit_ptr, bias_ptr, one, one == 0, scale, 0, E, TOPK, KP, 1, HAS_BIAS)
    slot = tl.arange(0, KP)
    w = tl.sum(w2, axis=0)
    local = tl.sum(id2, axis=0) - first
    mine = (slot < TOPK) & (local >= 0) & (local < E_LOCAL)
    # the block of a local pick: its place among the local picks by expert id (the picks' experts are distinct)
    rank = tl.sum(((local[None, :] < local[:, None]) & mine[None, :]).to(tl.int32), axis=1)
    if writer:
        n_mine = tl.sum(mine.to(tl.int32), axis=0)
        tl.store(w_out_ptr + slot, w, mask=slot < TOPK)
        tl.store(id_out_ptr + slot, local.to(tl.int64), mask=slot < TOPK)
        tl.store(block_expert_ptr + rank, local, mask=mine)
        flat = tl.arange(0, KP * BLOCK_M)
        first_row = flat % BLOCK_M == 0
        pick = tl.max(tl.where(mine[None, :] & (rank[None, :] == (flat // BLOCK_M)[:, None]), slot[None, :], -1),
                      axis=1)
        tl.store(sorted_ptr + flat, tl.where(first_row, pick, TOPK), mask=flat // BLOCK_M < n_mine)
        tl.store(n_post_ptr, n_mine * BLOCK_M)
    k = tl.max(tl.where(mine & (rank == pid_m), slot, -1), axis=0)
    e = tl.max(tl.where(slot == k, local, -1), axis=0)
    rows = tl.arange(0, BLOCK_M)
    pair = tl.where(rows == 0, k, TOPK)
    return e.to(tl.int64), pid_m * BLOCK_M + rows, pair, rows == 0  # (the caller leaves at e < 0)
