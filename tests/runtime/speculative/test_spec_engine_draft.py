"""The engine's draft state after rollbacks equals a from-scratch recompute of the same prefix.

After every engine step, each decoding request's K proposed drafts must be what the draft proposes when
everything is recomputed from nothing: target over tokens [0, L) with feature capture, draft extend over
positions [0, L), then K - 1 chained steps. Synthetic acceptance (AL 2.5) forces 1 or 2 of 3 drafts accepted, so
the draft KV is rolled back by lengths every step; both layouts, several draft page sizes.
"""

from __future__ import annotations

import pytest
import torch

from engine_spec_helpers import LLM, SamplingParams, llm_args, random_draft, random_prompts, small_model
from m3bench.runtime.attention.metadata import build_attn_metadata
from m3bench.runtime.kv_cache import KVCache, KVDtype
from m3bench.runtime.model import CaptureSpec
from m3bench.runtime.speculative.attention import DraftKV

K = 3
P = 16


def fresh_drafts(model, draft, layers, prefix: list[int]) -> list[int]:
    L = len(prefix) - 1
    pages = list(range(-(-(L + K) // P)))
    kv = KVCache(model.cfg, len(pages), P, KVDtype.AUTO, model.dtype)
    buf = torch.zeros(L, len(layers), model.cfg.hidden_size, dtype=model.dtype)
    meta = build_attn_metadata([L], [L], [pages], P)
    model(torch.tensor(prefix[:L]), meta.positions, meta, kv, CaptureSpec(layers, buf))
    dkv = DraftKV(len(pages), P, draft.cfg.num_kv_heads, draft.cfg.head_dim, KVDtype.AUTO, model.dtype)
    out = draft(torch.tensor(prefix[1:]), meta.positions, draft.combine_features(buf), meta, dkv)
    tok, feat, drafts = draft.compute_logits(out.hidden[-1:]).argmax(-1), out.feature[-1:], []
    drafts.append(int(tok))
    for i in range(1, K):
        m = build_attn_metadata([1], [L + i], [pages], P)
        out = draft(tok, m.positions, feat, m, dkv)
        tok, feat = draft.compute_logits(out.hidden).argmax(-1), out.feature
        drafts.append(int(tok))
    return drafts


@pytest.mark.parametrize("layout,page", [("separate", None), ("separate", 16), ("separate", 8), ("shared", None)])
def test_draft_state_equals_fresh_recompute(layout, page):
    model = small_model(seed=3)
    draft = random_draft(model, seed=4)
    llm = LLM(model, speculative_model=draft, draft_len=K, draft_kv=layout, draft_page_size=page,
              synthetic_acceptance_length=2.5, **llm_args(kv_cache_dtype="auto", tokens_per_block=P,
                                                          max_num_tokens=40))
    layers = llm.engine.spec.capture.layers
    for p in random_prompts(3, [6, 35, 20], seed=5):
        llm.add_request(p, SamplingParams(max_tokens=24, ignore_eos=True))
    checked = 0
    with torch.inference_mode():
        while llm.has_unfinished():
            llm.step()
            for seq in llm.engine.scheduler.running:
                st = llm.engine.spec.states.get(seq.request_id)
                if st is not None and st.drafts and seq.num_to_compute == 1:
                    assert st.drafts == fresh_drafts(model, draft, layers, seq.all_ids), (seq.request_id, seq.num_tokens)
                    checked += 1
    run = llm.spec_stats()
    assert checked >= 20 and run.histogram[1] > 0 and run.histogram[2] > 0  # AL 2.5: 1 or 2 accepted per step
