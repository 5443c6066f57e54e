"""Greedy speculative decoding through the engine emits exactly the non-speculative greedy tokens:
both draft-KV layouts, draft lengths 1/3/7, batch 1 and 4, pages of 16 and 32, bf16 and fp8 KV,
prompts past 2 MSA blocks of 16 (top-2: sparse selection active), requests joining mid-run.

The draft is an oracle wrong at every third position (engine_spec_helpers.OracleDraft), so every
step mixes acceptances and rejections: the rollback-by-length path runs constantly."""

from __future__ import annotations

import pytest

from engine_spec_helpers import LLM, OracleDraft, SamplingParams, greedy_reference, llm_args, random_prompts, small_model

N_NEW = 14
LENGTHS = [5, 40, 17, 33]


@pytest.fixture(scope="module")
def model():
    return small_model(seed=0)


@pytest.fixture(scope="module")
def prompts():
    return random_prompts(4, LENGTHS, seed=1)


@pytest.fixture(scope="module")
def oracle_seqs(model, prompts):
    """Prompt + a longer greedy continuation: the oracle's lookup table."""
    outs = greedy_reference(model, prompts, N_NEW + 16, kv_cache_dtype="bf16")
    return [p + o for p, o in zip(prompts, outs)]


_REFS: dict = {}


def _reference(model, prompts, **over):
    key = (len(prompts), tuple(sorted(over.items())))
    if key not in _REFS:
        _REFS[key] = greedy_reference(model, prompts, N_NEW, **over)
    return _REFS[key]


def _spec(model, prompts, seqs, layout: str, k: int, **over):
    llm = LLM(model, speculative_model=OracleDraft(model, seqs, wrong_every=3), draft_len=k, draft_kv=layout,
              **llm_args(**over))
    outs = llm.generate(prompts, SamplingParams(max_tokens=N_NEW, ignore_eos=True))
    return [o.token_ids for o in outs], llm.spec_stats()


@pytest.mark.parametrize("layout", ["separate", "shared"])
@pytest.mark.parametrize("k", [1, 3, 7])
def test_lossless_draft_lengths(model, prompts, oracle_seqs, layout, k):
    got, stats = _spec(model, prompts, oracle_seqs, layout, k, kv_cache_dtype="bf16")
    assert got == _reference(model, prompts, kv_cache_dtype="bf16")
    assert 0 < stats.accepted < stats.proposed  # both acceptances and rejections happened
    assert stats.histogram[0] > 0 and sum(stats.histogram[1:]) > 0


@pytest.mark.parametrize("layout", ["separate", "shared"])
@pytest.mark.parametrize("over", [dict(kv_cache_dtype="bf16", tokens_per_block=32),
                                  dict(kv_cache_dtype="fp8"), dict(kv_cache_dtype="fp8", tokens_per_block=32)],
                         ids=["bf16-p32", "fp8-p16", "fp8-p32"])
def test_lossless_pages_and_kv_dtypes(model, prompts, oracle_seqs, layout, over):
    got, _ = _spec(model, prompts, oracle_seqs, layout, 3, **over)
    assert got == _reference(model, prompts, **over)


@pytest.mark.parametrize("layout", ["separate", "shared"])
def test_lossless_batch_one(model, prompts, oracle_seqs, layout):
    one = [prompts[1]]
    got, stats = _spec(model, one, oracle_seqs, layout, 3, kv_cache_dtype="bf16")
    assert got == _reference(model, one, kv_cache_dtype="bf16")
    assert stats.drafts > 0


@pytest.mark.parametrize("layout", ["separate", "shared"])
def test_lossless_with_requests_joining_mid_run(model, prompts, oracle_seqs, layout):
    """Two requests decode; two more join at step 3 and prefill in the same steps as the others verify
    (a 48-token budget: the 33-token prompt is chunked over two steps)."""
    llm = LLM(model, speculative_model=OracleDraft(model, oracle_seqs, wrong_every=3), draft_len=3,
              draft_kv=layout, **llm_args(kv_cache_dtype="bf16", max_num_tokens=48))
    params = SamplingParams(max_tokens=N_NEW, ignore_eos=True)
    rids = [llm.add_request(p, params) for p in prompts[:2]]
    tokens: dict[int, list[int]] = {}
    for step in range(200):
        if step == 3:
            rids += [llm.add_request(p, params) for p in prompts[2:]]
        deltas = llm.step()
        if step == 3:  # the old requests decoded in the step where the newcomers were admitted
            assert len(llm.engine.scheduler.running) == 4 and {d.request_id for d in deltas} >= set(rids[:2])
        for d in deltas:
            tokens.setdefault(d.request_id, []).extend(d.token_ids)
        if not llm.has_unfinished():
            break
    assert [tokens[r] for r in rids] == _reference(model, prompts, kv_cache_dtype="bf16")


@pytest.mark.parametrize("layout", ["separate", "shared"])
def test_lossless_under_preemption(model, prompts, oracle_seqs, layout):
    """A pool too small for all four: requests are preempted, their draft state dropped and rebuilt."""
    over = dict(kv_cache_dtype="bf16", num_kv_blocks=12)
    llm = LLM(model, speculative_model=OracleDraft(model, oracle_seqs, wrong_every=3), draft_len=3,
              draft_kv=layout, **llm_args(**over))
    outs = llm.generate(prompts, SamplingParams(max_tokens=N_NEW, ignore_eos=True))
    assert llm.stats().num_preemptions > 0
    assert [o.token_ids for o in outs] == _reference(model, prompts, kv_cache_dtype="bf16")
    if layout == "separate":
        assert llm.engine.spec.layout.num_free == llm.engine.spec.layout.store.num_pages  # all returned


def test_shared_layout_keeps_prefix_caching(model, prompts, oracle_seqs):
    """SHARED: a repeated long prompt hits the prefix cache (the draft layer's pages come with it);
    SEPARATE turns prefix caching off (docs in speculative/setup.py)."""
    again = [prompts[1], prompts[1]]
    llm = LLM(model, speculative_model=OracleDraft(model, oracle_seqs, wrong_every=3), draft_len=3,
              draft_kv="shared", **llm_args(kv_cache_dtype="bf16"))
    first = llm.generate(again[:1], SamplingParams(max_tokens=N_NEW, ignore_eos=True))
    second = llm.generate(again[1:], SamplingParams(max_tokens=N_NEW, ignore_eos=True))
    assert second[0].num_cached_tokens >= 32
    want = _reference(model, [prompts[1]], kv_cache_dtype="bf16")
    assert first[0].token_ids == second[0].token_ids == want[0]
    sep = LLM(model, speculative_model=OracleDraft(model, oracle_seqs), draft_len=3, draft_kv="separate",
              **llm_args(kv_cache_dtype="bf16"))
    sep.generate(again, SamplingParams(max_tokens=4, ignore_eos=True))
    assert sep.stats().prefix_hit_tokens == 0


def test_logprobs_under_speculation_match(model, prompts, oracle_seqs):
    """Requests asking for logprobs still speculate; each token's logprob is the target's at its position."""
    params = SamplingParams(max_tokens=N_NEW, ignore_eos=True, logprobs=2)
    want = LLM(model, **llm_args(kv_cache_dtype="bf16")).generate(prompts, params)
    llm = LLM(model, speculative_model=OracleDraft(model, oracle_seqs, wrong_every=3), draft_len=3,
              **llm_args(kv_cache_dtype="bf16"))
    got = llm.generate(prompts, params)
    assert llm.spec_stats().accepted > 0
    for g, w in zip(got, want):
        assert g.token_ids == w.token_ids and len(g.logprobs) == N_NEW
        assert max(abs(a - b) for a, b in zip(g.logprobs, w.logprobs)) < 1e-3
        assert [[t for t, _ in top] for top in g.top_logprobs] == [[t for t, _ in top] for top in w.top_logprobs]


def test_scoring_beside_speculative_decoding(model, prompts, oracle_seqs):
    """Scoring requests (prefill only) share steps with verify rows; their logprobs are the plain engine's."""
    pairs = [(prompts[1], prompts[3][:6]), (prompts[0], prompts[2][:3])]
    want = LLM(model, **llm_args(kv_cache_dtype="bf16")).score(pairs)
    llm = LLM(model, speculative_model=OracleDraft(model, oracle_seqs, wrong_every=3), draft_len=3,
              **llm_args(kv_cache_dtype="bf16"))
    llm.add_request(prompts[2], SamplingParams(max_tokens=N_NEW, ignore_eos=True))
    llm.step()
    got = llm.score(pairs)
    assert [g for _, g in got] == [g for _, g in want]
    assert max(abs(a - b) for (a, _), (b, _) in zip(got, want)) < 1e-3


@pytest.mark.parametrize("layout", ["separate", "shared"])
def test_stop_token_inside_an_accepted_run(model, prompts, oracle_seqs, layout):
    """A stop token among the accepted drafts ends the request there; later tokens of the step are dropped."""
    ref = _reference(model, prompts, kv_cache_dtype="bf16")
    params = [SamplingParams(max_tokens=N_NEW, stop_token_ids=(r[6],), min_tokens=2) for r in ref]
    want = LLM(model, **llm_args(kv_cache_dtype="bf16")).generate(prompts, params)
    llm = LLM(model, speculative_model=OracleDraft(model, oracle_seqs), draft_len=7, draft_kv=layout,
              **llm_args(kv_cache_dtype="bf16"))
    got = llm.generate(prompts, params)
    assert [(g.token_ids, g.finish_reason) for g in got] == [(w.token_ids, w.finish_reason) for w in want]
    assert any(w.finish_reason == "stop" for w in want) and llm.spec_stats().accepted > 0
