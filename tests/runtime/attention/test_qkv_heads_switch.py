"""Attention.fuse_qkv_heads: at skinny rows the q|k|v(|index) projection ends in its heads' norm + RoPE + cache
write (kernels.skinny_heads, one launch for two). The tiny M3 in bf16 on the Triton backend (interpreter; the
skinny GEMMs allowed on CPU as they run on CUDA by themselves) gives the same hidden states and caches with it on
and off, within the rounding of the projection's other tiles, and takes it only where it applies."""

import pytest
import torch

from m3bench.runtime.attention.metadata import build_attn_metadata
from m3bench.runtime.attention.triton_backend import TritonBackend
from m3bench.runtime.kernels import kv_quant as kq
from m3bench.runtime.kernels import skinny
from m3bench.runtime.kv_cache import KVCache, KVDtype
from m3bench.runtime.layers import attention, linear
from m3bench.runtime.model import M3ForCausalLM

from .tiny_cfg import tiny_config

pytestmark = pytest.mark.usefixtures("triton_interpreter")


@pytest.fixture
def heads_calls(monkeypatch):
    """Skinny GEMMs on CPU tensors (the interpreter); the fused launches counted."""
    calls = []

    def runs(x, weight, rows):
        return bool(rows) and skinny.skinny_supported(x, weight, rows)

    def counted(*args, **kwargs):
        calls.append(args[3][0].branch.hq)
        return attention.skinny_heads.__wrapped__(*args, **kwargs)

    counted.__wrapped__ = attention.skinny_heads
    monkeypatch.setattr(linear, "skinny_runs", runs)
    monkeypatch.setattr(attention, "skinny_runs", runs)
    monkeypatch.setattr(attention, "skinny_heads", counted)
    return calls


def _step(fuse: bool, kv_dtype: KVDtype, query_lens: list[int]):
    m = M3ForCausalLM(tiny_config(), dtype=torch.bfloat16, backend=TritonBackend())
    m.init_dummy(7)
    for layer in m.layers:
        layer.attn.fuse_qkv_heads = fuse
    kv = KVCache(m.cfg, 6, 16, kv_dtype, torch.bfloat16)
    meta = build_attn_metadata(query_lens, [q + 9 for q in query_lens], [[0, 2], [1, 3]], 16)
    ids = torch.randint(0, m.cfg.vocab_size, (sum(query_lens),), generator=torch.Generator().manual_seed(3))
    return m(ids, meta.positions, meta, kv), kv


def _pages(kv: KVCache, layer: int):
    return [kq.dequantize_pages(p, torch.float32) for p in kv.pages(layer) if p is not None]


@pytest.mark.parametrize("kv_dtype", [KVDtype.BF16, KVDtype.FP8])
def test_fused_heads_give_the_same_step(heads_calls, kv_dtype):
    got, kv_got = _step(True, kv_dtype, [3, 1])
    assert len(heads_calls) == 2  # the dense layer and the MSA layer, one launch each
    want, kv_want = _step(False, kv_dtype, [3, 1])
    assert len(heads_calls) == 2
    scale = want.float().abs().max()
    assert (got.float() - want.float()).abs().max() <= 3e-2 * scale
    for layer in range(2):
        for a, b in zip(_pages(kv_got, layer), _pages(kv_want, layer)):
            assert (a - b).abs().max() <= 5e-2 * b.abs().max()


def test_more_rows_than_heads_max_rows_stay_on_two_launches(heads_calls):
    _step(True, KVDtype.BF16, [3, 2])  # 5 rows: skinny GEMMs, but norm_rope_write's program a row and head
    assert heads_calls == []


def test_hybrid_caches_stay_on_two_launches(heads_calls):
    """MSA layers with NVFP4 K / V and index keys: one format, fused; the dense layer's FP8: fused too."""
    _step(True, KVDtype.HYBRID, [1, 1])
    assert len(heads_calls) == 2
