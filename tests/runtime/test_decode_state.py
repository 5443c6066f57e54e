"""Decode inputs kept on the device (runtime/decode_state): the device-built step equals the host-built
one, and building it does no per-request Python work (CPU, fp32, the tiny random M3)."""

import sys

import pytest
from engine_fixtures import random_prompts, small_model

from m3bench.runtime.llm import LLM, SamplingParams

KW = dict(kv_cache_dtype="auto", tokens_per_block=16, num_kv_blocks=64, max_batch_size=8, max_num_tokens=64)


@pytest.fixture(scope="module")
def model():
    return small_model(seed=0)


def _host_built(llm):
    llm.engine.runner.state = None  # every step built on the host, as before the DecodeState
    return llm


class PrepareProbe:
    """Wraps runner.prepare: counts device-built steps, checks them against the host's view of the batch,
    and counts the Python line events (sys.settrace) that building each one took."""

    def __init__(self, runner, trace: bool = False):
        self.runner, self.orig, self.trace = runner, runner.prepare, trace
        self.device_built, self.lines = 0, []
        runner.prepare = self

    def __call__(self, batch):
        count = [0]

        def tracer(frame, event, arg):
            count[0] += event == "line"
            return tracer

        if self.trace:
            sys.settrace(tracer)
        try:
            inputs = self.orig(batch)
        finally:
            sys.settrace(None)
        if inputs.device_built:
            self.device_built += 1
            self.lines.append((len(batch.seqs), count[0]))
            _check_against_host(inputs, batch)
        return inputs


def _check_against_host(inputs, batch):
    seqs = batch.seqs
    assert inputs.input_ids.tolist() == [s.all_ids[s.num_computed] for s in seqs]
    assert inputs.positions.tolist() == [s.num_computed for s in seqs]
    assert inputs.meta.seq_lens_host == inputs.meta.seq_lens.tolist() == [s.num_computed + 1 for s in seqs]
    P = 16
    want = [s.block_ids[s.num_computed // P] * P + s.num_computed % P for s in seqs]
    assert inputs.meta.slot_mapping.tolist() == want


def test_device_built_decode_equals_host_built(model):
    prompts = random_prompts(6, [5, 40, 17, 33, 9, 21], seed=1)
    params = [SamplingParams(max_tokens=n, ignore_eos=True, logprobs=1) for n in (8, 3, 12, 5, 1, 9)]
    ref = _host_built(LLM(model, **KW)).generate(prompts, params)
    llm = LLM(model, **KW)
    probe = PrepareProbe(llm.engine.runner)
    moves = []
    llm.engine.scheduler.bm.on_move.append(lambda src, dst: moves.append((src, dst)))
    out = llm.generate(prompts, params)
    assert probe.device_built >= 5 and moves  # requests finished out of row order: rows moved with their state
    for a, b in zip(ref, out):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def test_device_built_survives_preemption_and_seeded_sampling(model):
    prompts = random_prompts(4, [30, 25, 40, 20], seed=2)
    p = [SamplingParams(max_tokens=20, temperature=1.0, top_k=30, seed=10 + i, ignore_eos=True) for i in range(4)]
    kw = {**KW, "num_kv_blocks": 9}  # 144 tokens for 4 x 50: preemptions
    ref = _host_built(LLM(model, **kw)).generate(prompts, p)
    llm = LLM(model, **kw)
    probe = PrepareProbe(llm.engine.runner)
    out = llm.generate(prompts, p)
    assert llm.stats().num_preemptions > 0 and probe.device_built > 0
    assert [o.token_ids for o in out] == [o.token_ids for o in ref]


def _decode_lines(model, batch_size: int) -> list[int]:
    llm = LLM(model, **{**KW, "max_batch_size": 64, "num_kv_blocks": 2 * 64 + 8, "max_num_tokens": 512})
    probe = PrepareProbe(llm.engine.runner, trace=True)
    llm.generate(random_prompts(batch_size, [3, 6, 4], seed=3), SamplingParams(max_tokens=4, ignore_eos=True))
    assert probe.lines and all(b == batch_size for b, _ in probe.lines)
    return [n for _, n in probe.lines]


def test_decode_prep_has_no_per_request_python(model):
    """Criterion: building a device-built decode step executes exactly as many Python lines (settrace
    line events, which also fire on every loop iteration) at batch 64 as at batch 1."""
    one, many = _decode_lines(model, 1), _decode_lines(model, 64)
    assert len(set(one)) == 1 and one[0] > 0
    assert many == one
