"""On a CUDA device with the engine's default (Triton) attention: greedy speculation is lossless for
both draft-KV layouts at the native page 128 (draft page 32 for SEPARATE), prompts past 2 MSA blocks
of 128 (top-2: selection active), bf16 and fp8 KV; sampled speculation runs and is seed-reproducible."""

from __future__ import annotations

import pytest
import torch

from engine_spec_helpers import LLM, OracleDraft, SamplingParams, random_draft
from m3bench.runtime.config import ModelConfig
from m3bench.runtime.model import M3ForCausalLM
from m3bench.runtime.tiny import TinySpec, m3_text_config

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

SPEC = TinySpec(vocab_size=512, hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=32,
                rotary_dim=16, dense_intermediate_size=256, num_experts=4, top_k=2, intermediate_size=64,
                shared_intermediate_size=64, index_dim=32, block_size=128, topk_blocks=2)
N_NEW = 24


def _model():
    m = M3ForCausalLM(ModelConfig.from_dict(m3_text_config(SPEC, 0, SPEC.vocab_size - 1)), torch.float32, "cuda")
    m.init_dummy(0)
    return m


def _args(**over):
    return {**dict(tokens_per_block=128, num_kv_blocks=64, max_batch_size=8, max_num_tokens=2048,
                   kv_cache_dtype="bf16"), **over}


def _prompts():
    g = torch.Generator().manual_seed(1)
    return [torch.randint(1, SPEC.vocab_size - 1, (n,), generator=g).tolist() for n in (300, 40, 270, 9)]


@pytest.mark.parametrize("kv", ["bf16", "fp8"])
@pytest.mark.parametrize("layout", ["separate", "shared"])
def test_greedy_lossless_on_cuda(layout, kv):
    model, prompts = _model(), _prompts()
    params = SamplingParams(max_tokens=N_NEW, ignore_eos=True)
    ref = [o.token_ids for o in LLM(model, **_args(kv_cache_dtype=kv)).generate(prompts, params)]
    longer = LLM(model, **_args(kv_cache_dtype=kv)).generate(prompts, SamplingParams(max_tokens=N_NEW + 12, ignore_eos=True))
    draft = OracleDraft(model, [p + o.token_ids for p, o in zip(prompts, longer)], wrong_every=3)
    llm = LLM(model, speculative_model=draft, draft_len=3, draft_kv=layout, **_args(kv_cache_dtype=kv))
    assert [o.token_ids for o in llm.generate(prompts, params)] == ref
    s = llm.spec_stats()
    assert 0 < s.accepted < s.proposed


@pytest.mark.parametrize("layout", ["separate", "shared"])
def test_sampled_speculation_on_cuda_is_reproducible(layout):
    model, prompts = _model(), _prompts()
    params = [SamplingParams(max_tokens=N_NEW, temperature=0.8, seed=i, ignore_eos=True) for i in range(4)]
    runs = []
    for _ in range(2):
        llm = LLM(model, speculative_model=random_draft(model), draft_len=3, draft_kv=layout, **_args())
        runs.append([o.token_ids for o in llm.generate(prompts, params)])
    assert runs[0] == runs[1] and all(len(t) == N_NEW for t in runs[0])
