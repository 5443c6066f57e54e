"""Triton gated activation of a fused gate|up projection: out[t, n] = act(gu[t, n], gu[t, I + n]) in fp32,
rounded once to the output dtype (moe_triton.gated_activation: SwiGLU-OAI or SiLU).

Grid (T, cdiv(I, BLOCK)): one program per token row and column block.
"""

import triton
import triton.language as tl

from m3bench.runtime.kernels.moe_triton import gated_activation
from m3bench.runtime.kernels.pdl_triton import pdl_wait


@triton.jit
def gated_act_kernel(gu_ptr, out_ptr, alpha, limit, s_gt, s_ot, I: tl.constexpr, BLOCK: tl.constexpr,
                     ACT: tl.constexpr, PDL: tl.constexpr):
    pdl_wait(PDL)  # first: nothing global before it (pdl_triton)
    t = tl.program_id(0).to(tl.int64)
    n = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = n < I
    g = tl.load(gu_ptr + t * s_gt + n, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + t * s_gt + I + n, mask=ok, other=0.0).to(tl.float32)
    h = gated_activation(g, u, alpha, limit, ACT)
    tl.store(out_ptr + t * s_ot + n, h.to(out_ptr.dtype.element_ty), mask=ok)
