"""MSA block selection and the torch attention backend (selection, dense equivalence, staircase)."""

from __future__ import annotations

import pytest
import torch

from m3bench.runtime.attention import msa
from m3bench.runtime.attention.metadata import build_attn_metadata
from m3bench.runtime.attention.torch_backend import TorchBackend
from m3bench.runtime.config import MsaConfig
from m3bench.runtime.kv_cache import KVCache, KVDtype
from tiny_m3 import tiny_m3_cfg

F64 = torch.float64


def brute_force_selection(iq, ik, positions, m: MsaConfig) -> list[list[set[int]]]:
    out = []
    for i, p in enumerate(positions.tolist()):
        cur = p // m.block_size
        row = []
        for h in range(iq.shape[1]):
            keys = {b: range(b * m.block_size, min(p + 1, (b + 1) * m.block_size)) for b in range(cur + 1)}
            score = {b: max(float(iq[i, h] @ ik[j]) for j in js) for b, js in keys.items()}
            forced = [b for b in range(cur + 1) if b < m.init_blocks or cur - m.local_blocks < b <= cur]
            rest = sorted((b for b in score if b not in forced), key=lambda b: -score[b])
            row.append(set((forced + rest)[:m.topk_blocks]))
        out.append(row)
    return out


@pytest.mark.parametrize("init_blocks,local_blocks,topk", [(0, 1, 3), (1, 1, 3), (1, 2, 4), (0, 1, 16)])
def test_selection_equals_brute_force(init_blocks, local_blocks, topk):
    m = MsaConfig(index_heads=2, index_dim=16, block_size=16, topk_blocks=topk, init_blocks=init_blocks,
                  local_blocks=local_blocks)
    g = torch.Generator().manual_seed(topk + init_blocks)
    iq, ik = torch.randn(40, 2, 16, generator=g, dtype=F64), torch.randn(100, 16, generator=g, dtype=F64)
    positions = torch.cat([torch.arange(0, 20), torch.arange(80, 100)])  # early and late queries
    sel = msa.select_blocks(msa.block_scores(iq, ik, positions, 16), positions, m)
    assert sel.shape == (40, 2, topk)
    want = brute_force_selection(iq, ik, positions, m)
    for i in range(40):
        for h in range(2):
            ids = sel[i, h].tolist()
            valid = [b for b in ids if b >= 0]
            assert set(valid) == want[i][h] and len(valid) == len(set(valid))
            assert ids == valid + [-1] * (topk - len(valid))  # left-packed, -1 padded


def _filled_cache(cfg, length: int, page: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    kv = KVCache(cfg, num_pages=-(-length // page) + 2, tokens_per_block=page, kv_dtype=KVDtype.AUTO, dtype=F64)
    table = list(range(kv.num_pages - 1, 0, -1))[: -(-length // page)]  # non-consecutive, reversed pages
    meta = build_attn_metadata([length], [length], [table], page)
    k = torch.randn(length, 2, 16, generator=g, dtype=F64)
    v = torch.randn(length, 2, 16, generator=g, dtype=F64)
    ik = torch.randn(length, 16, generator=g, dtype=F64)
    kv.write(1, k, v, ik, meta.slot_mapping)
    return kv, table, g


def test_msa_equals_dense_when_every_block_fits():
    cfg = tiny_m3_cfg(sparse=dict(sparse_topk_blocks=5))  # 70 tokens = 5 blocks of 16
    kv, table, g = _filled_cache(cfg, 70, page=8, seed=0)
    meta = build_attn_metadata([70], [70], [table], 8)
    q = torch.randn(70, 8, 16, generator=g, dtype=F64)
    iq = torch.randn(70, 2, 16, generator=g, dtype=F64)
    be = TorchBackend()
    assert torch.allclose(be.msa(1, q, iq, meta, kv, 0.25, cfg.msa), be.dense(1, q, meta, kv, 0.25), atol=1e-12)
    sparse_cfg = tiny_m3_cfg().msa  # top-2: now it must differ
    assert not torch.allclose(be.msa(1, q, iq, meta, kv, 0.25, sparse_cfg), be.dense(1, q, meta, kv, 0.25))


@pytest.mark.parametrize("kind", ["dense", "msa"])
def test_multi_token_chunk_is_a_staircase(kind):
    """A chunk of 10 queries after a 60-token prefix == the 10 tokens one by one."""
    cfg = tiny_m3_cfg()
    kv, table, g = _filled_cache(cfg, 70, page=8, seed=1)
    q = torch.randn(10, 8, 16, generator=g, dtype=F64)
    iq = torch.randn(10, 2, 16, generator=g, dtype=F64)
    be = TorchBackend()

    def run(qs, iqs, meta):
        return be.dense(1, qs, meta, kv, 0.25) if kind == "dense" else be.msa(1, qs, iqs, meta, kv, 0.25, cfg.msa)

    chunk = run(q, iq, build_attn_metadata([10], [70], [table], 8))
    for t in range(10):
        one = run(q[t:t + 1], iq[t:t + 1], build_attn_metadata([1], [61 + t], [table], 8))
        assert torch.allclose(chunk[t], one[0], atol=1e-12)


def test_batch_of_sequences_equals_each_alone():
    cfg = tiny_m3_cfg()
    g = torch.Generator().manual_seed(2)
    kv = KVCache(cfg, num_pages=12, tokens_per_block=16, kv_dtype=KVDtype.AUTO, dtype=F64)
    tables, lens = [[0, 1, 2, 3, 4], [7, 9]], [70, 20]
    for table, n in zip(tables, lens):
        meta = build_attn_metadata([n], [n], [table], 16)
        kv.write(1, torch.randn(n, 2, 16, generator=g, dtype=F64), torch.randn(n, 2, 16, generator=g, dtype=F64),
                 torch.randn(n, 16, generator=g, dtype=F64), meta.slot_mapping)
    q, iq = torch.randn(4, 8, 16, generator=g, dtype=F64), torch.randn(4, 2, 16, generator=g, dtype=F64)
    both = TorchBackend().msa(1, q, iq, build_attn_metadata([3, 1], lens, tables, 16), kv, 0.25, cfg.msa)
    first = TorchBackend().msa(1, q[:3], iq[:3], build_attn_metadata([3], [70], [tables[0]], 16), kv, 0.25, cfg.msa)
    second = TorchBackend().msa(1, q[3:], iq[3:], build_attn_metadata([1], [20], [tables[1]], 16), kv, 0.25, cfg.msa)
    assert torch.allclose(both, torch.cat([first, second]), atol=1e-12)
