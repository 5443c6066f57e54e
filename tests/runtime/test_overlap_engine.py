"""Overlap scheduling (the step loop's overlap mode, runtime/overlap.py): LLM(async_scheduling=True) gives exactly the outputs of
the synchronous engine, with the stop rules applied one step late (CPU, fp32, tiny random M3)."""

import dataclasses

import pytest
import torch
from engine_fixtures import EOS, SMALL_M3, random_prompts, small_model

from m3bench.runtime.config import ModelConfig
from m3bench.runtime.decode_state import PLACEHOLDER
from m3bench.runtime.engine_config import DeviceFacts, EngineConfig, resolve
from m3bench.runtime.llm import LLM, SamplingParams
from m3bench.runtime.model import M3ForCausalLM
from m3bench.runtime.tiny import TinySpec, m3_text_config, write_tiny_checkpoint

KW = dict(kv_cache_dtype="auto", tokens_per_block=16, num_kv_blocks=64, max_batch_size=8, max_num_tokens=64)
# head_dim 32 and the MSA block as the page: shapes the Triton kernels take
TRITON_SPEC = dataclasses.replace(SMALL_M3, hidden_size=128, num_heads=4, num_kv_heads=2, head_dim=32, rotary_dim=16,
                                  index_dim=32)
PROMPTS = random_prompts(6, [5, 40, 17, 33, 9, 21], seed=1)


@pytest.fixture(scope="module")
def model():
    return small_model(seed=0)


def _pair(model, **kw):
    """(synchronous engine with host-built steps, overlap engine) on the same model."""
    sync = LLM(model, **{**KW, **kw})
    sync.engine.runner.state = None
    over = LLM(model, async_scheduling=True, **{**KW, **kw})
    assert over.engine.lands_late and not sync.engine.lands_late
    return sync, over


def _same(a, b):
    for x, y in zip(a, b, strict=True):
        assert x.token_ids == y.token_ids and x.text == y.text and x.finish_reason == y.finish_reason
        assert PLACEHOLDER not in y.token_ids
        if x.logprobs is not None:
            assert x.logprobs == pytest.approx(y.logprobs, abs=1e-5)
            assert [[i for i, _ in t] for t in x.top_logprobs] == [[i for i, _ in t] for t in y.top_logprobs]


def test_greedy_stops_one_step_late_give_the_same_outputs(model):
    sync, over = _pair(model)
    free = sync.generate(PROMPTS, SamplingParams(max_tokens=12, ignore_eos=True))
    stops = [o.token_ids[i % 5 + 1] for i, o in enumerate(free)]  # each request meets its stop id mid-run
    params = [SamplingParams(max_tokens=n, ignore_eos=True, logprobs=2, stop_token_ids=(s,), min_tokens=i % 3)
              for i, (n, s) in enumerate(zip((12, 3, 12, 7, 1, 12), stops))]
    ref = sync.generate(PROMPTS, params)
    assert {o.finish_reason for o in ref} == {"stop", "length"}
    _same(ref, over.generate(PROMPTS, params))
    assert over.stats().kv_pages_free == 64 and not over.has_unfinished()


def test_seeded_sampling_preemption_and_prefix_caching(model):
    sync, over = _pair(model, num_kv_blocks=9)  # 144 tokens for 4 x ~50: preemptions
    prompts = random_prompts(4, [30, 25, 40, 20], seed=2)
    p = [SamplingParams(max_tokens=20, temperature=1.0, top_p=0.9, seed=10 + i, ignore_eos=True) for i in range(4)]
    _same(sync.generate(prompts, p), over.generate(prompts, p))
    assert over.stats().num_preemptions > 0
    shared = random_prompts(1, [40], seed=4)[0]
    cached = [shared + t for t in random_prompts(3, [3, 5, 2], seed=5)]
    g = SamplingParams(max_tokens=6, ignore_eos=True, logprobs=0)
    sync, over = _pair(model)
    _same(sync.generate(cached, g), over.generate(cached, g))
    _same(sync.generate(cached, g), over.generate(cached, g))  # second round: served from the cache
    assert over.stats().prefix_hit_tokens == sync.stats().prefix_hit_tokens > 0


def _run_joining(llm, schedule):
    """Requests join at given step numbers; tokens gathered from the deltas."""
    got, ids, step = {}, {}, 0
    while len(ids) < len(schedule) or llm.has_unfinished():
        for k, (at, prompt, params) in enumerate(schedule):
            if at == step:
                ids[k] = llm.add_request(prompt, params)
                got[ids[k]] = []
        for d in llm.step():
            got[d.request_id] += d.token_ids
        step += 1
    return [got[ids[k]] for k in range(len(schedule))]


def test_requests_joining_and_finishing_mid_run(model):
    sync, over = _pair(model)
    schedule = [(at, PROMPTS[i], SamplingParams(max_tokens=n, ignore_eos=True, seed=i, temperature=0.8 * (i % 2)))
                for i, (at, n) in enumerate([(0, 9), (0, 2), (2, 6), (3, 4), (7, 5), (8, 1)])]
    built = []
    prepare = over.engine.runner._prepare_decode
    over.engine.runner._prepare_decode = lambda batch: built.append(len(batch.seqs)) or prepare(batch)
    a, b = _run_joining(sync, schedule), _run_joining(over, schedule)
    assert a == b and [len(x) for x in b] == [9, 2, 6, 4, 5, 1]
    assert len(built) >= 3  # decode steps consumed the in-flight tokens on the device


def test_abort_and_score_while_a_step_is_in_flight(model):
    _, over = _pair(model)
    a = over.add_request(PROMPTS[1], SamplingParams(max_tokens=50, ignore_eos=True))
    for _ in range(4):
        over.step()
    seq = over.engine.scheduler.find(a)
    assert seq in over.engine.flight.seqs and len(seq.output_ids) == 3  # the 4th token is in flight
    assert over.abort(a) and len(seq.output_ids) == 3 and PLACEHOLDER not in seq.output_ids
    pairs = [(PROMPTS[0], PROMPTS[2][:4]), (PROMPTS[3], PROMPTS[4][:3])]
    sync, _ = _pair(model)
    got, want = over.score(pairs), sync.score(pairs)
    assert [g for _, g in got] == [g for _, g in want]
    assert [lp for lp, _ in got] == pytest.approx([lp for lp, _ in want], abs=1e-5)
    while over.has_unfinished():
        over.step()
    assert over.stats().kv_pages_free == 64


SPEC = TinySpec(vocab_size=512, hidden_size=32, num_layers=2, num_dense_layers=1, num_heads=4, num_kv_heads=2,
                head_dim=8, rotary_dim=4, dense_intermediate_size=48, num_experts=4, top_k=2, intermediate_size=16,
                shared_intermediate_size=16, index_dim=8, block_size=16, topk_blocks=2, max_position_embeddings=512)


def test_stop_strings_and_streaming_text(tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path, seed=0, spec=SPEC)
    kw = dict(kv_cache_dtype="auto", tokens_per_block=16, num_kv_blocks=64)
    sync, over = LLM(ckpt, **kw), LLM(ckpt, async_scheduling=True, **kw)
    p = SamplingParams(max_tokens=16, ignore_eos=True)
    prompts = ["once upon", "the cat sat", "a b c"]
    full = sync.generate(prompts, p)
    stops = [dataclasses.replace(p, stop=(o.text[3 + i:6 + i],)) for i, o in enumerate(full)]
    ref = sync.generate(prompts, stops)
    assert all(o.finish_reason == "stop" for o in ref)
    _same(ref, over.generate(prompts, stops))
    streamed = "".join(d.text for d in over.stream(prompts[0], stops[0]))
    assert streamed == ref[0].text


def test_async_choice():
    """Overlap's default (engine_config.resolve): on for CUDA at TP 1, with speculation too (lossless and faster
    on the H200, docs/performance.md 5a); at TP > 1 only when asked (lossless on CPU ranks:
    distributed/test_tp_overlap.py, not yet run on GPUs)."""
    def overlap(asked, device, **kw):
        facts = DeviceFacts(2 if device == "cuda" else 0)
        return resolve(EngineConfig("m", device=device, async_scheduling=asked, cuda_graphs=False, **kw), facts
                       ).async_scheduling

    assert overlap(None, "cuda") and not overlap(None, "cpu")  # default: CUDA only
    assert overlap(None, "cuda", draft="d") and not overlap(None, "cuda", tensor_parallel_size=2)
    assert overlap(True, "cpu") and not overlap(False, "cuda") and overlap(True, "cpu", draft="d")
    assert overlap(True, "cuda", tensor_parallel_size=2, draft="d")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("graphs", [False, True])
def test_cuda_overlap_equals_sync(graphs):
    from test_engine import StaticDenseBackend

    spec = dataclasses.replace(SMALL_M3, num_dense_layers=SMALL_M3.num_layers) if graphs else SMALL_M3
    model = small_model(seed=0, spec=spec, device="cuda")
    if graphs:
        model.backend = StaticDenseBackend()
    kw = dict(device="cuda", kv_cache_dtype="auto", tokens_per_block=16, num_kv_blocks=64, max_batch_size=12,
              cuda_graphs=graphs)
    sync = LLM(model, async_scheduling=False, **kw)
    sync.engine.runner.state = None
    over = LLM(model, async_scheduling=True, **kw)
    assert over.engine.lands_late
    params = [SamplingParams(max_tokens=n, ignore_eos=True, logprobs=1, seed=i, temperature=0.7 * (i % 2))
              for i, n in enumerate((8, 3, 6, 8, 2, 5))]
    _same(sync.generate(PROMPTS, params), over.generate(PROMPTS, params))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("graphs", [False, True])
def test_cuda_step_returns_while_the_next_step_runs(graphs):
    """With a 10 ms device delay in each model call, the overlap engine's step() returns while its
    launched step is still queued (it never waits for the device's queue); the synchronous one does not.
    The serving path: Triton kernels, eager or with decode graphs (the torch reference backend is not covered)."""
    from m3bench.runtime.attention.triton_backend import TritonBackend

    model = M3ForCausalLM(ModelConfig.from_dict(m3_text_config(TRITON_SPEC, 0, EOS)), torch.float32, "cuda",
                          backend=TritonBackend())
    model.init_dummy(0)
    kw = dict(device="cuda", kv_cache_dtype="auto", tokens_per_block=16, num_kv_blocks=64, max_batch_size=8,
              cuda_graphs=graphs)
    busy = {}
    for mode in (False, True):
        llm = LLM(model, async_scheduling=mode, **kw)
        run = llm.engine.runner.run
        llm.generate(PROMPTS[:3], SamplingParams(max_tokens=6, ignore_eos=True))  # warm-up: compile outside the check
        llm.engine.runner.run = lambda inputs, batch, run=run: torch.cuda._sleep(20_000_000) or run(inputs, batch)
        for p in PROMPTS[:3]:
            llm.add_request(p, SamplingParams(max_tokens=6, ignore_eos=True))
        flags = []
        while llm.has_unfinished():
            llm.step()
            flags.append(not torch.cuda.current_stream().query())  # device still busy when step() returned
        torch.cuda.synchronize()
        busy[mode] = flags
    assert sum(busy[False]) <= 1  # (tiny row-move copies of the last step may still be queued)
    assert sum(busy[True]) >= len(busy[True]) - 2
