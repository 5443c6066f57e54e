"""Tiny MiniMax-M3 configs and random canonical weights shared by the runtime model tests."""

from __future__ import annotations

import torch

from m3bench.runtime.config import ModelConfig, NormKind
from m3bench.runtime.model import M3ForCausalLM


def tiny_m3_raw(**over) -> dict:
    """4 layers: layer 0 dense attention + dense MLP, layers 1-3 MSA + MoE (block 16, top-2 blocks)."""
    sparse = dict(sparse_attention_freq=[0, 1, 1, 1], sparse_num_index_heads=2, sparse_index_dim=16,
                  sparse_block_size=16, sparse_topk_blocks=2, sparse_init_block=0, sparse_local_block=1)
    sparse.update(over.pop("sparse", {}))
    raw = dict(model_type="minimax_m3", architectures=["MiniMaxM3SparseForCausalLM"], hidden_size=64,
               num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, head_dim=16, rotary_dim=8,
               rope_theta=10000.0, vocab_size=512, rms_norm_eps=1e-6, use_gemma_norm=True, use_qk_norm=True,
               hidden_act="swigluoai", swiglu_alpha=1.702, swiglu_limit=7.0, dense_intermediate_size=96,
               num_local_experts=8, num_experts_per_tok=2, intermediate_size=32, n_shared_experts=1,
               shared_intermediate_size=32, routed_scaling_factor=2.0, moe_layer_freq=[0, 1, 1, 1],
               sparse_attention_config=sparse, max_position_embeddings=4096, tie_word_embeddings=False)
    raw.update(over)
    return raw


def tiny_m3_cfg(**over) -> ModelConfig:
    return ModelConfig.from_dict(tiny_m3_raw(**over))


def random_weights(cfg: ModelConfig, seed: int = 0, gain: float = 1.5) -> dict[str, torch.Tensor]:
    """Canonical name -> float64 tensor: matrices N(0, gain^2/fan_in), norms neutral +- 0.3, biases N(0, 0.1)."""
    g = torch.Generator().manual_seed(seed)
    shapes = {s.name: tuple(s.target.shape) for s in M3ForCausalLM(cfg, torch.float32, "meta").weight_slots()}
    neutral = 0.0 if cfg.norm is NormKind.GEMMA else 1.0
    out = {}
    for name, shape in shapes.items():
        x = torch.randn(shape, generator=g, dtype=torch.float64)
        if name.endswith("norm.weight"):
            x = neutral + 0.3 * x
        elif len(shape) == 1:
            x = 0.1 * x
        else:
            x = x * gain / shape[-1] ** 0.5
        out[name] = x
    return out


def build(cfg: ModelConfig, weights: dict, dtype=torch.float32) -> M3ForCausalLM:
    model = M3ForCausalLM(cfg, dtype=dtype, device="cpu")
    model.load_canonical(weights)
    return model


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b|."""
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())
