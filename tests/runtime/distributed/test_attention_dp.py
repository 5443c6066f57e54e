"""LLM(tensor_parallel_size=2, attention_dp=True) on CPU (rank 1 spawned, gloo): two engines, each with its own
requests and KV cache, attention with all heads, the routed experts split over the ranks with the tokens
exchanged; it gives what one rank gives: greedy tokens and logprobs within fp32 tolerance, with Eagle3
(each rank's own draft KV), with preemption (small pools), with a rank that has no request at all."""

from __future__ import annotations

import pytest
from tp_helpers import TP_SPEC, P, checkpoint_and_draft, random_prompts

from m3bench.runtime import LLM, SamplingParams

ATOL = 2e-4  # fp32 logprobs, as the TP tests: the experts' partial sums are added across ranks
QUESTIONS = ("Janet has 3 apples and buys 5 more. How many does she have?",  # chat prompts: the tiny draft
             "A train travels 60 miles in 2 hours. What is its speed?",  # was distilled on GSM8K chats
             "Tom reads 12 pages a day. How many pages in a week?", "Sara had 20 dollars and spent 7. How much is left?",
             "A box holds 6 eggs. How many eggs are in 4 boxes?", "Ben is 9. His sister is twice his age. How old is she?")
POOL = 10  # pages per rank: 4 requests of up to 60 tokens per rank do not fit, so requests are preempted


def _llm(ckpt, dp: bool, **kw) -> LLM:
    return LLM(ckpt, kv_cache_dtype="auto", tokens_per_block=P, tensor_parallel_size=2 if dp else 1,
               attention_dp=dp, **kw)


def _same_outputs(a, b) -> None:
    for x, y in zip(a, b, strict=True):
        assert x.token_ids == y.token_ids and x.finish_reason == y.finish_reason
        assert x.logprobs == pytest.approx(y.logprobs, abs=ATOL)
        assert [[t for t, _ in top] for top in x.top_logprobs] == [[t for t, _ in top] for top in y.top_logprobs]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    return checkpoint_and_draft(tmp_path_factory.mktemp("adp"))


@pytest.fixture(scope="module")
def pair(dirs):
    one, two = _llm(dirs[0], False), _llm(dirs[0], True, num_kv_blocks=POOL)
    yield one, two
    two.shutdown()


def test_greedy_tokens_and_logprobs_match_one_rank(pair):
    one, two = pair
    lengths = [70, 40, 9]  # 70 > 2 MSA blocks of 16: selection active; rank 0 gets 2 requests, rank 1 one
    params = SamplingParams(max_tokens=6, temperature=0.0, logprobs=3)
    _same_outputs(one.generate(random_prompts(lengths), params), two.generate(random_prompts(lengths), params))


def test_each_rank_holds_all_heads_and_half_the_experts(pair):
    _, two = pair
    moe = two.model.layers[1].mlp
    assert (moe.first_expert, moe.w_down.shape[0]) == (0, TP_SPEC.num_experts // 2)
    assert two.model.embed_tokens.shape[0] == TP_SPEC.vocab_size
    assert two.engine.local.runner.kv.k[0].data.shape[1] == TP_SPEC.num_kv_heads


def test_preemption_on_both_ranks(pair):
    one, two = pair
    prompts = random_prompts([40, 36, 30, 44, 38, 33, 41, 35], seed=21)
    params = SamplingParams(max_tokens=20, temperature=0.0, logprobs=1)
    before = two.stats().num_preemptions
    _same_outputs(one.generate(prompts, params), two.generate(prompts, params))
    assert two.stats().num_preemptions > before
    assert two.engine.rank_stats[1].num_preemptions > 0  # rank 1 preempted its own requests


def test_a_rank_without_requests_serves_its_experts(pair):
    one, two = pair
    params = SamplingParams(max_tokens=5, temperature=0.0, logprobs=0)
    start = two.engine.exchange.exchanges
    prompt = random_prompts([25], seed=4)
    _same_outputs(one.generate(prompt, params), two.generate(prompt, params))
    assert two.engine.rank_stats[1].num_running == 0 and two.engine.exchange.exchanges > start


def test_scores_seeded_sampling_and_abort(pair):
    one, two = pair
    ctx, cont = random_prompts([50, 12], seed=3)
    pairs = [(ctx, cont), (ctx[:20], cont[:5])]
    for (lp1, g1), (lp2, g2) in zip(one.score(pairs), two.score(pairs)):
        assert lp2 == pytest.approx(lp1, abs=1e-3) and g1 == g2
    params = SamplingParams(max_tokens=8, temperature=0.8, top_k=40, seed=7)
    prompts = random_prompts([33, 17], seed=5)
    assert [o.token_ids for o in one.generate(prompts, params)] == [o.token_ids for o in two.generate(prompts, params)]
    a, b = (two.add_request(p, SamplingParams(max_tokens=50)) for p in prompts)
    two.step()
    assert two.abort(b) and not two.abort(b)  # b runs on rank 1
    while two.has_unfinished():
        assert all(d.request_id != b for d in two.step())
    assert two.stats().num_running == 0 and two.stats().num_waiting == 0


def test_overlap_scheduling_on_every_rank(dirs, pair):
    """async_scheduling: each rank's engine runs in overlap mode (tokens land a step late), still one rank's outputs."""
    one = pair[0]
    prompts = random_prompts([40, 36, 30, 44, 9], seed=22)
    params = SamplingParams(max_tokens=10, temperature=0.0, logprobs=2)
    two = _llm(dirs[0], True, num_kv_blocks=POOL - 2, async_scheduling=True)
    try:
        assert two.engine.local.lands_late
        _same_outputs(one.generate(prompts, params), two.generate(prompts, params))
        assert two.stats().num_preemptions > 0
    finally:
        two.shutdown()


def test_eagle3_matches_one_rank_with_preemption(tmp_path):
    """The embedded tiny checkpoint (8 experts, 4 per rank) and the draft distilled for it (drafts are accepted);
    pages of 16 tokens, 7 per rank for 3 requests of ~36 + 12 + 6 lookahead tokens each: requests are preempted."""
    from m3bench.runtime.speculative.tiny_draft import shipped_tiny_eagle3
    from m3bench.runtime.tiny import write_tiny_checkpoint

    target = write_tiny_checkpoint(tmp_path / "tiny-m3")
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=1)
    kw = {"kv_cache_dtype": "auto", "tokens_per_block": P, "speculative_model": shipped_tiny_eagle3(), "draft_len": 3,
          "draft_kv": "separate"}
    one, two = LLM(target, **kw), LLM(target, tensor_parallel_size=2, attention_dp=True, num_kv_blocks=7, **kw)
    try:
        prompts = [one.apply_chat_template([{"role": "user", "content": q}]) for q in QUESTIONS]
        a, b = one.generate(prompts[:2], params), two.generate(prompts[:2], params)  # one per rank: no preemption
        _same_outputs(a, b)
        assert [o.spec for o in a] == [o.spec for o in b] and sum(o.spec.accepted for o in b) > 0
        _same_outputs(one.generate(prompts, params), two.generate(prompts, params))  # lossless under preemption
        assert two.engine.rank_stats[1].num_preemptions > 0 and two.stats().num_preemptions > 0
        assert two.engine.local.spec.layout.store is not None  # rank 0's own draft KV pool
    finally:
        two.shutdown()


def test_a_rank_killed_mid_generate_fails_within_seconds(dirs):
    import os
    import signal
    import threading
    import time

    llm = _llm(dirs[0], True)
    pid = llm._tp.pool.procs[0].pid
    killed_at: list[float] = []
    threading.Timer(0.5, lambda: (killed_at.append(time.monotonic()), os.kill(pid, signal.SIGKILL))).start()
    try:
        with pytest.raises(RuntimeError, match=r"worker rank 1 \(pid \d+\) exited with code -9"):
            llm.generate([[5, 6, 7]] * 2, SamplingParams(max_tokens=1000, ignore_eos=True))
        assert time.monotonic() - killed_at[0] < 10.0
        with pytest.raises(RuntimeError, match="cannot continue"):
            llm.generate([[5, 6, 7]], SamplingParams(max_tokens=2))
    finally:
        llm.shutdown()


def test_refused_before_any_process_starts(dirs, pair):
    from m3bench.runtime.distributed.attention_dp import RankSpec, check_fits
    from m3bench.runtime.engine_config import EngineConfig
    from m3bench.runtime.errors import InputError

    three = EngineConfig(dirs[0], device="cpu", dtype="float32", tensor_parallel_size=3, attention_dp=True)
    with pytest.raises(InputError, match="attention_dp over 3 ranks does not fit this model: num_experts 4"):
        check_fits(RankSpec(three))
    with pytest.raises(InputError, match="checkpoint directories"):
        LLM(pair[0].model, tensor_parallel_size=2, attention_dp=True)


TORCHRUN_SCRIPT = """
import json, os, sys
from m3bench.runtime import LLM, SamplingParams

llm = LLM(sys.argv[1], kv_cache_dtype="auto", tokens_per_block=16, tensor_parallel_size=2, attention_dp=True)
out = llm.generate([[5, 6, 7, 8, 9], [9, 8, 7]], SamplingParams(max_tokens=6))  # one request per rank
print("RANK", os.environ["RANK"], json.dumps([o.token_ids for o in out]), flush=True)
"""


def test_under_torchrun_rank_0_fronts_and_rank_1_serves(dirs, pair, tmp_path):
    import json
    import os
    import subprocess
    import sys

    script = tmp_path / "run.py"
    script.write_text(TORCHRUN_SCRIPT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script),
           str(dirs[0])]
    res = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert res.returncode == 0, res.stderr[-2000:]
    lines = [line.split(" ", 2) for line in res.stdout.splitlines() if line.startswith("RANK")]
    assert [r for _, r, _ in lines] == ["0"]  # rank 1 ran its engine for rank 0, then exited quietly
    want = pair[0].generate([[5, 6, 7, 8, 9], [9, 8, 7]], SamplingParams(max_tokens=6))
    assert json.loads(lines[0][2]) == [o.token_ids for o in want]
