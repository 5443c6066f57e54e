"""LLM(tensor_parallel_size=2) on CPU (rank 1 spawned, gloo) gives what TP 1 gives: greedy tokens,
logprobs and scores within fp32 tolerance, with MSA selection active, MoE under expert
parallelism, prefix caching and preemption (rank 1's KV pool has rank 0's pages; it writes the slots
rank 0 chose)."""

from __future__ import annotations

import pytest
import torch
from tp_helpers import TP_SPEC, P, random_prompts, tiny_checkpoint

from m3bench.runtime import LLM, SamplingParams

ATOL = 2e-4  # fp32 logprobs: the all-reduced sums round differently from one rank's


def _llm(ckpt, tp: int, **kw) -> LLM:
    return LLM(ckpt, kv_cache_dtype="auto", tokens_per_block=P, tensor_parallel_size=tp, **kw)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("tp_ckpt"))


@pytest.fixture(scope="module")
def pair(ckpt):
    one, two = _llm(ckpt, 1), _llm(ckpt, 2)
    yield one, two
    two.shutdown()


def _same_outputs(a, b) -> None:
    for x, y in zip(a, b, strict=True):
        assert x.token_ids == y.token_ids
        assert x.logprobs == pytest.approx(y.logprobs, abs=ATOL)
        assert [[t for t, _ in top] for top in x.top_logprobs] == [[t for t, _ in top] for top in y.top_logprobs]


def test_greedy_tokens_and_logprobs_match_tp1(pair):
    one, two = pair
    lengths = [70, 40, 9]  # 70 > 2 blocks of 16: MSA keeps 2 of 5 blocks
    assert max(lengths) > TP_SPEC.block_size * TP_SPEC.topk_blocks
    params = SamplingParams(max_tokens=6, temperature=0.0, logprobs=3)
    _same_outputs(one.generate(random_prompts(lengths), params), two.generate(random_prompts(lengths), params))


def test_rank0_holds_half_the_heads_vocab_and_experts(pair):
    _, two = pair
    moe = two.model.layers[1].mlp
    assert (moe.first_expert, moe.w_down.shape[0], moe.w_down.shape[2]) == (0, 2, TP_SPEC.intermediate_size)
    assert two.model.embed_tokens.shape[0] == TP_SPEC.vocab_size // 2
    assert two.engine.runner.kv.k[0].data.shape[1] == TP_SPEC.num_kv_heads // 2


def test_scores_match_tp1(pair):
    one, two = pair
    ctx, cont = random_prompts([50, 12], seed=3)
    pairs = [(ctx, cont), (ctx[:20], cont[:5])]
    for (lp1, g1), (lp2, g2) in zip(one.score(pairs), two.score(pairs)):
        assert lp2 == pytest.approx(lp1, abs=1e-3) and g1 == g2


def test_seeded_sampling_matches_tp1(pair):
    one, two = pair
    params = SamplingParams(max_tokens=8, temperature=0.8, top_k=40, seed=7)
    prompts = random_prompts([33, 17], seed=5)
    assert [o.token_ids for o in one.generate(prompts, params)] == [o.token_ids for o in two.generate(prompts, params)]


def test_prefix_cache_hits_on_both_ranks(pair):
    one, two = pair
    head = random_prompts([48], seed=11)[0]  # three full pages shared
    tails = random_prompts([5, 9], seed=12)
    params = SamplingParams(max_tokens=5, temperature=0.0, logprobs=2)
    for llm in pair:
        llm.generate([head + tails[0]], params)
    hits = two.stats().prefix_hit_tokens
    second = [head + tails[1]]
    _same_outputs(one.generate(second, params), two.generate(second, params))
    assert two.stats().prefix_hit_tokens - hits >= 48


def test_preemption_keeps_ranks_in_lock_step(ckpt):
    """A pool of 10 pages for 4 requests of up to 64 tokens: requests are preempted and recomputed."""
    prompts = random_prompts([40, 36, 30, 44], seed=21)
    params = SamplingParams(max_tokens=20, temperature=0.0, logprobs=1)
    one, two = _llm(ckpt, 1, num_kv_blocks=10), _llm(ckpt, 2, num_kv_blocks=10)
    try:
        a, b = one.generate(prompts, params), two.generate(prompts, params)
        assert two.stats().num_preemptions > 0 and one.stats().num_preemptions == two.stats().num_preemptions
        _same_outputs(a, b)
    finally:
        two.shutdown()


def test_refuses_a_prebuilt_model(pair):
    from m3bench.runtime.errors import InputError

    with pytest.raises(InputError, match="checkpoint directory"):
        LLM(pair[0].model, tensor_parallel_size=2)


def test_a_shut_down_llm_says_so(ckpt):
    llm = _llm(ckpt, 2)
    llm.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2))
    assert not torch.distributed.is_initialized()


def test_rank0_runs_the_tp1_runner_with_a_link(pair):
    """No stand-ins: rank 0's runner is TP 1's ModelRunner; its link (the Driver) sends each step's inputs."""
    from m3bench.runtime.distributed.driver import Driver
    from m3bench.runtime.engine import ModelRunner
    from m3bench.runtime.rank_step import NO_LINK

    one, two = pair
    assert type(two.engine.runner) is type(one.engine.runner) is ModelRunner
    assert one.engine.runner.link is NO_LINK and isinstance(two.engine.runner.link, Driver)
    assert type(two.model) is type(one.model)
