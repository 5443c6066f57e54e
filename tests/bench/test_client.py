"""The load generator: concurrency cap, arrival process, records of failures, SSE parsing, own overhead."""

import asyncio

import numpy as np
import pytest

from m3bench.bench.client import (Chunk, NullTarget, arrival_gaps_s, measure_client_overhead, parse_sse_line,
                                  run_benchmark, run_load)
from m3bench.bench.metrics import compute_metrics
from m3bench.bench.workload import WorkloadPrompt
from m3bench.runtime.errors import InputError


class CountingTarget:
    """Streams `output_len` chunks of 2 tokens, 1 ms apart, and tracks how many requests are in flight."""

    def __init__(self, fail_every: int = 0):
        self.in_flight = self.peak = self.sent = 0
        self.fail_every = fail_every

    async def stream(self, prompt):
        self.in_flight += 1
        self.sent += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            if self.fail_every and self.sent % self.fail_every == 0:
                raise ConnectionError("boom")
            for _ in range(prompt.output_len // 2):
                await asyncio.sleep(0.001)
                yield Chunk(num_tokens=2, text="ab")
            yield Chunk(prompt_tokens=prompt.prompt_len, output_tokens=prompt.output_len)
        finally:
            self.in_flight -= 1

    async def close(self):
        return None


def _prompts(n, out=6):
    return [WorkloadPrompt((1, 2, 3), "abc", out) for _ in range(n)]


def test_concurrency_cap_and_records():
    target = CountingTarget()
    result = asyncio.run(run_load(target, _prompts(12), concurrency=3))
    assert target.peak == 3 and len(result.records) == 12
    r = result.records[0]
    assert r.ok and r.output_tokens == 6 and r.chunk_tokens == (2, 2, 2) and r.prompt_tokens == 3
    assert r.send_time_s < r.chunk_times_s[0] <= r.chunk_times_s[-1]
    m = compute_metrics(result.records, result.duration_s)
    assert m.num_completed == 12 and m.itl_ms.mean >= 1.0 and m.tpot_ms.mean < m.itl_ms.mean  # 2 tokens a chunk


def test_failures_are_recorded_not_raised():
    result = asyncio.run(run_load(CountingTarget(fail_every=4), _prompts(8), concurrency=2))
    failed = [r for r in result.records if r.error]
    assert len(failed) == 2 and all("boom" in r.error for r in failed)
    assert compute_metrics(result.records, result.duration_s).num_failed == 2


def test_warmup_is_not_counted():
    target = CountingTarget()
    result = asyncio.run(run_benchmark(target, _prompts(4), _prompts(10), concurrency=2))
    assert target.sent == 14 and len(result.records) == 10


def test_arrival_gaps_gamma_mean_and_burstiness():
    assert arrival_gaps_s(3, float("inf"), 1.0, 0) == [0.0, 0.0, 0.0]
    poisson = np.array(arrival_gaps_s(20000, 10.0, 1.0, seed=1))
    bursty = np.array(arrival_gaps_s(20000, 10.0, 0.25, seed=1))
    assert abs(poisson.mean() - 0.1) < 0.005 and abs(bursty.mean() - 0.1) < 0.01
    assert abs(poisson.std() / poisson.mean() - 1.0) < 0.05  # exponential: CV 1
    assert abs(bursty.std() / bursty.mean() - 2.0) < 0.15  # gamma shape 1/4: CV 2
    with pytest.raises(InputError):
        arrival_gaps_s(3, 0.0, 1.0, 0)


def test_request_rate_paces_sends():
    result = asyncio.run(run_load(NullTarget(), _prompts(10, out=2), concurrency=10, request_rate=200.0, seed=0))
    sends = sorted(r.send_time_s for r in result.records)
    assert sends[-1] - sends[0] > 0.01  # not all at once


def test_client_overhead_is_measured():
    result = asyncio.run(measure_client_overhead(concurrency=4, output_len=16))
    m = compute_metrics(result.records, result.duration_s)
    assert m.num_completed == 16 and 0 < m.itl_ms.mean < 50  # the client's own floor per chunk
    assert result.client_us_per_chunk is not None and result.client_us_per_chunk >= 0


def test_parse_sse_line():
    line = b'data: {"choices": [{"text": "hi", "token_ids": [5, 6]}], "usage": null}\n'
    assert parse_sse_line(line) == Chunk(2, "hi", None, None)
    usage = b'data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 7}}'
    assert parse_sse_line(usage) == Chunk(0, "", 3, 7)
    assert parse_sse_line(b"data: [DONE]") is None and parse_sse_line(b"\n") is None and parse_sse_line(b": ping") is None
    with pytest.raises(RuntimeError, match="server error"):
        parse_sse_line(b'data: {"error": {"message": "bad"}}')
