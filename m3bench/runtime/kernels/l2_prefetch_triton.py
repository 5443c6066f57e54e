"""Triton kernel that pulls a byte range into L2 without reading it (sm90 `cp.async.bulk.prefetch.L2`).

    l2_prefetch_kernel   each lane of a program issues one bulk prefetch of CHUNK bytes (the range's last chunk
                         shorter, a multiple of 16); lanes past the range prefetch the first 16 bytes again.
                         Fire and forget: the kernel ends once the requests are issued, the copy engine fills L2.
"""

import triton
import triton.language as tl

from m3bench.runtime.kernels.pdl_triton import pdl_wait


@triton.jit(do_not_specialize=["nbytes"])
def l2_prefetch_kernel(ptr, nbytes, CHUNK: tl.constexpr, LANES: tl.constexpr, PDL: tl.constexpr):
    """Grid (cdiv(nbytes, CHUNK * LANES),); ptr 16-byte aligned, nbytes a multiple of 16."""
    pdl_wait(PDL)  # first: nothing global before it (pdl_triton)
    off = (tl.program_id(0) * LANES + tl.arange(0, LANES)).to(tl.int64) * CHUNK
    left = nbytes - off
    ok = left > 0
    size = tl.where(ok, tl.minimum(left, CHUNK), 16).to(tl.int32)
    addr = ptr + tl.where(ok, off, 0)
    tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0;", "=r,l,r",
                              [addr, size], dtype=tl.int32, is_pure=False, pack=1)
