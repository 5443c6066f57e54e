"""Triton MSA indexer: block scores over the paged index keys, then top-k with forced blocks.

block_scores_kernel, grid (B * n_qblk, n_seg): rows = BLOCK_Q tokens x HI index heads of one
request (>= 16 rows, one shared index-key head); the request's blocks are split over n_seg
programs (split over the context). Each block's score is the max over its keys j <= pos of
iq . ik[j] (fp32 accumulation); the local block gets +inf, init blocks INIT_SCORE; blocks after the
local one are left unspecified (never read).
topk_kernel, grid (B * max_q, HI): the TOPK best blocks of one (token, head) row of scores, sorted
(score desc, block id asc), -1 padded; NaN scores are never picked, -inf ones are (after the finite
ones). Rows of at most RANK_N valid blocks (8k context: 64) are ranked in one pass (each block's rank
is the count of blocks before it, from one [N, N] compare tile; rank r < TOPK lands in slot r), with
no sequential rounds; longer rows take TOPK rounds of one max over packed int64 (score, block) keys
(topk_keys_triton), the row in registers up to CHUNK blocks, else re-read chunk by chunk.
NVFP4 scale strides (s_ksp, s_kst) count rows of D/16 scales (backend.scale_row_strides).
"""

import triton
import triton.language as tl

from m3bench.runtime.kernels.kv_tiles_triton import (
    dot_parts,
    hoist_query_operand,
    kv_tile_factor,
    load_kv_parts,
    load_query,
)
from m3bench.runtime.kernels.pdl_triton import pdl_wait
from m3bench.runtime.kernels.topk_keys_triton import MAX_KEY, NO_KEY, key_index, ordered_key

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
    if BLOCK_M <= 32:  # decode rows (prefill's 64 rows held it in 32 more registers a thread: 144)
        hoist_query_operand(iq_a, iq_b, ik_ptr, iks_ptr, FMT, F32, D, ASM)
    _score_blocks(blk_lo, blk_hi, ik_ptr, iks_ptr, bt_ptr + b * s_bt, s_kp, s_kt, s_ksp, s_kst, iq_a, iq_b, gs,
                  scores_ptr + tok * s_st + head * s_sh, row_ok, pos // PAGE, PAGE, TILE, INIT_BLOCKS, FMT, F32,
                  D, ASM)


@triton.jit
def _score_blocks(blk_lo, blk_hi, ik_ptr, iks_ptr, bt_row, s_kp, s_kt, s_ksp, s_kst, iq_a, iq_b, gs,
                  out_row, row_ok, local, PAGE: tl.constexpr, TILE: tl.constexpr, INIT_BLOCKS: tl.constexpr,
                  FMT: tl.constexpr, F32: tl.constexpr, D: tl.constexpr, ASM: tl.constexpr):
    """Stores the scores of blocks blk_lo .. blk_hi - 1 of each row (block_scores_kernel), local: [rows] the
    row's local block. No causal or length mask: a block before a row's local one holds only keys at or
    before the row's position, its local block scores +inf whatever its keys, and topk_kernel reads no block
    after it. So masks changed no selection, while they cost ~100 of a decode step's instructions (sm90)."""
    toks = tl.arange(0, TILE)
    SUBS: tl.constexpr = PAGE // TILE
    best = tl.full(local.shape, float("-inf"), tl.float32)
    for it in range(blk_lo * SUBS, blk_hi * SUBS):  # one flat loop over key tiles: the pipeliner stages it
        blk = it // SUBS
        sub = it % SUBS
        # the page id as a [TILE] vector of one value: a tensor load, which the pipeliner issues ahead with
        # the tile loads that depend on it (a scalar load here cost NVFP4 keys ~20% on the H200)
        page = tl.load(bt_row + blk + toks * 0).to(tl.int64)
        off = (sub * TILE + toks).to(tl.int64)
        # every key of the page, also those past the context in its last page (they count only towards
        # scores that are forced or never read, see above): no predicates on the loads
        ik_a, ik_b = load_kv_parts(ik_ptr, iks_ptr, page * s_kp + off * s_kt, page * s_ksp + off * s_kst, None,
                                   FMT, TILE, D, ASM)
        tile_best = tl.max(dot_parts(iq_a, iq_b, ik_a, ik_b, FMT, F32), axis=1)
        best = tl.where(sub == 0, tile_best, tl.maximum(best, tile_best))
        last = (local * 0 + sub) == SUBS - 1  # the block's last tile stores its score (a [rows] mask: the
        #                                       interpreter refuses a scalar one beside a block)
        tl.store(out_row + blk, _block_score(best * gs, blk, local, INIT_BLOCKS), mask=row_ok & last)


@triton.jit
def _block_score(value, blk, local, INIT_BLOCKS: tl.constexpr):
    """A block's stored score: +inf for the row's local block, INIT_SCORE for init blocks, else value."""
    forced = tl.where((blk < INIT_BLOCKS) & (blk <= local), INIT_SCORE, value)
    return tl.where(blk == local, float("inf"), forced)


@triton.jit(do_not_specialize=["max_q"])
def topk_kernel(
    scores_ptr, out_ptr, seq_lens_ptr, qsl_ptr, max_q, s_st, s_sh, s_ot, s_oh,
    PAGE: tl.constexpr, TOPK: tl.constexpr, TOPK_P2: tl.constexpr, RANK_N: tl.constexpr,
    LONG: tl.constexpr, CHUNK: tl.constexpr, ONE_CHUNK: tl.constexpr, PDL: tl.constexpr,
):
    """The TOPK best blocks of one (token, head) row: by rank when the row has at most RANK_N valid
    blocks, else (LONG: rows that may be longer) by TOPK rounds of one max over packed keys."""
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
    out_row = out_ptr + tok * s_ot + head * s_oh
    if LONG:
        if n_valid <= RANK_N:
            _select_by_rank(row, out_row, n_valid, TOPK, RANK_N)
        else:
            _select_by_rounds(row, out_row, n_valid, TOPK, TOPK_P2, CHUNK, ONE_CHUNK)
    else:
        _select_by_rank(row, out_row, n_valid, TOPK, RANK_N)


@triton.jit
def _select_by_rank(row, out_row, n_valid, TOPK: tl.constexpr, N: tl.constexpr):
    """Rows of at most N valid blocks, in one pass: block i's rank is the number of blocks j ordered
    before it (a higher score, or the same score and a lower id), and rank r < TOPK goes to slot r.
    NaN scores (and the masked blocks >= n_valid, loaded as NaN) compare false with everything, so they
    rank nowhere and are not picked; the TOPK slots are set to -1 first, for rows with fewer picks.
    The compare tile is [j, i] so that its reduction runs over j, the axis each thread holds whole
    (the j scores reach every thread through one shared-memory broadcast): no shuffles."""
    i = tl.arange(0, N)[None, :]
    tl.store(out_row + i, -1, mask=i < TOPK)
    vi, rank = _block_ranks(row, n_valid, N)
    tl.debug_barrier()  # the -1 stores land before the picks that overwrite some of them
    tl.store(out_row + rank, i, mask=(vi == vi) & (rank < TOPK))


@triton.jit
def _block_ranks(row, n_valid, N: tl.constexpr):
    """(scores [1, N], ranks [1, N]) of a row's first N blocks: block i's rank is the number of blocks j ordered before
    it (a higher score, or the same score and a lower id), from one [j, i] compare tile reduced over j; blocks
    >= n_valid load as NaN."""
    j = tl.arange(0, N)[:, None]
    i = tl.arange(0, N)[None, :]
    vj = tl.load(row + j, mask=j < n_valid, other=float("nan"))
    vi = tl.load(row + i, mask=i < n_valid, other=float("nan"))
    before = (vj > vi) | ((vj == vi) & (j < i))
    return vi, tl.sum(before.to(tl.int32), axis=0, keep_dims=True)


@triton.jit
def _select_by_rounds(row, out_row, n_valid, TOPK: tl.constexpr, TOPK_P2: tl.constexpr, CHUNK: tl.constexpr,
                      ONE_CHUNK: tl.constexpr):
    """TOPK rounds of "the largest key below the previous pick"; with ONE_CHUNK the whole row stays in
    registers (one load), else every round re-reads it chunk by chunk."""
    slots = tl.arange(0, TOPK_P2)
    tl.store(out_row + slots, _ids_by_rounds(row, n_valid, TOPK, TOPK_P2, CHUNK, ONE_CHUNK), mask=slots < TOPK)


@triton.jit
def _ids_by_rounds(row, n_valid, TOPK: tl.constexpr, TOPK_P2: tl.constexpr, CHUNK: tl.constexpr,
                   ONE_CHUNK: tl.constexpr):
    """_select_by_rounds' picks [TOPK_P2] in slot order (-1 past the last pick and past TOPK)."""
    slots = tl.arange(0, TOPK_P2)
    ids = tl.full([TOPK_P2], -1, tl.int32)
    idx0 = tl.arange(0, CHUNK)
    keys = ordered_key(tl.load(row + idx0, mask=idx0 < n_valid, other=float("nan")), idx0, idx0 < n_valid)
    prev = tl.full([], MAX_KEY, tl.int64)
    for k in range(TOPK):
        if ONE_CHUNK:
            best = tl.max(tl.where(keys < prev, keys, NO_KEY), axis=0)
        else:
            best = _next_key(row, n_valid, prev, CHUNK)
        ids = tl.where(slots == k, key_index(best), ids)
        prev = best
    return ids


@triton.jit
def _next_key(row, n_valid, prev, CHUNK: tl.constexpr):
    """The largest key below `prev` in a row too long for registers, read chunk by chunk."""
    best = tl.full([], NO_KEY, tl.int64)
    for c in range(tl.cdiv(n_valid, CHUNK)):
        idx = c * CHUNK + tl.arange(0, CHUNK)
        keys = ordered_key(tl.load(row + idx, mask=idx < n_valid, other=float("nan")), idx, idx < n_valid)
        best = tl.maximum(best, tl.max(tl.where(keys < prev, keys, NO_KEY), axis=0))
    return best


@triton.jit
def row_top_ids(row, n_valid, TOPK: tl.constexpr, TOPK_P2: tl.constexpr, RANK_N: tl.constexpr, LONG: tl.constexpr,
                CHUNK: tl.constexpr, ONE_CHUNK: tl.constexpr):
    """topk_kernel's selection of one row of scores as a register vector [TOPK_P2] in slot order, -1 padded (for a
    kernel that attends to the blocks it selects: attention_triton's SELECT): by rank up to RANK_N valid blocks,
    else (LONG) by rounds."""
    if LONG:
        if n_valid <= RANK_N:
            ids = _ids_by_rank(row, n_valid, TOPK, TOPK_P2, RANK_N)
        else:
            ids = _ids_by_rounds(row, n_valid, TOPK, TOPK_P2, CHUNK, ONE_CHUNK)
    else:
        ids = _ids_by_rank(row, n_valid, TOPK, TOPK_P2, RANK_N)
    return ids


@triton.jit
def _ids_by_rank(row, n_valid, TOPK: tl.constexpr, TOPK_P2: tl.constexpr, N: tl.constexpr):
    """_select_by_rank's picks held in registers: slot s takes the block of rank s ([TOPK_P2, N] tile), -1 where no
    block has that rank."""
    vi, rank = _block_ranks(row, n_valid, N)
    rank = tl.where(vi == vi, rank, N)  # NaN: no rank
    slots = tl.arange(0, TOPK_P2)[:, None]
    return tl.max(tl.where((rank == slots) & (slots < TOPK), tl.arange(0, N)[None, :], -1), axis=1)
