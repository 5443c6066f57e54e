"""Triton router epilogue: sigmoid, correction bias, top-k, renormalise, scale, in one kernel.

Grid (cdiv(T, BLOCK_T),): one program loads BLOCK_T rows of the fp32 router logits [T, E] (E a
power of two), takes top-k by sigmoid + bias with k rounds of one max over packed (choice, expert)
keys (topk_keys_triton; ties: the lowest expert id, highest first as torch.topk returns them), and
writes the unbiased sigmoid weights of the chosen experts renormalised to sum 1 times `scale`, with
the expert ids (int64).
`router_align_kernel` (one program, T <= BLOCK_T, a warp a token row up to 4) goes on to the fused
MoE's alignment of the picks that land on this rank's experts [first, first + E_LOCAL) (and the
shared expert's pairs), byte for byte moe_align_kernel's layout but computed for every expert at once
on an [experts, tokens] tile (no loop over the experts): the routing and the MoE's first launch in one.
"""

import triton
import triton.language as tl

from m3bench.runtime.kernels.pdl_triton import pdl_wait
from m3bench.runtime.kernels.topk_keys_triton import MAX_KEY, NO_KEY, key_index, ordered_key


@triton.jit
def _topk_rows(logit_ptr, bias_ptr, rows, ok, scale, s_lt, E: tl.constexpr, K: tl.constexpr, KP: tl.constexpr,
               BLOCK_T: tl.constexpr, HAS_BIAS: tl.constexpr):
    """(weights [BLOCK_T, KP] fp32, expert ids [BLOCK_T, KP] int32) of the rows' top-k picks (slots >= K: 0).
    A round is one max over packed (sigmoid + bias, expert) keys (topk_keys_triton), and one max over
    the sigmoids' bits at the winning key fetches the pick's weight (s >= 0: its bits order as integers)."""
    ex = tl.arange(0, E)[None, :]
    logits = tl.load(logit_ptr + rows[:, None].to(tl.int64) * s_lt + ex, mask=ok[:, None], other=0.0)
    s = 1.0 / (1.0 + tl.exp(-logits))
    choice = s
    if HAS_BIAS:
        choice = s + tl.load(bias_ptr + ex + rows[:, None] * 0)  # one row a token: the logits' layout, no conversion
    keys = ordered_key(choice, ex, ok[:, None])
    s_bits = s.to(tl.int32, bitcast=True)
    slot = tl.arange(0, KP)[None, :]
    w_acc = tl.zeros([BLOCK_T, KP], tl.float32)
    id_acc = tl.zeros([BLOCK_T, KP], tl.int32)
    prev = tl.full([BLOCK_T, 1], MAX_KEY, tl.int64)
    for j in tl.static_range(K):
        best = tl.max(tl.where(keys < prev, keys, NO_KEY), axis=1, keep_dims=True)
        w_bits = tl.max(tl.where(keys == best, s_bits, 0), axis=1, keep_dims=True)
        w_acc = tl.where(slot == j, w_bits.to(tl.float32, bitcast=True), w_acc)
        id_acc = tl.where(slot == j, key_index(best), id_acc)
        prev = best
    return w_acc / tl.sum(w_acc, axis=1)[:, None] * scale, id_acc


@triton.jit
def router_topk_kernel(
    logit_ptr, bias_ptr, w_ptr, id_ptr, n_tok, scale, s_lt,
    E: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, BLOCK_T: tl.constexpr, HAS_BIAS: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_wait(PDL)  # first: nothing global before it (pdl_triton)
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
    E_LOCAL: tl.constexpr, BLOCK_M: tl.constexpr, SHARED: tl.constexpr, EP: tl.constexpr, PDL: tl.constexpr,
):
    """router_topk_kernel for all T <= BLOCK_T tokens (ids stored local: minus `first`), then
    moe_align_kernel's layout of the local picks:
    pair t * K + k (local expert id - first), the shared expert (SHARED: local id E_LOCAL) pairs
    T * K + t; padding marker T * K (+ T). EP: E_LOCAL (+ 1) as a power of two."""
    pdl_wait(PDL)  # first: nothing global before it (pdl_triton)
    rows = tl.arange(0, BLOCK_T)
    ok = rows < n_tok
    w_acc, id_acc = _topk_rows(logit_ptr, bias_ptr, rows, ok, scale, s_lt, E, K, KP, BLOCK_T, HAS_BIAS)
    slot = tl.arange(0, KP)
    pair = rows[:, None] * K + slot[None, :]
    keep = ok[:, None] & (slot[None, :] < K)
    local = id_acc - first
    tl.store(w_ptr + pair, w_acc, mask=keep)
    tl.store(id_ptr + pair, local.to(tl.int64), mask=keep)  # local ids (other ranks': outside [0, E_LOCAL))
    # The alignment reads the picks back from memory, one row of tokens per slot k (aligning the [BLOCK_T, KP]
    # tile through tl.reshape lost picks on the H200 (Triton 3.6; the interpreter was right) from 2 tokens on).
    tl.debug_barrier()  # the stores above are visible to every thread of the program
    marker = n_tok * K
    if SHARED:
        marker = n_tok * K + n_tok
    n_post = _align_picks(id_ptr, n_tok, marker, sorted_ptr, block_expert_ptr, K, E_LOCAL, SHARED, EP, BLOCK_T,
                          BLOCK_M)
    tl.store(n_post_ptr + n_post * 0, n_post)


@triton.jit
def _align_picks(id_ptr, n_tok, marker, sorted_ptr, block_expert_ptr, K: tl.constexpr, E_LOCAL: tl.constexpr,
                 SHARED: tl.constexpr, EP: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_M: tl.constexpr):
    """moe_triton.align_pairs' layout of the stored picks (local ids [T, K]) and the shared expert's
    pairs, for every expert at once, on an [EP, BLOCK_T] tile of expert x token. A token picks an expert
    at most once, so the tile's 0 / 1 entries are the pairs and, along a row, in pair order: each
    expert's count, first slot (a prefix sum of whole blocks over the experts) and each pair's rank
    among the expert's pairs (a prefix sum over the tokens) come from reductions and scans of the tile,
    with no loop over the experts. Returns the slot after the last block ([1, 1])."""
    e = tl.arange(0, EP)[:, None]
    t = tl.arange(0, BLOCK_T)[None, :]
    picked = tl.zeros([EP, BLOCK_T], tl.int32)
    for k in tl.static_range(K):
        picked += (_local_pick(id_ptr, t, n_tok, k, K, E_LOCAL) == e).to(tl.int32)
    if SHARED:  # the shared expert (local id E_LOCAL): every token's pair, after the routed ones
        picked += ((e == E_LOCAL) & (t < n_tok)).to(tl.int32)
    cnt = tl.sum(picked, axis=1, keep_dims=True)
    n_blk = tl.cdiv(cnt, BLOCK_M)
    first = (tl.cumsum(n_blk, axis=0) - n_blk) * BLOCK_M  # [EP, 1]: the expert's first slot
    slot = first + tl.cumsum(picked, axis=1) - picked  # [EP, BLOCK_T]: token t's pair with expert e, if picked
    for k in tl.static_range(K):
        ids = _local_pick(id_ptr, t, n_tok, k, K, E_LOCAL)
        tl.store(sorted_ptr + tl.sum(tl.where(ids == e, slot, 0), axis=0, keep_dims=True), t * K + k, mask=ids >= 0)
    if SHARED:
        shared_slot = tl.sum(tl.where(e == E_LOCAL, slot, 0), axis=0, keep_dims=True)
        tl.store(sorted_ptr + shared_slot, n_tok * K + t, mask=t < n_tok)
    for pad0 in tl.static_range(0, BLOCK_M, BLOCK_T):  # the padding, BLOCK_T slots at a time
        pad = pad0 + t
        tl.store(sorted_ptr + first + cnt + pad, marker + pad * 0, mask=pad < n_blk * BLOCK_M - cnt)
    tl.store(block_expert_ptr + first // BLOCK_M + t, e + t * 0, mask=t < n_blk)  # n_blk <= BLOCK_T
    return tl.sum(n_blk, axis=0, keep_dims=True) * BLOCK_M


@triton.jit
def _local_pick(id_ptr, t, n_tok, k, K: tl.constexpr, E_LOCAL: tl.constexpr):
    """The tokens' k-th stored pick ([1, BLOCK_T] int32) where it is one of this rank's experts, else -1."""
    ids = tl.load(id_ptr + t * K + k, mask=t < n_tok, other=-1)
    return tl.where((ids >= 0) & (ids < E_LOCAL), ids, -1).to(tl.int32)
