"""Every serving figure, made in one pure function from raw records (vLLM `bench serve` definitions).

Per request, client side, streaming:
- TTFT (ms): first chunk carrying generated tokens received - request sent.
- TPOT (ms): (E2EL - TTFT) / (output_tokens - 1), per request; one-token outputs have no TPOT.
- ITL (ms): gaps between consecutive streamed chunks, pooled over requests. With speculative
  decoding one chunk can carry several tokens, so ITL != TPOT.
- E2EL (ms): last chunk received - request sent.
Over the run (wall time `duration_s` of the measured window): request/s, output tok/s,
total (prompt + output) tok/s, total tok/s per GPU (= / tp), goodput (requests meeting every SLO
per second). Interactivity (tok/s/user, InferenceX): median = 1000 / median TPOT_ms,
x90 = 1000 / P90 TPOT_ms; E2E-normalized interactivity at P90 (InferenceX AgentX / AIPerf) =
1 / P90_i(E2EL_i / OSL_i), E2EL in seconds, OSL the request's output tokens (the slow tail of whole
requests, prefill and queueing included). Prefix cache: hit rate = prompt tokens served from the
cache / prompt tokens looked up (the engine's counters over the window); its trace bounds are
`trace_block_reuse` (blocks whose id was seen earlier in the window / all blocks: the trace's
figure) and `possible_prefix_hits` (what an unbounded prefix cache of whole pages could serve,
replayed in trace order: the figure a reached hit rate is held against).
Percentiles are numpy's linear ones, std is the population std (as vLLM).
Failed requests are counted in `num_failed` and never averaged in. An empty sample raises.

Engine side, in-process only (`compute_host_timing`, from the engine's own StepRecords of the window):
- host ms per engine step: (step wall time - its forward time) x 1000, median and P90 over the steps;
  forward = the model's forward passes and logits (target and draft; runtime/step_timing.py).
- device idle share: 1 - (sum of the steps' forward time) / window wall time, in [0, 1]: the share of the
  measured window in which no forward ran (between steps, and during each step's host work).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

from m3bench.bench.records import PrefixCounters, RequestRecord, Slo, SpecCounters
from m3bench.bench.trace import TraceRequest
from m3bench.runtime.errors import InputError
from m3bench.runtime.step_timing import StepRecord


class EmptySampleError(InputError):
    """A statistic was asked of an empty sample (e.g. every request failed)."""


@dataclass(frozen=True)
class Stats:
    mean: float
    median: float
    p90: float
    p99: float
    std: float

    @staticmethod
    def of(values: Sequence[float], what: str) -> "Stats":
        """Summary of a non-empty sample; an empty one raises EmptySampleError naming `what`."""
        if len(values) == 0:
            raise EmptySampleError(f"no samples for {what}")
        a = np.asarray(values, dtype=np.float64)
        p90, p99 = np.percentile(a, [90, 99])
        return Stats(float(a.mean()), float(np.median(a)), float(p90), float(p99), float(a.std()))


@dataclass(frozen=True)
class SpecMetrics:
    """Acceptance over a run: rate = accepted / proposed; AL = 1 + accepted / drafts (bonus token counted)."""

    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    acceptance_rate: float
    acceptance_length: float
    per_position_rate: tuple[float, ...]  # accepted at position k / drafts
    accepted_histogram: tuple[int, ...]  # [k] = verify steps that accepted exactly k draft tokens


@dataclass(frozen=True)
class ServingMetrics:
    num_requests: int
    num_completed: int
    num_failed: int
    duration_s: float
    total_prompt_tokens: int
    total_output_tokens: int
    tp: int
    ttft_ms: Stats
    tpot_ms: Stats
    itl_ms: Stats
    e2el_ms: Stats
    request_per_s: float
    output_tok_per_s: float
    total_tok_per_s: float
    total_tok_per_s_per_gpu: float
    interactivity_median: float  # tok/s/user = 1000 / median TPOT_ms
    interactivity_x90: float  # tok/s/user = 1000 / P90 TPOT_ms
    interactivity_e2e_p90: float  # tok/s/user = 1 / P90 (E2EL_s / output tokens)
    goodput_req_per_s: float | None  # None when no SLO was given
    spec: SpecMetrics | None  # None when speculation did not run
    prefix_cache_hit_rate: float | None = None  # None when the target exports no prefix-cache counters

    def to_flat_dict(self) -> dict:
        """One level of keys (`ttft_ms_p90`, `spec_acceptance_length`, ...), for CSV rows."""
        out: dict = {}
        for key, value in asdict(self).items():
            if isinstance(value, dict):
                out.update({f"{key}_{k}": v for k, v in value.items()})
            else:
                out[key] = value
        return out


def compute_metrics(
    records: Sequence[RequestRecord],
    duration_s: float,
    tp: int = 1,
    slo: Slo | None = None,
    spec: SpecCounters | None = None,
    prefix: PrefixCounters | None = None,
) -> ServingMetrics:
    """All serving figures of one run from its raw records (definitions in the module docstring)."""
    if duration_s <= 0:
        raise EmptySampleError(f"benchmark duration must be > 0 s, got {duration_s}")
    if tp < 1:
        raise InputError(f"tp must be >= 1, got {tp}")
    done = [r for r in records if r.ok]
    if not done:
        raise EmptySampleError(f"no completed request among {len(records)} (every request failed)")
    ttft, e2el, tpot, itl = _latencies_ms(done)
    prompt_toks = sum(r.prompt_tokens for r in done)
    output_toks = sum(r.output_tokens for r in done)
    tpot_stats = Stats.of(tpot, "TPOT (every completed request had a single output token)")
    if tpot_stats.p90 <= 0 or tpot_stats.median <= 0:
        raise EmptySampleError("TPOT is 0: outputs arrived in one chunk (not streamed), interactivity is undefined")
    total_per_s = (prompt_toks + output_toks) / duration_s
    return ServingMetrics(
        num_requests=len(records),
        num_completed=len(done),
        num_failed=len(records) - len(done),
        duration_s=duration_s,
        total_prompt_tokens=prompt_toks,
        total_output_tokens=output_toks,
        tp=tp,
        ttft_ms=Stats.of(ttft, "TTFT"),
        tpot_ms=tpot_stats,
        itl_ms=Stats.of(itl, "ITL (no request streamed more than one chunk)"),
        e2el_ms=Stats.of(e2el, "E2EL"),
        request_per_s=len(done) / duration_s,
        output_tok_per_s=output_toks / duration_s,
        total_tok_per_s=total_per_s,
        total_tok_per_s_per_gpu=total_per_s / tp,
        interactivity_median=1000.0 / tpot_stats.median,
        interactivity_x90=1000.0 / tpot_stats.p90,
        interactivity_e2e_p90=e2e_interactivity_p90(done),
        goodput_req_per_s=None if slo is None else _goodput(done, slo) / duration_s,
        spec=None if spec is None else spec_metrics(spec),
        prefix_cache_hit_rate=prefix_hit_rate(prefix),
    )


def e2e_interactivity_p90(done: Sequence[RequestRecord]) -> float:
    """1 / P90_i(E2EL_i / OSL_i) in tok/s/user (E2EL in seconds), over completed requests."""
    per_token_s = [(r.chunk_times_s[-1] - r.send_time_s) / r.output_tokens for r in done]
    p90 = Stats.of(per_token_s, "E2EL / OSL").p90
    if p90 <= 0:
        raise EmptySampleError("E2EL is 0: E2E-normalized interactivity is undefined")
    return 1.0 / p90


def prefix_hit_rate(c: PrefixCounters | None) -> float | None:
    """Prompt tokens served by the prefix cache / prompt tokens looked up; None without counters or lookups."""
    if c is None or c.queried_tokens <= 0:
        return None
    return c.hit_tokens / c.queried_tokens


def trace_block_reuse(reqs: Sequence[TraceRequest]) -> float:
    """Blocks whose hash id appeared in an earlier request of `reqs` / all blocks of `reqs`."""
    seen: set[int] = set()
    reused = total = 0
    for r in reqs:
        reused += sum(i in seen for i in r.hash_ids)
        total += len(r.hash_ids)
        seen.update(r.hash_ids)
    if total == 0:
        raise EmptySampleError("no trace blocks in the window")
    return reused / total


def possible_prefix_hits(reqs: Sequence[TraceRequest], block_tokens: int, page_tokens: int) -> PrefixCounters:
    """Prompt tokens an unbounded prefix cache of `page_tokens`-token pages could serve, requests in order.

    A page (tokens [p P, (p+1) P)) is cached once a request has held it full: its content is named by
    the blocks it reaches into and where it ends. A request reuses its leading run of cached pages,
    at most (n - 1) // P of them (one prompt token is always computed, for the next token's logits)."""
    cached: set[tuple] = set()
    hits = queried = 0
    for r in reqs:
        keys = [(r.hash_ids[:-(-(p + 1) * page_tokens // block_tokens)], (p + 1) * page_tokens)
                for p in range(r.input_len // page_tokens)]
        run = 0
        while run < min(len(keys), (r.input_len - 1) // page_tokens) and keys[run] in cached:
            run += 1
        hits += run * page_tokens
        queried += r.input_len
        cached.update(keys)
    return PrefixCounters(queried, hits)


def _latencies_ms(done: Sequence[RequestRecord]) -> tuple[list[float], list[float], list[float], list[float]]:
    """Per-request TTFT, E2EL, TPOT (output > 1 token only) and pooled ITL, in ms."""
    ttft, e2el, tpot, itl = [], [], [], []
    for r in done:
        first_ms = (r.chunk_times_s[0] - r.send_time_s) * 1000.0
        last_ms = (r.chunk_times_s[-1] - r.send_time_s) * 1000.0
        ttft.append(first_ms)
        e2el.append(last_ms)
        if (t := _request_tpot_ms(r)) is not None:
            tpot.append(t)
        itl.extend((b - a) * 1000.0 for a, b in zip(r.chunk_times_s, r.chunk_times_s[1:]))
    return ttft, e2el, tpot, itl


def _request_tpot_ms(r: RequestRecord) -> float | None:
    """(E2EL - TTFT) / (output_tokens - 1); None for a one-token output."""
    if r.output_tokens <= 1:
        return None
    return (r.chunk_times_s[-1] - r.chunk_times_s[0]) * 1000.0 / (r.output_tokens - 1)


def _goodput(done: Sequence[RequestRecord], slo: Slo) -> int:
    """Completed requests meeting every SLO that is set (a one-token output has no TPOT to miss)."""
    good = 0
    for r in done:
        ttft_ms = (r.chunk_times_s[0] - r.send_time_s) * 1000.0
        e2el_ms = (r.chunk_times_s[-1] - r.send_time_s) * 1000.0
        tpot_ms = _request_tpot_ms(r)
        ok = (slo.ttft_ms is None or ttft_ms <= slo.ttft_ms) and (slo.e2el_ms is None or e2el_ms <= slo.e2el_ms)
        ok = ok and (slo.tpot_ms is None or tpot_ms is None or tpot_ms <= slo.tpot_ms)
        good += int(ok)
    return good


def spec_metrics(c: SpecCounters) -> SpecMetrics:
    """Acceptance figures from counters; the histogram assumes prefix acceptance (position k needs 0..k-1)."""
    if c.drafts <= 0 or c.draft_tokens <= 0:
        raise EmptySampleError("speculation ran but no draft was proposed: no acceptance figures")
    pos = c.accepted_per_pos
    if pos and sum(pos) != c.accepted_tokens:
        raise InputError(f"accepted per position sums to {sum(pos)}, not accepted_tokens={c.accepted_tokens}")
    return SpecMetrics(
        num_drafts=c.drafts,
        num_draft_tokens=c.draft_tokens,
        num_accepted_tokens=c.accepted_tokens,
        acceptance_rate=c.accepted_tokens / c.draft_tokens,
        acceptance_length=1.0 + c.accepted_tokens / c.drafts,
        per_position_rate=tuple(a / c.drafts for a in pos),
        accepted_histogram=_accepted_histogram(c.drafts, pos),
    )


def _accepted_histogram(drafts: int, pos: tuple[int, ...]) -> tuple[int, ...]:
    """Steps with exactly k accepted = (steps with >= k) - (steps with >= k+1); >= 0 is every draft."""
    if not pos:
        return ()
    at_least = (drafts, *pos, 0)
    return tuple(at_least[k] - at_least[k + 1] for k in range(len(pos) + 1))


@dataclass(frozen=True)
class HostTiming:
    """Host work per engine step and the share of the window the device sat idle (module docstring)."""

    engine_steps: int
    host_ms_per_step_median: float
    host_ms_per_step_p90: float
    device_idle_share: float


def compute_host_timing(steps: Sequence[StepRecord], window_s: float) -> HostTiming:
    """The window's HostTiming; no step raises EmptySampleError. A step's host time is at least 0 (on CUDA an
    overlapped step's device time can outlast its host wall time)."""
    if window_s <= 0:
        raise ValueError(f"window_s must be positive, got {window_s}")
    host = Stats.of([max(s.step_s - s.forward_s, 0.0) * 1e3 for s in steps], "engine steps")
    busy = sum(s.forward_s for s in steps)
    return HostTiming(len(steps), host.median, host.p90, min(max(1.0 - busy / window_s, 0.0), 1.0))
