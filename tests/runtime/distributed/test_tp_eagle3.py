"""Eagle3 speculative decoding at TP 2 on CPU, both draft-KV layouts: the draft (vocab-parallel
embedding, column/row-parallel layer) runs on both ranks from the inputs rank 0 sends
(draft_step.run_draft); the outputs, every step's draft proposals and the acceptance counts equal TP 1's."""

from __future__ import annotations

import pytest
from tp_helpers import P, checkpoint_and_draft, random_prompts

from m3bench.runtime import LLM, SamplingParams


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    return checkpoint_and_draft(tmp_path_factory.mktemp("tp_eagle"))


def _run(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> tuple[list[list[int]], list[dict]]:
    """(outputs, the draft tokens each request holds after every step)."""
    rids = [llm.add_request(p, params) for p in prompts]
    outs = {r: [] for r in rids}
    proposals = []
    while llm.has_unfinished():
        for d in llm.step():
            outs[d.request_id] += d.token_ids
        proposals.append({r: list(st.drafts) for r, st in llm.engine.spec.states.items()})
    return [outs[r] for r in rids], proposals


@pytest.mark.parametrize("layout", ["separate", "shared"])
def test_eagle3_at_tp2_matches_tp1(dirs, layout):
    target, draft = dirs
    prompts = random_prompts([40, 12], seed=9)  # 40 > 2 MSA blocks of 16: selection active
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    kw = {"kv_cache_dtype": "auto", "tokens_per_block": P, "speculative_model": draft, "draft_len": 3,
          "draft_kv": layout}
    plain = LLM(target, kv_cache_dtype="auto", tokens_per_block=P).generate(prompts, params)
    one, two = LLM(target, **kw), LLM(target, tensor_parallel_size=2, **kw)
    try:
        (a, drafts_a), (b, drafts_b) = _run(one, prompts, params), _run(two, prompts, params)
        assert a == b == [o.token_ids for o in plain]
        assert drafts_a == drafts_b and any(d for step in drafts_b for d in step.values())
        assert two.spec_stats() == one.spec_stats() and two.spec_stats().proposed > 0
    finally:
        two.shutdown()
