"""A batched, differentiable M3 forward over padded short sequences, for training the tiny model fast.

Same math as m3bench/runtime/reference.py (canonical weight names, Gemma norms, q/k norm, partial RoPE,
SwiGLU-OAI, sigmoid router with a selection-only bias, shared expert), vectorised over a [B, T] batch:

    logits = batched_logits(cfg, weights, ids, lengths)      # [B, T, V]

MSA layers equal dense causal attention while a sequence fits in the blocks MSA keeps
(T <= block_size * topk_blocks), which `check_dense_msa` asserts; the indexer then gets no gradient.
Every routed expert is computed for every token and weighted by the router's gates (zero where not
picked): exact, and cheap at the tiny model's 8 experts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
import torch.nn.functional as F

from m3bench.runtime.config import Activation, AttnKind, MlpKind, ModelConfig, NormKind


def check_dense_msa(cfg: ModelConfig, max_len: int) -> None:
    if any(k is AttnKind.MSA for k in cfg.attn_kinds) and max_len > cfg.msa.block_size * cfg.msa.topk_blocks:
        raise ValueError(f"max_len {max_len} exceeds the {cfg.msa.topk_blocks} MSA blocks of "
                         f"{cfg.msa.block_size}: MSA would select, the batched forward attends densely")


def _norm(x: torch.Tensor, w: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    scale = (1.0 + w) if cfg.norm is NormKind.GEMMA else w
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + cfg.rms_norm_eps) * scale


def _rope_tables(cfg: ModelConfig, t_len: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    if cfg.rope_scaling is not None:
        raise ValueError("the batched forward has no rope_scaling")
    half = cfg.rotary_dim // 2
    freqs = cfg.rope_theta ** (-(2 * torch.arange(half, dtype=torch.float64, device=device)) / cfg.rotary_dim)
    angle = torch.arange(t_len, dtype=torch.float64, device=device)[:, None] * freqs
    return angle.cos().float(), angle.sin().float()


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, H, d]: rotate pairs (i, i + r/2) of the first r dims."""
    half = cos.shape[-1]
    a, b, rest = x[..., :half], x[..., half:2 * half], x[..., 2 * half:]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.cat([a * c - b * s, b * c + a * s, rest], dim=-1)


def _act(gate: torch.Tensor, up: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    if cfg.activation is Activation.SILU:
        return F.silu(gate) * up
    g = gate.clamp(max=cfg.swiglu_limit)
    u = up.clamp(-cfg.swiglu_limit, cfg.swiglu_limit)
    return g * torch.sigmoid(cfg.swiglu_alpha * g) * (u + 1)


def _mlp(x: torch.Tensor, w: Mapping, p: str, cfg: ModelConfig) -> torch.Tensor:
    return _act(x @ w[p + "gate_proj.weight"].T, x @ w[p + "up_proj.weight"].T, cfg) @ w[p + "down_proj.weight"].T


def _moe(x: torch.Tensor, w: Mapping, p: str, cfg: ModelConfig) -> torch.Tensor:
    m = cfg.moe
    s = torch.sigmoid(x @ w[p + "router.weight"].T)  # [B, T, E]
    pick_score = s.detach() + (w[p + "router.bias"].detach() if m.use_routing_bias else 0)
    chosen = pick_score.topk(m.top_k, dim=-1).indices
    picked = torch.zeros_like(s).scatter(-1, chosen, 1.0)
    gates = s * picked
    gates = gates / gates.sum(-1, keepdim=True) * m.routed_scaling_factor
    out = torch.zeros_like(x)
    for e in range(m.num_experts):
        out = out + gates[..., e:e + 1] * _mlp(x, w, f"{p}experts.{e}.", cfg)
    if m.shared_intermediate_size:
        out = out + _mlp(x, w, p + "shared.", cfg)
    return out


def _attention(x: torch.Tensor, w: Mapping, p: str, cfg: ModelConfig, rope, pad_mask) -> torch.Tensor:
    b, t, _ = x.shape
    d = cfg.head_dim

    def proj(name: str) -> torch.Tensor:
        y = x @ w[f"{p}{name}_proj.weight"].T
        return (y + w[f"{p}{name}_proj.bias"] if cfg.qkv_bias else y).view(b, t, -1, d)

    q, k, v = proj("q"), proj("k"), proj("v")
    if cfg.qk_norm:
        q, k = _norm(q, w[p + "q_norm.weight"], cfg), _norm(k, w[p + "k_norm.weight"], cfg)
    q, k = _rope(q, *rope), _rope(k, *rope)
    group = cfg.num_heads // cfg.num_kv_heads
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                       attn_mask=pad_mask, scale=1.0 / math.sqrt(d))
    return o.transpose(1, 2).reshape(b, t, -1) @ w[p + "o_proj.weight"].T


def batched_logits(cfg: ModelConfig, w: Mapping[str, torch.Tensor], ids: torch.Tensor,
                   lengths: torch.Tensor) -> torch.Tensor:
    """Logits [B, T, V] of right-padded sequences ids [B, T] (positions 0..len-1; padding is masked)."""
    b, t = ids.shape
    check_dense_msa(cfg, t)
    rope = _rope_tables(cfg, t, ids.device)
    causal = torch.tril(torch.ones(t, t, dtype=torch.bool, device=ids.device))
    valid = torch.arange(t, device=ids.device)[None, :] < lengths[:, None]  # [B, T] keys that exist
    mask = (causal[None] & valid[:, None, :]) | torch.eye(t, dtype=torch.bool, device=ids.device)[None]
    mask = mask[:, None]  # [B, 1, T, T]; the diagonal keeps padded rows finite
    h = w["embed_tokens.weight"][ids]
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        h = h + _attention(_norm(h, w[p + "input_norm.weight"], cfg), w, p + "attn.", cfg, rope, mask)
        x = _norm(h, w[p + "post_attn_norm.weight"], cfg)
        h = h + (_moe(x, w, p + "moe.", cfg) if cfg.mlp_kinds[i] is MlpKind.MOE else _mlp(x, w, p + "mlp.", cfg))
    head = w["embed_tokens.weight"] if cfg.tie_word_embeddings else w["lm_head.weight"]
    return _norm(h, w["norm.weight"], cfg) @ head.T
