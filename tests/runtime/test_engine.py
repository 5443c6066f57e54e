"""The paged engine against the contiguous path: page sizes, chunked prefill, batching, preemption,
prefix caching, scoring, stop rules (CPU, fp32, a tiny random M3 with MSA block 16)."""

import pytest
import torch

from m3bench.runtime import contiguous
from m3bench.runtime.llm import LLM, SamplingParams

from engine_fixtures import random_prompts, small_model

MAX_NEW = 8
LENGTHS = [5, 40, 17, 33]  # 40 and 33 tokens: MSA selects 2 of 3 blocks


@pytest.fixture(scope="module")
def model():
    return small_model(seed=0)


@pytest.fixture(scope="module")
def prompts():
    return random_prompts(4, LENGTHS, seed=1)


@pytest.fixture(scope="module")
def reference(model, prompts):
    """Contiguous-cache greedy tokens and the logits each was chosen from."""
    return contiguous.generate(model, prompts, MAX_NEW, tokens_per_block=16)


def _llm(model, **kw):
    args = dict(kv_cache_dtype="auto", tokens_per_block=32, num_kv_blocks=64, max_batch_size=8, max_num_tokens=256)
    return LLM(model, **{**args, **kw})


GREEDY = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True, logprobs=0)


def _check_against_reference(outs, reference):
    ref_tokens, ref_logits = reference
    for out, toks, logits in zip(outs, ref_tokens, ref_logits):
        assert out.token_ids == toks
        ref_lp = [torch.log_softmax(lg.double(), -1)[t].item() for lg, t in zip(logits, toks)]
        assert out.logprobs == pytest.approx(ref_lp, abs=1e-4)


@pytest.mark.parametrize("page", [32, 64, 128])
def test_paged_equals_contiguous(model, prompts, reference, page):
    outs = _llm(model, tokens_per_block=page).generate(prompts, GREEDY)
    _check_against_reference(outs, reference)


@pytest.mark.parametrize("budget", [7, 13])
def test_chunked_prefill_at_odd_positions(model, prompts, reference, budget):
    llm = _llm(model, max_num_tokens=budget, tokens_per_block=16)
    _check_against_reference(llm.generate(prompts, GREEDY), reference)


def test_batch_invariance(model, prompts):
    llm = _llm(model)
    together = [o.token_ids for o in llm.generate(prompts, GREEDY)]
    alone = [llm.generate([p], GREEDY)[0].token_ids for p in prompts]
    assert together == alone


def test_requests_added_while_others_run(model, prompts, reference):
    llm = _llm(model, max_num_tokens=16)
    rids = [llm.add_request(prompts[0], GREEDY)]
    got: dict[int, list[int]] = {}
    for i in range(40):
        if i in (2, 5, 6):
            rids.append(llm.add_request(prompts[len(rids)], GREEDY))
        for d in llm.step():
            got.setdefault(d.request_id, []).extend(d.token_ids)
    assert not llm.has_unfinished()
    assert [got[r] for r in rids] == reference[0]


def test_preemption_keeps_outputs(model, prompts, reference):
    llm = _llm(model, tokens_per_block=8, num_kv_blocks=10, enable_prefix_caching=False)  # 80 slots < 127 needed
    outs = llm.generate(prompts, GREEDY)
    assert llm.stats().num_preemptions > 0
    _check_against_reference(outs, reference)
    assert llm.stats().kv_pages_free == 10


def test_prefix_caching_same_outputs_and_hits(model):
    shared = random_prompts(1, [36], seed=5)[0]
    tails = random_prompts(3, [3, 9, 1], seed=6)
    ps = [shared + t for t in tails]
    off = _llm(model, tokens_per_block=16, enable_prefix_caching=False)
    on = _llm(model, tokens_per_block=16)
    base = [o.token_ids for o in off.generate(ps, GREEDY)]
    first = on.generate(ps[:1], GREEDY)
    rest = on.generate(ps[1:], GREEDY)
    assert [o.token_ids for o in first + rest] == base
    assert [o.num_cached_tokens for o in rest] == [32, 32] and on.stats().prefix_hit_tokens >= 64
    assert off.stats().prefix_hit_tokens == 0
    again = on.generate(ps, GREEDY)  # fully cached prompts still recompute their last token
    assert [o.token_ids for o in again] == base


def test_score_equals_full_forward(model, prompts):
    llm = _llm(model, tokens_per_block=16, max_num_tokens=11)
    pairs = [(p[:-k], p[-k:]) for p, k in zip(prompts, [2, 9, 5, 1])]
    got = llm.score(pairs)
    for (ctx, cont), (lp, greedy) in zip(pairs, got):
        logits = contiguous.prefill_logits(model, ctx + cont)
        lsm = torch.log_softmax(logits.double(), -1)
        rows = range(len(ctx) - 1, len(ctx) + len(cont) - 1)
        ref = sum(lsm[r, (ctx + cont)[r + 1]].item() for r in rows)
        assert lp == pytest.approx(ref, abs=1e-4)
        assert greedy == all(lsm[r].argmax().item() == (ctx + cont)[r + 1] for r in rows)
    # a greedy continuation is greedy, and scores after a cached context still match
    ctx = prompts[1]
    cont = llm.generate([ctx], SamplingParams(max_tokens=4, ignore_eos=True))[0].token_ids
    (lp1, g1), (lp2, g2) = llm.score([(ctx, cont), (ctx, cont)])
    assert g1 and g2 and lp1 == pytest.approx(lp2, abs=1e-5)


def test_score_survives_preemption(model, prompts):
    pairs = [(p[:3], p[3:]) for p in prompts]
    roomy = _llm(model, tokens_per_block=8).score(pairs)
    tight = _llm(model, tokens_per_block=8, num_kv_blocks=6, max_num_tokens=9, enable_prefix_caching=False)
    tight.add_request(prompts[0], SamplingParams(max_tokens=40, ignore_eos=True))  # grows to the whole pool
    got = tight.score(pairs)
    assert tight.stats().num_preemptions > 0
    assert [g for _, g in got] == [g for _, g in roomy]
    assert [lp for lp, _ in got] == pytest.approx([lp for lp, _ in roomy], abs=1e-4)


def test_stop_token_ids_min_tokens_and_max_tokens(model, prompts, reference):
    toks = reference[0][1]
    llm = _llm(model)
    out = llm.generate([prompts[1]], SamplingParams(max_tokens=MAX_NEW, stop_token_ids=(toks[2],)))[0]
    cut = toks.index(toks[2]) + 1
    assert out.token_ids == toks[:cut] and out.finish_reason == "stop"
    out = llm.generate([prompts[1]], SamplingParams(max_tokens=3, ignore_eos=True))[0]
    assert out.token_ids == toks[:3] and out.finish_reason == "length"
    p = SamplingParams(max_tokens=6, min_tokens=4, stop_token_ids=tuple(range(96)))  # every token stops
    out = llm.generate([prompts[1]], p)[0]
    assert len(out.token_ids) == 5 and out.finish_reason == "stop"


def test_eos_stops_unless_ignored(model, prompts, reference):
    llm = _llm(model)
    first = reference[0][0][0]
    llm.engine.eos = frozenset({first})  # pretend the first greedy token is EOS
    assert llm.generate([prompts[0]], SamplingParams(max_tokens=5))[0].token_ids == [first]
    out = llm.generate([prompts[0]], SamplingParams(max_tokens=5, ignore_eos=True))[0]
    assert out.token_ids == reference[0][0][:5]
    out = llm.generate([prompts[0]], SamplingParams(max_tokens=5, min_tokens=2))[0]
    assert out.token_ids[0] != first and len(out.token_ids) >= 2


def test_seeded_sampling_reproduces_across_batches(model, prompts):
    p = SamplingParams(max_tokens=MAX_NEW, temperature=1.0, top_k=20, seed=123, ignore_eos=True)
    other = SamplingParams(max_tokens=MAX_NEW, temperature=1.0, ignore_eos=True)
    alone = _llm(model).generate([prompts[2]], p)[0].token_ids
    mixed = _llm(model, seed=9).generate(prompts, [other, other, p, other])[2].token_ids
    assert alone == mixed
    assert _llm(model).generate([prompts[2]], p)[0].token_ids == alone


def test_abort_frees_pages_and_streaming_deltas(model, prompts):
    llm = _llm(model, tokens_per_block=16)
    a = llm.add_request(prompts[1], SamplingParams(max_tokens=50, ignore_eos=True))
    b = llm.add_request(prompts[2], SamplingParams(max_tokens=4, ignore_eos=True))
    got = {a: [], b: []}
    for _ in range(3):
        for d in llm.step():
            got[d.request_id] += d.token_ids
    assert llm.abort(a) and not llm.abort(a)
    finished = False
    while llm.has_unfinished():
        for d in llm.step():
            assert d.request_id == b
            got[b] += d.token_ids
            finished = finished or d.finished
    assert finished and len(got[b]) == 4 and len(got[a]) == 3
    c = llm.add_request(prompts[0], SamplingParams(max_tokens=3, ignore_eos=True, logprobs=2))
    deltas = [d for _ in range(3) for d in llm.step()]
    out = llm.generate([prompts[0]], SamplingParams(max_tokens=3, ignore_eos=True, logprobs=2))[0]
    assert [lp for d in deltas for lp in d.logprobs] == pytest.approx(out.logprobs, abs=1e-5)
    assert [list(t) for d in deltas for t in d.top_logprobs][0][0][0] == out.top_logprobs[0][0][0]
    assert all(d.request_id == c for d in deltas)
    assert llm.stats().kv_pages_free == 64


def test_timings_are_ordered(model, prompts):
    out = _llm(model).generate(prompts[:2], GREEDY)
    for o in out:
        t = o.timings
        assert t.arrival_s <= t.scheduled_s <= t.first_token_s
        assert len(t.token_s) == MAX_NEW and t.token_s == sorted(t.token_s)


def test_tiny_pool_request_finishes_with_length(model):
    llm = _llm(model, tokens_per_block=16, num_kv_blocks=2)  # 32 tokens in all
    out = llm.generate([random_prompts(1, [20])[0]], SamplingParams(max_tokens=50, ignore_eos=True))[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 12


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_engine_matches_contiguous_and_sizes_pool_from_memory():
    model = small_model(seed=0, device="cuda")
    prompts = random_prompts(4, LENGTHS, seed=1)
    ref = contiguous.generate(model, prompts, MAX_NEW, tokens_per_block=16)
    llm = LLM(model, device="cuda", kv_cache_dtype="auto", tokens_per_block=16, gpu_memory_utilization=0.05,
              max_num_tokens=13)
    assert llm.stats().kv_pages_total > 1000  # 5% of an H200 holds far more than the tiny model needs
    _check_against_reference(llm.generate(prompts, GREEDY), ref)
    p = SamplingParams(max_tokens=MAX_NEW, temperature=1.0, top_p=0.9, seed=5, ignore_eos=True)
    a = llm.generate(prompts, [p] * 4)
    b = llm.generate(prompts[::-1], [p] * 4)[::-1]
    assert [o.token_ids for o in a] == [o.token_ids for o in b]


class StaticDenseBackend:
    """A graph-safe dense attention for the test: every token gathers its sequence's whole table row
    and masks keys past its position on the device (no host reads, static shapes)."""

    graph_safe = True

    def dense(self, layer, q, meta, kv, scale):
        T, hq, d = q.shape
        seq_of = torch.searchsorted(meta.query_start_loc[1:].long(), torch.arange(T, device=q.device), right=True)
        pages = meta.block_tables.long()[seq_of]  # [T, W]
        k = kv.k[layer].read(pages, q.dtype)  # [T, W, Hkv, P, d]
        v = kv.v[layer].read(pages, q.dtype)
        hkv = k.shape[2]
        k = k.permute(0, 2, 1, 3, 4).flatten(2, 3)  # [T, Hkv, W*P, d]
        v = v.permute(0, 2, 1, 3, 4).flatten(2, 3)
        keys = torch.arange(k.shape[2], device=q.device)
        allowed = keys[None, :] <= meta.positions[:, None]  # [T, S]
        qh = q.view(T, hkv, hq // hkv, d)
        s = torch.einsum("thgd,thsd->thgs", qh, k) * scale
        s = s.masked_fill(~allowed[:, None, None, :], float("-inf"))
        return torch.einsum("thgs,thsd->thgd", torch.softmax(s, -1), v).reshape(T, hq, d)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graph_decode_matches_eager():
    import dataclasses

    from engine_fixtures import SMALL_M3

    spec = dataclasses.replace(SMALL_M3, num_dense_layers=SMALL_M3.num_layers)  # dense attention + MLP only
    model = small_model(seed=0, spec=spec, device="cuda")
    model.backend = StaticDenseBackend()
    prompts = random_prompts(5, [5, 40, 17, 33, 9], seed=1)
    kw = dict(device="cuda", kv_cache_dtype="auto", tokens_per_block=16, num_kv_blocks=64, max_batch_size=12)
    params = [dataclasses.replace(GREEDY, max_tokens=n) for n in (8, 3, 6, 8, 2)]  # the batch shrinks
    eager = LLM(model, **kw).generate(prompts, params)
    llm = LLM(model, cuda_graphs=True, **kw)
    assert llm.engine.runner.graphs.sizes == [1, 2, 4, 8, 12]
    replays = []
    orig = llm.engine.runner.graphs.replay
    llm.engine.runner.graphs.replay = lambda inputs: replays.append(inputs.input_ids.shape[0]) or orig(inputs)
    graphed = llm.generate(prompts, params)
    assert max(replays) == 5 and 3 in replays
    for a, b in zip(eager, graphed):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    from m3bench.runtime.attention.torch_backend import TorchBackend

    model.backend = TorchBackend()  # and the test backend agrees with the reference one
    assert [o.token_ids for o in LLM(model, **kw).generate(prompts, params)] == [o.token_ids for o in eager]
