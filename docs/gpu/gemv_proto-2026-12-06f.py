import triton
import triton.language as tl
from m3bench.runtime.kernels.mx_tiles_triton import MX_BLOCK, block_cols, e8m0_scale, finish_tile
from m3bench.runtime.kernels.pdl_triton import pdl_wait


@triton.jit(do_not_specialize=["M"])
def gemv_a_kernel(
    x_ptr, w_ptr, s_ptr, b_ptr, y_ptr, part_ptr, cnt_ptr, M, s_xm, s_wn, s_wb, s_sn, s_ym, s_bm,
    N: tl.constexpr, K: tl.constexpr, K_SPLIT: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr, SCALED: tl.constexpr, EVEN: tl.constexpr,
    PDL: tl.constexpr, VARIANT: tl.constexpr,
):
    pdl_wait(PDL)
    G: tl.constexpr = BLOCK_K // MX_BLOCK
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    g = tl.arange(0, G)
    acc = tl.zeros([BLOCK_N, G], tl.float32)
    w_rows = w_ptr + n.to(tl.int64) * s_wn
    k_begin = tl.program_id(1) * K_SPLIT
    for k_off in range(0, K_SPLIT, BLOCK_K):
        k0 = k_begin + k_off
        w = tl.load(w_rows[:, None, None] + block_cols(k0, s_wb, G)[None, :, :])
        blk = k0 // MX_BLOCK + g
        sc = e8m0_scale(tl.load(s_ptr + n.to(tl.int64)[:, None] * s_sn + blk[None, :]))
        kk = k0 + g[:, None] * MX_BLOCK + tl.arange(0, MX_BLOCK)[None, :]
        x = tl.load(x_ptr + kk).to(tl.float32)
        if VARIANT == 0:
            part = tl.sum(w.to(tl.float32) * x[None, :, :], axis=2)
        else:
            part = tl.sum(w.to(tl.float16).to(tl.float32) * x[None, :, :], axis=2)
        acc += part * sc
    rows = tl.arange(0, 1)
    finish_tile(tl.sum(acc, axis=1)[None, :], rows, n, rows < M, n_ok, y_ptr, s_ym, b_ptr, s_bm, part_ptr, cnt_ptr,
                tl.program_id(0), M, N, SPLIT, HAS_BIAS)


@triton.jit
def read_tile_kernel(w_ptr, out_ptr, s_wn, N: tl.constexpr, K_SPLIT_W: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_W: tl.constexpr, PDL: tl.constexpr):
    """Read only: the GEMV's grid over int32 words of the weights, xor-reduced (the bytes' ceiling)."""
    pdl_wait(PDL)
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_N, BLOCK_W], tl.int32)
    base = tl.program_id(1) * K_SPLIT_W
    for k in range(0, K_SPLIT_W, BLOCK_W):
        acc ^= tl.load(w_ptr + n.to(tl.int64)[:, None] * s_wn + base + k + tl.arange(0, BLOCK_W)[None, :])
    tl.store(out_ptr + tl.program_id(0) * tl.num_programs(1) + tl.program_id(1), tl.xor_sum(tl.xor_sum(acc, 1), 0))

