"""The model's torch path on CUDA: same results as on CPU, every KV dtype, an M3-like bf16 shape."""

from __future__ import annotations

import pytest
import torch

from m3bench.runtime.contiguous import greedy_generate, prefill_logits
from m3bench.runtime.kv_cache import KVDtype
from m3bench.runtime.model import M3ForCausalLM
from m3bench.runtime.reference import reference_logits
from tiny_m3 import build, random_weights, rel_err, tiny_m3_cfg

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _ids(n: int, vocab: int, seed: int) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_cuda_fp32_matches_reference_and_cpu_greedy():
    cfg = tiny_m3_cfg()
    w = random_weights(cfg, seed=0)
    model = M3ForCausalLM(cfg, torch.float32, "cuda")
    model.load_canonical(w)
    ids = _ids(100, 512, 100)
    assert rel_err(prefill_logits(model, ids, [37, 1, 62], 8).cpu(), reference_logits(cfg, w, ids)) < 1e-4
    prompts = [ids[:90], ids[:25]]
    assert greedy_generate(model, prompts, 8) == greedy_generate(build(cfg, w), prompts, 8)


@pytest.mark.parametrize("kv_dtype", list(KVDtype))
def test_cuda_every_kv_dtype(kv_dtype):
    cfg = tiny_m3_cfg()
    model = M3ForCausalLM(cfg, torch.bfloat16, "cuda")
    model.init_dummy(1)
    logits = prefill_logits(model, _ids(80, 512, 1), [50, 30], 16, kv_dtype)
    assert logits.is_cuda and logits.dtype == torch.float32 and logits.isfinite().all()


def test_cuda_bf16_m3_like_shape_with_page_128():
    """head_dim 128, rotary 64, 4 KV / index heads of 128, block 128 top-4, 32 experts top-4."""
    cfg = tiny_m3_cfg(hidden_size=1024, num_attention_heads=16, num_key_value_heads=4, head_dim=128,
                      rotary_dim=64, vocab_size=32000, num_local_experts=32, num_experts_per_tok=4,
                      intermediate_size=256, shared_intermediate_size=256, dense_intermediate_size=1024,
                      sparse=dict(sparse_num_index_heads=4, sparse_index_dim=128, sparse_block_size=128,
                                  sparse_topk_blocks=4))
    model = M3ForCausalLM(cfg, torch.bfloat16, "cuda")
    model.init_dummy(0)
    p = _ids(1000, 32000, 2)  # 8 blocks of 128 > top-4
    bf16 = greedy_generate(model, [p, p[:300]], 16, tokens_per_block=128, kv_dtype=KVDtype.BF16)
    hybrid = greedy_generate(model, [p, p[:300]], 16, tokens_per_block=128, kv_dtype=KVDtype.HYBRID)
    assert all(len(o) == 16 for o in bf16 + hybrid)
    assert greedy_generate(model, [p, p[:300]], 16, tokens_per_block=128, kv_dtype=KVDtype.BF16) == bf16
