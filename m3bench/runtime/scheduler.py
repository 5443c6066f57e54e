"""Continuous batching: which requests compute how many tokens this step.

One rule covers prefill and decode: every request has `num_to_compute` tokens without K/V (the
whole prompt at first, then the one token just sampled). Each step, oldest first, running requests
take up to their need from a token budget (`max_num_tokens`; a long prompt is split into chunks
across steps), then waiting requests are admitted FCFS while budget, batch slots and pages last.
When pages run out the youngest running request is preempted: its pages are freed and it goes back
to the front of the queue, to be recomputed (prompt plus what it has generated) later.

    sched = Scheduler(block_manager, max_batch_size=64, max_num_tokens=2048)
    sched.add(seq); batch = sched.schedule()   # ScheduledBatch | None
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from m3bench.runtime.block_manager import BlockManager
from m3bench.runtime.sequence import FinishReason, Sequence, SeqStatus


@dataclass(frozen=True)
class ScheduledBatch:
    seqs: list[Sequence]  # ordered by block-table row
    num_tokens: list[int]  # tokens each computes this step, starting at its num_computed


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_batch_size: int, max_num_tokens: int) -> None:
        self.bm = block_manager
        self.max_batch_size = max_batch_size
        self.max_num_tokens = max_num_tokens
        self.lookahead_tokens = 0  # speculation: KV positions reserved past a generating request's tokens
        self.draft_tokens = 0  # speculation: extra tokens a decoding request runs per step (its drafts)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admission order: the youngest is last
        self.num_preemptions = 0
        self.dropped: list[Sequence] = []  # finished here (no room even alone); the engine reports them

    def drain_dropped(self) -> list[Sequence]:
        out, self.dropped = self.dropped, []
        return out

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        """Sequences to run, or dropped ones whose finish the next step still has to report."""
        return bool(self.waiting or self.running or self.dropped)

    def schedule(self) -> ScheduledBatch | None:
        """Plan one step (None when nothing can run)."""
        plan: dict[int, tuple[Sequence, int]] = {}
        preemptions = self.num_preemptions
        budget = self._schedule_running(plan, self.max_num_tokens)
        if self.num_preemptions == preemptions:  # pages were short: no newcomers this step
            self._admit_waiting(plan, budget)
        if not plan:
            return None
        items = sorted(plan.values(), key=lambda sn: sn[0].row)
        return ScheduledBatch([s for s, _ in items], [n for _, n in items])

    def _schedule_running(self, plan: dict, budget: int) -> int:
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_to_compute, budget)
            if self._make_room(seq, seq.num_computed + n + self._lookahead(seq)):
                plan[seq.request_id] = (seq, n)
                budget -= n + (self.draft_tokens if seq.num_to_compute == 1 else 0)
                i += 1
            # else: seq itself was preempted or finished; running[i] is now the next one
        return budget

    def _make_room(self, seq: Sequence, num_tokens: int) -> bool:
        """Allocate pages for `seq`, preempting the youngest others; False if `seq` itself had to go."""
        if len(seq.block_ids) + self.bm.pages_needed(seq, num_tokens) > self.bm.max_pages:
            self.drop(seq)  # longer than a block-table row (the engine stops it earlier)
            return False
        while not self.bm.allocate(seq, num_tokens):
            victim = self.running[-1]
            if victim is seq and len(self.running) == 1:
                self.drop(seq)  # the whole pool cannot hold this one request
                return False
            self.preempt(victim)
            if victim is seq:
                return False
        return True

    def _admit_waiting(self, plan: dict, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.max_batch_size:
            seq = self.waiting[0]
            self.bm.admit(seq, reusable_tokens=_reusable(seq))
            n = min(seq.num_to_compute, budget)
            if not self.bm.allocate(seq, seq.num_computed + n + self._lookahead(seq)):
                self.bm.unadmit(seq)
                if self.running:
                    return
                self.drop(seq)  # alone and still no room: it can never run
                continue
            self.waiting.popleft()
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            plan[seq.request_id] = (seq, n)
            budget -= n

    def _lookahead(self, seq: Sequence) -> int:
        return 0 if seq.is_score else self.lookahead_tokens

    def drop(self, seq: Sequence) -> None:
        self.finish(seq, FinishReason.LENGTH)
        self.dropped.append(seq)

    def preempt(self, seq: Sequence) -> None:
        """Free the pages of `seq` and queue it first; it is recomputed on re-admission."""
        self.running.remove(seq)
        self.bm.free(seq)
        seq.score_logprobs, seq.score_greedy, seq.score_top = [], [], []  # scored positions are all recomputed
        seq.status = SeqStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        if seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SeqStatus.WAITING:
            self.waiting.remove(seq)
        self.bm.free(seq)
        seq.status, seq.finish_reason = SeqStatus.FINISHED, reason

    def find(self, request_id: int) -> Sequence | None:
        for seq in (*self.running, *self.waiting):
            if seq.request_id == request_id:
                return seq
        return None


def _reusable(seq: Sequence) -> int:
    """Tokens a prefix-cache hit may cover: at least one token must run to give the next logits
    (for scoring and prompt logprobs, every position from logprob_from - 1 on must run: no reuse below it)."""
    limit = seq.num_tokens - 1
    return min(limit, seq.logprob_from - 1) if seq.logprob_from >= 0 else limit
