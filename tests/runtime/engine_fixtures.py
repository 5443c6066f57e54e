"""Tiny random models shared by the engine / LLM tests (CPU, fp32)."""

from __future__ import annotations

import torch

from m3bench.runtime.config import ModelConfig
from m3bench.runtime.model import M3ForCausalLM
from m3bench.runtime.tiny import TinySpec, m3_text_config

# MSA block 16, top-2 blocks: selection is active past 32 tokens; the page size may differ from it.
SMALL_M3 = TinySpec(vocab_size=96, hidden_size=32, num_layers=3, num_dense_layers=1, num_heads=4, num_kv_heads=2,
                    head_dim=8, rotary_dim=4, dense_intermediate_size=48, num_experts=4, top_k=2,
                    intermediate_size=16, shared_intermediate_size=16, index_dim=8, block_size=16, topk_blocks=2,
                    max_position_embeddings=1024)
EOS = 95


def small_config(spec: TinySpec = SMALL_M3) -> ModelConfig:
    return ModelConfig.from_dict(m3_text_config(spec, bos_id=0, eos_id=EOS))


def small_model(seed: int = 0, spec: TinySpec = SMALL_M3, device: str = "cpu") -> M3ForCausalLM:
    model = M3ForCausalLM(small_config(spec), dtype=torch.float32, device=device)
    model.init_dummy(seed)
    return model


def random_prompts(n: int, lengths: list[int], seed: int = 0, vocab: int = 90) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, vocab, (lengths[i % len(lengths)],), generator=g).tolist() for i in range(n)]
