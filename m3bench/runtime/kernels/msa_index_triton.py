"""Triton MSA indexer: block scores over the paged index keys, then top-k with forced blocks.

block_scores_kernel, grid (B * n_qblk, n_seg): rows = BLOCK_Q tokens x HI index heads of one
request (>= 16 rows, one shared index-key head); the request's blocks are split over n_seg
programs (split over the context). Each block's score is the max over its keys j <= pos of
iq . ik[j] (fp32 accumulation); the local block gets +inf, init blocks INIT_SCORE.
topk_kernel, grid (B * max_q, HI): merges the segments' scores of one (token, head) row into
the TOPK best blocks, sorted (score desc, block id asc), -1 padded.
"""

import triton
import triton.language as tl

from m3bench.runtime.kernels.kv_tiles_triton import dot_parts, kv_tile_factor, load_kv_parts, load_query
from m3bench.runtime.kernels.pdl_triton import pdl_wait

INIT_SCORE = tl.constexpr(3.0e38)
NO_BLOCK = tl.constexpr(2147483647)


@triton.jit(do_not_specialize=["n_qblk", "n_seg"])
def block_scores_kernel(
    iq_ptr, ik_ptr, iks_ptr, ikgs_ptr, scores_ptr, bt_ptr, seq_lens_ptr, qsl_ptr, n_qblk, n_seg,
    s_qt, s_qh, s_kp, s_kt, s_ksp, s_kst, s_bt, s_st, s_sh,
    HI: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr, TILE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, INIT_BLOCKS: tl.constexpr, FMT: tl.constexpr, F32: tl.constexpr,
    ASM: tl.constexpr, PDL: tl.constexpr,
):
    pdl_wait(PDL)  # first: nothing global before it (pdl_triton)
    pid = tl.program_id(0)
    seg = tl.program_id(1)
    b = pid // n_qblk
    qb = pid % n_qblk
    q_start = tl.load(qsl_ptr + b)
    q_len = tl.load(qsl_ptr + b + 1) - q_start
    if qb * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + b)
    rows = tl.arange(0, BLOCK_M)
    t = qb * BLOCK_Q + rows // HI
    row_ok = (rows // HI < BLOCK_Q) & (t < q_len)
    tok = (q_start + t).to(tl.int64)
    head = rows % HI
    pos = seq_len - q_len + t
    iq_a, iq_b = load_query(iq_ptr + tok * s_qt + head * s_qh, row_ok, FMT, F32, D)  # NVFP4: in halves
    gs = kv_tile_factor(ikgs_ptr, FMT)  # NVFP4: the keys' global scale (x 64), applied to each block's max

    n_blocks = tl.cdiv(seq_len - q_len + tl.minimum(q_len, (qb + 1) * BLOCK_Q), PAGE)
    per_seg = tl.cdiv(n_blocks, n_seg)
    blk_lo = seg * per_seg
    blk_hi = tl.minimum(blk_lo + per_seg, n_blocks)
    toks = tl.arange(0, TILE)
    local = pos // PAGE
    out_row = scores_ptr + tok * s_st + head * s_sh
    SUBS: tl.constexpr = PAGE // TILE
    best = tl.full([BLOCK_M], float("-inf"), tl.float32)
    for it in range(blk_lo * SUBS, blk_hi * SUBS):  # one flat loop over key tiles: the pipeliner stages it
        blk = it // SUBS
        sub = it % SUBS
        # the page id as a [TILE] vector of one value: a tensor load, which the pipeliner issues ahead with
        # the tile loads that depend on it (a scalar load here cost NVFP4 keys ~20% on the H200)
        page = tl.load(bt_ptr + b * s_bt + blk + toks * 0).to(tl.int64)
        off = sub * TILE + toks
        kpos = blk * PAGE + off
        k_off = page * s_kp + off.to(tl.int64) * s_kt
        ks_off = page * s_ksp + off.to(tl.int64) * s_kst
        ik_a, ik_b = load_kv_parts(ik_ptr, iks_ptr, k_off, ks_off, kpos < seq_len, FMT, TILE, D, ASM)
        s = dot_parts(iq_a, iq_b, ik_a, ik_b, FMT, F32)
        ok = kpos[None, :] <= pos[:, None]
        tile_best = tl.max(tl.where(ok, s, float("-inf")), axis=1)
        best = tl.where(sub == 0, tile_best, tl.maximum(best, tile_best))
        fin = tl.where(best > float("-inf"), best * gs, best)  # gs > 0: the max commutes with it
        forced = tl.where((blk < INIT_BLOCKS) & (blk <= local), INIT_SCORE, fin)
        score = tl.where(blk == local, float("inf"), forced)
        last = (rows * 0 + sub) == SUBS - 1  # the block's last tile stores its score (a [BLOCK_M] mask: the
        #                                       interpreter refuses a scalar one beside a block)
        tl.store(out_row + blk, score, mask=row_ok & last)


@triton.jit(do_not_specialize=["max_q"])
def topk_kernel(
    scores_ptr, out_ptr, seq_lens_ptr, qsl_ptr, max_q, s_st, s_sh, s_ot, s_oh,
    PAGE: tl.constexpr, TOPK: tl.constexpr, TOPK_P2: tl.constexpr,
    CHUNK: tl.constexpr, ONE_CHUNK: tl.constexpr, PDL: tl.constexpr,
):
    """TOPK rounds of "largest (score, -id) after the previous pick"; with ONE_CHUNK the whole
    score row stays in registers (one load), else every round re-reads it chunk by chunk."""
    pdl_wait(PDL)  # first: nothing global before it (pdl_triton)
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
            best_val, best_idx = _best_after(row_vals, idx0, n_valid, prev_val, prev_idx)
        else:
            best_val, best_idx = _next_best(row, n_valid, prev_val, prev_idx, CHUNK)
        ids = tl.where(slots == k, tl.where(best_idx == NO_BLOCK, -1, best_idx), ids)
        prev_val = best_val
        prev_idx = best_idx
    tl.store(out_ptr + tok * s_ot + head * s_oh + slots, ids, mask=slots < TOPK)


@triton.jit
def _best_after(v, idx, n_valid, prev_val, prev_idx):
    """Largest (v, -idx) strictly after (prev_val, -prev_idx) among idx < n_valid; NO_BLOCK if none."""
    ok = (idx < n_valid) & ((v < prev_val) | ((v == prev_val) & (idx > prev_idx)))
    v = tl.where(ok, v, float("-inf"))
    best = tl.max(v, axis=0)
    return best, tl.min(tl.where(ok & (v == best), idx, NO_BLOCK), axis=0)


@triton.jit
def _next_best(row, n_valid, prev_val, prev_idx, CHUNK: tl.constexpr):
    """_best_after over a score row too long for registers, read chunk by chunk."""
    best_val = float("-inf")
    best_idx = NO_BLOCK
    for c in range(tl.cdiv(n_valid, CHUNK)):
        idx = c * CHUNK + tl.arange(0, CHUNK)
        v = tl.load(row + idx, mask=idx < n_valid, other=float("-inf"))
        c_val, c_idx = _best_after(v, idx, n_valid, prev_val, prev_idx)
        better = (c_val > best_val) & (c_idx != NO_BLOCK)
        best_idx = tl.where(better, c_idx, best_idx)
        best_val = tl.where(better, c_val, best_val)
    return best_val, best_idx
