"""Page pool, persistent block tables and prefix caching."""

import random

import pytest

from m3bench.runtime.block_manager import BlockManager, page_hash
from m3bench.runtime.sequence import SamplingParams, Sequence

P = 4


def _seq(rid, ids):
    return Sequence(request_id=rid, prompt_ids=list(ids), params=SamplingParams())


def _bm(n=16, rows=4, pages=8, caching=True):
    return BlockManager(num_blocks=n, tokens_per_block=P, max_rows=rows, max_pages=pages, enable_prefix_caching=caching)


def _run_prefill(bm, seq):
    """What the engine does: admit, allocate the whole prompt, compute it, commit."""
    bm.admit(seq, reusable_tokens=seq.num_tokens - 1)
    assert bm.allocate(seq, seq.num_tokens)
    seq.num_computed = seq.num_tokens
    bm.commit(seq)


def test_allocate_appends_entries_and_table_matches_host_mirror():
    bm = _bm()
    a, b = _seq(0, range(10)), _seq(1, range(100, 103))
    for s in (a, b):
        _run_prefill(bm, s)
    bm.flush()
    assert len(a.block_ids) == 3 and len(b.block_ids) == 1
    assert bm.table[a.row, :3].tolist() == a.block_ids and bm.table[b.row, :1].tolist() == b.block_ids
    assert bm.allocate(b, 9) and len(b.block_ids) == 3  # appended, first entry untouched
    bm.flush()
    assert bm.table[b.row, :3].tolist() == b.block_ids
    assert len(set(a.block_ids) | set(b.block_ids)) == 6 and bm.num_available == 10


def test_pool_exhaustion_takes_nothing():
    bm = _bm(n=3, caching=False)
    s = _seq(0, range(8))
    bm.admit(s, 0)
    assert bm.allocate(s, 8)
    assert not bm.allocate(s, 13)  # needs 2 more, 1 left
    assert len(s.block_ids) == 2 and bm.num_available == 1


def test_free_returns_pages_and_rows_stay_dense():
    bm = _bm(rows=3)
    seqs = [_seq(i, [i] * 6) for i in range(3)]
    for s in seqs:
        _run_prefill(bm, s)
    bm.free(seqs[0])  # the last row moves into row 0
    bm.flush()
    assert seqs[0].row == -1 and sorted(s.row for s in seqs[1:]) == [0, 1]
    for s in seqs[1:]:
        assert bm.table[s.row, :2].tolist() == s.block_ids
    view = bm.rows_view(sorted(seqs[1:], key=lambda s: s.row), 2)
    assert view.data_ptr() == bm.table.data_ptr()  # rows 0..B-1: a view, no copy


def test_rows_view_gathers_out_of_order_rows():
    bm = _bm()
    seqs = [_seq(i, [i] * 5) for i in range(3)]
    for s in seqs:
        _run_prefill(bm, s)
    bm.flush()
    got = bm.rows_view([seqs[2], seqs[0]], 2)
    assert got.tolist() == [seqs[2].block_ids, seqs[0].block_ids]


def test_prefix_hits_share_full_pages_only():
    bm = _bm()
    a = _seq(0, list(range(10)))
    _run_prefill(bm, a)
    b = _seq(1, list(range(9)) + [99, 98])  # shares 2 full pages + 1 token
    bm.admit(b, reusable_tokens=b.num_tokens - 1)
    assert b.num_computed == 8 and b.block_ids == a.block_ids[:2]
    assert bm.pages[a.block_ids[0]].ref_count == 2
    assert bm.stats.hit_tokens == 8 and bm.stats.queried_tokens == 21


def test_prefix_hit_capped_so_one_token_runs():
    bm = _bm()
    _run_prefill(bm, _seq(0, range(8)))
    b = _seq(1, range(8))
    bm.admit(b, reusable_tokens=7)
    assert b.num_computed == 4  # the second page holds the last token, which must be recomputed


def test_cached_pages_survive_free_and_are_evicted_lru():
    bm = _bm(n=4, pages=4)
    a = _seq(0, range(8))
    _run_prefill(bm, a)
    bm.free(a)
    assert bm.num_available == 4 and len(bm.cached) == 2
    b = _seq(1, range(8))
    bm.admit(b, 7)
    assert b.num_cached == 4
    bm.free(b)
    c = _seq(2, range(50, 66))  # needs all 4 pages: evicts both cached ones
    bm.admit(c, 0)
    assert bm.allocate(c, 16) and not bm.cached
    d = _seq(3, range(8))
    bm.free(c)
    bm.admit(d, 7)
    assert d.num_cached == 0


def test_hash_chains_parent():
    h1 = page_hash(b"", [1, 2, 3, 4])
    assert page_hash(h1, [5, 6, 7, 8]) != page_hash(b"", [5, 6, 7, 8])
    assert page_hash(b"", [1, 2, 3, 4]) == h1


def test_random_workload_keeps_ref_counts_consistent():
    rng = random.Random(0)
    bm = _bm(n=24, rows=6, pages=6)
    live = []
    for step in range(300):
        if live and (rng.random() < 0.4 or len(live) == 6):
            bm.free(live.pop(rng.randrange(len(live))))
        else:
            s = _seq(step, [rng.randrange(3) for _ in range(rng.randrange(1, 20))])
            bm.admit(s, s.num_tokens - 1)
            if bm.allocate(s, s.num_tokens):
                s.num_computed = s.num_tokens
                bm.commit(s)
                live.append(s)
            else:
                bm.unadmit(s)
        bm.flush()
        refs = [0] * 24
        for s in live:
            for pid in s.block_ids:
                refs[pid] += 1
            assert bm.table[s.row, : len(s.block_ids)].tolist() == s.block_ids
        assert refs == [p.ref_count for p in bm.pages]
        assert bm.num_available == sum(r == 0 for r in refs)
        assert len(bm.cached) == sum(p.hash is not None for p in bm.pages)
    assert bm.stats.hit_tokens > 0


def test_rejects_empty_pool():
    with pytest.raises(ValueError):
        _bm(n=0)
