"""Programmatic dependent launch (PDL, Hopper+) in the runtime's Triton kernels: the one helper every kernel
calls first.

A kernel launched with `launch_pdl=True` may start while the kernel before it in the stream is still
running (its launch and ramp overlap that kernel's tail). `griddepcontrol.wait` then blocks until the previous
kernel has completed and its memory is visible, so nothing global (load, store, atomic) may come before it:
`pdl_wait(PDL)` is the first statement of every kernel, and the launch passes `**backend.pdl_args(t)` (PDL and
launch_pdl together). PDL codes (backend.PDL_CODE): 0 off (no instruction at all: the interpreter and other
GPUs compile what they did before), 1 wait, then let the next kernel launch; 2 let the next kernel launch,
then wait (its launch overlaps this whole kernel; it still waits for this one to complete before its own
first access).

What may come before the wait: arithmetic on program ids and arguments, and a bulk L2 prefetch of weights
(`prefetch_weights`, kernels/prefetch.py: the bytes of the weights that never change arrive while the kernel before
finishes; nothing is read into registers before the wait).
"""

import triton
import triton.language as tl


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """Wait for the previous kernel of the stream (PDL 1, 2) and let the next one launch (PDL 2: before the wait)."""
    if PDL == 2:
        tl.extra.cuda.gdc_launch_dependents()
    if PDL != 0:
        tl.extra.cuda.gdc_wait()
    if PDL == 1:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def prefetch_l2(starts, nbytes):
    """Bulk-prefetch nbytes[i] (a multiple of 16) from each starts[i] (16-byte aligned) into L2; nothing returned,
    so nothing can be read early: L2 is where every SM's global accesses meet, so a line fetched before the wait
    is never stale (the static check in tests/runtime/kernel_tests/pdl_checks.py allows exactly this before it)."""
    tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0;", "=r,l,r",
                              [starts, nbytes], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def prefetch_weights(w_ptr, n0, N, k_start, s_wn, s_wb, PREFETCH: tl.constexpr, BLOCK_MAJOR: tl.constexpr,
                     BLOCK_N: tl.constexpr, WIDTH: tl.constexpr):
    """Before the PDL wait: bulk-prefetch into L2 the first PREFETCH inputs (0: nothing) from k_start of the
    weight rows n0 + [0, BLOCK_N) (those < N). Row-major ([N, K], rows s_wn elements apart): one run a row.
    BLOCK_MAJOR (quant.block_major: WIDTH-wide blocks s_wb elements apart, a block's rows contiguous): one run a
    block (PREFETCH / WIDTH a power of two), the tile's rows from n0. kernels/prefetch.py chooses PREFETCH
    (0 where PDL is off or the alignment forbids it)."""
    if PREFETCH > 0:
        elem: tl.constexpr = w_ptr.dtype.element_ty.primitive_bitwidth // 8
        if BLOCK_MAJOR:
            blk = k_start // WIDTH + tl.arange(0, PREFETCH // WIDTH)
            rows = tl.minimum(N - n0, BLOCK_N)
            starts = w_ptr + blk.to(tl.int64) * s_wb + n0.to(tl.int64) * WIDTH
            prefetch_l2(starts, (blk * 0 + rows * (WIDTH * elem)).to(tl.int32))
        else:
            row = tl.minimum(n0 + tl.arange(0, BLOCK_N), N - 1)
            starts = w_ptr + row.to(tl.int64) * s_wn + k_start
            prefetch_l2(starts, (row * 0 + PREFETCH * elem).to(tl.int32))
