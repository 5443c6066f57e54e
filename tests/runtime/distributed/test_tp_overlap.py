"""Overlap at TP 2 (CPU, gloo): LLM(tensor_parallel_size=2, async_scheduling=True) gives the synchronous
TP 1 engine's outputs (greedy tokens and logprobs within fp32 tolerance, seeded sampling, preemption),
and with Eagle3 (drafts kept on the device, every draft step run on both ranks) the plain greedy tokens with
TP 1's acceptance counts."""

from __future__ import annotations

import pytest
from tp_helpers import P, checkpoint_and_draft, random_prompts

from m3bench.runtime import LLM, SamplingParams

ATOL = 2e-4  # fp32 logprobs: the all-reduced sums round differently from one rank's


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    return checkpoint_and_draft(tmp_path_factory.mktemp("tp_overlap"))


def _same(a, b) -> None:
    for x, y in zip(a, b, strict=True):
        assert (x.token_ids, x.finish_reason) == (y.token_ids, y.finish_reason)
        if x.logprobs is not None:
            assert x.logprobs == pytest.approx(y.logprobs, abs=ATOL)


def test_overlap_at_tp2_matches_sync_tp1(dirs):
    target, _ = dirs
    kw = dict(kv_cache_dtype="auto", tokens_per_block=P, num_kv_blocks=10)  # 4 x ~60 tokens: preemptions
    prompts = random_prompts([40, 36, 30, 44], seed=21)
    greedy = SamplingParams(max_tokens=16, temperature=0.0, logprobs=1)
    seeded = SamplingParams(max_tokens=8, temperature=0.8, top_k=40, seed=7)
    one = LLM(target, async_scheduling=False, **kw)
    two = LLM(target, tensor_parallel_size=2, async_scheduling=True, **kw)
    try:
        assert two.engine.lands_late and not one.engine.lands_late
        _same(one.generate(prompts, greedy), two.generate(prompts, greedy))
        assert two.stats().num_preemptions > 0
        _same(one.generate(prompts[:2], seeded), two.generate(prompts[:2], seeded))
    finally:
        two.shutdown()


def test_overlap_with_eagle3_at_tp2_matches_tp1(dirs):
    target, draft = dirs
    prompts = random_prompts([40, 12], seed=9)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    kw = dict(kv_cache_dtype="auto", tokens_per_block=P, speculative_model=draft, draft_len=3)
    plain = LLM(target, kv_cache_dtype="auto", tokens_per_block=P).generate(prompts, params)
    one = LLM(target, async_scheduling=False, **kw)
    two = LLM(target, tensor_parallel_size=2, async_scheduling=True, **kw)
    try:
        assert two.engine.spec.drafts_on_device and not one.engine.spec.drafts_on_device
        a, b = one.generate(prompts, params), two.generate(prompts, params)
        assert [o.token_ids for o in a] == [o.token_ids for o in b] == [o.token_ids for o in plain]
        assert two.spec_stats() == one.spec_stats() and two.spec_stats().proposed > 0
    finally:
        two.shutdown()


def test_overlap_eagle3_tp2_with_preemption_matches_sync_tp1(dirs):
    """All of it at once: TP 2, overlap, Eagle3 and a pool too small for the batch (requests preempted and
    recomputed, their draft state dropped); greedy and seeded sampling (rank 0 picks the drafts). The random
    draft accepts nothing on its own: synthetic acceptance (AL 2.5) makes verify rows land drafts."""
    target, draft = dirs
    kw = dict(kv_cache_dtype="auto", tokens_per_block=P, num_kv_blocks=10, speculative_model=draft, draft_len=3,
              synthetic_acceptance_length=2.5)
    prompts = random_prompts([40, 36, 30, 44], seed=21)
    greedy = SamplingParams(max_tokens=14, temperature=0.0, logprobs=1, ignore_eos=True)
    seeded = SamplingParams(max_tokens=8, temperature=0.8, seed=7, ignore_eos=True)
    one = LLM(target, async_scheduling=False, **kw)
    two = LLM(target, tensor_parallel_size=2, async_scheduling=True, **kw)
    try:
        assert two.engine.spec.drafts_on_device
        _same(one.generate(prompts, greedy), two.generate(prompts, greedy))
        assert two.stats().num_preemptions > 0
        assert two.spec_stats() == one.spec_stats() and two.spec_stats().accepted > 0
        _same(one.generate(prompts[:2], seeded), two.generate(prompts[:2], seeded))
    finally:
        two.shutdown()
