"""The draft layer's KV pages: write/gather through page ids, and the storage format per KV dtype."""

from __future__ import annotations

import pytest
import torch

from m3bench.runtime.kv_cache import KVDtype
from m3bench.runtime.speculative.attention import DraftKV


def test_write_then_gather_through_scattered_pages():
    kv = DraftKV(num_pages=6, page_size=4, num_kv_heads=2, head_dim=8, kv_dtype=KVDtype.AUTO, dtype=torch.float64)
    k, v = torch.randn(10, 2, 8, dtype=torch.float64), torch.randn(10, 2, 8, dtype=torch.float64)
    table = torch.tensor([5, 0, 3], dtype=torch.int32)
    slots = torch.tensor([int(table[p // 4]) * 4 + p % 4 for p in range(10)])
    kv.write(0, k, v, None, slots)
    gk, gv, none = kv.gather(0, table, 10)
    assert none is None and torch.equal(gk, k.transpose(0, 1)) and torch.equal(gv, v.transpose(0, 1))
    with pytest.raises(IndexError):
        kv.gather(1, table, 10)


def test_hybrid_stores_the_draft_layer_as_fp8():
    kv = DraftKV(2, 4, 1, 16, KVDtype.HYBRID, torch.bfloat16)
    assert kv.k.data.dtype == torch.float8_e4m3fn
    k = torch.randn(4, 1, 16).to(torch.bfloat16)
    kv.write(0, k, k, None, torch.arange(4))
    gk, _, _ = kv.gather(0, torch.tensor([0], dtype=torch.int32), 4)
    assert torch.equal(gk, k.transpose(0, 1).to(torch.float8_e4m3fn).to(torch.bfloat16))
    assert DraftKV(2, 4, 1, 16, KVDtype.BF16, torch.float32).k.data.dtype == torch.bfloat16
