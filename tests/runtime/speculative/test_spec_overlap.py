"""Overlap with speculation (LLM(async_scheduling=True, speculative_model=...)): the drafts stay on the
device and the next step is built while the chain runs; the outputs are exactly the synchronous
speculative engine's and, for greedy requests, the plain engine's (tokens, logprobs, stop reasons),
under preemption, with requests joining mid-run, seeded sampling, both draft-KV layouts and the
static-buffer (CUDA graph) paths run on the CPU (CPU, fp32/bf16 KV, tiny random M3)."""

from __future__ import annotations

import pytest
import torch
from engine_spec_helpers import LLM, OracleDraft, SamplingParams, llm_args, random_draft, random_prompts, small_model

import m3bench.runtime.engine_builder as engine_builder
import m3bench.runtime.engine_config as engine_config
from m3bench.runtime.decode_state import PLACEHOLDER

N_NEW = 12


@pytest.fixture(scope="module")
def model():
    return small_model(seed=0)


@pytest.fixture(scope="module")
def prompts():
    return random_prompts(4, [5, 40, 17, 33], seed=1)


@pytest.fixture(scope="module")
def oracle_seqs(model, prompts):
    outs = LLM(model, **llm_args(kv_cache_dtype="bf16")).generate(
        prompts, SamplingParams(max_tokens=N_NEW + 16, ignore_eos=True))
    return [p + o.token_ids for p, o in zip(prompts, outs)]


def _spec(model, draft, overlap: bool, layout: str = "separate", k: int = 3, **over):
    llm = LLM(model, speculative_model=draft, draft_len=k, draft_kv=layout, async_scheduling=overlap,
              **llm_args(**over))
    assert llm.engine.spec.drafts_on_device is overlap
    return llm


def _same(got, want, lp_tol: float = 1e-5):
    for g, w in zip(got, want, strict=True):
        assert (g.token_ids, g.finish_reason, g.text) == (w.token_ids, w.finish_reason, w.text)
        assert PLACEHOLDER not in g.token_ids
        if w.logprobs is not None:
            assert g.logprobs == pytest.approx(w.logprobs, abs=lp_tol)
            assert [[t for t, _ in top] for top in g.top_logprobs] == [[t for t, _ in top] for top in w.top_logprobs]


def _device_drafts_seen(llm, prompts, params) -> tuple[list, bool]:
    """Run to the end by steps; whether some step left its drafts on the device (placeholders on the host)."""
    seen = False
    rids = [llm.add_request(p, params) for p in prompts]
    tokens: dict[int, list[int]] = {r: [] for r in rids}
    while llm.has_unfinished():
        for d in llm.step():
            tokens[d.request_id] += d.token_ids
        states = llm.engine.spec.states.values()
        seen |= any(st.tokens is not None and st.drafts == [PLACEHOLDER] * len(st.drafts) and st.drafts
                    for st in states)
    return [tokens[r] for r in rids], seen


@pytest.mark.parametrize("layout", ["separate", "shared"])
@pytest.mark.parametrize("k", [1, 3])
def test_greedy_overlap_equals_the_plain_engine(model, prompts, oracle_seqs, layout, k):
    params = SamplingParams(max_tokens=N_NEW, ignore_eos=True)
    want = [o.token_ids for o in LLM(model, **llm_args(kv_cache_dtype="bf16")).generate(prompts, params)]
    sync = _spec(model, OracleDraft(model, oracle_seqs, wrong_every=3), False, layout, k, kv_cache_dtype="bf16")
    assert [o.token_ids for o in sync.generate(prompts, params)] == want
    over = _spec(model, OracleDraft(model, oracle_seqs, wrong_every=3), True, layout, k, kv_cache_dtype="bf16")
    got, seen = _device_drafts_seen(over, prompts, params)
    assert got == want and seen
    a, b = sync.spec_stats(), over.spec_stats()
    assert (a.drafts, a.proposed, a.accepted) == (b.drafts, b.proposed, b.accepted) and 0 < b.accepted < b.proposed


def test_logprobs_stops_and_preemption_under_overlap(model, prompts, oracle_seqs):
    """Logprobs and top-2 per token equal the plain engine's; stop ids met inside an accepted run; a pool
    too small for all four (preemptions drop and rebuild the draft state)."""
    ref = LLM(model, **llm_args(kv_cache_dtype="bf16")).generate(prompts, SamplingParams(max_tokens=N_NEW,
                                                                                         ignore_eos=True))
    params = [SamplingParams(max_tokens=N_NEW, logprobs=2, stop_token_ids=(r.token_ids[5 + i],), min_tokens=i)
              for i, r in enumerate(ref)]
    want = LLM(model, **llm_args(kv_cache_dtype="bf16")).generate(prompts, params)
    assert any(w.finish_reason == "stop" for w in want)
    over = _spec(model, OracleDraft(model, oracle_seqs, wrong_every=3), True, kv_cache_dtype="bf16",
                 num_kv_blocks=9)
    _same(over.generate(prompts, params), want, lp_tol=1e-3)
    assert over.stats().num_preemptions > 0 and over.spec_stats().accepted > 0
    assert over.engine.spec.early_steps > 0  # stops inside accepted runs, preemptions: with the early draft
    assert over.engine.spec.device_steps > 0  # and verify steps built on the device from its state
    assert over.engine.spec.layout.num_free == over.engine.spec.layout.store.num_pages  # all draft pages back


@pytest.mark.parametrize("layout", ["separate", "shared"])
@pytest.mark.parametrize("k", [1, 3])
def test_early_draft_equals_drafting_after_landing(model, prompts, oracle_seqs, layout, k):
    """A pure greedy verify step drafts from its verification on the device, before it lands (the extend
    over the verify row's K + 1 positions at a fixed shape), and the next pure-verify step is built on the
    device from that draft's state: the same drafts and inputs as the host's, so the same proposals,
    acceptances and tokens; requests of different lengths finish at different steps (max_tokens inside an
    accepted run; the block-table rows of those left move)."""
    params = [SamplingParams(max_tokens=N_NEW - 3 * i, ignore_eos=True) for i in range(4)]
    runs = {}
    for early in (False, True):
        llm = _spec(model, OracleDraft(model, oracle_seqs, wrong_every=3), True, layout, k, kv_cache_dtype="bf16")
        llm.engine.spec.early = early
        outs = [(o.token_ids, o.finish_reason) for o in llm.generate(prompts, params)]
        st = llm.spec_stats()
        spec = llm.engine.spec
        runs[early] = (outs, st.drafts, st.proposed, st.accepted, spec.early_steps, spec.device_steps)
    assert runs[True][:4] == runs[False][:4] and 0 < runs[True][3] < runs[True][2]
    assert runs[False][4:] == (0, 0) and runs[True][4] > 0 and runs[True][5] > 0


@pytest.mark.parametrize("layout", ["separate", "shared"])
def test_seeded_sampling_and_joining_requests_match_the_synchronous_loop(model, prompts, layout):
    """Rejection sampling with per-request seeds (and one unseeded request on the shared generator): the
    same draws in the same order, so the same tokens and logprobs; two requests join mid-run."""
    params = [SamplingParams(max_tokens=N_NEW, temperature=0.8, top_p=0.9, seed=None if i == 3 else 7 + i,
                             ignore_eos=True, logprobs=1) for i in range(4)]

    def run(overlap: bool):
        llm = _spec(model, random_draft(model, seed=3), overlap, layout, max_num_tokens=48)
        rids = [llm.add_request(p, q) for p, q in zip(prompts[:2], params[:2])]
        got: dict[int, list] = {}
        for step in range(300):
            if step == 2:
                rids += [llm.add_request(p, q) for p, q in zip(prompts[2:], params[2:])]
            for d in llm.step():
                toks, lps = got.setdefault(d.request_id, ([], []))
                toks += d.token_ids
                lps += d.logprobs
            if step > 2 and not llm.has_unfinished():
                break
        return [got[r] for r in rids], llm.spec_stats()

    (want, a), (got, b) = run(False), run(True)
    assert [t for t, _ in got] == [t for t, _ in want]
    assert torch.allclose(torch.tensor([x for _, lp in got for x in lp]), torch.tensor([x for _, lp in want for x in lp]),
                          atol=1e-5)
    assert (a.proposed, a.accepted) == (b.proposed, b.accepted) and b.proposed > 0


@pytest.fixture
def cpu_graphs(monkeypatch):
    """LLM(cuda_graphs=True) on the CPU: the captured functions run on their static buffers."""
    monkeypatch.setattr(engine_config, "check_modes", lambda cfg: None)
    monkeypatch.setattr(engine_builder, "check_graphs", lambda *a: None)


@pytest.mark.parametrize(("temperature", "top_p"), [(0.0, 1.0), (1.0, 1.0), (1.0, 0.8)])
def test_graph_paths_under_overlap(model, prompts, oracle_seqs, cpu_graphs, temperature, top_p):
    """The verify graph (greedy verification inside it; rejection sampling, with or without top-p, in the
    sampled verification graph) and the early draft graph (greedy or sampled first pick and chain, the noise
    drawn in the eager order) take the device drafts; the tokens equal the eager synchronous loop's."""
    params = [SamplingParams(max_tokens=N_NEW, ignore_eos=True, temperature=temperature, seed=5 + i,
                             top_p=top_p if i % 2 else 1.0) for i in range(4)]
    outs = {}
    for overlap, graphs in ((False, False), (True, True)):
        llm = LLM(model, speculative_model=OracleDraft(model, oracle_seqs, wrong_every=3), draft_len=3,
                  cuda_graphs=graphs, async_scheduling=overlap, **llm_args(kv_cache_dtype="bf16"))
        outs[overlap] = [o.token_ids for o in llm.generate(prompts, params)]
    assert outs[True] == outs[False]
    replays = llm.engine.spec.graphs.replays
    assert replays["verify"] > 0
    assert replays["early"] > 0 and replays["early"] == llm.engine.spec.early_steps  # the draft before landing
    assert (replays["sampled"] > 0) == (temperature > 0)  # rejection sampling in its graph


def test_scoring_beside_overlapped_speculation(model, prompts, oracle_seqs):
    """Scoring rows share steps with verify rows whose drafts are on the device; scores are the plain engine's."""
    pairs = [(prompts[1], prompts[3][:6]), (prompts[0], prompts[2][:3])]
    want = LLM(model, **llm_args(kv_cache_dtype="bf16")).score(pairs)
    over = _spec(model, OracleDraft(model, oracle_seqs, wrong_every=3), True, kv_cache_dtype="bf16")
    rid = over.add_request(prompts[2], SamplingParams(max_tokens=N_NEW, ignore_eos=True))
    over.step()
    over.step()  # the request now holds drafts on the device
    assert over.engine.spec.states[rid].tokens is not None
    got = over.score(pairs)
    assert [g for _, g in got] == [g for _, g in want]
    assert max(abs(a - b) for (a, _), (b, _) in zip(got, want)) < 1e-3


def test_runs_land_as_token_by_token(model, prompts, oracle_seqs, monkeypatch):
    """Engine.land appends a run at once when no stop rule can fire within it (Engine._no_stop_within); the
    tokens, logprobs, tops and finish reasons equal landing token by token, with stop ids, min_tokens and
    max_tokens met inside accepted runs."""
    from m3bench.runtime.engine import Engine

    ref = LLM(model, **llm_args(kv_cache_dtype="bf16")).generate(prompts, SamplingParams(max_tokens=N_NEW,
                                                                                         ignore_eos=True))
    params = [SamplingParams(max_tokens=N_NEW - i, logprobs=2, min_tokens=i,
                             stop_token_ids=(r.token_ids[4 + 2 * i],) if i < 3 else ()) for i, r in enumerate(ref)]
    runs, fast = [], Engine._no_stop_within
    for allowed in (True, False):
        calls = []

        def spy(self, seq, tokens, allowed=allowed, calls=calls):
            calls.append(fast(self, seq, tokens))
            return calls[-1] and allowed

        monkeypatch.setattr(Engine, "_no_stop_within", spy)
        llm = _spec(model, OracleDraft(model, oracle_seqs, wrong_every=3), True, kv_cache_dtype="bf16")
        outs = llm.generate(prompts, params)
        runs.append([(o.token_ids, o.finish_reason, o.logprobs, o.top_logprobs) for o in outs])
        assert any(calls) and not all(calls)  # both kinds of run happened
    assert runs[0] == runs[1]
    assert any(o[1] == "stop" for o in runs[0]) and any(o[1] == "length" for o in runs[0])
