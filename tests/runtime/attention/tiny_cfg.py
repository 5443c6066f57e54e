"""A tiny MiniMax-M3 config for the backend tests: layer 0 dense, layer 1 MSA + MoE, block 16."""

import torch

from m3bench.runtime.attention.metadata import build_attn_metadata
from m3bench.runtime.config import ModelConfig
from m3bench.runtime.kv_cache import KVCache, KVDtype
from m3bench.runtime.tiny import Layout, TinySpec, config_for

SPEC = TinySpec(vocab_size=128, hidden_size=64, num_layers=2, num_dense_layers=1, num_heads=4,
                num_kv_heads=2, head_dim=16, rotary_dim=8, dense_intermediate_size=64, num_experts=4,
                top_k=2, intermediate_size=32, shared_intermediate_size=32, index_dim=16, block_size=16,
                topk_blocks=2, max_position_embeddings=512)


def tiny_config(**changes) -> ModelConfig:
    return ModelConfig.from_dict(config_for(Layout.M3, TinySpec(**{**SPEC.__dict__, **changes}), 1, 2))


def prefill_step(m, n_tok: int) -> torch.Tensor:
    """The hidden states of one prefill of n_tok tokens (seeded by n_tok) into a fresh 4-page cache."""
    kv = KVCache(m.cfg, 4, 16, KVDtype.AUTO, m.dtype)
    meta = build_attn_metadata([n_tok], [n_tok], [[0]], 16)
    ids = torch.randint(0, m.cfg.vocab_size, (n_tok,), generator=torch.Generator().manual_seed(n_tok))
    return m(ids, meta.positions, meta, kv)
