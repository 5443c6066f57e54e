"""Scheduler: token budget, chunked prefill, batch size, FCFS, preemption of the youngest."""

import random

from m3bench.runtime.block_manager import BlockManager
from m3bench.runtime.scheduler import Scheduler
from m3bench.runtime.sequence import FinishReason, SamplingParams, Sequence, SeqStatus

P = 4


def _make(n_blocks=32, batch=4, budget=16, rows=None, pages=16, caching=False):
    bm = BlockManager(n_blocks, P, max_rows=rows or batch, max_pages=pages, enable_prefix_caching=caching)
    return Scheduler(bm, max_batch_size=batch, max_num_tokens=budget)


def _seq(rid, n_prompt, max_tokens=3):
    return Sequence(request_id=rid, prompt_ids=[rid % 7 + 1] * n_prompt, params=SamplingParams(max_tokens=max_tokens))


def _step(sched):
    """Stand-in for the model: mark scheduled tokens computed, emit token 0 when a chunk ends a sequence."""
    batch = sched.schedule()
    if batch is None:
        return None
    for seq, n in zip(batch.seqs, batch.num_tokens):
        seq.num_computed += n
        sched.bm.commit(seq)
        if seq.num_computed == seq.num_tokens:
            seq.output_ids.append(0)
            if len(seq.output_ids) >= seq.params.max_tokens:
                sched.finish(seq, FinishReason.LENGTH)
    return batch


def _check_invariants(sched):
    bm = sched.bm
    held = sum(len(s.block_ids) for s in sched.running)
    assert held + bm.num_available == bm.num_blocks
    assert all(not s.block_ids for s in sched.waiting)
    assert len(sched.running) <= sched.max_batch_size


def test_chunked_prefill_respects_budget_and_decodes_batch():
    sched = _make(budget=8)
    a, b = _seq(0, 13), _seq(1, 3)
    sched.add(a), sched.add(b)
    b1 = _step(sched)
    assert [s.request_id for s in b1.seqs] == [0] and b1.num_tokens == [8]
    b2 = _step(sched)  # a finishes its prompt (5), b gets the remaining 3
    assert dict(zip([s.request_id for s in b2.seqs], b2.num_tokens)) == {0: 5, 1: 3}
    b3 = _step(sched)
    assert b3.num_tokens == [1, 1]  # both decode


def test_max_batch_size_and_fcfs():
    sched = _make(batch=2, budget=64)
    seqs = [_seq(i, 2, max_tokens=2) for i in range(5)]
    for s in seqs:
        sched.add(s)
    order = []
    while (batch := _step(sched)) is not None:
        assert len(batch.seqs) <= 2
        order.extend(s.request_id for s in batch.seqs if s.finished)
        _check_invariants(sched)
    assert order == [0, 1, 2, 3, 4]


def test_preemption_recomputes_youngest_and_everyone_finishes():
    sched = _make(n_blocks=6, batch=4, budget=32)  # 24 slots for 4 x (5 + 6) tokens
    seqs = [_seq(i, 5, max_tokens=6) for i in range(4)]
    for s in seqs:
        sched.add(s)
    steps = 0
    while _step(sched) is not None:
        _check_invariants(sched)
        steps += 1
        assert steps < 500
    assert sched.num_preemptions > 0
    assert all(s.finished and len(s.output_ids) == 6 for s in seqs)
    assert sched.bm.num_available == 6


def test_request_larger_than_pool_finishes_with_length():
    sched = _make(n_blocks=2, batch=2, budget=32)
    big = _seq(0, 7, max_tokens=10)  # 7 + 10 tokens > 8 slots
    sched.add(big)
    while _step(sched) is not None:
        pass
    assert big.finish_reason is FinishReason.LENGTH and big.status is SeqStatus.FINISHED
    assert sched.bm.num_available == 2


def test_added_while_running_and_random_churn():
    rng = random.Random(1)
    sched = _make(n_blocks=12, batch=3, budget=10, caching=True)
    made = []
    for t in range(400):
        if rng.random() < 0.2 and len(made) < 30:
            made.append(_seq(len(made), rng.randrange(1, 12), max_tokens=rng.randrange(1, 6)))
            sched.add(made[-1])
        _step(sched)
        _check_invariants(sched)
    while _step(sched) is not None:
        _check_invariants(sched)
    assert all(s.finished for s in made) and len(made) > 10


def test_finish_while_waiting_frees_nothing_twice():
    sched = _make()
    s = _seq(0, 3)
    sched.add(s)
    sched.finish(s, FinishReason.ABORT)
    assert not sched.has_work() and sched.bm.num_available == 32
