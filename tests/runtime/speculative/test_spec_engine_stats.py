"""Acceptance figures through the engine: an oracle draft gives AL = K + 1, the two draft-KV layouts give
identical tokens and statistics (greedy and seeded sampling), synthetic acceptance hits its target."""

from __future__ import annotations

import pytest

from engine_spec_helpers import LLM, OracleDraft, SamplingParams, greedy_reference, llm_args, random_prompts, small_model


@pytest.fixture(scope="module")
def model():
    return small_model(seed=0)


@pytest.fixture(scope="module")
def prompts():
    return random_prompts(4, [9, 37, 21, 30], seed=2)


@pytest.mark.parametrize("k", [1, 3, 7])
def test_oracle_draft_accepts_everything(model, prompts, k):
    n_new = 20
    ref = greedy_reference(model, prompts[:1], n_new + k + 2)
    draft = OracleDraft(model, [prompts[0] + ref[0]])
    llm = LLM(model, speculative_model=draft, draft_len=k, **llm_args())
    out = llm.generate(prompts[:1], SamplingParams(max_tokens=n_new, ignore_eos=True))[0]
    assert out.token_ids == ref[0][:n_new]
    s = out.spec
    assert s.acceptance_length == k + 1 and s.acceptance_rate == 1.0
    assert s.per_position_rate == (1.0,) * k and s.histogram == (0,) * k + (s.drafts,)
    assert s.drafts == -(-(n_new - 1) // (k + 1))  # the first token comes from the prefill
    assert llm.spec_stats() == s


def _run(model, prompts, seqs, layout, params):
    llm = LLM(model, speculative_model=OracleDraft(model, seqs, wrong_every=4), draft_len=3, draft_kv=layout,
              **llm_args(kv_cache_dtype="bf16"))
    outs = llm.generate(prompts, params)
    return [o.token_ids for o in outs], [o.spec for o in outs], llm.spec_stats()


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_layouts_identical_tokens_and_stats(model, prompts, temperature):
    ref = greedy_reference(model, prompts, 40, kv_cache_dtype="bf16")
    seqs = [p + r for p, r in zip(prompts, ref)]
    params = [SamplingParams(max_tokens=16, temperature=temperature, seed=10 + i, ignore_eos=True)
              for i in range(len(prompts))]
    sep = _run(model, prompts, seqs, "separate", params)
    shared = _run(model, prompts, seqs, "shared", params)
    assert sep == shared
    tokens, per_request, run = sep
    assert all(len(t) == 16 for t in tokens)
    assert run.accepted < run.proposed and (run.accepted > 0 or temperature > 0)  # (sampled tokens leave the oracle)
    assert run.drafts == sum(s.drafts for s in per_request)
    assert run.accepted == sum(s.accepted for s in per_request)
    if temperature == 0.0:
        assert tokens == [r[:16] for r in ref]


def test_seeded_sampling_is_reproducible_and_not_greedy(model, prompts):
    params = SamplingParams(max_tokens=16, temperature=1.0, seed=3, ignore_eos=True)
    ref = greedy_reference(model, prompts[:2], 40, kv_cache_dtype="bf16")
    seqs = [p + r for p, r in zip(prompts, ref)]
    a = _run(model, prompts[:2], seqs, "shared", params)
    b = _run(model, prompts[:2], seqs, "shared", params)
    assert a == b
    assert a[0] != [r[:16] for r in ref]


@pytest.mark.parametrize("al", [1.0, 2.3, 4.0])
def test_synthetic_acceptance_hits_the_requested_length(model, prompts, al):
    """AL of forced counts: exact at 1 and 1 + K; within 0.12 (> 4 standard errors at ~300 steps) between."""
    llm = LLM(model, speculative_model=OracleDraft(model, []), draft_len=3, synthetic_acceptance_length=al,
              **llm_args(max_batch_size=4))
    outs = llm.generate(prompts, SamplingParams(max_tokens=240, ignore_eos=True))
    s = llm.spec_stats()
    assert s.synthetic and all(o.spec is None or o.spec.synthetic for o in outs)
    assert all(len(o.token_ids) == 240 for o in outs)
    tol = 0.0 if al in (1.0, 4.0) else 0.12
    assert abs(s.acceptance_length - al) <= tol, (s.acceptance_length, s.drafts)
