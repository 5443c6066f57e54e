"""Rank 0's front of an attention-DP run: the step loop's interface (add, step, abort, has_work) over N engines.

    front = DPFront(driver, engine, exchange, speculative)    # engine: rank 0's own
    front.add(seq); deltas = front.step()                       # every rank steps; deltas of all, by request id

A request goes to the rank with the fewest unfinished requests (ties: the lowest rank), so a batch of
prompts is dealt round-robin. Rank 0 keeps a copy of each other rank's Sequence: the deltas extend it
(tokens, logprobs, times), and a `Finished` message completes it (text, finish reason, scores), so
`LLM.generate`, `score`, `stream` and the server read it as they read a local one. Each step: rank 0
sends the step's news (distributed/dp_messages.TickPlan), every rank runs one engine step (`rank_tick`) and
serves the others' MoE exchanges until all are done, then the ranks' reports are gathered.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from m3bench.runtime.distributed.dp_messages import (
    Finished,
    NewRequest,
    RankReport,
    RankStats,
    TickPlan,
    gather_reports,
    send_plan,
)
from m3bench.runtime.sequence import FinishReason, Sequence, SeqStatus


@torch.inference_mode()
def rank_tick(engine: Any, exchange: Any, groups: Any, plan: TickPlan, seqs: dict[int, Sequence]) -> None:
    """A rank > 0's step: take rank 0's news, step the engine (or not), serve the exchanges, report."""
    rank = groups.tp.rank
    for req in plan.new.get(rank, ()):
        seqs[req.request_id] = seq = req.sequence()
        engine.add(seq)
    for rid in plan.aborts.get(rank, ()):
        engine.abort(rid)
        seqs.pop(rid, None)
    deltas = engine.step()  # (idle: no forward; a request dropped at admission is reported)
    exchange.finish_tick()
    done = [Finished.of(seqs.pop(d.request_id), _record(engine, d.request_id)) for d in deltas
            if d.finished and d.request_id in seqs]
    gather_reports(groups.control, groups.tp.world, RankReport(deltas, done, engine.has_work(),
                                                               RankStats.of(engine)))


def _record(engine: Any, rid: int) -> Any:
    return None if engine.spec is None else engine.spec.records.get(rid)


@dataclass
class Remote:
    """Rank 0's copy of a request another rank runs."""

    seq: Sequence
    rank: int


class DPFront:
    def __init__(self, driver: Any, engine: Any, exchange: Any, speculative: bool) -> None:
        self.driver, self.local, self.exchange = driver, engine, exchange
        self.world = driver.tp.world
        self.remote: dict[int, Remote] = {}  # unfinished requests of ranks > 0
        self.plan = TickPlan()
        self.busy = [False] * self.world  # ranks > 0 had work left after the last step
        self.rank_stats: list[RankStats | None] = [None] * self.world
        self.records: dict[int, Any] = {}  # AcceptanceRecords of finished remote requests
        self.spec = SpecRecords(self) if speculative else None
        self.scheduler = FrontScheduler(self)

    # ---- the step loop's interface ---------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        rank = self.least_loaded()
        if rank == 0:
            self.local.add(seq)
            return
        self.remote[seq.request_id] = Remote(seq, rank)
        self.plan.new.setdefault(rank, []).append(NewRequest.of(seq))

    def least_loaded(self) -> int:
        load = [len(self.local.scheduler.running) + len(self.local.scheduler.waiting)] + [0] * (self.world - 1)
        for r in self.remote.values():
            load[r.rank] += 1
        return load.index(min(load))

    def abort(self, request_id: int) -> bool:
        r = self.remote.pop(request_id, None)
        if r is None:
            return self.local.abort(request_id)
        r.seq.status, r.seq.finish_reason = SeqStatus.FINISHED, FinishReason.ABORT
        if not any(n.request_id == request_id for n in self.plan.new.get(r.rank, ())):
            self.plan.aborts.setdefault(r.rank, []).append(request_id)
        else:  # not sent yet: never send it
            self.plan.new[r.rank] = [n for n in self.plan.new[r.rank] if n.request_id != request_id]
        return True

    def has_work(self) -> bool:
        return self.local.has_work() or bool(self.remote) or any(self.busy) or bool(self.plan.aborts)

    def step(self) -> list[Any]:
        """One step on every rank; the deltas of every rank's requests, by request id."""
        plan, self.plan = self.plan, TickPlan()
        self.driver.in_step = True
        with self.driver.guard(), torch.inference_mode():
            send_plan(self.driver.groups.control, plan)
            deltas = self.local.step()
            self.exchange.finish_tick()
            reports = gather_reports(self.driver.groups.control, self.world, None)
        self.driver.in_step = False
        for rank, report in enumerate(reports[1:], start=1):
            deltas += self._land(rank, report)
        return sorted(deltas, key=lambda d: d.request_id)

    def _land(self, rank: int, report: RankReport) -> list[Any]:
        self.busy[rank], self.rank_stats[rank] = report.busy, report.stats
        live = [d for d in report.deltas if d.request_id in self.remote]  # (an aborted request's are dropped)
        for d in live:
            extend(self.remote[d.request_id].seq, d)
        for f in report.finished:
            r = self.remote.pop(f.request_id, None)
            if r is not None:
                complete(r.seq, f)
                if f.record is not None:
                    self.records[f.request_id] = f.record
        return live

    def merged_stats(self) -> dict[str, int]:
        """LLM.stats' fields summed over the ranks (the other ranks' as of the last step)."""
        stats = [RankStats.of(self.local)] + [s for s in self.rank_stats[1:] if s is not None]
        return {k: sum(getattr(s, k) for s in stats) for k in RankStats.__dataclass_fields__}


def extend(seq: Sequence, d: Any) -> None:
    """Rank 0's copy of a remote request gains what one delta carries."""
    seq.output_ids += d.token_ids
    seq.timings.token_s += d.token_times_s
    seq.text += d.text
    if seq.params.logprobs is not None:
        seq.logprobs += d.logprobs
        seq.top_logprobs += [list(t) for t in d.top_logprobs]


def complete(seq: Sequence, f: Finished) -> None:
    """... and is finished with what the deltas do not carry."""
    seq.text, seq.num_cached = f.text, f.num_cached
    seq.score_logprobs, seq.score_greedy, seq.score_top = f.score_logprobs, f.score_greedy, f.score_top
    seq.timings.scheduled_s = f.scheduled_s
    seq.status, seq.finish_reason = SeqStatus.FINISHED, FinishReason(f.finish_reason)


class SpecRecords:
    """`engine.spec.records` of the front: rank 0's own and the finished remote requests' AcceptanceRecords."""

    def __init__(self, front: DPFront) -> None:
        self.front = front

    @property
    def records(self) -> dict[int, Any]:
        return {**self.front.local.spec.records, **self.front.records}


class FrontScheduler:
    """`engine.scheduler` of the front, for readers of the page size and of a request's Sequence."""

    def __init__(self, front: DPFront) -> None:
        self.front = front

    @property
    def bm(self) -> Any:
        return self.front.local.scheduler.bm  # every rank's pool has rank 0's page size and layout

    def find(self, request_id: int) -> Sequence | None:
        r = self.front.remote.get(request_id)
        return r.seq if r is not None else self.front.local.scheduler.find(request_id)
