"""Triton decode GEMMs over MXFP8 / NVFP4 weights, the whole weight tile dequantized in registers at once.

    mx_tile(...) -> [BLOCK_N, BLOCK_K] weights: the fp8 bytes loaded as [BLOCK_N, BLOCK_K/32, 32] (16-byte
                    vector loads), one conversion, one broadcast multiply by the block's power of two
                    (mx_steps: E8M0 `s` -> 2**(s - 127) as the fp32 bit pattern s << 23, no exp2; the
                    kernels load the steps one K step ahead, as the pipeliner only moves the tiles)
    nv_tile(...) -> the same for NVFP4 (E2M1 codes two a byte, e4m3 scale per 16, fp32 global per row):
                    the codes, read as int32 words, become e4m3 codes with word-wide bit operations
    mx_gemv_kernel  skinny M (<= 4 rows): no tl.dot; fp32 products reduced per 32-block, then scaled (or
                    not: the plain-weight GEMV of kernels/skinny.py, the fp32 router)
    mx_dot_kernel   M up to 64: y^T = W x^T as ONE tl.dot per BLOCK_K step (the weight tile is the
                    MMA's M side, the padded batch its N side: "swap AB")

Both split K over program_id(1) when N alone does not fill the GPU; the last split of an output tile to
finish (an atomic counter per tile, reset by that program) sums the fp32 partials in a fixed order, so
the result is deterministic and no second kernel runs (`finish_tile`).
"""

import triton
import triton.language as tl

from m3bench.runtime.kernels.pdl_triton import pdl_wait

MX_BLOCK = tl.constexpr(32)
NV_BLOCK = tl.constexpr(16)


@triton.jit
def e8m0_scale(s):
    """uint8 E8M0 -> fp32 2**(s - 127) as a bit pattern (s = 0 gives 0 instead of 2**-127)."""
    return (s.to(tl.int32) << 23).to(tl.float32, bitcast=True)


@triton.jit
def mx_steps(s_ptr, n, n_ok, k0, s_sn, K: tl.constexpr, BLOCK_K: tl.constexpr, F32: tl.constexpr):
    """The power of two of each 32-block of rows n, inputs k0 + [0, BLOCK_K): [BLOCK_N, BLOCK_K / 32], bf16
    (exact; fp32 if F32), 0 past K. Loaded one K step ahead of its tile (the pipeliner moves only the tiles)."""
    blk = k0 // MX_BLOCK + tl.arange(0, BLOCK_K // MX_BLOCK)
    ok = n_ok[:, None] & (blk * MX_BLOCK < K)[None, :]
    step = e8m0_scale(tl.load(s_ptr + n.to(tl.int64)[:, None] * s_sn + blk[None, :], mask=ok, other=0))
    if not F32:
        step = step.to(tl.bfloat16)
    return step


@triton.jit
def block_cols(k0, s_wb, G: tl.constexpr):
    """Offsets [G, 32] in a weight row of its inputs k0 + [0, 32 G) (k0 a multiple of 32), the row's 32-wide
    blocks s_wb apart: 32 row-major, N * 32 block-major (quant.block_major)."""
    blk = tl.arange(0, G) + k0 // MX_BLOCK  # (the tensor first: k0 may be a constexpr)
    return blk[:, None] * s_wb + tl.arange(0, MX_BLOCK)[None, :]


@triton.jit
def gemv_weights(w_rows, k0, n_ok, s_wb, K: tl.constexpr, G: tl.constexpr, EVEN: tl.constexpr):
    """The GEMVs' weights of rows w_rows [BLOCK_N] (pointers), inputs k0 + [0, 32 G), as fp32 [BLOCK_N, G, 32]
    (0 past N or K; EVEN: no masks, the tile exists)."""
    ptrs = w_rows[:, None, None] + block_cols(k0, s_wb, G)[None, :, :]
    if EVEN:
        w = tl.load(ptrs)
    else:
        kk = k0 + tl.arange(0, G)[:, None] * MX_BLOCK + tl.arange(0, MX_BLOCK)[None, :]
        w = tl.load(ptrs, mask=n_ok[:, None, None] & (kk < K)[None, :, :], other=0.0)
    return w.to(tl.float32)


@triton.jit
def gemv_scales(s_rows, k0, n_ok, K: tl.constexpr, G: tl.constexpr):
    """The powers of two [BLOCK_N, G] (fp32) of the GEMVs' 32-blocks k0 // 32 + [0, G) of rows whose scales start
    at s_rows [BLOCK_N] (pointers, one byte a block); 0 past N or K."""
    g = tl.arange(0, G)
    s_ok = n_ok[:, None] & (k0 + g * MX_BLOCK < K)[None, :]
    return e8m0_scale(tl.load(s_rows[:, None] + (k0 // MX_BLOCK + g)[None, :], mask=s_ok, other=0))


@triton.jit
def mx_tile(w_ptr, step, n, n_ok, k0, s_wn, s_wb, K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
            F32: tl.constexpr, EVEN: tl.constexpr):
    """Dequantized MXFP8 weights [BLOCK_N, BLOCK_K] (rows n, inputs k0 + [0, BLOCK_K)) in step's dtype:
    one conversion and one multiply by the block's step (mx_steps). EVEN: no masks (the tile exists).
    s_wn, s_wb: the rows' and their 32-blocks' strides (block_cols)."""
    G: tl.constexpr = BLOCK_K // MX_BLOCK
    kk = k0 + tl.arange(0, G)[:, None] * MX_BLOCK + tl.arange(0, MX_BLOCK)[None, :]  # [G, 32]
    ptrs = (w_ptr + n.to(tl.int64) * s_wn)[:, None, None] + block_cols(k0, s_wb, G)[None, :, :]
    if EVEN:
        w = tl.load(ptrs)
    else:
        w = tl.load(ptrs, mask=n_ok[:, None, None] & (kk < K)[None, :, :], other=0.0)
    return tl.reshape(w.to(step.dtype) * step[:, :, None], (BLOCK_N, BLOCK_K))


@triton.jit
def nv_steps(s_ptr, glob64, n, n_ok, k0, s_sn, K: tl.constexpr, BLOCK_K: tl.constexpr, F32: tl.constexpr):
    """NVFP4 multiplier of each 16-block: e4m3 scale x the row's global x 64 (glob64 [BLOCK_N], fp32):
    [BLOCK_N, BLOCK_K / 16] in bf16 (fp32 if F32), 0 past K."""
    blk = k0 // NV_BLOCK + tl.arange(0, BLOCK_K // NV_BLOCK)
    ok = n_ok[:, None] & (blk * NV_BLOCK < K)[None, :]
    sc = tl.load(s_ptr + n.to(tl.int64)[:, None] * s_sn + blk[None, :], mask=ok, other=0.0)
    step = sc.to(tl.float32) * glob64[:, None]
    if not F32:
        step = step.to(tl.bfloat16)
    return step


@triton.jit
def bytes_of(v):
    """[..., 2, 2] uint8 of int32 words v [...]: [..., e, f] is byte 2e + f (flattened: the low byte first)."""
    b0, b1 = (v & 255).to(tl.uint8), ((v >> 8) & 255).to(tl.uint8)
    b2, b3 = ((v >> 16) & 255).to(tl.uint8), ((v >> 24) & 255).to(tl.uint8)
    return tl.join(tl.join(b0, b2), tl.join(b1, b3))


@triton.jit
def nv_tile(w_ptr, step, n, n_ok, k0, s_wn, K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
            F32: tl.constexpr, EVEN: tl.constexpr):
    """Dequantized NVFP4 weights [BLOCK_N, BLOCK_K] from int32 words of packed E2M1 codes (w_ptr, s_wn in
    words: eight codes a word, element 2j in byte j's low nibble). The codes become e4m3 codes of the same
    values / 64 four at a time with word-wide bit operations (kv_tiles_triton.e2m1_as_e4m3 per byte), then
    one fp8 conversion and one multiply by the block's step (nv_steps)."""
    G: tl.constexpr = BLOCK_K // NV_BLOCK
    kw = k0 // 8 + tl.arange(0, G)[:, None] * 2 + tl.arange(0, 2)[None, :]  # words [G, 2]
    ptrs = (w_ptr + n.to(tl.int64) * s_wn)[:, None, None] + kw[None, :, :]
    if EVEN:
        word = tl.load(ptrs)
    else:
        word = tl.load(ptrs, mask=n_ok[:, None, None] & (kw < K // 8)[None, :, :], other=0)
    lo = ((word & 0x08080808) << 4) | ((word & 0x07070707) << 2)  # elements 0, 2, 4, 6
    hi = (word & -2139062144) | ((word >> 2) & 0x1C1C1C1C)  # (0x80808080) elements 1, 3, 5, 7
    codes = tl.reshape(tl.join(bytes_of(lo), bytes_of(hi)), (BLOCK_N, G, NV_BLOCK))
    vals = codes.to(tl.float8e4nv, bitcast=True).to(step.dtype)
    return tl.reshape(vals * step[:, :, None], (BLOCK_N, BLOCK_K))


@triton.jit
def dot_acc(a, b, acc, F32: tl.constexpr):
    """acc + a @ b in fp32; F32: IEEE fp32 operands (fp32 inputs and the CPU interpreter)."""
    if F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(a, b.to(a.dtype), acc)


@triton.jit
def finish_tile(acc, m, n, m_ok, n_ok, y_ptr, s_ym, b_ptr, s_bm, part_ptr, cnt_ptr, tile, M, N,
                SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr):
    """Write acc [BLOCK_M, BLOCK_N] (fp32) to y (+ b[m * s_bm + n]: a bias with s_bm 0, an addend [M, N] with its
    row stride). SPLIT > 1: store the partial of this program's split (program_id(1)); the last of the tile's
    splits to arrive sums them all in split order, writes y and resets the tile's counter to 0 for the next
    launch. Returns whether this program wrote the tile (its epilogue may follow: skinny_heads_triton)."""
    mask = m_ok[:, None] & n_ok[None, :]
    mine = True
    if SPLIT > 1:
        cell = m[:, None].to(tl.int64) * N + n[None, :]
        store_partial(acc, cell, mask, part_ptr, M * N)
        mine = last_split(cnt_ptr, tile, SPLIT)
        if mine:
            acc = sum_partials(acc, cell, mask, part_ptr, M * N, SPLIT)
            _store(acc, m, n, mask, y_ptr, s_ym, b_ptr, s_bm, HAS_BIAS)
            tl.atomic_xchg(cnt_ptr + tile, 0)
    else:
        _store(acc, m, n, mask, y_ptr, s_ym, b_ptr, s_bm, HAS_BIAS)
    return mine


@triton.jit
def store_partial(acc, cell, mask, part_ptr, plane):
    """This split's fp32 partial at part[program_id(1) * plane + cell] (past L1: the last split reads it)."""
    tl.store(part_ptr + tl.program_id(1).to(tl.int64) * plane + cell, acc, mask=mask, cache_modifier=".cg")


@triton.jit
def last_split(cnt_ptr, tile, SPLIT):
    """True in the last of the tile's SPLIT programs to arrive (after every thread's partial is stored); SPLIT a
    constexpr or a run-time count (the fused MoE's per-expert chunks)."""
    tl.debug_barrier()  # every thread's partial stored before the release below
    return tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel") == SPLIT - 1


@triton.jit
def sum_partials(like, cell, mask, part_ptr, plane, SPLIT: tl.constexpr):
    """The sum of the SPLIT partials of `cell`, in split order (deterministic)."""
    acc = tl.zeros_like(like)
    for s in tl.static_range(SPLIT):  # all partials in flight at once
        acc += tl.load(part_ptr + s * plane + cell, mask=mask, other=0.0, cache_modifier=".cg")
    return acc


@triton.jit
def _store(acc, m, n, mask, y_ptr, s_ym, b_ptr, s_bm, HAS_BIAS: tl.constexpr):
    if HAS_BIAS:
        acc += tl.load(b_ptr + m[:, None].to(tl.int64) * s_bm + n[None, :], mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + m[:, None].to(tl.int64) * s_ym + n[None, :], acc.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["M"])
def mx_gemv_kernel(
    x_ptr, w_ptr, s_ptr, b_ptr, y_ptr, part_ptr, cnt_ptr, M, s_xm, s_wn, s_wb, s_sn, s_ym, s_bm,
    N: tl.constexpr, K: tl.constexpr, K_SPLIT: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr, SCALED: tl.constexpr, EVEN: tl.constexpr,
    PDL: tl.constexpr,
):
    """y[:M, n-tile] for M <= BLOCK_M (<= 4) rows: per row, fp32 products summed within each 32-block
    (mostly in-thread), scaled by the block's power of two (SCALED: MXFP8; else plain weights, kernels/skinny.py)
    into a [BLOCK_M, BLOCK_N, BLOCK_K / 32] accumulator; the cross-thread sum over the blocks runs once, after
    the K loop. EVEN: no masks on the weights. Grid (N tiles, SPLIT)."""
    pdl_wait(PDL)  # first: nothing global before it (pdl_triton)
    G: tl.constexpr = BLOCK_K // MX_BLOCK
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    rows = tl.arange(0, BLOCK_M)
    g = tl.arange(0, G)
    acc = tl.zeros([BLOCK_M, BLOCK_N, G], tl.float32)
    w_rows, s_rows = w_ptr + n.to(tl.int64) * s_wn, s_ptr + n.to(tl.int64) * s_sn
    k_begin = tl.program_id(1) * K_SPLIT
    for k_off in range(0, K_SPLIT, BLOCK_K):  # constant trip count
        k0 = k_begin + k_off
        kk = k0 + g[:, None] * MX_BLOCK + tl.arange(0, MX_BLOCK)[None, :]  # [G, 32]
        k_ok = kk < K
        w = gemv_weights(w_rows, k0, n_ok, s_wb, K, G, EVEN)
        if SCALED:
            sc = gemv_scales(s_rows, k0, n_ok, K, G)
        for r in tl.static_range(BLOCK_M):
            # the row's inputs once a K step ([G, 32], broadcast over the tile's rows): read in the tile's own
            # shape instead (an L1 hit a weight) the kernel ran 1.12-1.36x slower (H100, 2026-12-06)
            xr = tl.load(x_ptr + r * s_xm + kk, mask=k_ok & (kk * 0 + r < M), other=0.0).to(tl.float32)
            part = tl.sum(w * xr[None, :, :], axis=2)  # [BLOCK_N, G]
            if SCALED:
                part = part * sc
            if BLOCK_M == 1:
                acc += part[None, :, :]
            else:
                acc = tl.where(rows[:, None, None] == r, acc + part[None, :, :], acc)
    finish_tile(tl.sum(acc, axis=2), rows, n, rows < M, n_ok, y_ptr, s_ym, b_ptr, s_bm, part_ptr, cnt_ptr,
                tl.program_id(0), M, N, SPLIT, HAS_BIAS)


@triton.jit(do_not_specialize=["M"])
def mx_dot_kernel(
    x_ptr, w_ptr, s_ptr, b_ptr, y_ptr, part_ptr, cnt_ptr, M, s_xm, s_wn, s_wb, s_sn, s_ym,
    N: tl.constexpr, K: tl.constexpr, K_SPLIT: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr, F32: tl.constexpr, EVEN: tl.constexpr,
    PDL: tl.constexpr,
):
    """y[m-tile, n-tile]^T = dequant(W)[n-tile] @ x[m-tile]^T, one dot per BLOCK_K step.
    Grid (N tiles x M tiles, SPLIT), N tiles fastest."""
    pdl_wait(PDL)  # first: nothing global before it (pdl_triton)
    n_tiles: tl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
    pid_n = tl.program_id(0) % n_tiles
    pid_m = tl.program_id(0) // n_tiles
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n_ok, m_ok = n < N, m < M
    acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    x_rows = x_ptr + m.to(tl.int64) * s_xm
    k_begin = tl.program_id(1) * K_SPLIT
    step = mx_steps(s_ptr, n, n_ok, k_begin, s_sn, K, BLOCK_K, F32)
    for k_off in range(0, K_SPLIT, BLOCK_K):  # constant trip count
        k0 = k_begin + k_off
        next_step = mx_steps(s_ptr, n, n_ok, k0 + BLOCK_K, s_sn, K, BLOCK_K, F32)
        w = mx_tile(w_ptr, step, n, n_ok, k0, s_wn, s_wb, K, BLOCK_N, BLOCK_K, F32, EVEN)
        step = next_step
        kk = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_rows[:, None] + kk[None, :], mask=m_ok[:, None] & (kk < K)[None, :], other=0.0)
        acc = dot_acc(w, tl.trans(x), acc, F32)
    finish_tile(tl.trans(acc), m, n, m_ok, n_ok, y_ptr, s_ym, b_ptr, 0, part_ptr, cnt_ptr, tl.program_id(0), M, N,
                SPLIT, HAS_BIAS)
