"""Scoring with an Eagle3 draft loaded: prompt-logprob requests with max_tokens=0 run the target alone."""

from __future__ import annotations

import random

import pytest

from m3bench.runtime import LLM, SamplingParams


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """The tiny checkpoint and the Eagle3 draft the wheel ships for it."""
    from m3bench.runtime.speculative.tiny_draft import shipped_tiny_eagle3
    from m3bench.runtime.tiny import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("pair") / "t", seed=0), shipped_tiny_eagle3()


def _prompts(seed: int) -> list[list[int]]:
    rnd = random.Random(seed)
    return [[rnd.randrange(2048) for _ in range(n)] for n in (23, 9, 140)]


def test_score_requests_beside_generation_equal_the_plain_engine(pair):
    target, draft = pair
    plain = LLM(str(target), device="cpu", dtype="float32", tokens_per_block=16)
    spec = LLM(str(target), device="cpu", dtype="float32", tokens_per_block=16, speculative_model=draft, draft_len=3)
    prompts = _prompts(7)
    score = SamplingParams(max_tokens=0, prompt_logprobs=2)
    gen = SamplingParams(max_tokens=10)
    params = [score, gen, score]
    want, got = plain.generate(prompts, params), spec.generate(prompts, params)
    for w, g, p in zip(want, got, params):
        if p is score:
            assert g.prompt_logprobs == pytest.approx(w.prompt_logprobs, abs=1e-5)
            assert len(g.prompt_logprobs) == len(g.prompt_ids) - 1 and g.token_ids == []
            assert [[t for t, _ in row] for row in g.prompt_top_logprobs] == [[t for t, _ in row] for row in w.prompt_top_logprobs]
            record = spec.spec_record(g.request_id)
            assert record is None or not any(proposed for proposed, _ in record.steps)  # no draft ran for it
        else:
            assert g.token_ids == w.token_ids  # greedy speculation stays lossless beside scoring rows
    assert spec.spec_stats([got[1].request_id]).drafts > 0  # the generating request did speculate


@pytest.mark.parametrize("overlap", [False, True])
def test_prompt_logprobs_with_generation_under_speculation_equal_the_plain_engine(pair, overlap):
    """Prompt logprobs of a generating request (echo with max_tokens > 0) are scored on its prefill rows, the
    generation still speculates, and both equal the plain engine's (overlap: drafts kept on the device)."""
    target, draft = pair
    plain = LLM(str(target), device="cpu", dtype="float32", tokens_per_block=16, max_num_tokens=64)
    spec = LLM(str(target), device="cpu", dtype="float32", tokens_per_block=16, max_num_tokens=64,
               speculative_model=draft, draft_len=3, async_scheduling=overlap)
    prompts = _prompts(11)  # 140 tokens > max_num_tokens: a chunked prefill
    params = SamplingParams(max_tokens=8, prompt_logprobs=1)
    want, got = plain.generate(prompts, params), spec.generate(prompts, params)
    for w, g in zip(want, got):
        assert g.token_ids == w.token_ids and len(g.prompt_logprobs) == len(g.prompt_ids) - 1
        assert g.prompt_logprobs == pytest.approx(w.prompt_logprobs, abs=1e-5)
    assert spec.spec_stats().drafts > 0
