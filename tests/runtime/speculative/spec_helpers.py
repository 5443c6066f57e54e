"""Tiny Eagle3 draft configs and an independent float64 reference of the draft forward."""

from __future__ import annotations

import math

import torch

from m3bench.runtime.speculative.config import EagleConfig

EAGLE_RAW = dict(
    architectures=["LlamaForCausalLMEagle3"], model_type="llama", hidden_size=32, num_attention_heads=4,
    num_key_value_heads=2, head_dim=8, intermediate_size=48, rms_norm_eps=1e-6, rope_theta=10000.0,
    vocab_size=40, draft_vocab_size=40, fc_norm=True, norm_output=True, target_hidden_size=24,
    num_hidden_layers=1, hidden_act="silu", tie_word_embeddings=False, torch_dtype="bfloat16",
)


def eagle_cfg(**over) -> EagleConfig:
    return EagleConfig.from_dict({**EAGLE_RAW, **over})


def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def rope(x: torch.Tensor, pos: int, theta: float) -> torch.Tensor:
    """NeoX rotation of one head vector x [d]: pairs (i, i + d/2), angle pos * theta^(-2i/d)."""
    d = x.shape[0]
    out = x.clone()
    for i in range(d // 2):
        a = pos * theta ** (-2.0 * i / d)
        c, s = math.cos(a), math.sin(a)
        out[i] = x[i] * c - x[i + d // 2] * s
        out[i + d // 2] = x[i + d // 2] * c + x[i] * s
    return out


def ref_features(w: dict, cfg: EagleConfig, captured: torch.Tensor) -> torch.Tensor:
    """captured [T, n, Ht] -> fc(cat(fc_norm_i(c_i))) [T, H]."""
    parts = [rms(captured[:, i], w[f"fc_norm.{i}.weight"], cfg.rms_norm_eps) for i in range(captured.shape[1])]
    return torch.cat(parts, dim=-1) @ w["fc.weight"].T


def ref_draft(w: dict, embed: torch.Tensor, cfg: EagleConfig, tokens: list[int], features: torch.Tensor,
              positions: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence, every token attending to the tokens at positions <= its own: (hidden, next feature)."""
    p, eps, d = "layers.0.", cfg.rms_norm_eps, cfg.head_dim
    e = embed[torch.tensor(tokens)]
    x = torch.cat((rms(e, w[p + "input_layernorm.weight"], eps), rms(features, w[p + "hidden_norm.weight"], eps)), -1)
    q = (x @ w[p + "self_attn.q_proj.weight"].T).view(len(tokens), cfg.num_heads, d)
    k = (x @ w[p + "self_attn.k_proj.weight"].T).view(len(tokens), cfg.num_kv_heads, d)
    v = (x @ w[p + "self_attn.v_proj.weight"].T).view(len(tokens), cfg.num_kv_heads, d)
    group = cfg.num_heads // cfg.num_kv_heads
    o = torch.zeros(len(tokens), cfg.num_heads, d, dtype=torch.float64)
    for t in range(len(tokens)):
        for h in range(cfg.num_heads):
            qt = rope(q[t, h], positions[t], cfg.rope_theta)
            keys = [j for j in range(len(tokens)) if positions[j] <= positions[t]]
            kj = [rope(k[j, h // group], positions[j], cfg.rope_theta) for j in keys]
            scores = torch.stack([qt @ x for x in kj]) / math.sqrt(d)
            prob = torch.softmax(scores, 0)
            o[t, h] = sum(prob[i] * v[j, h // group] for i, j in enumerate(keys))
    r = features + o.reshape(len(tokens), -1) @ w[p + "self_attn.o_proj.weight"].T
    n = rms(r, w[p + "post_attention_layernorm.weight"], eps)
    gate, up = n @ w[p + "mlp.gate_proj.weight"].T, n @ w[p + "mlp.up_proj.weight"].T
    s = r + (gate * torch.sigmoid(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    hidden = rms(s, w["norm.weight"], eps)
    return hidden, (hidden if cfg.norm_output else s)
