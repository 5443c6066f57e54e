"""TP on GPUs (NCCL, one process per GPU, spawned by m3bench): TP 2 / 4 give TP 1's greedy tokens and
logprobs in fp32 (MSA selection active, MoE under EP, prefix caching), Eagle3 both layouts, and a dead
worker fails generate within seconds. Skipped without enough GPUs."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch
from tp_helpers import P, random_prompts, tiny_checkpoint

from m3bench.runtime import LLM, SamplingParams
from m3bench.runtime.speculative.tiny_draft import write_tiny_draft

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(GPUS < 2, reason="needs 2 CUDA devices")]


def _llm(ckpt, tp: int, **kw) -> LLM:
    return LLM(ckpt, device="cuda", dtype="float32", kv_cache_dtype="auto", tokens_per_block=P,
               num_kv_blocks=256, tensor_parallel_size=tp, **kw)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("tp_gpu_ckpt"))


@pytest.mark.parametrize("tp", [t for t in (2, 4) if t <= GPUS])
def test_nccl_tp_matches_tp1(ckpt, tp):
    prompts = random_prompts([70, 40, 9], seed=1)
    params = SamplingParams(max_tokens=8, temperature=0.0, logprobs=1)
    want = _llm(ckpt, 1).generate(prompts, params)
    llm = _llm(ckpt, tp)
    try:
        got = llm.generate(prompts, params)
        again = llm.generate(prompts, params)  # prefix-cache hits on every rank
        for w, g, a in zip(want, got, again):
            assert w.token_ids == g.token_ids == a.token_ids
            assert g.logprobs == pytest.approx(w.logprobs, abs=1e-3)
        assert llm.stats().prefix_hit_tokens > 0
    finally:
        llm.shutdown()


@pytest.mark.parametrize("layout", ["separate", "shared"])
def test_nccl_eagle3_matches_tp1(ckpt, tmp_path, layout):
    write_tiny_draft(tmp_path / "draft", ckpt, seed=3)
    kw = {"speculative_model": tmp_path / "draft", "draft_len": 3, "draft_kv": layout}
    prompts = random_prompts([40, 12], seed=9)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    want = _llm(ckpt, 1, **kw).generate(prompts, params)
    llm = _llm(ckpt, 2, **kw)
    try:
        assert [o.token_ids for o in llm.generate(prompts, params)] == [o.token_ids for o in want]
    finally:
        llm.shutdown()


def test_nccl_dead_worker_fails_within_seconds(ckpt):
    llm = _llm(ckpt, 2)
    pid = llm._tp.pool.procs[0].pid
    threading.Timer(1.0, os.kill, (pid, signal.SIGKILL)).start()
    start = time.monotonic()
    try:
        with pytest.raises(RuntimeError, match="worker rank 1"):
            llm.generate([[5, 6, 7]] * 4, SamplingParams(max_tokens=900, ignore_eos=True))
        assert time.monotonic() - start < 60.0
    finally:
        llm.shutdown()
