"""Triton paged GQA attention (dense or MSA-selected blocks) with split-KV and a reduce kernel.

Grid (static): (B * n_qblk, Hkv, n_seg). One program packs the G query heads of one KV head
times BLOCK_Q query tokens of one request into BLOCK_M >= 16 rows (row r: token r // G, head
r % G), so each K/V tile is read once per KV head and tl.dot has M >= 16. Keys come in tiles
of TILE tokens, each looking up its page in the block table. Dense mode walks the request's
keys 0..max position; sparse mode (BLOCK_Q = 1) walks the TOPK selected blocks of its token, read from the
selection, or (SELECT) picked by the program from its token's block scores (msa_index_triton.row_top_ids).
With SPLIT (n_seg > 1) each program writes a normalized partial output and its log2-sum-exp, and
`reduce_kernel` merges the segments. Lengths are read on the device only. NVFP4 scale strides
(s_ksp.., s_vsp..) count rows of D/16 scales (backend.scale_row_strides).
"""

import triton
import triton.language as tl

from m3bench.runtime.kernels.kv_tiles_triton import (
    dot_parts,
    kv_tile_factor,
    load_kv_parts,
    load_query,
    mma,
)
from m3bench.runtime.kernels.msa_index_triton import row_top_ids
from m3bench.runtime.kernels.pdl_triton import pdl_wait

NEG_BIG = tl.constexpr(-1.0e30)


@triton.jit
def _tile_start(it, sel_ptr, ids, seq_len, SPARSE: tl.constexpr, SELECT: tl.constexpr, SUB: tl.constexpr,
                PAGE: tl.constexpr, TILE: tl.constexpr):
    """Logical position of the first key of iteration `it`, and the key limit (0: no tile). SELECT: the blocks are
    the program's own picks `ids` (slot order), else read from the selection row."""
    if SPARSE:
        if SELECT:
            slots = tl.arange(0, ids.shape[0])
            blk = tl.max(tl.where(slots == it // SUB, ids, -1), axis=0)
        else:
            blk = tl.load(sel_ptr + it // SUB)
        return tl.maximum(blk, 0) * PAGE + (it % SUB) * TILE, tl.where(blk >= 0, seq_len, 0)
    else:
        return it * TILE, seq_len


@triton.jit(do_not_specialize=["n_qblk", "n_seg"])
def paged_attn_kernel(
    q_ptr, o_ptr, part_o_ptr, part_lse_ptr,
    k_ptr, ks_ptr, kgs_ptr, v_ptr, vs_ptr, vgs_ptr,
    bt_ptr, seq_lens_ptr, qsl_ptr, sel_ptr, sm_scale_log2, n_qblk, n_seg,
    s_qt, s_qh, s_ot, s_oh,
    s_kp, s_kh, s_kt, s_ksp, s_ksh, s_kst,
    s_vp, s_vh, s_vt, s_vsp, s_vsh, s_vst,
    s_bt, s_selt, s_selh,
    HQ: tl.constexpr, G: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr, TILE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, SPLIT: tl.constexpr,
    TOPK: tl.constexpr, SPARSE: tl.constexpr, FMT: tl.constexpr, F32: tl.constexpr, ASM: tl.constexpr,
    SELECT: tl.constexpr, TOPK_P2: tl.constexpr, RANK_N: tl.constexpr, LONG: tl.constexpr, CHUNK: tl.constexpr,
    ONE_CHUNK: tl.constexpr, PDL: tl.constexpr,
):
    pdl_wait(PDL)  # first: nothing global before it (pdl_triton)
    pid = tl.program_id(0)
    h = tl.program_id(1)
    seg = tl.program_id(2)
    b = pid // n_qblk
    qb = pid % n_qblk
    q_start = tl.load(qsl_ptr + b)
    q_len = tl.load(qsl_ptr + b + 1) - q_start
    if qb * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + b)
    rows = tl.arange(0, BLOCK_M)
    t = qb * BLOCK_Q + rows // G
    row_ok = (rows // G < BLOCK_Q) & (t < q_len)
    tok = (q_start + t).to(tl.int64)
    pos = seq_len - q_len + t
    head = h * G + rows % G
    cols = tl.arange(0, D)
    # NVFP4: every dot over the head dim in even and odd halves, as the tiles decode (q_a, q_b; else q_b is q_a)
    q_a, q_b = load_query(q_ptr + tok * s_qt + head * s_qh, row_ok, FMT, F32, D)

    SUB: tl.constexpr = PAGE // TILE
    if SPARSE:
        n_iter = TOPK * SUB
    else:
        n_iter = tl.cdiv(seq_len - q_len + tl.minimum(q_len, (qb + 1) * BLOCK_Q), TILE)
    per_seg = tl.cdiv(n_iter, n_seg)
    it_lo = seg * per_seg
    it_hi = tl.minimum(it_lo + per_seg, n_iter)
    sel_row = sel_ptr + (q_start + qb).to(tl.int64) * s_selt + h * s_selh
    if SELECT:  # sel_row: the token's block scores; its picks as msa_index_triton.topk_kernel makes them
        ids = row_top_ids(sel_row, (seq_len - q_len + qb) // PAGE + 1, TOPK, TOPK_P2, RANK_N, LONG, CHUNK, ONE_CHUNK)
    else:
        ids = tl.full([TOPK_P2], -1, tl.int32)  # not read
    kgs = kv_tile_factor(kgs_ptr, FMT)  # NVFP4: the tiles' global scale (x 64), applied to S and the output
    vgs = kv_tile_factor(vgs_ptr, FMT)
    s_scale = sm_scale_log2 * kgs

    m_i = tl.full([BLOCK_M], NEG_BIG, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    if FMT == 2:
        acc_even = tl.zeros([BLOCK_M, D // 2], tl.float32)
        acc_odd = tl.zeros([BLOCK_M, D // 2], tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, D], tl.float32)
    toks = tl.arange(0, TILE)
    for it in range(it_lo, it_hi):
        start, limit = _tile_start(it, sel_row, ids, seq_len, SPARSE, SELECT, SUB, PAGE, TILE)
        kpos = start + toks
        kmask = kpos < limit
        page = tl.load(bt_ptr + b * s_bt + start // PAGE).to(tl.int64)
        off = (start % PAGE + toks).to(tl.int64)
        k_off, ks_row = page * s_kp + h * s_kh + off * s_kt, page * s_ksp + h * s_ksh + off * s_kst
        v_off, vs_row = page * s_vp + h * s_vh + off * s_vt, page * s_vsp + h * s_vsh + off * s_vst
        k_a, k_b = load_kv_parts(k_ptr, ks_ptr, k_off, ks_row, kmask, FMT, TILE, D, ASM)
        v_a, v_b = load_kv_parts(v_ptr, vs_ptr, v_off, vs_row, kmask, FMT, TILE, D, ASM)
        s = dot_parts(q_a, q_b, k_a, k_b, FMT, F32) * s_scale
        ok = row_ok[:, None] & kmask[None, :] & (kpos[None, :] <= pos[:, None])
        m_new = tl.maximum(m_i, tl.max(tl.where(ok, s, NEG_BIG), axis=1))
        p = tl.where(ok, tl.exp2(tl.where(ok, s, NEG_BIG) - m_new[:, None]), 0.0)
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        p = p.to(q_a.dtype)
        if FMT == 2:
            acc_even = acc_even * alpha[:, None] + mma(p, v_a, F32)
            acc_odd = acc_odd * alpha[:, None] + mma(p, v_b, F32)
        else:
            acc = acc * alpha[:, None] + mma(p, v_a, F32)
        m_i = m_new

    if FMT == 2:
        acc = tl.reshape(tl.join(acc_even, acc_odd), (BLOCK_M, D))
    o = acc * (vgs / tl.where(l_i > 0, l_i, 1.0))[:, None]
    if not SPLIT:
        o_ptrs = o_ptr + tok[:, None] * s_ot + head[:, None] * s_oh + cols[None, :]
        tl.store(o_ptrs, o.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])
    else:
        prow = (tok * HQ + head) * n_seg + seg
        tl.store(part_o_ptr + prow[:, None] * D + cols[None, :], o, mask=row_ok[:, None])
        lse = tl.where(l_i > 0, m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
        tl.store(part_lse_ptr + prow, lse, mask=row_ok)


@triton.jit(do_not_specialize=["n_req"])
def reduce_kernel(
    part_o_ptr, part_lse_ptr, o_ptr, qsl_ptr, n_req, s_ot, s_oh,
    HQ: tl.constexpr, D: tl.constexpr, N_SEG: tl.constexpr, PDL: tl.constexpr,
):
    """out[t, h] = sum_s 2^(lse_s - max) o_s / sum_s 2^(lse_s - max); grid (T, HQ)."""
    pdl_wait(PDL)  # first: nothing global before it (pdl_triton)
    tok = tl.program_id(0)
    head = tl.program_id(1)
    if tok >= tl.load(qsl_ptr + n_req):
        return
    segs = tl.arange(0, N_SEG)
    cols = tl.arange(0, D)
    prow = (tok.to(tl.int64) * HQ + head) * N_SEG + segs
    lse = tl.load(part_lse_ptr + prow)
    top = tl.max(lse, axis=0)
    top = tl.where(top == float("-inf"), 0.0, top)
    w = tl.exp2(lse - top)
    parts = tl.load(part_o_ptr + prow[:, None] * D + cols[None, :])
    total = tl.sum(w, axis=0)
    o = tl.sum(w[:, None] * parts, axis=0) / tl.where(total > 0, total, 1.0)
    tl.store(o_ptr + tok.to(tl.int64) * s_ot + head * s_oh + cols, o.to(o_ptr.dtype.element_ty))
