"""Plain-torch references of the Triton kernels (same signatures); also the CPU fallback.

Shapes (design.md): q [T, Hq, d]; K / V caches [pages, Hkv, P, d] (or Nvfp4Pages);
index keys [pages, P, di]; block_tables [B, max_pages] int32; seq_lens [B] int32 (context
length after this step's tokens); query_start_loc [B+1] int32. Token t of request b sits at
position seq_len - q_len + t and attends keys 0..position (a staircase for multi-token chunks).
These loop over requests on the host (.tolist()): fine on CPU, never used in a CUDA graph.
"""

from __future__ import annotations

import math
from enum import Enum

import torch

from m3bench.runtime.kernels.kv_quant import PagedTensor, dequantize_pages, index_pages

INIT_BLOCK_SCORE = 3.0e38  # init blocks rank after the local block (+inf), before any score


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def gather_pages(cache: PagedTensor, pages: torch.Tensor, n_tokens: int, dtype) -> torch.Tensor:
    """The first n_tokens of a sequence: [..heads.., n_tokens, d] from K/V or index-key pages."""
    x = dequantize_pages(index_pages(cache, pages.long()), dtype)  # [n_pages, (Hkv,) P, d]
    if x.dim() == 4:
        x = x.permute(1, 0, 2, 3)  # [Hkv, n_pages, P, d]
    return x.flatten(-3, -2)[..., :n_tokens, :]


def _request_spans(query_start_loc, seq_lens):
    starts = query_start_loc.tolist()
    return [(starts[b], starts[b + 1], int(n)) for b, n in enumerate(seq_lens.tolist())]


def _sparse_key_mask(sel: torch.Tensor, n_keys: int, page: int) -> torch.Tensor:
    """Selected block ids [q, Hkv, topk] (-1 padded) -> allowed keys [q, Hkv, n_keys]."""
    key_block = torch.arange(n_keys, device=sel.device) // page
    hit = (sel.long().unsqueeze(-1) == key_block) & (sel.unsqueeze(-1) >= 0)
    return hit.any(dim=-2)


def paged_attention_ref(
    q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale,
    selected_blocks=None, out=None,
):
    """Causal paged GQA attention; with selected_blocks [T, Hkv, topk] only those blocks."""
    out = torch.empty_like(q) if out is None else out
    cdt = _compute_dtype(q)
    hkv, page = k_cache.shape[1], k_cache.shape[2]
    group = q.shape[1] // hkv
    for b, (t0, t1, n_ctx) in enumerate(_request_spans(query_start_loc, seq_lens)):
        pages = block_tables[b, : math.ceil(n_ctx / page)]
        k = gather_pages(k_cache, pages, n_ctx, cdt).repeat_interleave(group, dim=0)
        v = gather_pages(v_cache, pages, n_ctx, cdt).repeat_interleave(group, dim=0)
        qb = q[t0:t1].to(cdt).transpose(0, 1)  # [Hq, q_len, d]
        pos = n_ctx - (t1 - t0) + torch.arange(t1 - t0, device=q.device)
        mask = torch.arange(n_ctx, device=q.device) <= pos[:, None]  # [q_len, n_ctx]
        mask = mask.unsqueeze(0).expand(q.shape[1], -1, -1)
        if selected_blocks is not None:
            sparse = _sparse_key_mask(selected_blocks[t0:t1], n_ctx, page)
            mask = mask & sparse.repeat_interleave(group, dim=1).transpose(0, 1)
        s = (qb @ k.transpose(-1, -2)) * scale
        p = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1)
        out[t0:t1] = (p @ v).transpose(0, 1).to(out.dtype)
    return out


def msa_block_scores_ref(iq, ik_cache, block_tables, seq_lens, query_start_loc):
    """M[t, h, b] = max over keys j of block b with j <= pos_t of iq[t, h] . ik[j] (fp32).

    Returns [T, Hi, max_pages] float32, -inf for blocks past the token's own position.
    """
    page = ik_cache.shape[1]
    scores = torch.full((*iq.shape[:2], block_tables.shape[1]), float("-inf"), device=iq.device)
    for b, (t0, t1, n_ctx) in enumerate(_request_spans(query_start_loc, seq_lens)):
        n_pages = math.ceil(n_ctx / page)
        ik = gather_pages(ik_cache, block_tables[b, :n_pages], n_ctx, torch.float32)
        pos = n_ctx - (t1 - t0) + torch.arange(t1 - t0, device=iq.device)
        s = iq[t0:t1].float() @ ik.T  # [q_len, Hi, n_ctx]
        s = s.masked_fill(torch.arange(n_ctx, device=iq.device) > pos[:, None, None], float("-inf"))
        pad = n_pages * page - n_ctx
        s = torch.nn.functional.pad(s, (0, pad), value=float("-inf"))
        scores[t0:t1, :, :n_pages] = s.unflatten(-1, (n_pages, page)).amax(dim=-1)
    return scores


def msa_select_blocks_ref(
    iq, ik_cache, block_tables, seq_lens, query_start_loc, topk, init_blocks=0, out=None,
):
    """Top-k blocks per token and index head: [T, Hi, topk] int32, local block first, -1 padded."""
    scores = msa_block_scores_ref(iq, ik_cache, block_tables, seq_lens, query_start_loc)
    page = ik_cache.shape[1]
    pos = _token_positions(query_start_loc, seq_lens, iq.shape[0], iq.device)
    blocks = torch.arange(scores.shape[-1], device=iq.device)
    valid = blocks <= (pos // page)[:, None]  # [T, n_blocks]
    init = (blocks < init_blocks) & valid
    scores = torch.where(init[:, None, :], INIT_BLOCK_SCORE, scores)
    local = blocks == (pos // page)[:, None]
    scores = torch.where(local[:, None, :], float("inf"), scores)
    k = min(topk, scores.shape[-1])
    vals, ids = torch.topk(scores, k, dim=-1)
    ids = torch.where(vals > float("-inf"), ids, -1).to(torch.int32)
    out = torch.full((*iq.shape[:2], topk), -1, dtype=torch.int32, device=iq.device) if out is None else out
    out.fill_(-1)
    out[..., :k] = ids
    return out


def _token_positions(query_start_loc, seq_lens, n_tokens, device):
    pos = torch.zeros(n_tokens, dtype=torch.long, device=device)
    for t0, t1, n_ctx in _request_spans(query_start_loc, seq_lens):
        pos[t0:t1] = n_ctx - (t1 - t0) + torch.arange(t1 - t0, device=device)
    return pos


class MoeActivation(Enum):
    SWIGLUOAI = "swigluoai"  # g = gate.clamp(max=L); u = up.clamp(-L, L); g*sigmoid(alpha g)*(u+1)
    SILU = "silu"  # silu(gate) * up


def moe_activation_ref(gate, up, activation=MoeActivation.SWIGLUOAI, alpha=1.702, limit=7.0):
    """swigluoai: g=gate.clamp(max=L); u=up.clamp(-L, L); g*sigmoid(alpha g)*(u+1). silu: silu(gate)*up."""
    if activation is MoeActivation.SILU:
        return torch.nn.functional.silu(gate) * up
    g = gate.clamp(max=limit)
    u = up.clamp(-limit, limit)
    return g * torch.sigmoid(alpha * g) * (u + 1)


def fused_moe_ref(
    x, w_gate, w_up, w_down, topk_ids, topk_weights, activation=MoeActivation.SWIGLUOAI,
    alpha=1.702, limit=7.0, out=None,
):
    """sum_k w[t,k] * expert_{id[t,k]}(x[t]); ids outside [0, E) (other ranks' experts) skipped.

    x [T, H]; w_gate, w_up [E, I, H]; w_down [E, H, I]; topk_ids [T, K]; topk_weights [T, K].
    """
    cdt = _compute_dtype(x)
    acc = torch.zeros(x.shape, dtype=cdt, device=x.device)
    n_experts = w_gate.shape[0]
    for e in torch.unique(topk_ids).tolist():
        if not 0 <= e < n_experts:
            continue
        tok, slot = (topk_ids == e).nonzero(as_tuple=True)
        xe = x[tok].to(cdt)
        h = moe_activation_ref(xe @ w_gate[e].to(cdt).T, xe @ w_up[e].to(cdt).T, activation, alpha, limit)
        y = (h @ w_down[e].to(cdt).T) * topk_weights[tok, slot].to(cdt)[:, None]
        acc.index_add_(0, tok, y)
    out = torch.empty_like(x) if out is None else out
    return out.copy_(acc)
