"""Trace replay on CPU: reading and refusing trace files, the prompt builder, the schedule, the trace metrics."""

import asyncio
import json
import time

import numpy as np
import pytest
from typer.testing import CliRunner

from m3bench.bench.client import Chunk, run_load
from m3bench.bench.metrics import (compute_metrics, e2e_interactivity_p90, possible_prefix_hits, prefix_hit_rate,
                                   trace_block_reuse)
from m3bench.bench.records import PrefixCounters, RequestRecord
from m3bench.bench.sweep import parse_engine_counters
from m3bench.bench.trace import (BlockTokens, TraceRequest, TraceSchedule, TraceSpec, read_trace, scale_request,
                                 trace_prompts)
from m3bench.bench.trace_replay import plan_trace_point
from m3bench.bench.workload import WorkloadPrompt
from m3bench.cli.main import app
from m3bench.runtime.errors import InputError

A = pytest.approx


def _line(ts, n_in, n_out, ids):
    return json.dumps({"timestamp": ts, "input_length": n_in, "output_length": n_out, "hash_ids": ids})


HAND_MADE = [  # 512-token blocks; request 2 continues request 0's conversation, request 3 shares block 0 only
    _line(0, 1100, 10, [0, 1, 2]),  # blocks 512 + 512 + 76
    _line(250, 600, 4, [7, 8]),  # 512 + 88
    _line(500, 1536, 20, [0, 1, 2]),  # the same three blocks, now all full (76 -> 512)
    _line(1500, 700, 2, [0, 9]),
]


@pytest.fixture
def hand_trace(tmp_path):
    path = tmp_path / "hand.jsonl"
    path.write_text("\n".join(HAND_MADE) + "\n")
    return path


def test_read_and_scale(hand_trace):
    reqs = read_trace(hand_trace)
    assert [r.line for r in reqs] == [1, 2, 3, 4] and reqs[2].hash_ids == (0, 1, 2)
    s = scale_request(reqs[0], 16)  # F = 1/32: blocks 16, last block 76 / 32 = 2.4 -> 2, output 10/32 -> 1
    assert (s.input_len, s.output_len, s.hash_ids) == (16 + 16 + 2, 1, (0, 1, 2))
    spec = TraceSpec(hand_trace, offset=1, max_requests=2, scale=1 / 32)
    assert spec.block_tokens == 16 and [r.line for r in spec.window()] == [2, 3]
    with pytest.raises(InputError, match="whole number"):
        TraceSpec(hand_trace, scale=0.1).check()


def test_prompt_builder_equal_ids_equal_blocks(bpe_tokenizer, hand_trace):
    reqs = TraceSpec(hand_trace, scale=1 / 8).window()  # blocks of 64 tokens
    prompts = trace_prompts(bpe_tokenizer, reqs, 64, seed=3)
    assert [p.prompt_len for p in prompts] == [r.input_len for r in reqs] == [64 + 64 + 10, 64 + 11, 192, 64 + 24]
    assert [p.output_len for p in prompts] == [r.output_len for r in reqs]
    a, b, c, d = (np.array(p.token_ids) for p in prompts)
    assert (a[:128] == c[:128]).all() and (a[128:] == c[128:138]).all()  # partial block 2 = prefix of the full one
    assert (a[:64] == d[:64]).all() and not (a[64:88] == d[64:88]).all()  # block 0 shared, 1 vs 9 differ
    assert not (a[:64] == b[:64]).all()
    special = set(bpe_tokenizer.all_special_ids)
    assert not special & set(a.tolist())
    again = trace_prompts(bpe_tokenizer, reqs, 64, seed=3)
    assert [p.token_ids for p in again] == [p.token_ids for p in prompts]  # deterministic
    other = trace_prompts(bpe_tokenizer, reqs, 64, seed=3, salt=1)
    assert all(x.token_ids != y.token_ids for x, y in zip(other, prompts))  # another salt: other tokens
    blocks = BlockTokens(np.arange(100, 200), 64, seed=3)
    assert (blocks.block(5) == blocks.block(5)).all() and len(blocks.block(-5)) == 64


def test_metrics_on_hand_made_trace(hand_trace):
    reqs = read_trace(hand_trace)
    assert trace_block_reuse(reqs) == A(4 / 10)  # blocks 0, 1, 2 in request 3, block 0 in request 4
    # pages of 512 = the blocks: request 3 reuses 0, 1 (block 2 was partial in request 1: never cached full)
    # and may not reuse all three (one token must run), request 4 reuses block 0
    assert possible_prefix_hits(reqs, 512, 512) == PrefixCounters(1100 + 600 + 1536 + 700, 2 * 512 + 512)
    # pages of 256: request 1 caches pages ending at 256..1024, request 3 reuses them (4 pages) plus nothing
    # of block 2's second half (its first page [1024, 1280) was not full in request 1); request 4: 2 pages
    assert possible_prefix_hits(reqs, 512, 256) == PrefixCounters(3936, 4 * 256 + 2 * 256)
    assert prefix_hit_rate(PrefixCounters(200, 50)) == A(0.25) and prefix_hit_rate(PrefixCounters(0, 0)) is None
    # E2E-normalized interactivity: E2EL / OSL = 1.0 / 10, 0.5 / 2, 2.0 / 40 -> P90 of (0.1, 0.25, 0.05) = 0.22
    recs = [RequestRecord(0.0, (0.2, 0.6, 1.0), (1, 5, 4), 10, 10), RequestRecord(1.0, (1.3, 1.5), (1, 1), 5, 2),
            RequestRecord(2.0, (2.5, 4.0), (1, 39), 7, 40), RequestRecord(3.0, (), (), 5, 0, error="x")]
    assert e2e_interactivity_p90([r for r in recs if r.ok]) == A(1 / 0.22)
    m = compute_metrics(recs, 5.0, prefix=PrefixCounters(22, 11))
    assert m.interactivity_e2e_p90 == A(1 / 0.22) and m.prefix_cache_hit_rate == A(0.5)
    assert m.to_flat_dict()["interactivity_e2e_p90"] == A(1 / 0.22)


def test_parse_prefix_counters_and_page_size():
    text = """vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1200.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 300.0
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True"} 1.0
"""
    c = parse_engine_counters(text)
    assert c.prefix == PrefixCounters(1200, 300) and c.page_tokens == 16 and c.spec is None
    assert parse_engine_counters(text.replace("vllm:", "m3bench:")).prefix == PrefixCounters(1200, 300)
    assert parse_engine_counters("m3bench:num_requests_running 0\n").prefix is None
    both = text + 'vllm:gpu_prefix_cache_queries_total{engine="0"} 1200.0\nvllm:gpu_prefix_cache_hits_total{engine="0"} 300.0\n'
    assert parse_engine_counters(both).prefix == PrefixCounters(1200, 300)  # not counted twice
    old_only = 'vllm:gpu_prefix_cache_queries_total{engine="0"} 50.0\nvllm:gpu_prefix_cache_hits_total{engine="0"} 5.0\n'
    assert parse_engine_counters(old_only + 'vllm:prefix_cache_queries_created{engine="0"} 1.7e9\n').prefix == \
        PrefixCounters(50, 5)


def test_plan_skips_and_counts_too_long(bpe_tokenizer, hand_trace):
    spec = TraceSpec(hand_trace, scale=1 / 8, schedule=TraceSchedule.TIMESTAMPS, time_scale=0.5)
    plan = plan_trace_point(spec, bpe_tokenizer, max_model_len=100, num_warmup=3, seed=0)
    assert [r.line for r in plan.sent] == [2, 4] and plan.num_skipped == 2  # 139 + 1, 192 + 2 do not fit 100
    assert [p.prompt_len for p in plan.prompts] == [75, 88]  # never truncated
    assert [p.prompt_len for p in plan.warmup] == [75, 88, 75]
    assert plan.warmup[0].token_ids != plan.prompts[0].token_ids  # the warm-up's own blocks: no cache hit
    assert plan.arrivals_s == (0.0, A((1500 - 250) / 1000 * 0.5))
    fig = plan.figures(engine_page_tokens=None)
    assert fig["num_skipped_too_long"] == 2 and fig["prefix_page_tokens"] == 64
    with pytest.raises(InputError, match="fits"):
        plan_trace_point(spec, bpe_tokenizer, max_model_len=10, num_warmup=0, seed=0)


class _SlowTarget:
    """Answers after 40 ms with one token; remembers when each request came and how many ran at once."""

    def __init__(self):
        self.starts, self.running, self.peak = [], 0, 0

    async def stream(self, prompt):
        self.starts.append(time.perf_counter())
        self.running += 1
        self.peak = max(self.peak, self.running)
        await asyncio.sleep(0.04)
        self.running -= 1
        yield Chunk(num_tokens=1, text="x")

    async def close(self):
        return None


def test_schedule_timestamps_and_cap():
    prompts = [WorkloadPrompt((1,), "", 1)] * 5
    due = [0.0, 0.05, 0.10, 0.30, 0.32]
    target = _SlowTarget()
    t0 = time.perf_counter()
    result = asyncio.run(run_load(target, prompts, concurrency=64, arrivals_s=due))
    late = [s - t0 - d for s, d in zip(target.starts, due)]
    assert min(late) > -0.002 and max(late) < 0.03, late  # honoured within 30 ms (a shared 2-core machine)
    assert result.duration_s >= 0.32 + 0.04
    capped = _SlowTarget()
    asyncio.run(run_load(capped, [WorkloadPrompt((1,), "", 1)] * 12, concurrency=3))
    assert capped.peak == 3 and len(capped.starts) == 12
    late_cap = _SlowTarget()  # a due request waits for a free slot: the cap holds under timestamps too
    asyncio.run(run_load(late_cap, prompts, concurrency=1, arrivals_s=[0.0] * 5))
    assert late_cap.peak == 1 and late_cap.starts[-1] - late_cap.starts[0] >= 4 * 0.04 - 0.005


BAD_LINES = [
    ("missing", [HAND_MADE[0], '{"timestamp": 1, "input_length": 5, "hash_ids": [0]}'], 2, "missing key"),
    ("negative", [HAND_MADE[0], HAND_MADE[1], _line(300, -4, 3, [])], 3, "input_length"),
    ("negative out", [_line(0, 10, -1, [0])], 1, "output_length"),
    ("unsorted", [HAND_MADE[1], _line(100, 10, 1, [0])], 2, "before the previous"),
    ("short ids", [HAND_MADE[0], _line(300, 1100, 1, [0, 1])], 2, "too short"),
    ("long ids", [_line(0, 512, 1, [0, 1])], 1, "too long"),
    ("bad json", [HAND_MADE[0], HAND_MADE[1], "{not json"], 3, "not JSON"),
]


@pytest.mark.parametrize("name,lines,bad_line,what", BAD_LINES, ids=[b[0] for b in BAD_LINES])
def test_bad_trace_files_exit_2_with_line(tmp_path, name, lines, bad_line, what):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    res = CliRunner().invoke(app, ["sweep", "--model", str(tmp_path), "--dataset", f"trace:{path}",
                                   "--out", str(tmp_path / "o")])
    assert res.exit_code == 2, res.output
    assert f"bad.jsonl:{bad_line}:" in res.output and what in res.output and "Traceback" not in res.output
