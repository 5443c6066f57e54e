"""The MSA top-k kernel as it was before the rank / packed-key rewrite (commit 293e21c), kept only so that
benchmarks/topk_speed.py can time old against new and the tests check that both select the same; the
runtime does not import this module.

    select_top_blocks_v0(scores, out, page, seq_lens, qsl, topk, max_q)
"""

from __future__ import annotations

import triton
import triton.language as tl

from m3bench.runtime.kernels.backend import next_pow2

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
