"""The MSA top-k and router top-k + align kernels as they were before the rank / packed-key rewrite
(commit 293e21c), kept only so that benchmarks/topk_speed.py can time old against new and check that
both select the same; the runtime does not import this module.

    select_top_blocks_v0(scores, out, page, seq_lens, qsl, topk, max_q)
    router_topk_align_v0(logits, bias, top_k, scale, first, n_local, block_m, shared)
    router_topk_v0(logits, bias, top_k, scale)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from m3bench.runtime.kernels.backend import next_pow2
from m3bench.runtime.kernels.moe_align import MoeAlignment, align_slots
from m3bench.runtime.kernels.moe_triton import align_pairs

NO_BLOCK = tl.constexpr(2147483647)
MAX_TOPK_CHUNK = 4096


def select_top_blocks_v0(scores, out, page, seq_lens, qsl, topk, max_q):
    """The old msa_index._launch_topk: TOPK rounds of max + min, 4 warps (8 past 1024 blocks)."""
    n_req, hi = seq_lens.shape[0], scores.shape[1]
    chunk = min(MAX_TOPK_CHUNK, max(16, next_pow2(scores.shape[-1])))
    topk_kernel_v0[(n_req * max_q, hi)](
        scores, out, seq_lens, qsl, max_q,
        scores.stride(0), scores.stride(1), out.stride(0), out.stride(1),
        PAGE=page, TOPK=topk, TOPK_P2=next_pow2(topk), CHUNK=chunk,
        ONE_CHUNK=chunk >= scores.shape[-1], num_warps=4 if chunk <= 1024 else 8,
    )


def router_topk_align_v0(logits, bias, top_k, scale, first, n_local, block_m, shared):
    """The old router.router_topk_align: K rounds of max + min + sum, then a loop over the experts."""
    n_tok, n_exp = logits.shape
    dev = logits.device
    w = torch.empty((n_tok, top_k), dtype=torch.float32, device=dev)
    ids = torch.empty((n_tok, top_k), dtype=torch.int64, device=dev)
    n_slots = align_slots(n_tok * top_k, n_local, block_m, n_tok if shared else 0)
    out = MoeAlignment(torch.empty((n_slots,), dtype=torch.int32, device=dev),
                       torch.empty((n_slots // block_m,), dtype=torch.int32, device=dev),
                       torch.empty((1,), dtype=torch.int32, device=dev))
    router_align_kernel_v0[(1,)](
        logits, logits if bias is None else bias, w, ids, n_tok, float(scale), logits.stride(0), int(first),
        out.sorted_ids, out.block_expert, out.n_post, E=n_exp, K=top_k, KP=next_pow2(top_k),
        BLOCK_T=next_pow2(max(n_tok, 1)), HAS_BIAS=bias is not None, E_LOCAL=n_local, BLOCK_M=block_m,
        SHARED=shared, num_warps=4,
    )
    return w, ids, out


def router_topk_v0(logits, bias, top_k, scale):
    """The old router.router_topk (BLOCK_T rows a program, 4 warps)."""
    n_tok, n_exp = logits.shape
    w = torch.empty((n_tok, top_k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((n_tok, top_k), dtype=torch.int64, device=logits.device)
    block_t = max(1, min(16, 4096 // n_exp))
    router_topk_kernel_v0[(triton.cdiv(n_tok, block_t),)](
        logits, logits if bias is None else bias, w, ids, n_tok, float(scale), logits.stride(0),
        E=n_exp, K=top_k, KP=next_pow2(top_k), BLOCK_T=block_t, HAS_BIAS=bias is not None, num_warps=4,
    )
    return w, ids


@triton.jit(do_not_specialize=["max_q"])
def topk_kernel_v0(
    scores_ptr, out_ptr, seq_lens_ptr, qsl_ptr, max_q, s_st, s_sh, s_ot, s_oh,
    PAGE: tl.constexpr, TOPK: tl.constexpr, TOPK_P2: tl.constexpr,
    CHUNK: tl.constexpr, ONE_CHUNK: tl.constexpr,
):
    """TOPK rounds of "largest (score, -id) after the previous pick"; with ONE_CHUNK the whole
    score row stays in registers (one load), else every round re-reads it chunk by chunk."""
    pid = tl.program_id(0)
    head = tl.program_id(1)
    b = pid // max_q
    t = pid % max_q
    q_start = tl.load(qsl_ptr + b)
    q_len = tl.load(qsl_ptr + b + 1) - q_start
    if t >= q_len:
        return
    tok = (q_start + t).to(tl.int64)
    n_valid = (tl.load(seq_lens_ptr + b) - q_len + t) // PAGE + 1
    row = scores_ptr + tok * s_st + head * s_sh
    slots = tl.arange(0, TOPK_P2)
    ids = tl.full([TOPK_P2], -1, tl.int32)
    idx0 = tl.arange(0, CHUNK)
    row_vals = tl.load(row + idx0, mask=idx0 < n_valid, other=float("-inf"))
    prev_val = float("inf")
    prev_idx = -1
    for k in range(TOPK):
        if ONE_CHUNK:
            best_val, best_idx = _best_after_v0(row_vals, idx0, n_valid, prev_val, prev_idx)
        else:
            best_val, best_idx = _next_best_v0(row, n_valid, prev_val, prev_idx, CHUNK)
        ids = tl.where(slots == k, tl.where(best_idx == NO_BLOCK, -1, best_idx), ids)
        prev_val = best_val
        prev_idx = best_idx
    tl.store(out_ptr + tok * s_ot + head * s_oh + slots, ids, mask=slots < TOPK)


@triton.jit
def _best_after_v0(v, idx, n_valid, prev_val, prev_idx):
    """Largest (v, -idx) strictly after (prev_val, -prev_idx) among idx < n_valid; NO_BLOCK if none."""
    ok = (idx < n_valid) & ((v < prev_val) | ((v == prev_val) & (idx > prev_idx)))
    v = tl.where(ok, v, float("-inf"))
    best = tl.max(v, axis=0)
    return best, tl.min(tl.where(ok & (v == best), idx, NO_BLOCK), axis=0)


@triton.jit
def _next_best_v0(row, n_valid, prev_val, prev_idx, CHUNK: tl.constexpr):
    """_best_after_v0 over a score row too long for registers, read chunk by chunk."""
    best_val = float("-inf")
    best_idx = NO_BLOCK
    for c in range(tl.cdiv(n_valid, CHUNK)):
        idx = c * CHUNK + tl.arange(0, CHUNK)
        v = tl.load(row + idx, mask=idx < n_valid, other=float("-inf"))
        c_val, c_idx = _best_after_v0(v, idx, n_valid, prev_val, prev_idx)
        better = (c_val > best_val) & (c_idx != NO_BLOCK)
        best_idx = tl.where(better, c_idx, best_idx)
        best_val = tl.where(better, c_val, best_val)
    return best_val, best_idx


@triton.jit
def _topk_rows_v0(logit_ptr, bias_ptr, rows, ok, scale, s_lt, E: tl.constexpr, K: tl.constexpr, KP: tl.constexpr,
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
def router_topk_kernel_v0(
    logit_ptr, bias_ptr, w_ptr, id_ptr, n_tok, scale, s_lt,
    E: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, BLOCK_T: tl.constexpr, HAS_BIAS: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    ok = rows < n_tok
    w_acc, id_acc = _topk_rows_v0(logit_ptr, bias_ptr, rows, ok, scale, s_lt, E, K, KP, BLOCK_T, HAS_BIAS)
    slot = tl.arange(0, KP)
    out = rows[:, None].to(tl.int64) * K + slot[None, :]
    keep = ok[:, None] & (slot[None, :] < K)
    tl.store(w_ptr + out, w_acc, mask=keep)
    tl.store(id_ptr + out, id_acc.to(tl.int64), mask=keep)


@triton.jit(do_not_specialize=["n_tok", "first"])
def router_align_kernel_v0(
    logit_ptr, bias_ptr, w_ptr, id_ptr, n_tok, scale, s_lt, first, sorted_ptr, block_expert_ptr, n_post_ptr,
    E: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, BLOCK_T: tl.constexpr, HAS_BIAS: tl.constexpr,
    E_LOCAL: tl.constexpr, BLOCK_M: tl.constexpr, SHARED: tl.constexpr,
):
    """router_topk_kernel for all T <= BLOCK_T tokens (ids stored local: minus `first`), then
    moe_align_kernel's layout of the local picks:
    pair t * K + k (local expert id - first), the shared expert (SHARED: local id E_LOCAL) pairs
    T * K + t; padding marker T * K (+ T)."""
    rows = tl.arange(0, BLOCK_T)
    ok = rows < n_tok
    w_acc, id_acc = _topk_rows_v0(logit_ptr, bias_ptr, rows, ok, scale, s_lt, E, K, KP, BLOCK_T, HAS_BIAS)
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
