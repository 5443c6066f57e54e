"""Rejection sampling through the engine keeps the target's distribution.

1200 seeded requests of one prompt at temperature 0.6; the draft always proposes the same token x (q ~ one-hot
at x, x the likeliest second token, so a wrong acceptance rule or residual shows as a surplus at x). The
first token comes from the prefill's sampler, the second from the first verify step (accepted draft or
residual resample). Its empirical distribution is tested against the exact marginal
p(t2) = sum_t1 p(t1 | prompt) p(t2 | prompt, t1), computed with the target directly: chi-square over
tokens with expected count >= 5 (the rest merged), false-alarm rate 1e-3 (seeds fixed: deterministic)."""

from __future__ import annotations

import torch
from scipy.stats import chi2

from engine_spec_helpers import LLM, OracleDraft, SamplingParams, llm_args, small_model
from m3bench.runtime.attention.metadata import build_attn_metadata
from m3bench.runtime.kv_cache import KVCache, KVDtype

N = 1200
T = 0.6
PROMPT = [3, 17, 42, 8, 61, 25, 9, 77]


def exact_second_token(model) -> torch.Tensor:
    v = model.cfg.vocab_size
    with torch.inference_mode():
        seqs = [PROMPT] + [PROMPT + [t] for t in range(v)]
        lens = [len(s) for s in seqs]
        meta = build_attn_metadata(lens, lens, [[i] for i in range(len(seqs))], 16)
        kv = KVCache(model.cfg, len(seqs), 16, KVDtype.AUTO, model.dtype)
        hidden = model(torch.tensor([t for s in seqs for t in s]), meta.positions, meta, kv)
        probs = torch.softmax(model.compute_logits(hidden[meta.query_start_loc[1:].long() - 1]).double() / T, -1)
    return probs[0] @ probs[1:]


def test_second_token_follows_the_target_marginal():
    model = small_model(seed=0)
    want = exact_second_token(model)
    draft = OracleDraft(model, [], default=int(want.argmax()))
    llm = LLM(model, speculative_model=draft, draft_len=3, draft_kv="shared",
              **llm_args(kv_cache_dtype="auto", max_batch_size=64, num_kv_blocks=200, max_num_tokens=1024))
    params = [SamplingParams(max_tokens=2, temperature=T, seed=1000 + i, ignore_eos=True) for i in range(N)]
    outs = llm.generate([PROMPT] * N, params)
    s = llm.spec_stats()
    assert s.drafts == N and 0 < s.accepted < s.proposed  # some drafts accepted, some resampled
    counts = torch.bincount(torch.tensor([o.token_ids[1] for o in outs]), minlength=len(want)).double()
    expected = want * N
    big = expected >= 5
    obs = torch.cat((counts[big], counts[~big].sum()[None]))
    exp = torch.cat((expected[big], expected[~big].sum()[None]))
    stat = float(((obs - exp) ** 2 / exp).sum())
    assert stat < chi2.ppf(1 - 1e-3, len(obs) - 1), (stat, len(obs))
    x = draft.default  # and the proposed token on its own: within 3.3 standard deviations (two-sided 1e-3)
    px = float(want[x])
    assert abs(float(counts[x]) - N * px) < 3.3 * (N * px * (1 - px)) ** 0.5, (float(counts[x]), N * px)
