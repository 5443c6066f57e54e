"""The public LLM API on a tiny checkpoint: loading, text prompts, streaming, stop strings, bad input,
KV dtypes."""

import dataclasses
import json
import subprocess
import sys

import pytest
import torch

from m3bench.runtime.errors import InputError
from m3bench.runtime.llm import LLM, SamplingParams
from m3bench.runtime.tiny import TinySpec, write_tiny_checkpoint

from engine_fixtures import SMALL_M3, random_prompts, small_model

SPEC = TinySpec(vocab_size=512, hidden_size=32, num_layers=2, num_dense_layers=1, num_heads=4, num_kv_heads=2,
                head_dim=8, rotary_dim=4, dense_intermediate_size=48, num_experts=4, top_k=2, intermediate_size=16,
                shared_intermediate_size=16, index_dim=8, block_size=16, topk_blocks=2, max_position_embeddings=512)
KW = dict(kv_cache_dtype="auto", tokens_per_block=16, num_kv_blocks=64)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), seed=0, spec=SPEC)


@pytest.fixture(scope="module")
def llm(ckpt):
    return LLM(ckpt, **KW)


def test_loads_checkpoint_and_tokenizer(llm, ckpt):
    assert llm.config.vocab_size == 512 and llm.tokenizer is not None
    eos = json.loads((ckpt / "generation_config.json").read_text())["eos_token_id"]
    assert eos in llm.engine.eos


def test_text_prompt_equals_its_token_ids(llm):
    p = SamplingParams(max_tokens=10, ignore_eos=True)
    a = llm.generate("the cat sat", p)[0]
    b = llm.generate([llm.tokenizer.encode("the cat sat")], p)[0]
    assert a.token_ids == b.token_ids and a.text == b.text
    assert a.text == llm.tokenizer.decode(a.token_ids, skip_special_tokens=True)


def test_stream_concatenates_to_generate(llm):
    p = SamplingParams(max_tokens=12, ignore_eos=True)
    outs = llm.generate(["hello", "a b c"], p)
    toks, text, done = {}, {}, set()
    for d in llm.stream(["hello", "a b c"], p):
        toks.setdefault(d.request_id, []).extend(d.token_ids)
        text[d.request_id] = text.get(d.request_id, "") + d.text
        if d.finished:
            done.add(d.request_id)
    assert len(done) == 2
    assert [toks[r] for r in sorted(toks)] == [o.token_ids for o in outs]
    assert [text[r] for r in sorted(text)] == [o.text for o in outs]


def test_stop_string_cuts_text(llm):
    p = SamplingParams(max_tokens=16, ignore_eos=True)
    full = llm.generate("once upon", p)[0]
    assert len(full.text) > 6
    stop = full.text[3:6]
    cut = llm.generate("once upon", dataclasses.replace(p, stop=(stop,)))[0]
    assert cut.finish_reason == "stop" and cut.text == full.text[: full.text.index(stop)]
    assert cut.token_ids == full.token_ids[: len(cut.token_ids)] and len(cut.token_ids) < 16
    streamed = "".join(d.text for d in llm.stream("once upon", dataclasses.replace(p, stop=(stop,))))
    assert streamed == cut.text


def test_dummy_load_from_config(ckpt, tmp_path):
    (tmp_path / "config.json").write_text((ckpt / "config.json").read_text())
    a = LLM(tmp_path, load_format="dummy", seed=3, **KW)
    b = LLM(None, load_format="dummy", config=a.config, seed=3, **KW)
    assert a.tokenizer is None
    ids = random_prompts(2, [7, 20], vocab=500)
    p = SamplingParams(max_tokens=5, ignore_eos=True)
    assert [o.token_ids for o in a.generate(ids, p)] == [o.token_ids for o in b.generate(ids, p)]
    with pytest.raises(InputError):
        a.generate("text needs a tokenizer", p)


@pytest.mark.parametrize("bad", [
    dict(model="/nonexistent/dir"), dict(dtype="float7"), dict(kv_cache_dtype="int3"),
    dict(load_format="pickle"), dict(max_num_tokens=0), dict(num_kv_blocks=0), dict(cuda_graphs=True)])
def test_bad_construction_is_input_error(ckpt, bad):
    args = {"model": ckpt, **KW, **bad}
    with pytest.raises(InputError):
        LLM(args.pop("model"), **args)


def test_bad_requests_are_input_errors(llm):
    with pytest.raises(InputError):
        llm.generate([[1, 2, 99999]], SamplingParams())
    with pytest.raises(InputError):
        llm.generate([[1] * 600], SamplingParams())  # longer than max_position_embeddings 512
    with pytest.raises(InputError):
        llm.score([([], [1, 2])])
    with pytest.raises(InputError):
        SamplingParams(top_p=0.0)
    with pytest.raises(InputError):
        llm.generate([[1, 2], [3]], [SamplingParams()])
    with pytest.raises(InputError):  # a bad prompt after good ones queues none of them
        llm.generate([[1, 2], [3, 4], [99999]], SamplingParams())
    assert not llm.has_unfinished() and not llm._tracked


def test_max_tokens_zero_and_mixed_params(llm):
    outs = llm.generate([[5, 6, 7], [8, 9]], [SamplingParams(max_tokens=0), SamplingParams(max_tokens=2, ignore_eos=True)])
    assert outs[0].token_ids == [] and outs[0].finish_reason == "length" and len(outs[1].token_ids) == 2
    rid = llm.add_request([5, 6], SamplingParams(max_tokens=0))
    assert any(d.request_id == rid and d.finished for d in llm.step())


@pytest.mark.parametrize("overlap", [False, True])
def test_max_tokens_zero_alone_finishes(ckpt, overlap):
    """Only requests with nothing to generate: the engine reports them finished (it once went idle before)."""
    llm = LLM(ckpt, async_scheduling=overlap, **KW)
    outs = llm.generate([[5, 6, 7], [8, 9]], SamplingParams(max_tokens=0))
    assert [(o.token_ids, o.finish_reason) for o in outs] == [([], "length")] * 2 and not llm.has_unfinished()


def test_graph_batch_sizes():
    from m3bench.runtime.engine import graph_batch_sizes

    assert graph_batch_sizes(1) == [1]
    assert graph_batch_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert graph_batch_sizes(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]


def test_import_does_not_load_torch():
    code = "import sys, m3bench.runtime as r; r.SamplingParams; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# NVFP4 groups 16 head-dim elements: a 16-wide variant of the small model.
WIDE = dataclasses.replace(SMALL_M3, head_dim=16, rotary_dim=8, index_dim=16)
# Mean |logprob - bf16 logprob| over every scored token (each position scored as its own request), with
# stated tolerances about twice what this tiny random model shows (measured: fp32 cache 0.0045, fp8 0.075,
# hybrid 0.13, nvfp4 0.27; its attention is sharp, |q| = |k| = sqrt(d) after the Gemma qk-norm).
KV_TOL = {"fp8": 0.15, "hybrid": 0.3, "nvfp4": 0.5}


@pytest.mark.parametrize("kv", ["fp8", "nvfp4", "hybrid"])
def test_quantized_kv_stays_close_to_bf16(kv):
    model = small_model(seed=2, spec=WIDE)
    seq = random_prompts(1, [57], seed=4)[0]
    pairs = [(seq[:k], seq[k:k + 1]) for k in range(1, len(seq))]

    def logprobs(kv_dtype):
        llm = LLM(model, kv_cache_dtype=kv_dtype, tokens_per_block=16, num_kv_blocks=64)
        return torch.tensor([lp for lp, _ in llm.score(pairs)])

    ref = logprobs("bf16")
    err = (logprobs(kv) - ref).abs().mean().item()
    assert 0 < err < KV_TOL[kv]
    assert (logprobs("auto") - ref).abs().mean().item() < err  # bf16 rounding is the smaller error


def test_speculative_deltas_concatenate_to_the_output_with_stops_and_logprobs(ckpt, tmp_path):
    # A verify row lands several tokens in one delta (forced acceptance 3 of K 3): its tokens, text, times and
    # logprobs in order, the stop string cut mid-run, and the concatenation equal to the finished output.
    from m3bench.runtime.speculative.tiny_draft import write_tiny_draft

    write_tiny_draft(tmp_path / "draft", ckpt, seed=1)
    spec = LLM(ckpt, speculative_model=tmp_path / "draft", draft_len=3, synthetic_acceptance_length=3.0, **KW)
    p = SamplingParams(max_tokens=24, ignore_eos=True, logprobs=2)
    full = spec.generate("once upon", p)[0]
    stop = full.text[5:8]
    assert len(full.text) > 8 and stop
    for params in (p, dataclasses.replace(p, stop=(stop,))):
        out = spec.generate("once upon", params)[0]
        deltas = list(spec.stream("once upon", params))
        assert max(len(d.token_ids) for d in deltas) > 1  # runs landed as one delta
        assert [t for d in deltas for t in d.token_ids] == out.token_ids
        assert "".join(d.text for d in deltas) == out.text
        assert all(len(d.logprobs) == len(d.top_logprobs) == len(d.token_ids) == len(d.token_times_s) for d in deltas)
        assert [x for d in deltas for x in d.logprobs] == pytest.approx(out.logprobs)
        assert deltas[-1].finished and not any(d.finished for d in deltas[:-1])
    assert out.finish_reason == "stop" and out.text == full.text[: full.text.index(stop)]
