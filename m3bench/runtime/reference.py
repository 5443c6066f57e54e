"""A plain, slow float64 forward of one whole sequence from canonical weights, for tests only.

Written apart from the fast model: explicit [T, T] masks, MSA selection by brute-force loops,
per-token / per-expert python loops, its own norm and rotary code.

    logits = reference_logits(cfg, weights, ids)     # [T, V] float64
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from m3bench.runtime.config import Activation, AttnKind, MlpKind, ModelConfig, NormKind

F64 = torch.float64


def _norm(x: torch.Tensor, w: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    scale = (1.0 + w) if cfg.norm is NormKind.GEMMA else w
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + cfg.rms_norm_eps) * scale


def _freqs(cfg: ModelConfig) -> list[float]:
    r = cfg.rotary_dim
    out = []
    for i in range(r // 2):
        f = cfg.rope_theta ** (-(2 * i) / r)
        s = cfg.rope_scaling
        if s is not None:
            wavelen = 2 * math.pi / f
            old = s.original_max_position_embeddings
            if wavelen > old / s.low_freq_factor:
                f = f / s.factor
            elif wavelen >= old / s.high_freq_factor:
                t = (old / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
                f = (1 - t) * f / s.factor + t * f
        out.append(f)
    return out


def _rope(x: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """x [T, ..., d]: rotate pairs (i, i + r/2) of the first r dims by angle pos * f_i."""
    y = x.clone()
    half = cfg.rotary_dim // 2
    pos = torch.arange(x.shape[0], dtype=F64).view(-1, *([1] * (x.dim() - 2)))
    for i, f in enumerate(_freqs(cfg)):
        c, s = torch.cos(pos * f), torch.sin(pos * f)
        a, b = x[..., i], x[..., i + half]
        y[..., i], y[..., i + half] = a * c - b * s, b * c + a * s
    return y


def _act(gate: torch.Tensor, up: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    if cfg.activation is Activation.SILU:
        return gate * torch.sigmoid(gate) * up
    g = torch.minimum(gate, torch.tensor(cfg.swiglu_limit, dtype=F64))
    u = torch.clamp(up, -cfg.swiglu_limit, cfg.swiglu_limit)
    return g * torch.sigmoid(cfg.swiglu_alpha * g) * (u + 1)


def _mlp(x: torch.Tensor, w: Mapping, p: str, cfg: ModelConfig) -> torch.Tensor:
    return _act(x @ w[p + "gate_proj.weight"].T, x @ w[p + "up_proj.weight"].T, cfg) @ w[p + "down_proj.weight"].T


def _moe(x: torch.Tensor, w: Mapping, p: str, cfg: ModelConfig) -> torch.Tensor:
    m = cfg.moe
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        s = torch.sigmoid(w[p + "router.weight"] @ x[t])
        bias = w[p + "router.bias"] if m.use_routing_bias else torch.zeros_like(s)
        chosen = sorted(range(m.num_experts), key=lambda e: -float(s[e] + bias[e]))[:m.top_k]
        total = sum(float(s[e]) for e in chosen)
        for e in chosen:
            out[t] += float(s[e]) / total * m.routed_scaling_factor * _mlp(x[t:t + 1], w, f"{p}experts.{e}.", cfg)[0]
    if m.shared_intermediate_size:
        out += _mlp(x, w, p + "shared.", cfg)
    return out


def msa_keep(iq: torch.Tensor, ik: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """Brute force: keep[g, i, j] for KV head g, query i, key j (iq [T, Hi, di], ik [T, di])."""
    m = cfg.msa
    t_len = iq.shape[0]
    keep = torch.zeros((iq.shape[1], t_len, t_len), dtype=torch.bool)
    for g in range(iq.shape[1]):
        for i in range(t_len):
            cur = i // m.block_size
            keys = {b: range(b * m.block_size, min(i + 1, (b + 1) * m.block_size)) for b in range(cur + 1)}
            score = {b: max(float(iq[i, g] @ ik[j]) for j in js) for b, js in keys.items()}
            forced = {b for b in range(cur + 1) if b < m.init_blocks or cur - m.local_blocks < b <= cur}
            rest = sorted((b for b in score if b not in forced), key=lambda b: -score[b])
            for b in (sorted(forced) + rest)[:m.topk_blocks]:
                for j in keys[b]:
                    keep[g, i, j] = True
    return keep


def _attention(x: torch.Tensor, w: Mapping, p: str, layer: int, cfg: ModelConfig) -> torch.Tensor:
    t_len, d = x.shape[0], cfg.head_dim

    def proj(name: str) -> torch.Tensor:
        y = x @ w[f"{p}{name}_proj.weight"].T
        return y + w[f"{p}{name}_proj.bias"] if cfg.qkv_bias else y

    q, k, v = (proj(n).view(t_len, -1, d) for n in "qkv")
    if cfg.qk_norm:
        q, k = _norm(q, w[p + "q_norm.weight"], cfg), _norm(k, w[p + "k_norm.weight"], cfg)
    q, k = _rope(q, cfg), _rope(k, cfg)
    keep = torch.tril(torch.ones(t_len, t_len, dtype=torch.bool)).expand(cfg.num_kv_heads, t_len, t_len)
    if cfg.attn_kinds[layer] is AttnKind.MSA:
        di = cfg.msa.index_dim
        iq = (x @ w[p + "index_q_proj.weight"].T).view(t_len, -1, di)
        iq = _rope(_norm(iq, w[p + "index_q_norm.weight"], cfg), cfg)
        ik = _rope(_norm(x @ w[p + "index_k_proj.weight"].T, w[p + "index_k_norm.weight"], cfg), cfg)
        keep = msa_keep(iq, ik, cfg)
    group = cfg.num_heads // cfg.num_kv_heads
    heads = []
    for h in range(cfg.num_heads):
        g = h // group
        s = (q[:, h] @ k[:, g].T) / math.sqrt(d)
        s = s.masked_fill(~keep[g], float("-inf"))
        heads.append(torch.softmax(s, dim=-1) @ v[:, g])
    return torch.cat(heads, dim=-1) @ w[p + "o_proj.weight"].T


def reference_logits(cfg: ModelConfig, weights: Mapping[str, torch.Tensor], ids: list[int]) -> torch.Tensor:
    """Logits [T, V] float64 of the sequence `ids` (positions 0..T-1)."""
    w = {n: t.to(F64) for n, t in weights.items()}
    h = w["embed_tokens.weight"][torch.tensor(ids)]
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        h = h + _attention(_norm(h, w[p + "input_norm.weight"], cfg), w, p + "attn.", i, cfg)
        x = _norm(h, w[p + "post_attn_norm.weight"], cfg)
        h = h + (_moe(x, w, p + "moe.", cfg) if cfg.mlp_kinds[i] is MlpKind.MOE else _mlp(x, w, p + "mlp.", cfg))
    head = w["embed_tokens.weight"] if cfg.tie_word_embeddings else w["lm_head.weight"]
    return _norm(h, w["norm.weight"], cfg) @ head.T
