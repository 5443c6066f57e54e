"""Attention DP on GPUs (NCCL for the expert exchange, a reduce-scatter back; one process per GPU): 2 / 4 ranks
give one GPU's greedy tokens and logprobs in fp32 (the fused Triton MoE over every rank's tokens), with
preemption and with Eagle3. Skipped without enough GPUs."""

from __future__ import annotations

import pytest
import torch
from tp_helpers import P, checkpoint_and_draft, random_prompts

from m3bench.runtime import LLM, SamplingParams

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(GPUS < 2, reason="needs 2 CUDA devices")]


def _llm(ckpt, ranks: int, **kw) -> LLM:
    return LLM(ckpt, device="cuda", dtype="float32", kv_cache_dtype="auto", tokens_per_block=P,
               tensor_parallel_size=ranks, attention_dp=ranks > 1, **kw)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    return checkpoint_and_draft(tmp_path_factory.mktemp("adp_gpu"))


@pytest.mark.parametrize("ranks", [r for r in (2, 4) if r <= GPUS])
def test_nccl_attention_dp_matches_one_gpu(dirs, ranks):
    prompts = random_prompts([70, 40, 9, 33, 50, 21, 44, 12], seed=1)
    params = SamplingParams(max_tokens=16, temperature=0.0, logprobs=1)
    want = _llm(dirs[0], 1, num_kv_blocks=256).generate(prompts, params)
    llm = _llm(dirs[0], ranks, num_kv_blocks=8)  # per rank: preempts
    try:
        for w, g in zip(want, llm.generate(prompts, params)):
            assert w.token_ids == g.token_ids and g.logprobs == pytest.approx(w.logprobs, abs=1e-3)
        assert llm.stats().num_preemptions > 0
    finally:
        llm.shutdown()


def test_nccl_attention_dp_eagle3_matches_one_gpu(dirs):
    kw = {"speculative_model": dirs[1], "draft_len": 3, "draft_kv": "separate", "num_kv_blocks": 256}
    prompts = random_prompts([40, 12, 33], seed=9)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    want = _llm(dirs[0], 1, **kw).generate(prompts, params)
    llm = _llm(dirs[0], 2, **kw)
    try:
        assert [o.token_ids for o in llm.generate(prompts, params)] == [o.token_ids for o in want]
    finally:
        llm.shutdown()
