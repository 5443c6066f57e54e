"""Prompt logprobs (SamplingParams.prompt_logprobs) equal log_softmax of one full forward, with chunked
prefill, prefix caching, preemption and max_tokens=0 (CPU, fp32, a tiny random M3 with MSA block 16)."""

import pytest
import torch

from m3bench.runtime import contiguous
from m3bench.runtime.errors import InputError
from m3bench.runtime.llm import LLM, SamplingParams

from engine_fixtures import random_prompts, small_model

LENGTHS = [40, 7, 33]  # 40 and 33 tokens: MSA selects 2 of 3 blocks
TOP = 3


@pytest.fixture(scope="module")
def model():
    return small_model(seed=2)


@pytest.fixture(scope="module")
def prompts():
    return random_prompts(3, LENGTHS, seed=5)


def _llm(model, **kw):
    args = dict(kv_cache_dtype="auto", tokens_per_block=16, num_kv_blocks=64, max_batch_size=8, max_num_tokens=256)
    return LLM(model, **{**args, **kw})


def _reference(model, ids):
    """log_softmax of a full forward: row r scores token r + 1."""
    return torch.log_softmax(contiguous.prefill_logits(model, ids).double(), -1)


def _check(model, prompts, outs):
    for ids, out in zip(prompts, outs):
        lsm = _reference(model, ids)
        want = [lsm[r, ids[r + 1]].item() for r in range(len(ids) - 1)]
        assert out.prompt_logprobs == pytest.approx(want, abs=1e-4)
        assert len(out.prompt_top_logprobs) == len(ids) - 1
        for r, row in enumerate(out.prompt_top_logprobs):
            vals, top_ids = lsm[r].topk(TOP)
            assert [t for t, _ in row] == top_ids.tolist()
            assert [v for _, v in row] == pytest.approx(vals.tolist(), abs=1e-4)


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("max_num_tokens", [256, 9])  # 9: every prompt is prefilled in chunks
def test_prompt_logprobs_equal_full_forward(model, prompts, max_num_tokens, async_scheduling):
    llm = _llm(model, max_num_tokens=max_num_tokens, async_scheduling=async_scheduling)
    outs = llm.generate(prompts, SamplingParams(max_tokens=3, ignore_eos=True, prompt_logprobs=TOP))
    _check(model, prompts, outs)
    plain = llm.generate(prompts, SamplingParams(max_tokens=3, ignore_eos=True))
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]  # generation itself is unchanged
    assert plain[0].prompt_logprobs is None


def test_prefix_cache_does_not_skip_prompt_logprobs(model, prompts):
    llm = _llm(model, enable_prefix_caching=True)
    llm.generate(prompts, SamplingParams(max_tokens=2))  # fills the prefix cache with these prompts
    outs = llm.generate(prompts, SamplingParams(max_tokens=2, prompt_logprobs=TOP))
    assert all(o.num_cached_tokens == 0 for o in outs)  # choice: no prefix reuse for prompt-logprob requests
    _check(model, prompts, outs)
    again = llm.generate(prompts, SamplingParams(max_tokens=2))
    assert again[0].num_cached_tokens > 0  # their pages still serve others


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_max_tokens_zero_scores_the_prompt_only(model, prompts, async_scheduling):
    llm = _llm(model, max_num_tokens=12, async_scheduling=async_scheduling)
    outs = llm.generate(prompts, SamplingParams(max_tokens=0, prompt_logprobs=TOP))
    assert all(o.token_ids == [] for o in outs)
    _check(model, prompts, outs)
    zero = llm.generate(prompts[:1], SamplingParams(max_tokens=0, prompt_logprobs=0))[0]
    assert zero.prompt_top_logprobs == [[]] * (len(prompts[0]) - 1)
    assert zero.prompt_logprobs == pytest.approx(outs[0].prompt_logprobs, abs=1e-6)


def test_survives_preemption(model, prompts):
    tight = _llm(model, tokens_per_block=8, num_kv_blocks=8, max_num_tokens=9, enable_prefix_caching=False)
    tight.add_request(prompts[1], SamplingParams(max_tokens=50, ignore_eos=True))  # grows into the whole pool
    outs = tight.generate(prompts, SamplingParams(max_tokens=4, ignore_eos=True, prompt_logprobs=TOP))
    assert tight.stats().num_preemptions > 0
    _check(model, prompts, outs)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_stream_delta_carries_prompt_logprobs_once(model, prompts, async_scheduling):
    llm = _llm(model, max_num_tokens=9, async_scheduling=async_scheduling)
    deltas = list(llm.stream([prompts[0]], SamplingParams(max_tokens=3, ignore_eos=True, prompt_logprobs=1)))
    carried = [d for d in deltas if d.prompt_logprobs]
    assert len(carried) == 1 and len(carried[0].prompt_logprobs) == len(prompts[0]) - 1
    assert carried[0].token_ids  # with the first sampled token


def test_negative_prompt_logprobs_is_input_error():
    with pytest.raises(InputError):
        SamplingParams(prompt_logprobs=-1)
