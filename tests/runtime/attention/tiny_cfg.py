"""A tiny MiniMax-M3 config for the backend tests: layer 0 dense, layer 1 MSA + MoE, block 16."""

from m3bench.runtime.config import ModelConfig
from m3bench.runtime.tiny import Layout, TinySpec, config_for

SPEC = TinySpec(vocab_size=128, hidden_size=64, num_layers=2, num_dense_layers=1, num_heads=4,
                num_kv_heads=2, head_dim=16, rotary_dim=8, dense_intermediate_size=64, num_experts=4,
                top_k=2, intermediate_size=32, shared_intermediate_size=32, index_dim=16, block_size=16,
                topk_blocks=2, max_position_embeddings=512)


def tiny_config(**changes) -> ModelConfig:
    return ModelConfig.from_dict(config_for(Layout.M3, TinySpec(**{**SPEC.__dict__, **changes}), 1, 2))
