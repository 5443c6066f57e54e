"""What attention-DP ranks tell each other once per engine step, on the gloo control group.

    send_plan(control, plan)            # rank 0: STEP header, then the pickled TickPlan (new requests, aborts)
    plan = receive_plan(control, fields)          # other ranks, after recv_header gave (Op.STEP, fields)
    reports = gather_reports(control, world, report)   # every rank: each rank's RankReport (rank 0 sends None)

Messages are pickled between the processes of one run (same code on both ends); a tick with nothing new
sends a header only.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from typing import Any

import torch

from m3bench.runtime.distributed.protocol import Op, broadcast0, send_header
from m3bench.runtime.sequence import SamplingParams, Sequence


@dataclass(frozen=True)
class NewRequest:
    """A request rank 0 admitted and assigned to another rank (its id is rank 0's)."""

    request_id: int
    prompt_ids: list[int]
    params: SamplingParams
    score_from: int
    arrival_s: float

    @classmethod
    def of(cls, seq: Sequence) -> "NewRequest":
        return cls(seq.request_id, list(seq.prompt_ids), seq.params, seq.score_from, seq.arrival_s)

    def sequence(self) -> Sequence:
        return Sequence(request_id=self.request_id, prompt_ids=list(self.prompt_ids), params=self.params,
                        arrival_s=self.arrival_s, score_from=self.score_from)


@dataclass(frozen=True)
class TickPlan:
    """One step's news for the other ranks: rank -> requests to add, rank -> request ids to abort."""

    new: dict[int, list[NewRequest]] = field(default_factory=dict)
    aborts: dict[int, list[int]] = field(default_factory=dict)


@dataclass(frozen=True)
class Finished:
    """What a finished request's deltas do not carry (rank 0 completes its copy of the Sequence with it)."""

    request_id: int
    text: str  # the final text (cut at a stop string)
    finish_reason: str
    num_cached: int
    score_logprobs: list[float]
    score_greedy: list[bool]
    score_top: list[list[tuple[int, float]]]
    scheduled_s: float | None
    record: Any  # the request's AcceptanceRecord under speculation, or None

    @classmethod
    def of(cls, seq: Sequence, record: Any) -> "Finished":
        return cls(seq.request_id, seq.text, seq.finish_reason.value, seq.num_cached, list(seq.score_logprobs),
                   list(seq.score_greedy), [list(t) for t in seq.score_top], seq.timings.scheduled_s, record)


@dataclass(frozen=True)
class RankStats:
    """One rank's queues and KV pool (summed over the ranks for LLM.stats)."""

    num_running: int
    num_waiting: int
    kv_pages_total: int
    kv_pages_free: int
    prefix_queried_tokens: int
    prefix_hit_tokens: int
    num_preemptions: int

    @classmethod
    def of(cls, engine: Any) -> "RankStats":
        s, bm = engine.scheduler, engine.scheduler.bm
        return cls(len(s.running), len(s.waiting), bm.num_blocks, bm.num_available, bm.stats.queried_tokens,
                   bm.stats.hit_tokens, s.num_preemptions)


@dataclass(frozen=True)
class RankReport:
    """One rank's step: its deltas (batch order), the requests that finished, whether work is left."""

    deltas: list[Any]
    finished: list[Finished]
    busy: bool
    stats: RankStats


def send_plan(control: Any, plan: TickPlan) -> None:
    """Rank 0: announce a step (and its news, when there is any)."""
    data = pickle.dumps(plan) if plan.new or plan.aborts else b""
    send_header(control, Op.STEP, (len(data),))
    if data:
        broadcast0(torch.frombuffer(bytearray(data), dtype=torch.uint8), control)


def receive_plan(control: Any, fields: list[int]) -> TickPlan:
    """Other ranks: the plan of the step a STEP header with these fields announced."""
    if fields[0] == 0:
        return TickPlan()
    buf = torch.empty(fields[0], dtype=torch.uint8)
    broadcast0(buf, control)
    return pickle.loads(buf.numpy().tobytes())


def gather_reports(control: Any, world: int, report: RankReport | None) -> list[RankReport | None]:
    """Every rank's report, in rank order (all-gathered: gloo groups of either kind support it)."""
    import torch.distributed as dist

    data = pickle.dumps(report)
    sizes = [torch.empty(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([len(data)], dtype=torch.int64), group=control)
    n = max(int(s.item()) for s in sizes)
    mine = torch.zeros(n, dtype=torch.uint8)
    mine[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    parts = [torch.empty(n, dtype=torch.uint8) for _ in range(world)]
    dist.all_gather(parts, mine, group=control)
    return [pickle.loads(p[:int(s.item())].numpy().tobytes()) for p, s in zip(parts, sizes)]
