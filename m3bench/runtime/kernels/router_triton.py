"""Triton router epilogue: sigmoid, correction bias, top-k, renormalise, scale, in one kernel.

Grid (cdiv(T, BLOCK_T),): one program loads BLOCK_T rows of the fp32 router logits [T, E] (E a
power of two), takes top-k by sigmoid + bias with k rounds of arg-max (ties: the lowest expert id,
highest first as torch.topk returns them), and writes the unbiased sigmoid weights of the chosen
experts renormalised to sum 1 times `scale`, with the expert ids (int64).
"""

import triton
import triton.language as tl


@triton.jit
def _router_topk_kernel(
    logit_ptr, bias_ptr, w_ptr, id_ptr, n_tok, scale, s_lt,
    E: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, BLOCK_T: tl.constexpr, HAS_BIAS: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    ok = rows < n_tok
    ex = tl.arange(0, E)
    logits = tl.load(logit_ptr + rows[:, None].to(tl.int64) * s_lt + ex[None, :], mask=ok[:, None], other=0.0)
    s = 1.0 / (1.0 + tl.exp(-logits))
    choice = s
    if HAS_BIAS:
        choice = s + tl.load(bias_ptr + ex)[None, :]
    slot = tl.arange(0, KP)
    w_acc = tl.zeros([BLOCK_T, KP], tl.float32)
    id_acc = tl.zeros([BLOCK_T, KP], tl.int32)
    for j in tl.static_range(K):
        best = tl.max(choice, axis=1)
        pick = tl.min(tl.where(choice == best[:, None], ex[None, :], E), axis=1)
        hit = ex[None, :] == pick[:, None]
        w_j = tl.sum(tl.where(hit, s, 0.0), axis=1)
        w_acc = tl.where(slot[None, :] == j, w_j[:, None], w_acc)
        id_acc = tl.where(slot[None, :] == j, pick[:, None], id_acc)
        choice = tl.where(hit, float("-inf"), choice)
    w_acc = w_acc / tl.sum(w_acc, axis=1)[:, None] * scale
    out = rows[:, None].to(tl.int64) * K + slot[None, :]
    keep = ok[:, None] & (slot[None, :] < K)
    tl.store(w_ptr + out, w_acc, mask=keep)
    tl.store(id_ptr + out, id_acc.to(tl.int64), mask=keep)
