"""Triton router epilogue: sigmoid, correction bias, top-k, renormalise, scale, in one kernel.

Grid (cdiv(T, BLOCK_T),): one program loads BLOCK_T rows of the fp32 router logits [T, E] (E a
power of two), takes top-k by sigmoid + bias with k rounds of arg-max (ties: the lowest expert id,
highest first as torch.topk returns them), and writes the unbiased sigmoid weights of the chosen
experts renormalised to sum 1 times `scale`, with the expert ids (int64).
`router_align_kernel` (one program, T <= BLOCK_T) goes on to the fused MoE's alignment
(moe_triton.align_pairs) of the picks that land on this rank's experts [first, first + E_LOCAL) (and
the shared expert's pairs): the routing and the MoE's first launch in one.
"""

import triton
import triton.language as tl

from m3bench.runtime.kernels.moe_route_triton import topk_rows
from m3bench.runtime.kernels.moe_triton import align_pairs
from m3bench.runtime.kernels.pdl_triton import pdl_wait


@triton.jit
def router_topk_kernel(
    logit_ptr, bias_ptr, w_ptr, id_ptr, n_tok, scale, s_lt,
    E: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, BLOCK_T: tl.constexpr, HAS_BIAS: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_wait(PDL)  # first: nothing global before it (pdl_triton)
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    ok = rows < n_tok
    w_acc, id_acc = topk_rows(logit_ptr, bias_ptr, rows, ok, scale, s_lt, E, K, KP, BLOCK_T, HAS_BIAS)
    slot = tl.arange(0, KP)
    out = rows[:, None].to(tl.int64) * K + slot[None, :]
    keep = ok[:, None] & (slot[None, :] < K)
    tl.store(w_ptr + out, w_acc, mask=keep)
    tl.store(id_ptr + out, id_acc.to(tl.int64), mask=keep)


@triton.jit(do_not_specialize=["n_tok", "first"])
def router_align_kernel(
    logit_ptr, bias_ptr, w_ptr, id_ptr, n_tok, scale, s_lt, first, sorted_ptr, block_expert_ptr, n_post_ptr,
    E: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, BLOCK_T: tl.constexpr, HAS_BIAS: tl.constexpr,
    E_LOCAL: tl.constexpr, BLOCK_M: tl.constexpr, SHARED: tl.constexpr, PDL: tl.constexpr,
):
    """router_topk_kernel for all T <= BLOCK_T tokens (ids stored local: minus `first`), then
    moe_align_kernel's layout of the local picks:
    pair t * K + k (local expert id - first), the shared expert (SHARED: local id E_LOCAL) pairs
    T * K + t; padding marker T * K (+ T)."""
    pdl_wait(PDL)  # first: nothing global before it (pdl_triton)
    rows = tl.arange(0, BLOCK_T)
    ok = rows < n_tok
    w_acc, id_acc = topk_rows(logit_ptr, bias_ptr, rows, ok, scale, s_lt, E, K, KP, BLOCK_T, HAS_BIAS)
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
